// Every floating op of tensor/ops/ops.h in bfloat16 and float16, against the float32 op on
// the same values: the inputs are rounded to the 16-bit dtype first, so the float32 op sees
// exactly what the 16-bit op sees and the only difference is the 16-bit op's own rounding.
// Tolerances are PyTorch's (bfloat16 rtol 1.6e-2, float16 rtol 1e-3, atol 1e-5), times a
// small factor for ops that round more than once (mean: the sum, then the scaling) and, for
// gradients, relative to the gradient's size (a backward is a chain of rounded ops). Then a
// small model's backward in bfloat16 and float16, whose gradients must stay 16-bit and close
// to float32's.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace tandem {
namespace {

using ::testing::ElementsAre;
using Inputs = std::vector<Tensor>;

struct Precision {
  DType dtype;
  double rtol;
};
constexpr double kAtol = 1e-5;
const Precision kPrecisions[] = {{kBFloat16, 1.6e-2}, {kFloat16, 1e-3}};

std::vector<double> Doubles(const Tensor& t) {
  return t.detach().to(Device::Cpu()).to(kFloat64).contiguous().to_vector<double>();
}

Tensor Normal(const Shape& shape, uint64_t seed, double scale = 1.0) {
  Generator gen(seed);
  return mul(randn(shape, {}, &gen), scale);
}
Tensor Positive(const Shape& shape, uint64_t seed) {
  Generator gen(seed);
  return add(rand(shape, {}, &gen), 0.25);  // [0.25, 1.25)
}

// One op under test: `f` of float inputs (rounded to the dtype under test before use).
struct Case {
  std::string name;
  Inputs inputs;
  std::function<Tensor(const Inputs&)> f;
  double factor = 1.0;  // how many roundings the op's result may carry
  double floor = 0.0;   // the tolerance's relative part never drops below factor*rtol*floor
  bool differentiable = true;
};

// |low - ref| <= atol + factor * rtol * max(|ref|, floor), elementwise.
void ExpectClose(const Tensor& low, const Tensor& ref, double rtol, double factor, double floor,
                 const std::string& what) {
  ASSERT_EQ(low.shape(), ref.shape()) << what;
  const std::vector<double> a = Doubles(low), r = Doubles(ref);
  int reported = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(r[i])) {
      EXPECT_TRUE(std::isnan(a[i])) << what << " element " << i;
      continue;
    }
    if (std::isinf(r[i])) {
      EXPECT_EQ(a[i], r[i]) << what << " element " << i;
      continue;
    }
    const double tol = kAtol + factor * rtol * std::max(std::fabs(r[i]), floor);
    if (!(std::fabs(a[i] - r[i]) <= tol) && reported++ < 5) {
      ADD_FAILURE() << what << " element " << i << ": " << a[i] << " vs float32's " << r[i]
                    << " (tolerance " << tol << ")";
    }
  }
}

double MaxAbs(const Tensor& t) {
  double m = 0;
  for (double v : Doubles(t)) m = std::max(m, std::fabs(v));
  return m;
}

