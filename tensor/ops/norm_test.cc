// The fused ops of Note [Fused row norms]: layer_norm, rms_norm, gelu(x, "tanh"), tril and triu
// against results computed on the host in double, float64 gradient checks, and the errors for
// bad arguments. (16-bit coverage: reduced_precision_test.cc.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "tensor/gradcheck.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace tandem {
namespace {

using ::tandem::testing::ErrorOf;
using ::testing::HasSubstr;
using Inputs = std::vector<Tensor>;

Tensor Randn(const Shape& shape, uint64_t seed, double scale = 1.0, double shift = 0.0) {
  Generator gen(seed);
  return add(mul(randn(shape, {}, &gen), scale), shift);
}

Tensor Param64(const Tensor& t) {
  Tensor leaf = t.to(kFloat64).detach();
  leaf.set_requires_grad(true);
  return leaf;
}

std::vector<double> Doubles(const Tensor& t) {
  return t.detach().to(kFloat64).contiguous().to_vector<double>();
}

void ExpectNear(const Tensor& actual, const std::vector<double>& expected, double tol) {
  const std::vector<double> got = Doubles(actual);
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expected[i], tol) << "at " << i;
}

// layer_norm (rms = false) or rms_norm of each `cols`-element row of x, in double.
std::vector<double> HostNorm(bool rms, const std::vector<double>& x, int64_t cols, double eps,
                             const std::vector<double>& weight, const std::vector<double>& bias) {
  std::vector<double> out(x.size());
  for (size_t start = 0; start < x.size(); start += static_cast<size_t>(cols)) {
    double mean = 0;
    if (!rms) {
      for (int64_t j = 0; j < cols; ++j) mean += x[start + j];
      mean /= double(cols);
    }
    double var = 0;
    for (int64_t j = 0; j < cols; ++j) var += (x[start + j] - mean) * (x[start + j] - mean);
    var /= double(cols);
    for (int64_t j = 0; j < cols; ++j) {
      double v = (x[start + j] - mean) / std::sqrt(var + eps);
      if (!weight.empty()) v *= weight[j];
      if (!bias.empty()) v += bias[j];
      out[start + j] = v;
    }
  }
  return out;
}

// ---- layer_norm ------------------------------------------------------------------------

TEST(NormTest, LayerNormMatchesTheHostOverTrailingDimensions) {
  // Off-centre, scaled rows: the variance is computed about the mean, not as E[x^2] - mean^2.
  const Tensor x = Randn({2, 3, 4, 5}, 1, 3.0, 100.0);
  const Tensor w = Randn({4, 5}, 2), b = Randn({4, 5}, 3);
  const Tensor y = layer_norm(x, {4, 5}, w, b, 1e-5);
  ASSERT_EQ(y.shape(), x.shape());
  ExpectNear(y, HostNorm(false, Doubles(x), 20, 1e-5, Doubles(w), Doubles(b)), 2e-4);
  // No affine parameters, one normalised dimension, a large eps.
  ExpectNear(layer_norm(x, {5}, Tensor(), Tensor(), 0.5),
             HostNorm(false, Doubles(x), 5, 0.5, {}, {}), 2e-4);
  // Weight only, bias only.
  ExpectNear(layer_norm(x, {5}, Randn({5}, 4), Tensor()),
             HostNorm(false, Doubles(x), 5, 1e-5, Doubles(Randn({5}, 4)), {}), 2e-4);
  ExpectNear(layer_norm(x, {5}, Tensor(), Randn({5}, 5)),
             HostNorm(false, Doubles(x), 5, 1e-5, {}, Doubles(Randn({5}, 5))), 2e-4);
  // float64 in, float64 out, to double precision.
  const Tensor x64 = x.to(kFloat64);
  const Tensor y64 = layer_norm(x64, {4, 5}, w.to(kFloat64), b.to(kFloat64));
  EXPECT_EQ(y64.dtype(), kFloat64);
  ExpectNear(y64, HostNorm(false, Doubles(x64), 20, 1e-5, Doubles(w), Doubles(b)), 1e-10);
}

TEST(NormTest, LayerNormOfANonContiguousInputAndLongRows) {
  const Tensor x = Randn({6, 3}, 6).t();  // [3, 6], transposed view
  ExpectNear(layer_norm(x, {6}, Tensor(), Tensor()), HostNorm(false, Doubles(x), 6, 1e-5, {}, {}),
             1e-5);
  // Rows longer than one block of threads, more rows than a backward block.
  const Tensor wide = Randn({70, 1500}, 7);
  ExpectNear(layer_norm(wide, {1500}, Tensor(), Tensor()),
             HostNorm(false, Doubles(wide), 1500, 1e-5, {}, {}), 1e-4);
}

