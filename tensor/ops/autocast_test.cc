// Autocast: the cast policy of each listed op, the weight cache (once per guard, shared across
// threads, differentiable), nesting, the dtypes left alone, and the state reaching device
// workers while backward functions run without it.
#include "tensor/ops/autocast.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <future>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "tensor/core/autograd.h"
#include "tensor/ops/autocast_weights.h"
#include "tensor/runtime/allocator.h"
#include "tensor/runtime/threads.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace tandem {
namespace {

using ::tandem::testing::ErrorOf;
using ::tandem::testing::MaxAbsDiff;
using ::testing::HasSubstr;

constexpr DeviceType kCPU = DeviceType::kCPU;
constexpr DeviceType kCUDA = DeviceType::kCUDA;

// max |a - b| <= atol + rtol * max |b| (b the float32 reference), PyTorch's tolerances scaled
// by `scale`. Relative to the largest element rather than to each one: a sum of products that
// cancels to near zero keeps the rounding errors of its large terms.
void ExpectCloseTo(const Tensor& a, const Tensor& b, DType dtype, double scale = 1.0) {
  ASSERT_EQ(a.shape(), b.shape());
  EXPECT_NE(a.dtype(), kFloat64);
  const double rtol = (dtype == kBFloat16 ? 1.6e-2 : 1e-3) * scale;
  const double largest = MaxAbsDiff(b, zeros_like(b));
  EXPECT_LE(MaxAbsDiff(a, b), 1e-5 * scale + rtol * largest) << "largest |b| = " << largest;
}

Tensor Param(const Shape& shape, uint64_t seed) {
  manual_seed(seed);
  Tensor p = mul(randn(shape), 0.5).detach();
  p.set_requires_grad(true);
  return p;
}

TEST(AutocastModeTest, OffByDefaultWithPyTorchsDefaultDTypes) {
  EXPECT_FALSE(AutocastMode::IsAnyEnabled());
  EXPECT_FALSE(AutocastMode::IsEnabled(kCPU));
  EXPECT_FALSE(AutocastMode::IsEnabled(kCUDA));
  EXPECT_EQ(AutocastMode::DefaultDType(kCPU), kBFloat16);
  EXPECT_EQ(AutocastMode::DefaultDType(kCUDA), kFloat16);
  EXPECT_EQ(AutocastMode::GetDType(kCPU), kBFloat16);
  EXPECT_EQ(AutocastMode::GetDType(kCUDA), kFloat16);
  EXPECT_EQ(autocast::CachedCastCount(), 0u);
}

TEST(AutocastTest, GuardsNestAndRestore) {
  {
    AutocastGuard outer(kCPU);
    EXPECT_TRUE(AutocastMode::IsEnabled(kCPU));
    EXPECT_FALSE(AutocastMode::IsEnabled(kCUDA));
    EXPECT_EQ(AutocastMode::GetDType(kCPU), kBFloat16);
    {
      AutocastGuard half(kCPU, kFloat16);
      EXPECT_EQ(AutocastMode::GetDType(kCPU), kFloat16);
      {
        AutocastGuard inherits(kCPU);  // no dtype: the enclosing guard's
        EXPECT_EQ(AutocastMode::GetDType(kCPU), kFloat16);
        AutocastGuard off(kCPU, std::nullopt, /*enabled=*/false);
        EXPECT_FALSE(AutocastMode::IsEnabled(kCPU));
        EXPECT_FALSE(AutocastMode::IsAnyEnabled());
        EXPECT_EQ(exp(ones({2}).to(kBFloat16)).dtype(), kBFloat16);  // off: no cast
      }
      EXPECT_TRUE(AutocastMode::IsEnabled(kCPU));
      EXPECT_EQ(AutocastMode::GetDType(kCPU), kFloat16);
      AutocastGuard cuda(kCUDA);
      EXPECT_TRUE(AutocastMode::IsEnabled(kCUDA));
      EXPECT_EQ(AutocastMode::GetDType(kCUDA), kFloat16);
    }
    EXPECT_FALSE(AutocastMode::IsEnabled(kCUDA));
    EXPECT_EQ(AutocastMode::GetDType(kCPU), kBFloat16);
  }
  EXPECT_FALSE(AutocastMode::IsAnyEnabled());
  EXPECT_EQ(AutocastMode::GetDType(kCPU), kBFloat16);
}

TEST(AutocastTest, RefusesANonReducedDType) {
  EXPECT_THAT(ErrorOf([] { AutocastGuard guard(kCPU, kFloat32); }),
              HasSubstr("expected a 16-bit floating dtype (bfloat16 or float16)"));
  EXPECT_THAT(ErrorOf([] { AutocastGuard guard(kCPU, kInt64); }), HasSubstr("got int64"));
  EXPECT_FALSE(AutocastMode::IsAnyEnabled());  // a refused guard leaves the state alone
}

TEST(AutocastTest, Float32ListRunsInFloat32) {
  manual_seed(1);
  const Tensor x32 = randn({4, 5});
  const Tensor x = x32.to(kBFloat16);
  const Tensor positive = add(abs(x32), 0.5).to(kBFloat16);
  const Tensor labels = from_vector(std::vector<int64_t>{0, 4, 2, 1}, {4});
  AutocastGuard autocast(kCPU);
  EXPECT_EQ(softmax(x, 1).dtype(), kFloat32);
  EXPECT_EQ(log_softmax(x, 1).dtype(), kFloat32);
  EXPECT_EQ(exp(x).dtype(), kFloat32);
  EXPECT_EQ(log(positive).dtype(), kFloat32);
  EXPECT_EQ(pow(x, 2.0).dtype(), kFloat32);
  EXPECT_EQ(sum(x).dtype(), kFloat32);
  EXPECT_EQ(sum(x, {1}).dtype(), kFloat32);
  EXPECT_EQ(mean(x).dtype(), kFloat32);
  EXPECT_EQ(mean(x, {0}, true).dtype(), kFloat32);
  EXPECT_EQ(cross_entropy(x, labels).dtype(), kFloat32);
  EXPECT_EQ(nll_loss(log_softmax(x, 1).to(kBFloat16), labels).dtype(), kFloat32);
  EXPECT_EQ(mse_loss(x, x32).dtype(), kFloat32);
  // Computed from the bf16 values, in float32: the same as casting up first.
  EXPECT_EQ(MaxAbsDiff(softmax(x, 1), softmax(x.to(kFloat32), 1)), 0.0);
  EXPECT_EQ(MaxAbsDiff(cross_entropy(x, labels), cross_entropy(x.to(kFloat32), labels)), 0.0);
  // float16 inputs are cast up too.
  EXPECT_EQ(softmax(x32.to(kFloat16), 0).dtype(), kFloat32);
}

// Note [Autocast cross-entropy]: 16-bit logits are widened inside the fused kernels instead of
// cast first; the loss and the logits' gradient are the cast path's to the bit, in both 16-bit
// dtypes, on every device autocast runs on (CUDA's in tensor/cuda/cuda_reduce_softmax_test.cc).
TEST(AutocastTest, CrossEntropyOfSixteenBitLogitsIsTheCastLogitsToTheBit) {
  manual_seed(2);
  const Tensor labels = from_vector(std::vector<int64_t>{0, 6, 2, 1, 6}, {5});
  for (DType dtype : {kBFloat16, kFloat16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const Tensor x0 = (randn({5, 7}) * 3.0).to(dtype);
    Tensor widened = x0.detach(), cast = x0.detach();
    widened.set_requires_grad(true);
    cast.set_requires_grad(true);
    Tensor loss_widened, loss_cast;
    {
      AutocastGuard autocast(kCPU, dtype);
      loss_widened = cross_entropy(widened, labels);
      loss_cast = cross_entropy(cast.to(kFloat32), labels);
    }
    EXPECT_EQ(loss_widened.dtype(), kFloat32);
    EXPECT_EQ(loss_widened.to_vector<float>(), loss_cast.to_vector<float>());
    (loss_widened * 3.0).backward();
    (loss_cast * 3.0).backward();
    EXPECT_EQ(widened.grad().dtype(), dtype);
    EXPECT_EQ(MaxAbsDiff(widened.grad(), cast.grad()), 0.0);
  }
}

// Note [Autocast residual norm]: under autocast a float32 stream and a 16-bit branch in, the
// float32 sum and the 16-bit normalised output out, with the bits of casting the branch up,
// norming in float32 and casting y down (the path without the fused i/o), forward and backward.
TEST(AutocastTest, AddLayerNormEqualsItsCastsBitForBit) {
  for (DType lower : {kBFloat16, kFloat16}) {
    SCOPED_TRACE(::testing::Message() << lower);
    std::vector<Tensor> fused, cast;
    for (uint64_t seed : {61, 62, 63, 64}) {
      manual_seed(seed);
      const Tensor t = seed <= 62 ? randn({3, 5, 40}) + 2.0 : randn({40});
      // The residual (seed 62) comes from a 16-bit GEMM; the rest are float32.
      const Tensor leaf = (seed == 62 ? t.to(lower) : t).detach();
      fused.push_back(leaf.detach());
      cast.push_back(leaf.detach());
      fused.back().set_requires_grad(true);
      cast.back().set_requires_grad(true);
    }
    manual_seed(65);
    const Tensor g_sum = randn({3, 5, 40}), g_y = randn({3, 5, 40}).to(lower);
    Tensor sum, y;
    {
      AutocastGuard autocast(kCPU, lower);
      std::tie(sum, y) = add_layer_norm(fused[0], fused[1], {40}, fused[2], fused[3], 1e-5);
    }
    EXPECT_EQ(sum.dtype(), kFloat32);
    EXPECT_EQ(y.dtype(), lower);
    // Both outputs get a gradient, as a block's stream and its norm do.
    ((sum * g_sum).sum() + (y.to(kFloat32) * g_y.to(kFloat32)).sum()).backward();
    const auto [sum_c, y32] =
        add_layer_norm(cast[0], cast[1].to(kFloat32), {40}, cast[2], cast[3], 1e-5);
    ((sum_c * g_sum).sum() + (y32.to(lower).to(kFloat32) * g_y.to(kFloat32)).sum()).backward();
    EXPECT_EQ(MaxAbsDiff(sum, sum_c), 0.0);
    EXPECT_EQ(MaxAbsDiff(y, y32.to(lower)), 0.0);
    for (int i = 0; i < 4; ++i) {
      SCOPED_TRACE(::testing::Message() << "gradient of input " << i);
      ASSERT_TRUE(fused[i].grad().defined());
      EXPECT_EQ(fused[i].grad().dtype(), fused[i].dtype());
      EXPECT_EQ(MaxAbsDiff(fused[i].grad(), cast[i].grad()), 0.0);
    }
  }
  // A float32 residual under autocast: y is still in the autocast dtype.
  const Tensor x = randn({2, 8}), r = randn({2, 8});
  AutocastGuard autocast(kCPU, kBFloat16);
  const auto [sum, y] = add_layer_norm(x, r, {8}, Tensor(), Tensor());
  EXPECT_EQ(sum.dtype(), kFloat32);
  EXPECT_EQ(y.dtype(), kBFloat16);
}

TEST(AutocastTest, OtherOpsRunInTheirInputsDType) {
  const Tensor x = randn({3, 4}).to(kBFloat16);
  AutocastGuard autocast(kCPU);
  EXPECT_EQ(relu(x).dtype(), kBFloat16);
  EXPECT_EQ(tanh(x).dtype(), kBFloat16);
  EXPECT_EQ(mul(x, x).dtype(), kBFloat16);
  EXPECT_EQ(add(x, randn({3, 4})).dtype(), kFloat32);  // type promotion, not autocast
  EXPECT_EQ(relu(randn({3})).dtype(), kFloat32);       // float32 stays float32 outside the list
}

TEST(AutocastTest, CatPromotesToTheWidestFloatingDType) {
  const Tensor a = ones({2, 3}).to(kBFloat16);
  const Tensor b = ones({1, 3});
  AutocastGuard autocast(kCPU);
  const Tensor joined = cat({a, b}, 0);
  EXPECT_EQ(joined.dtype(), kFloat32);
  EXPECT_EQ(joined.size(0), 3);
  EXPECT_EQ(stack({ones({3}).to(kFloat16), ones({3}).to(kBFloat16)}).dtype(), kFloat32);
  EXPECT_EQ(cat({a, a}).dtype(), kBFloat16);
}

TEST(AutocastTest, Float64AndIntegersAreLeftAlone) {
  manual_seed(2);
  const Tensor x64 = randn({3, 4}, TensorOptions().dtype(kFloat64));
  const Tensor w64 = randn({2, 4}, TensorOptions().dtype(kFloat64));
  const Tensor ints = from_vector(std::vector<int64_t>{1, 2, 3}, {3});
  AutocastGuard autocast(kCPU);
  EXPECT_FALSE(autocast::IsEligible(x64));
  EXPECT_FALSE(autocast::IsEligible(ints));
  EXPECT_EQ(linear(x64, w64, Tensor()).dtype(), kFloat64);
  EXPECT_EQ(matmul(x64, w64.t()).dtype(), kFloat64);
  EXPECT_EQ(softmax(x64, 1).dtype(), kFloat64);
  EXPECT_EQ(exp(x64).dtype(), kFloat64);
  EXPECT_EQ(sum(ints).dtype(), kInt64);
  EXPECT_EQ(autocast::CastToLowerPrecision(ints).dtype(), kInt64);
  EXPECT_EQ(autocast::CastToFloat32(x64).dtype(), kFloat64);
}

TEST(AutocastTest, OnlyTheGuardedDeviceTypeIsCast) {
  const Tensor x = ones({2, 3}).to(kBFloat16);
  AutocastGuard autocast(kCUDA);  // CUDA only: CPU tensors are not touched
  EXPECT_FALSE(autocast::IsEligible(x));
  EXPECT_EQ(exp(x).dtype(), kBFloat16);
  EXPECT_EQ(autocast::CastToLowerPrecision(ones({2})).dtype(), kFloat32);
}

TEST(AutocastTest, LowerPrecisionListRunsInBFloat16) {
  manual_seed(3);
  const Tensor x = randn({6, 8}), w = randn({5, 8}), b = randn({5});
  const Tensor image = randn({2, 3, 6, 6}), kernel = randn({4, 3, 3, 3}), kb = randn({4});
  const Tensor linear32 = linear(x, w, b), matmul32 = matmul(x, w.t());
  const Tensor conv32 = conv2d(image, kernel, kb, {1, 1}, {1, 1});
  AutocastGuard autocast(kCPU);
  const Tensor y = linear(x, w, b);
  const Tensor m = matmul(x, w.t());
  const Tensor c = conv2d(image, kernel, kb, {1, 1}, {1, 1});
  EXPECT_EQ(y.dtype(), kBFloat16);
  EXPECT_EQ(m.dtype(), kBFloat16);
  EXPECT_EQ(c.dtype(), kBFloat16);
  EXPECT_EQ(x.matmul(w.t()).dtype(), kBFloat16);
  // The inputs round to bf16 (relative error 2^-9 each) and the result once more.
  ExpectCloseTo(y, linear32, kBFloat16);
  ExpectCloseTo(m, matmul32, kBFloat16);
  ExpectCloseTo(c, conv32, kBFloat16);
}

TEST(AutocastTest, Float16OnTheCpu) {
  manual_seed(4);
  const Tensor x = randn({6, 8}), w = randn({5, 8}), b = randn({5});
  const Tensor expected = linear(x, w, b);
  AutocastGuard autocast(kCPU, kFloat16);
  const Tensor y = linear(x, w, b);
  EXPECT_EQ(y.dtype(), kFloat16);
  ExpectCloseTo(y, expected, kFloat16);
  EXPECT_EQ(log_softmax(y, 1).dtype(), kFloat32);
}

TEST(AutocastTest, AParameterIsCastOncePerGuard) {
  const Tensor w = Param({4, 3}, 5);
  const Tensor activation = randn({4, 3});  // requires no grad: not cached
  const Tensor non_leaf = mul(w, 2.0);      // not a leaf: not cached
  {
    AutocastGuard autocast(kCPU);
    const Tensor first = autocast::CastToLowerPrecision(w);
    const Tensor second = autocast::CastToLowerPrecision(w);
    EXPECT_EQ(first.dtype(), kBFloat16);
    EXPECT_EQ(first.impl(), second.impl());
    EXPECT_TRUE(first.requires_grad());
    EXPECT_EQ(autocast::CachedCastCount(), 1u);
    EXPECT_NE(autocast::CastToLowerPrecision(activation).impl(),
              autocast::CastToLowerPrecision(activation).impl());
    EXPECT_NE(autocast::CastToLowerPrecision(non_leaf).impl(),
              autocast::CastToLowerPrecision(non_leaf).impl());
    EXPECT_EQ(autocast::CachedCastCount(), 1u);
    {
      AutocastGuard nested(kCPU);  // shares the outer guard's cache
      EXPECT_EQ(autocast::CastToLowerPrecision(w).impl(), first.impl());
      AutocastGuard half(kCPU, kFloat16);  // another dtype: another entry
      EXPECT_EQ(autocast::CastToLowerPrecision(w).dtype(), kFloat16);
      EXPECT_EQ(autocast::CachedCastCount(), 2u);
    }
    EXPECT_EQ(autocast::CachedCastCount(), 2u);  // nested guards do not clear it
    {
      AutocastGuard uncached(kCPU, std::nullopt, true, /*cache_enabled=*/false);
      EXPECT_NE(autocast::CastToLowerPrecision(w).impl(), first.impl());
    }
  }
  EXPECT_EQ(autocast::CachedCastCount(), 0u);
  AutocastGuard again(kCPU);  // a new outermost guard casts afresh
  EXPECT_EQ(autocast::CachedCastCount(), 0u);
  autocast::CastToLowerPrecision(w);
  EXPECT_EQ(autocast::CachedCastCount(), 1u);
}

TEST(AutocastTest, ACastMadeWithoutGradIsNotReusedWithGrad) {
  const Tensor w = Param({3}, 6);
  AutocastGuard autocast(kCPU);
  Tensor without;
  {
    NoGradGuard no_grad;
    without = autocast::CastToLowerPrecision(w);
  }
  EXPECT_FALSE(without.requires_grad());
  const Tensor with = autocast::CastToLowerPrecision(w);
  EXPECT_TRUE(with.requires_grad());
  EXPECT_NE(with.impl(), without.impl());
  NoGradGuard no_grad;  // a recorded cast serves a caller that records nothing too
  EXPECT_EQ(autocast::CastToLowerPrecision(w).impl(), with.impl());
}

TEST(AutocastTest, WeightUsedTwiceIsCastOnceAndGetsBothGradients) {
  Tensor w = Param({4, 4}, 7), b = Param({4}, 8);
  manual_seed(9);
  Tensor x = randn({5, 4});
  x.set_requires_grad(true);  // each linear keeps w's cast for x's gradient: one cast serves both
  const auto forward = [&] { return sum(linear(relu(linear(x, w, b)), w, b)); };
  forward().backward();
  const Tensor w_grad32 = w.grad(), b_grad32 = b.grad();
  w.set_grad(Tensor());
  b.set_grad(Tensor());
  Tensor loss;
  {
    AutocastGuard autocast(kCPU);
    loss = forward();
    EXPECT_EQ(autocast::CachedCastCount(), 2u);  // w and b, each once
  }
  EXPECT_EQ(loss.dtype(), kFloat32);
  loss.backward();
  ASSERT_TRUE(w.grad().defined());
  EXPECT_EQ(w.grad().dtype(), kFloat32);
  EXPECT_EQ(b.grad().dtype(), kFloat32);
  ExpectCloseTo(w.grad(), w_grad32, kBFloat16, 2.0);  // two bf16 GEMMs deep
  ExpectCloseTo(b.grad(), b_grad32, kBFloat16, 2.0);
}

// Note [Autocast linear]: the weight's gradient comes out of the GEMM in float32. With
// sum(y) the output's gradient is all ones, so dW[o, i] = sum over rows of x's bfloat16 value:
// exact products summed in float (float32's rounding), where a bfloat16 gradient would be off
// by up to 2^-9 of it.
TEST(AutocastTest, LinearWeightGradientIsNotRoundedTo16Bits) {
  const Tensor w = Param({3, 40}, 17);
  manual_seed(18);
  const Tensor x = randn({64, 40});
  {
    AutocastGuard autocast(kCPU);
    sum(linear(x, w, Tensor())).backward();
  }
  ASSERT_TRUE(w.grad().defined());
  EXPECT_EQ(w.grad().dtype(), kFloat32);
  const Tensor column_sums = sum(x.to(kBFloat16).to(kFloat64), {0});
  for (int64_t o = 0; o < 3; ++o) {
    const Tensor row = w.grad().select(0, o).to(kFloat64);
    EXPECT_LE(MaxAbsDiff(row, column_sums), 1e-5 * (1.0 + MaxAbsDiff(column_sums, zeros({40}))))
        << "row " << o;
  }
}

// The batch (an input that needs no gradient) is kept as the caller holds it, not as a second,
// 16-bit copy, and the first layer's weight cast is not cached: it is freed after the product.
TEST(AutocastTest, LinearKeepsNoCopyOfTheBatch) {
  const Tensor w = Param({8, 2048}, 19);
  manual_seed(20);
  const Tensor x = randn({256, 2048});  // 2 MiB as float32, 1 MiB as bfloat16
  const Device cpu = Device::Cpu(0);
  const int64_t before = GetMemoryStats(cpu).in_use_bytes;
  Tensor y;
  {
    AutocastGuard autocast(kCPU);
    y = linear(x, w, Tensor());
    EXPECT_EQ(autocast::CachedCastCount(), 0u);
  }
  EXPECT_EQ(y.dtype(), kBFloat16);
  // y and the graph hold a few KiB; a bfloat16 copy of x or of w would be 1 MiB or 32 KiB.
  EXPECT_LT(GetMemoryStats(cpu).in_use_bytes - before, 16 * 1024);
  sum(y).backward();
  ASSERT_TRUE(w.grad().defined());
  Tensor w32 = w.detach();
  w32.set_requires_grad(true);
  sum(linear(x, w32, Tensor())).backward();
  ExpectCloseTo(w.grad(), w32.grad(), kBFloat16);
}

// A batch is rounded to bfloat16 64 rows at a time in forward, and in backward each block of
// the weight gradient rounds only its own columns of it: no whole 16-bit copy of the batch is
// held at once, and y is bit for bit the product of the batch cast first.
TEST(AutocastTest, LinearRoundsTheBatchABlockAtATime) {
  const Tensor w = Param({64, 2048}, 26), b = Param({64}, 27);
  manual_seed(28);
  const Tensor x = randn({2, 100, 2048});  // 1.6 MiB as float32, 0.8 MiB as bfloat16
  const int64_t copy = x.numel() * 2;
  const Device cpu = Device::Cpu(0);
  int64_t before = GetMemoryStats(cpu).in_use_bytes;
  ResetPeakMemory(cpu);
  Tensor y;
  {
    AutocastGuard autocast(kCPU);
    y = linear(x, w, b);
  }
  // The weight's cast (256 KiB), y (25 KiB) and one block of 64 rows (256 KiB).
  EXPECT_LT(GetMemoryStats(cpu).peak_bytes - before, w.numel() * 2 + copy / 2);
  ASSERT_EQ(y.shape(), (Shape{2, 100, 64}));
  const Tensor expected = linear(x.to(kBFloat16), w.to(kBFloat16), b.to(kBFloat16));
  EXPECT_EQ(MaxAbsDiff(y, expected), 0.0);

  before = GetMemoryStats(cpu).in_use_bytes;
  ResetPeakMemory(cpu);
  sum(y).backward();
  // The float32 gradients (512 KiB) and the blocks of the pool's threads (64 KiB each).
  EXPECT_LT(GetMemoryStats(cpu).peak_bytes - before, (w.numel() + b.numel()) * 4 + copy * 3 / 4);
  Tensor w32 = w.detach();
  w32.set_requires_grad(true);
  sum(linear(x.to(kBFloat16).to(kFloat32), w32, Tensor())).backward();
  ExpectCloseTo(w.grad(), w32.grad(), kFloat32);
}

// Without grad (evaluation, sampling) one guard may span many forwards: the weight is cast once.
TEST(AutocastTest, LinearCachesItsWeightCastWithoutGrad) {
  const Tensor w = Param({4, 6}, 24);
  manual_seed(25);
  const Tensor x = randn({3, 6});
  AutocastGuard autocast(kCPU);
  NoGradGuard no_grad;
  const Tensor first = linear(x, w, Tensor());
  EXPECT_EQ(autocast::CachedCastCount(), 1u);
  const Tensor second = linear(x, w, Tensor());
  EXPECT_EQ(autocast::CachedCastCount(), 1u);
  EXPECT_EQ(MaxAbsDiff(first, second), 0.0);
}

TEST(AutocastTest, LinearInputGradientsKeepTheInputsDType) {
  const Tensor w = Param({5, 6}, 21), b = Param({5}, 22);
  for (DType dtype : {kFloat32, kBFloat16, kFloat16}) {
    SCOPED_TRACE(DTypeName(dtype));
    manual_seed(23);
    Tensor x = randn({2, 3, 6}).to(dtype).detach();
    x.set_requires_grad(true);
    {
      AutocastGuard autocast(kCPU);
      const Tensor y = linear(x, w, b);
      EXPECT_EQ(y.dtype(), kBFloat16);
      EXPECT_EQ(y.shape(), (Shape{2, 3, 5}));
      sum(y).backward();
    }
    ASSERT_TRUE(x.grad().defined());
    EXPECT_EQ(x.grad().dtype(), dtype);
    EXPECT_EQ(x.grad().shape(), x.shape());
    // d sum(y) / dx = column sums of w, rounded through bfloat16.
    const Tensor expected = sum(w.detach(), {0}).reshape({1, 1, 6}).expand({2, 3, 6});
    ExpectCloseTo(x.grad().to(kFloat32), expected, kBFloat16, 2.0);
  }
}

TEST(AutocastTest, GradientsMatchTheFloat32Model) {
  const Tensor w1 = Param({16, 10}, 10), b1 = Param({16}, 11);
  const Tensor w2 = Param({3, 16}, 12), b2 = Param({3}, 13);
  manual_seed(14);
  const Tensor x = randn({8, 10});
  const Tensor labels = from_vector(std::vector<int64_t>{0, 1, 2, 0, 1, 2, 2, 1}, {8});
  const auto forward = [&] {
    return cross_entropy(linear(relu(linear(x, w1, b1)), w2, b2), labels);
  };
  const std::vector<Tensor> params = {w1, b1, w2, b2};
  forward().backward();
  std::vector<Tensor> grads32;
  for (Tensor p : params) {
    grads32.push_back(p.grad());
    p.set_grad(Tensor());
  }
  {
    AutocastGuard autocast(kCPU);
    const Tensor loss = forward();
    EXPECT_EQ(loss.dtype(), kFloat32);
    loss.backward();  // inside the guard: backward still runs in the forward's dtypes
  }
  for (size_t i = 0; i < params.size(); ++i) {
    SCOPED_TRACE(i);
    ASSERT_TRUE(params[i].grad().defined());
    EXPECT_EQ(params[i].grad().dtype(), kFloat32);
    // Two bf16 GEMMs deep: a few bf16 roundings on every gradient.
    ExpectCloseTo(params[i].grad(), grads32[i], kBFloat16, 2.0);
  }
}

TEST(AutocastTest, BackwardFunctionsRunWithAutocastOff) {
  SetCpuDeviceCount(2);
  for (Device device : {Device::Cpu(0), Device::Cpu(1)}) {
    SCOPED_TRACE(device.ToString());
    Tensor x = ones({3}, TensorOptions().device(device));
    x.set_requires_grad(true);
    std::atomic<int> seen{-1};
    Tensor out = mul(x.detach(), 1.0);
    RecordOp("ProbeBackward", {x}, out, [&seen](const Tensor& grad) {
      seen = AutocastMode::IsAnyEnabled() ? 1 : 0;
      return std::vector<Tensor>{grad};
    });
    AutocastGuard autocast(kCPU);
    out.backward(ones({3}, TensorOptions().device(device)));
    EXPECT_EQ(seen.load(), 0);
    EXPECT_TRUE(AutocastMode::IsEnabled(kCPU));  // restored after the pass
  }
}

TEST(AutocastTest, ABackwardThatCallsListedOpsKeepsTheForwardsDType) {
  // amax's backward sums a bf16 mask: under autocast that sum would come out float32 and the
  // gradient of the bf16 input with it.
  Tensor x = randn({3, 4}).to(kBFloat16);
  x.set_requires_grad(true);
  AutocastGuard autocast(kCPU);
  sum(amax(x, 1)).backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_EQ(x.grad().dtype(), kBFloat16);
}

TEST(AutocastTest, TasksOnDeviceWorkersSeeTheCallersState) {
  SetCpuDeviceCount(2);
  DeviceWorker& worker = DeviceWorker::For(Device::Cpu(1));
  const auto probe = [] {
    return std::make_pair(AutocastMode::IsEnabled(kCPU), AutocastMode::GetDType(kCPU));
  };
  {
    AutocastGuard autocast(kCPU, kFloat16);
    const auto seen = worker.Submit(probe).get();
    EXPECT_TRUE(seen.first);
    EXPECT_EQ(seen.second, kFloat16);
    const Tensor x = ones({2, 3}, TensorOptions().device(Device::Cpu(1))).to(kFloat16);
    EXPECT_EQ(worker.Submit([x] { return softmax(x, 1).dtype(); }).get(), kFloat32);
  }
  // The worker's own state was restored after each task, and nothing leaks into later ones.
  const auto after = worker.Submit(probe).get();
  EXPECT_FALSE(after.first);
  EXPECT_EQ(after.second, kBFloat16);
}

TEST(AutocastTest, WorkersShareTheGuardsWeightCache) {
  SetCpuDeviceCount(2);
  const Tensor w = Param({8, 8}, 15);
  AutocastGuard autocast(kCPU);
  // Both workers cast the same parameter at about the same time: one cast wins, both use it.
  std::vector<std::future<const void*>> casts;
  for (int round = 0; round < 20; ++round) {
    for (int d = 0; d < 2; ++d) {
      casts.push_back(DeviceWorker::For(Device::Cpu(d)).Submit([w] {
        return static_cast<const void*>(autocast::CastToLowerPrecision(w).impl());
      }));
    }
  }
  const void* first = autocast::CastToLowerPrecision(w).impl();
  for (auto& cast : casts) EXPECT_EQ(cast.get(), first);
  EXPECT_EQ(autocast::CachedCastCount(), 1u);
}

TEST(AutocastTest, ATaskThatOutlivesTheGuardCastsUncached) {
  SetCpuDeviceCount(2);
  const Tensor w = Param({4}, 16);
  std::promise<void> closed;
  std::future<std::pair<DType, size_t>> late;
  {
    AutocastGuard autocast(kCPU);
    late = DeviceWorker::For(Device::Cpu(1)).Submit([&closed, w] {
      closed.get_future().wait();
      const Tensor cast = autocast::CastToLowerPrecision(w);
      return std::make_pair(cast.dtype(), autocast::CachedCastCount());
    });
  }
  closed.set_value();
  const auto [dtype, cached] = late.get();
  EXPECT_EQ(dtype, kBFloat16);  // the task still runs under the state it was posted with
  EXPECT_EQ(cached, 0u);        // but the closed cache keeps nothing
}

// ---- autocast::CastWeights ----------------------------------------------------------------

// Whether a and b hold the same bytes (same dtype and shape).
bool SameBits(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const Tensor x = a.contiguous(), y = b.contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), x.numel() * ElementSize(x.dtype())) == 0;
}