std::vector<Case> Cases() {
  const Tensor a = Normal({4, 6}, 1), b = Normal({4, 6}, 2), row = Normal({6}, 3);
  const Tensor pos = Positive({4, 6}, 4), pos2 = Positive({4, 6}, 5);
  const Tensor image = Normal({2, 3, 6, 6}, 6), kernel = Normal({4, 3, 3, 3}, 7, 0.3);
  const Tensor grouped_kernel = Normal({4, 1, 3, 3}, 8, 0.3), bias = Normal({4}, 9);
  const Tensor wide = Normal({2, 40, 5, 5}, 10), wide_kernel = Normal({8, 40, 3, 3}, 11, 0.1);
  const Tensor logits = Normal({5, 7}, 12, 2.0);
  const Tensor targets = from_vector(std::vector<int64_t>{0, 6, 3, 3, 1}, {5});
  const Tensor mask = gt(Normal({4, 6}, 13), zeros({}));
  const Tensor index = from_vector(std::vector<int64_t>{2, 0, 2}, {3});
  const Tensor rows = from_vector(std::vector<int64_t>{3, 0, 1, 5, 5, 2}, {1, 6}).expand({4, 6});
  const Tensor w = Normal({5, 6}, 14, 0.4), wb = Normal({5}, 15);
  const Tensor batch_a = Normal({3, 4, 6}, 16), batch_b = Normal({3, 6, 2}, 17);
  using I = const Inputs&;
  return {
      {"neg", {a}, [](I x) { return neg(x[0]); }},
      {"exp", {a}, [](I x) { return exp(x[0]); }},
      {"log", {pos}, [](I x) { return log(x[0]); }, 1, 1},
      {"sqrt", {pos}, [](I x) { return sqrt(x[0]); }},
      {"abs", {a}, [](I x) { return abs(x[0]); }},
      {"tanh", {a}, [](I x) { return tanh(x[0]); }},
      {"sigmoid", {a}, [](I x) { return sigmoid(x[0]); }},
      {"square", {a}, [](I x) { return square(x[0]); }},
      {"relu", {a}, [](I x) { return relu(x[0]); }},
      {"gelu", {a}, [](I x) { return gelu(x[0]); }, 1, 0.1},
      {"gelu tanh", {a}, [](I x) { return gelu(x[0], "tanh"); }, 1, 0.1},
      {"silu", {a}, [](I x) { return silu(x[0]); }, 1, 0.1},
      {"pow", {pos}, [](I x) { return pow(x[0], 2.5); }},
      {"add scalar", {a}, [](I x) { return add(x[0], 0.75); }, 1, 1},
      {"mul scalar", {a}, [](I x) { return mul(x[0], -1.5); }},
      {"div scalar", {a}, [](I x) { return x[0] / 3.0; }, 2},
      {"clamp", {a}, [](I x) { return clamp(x[0], -0.5, 0.7); }},
      {"add", {a, row}, [](I x) { return add(x[0], x[1]); }, 1, 1},
      {"sub", {a, b}, [](I x) { return sub(x[0], x[1]); }, 1, 1},
      {"mul", {a, row}, [](I x) { return mul(x[0], x[1]); }},
      {"div", {a, pos}, [](I x) { return div(x[0], x[1]); }},
      {"maximum", {a, b}, [](I x) { return maximum(x[0], x[1]); }},
      {"minimum", {a, row}, [](I x) { return minimum(x[0], x[1]); }},
      {"sum", {pos}, [](I x) { return sum(x[0]); }},
      {"sum dims", {a}, [](I x) { return sum(x[0], {1}); }, 1, 1},
      {"mean", {pos}, [](I x) { return mean(x[0]); }, 2},
      {"mean dims", {a}, [](I x) { return mean(x[0], {0}, true); }, 2, 0.5},
      {"amax", {a}, [](I x) { return amax(x[0], 1); }},
      {"softmax", {logits}, [](I x) { return softmax(x[0], 1); }, 1, 0.01},
      {"log_softmax", {logits}, [](I x) { return log_softmax(x[0], 1); }, 1, 1},
      {"matmul", {a, Normal({6, 3}, 18)}, [](I x) { return matmul(x[0], x[1]); }, 1, 1},
      {"batched matmul", {batch_a, batch_b}, [](I x) { return matmul(x[0], x[1]); }, 1, 1},
      {"linear", {a, w, wb}, [](I x) { return linear(x[0], x[1], x[2]); }, 1, 1},
      {"conv2d",
       {image, kernel, bias},
       [](I x) {
         return conv2d(x[0], x[1], x[2], {1, 1}, {1, 1});
       },
       1,
       1},
      {"conv2d strided grouped",
       {Normal({2, 4, 7, 7}, 19), grouped_kernel},
       [](I x) {
         return conv2d(x[0], x[1], Tensor(), {2, 2}, {0, 0}, {1, 1}, 4);
       },
       1,
       1},
      // Many input channels: the batched-columns layout of conv2d.
      {"conv2d wide",
       {wide, wide_kernel},
       [](I x) {
         return conv2d(x[0], x[1], Tensor(), {1, 1}, {1, 1});
       },
       1,
       1},
      {"max_pool2d",
       {image},
       [](I x) {
         return max_pool2d(x[0], {2, 2});
       }},
      {"avg_pool2d",
       {image},
       [](I x) {
         return avg_pool2d(x[0], {3, 3}, {2, 2}, {1, 1});
       },
       1,
       0.5},
      {"adaptive_avg_pool2d",
       {image},
       [](I x) {
         return adaptive_avg_pool2d(x[0], {4, 3});
       },
       1,
       0.5},
      {"nll_loss", {logits}, [targets](I x) { return nll_loss(x[0], targets); }, 2},
      {"cross_entropy", {logits}, [targets](I x) { return cross_entropy(x[0], targets); }, 2},
      {"mse_loss", {a, b}, [](I x) { return mse_loss(x[0], x[1]); }, 3},
      {"dropout",
       {a},
       [](I x) {
         Generator gen(21);
         return dropout(x[0], 0.3, /*training=*/true, &gen);
       }},
      {"cat",
       {a, b},
       [](I x) {
         return cat({x[0], x[1]}, 1);
       }},
      {"stack",
       {a, b},
       [](I x) {
         return stack({x[0], x[1]}, 0);
       }},
      {"where", {a, b}, [mask](I x) { return where(mask, x[0], x[1]); }},
      {"masked_fill", {a}, [mask](I x) { return masked_fill(x[0], mask, 0.5); }},
      {"gather", {a}, [rows](I x) { return gather(x[0], 1, rows); }},
      {"index_select", {a}, [index](I x) { return index_select(x[0], 0, index); }},
      {"topk", {a}, [](I x) { return topk(x[0], 3, 1).first; }},
      {"transpose contiguous", {a}, [](I x) { return x[0].t().contiguous(); }},
      // The fused norms: statistics in float, each output rounded once.
      {"layer_norm",
       {a, row, Normal({6}, 22)},
       [](I x) { return layer_norm(x[0], {6}, x[1], x[2], 1e-5); },
       1,
       0.5},
      {"rms_norm", {a, row}, [](I x) { return rms_norm(x[0], {6}, x[1], 1e-6); }, 1, 0.5},
      {"tril", {batch_a}, [](I x) { return tril(x[0], 1); }},
      {"triu", {batch_a}, [](I x) { return triu(x[0], -1); }},
      // Not differentiable: exact results.
      {"argmax", {a}, [](I x) { return argmax(x[0], 1); }, 1, 0, false},
      {"argmin", {a}, [](I x) { return argmin(x[0], 0); }, 1, 0, false},
      {"comparisons",
       {a, b},
       [](I x) {
         return stack({eq(x[0], x[1]), ne(x[0], x[1]), lt(x[0], x[1]), le(x[0], x[1]),
                       gt(x[0], x[1]), ge(x[0], x[1])});
       },
       1,
       0,
       false},
      {"any all",
       {a},
       [](I x) {
         return stack({any(gt(x[0], zeros({})), 1), all(x[0], 1)});
       },
       1,
       0,
       false},
  };
}