TEST(NormTest, LayerNormGradientsMatchFiniteDifferences) {
  const Tensor x = Param64(Randn({3, 2, 4}, 8)), w = Param64(Randn({2, 4}, 9)),
               b = Param64(Randn({2, 4}, 10));
  EXPECT_GRADIENTS_MATCH(
      [](const Inputs& in) {
        return layer_norm(in[0], {2, 4}, in[1], in[2], 1e-5);
      },
      {x, w, b});
  EXPECT_GRADIENTS_MATCH(
      [](const Inputs& in) { return layer_norm(in[0], {4}, Tensor(), Tensor(), 1e-3); }, {x});
  const Tensor w4 = Param64(Randn({4}, 11));
  EXPECT_GRADIENTS_MATCH(
      [](const Inputs& in) { return layer_norm(in[0], {4}, in[1], Tensor(), 1e-5); }, {x, w4});
  // More rows than one block of the backward's parameter sums (32).
  const Tensor many = Param64(Randn({70, 3}, 12)), w3 = Param64(Randn({3}, 13)),
               b3 = Param64(Randn({3}, 14));
  EXPECT_GRADIENTS_MATCH(
      [](const Inputs& in) { return layer_norm(in[0], {3}, in[1], in[2], 1e-5); }, {many, w3, b3});
}

TEST(NormTest, LayerNormGradientOnlyWhereNeeded) {
  Tensor x = Randn({4, 6}, 15);
  Tensor w = ones({6}), b = zeros({6});
  w.set_requires_grad(true);
  b.set_requires_grad(true);
  sum(mul(layer_norm(x, {6}, w, b), Randn({4, 6}, 16))).backward();
  EXPECT_FALSE(x.grad().defined());
  ASSERT_TRUE(w.grad().defined());
  ASSERT_TRUE(b.grad().defined());
  EXPECT_EQ(w.grad().shape(), (Shape{6}));
  // The bias's gradient is the column sum of the incoming gradient.
  const std::vector<double> g = Doubles(Randn({4, 6}, 16)), db = Doubles(b.grad());
  for (int64_t j = 0; j < 6; ++j) {
    double expected = 0;
    for (int64_t r = 0; r < 4; ++r) expected += g[r * 6 + j];
    EXPECT_NEAR(db[j], expected, 1e-5);
  }
}

TEST(NormTest, LayerNormSaysWhatWasExpected) {
  const Tensor x = Randn({2, 4, 3}, 17);
  EXPECT_THAT(ErrorOf([&] {
                layer_norm(x, {3, 4}, Tensor(), Tensor());
              }),
              HasSubstr("normalized_shape [3, 4] must equal the last 2 dimension(s) of the "
                        "input, but the input is [2, 4, 3]"));
  EXPECT_THAT(ErrorOf([&] {
                layer_norm(Randn({4}, 1), {2, 4}, Tensor(), Tensor());
              }),
              HasSubstr("but the input is [4]"));
  EXPECT_THAT(ErrorOf([&] { layer_norm(x, {}, Tensor(), Tensor()); }),
              HasSubstr("at least one dimension"));
  EXPECT_THAT(ErrorOf([&] { layer_norm(x, {3}, ones({4}), Tensor()); }),
              HasSubstr("weight must have normalized_shape [3] but has [4]"));
  EXPECT_THAT(ErrorOf([&] { layer_norm(x, {3}, Tensor(), ones({3}, kFloat64)); }),
              HasSubstr("bias is float64"));
  EXPECT_THAT(ErrorOf([&] { layer_norm(x.to(kInt64), {3}, Tensor(), Tensor()); }),
              HasSubstr("floating-point"));
  EXPECT_THAT(ErrorOf([&] { layer_norm(x, {3}, Tensor(), Tensor(), -1.0); }),
              HasSubstr("eps must be a finite value >= 0"));
}

TEST(NormTest, LayerNormOfNoRows) {
  Tensor x = zeros({0, 4});
  x.set_requires_grad(true);
  Tensor w = ones({4});
  w.set_requires_grad(true);
  const Tensor y = layer_norm(x, {4}, w, Tensor());
  EXPECT_EQ(y.shape(), (Shape{0, 4}));
  sum(y).backward();
  EXPECT_EQ(Doubles(w.grad()), (std::vector<double>{0, 0, 0, 0}));
}