// A float32 parameter whose values include what rounding can get wrong: ties to even, values
// that round up to the next binade or to infinity, subnormals, infinities and NaN.
Tensor AwkwardParam(int64_t n, uint64_t seed) {
  manual_seed(seed);
  std::vector<float> values = mul(randn({n}), 3.0).to_vector<float>();
  const float specials[] = {1.00390625f,  // a bfloat16 tie
                            1.01171875f,
                            65520.0f,  // rounds to float16's infinity
                            3.3895314e38f,
                            1e-40f,
                            -1e-42f,
                            5.9604645e-8f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            -0.0f};
  for (size_t i = 0; i < sizeof(specials) / sizeof(specials[0]); ++i) values[i * 7] = specials[i];
  Tensor p = from_vector(values, {n});
  p.set_requires_grad(true);
  return p;
}

TEST(AutocastCastWeightsTest, FillsTheCacheWithTheCastsToTheBit) {
  for (DType dtype : {kBFloat16, kFloat16}) {
    SCOPED_TRACE(DTypeName(dtype));
    // 70,000 elements: more than one piece of the CPU kernel's split.
    const Tensor big = AwkwardParam(70000, 1), small = AwkwardParam(97, 2);
    const Tensor w = Param({5, 6}, 3);
    AutocastGuard autocast(kCPU, dtype);
    autocast::CastWeights({big, small, w, big});  // big twice: cast once
    EXPECT_EQ(autocast::CachedCastCount(), 3u);
    for (const Tensor& p : {big, small, w}) {
      const Tensor cached = autocast::CastWeightOutsideGraph(p, /*keep=*/true);
      EXPECT_EQ(autocast::CachedCastCount(), 3u) << "the linear ops find the cast";
      EXPECT_EQ(cached.dtype(), dtype);
      EXPECT_FALSE(cached.requires_grad());
      NoGradGuard no_grad;
      EXPECT_TRUE(SameBits(cached, p.to(dtype))) << "differs from Tensor::to's rounding";
    }
    autocast::CastWeights({big, small, w});  // cached already: nothing more
    EXPECT_EQ(autocast::CachedCastCount(), 3u);
  }
}