class ReducedPrecisionTest : public ::testing::TestWithParam<Precision> {};

TEST_P(ReducedPrecisionTest, EveryOpMatchesFloat32OnTheSameValues) {
  const Precision p = GetParam();
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.name + " in " + DTypeName(p.dtype));
    Inputs low, ref;
    for (const Tensor& x : c.inputs) {
      Tensor l = x.to(p.dtype);
      Tensor r = l.to(kFloat32);
      if (c.differentiable) {
        l.set_requires_grad(true);
        r.set_requires_grad(true);
      }
      low.push_back(l);
      ref.push_back(r);
    }
    Tensor out_low, out_ref;
    try {
      out_low = c.f(low);
      out_ref = c.f(ref);
    } catch (const Error& e) {
      ADD_FAILURE() << e.what();
      continue;
    }
    if (!c.differentiable) {
      EXPECT_EQ(out_low.dtype(), out_ref.dtype());
      EXPECT_EQ(Doubles(out_low), Doubles(out_ref));
      continue;
    }
    EXPECT_EQ(out_low.dtype(), p.dtype);
    ExpectClose(out_low, out_ref, p.rtol, c.factor, c.floor, "forward");
    // Backward of sum(out * weight), the weight rounded like the inputs.
    const Tensor weight = Normal(out_ref.shape(), 99).to(p.dtype);
    try {
      sum(mul(out_low, weight)).backward();
      sum(mul(out_ref, weight.to(kFloat32))).backward();
    } catch (const Error& e) {
      ADD_FAILURE() << "backward: " << e.what();
      continue;
    }
    for (size_t i = 0; i < low.size(); ++i) {
      ASSERT_TRUE(low[i].grad().defined()) << "input " << i;
      EXPECT_EQ(low[i].grad().dtype(), p.dtype) << "input " << i;
      // A backward rounds at every op of its chain: relative to the gradient's size.
      // (Its sums cancel too, as softmax's y * (g - sum(g * y)) does: hence the floor.)
      ExpectClose(low[i].grad(), ref[i].grad(), p.rtol, 4.0, 0.5 * MaxAbs(ref[i].grad()),
                  "gradient of input " + std::to_string(i));
    }
  }
}