// ---- add_layer_norm (Note [Fused residual norm]) ---------------------------------------

// The fused op against add then layer_norm, in every floating dtype: the sum and the norm the
// same values (one rounding of the sum on both, then the same kernel); the gradients of input,
// residual, weight and bias within two units in the dtype's last place of add then layer_norm
// in float64 on the same values (the fused backward rounds once where the composed one rounds
// the norm's gradient before adding the stream's: it is the more accurate of the two).
TEST(NormTest, AddLayerNormEqualsAddThenLayerNormInEveryDtype) {
  for (DType dtype : {kFloat32, kFloat64, kBFloat16, kFloat16}) {
    SCOPED_TRACE(::testing::Message() << dtype);
    Inputs fused, oracle;
    for (uint64_t seed : {21, 22, 23, 24}) {
      const Tensor t =
          (seed <= 22 ? Randn({3, 5, 40}, seed, 1.0, 2.0) : Randn({40}, seed)).to(dtype).detach();
      fused.push_back(t.detach());
      oracle.push_back(t.to(kFloat64).detach());
      fused.back().set_requires_grad(true);
      oracle.back().set_requires_grad(true);
    }
    const auto [sum, y] = add_layer_norm(fused[0], fused[1], {40}, fused[2], fused[3], 1e-5);
    EXPECT_EQ(sum.dtype(), dtype);
    EXPECT_EQ(y.dtype(), dtype);
    {
      NoGradGuard no_grad;
      const Tensor sum_c = add(fused[0], fused[1]);
      ExpectNear(sum, Doubles(sum_c), 0.0);
      ExpectNear(y, Doubles(layer_norm(sum_c, {40}, fused[2], fused[3], 1e-5)), 0.0);
    }
    // Both outputs get a gradient, as a block's stream and its norm do.
    const Tensor g_sum = Randn({3, 5, 40}, 25).to(dtype), g_y = Randn({3, 5, 40}, 26).to(dtype);
    (sum * g_sum + y * g_y).sum().backward();
    // The oracle normalises the sum rounded to the dtype, as the op does, its gradient the
    // identity's.
    const Tensor exact = add(oracle[0], oracle[1]);
    const Tensor sum64 = exact + (exact.detach().to(dtype).to(kFloat64) - exact.detach());
    const Tensor y64 = layer_norm(sum64, {40}, oracle[2], oracle[3], 1e-5);
    (sum64 * g_sum.to(kFloat64) + y64 * g_y.to(kFloat64)).sum().backward();
    const double ulp = dtype == kBFloat16  ? 0x1p-8
                       : dtype == kFloat16 ? 0x1p-11
                       : dtype == kFloat32 ? 0x1p-24
                                           : 0x1p-53;
    for (int i = 0; i < 4; ++i) {
      SCOPED_TRACE(::testing::Message() << "gradient of input " << i);
      ASSERT_TRUE(fused[i].grad().defined());
      EXPECT_EQ(fused[i].grad().dtype(), dtype);
      const std::vector<double> got = Doubles(fused[i].grad()), want = Doubles(oracle[i].grad());
      ASSERT_EQ(got.size(), want.size());
      for (size_t k = 0; k < got.size(); ++k) {
        EXPECT_NEAR(got[k], want[k], 1e-5 + 2 * ulp * std::abs(want[k])) << "at " << k;
      }
    }
  }
}

TEST(NormTest, AddLayerNormGradientsMatchFiniteDifferences) {
  const Tensor x = Param64(Randn({3, 2, 4}, 31)), r = Param64(Randn({3, 2, 4}, 32));
  const Tensor w = Param64(Randn({4}, 33)), b = Param64(Randn({4}, 34));
  // Each output alone, and both (the stream's gradient added into the norm's).
  for (int which : {0, 1, 2}) {
    SCOPED_TRACE(::testing::Message() << "output " << which);
    const auto f = [which](const Inputs& in) {
      const auto [sum, y] = add_layer_norm(in[0], in[1], {4}, in[2], in[3], 1e-5);
      return which == 0 ? sum : which == 1 ? y : sum * 0.5 + y;
    };
    EXPECT_GRADIENTS_MATCH(f, {x, r, w, b});
    EXPECT_GRADGRADIENTS_MATCH(f, {x, r, w, b});
  }
  EXPECT_GRADIENTS_MATCH(
      [](const Inputs& in) {
        const auto [sum, y] = add_layer_norm(in[0], in[1], {2, 4}, Tensor(), Tensor(), 1e-3);
        return y * sum;
      },
      {x, r});
}