TEST(AutocastCastWeightsTest, SkipsWhatTheCacheDoesNotHold) {
  const Tensor w = Param({4, 3}, 6);
  Tensor wide = randn({4, 3}).to(kFloat64).detach();
  wide.set_requires_grad(true);
  const Tensor frozen = randn({4, 3});  // requires no grad
  const Tensor non_leaf = mul(w, 2.0);
  const Tensor half = Param({4, 3}, 7).to(kBFloat16).detach();
  AutocastGuard autocast(kCPU);
  autocast::CastWeights({wide, frozen, non_leaf, half, Tensor()});
  EXPECT_EQ(autocast::CachedCastCount(), 0u);
  autocast::CastWeights({w});
  EXPECT_EQ(autocast::CachedCastCount(), 1u);
}

TEST(AutocastCastWeightsTest, CastsAStridedWeightOnItsOwn) {
  manual_seed(8);
  Tensor strided = randn({6, 5}).t().detach();  // a leaf view with transposed strides
  strided.set_requires_grad(true);
  ASSERT_FALSE(strided.is_contiguous());
  AutocastGuard autocast(kCPU);
  autocast::CastWeights({strided});
  EXPECT_EQ(autocast::CachedCastCount(), 1u);
  NoGradGuard no_grad;
  EXPECT_TRUE(SameBits(autocast::CastWeightOutsideGraph(strided, true), strided.to(kBFloat16)));
}