// A small convolutional classifier's training step in 16 bits: every gradient is 16-bit and,
// as a whole, within a few times the dtype's tolerance of float32's on the same values.
TEST_P(ReducedPrecisionTest, ModelGradientsStay16BitAndCloseToFloat32) {
  const Precision p = GetParam();
  const Inputs params32 = {Normal({6, 1, 3, 3}, 31, 0.3), Normal({6}, 32, 0.1),
                           Normal({16, 24}, 33, 0.2),     Normal({16}, 34, 0.1),
                           Normal({10, 16}, 35, 0.25),    Normal({10}, 36, 0.1)};
  const Tensor images = Normal({8, 1, 8, 8}, 37).to(p.dtype);
  const Tensor labels = from_vector(std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}, {8});
  const auto loss_of = [&](const Inputs& w, const Tensor& x) {
    Tensor h = relu(conv2d(x, w[0], w[1], {1, 1}, {1, 1}));
    // avg, not max, pooling: float32's unrounded activations would pick other maxima where
    // 16-bit rounding ties them (max_pool2d itself is checked on identical inputs above).
    h = avg_pool2d(h, {3, 3}).flatten(1);
    h = gelu(linear(h, w[2], w[3]));
    h = dropout(linear(h, w[4], w[5]), 0.1, true, nullptr);
    return cross_entropy(h, labels);
  };
  Inputs low, ref;
  for (const Tensor& w : params32) {
    Tensor l = w.to(p.dtype);
    l.set_requires_grad(true);
    Tensor r = l.to(kFloat32).detach();
    r.set_requires_grad(true);
    low.push_back(l);
    ref.push_back(r);
  }
  manual_seed(5);
  const Tensor loss_low = loss_of(low, images);
  manual_seed(5);
  const Tensor loss_ref = loss_of(ref, images.to(kFloat32));
  EXPECT_EQ(loss_low.dtype(), p.dtype);
  EXPECT_NEAR(loss_low.item(), loss_ref.item(), 4 * p.rtol * std::fabs(loss_ref.item()));
  loss_low.backward();
  loss_ref.backward();
  for (size_t i = 0; i < low.size(); ++i) {
    SCOPED_TRACE("parameter " + std::to_string(i));
    const Tensor g = low[i].grad();
    ASSERT_TRUE(g.defined());
    EXPECT_EQ(g.dtype(), p.dtype);
    const std::vector<double> a = Doubles(g), r = Doubles(ref[i].grad());
    double diff = 0, norm = 0;
    for (size_t j = 0; j < a.size(); ++j) {
      diff += (a[j] - r[j]) * (a[j] - r[j]);
      norm += r[j] * r[j];
    }
    EXPECT_LE(std::sqrt(diff), 4 * p.rtol * std::sqrt(norm) + kAtol);
  }
}

INSTANTIATE_TEST_SUITE_P(BFloat16AndFloat16, ReducedPrecisionTest, ::testing::ValuesIn(kPrecisions),
                         [](const ::testing::TestParamInfo<Precision>& info) {
                           return std::string(info.param.dtype == kBFloat16 ? "BFloat16"
                                                                            : "Float16");
                         });