TEST(NormTest, AddLayerNormComposesWhatItDoesNotFuseAndChecksItsArguments) {
  // A broadcast residual and mixed dtypes go through add and layer_norm.
  const Tensor x = Randn({2, 3, 4}, 41), row = Randn({4}, 42);
  const auto [sum, y] = add_layer_norm(x, row, {4}, Tensor(), Tensor(), 1e-5);
  ExpectNear(sum, Doubles(add(x, row)), 0.0);
  ExpectNear(y, Doubles(layer_norm(add(x, row), {4}, Tensor(), Tensor(), 1e-5)), 0.0);
  const auto [sum64, y64] = add_layer_norm(x.to(kFloat64), x, {4}, Tensor(), Tensor(), 1e-5);
  EXPECT_EQ(y64.dtype(), kFloat64);
  EXPECT_THAT(ErrorOf([&] { add_layer_norm(x, Tensor(), {4}, Tensor(), Tensor()); }),
              HasSubstr("add_layer_norm"));
  EXPECT_THAT(ErrorOf([&] { add_layer_norm(x, x, {3}, Tensor(), Tensor()); }),
              HasSubstr("add_layer_norm: normalized_shape [3] must equal the last 1 dimension(s)"));
  EXPECT_THAT(ErrorOf([&] { add_layer_norm(x, x, {4}, Tensor(), Tensor(), -1.0); }),
              HasSubstr("eps must be a finite value >= 0"));
  const Tensor ints = zeros({2, 4}, TensorOptions(kInt64));
  EXPECT_THAT(ErrorOf([&] { add_layer_norm(ints, ints, {4}, Tensor(), Tensor()); }),
              HasSubstr("add_layer_norm"));
}

TEST(NormTest, AddLayerNormRefusesASecondBackwardAfterFreeing) {
  Tensor x = Randn({2, 4}, 51).detach();
  x.set_requires_grad(true);
  const auto [sum, y] = add_layer_norm(x, x, {4}, Tensor(), Tensor());
  const Tensor loss = (sum + y).sum();
  loss.backward();
  EXPECT_THAT(ErrorOf([&] { loss.backward(); }), HasSubstr("a second time"));
}

// ---- rms_norm --------------------------------------------------------------------------

TEST(NormTest, RmsNormMatchesTheHost) {
  const Tensor x = Randn({3, 2, 8}, 20, 2.0, 0.5), w = Randn({2, 8}, 21);
  ExpectNear(rms_norm(x, {2, 8}, w, 1e-6), HostNorm(true, Doubles(x), 16, 1e-6, Doubles(w), {}),
             1e-5);
  ExpectNear(rms_norm(x, {8}, Tensor(), 0.25), HostNorm(true, Doubles(x), 8, 0.25, {}, {}), 1e-5);
  // eps defaults to the dtype's machine epsilon: visible on an all-zero row, where
  // y = x / sqrt(eps) would otherwise divide by zero, and on tiny rows.
  const Tensor tiny = mul(ones({1, 4}), 1e-4);
  ExpectNear(rms_norm(tiny, {4}, Tensor()),
             HostNorm(true, Doubles(tiny), 4, std::numeric_limits<float>::epsilon(), {}, {}), 1e-6);
  const Tensor tiny64 = tiny.to(kFloat64);
  ExpectNear(rms_norm(tiny64, {4}, Tensor()),
             HostNorm(true, Doubles(tiny64), 4, std::numeric_limits<double>::epsilon(), {}, {}),
             1e-12);
  EXPECT_EQ(Doubles(rms_norm(zeros({2, 3}), {3}, Tensor())), std::vector<double>(6, 0.0));
  // The 16-bit floats compute in float and default to float's epsilon, as current PyTorch
  // (not their own 2^-7 or 2^-10, which would halve these tiny rows).
  for (DType dtype : {kBFloat16, kFloat16}) {
    const Tensor tiny16 = tiny.to(dtype);
    const std::vector<double> want =
        HostNorm(true, Doubles(tiny16), 4, std::numeric_limits<float>::epsilon(), {}, {});
    const std::vector<double> got = Doubles(rms_norm(tiny16, {4}, Tensor()));
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-2) << dtype;
  }
}

TEST(NormTest, RmsNormGradientsMatchFiniteDifferences) {
  const Tensor x = Param64(Randn({4, 5}, 22)), w = Param64(Randn({5}, 23));
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return rms_norm(in[0], {5}, in[1], 1e-5); },
                         {x, w});
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return rms_norm(in[0], {4, 5}, Tensor()); }, {x});
}