TEST(AutocastCastWeightsTest, DoesNothingOutsideAGuardOrWithTheCacheOff) {
  const Tensor w = Param({4, 3}, 9);
  autocast::CastWeights({w});
  EXPECT_EQ(autocast::CachedCastCount(), 0u);
  {
    AutocastGuard autocast(kCPU, kBFloat16, /*enabled=*/true, /*cache_enabled=*/false);
    autocast::CastWeights({w});
    EXPECT_EQ(autocast::CachedCastCount(), 0u);
  }
  {
    AutocastGuard autocast(kCUDA);  // on for CUDA only: a CPU weight is not cast
    autocast::CastWeights({w});
    EXPECT_EQ(autocast::CachedCastCount(), 0u);
  }
}

TEST(AutocastCastWeightsTest, LinearsGiveTheSameOutputAndGradients) {
  const Tensor w1 = Param({16, 10}, 10), b1 = Param({16}, 11);
  const Tensor w2 = Param({3, 16}, 12), b2 = Param({3}, 13);
  manual_seed(14);
  const Tensor x = randn({8, 10});
  const Tensor labels = from_vector(std::vector<int64_t>{0, 1, 2, 0, 1, 2, 2, 1}, {8});
  const std::vector<Tensor> params = {w1, b1, w2, b2};
  const auto run = [&](bool cast_first, std::vector<Tensor>* grads) {
    Tensor loss, logits;
    {
      AutocastGuard autocast(kCPU);
      if (cast_first) {
        autocast::CastWeights(params);
        EXPECT_EQ(autocast::CachedCastCount(), 4u);
      }
      logits = linear(relu(linear(x, w1, b1)), w2, b2);
      loss = cross_entropy(logits, labels);
      if (cast_first) EXPECT_EQ(autocast::CachedCastCount(), 4u) << "no cast of their own";
    }
    loss.backward();
    for (Tensor p : params) {
      grads->push_back(p.grad());
      p.set_grad(Tensor());
    }
    return logits;
  };
  std::vector<Tensor> plain, cast;
  const Tensor expected = run(false, &plain);
  const Tensor logits = run(true, &cast);
  EXPECT_TRUE(SameBits(logits, expected));
  for (size_t i = 0; i < params.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_TRUE(SameBits(cast[i], plain[i]));
  }
}

}  // namespace
}  // namespace tandem