// The activations in 16 bits are PyTorch's, forward and backward: the float function of the
// 16-bit values (the input; for gradients the incoming gradient and the saved output or
// input), rounded once. Built from 16-bit
// ops instead (tanh's grad * (1 - y^2) as four ops), each intermediate rounds too: up to ~5
// ulps off.
TEST_P(ReducedPrecisionTest, ActivationsAndTheirGradientsAreTheFloatFormulaRoundedOnce) {
  const Precision p = GetParam();
  const Tensor x = Normal({4096}, 7, 2.0).to(p.dtype);
  const Tensor g = Normal({4096}, 8).to(p.dtype);
  const Tensor g32 = g.to(kFloat32);
  struct Activation {
    const char* name;
    std::function<Tensor(const Tensor&)> f;
    // The float formula: of the widened 16-bit output for tanh and sigmoid (the saved
    // tensor), of the input for gelu (float32 autograd on the same values).
    std::function<Tensor(const Tensor& y32, const Tensor& x32)> formula;
  };
  const auto through_float_autograd = [&g32](const std::function<Tensor(const Tensor&)>& f) {
    return [&g32, f](const Tensor&, const Tensor& x32) {
      Tensor leaf = x32.detach();
      leaf.set_requires_grad(true);
      sum(mul(f(leaf), g32)).backward();
      return leaf.grad();
    };
  };
  const Activation activations[] = {
      {"tanh", [](const Tensor& t) { return tanh(t); },
       [&g32](const Tensor& y32, const Tensor&) {
         return mul(g32, sub(ones_like(y32), mul(y32, y32)));
       }},
      {"sigmoid", [](const Tensor& t) { return sigmoid(t); },
       [&g32](const Tensor& y32, const Tensor&) {
         return mul(g32, mul(sub(ones_like(y32), y32), y32));
       }},
      {"gelu", [](const Tensor& t) { return gelu(t); },
       through_float_autograd([](const Tensor& t) { return gelu(t); })},
      {"gelu tanh", [](const Tensor& t) { return gelu(t, "tanh"); },
       through_float_autograd([](const Tensor& t) { return gelu(t, "tanh"); })},
      {"silu", [](const Tensor& t) { return silu(t); },
       through_float_autograd([](const Tensor& t) { return silu(t); })},
  };
  for (const Activation& a : activations) {
    SCOPED_TRACE(std::string(a.name) + " in " + DTypeName(p.dtype));
    Tensor leaf = x.detach();
    leaf.set_requires_grad(true);
    const Tensor y = a.f(leaf);
    // The forward too: the float function of the 16-bit input, rounded once.
    EXPECT_EQ(Doubles(y), Doubles(a.f(x.to(kFloat32)).to(p.dtype))) << "forward";
    sum(mul(y, g)).backward();
    const Tensor want = a.formula(y.detach().to(kFloat32), x.to(kFloat32)).to(p.dtype);
    ASSERT_EQ(leaf.grad().dtype(), p.dtype);
    const std::vector<double> got = Doubles(leaf.grad()), expected = Doubles(want);
    int differ = 0;
    for (size_t i = 0; i < got.size(); ++i) differ += got[i] != expected[i];
    EXPECT_EQ(differ, 0) << "of " << got.size() << " gradients differ from the float formula "
                         << "rounded once";
  }
}

// Random factories make 16-bit tensors from the float32 stream: the same seed gives the
// float32 numbers rounded (within half an ulp of the dtype).
TEST_P(ReducedPrecisionTest, RandomNumbersAreTheFloat32NumbersRounded) {
  const Precision p = GetParam();
  for (const bool normal : {false, true}) {
    SCOPED_TRACE(normal ? "randn" : "rand");
    Generator low_gen(17), ref_gen(17);
    const Tensor low = normal ? randn({256}, p.dtype, &low_gen) : rand({256}, p.dtype, &low_gen);
    const Tensor ref = normal ? randn({256}, {}, &ref_gen) : rand({256}, {}, &ref_gen);
    EXPECT_EQ(low.dtype(), p.dtype);
    // Half an ulp is at most 2^-8 of the value for bfloat16 (8 significant bits), 2^-11 for
    // float16 (11).
    const double half_ulp = p.dtype == kBFloat16 ? 1.0 / 256 : 1.0 / 2048;
    ExpectClose(low, ref, half_ulp, 1.0, 0.0, "draws");
  }
}