TEST(NormTest, RmsNormSaysWhatWasExpected) {
  EXPECT_THAT(ErrorOf([] {
                rms_norm(zeros({2, 3}), {2}, Tensor());
              }),
              HasSubstr("rms_norm: normalized_shape [2] must equal the last 1 dimension(s)"));
  EXPECT_THAT(ErrorOf([] {
                rms_norm(zeros({2, 3}), {3}, ones({2, 3}));
              }),
              HasSubstr("weight must have normalized_shape [3]"));
}

// ---- gelu tanh -------------------------------------------------------------------------

TEST(NormTest, GeluTanhMatchesTheFormulaAndItsDerivative) {
  const Tensor x = Randn({1000}, 30, 3.0);
  Tensor leaf = x.detach();
  leaf.set_requires_grad(true);
  const Tensor y = gelu(leaf, "tanh");
  sum(y).backward();
  const std::vector<double> xs = Doubles(x), ys = Doubles(y), gs = Doubles(leaf.grad());
  const double k = std::sqrt(2.0 / M_PI);
  for (size_t i = 0; i < xs.size(); ++i) {
    const double v = xs[i], u = k * (v + 0.044715 * v * v * v), t = std::tanh(u);
    EXPECT_NEAR(ys[i], 0.5 * v * (1 + t), 1e-5 * (1 + std::fabs(v))) << v;
    const double dy = 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * k * (1 + 3 * 0.044715 * v * v);
    EXPECT_NEAR(gs[i], dy, 1e-5) << v;
  }
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return gelu(in[0], "tanh"); },
                         {Param64(Randn({4, 5}, 31, 2.0))});
  // Integer inputs promote to float32, as the erf form does.
  EXPECT_EQ(gelu(from_vector(std::vector<int64_t>{-1, 0, 2}, {3}), "tanh").dtype(), kFloat32);
}

// ---- tril / triu -----------------------------------------------------------------------

std::vector<double> HostTriangle(bool lower, const std::vector<double>& x, int64_t rows,
                                 int64_t cols, int64_t diagonal) {
  std::vector<double> out(x.size());
  for (size_t k = 0; k < x.size(); ++k) {
    const int64_t j = static_cast<int64_t>(k) % cols, i = (static_cast<int64_t>(k) / cols) % rows;
    const bool keep = lower ? j - i <= diagonal : j - i >= diagonal;
    out[k] = keep ? x[k] : 0.0;
  }
  return out;
}

TEST(NormTest, TrilTriuKeepTheirTrianglesForEveryDiagonal) {
  const Tensor x = Randn({2, 4, 6}, 40);
  for (int64_t diagonal = -5; diagonal <= 7; ++diagonal) {
    SCOPED_TRACE(diagonal);
    EXPECT_EQ(Doubles(tril(x, diagonal)), HostTriangle(true, Doubles(x), 4, 6, diagonal));
    EXPECT_EQ(Doubles(triu(x, diagonal)), HostTriangle(false, Doubles(x), 4, 6, diagonal));
  }
  // A transposed (non-contiguous) view, tall matrices.
  const Tensor t = Randn({5, 3}, 41).t().contiguous().t();
  EXPECT_EQ(Doubles(tril(t, -1)), HostTriangle(true, Doubles(t), 5, 3, -1));
}

TEST(NormTest, TrilTriuTakeEveryDtype) {
  const Tensor mask = tril(ones({3, 3}, kBool));
  EXPECT_EQ(mask.dtype(), kBool);
  EXPECT_EQ(mask.to_vector<bool>(),
            (std::vector<bool>{true, false, false, true, true, false, true, true, true}));
  for (DType dtype : {kInt64, kInt32, kUInt8, kBFloat16, kFloat16, kFloat64}) {
    SCOPED_TRACE(DTypeName(dtype));
    const Tensor x = add(Randn({3, 4}, 42, 5.0), 10.0).to(dtype);
    EXPECT_EQ(triu(x, 1).dtype(), dtype);
    EXPECT_EQ(Doubles(triu(x, 1)), HostTriangle(false, Doubles(x), 3, 4, 1));
  }
}

TEST(NormTest, TrilTriuGradientsAreTheirTriangles) {
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return tril(in[0], 1); },
                         {Param64(Randn({2, 3, 4}, 43))});
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return triu(in[0], -1); },
                         {Param64(Randn({4, 3}, 44))});
  EXPECT_THAT(ErrorOf([] { tril(zeros({4})); }), HasSubstr("at least 2 dimensions"));
}

}  // namespace
}  // namespace tandem