// PyTorch's promotion with 16-bit floats and the new integral dtypes, through every binary op.
TEST(ReducedPrecisionPromotionTest, BinaryOpsPromoteAsPyTorch) {
  const Tensor h = ones({2}, kFloat16), bf = ones({2}, kBFloat16);
  const Tensor i32 = ones({2}, kInt32), u8 = ones({2}, kUInt8), b = ones({2}, kBool);
  const Tensor f32 = ones({2}), i64 = ones({2}, kInt64);
  EXPECT_EQ(add(i32, h).dtype(), kFloat16);
  EXPECT_EQ(mul(h, i64).dtype(), kFloat16);
  EXPECT_EQ(add(h, bf).dtype(), kFloat32);
  EXPECT_EQ(sub(bf, f32).dtype(), kFloat32);
  EXPECT_EQ(add(u8, i32).dtype(), kInt32);
  EXPECT_EQ(mul(u8, b).dtype(), kUInt8);
  EXPECT_EQ(mul(bf, b).dtype(), kBFloat16);
  EXPECT_EQ(div(i32, u8).dtype(), kFloat32);  // true division of integers
  EXPECT_EQ(maximum(i32, i64).dtype(), kInt64);
  EXPECT_EQ(add(b, b).dtype(), kBool);
  // A zero-dimensional tensor only counts from a higher category.
  EXPECT_EQ(add(h, scalar_tensor(1.0, kFloat64)).dtype(), kFloat16);
  EXPECT_EQ(add(i32, scalar_tensor(1.0, kFloat64)).dtype(), kFloat64);
  EXPECT_EQ(add(u8, scalar_tensor(1, kInt64)).dtype(), kUInt8);
  EXPECT_EQ(add(b, scalar_tensor(1, kInt32)).dtype(), kInt32);
  // Scalars: a 16-bit tensor keeps its dtype; integral tensors keep theirs with whole numbers.
  EXPECT_EQ(mul(bf, 0.1).dtype(), kBFloat16);
  EXPECT_EQ(add(u8, 3.0).dtype(), kUInt8);
  EXPECT_EQ(add(i32, 0.5).dtype(), kFloat32);
  EXPECT_EQ(add(b, 1.0).dtype(), kInt64);
  // Values: int32 + float16 computes in float16.
  const Tensor sum16 = add(from_vector(std::vector<int32_t>{3, -2}, {2}),
                           from_vector(std::vector<float>{0.5f, 0.25f}, {2}, kFloat16));
  EXPECT_THAT(sum16.to(kFloat32).to_vector<float>(), ElementsAre(3.5f, -1.75f));
  // Integral and bool sums are int64; sums of bytes do not wrap.
  EXPECT_EQ(sum(u8).dtype(), kInt64);
  EXPECT_EQ(sum(full({300}, 255, kUInt8)).item<int64_t>(), 300 * 255);
  EXPECT_EQ(sum(b, {0}).dtype(), kInt64);
  EXPECT_EQ(sum(ones({2, 3}, kInt32), {1}).to_vector<int64_t>(), (std::vector<int64_t>{3, 3}));
  EXPECT_THAT(testing::ErrorOf([&] { mean(i32); }), ::testing::HasSubstr("mean: could not infer"));
  EXPECT_THAT(testing::ErrorOf([&] { sub(b, b); }),
              ::testing::HasSubstr("subtracting two bool tensors is not supported"));
  EXPECT_THAT(testing::ErrorOf([&] { neg(b); }), ::testing::HasSubstr("logical_not"));
}

TEST(LogicalTest, LogicalOpsAnyAndAll) {
  const Tensor x = from_vector(std::vector<float>{0, 2, std::nanf(""), 0}, {2, 2});
  const Tensor y = from_vector(std::vector<int32_t>{0, 0, 1, 1}, {2, 2});
  EXPECT_THAT(logical_not(x).to_vector<bool>(), ElementsAre(true, false, false, true));
  EXPECT_THAT(logical_and(x, y).to_vector<bool>(), ElementsAre(false, false, true, false));
  EXPECT_THAT(logical_or(x, y).to_vector<bool>(), ElementsAre(false, true, true, true));
  EXPECT_THAT(logical_xor(x, y).to_vector<bool>(), ElementsAre(false, true, false, true));
  EXPECT_TRUE(any(x).item<bool>());
  EXPECT_FALSE(all(x).item<bool>());
  EXPECT_EQ(any(x).dim(), 0);
  EXPECT_EQ(any(x).dtype(), kBool);
  EXPECT_THAT(any(x, 1).to_vector<bool>(), ElementsAre(true, true));
  EXPECT_THAT(all(x, 0).to_vector<bool>(), ElementsAre(false, false));
  EXPECT_THAT(all(y, 0, true).to_vector<bool>(), ElementsAre(false, false));
  EXPECT_EQ(all(y, 0, true).shape(), (Shape{1, 2}));
  EXPECT_THAT(all(ones({2, 2}, kBFloat16), 1).to_vector<bool>(), ElementsAre(true, true));
  // Over no elements: any is false, all is true.
  EXPECT_FALSE(any(zeros({0})).item<bool>());
  EXPECT_TRUE(all(zeros({0})).item<bool>());
}

}  // namespace
}  // namespace tandem
