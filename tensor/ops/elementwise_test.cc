// Tests of the elementwise ops (tensor/ops/elementwise.cc, logical.cc): values against the host,
// dtype promotion, errors, autograd bookkeeping, gradient checks, and NaN/infinity semantics.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "tensor/core/autograd.h"
#include "tensor/gradcheck.h"
#include "tensor/ops/ops_testing.h"
#include "tensor/runtime/devices.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace tandem {
namespace ops_testing {
namespace {

// ---- Elementwise ---------------------------------------------------------------------------

struct BinaryCase {
  Shape a, b;
};

const std::vector<BinaryCase>& BroadcastCases() {
  static const std::vector<BinaryCase> cases = {{{2, 3}, {2, 3}}, {{2, 3}, {3}},
                                                {{2, 1}, {1, 3}}, {{4, 1, 3}, {2, 1}},
                                                {{}, {2, 3}},     {{3}, {}},
                                                {{0, 3}, {3}},    {{2, 0}, {1, 1}},
                                                {{1}, {5}},       {{3, 1, 1}, {1, 2, 2}}};
  return cases;
}

void CheckBinaryAgainstHost(const std::function<Tensor(const Tensor&, const Tensor&)>& op,
                            const std::function<float(float, float)>& reference, bool positive_b,
                            const char* name) {
  uint64_t seed = 100;
  for (const BinaryCase& c : BroadcastCases()) {
    SCOPED_TRACE(std::string(name) + " " + ShapeToString(c.a) + " with " + ShapeToString(c.b));
    const Tensor a = Randn(c.a, ++seed);
    const Tensor b = positive_b ? Uniform(c.b, 0.5, 2.0, ++seed) : Randn(c.b, ++seed);
    const Shape shape = BroadcastShape(c.a, c.b);
    const std::vector<float> av = Values(a), bv = Values(b);
    std::vector<float> expected(NumElements(shape));
    for (int64_t i = 0; i < static_cast<int64_t>(expected.size()); ++i) {
      expected[i] =
          reference(av[BroadcastSource(i, shape, c.a)], bv[BroadcastSource(i, shape, c.b)]);
    }
    ExpectValues(op(a, b), shape, expected, 1e-6);
  }
}

TEST_F(OpsTest, BinaryOpsBroadcastAndMatchTheHost) {
  CheckBinaryAgainstHost([](auto& a, auto& b) { return add(a, b); },
                         [](float x, float y) { return x + y; }, false, "add");
  CheckBinaryAgainstHost([](auto& a, auto& b) { return sub(a, b); },
                         [](float x, float y) { return x - y; }, false, "sub");
  CheckBinaryAgainstHost([](auto& a, auto& b) { return mul(a, b); },
                         [](float x, float y) { return x * y; }, false, "mul");
  CheckBinaryAgainstHost([](auto& a, auto& b) { return div(a, b); },
                         [](float x, float y) { return x / y; }, true, "div");
  CheckBinaryAgainstHost([](auto& a, auto& b) { return maximum(a, b); },
                         [](float x, float y) { return std::max(x, y); }, false, "maximum");
  CheckBinaryAgainstHost([](auto& a, auto& b) { return minimum(a, b); },
                         [](float x, float y) { return std::min(x, y); }, false, "minimum");
  CheckBinaryAgainstHost([](auto& a, auto& b) { return a + b; },
                         [](float x, float y) { return x + y; }, false, "operator+");
  CheckBinaryAgainstHost([](auto& a, auto& b) { return a - b; },
                         [](float x, float y) { return x - y; }, false, "operator-");
  CheckBinaryAgainstHost([](auto& a, auto& b) { return a * b; },
                         [](float x, float y) { return x * y; }, false, "operator*");
  CheckBinaryAgainstHost([](auto& a, auto& b) { return a / b; },
                         [](float x, float y) { return x / y; }, true, "operator/");
}

std::vector<bool> Bools(const Tensor& t) { return t.to(Device::Cpu()).to_vector<bool>(); }

TEST_F(OpsTest, ComparisonsGiveBoolTensors) {
  const Tensor a = from_vector(std::vector<float>{1, 2, 3, 4}, {4});
  const Tensor b = from_vector(std::vector<float>{2, 2, 2, 2}, {4});
  EXPECT_EQ(eq(a, b).dtype(), kBool);
  EXPECT_THAT(Bools(eq(a, b)), ElementsAre(false, true, false, false));
  EXPECT_THAT(Bools(ne(a, b)), ElementsAre(true, false, true, true));
  EXPECT_THAT(Bools(lt(a, b)), ElementsAre(true, false, false, false));
  EXPECT_THAT(Bools(le(a, b)), ElementsAre(true, true, false, false));
  EXPECT_THAT(Bools(gt(a, b)), ElementsAre(false, false, true, true));
  EXPECT_THAT(Bools(ge(a, b)), ElementsAre(false, true, true, true));
  // Broadcasting; int64 inputs give bool too.
  const Tensor labels = Labels(std::vector<int64_t>{0, 1, 2}, {3});
  const Tensor column = Labels(std::vector<int64_t>{1, 2}, {2, 1});
  const Tensor hits = eq(labels, column);
  EXPECT_EQ(hits.dtype(), kBool);
  EXPECT_EQ(hits.shape(), (Shape{2, 3}));
  EXPECT_THAT(Bools(hits), ElementsAre(false, true, false, false, false, true));
  // Mixed dtypes compare in the promoted dtype: 1 < 1.5 in float32, not 1 < 1 in int64.
  EXPECT_THAT(Bools(lt(labels, from_vector(std::vector<float>{1.5f}, {1}))),
              ElementsAre(true, true, false));
  // Counting and averaging hits as PyTorch does: sum gives int64, mean needs a float.
  EXPECT_EQ(sum(hits).dtype(), kInt64);
  EXPECT_EQ(sum(hits).item<int64_t>(), 2);
  EXPECT_NEAR(hits.to(kFloat32).mean().item(), 2.0 / 6.0, 1e-7);
  // A bool tensor promotes to the other operand's dtype in arithmetic.
  EXPECT_EQ(mul(a, gt(a, b)).dtype(), kFloat32);
  EXPECT_THAT(Values(mul(a, gt(a, b))), ElementsAre(0, 0, 3, 4));
  // Not differentiable: no graph even for inputs that require grad.
  const Tensor p = Param(a);
  EXPECT_FALSE(gt(p, b).requires_grad());
}

TEST_F(OpsTest, Int64ArithmeticStaysInt64AndMixingPromotes) {
  const Tensor a = Labels(std::vector<int64_t>{1, -2, 3, 7}, {2, 2});
  const Tensor b = Labels(std::vector<int64_t>{4, 5}, {2});
  EXPECT_EQ(add(a, b).dtype(), kInt64);
  EXPECT_THAT(add(a, b).to_vector<int64_t>(), ElementsAre(5, 3, 7, 12));
  EXPECT_THAT(sub(a, b).to_vector<int64_t>(), ElementsAre(-3, -7, -1, 2));
  EXPECT_THAT(mul(a, b).to_vector<int64_t>(), ElementsAre(4, -10, 12, 35));
  EXPECT_THAT(maximum(a, b).to_vector<int64_t>(), ElementsAre(4, 5, 4, 7));
  EXPECT_THAT(minimum(a, b).to_vector<int64_t>(), ElementsAre(1, -2, 3, 5));
  EXPECT_THAT(neg(a).to_vector<int64_t>(), ElementsAre(-1, 2, -3, -7));
  EXPECT_THAT(abs(a).to_vector<int64_t>(), ElementsAre(1, 2, 3, 7));
  EXPECT_THAT(square(a).to_vector<int64_t>(), ElementsAre(1, 4, 9, 49));
  EXPECT_THAT(relu(a).to_vector<int64_t>(), ElementsAre(1, 0, 3, 7));
  EXPECT_EQ(relu(a).dtype(), kInt64);
  EXPECT_THAT(add(a, 2.0).to_vector<int64_t>(), ElementsAre(3, 0, 5, 9));
  EXPECT_THAT(mul(a, 3.0).to_vector<int64_t>(), ElementsAre(3, -6, 9, 21));
  EXPECT_THAT((a - 1.0).to_vector<int64_t>(), ElementsAre(0, -3, 2, 6));
  EXPECT_THAT((10.0 - a).to_vector<int64_t>(), ElementsAre(9, 12, 7, 3));
  // A fractional scalar, true division and float functions promote to float32.
  EXPECT_EQ(add(a, 0.5).dtype(), kFloat32);
  EXPECT_THAT(Values(add(a, 0.5)), ElementsAre(1.5f, -1.5f, 3.5f, 7.5f));
  EXPECT_THAT(Values(mul(a, 0.5)), ElementsAre(0.5f, -1.0f, 1.5f, 3.5f));
  EXPECT_THAT(Values(a / 2.0), ElementsAre(0.5f, -1.0f, 1.5f, 3.5f));
  EXPECT_THAT(Values(div(a, b)), ElementsAre(0.25f, -0.4f, 0.75f, 1.4f));
  EXPECT_EQ(exp(a).dtype(), kFloat32);
  EXPECT_NEAR(Values(exp(a))[0], std::exp(1.0f), 1e-6);
  EXPECT_NEAR(Values(sqrt(b))[0], 2.0f, 1e-6);
  EXPECT_NEAR(Values(pow(b, 0.5))[1], std::sqrt(5.0f), 1e-6);
  // int64 + float32 promotes to float32.
  const Tensor f = from_vector(std::vector<float>{0.5f, 0.25f}, {2});
  EXPECT_EQ(add(a, f).dtype(), kFloat32);
  EXPECT_THAT(Values(add(a, f)), ElementsAre(1.5f, -1.75f, 3.5f, 7.25f));
  EXPECT_THAT(Values(mul(f, a)), ElementsAre(0.5f, -0.5f, 1.5f, 1.75f));
  // Reductions keep int64.
  EXPECT_EQ(sum(a).dtype(), kInt64);
  EXPECT_EQ(sum(a).item<int64_t>(), 9);
  EXPECT_THAT(sum(a, {0}).to_vector<int64_t>(), ElementsAre(4, 5));
  EXPECT_THAT(amax(a, 1).to_vector<int64_t>(), ElementsAre(1, 7));
  EXPECT_THAT(argmax(a, 0).to_vector<int64_t>(), ElementsAre(1, 1));
  EXPECT_THAT(argmin(a, 1).to_vector<int64_t>(), ElementsAre(1, 0));
}

TEST_F(OpsTest, Int64OnlyOpsThatNeedFloatSayHowToConvert) {
  const Tensor labels = Labels(std::vector<int64_t>{1, 2, 3, 4}, {2, 2});
  EXPECT_THAT(ErrorOf([&] { mean(labels); }),
              HasSubstr("mean: could not infer the output dtype; the input must be "
                        "floating-point (float32, float64, bfloat16 or float16) but is int64"));
  EXPECT_THAT(ErrorOf([&] { softmax(labels, 1); }),
              HasSubstr("softmax: input must be a floating-point tensor (float32, float64, "
                        "bfloat16 or float16) but is int64"));
  EXPECT_THAT(ErrorOf([&] { log_softmax(labels, 1); }), HasSubstr("log_softmax: input must be"));
  EXPECT_THAT(ErrorOf([&] { matmul(labels, labels); }),
              HasSubstr("matmul: a must be a floating-point tensor (float32, float64, bfloat16 "
                        "or float16) but is int64; convert it with .to(kFloat32)"));
  EXPECT_THAT(ErrorOf([&] { mse_loss(labels, labels); }), HasSubstr("mse_loss: input must be"));
  EXPECT_THAT(ErrorOf([&] { dropout(labels, 0.5, true); }), HasSubstr("dropout: input must be"));
}

struct UnaryCase {
  const char* name;
  std::function<Tensor(const Tensor&)> op;
  std::function<float(float)> reference;
  double low, high;  // input range
};

std::vector<UnaryCase> UnaryCases() {
  return {
      {"neg", [](const Tensor& x) { return neg(x); }, [](float x) { return -x; }, -3, 3},
      {"operator-", [](const Tensor& x) { return -x; }, [](float x) { return -x; }, -3, 3},
      {"exp", [](const Tensor& x) { return exp(x); }, [](float x) { return std::exp(x); }, -3, 3},
      {"log", [](const Tensor& x) { return log(x); }, [](float x) { return std::log(x); }, 0.1, 5},
      {"sqrt", [](const Tensor& x) { return sqrt(x); }, [](float x) { return std::sqrt(x); }, 0, 5},
      {"abs", [](const Tensor& x) { return abs(x); }, [](float x) { return std::fabs(x); }, -3, 3},
      {"tanh", [](const Tensor& x) { return tanh(x); }, [](float x) { return std::tanh(x); }, -3,
       3},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); },
       [](float x) { return 1.0f / (1.0f + std::exp(-x)); }, -6, 6},
      {"silu", [](const Tensor& x) { return silu(x); },
       [](float x) { return x / (1.0f + std::exp(-x)); }, -6, 6},
      {"square", [](const Tensor& x) { return square(x); }, [](float x) { return x * x; }, -3, 3},
      {"relu", [](const Tensor& x) { return relu(x); }, [](float x) { return x > 0 ? x : 0.0f; },
       -3, 3},
      {"pow 2.5", [](const Tensor& x) { return pow(x, 2.5); },
       [](float x) { return std::pow(x, 2.5f); }, 0.1, 3},
      {"pow 3", [](const Tensor& x) { return pow(x, 3.0); }, [](float x) { return x * x * x; }, -2,
       2},
      {"pow -1", [](const Tensor& x) { return pow(x, -1.0); }, [](float x) { return 1.0f / x; },
       0.5, 3},
      {"add scalar", [](const Tensor& x) { return x + 1.5; }, [](float x) { return x + 1.5f; }, -3,
       3},
      {"scalar add", [](const Tensor& x) { return 1.5 + x; }, [](float x) { return x + 1.5f; }, -3,
       3},
      {"sub scalar", [](const Tensor& x) { return x - 1.5; }, [](float x) { return x - 1.5f; }, -3,
       3},
      {"scalar sub", [](const Tensor& x) { return 1.5 - x; }, [](float x) { return 1.5f - x; }, -3,
       3},
      {"mul scalar", [](const Tensor& x) { return x * -2.5; }, [](float x) { return x * -2.5f; },
       -3, 3},
      {"scalar mul", [](const Tensor& x) { return -2.5 * x; }, [](float x) { return x * -2.5f; },
       -3, 3},
      {"div scalar", [](const Tensor& x) { return x / 4.0; }, [](float x) { return x / 4.0f; }, -3,
       3},
      {"method relu", [](const Tensor& x) { return x.relu(); },
       [](float x) { return x > 0 ? x : 0.0f; }, -3, 3},
      {"method exp", [](const Tensor& x) { return x.exp(); }, [](float x) { return std::exp(x); },
       -3, 3},
      {"method log", [](const Tensor& x) { return x.log(); }, [](float x) { return std::log(x); },
       0.1, 3},
  };
}

TEST_F(OpsTest, UnaryOpsMatchTheHost) {
  uint64_t seed = 300;
  for (const UnaryCase& c : UnaryCases()) {
    for (const Shape& shape : {Shape{}, Shape{7}, Shape{3, 5}, Shape{0, 4}}) {
      SCOPED_TRACE(std::string(c.name) + " " + ShapeToString(shape));
      const Tensor x = Uniform(shape, c.low, c.high, ++seed);
      std::vector<float> expected;
      for (float v : Values(x)) expected.push_back(c.reference(v));
      ExpectValues(c.op(x), shape, expected, 2e-6);
      // Strided (non-contiguous) inputs give the same values.
      if (shape.size() == 2) {
        const Tensor xt = x.t().contiguous().t();
        ASSERT_FALSE(xt.is_contiguous() && shape[0] > 1);
        ExpectValues(c.op(xt), shape, expected, 2e-6);
      }
    }
  }
}

TEST_F(OpsTest, ElementwiseErrorsNameTheOpShapesAndDevices) {
  EXPECT_THAT(ErrorOf([] {
                add(zeros({2, 3}), zeros({4}));
              }),
              HasSubstr("add: shapes [2, 3] and [4] cannot be broadcast together"));
  EXPECT_THAT(ErrorOf([] {
                mul(zeros({2, 3}), zeros({3, 2}));
              }),
              HasSubstr("mul: shapes [2, 3] and [3, 2] cannot be broadcast"));
  EXPECT_THAT(ErrorOf([] { add(zeros({2}), zeros({2}, Device::Cpu(1))); }),
              HasSubstr("add: a is on cpu:0 and b on cpu:1; all inputs of an op must be on one "
                        "device: move one with .to(cpu:0)"));
  EXPECT_THAT(ErrorOf([] { maximum(zeros({2}, Device::Cpu(1)), zeros({2})); }),
              HasSubstr("maximum: a is on cpu:1 and b on cpu:0"));
  EXPECT_THAT(ErrorOf([] { eq(zeros({2}), zeros({2}, Device::Cpu(1))); }),
              HasSubstr("eq: a is on cpu:0 and b on cpu:1"));
  EXPECT_THAT(ErrorOf([] { sub(Tensor(), zeros({2})); }),
              HasSubstr("sub: a is an undefined Tensor"));
  EXPECT_THAT(ErrorOf([] { exp(Tensor()); }), HasSubstr("exp: input is an undefined Tensor"));
  EXPECT_THAT(ErrorOf([] { Tensor() + 1.0; }), HasSubstr("add: a is an undefined Tensor"));
}

TEST_F(OpsTest, OpsRunOnTheInputsDevice) {
  const Device cpu1 = Device::Cpu(1);
  const Tensor a = Randn({3, 4}, 1).to(cpu1);
  const Tensor b = Randn({4}, 2).to(cpu1);
  const Tensor y = relu(add(mul(a, b), 1.0)).sum({1});
  EXPECT_EQ(y.device(), cpu1);
  const Tensor expected = relu(add(mul(a.to(Device::Cpu(0)), b.to(Device::Cpu(0))), 1.0)).sum({1});
  EXPECT_TRUE(allclose(y.to(Device::Cpu(0)), expected));
  EXPECT_EQ(matmul(a, a.t()).device(), cpu1);
  EXPECT_EQ(cross_entropy(a, Labels(std::vector<int64_t>{0, 1, 3}, {3}, cpu1)).device(), cpu1);
}

TEST_F(OpsTest, AllcloseComparesOnTheHost) {
  const Tensor a = from_vector(std::vector<float>{1.0f, 2.0f, INFINITY}, {3});
  EXPECT_TRUE(allclose(a, a));
  EXPECT_TRUE(allclose(a, from_vector(std::vector<float>{1.0f + 1e-6f, 2.0f, INFINITY}, {3})));
  EXPECT_FALSE(allclose(a, from_vector(std::vector<float>{1.001f, 2.0f, INFINITY}, {3})));
  EXPECT_TRUE(allclose(a, from_vector(std::vector<float>{1.001f, 2.0f, INFINITY}, {3}), 1e-2));
  EXPECT_TRUE(allclose(a, from_vector(std::vector<float>{1.001f, 2.0f, INFINITY}, {3}), 0.0, 1e-2));
  EXPECT_FALSE(allclose(a, from_vector(std::vector<float>{1.0f, 2.0f, -INFINITY}, {3})));
  EXPECT_FALSE(allclose(from_vector(std::vector<float>{NAN}, {1}),
                        from_vector(std::vector<float>{NAN}, {1})));
  EXPECT_FALSE(allclose(zeros({2, 3}), zeros({3, 2})));
  EXPECT_FALSE(allclose(zeros({3}), zeros({1, 3})));
  EXPECT_TRUE(allclose(arange(4, kInt64), arange(4, kInt64).to(kFloat32)));
  EXPECT_TRUE(allclose(ones({2}, Device::Cpu(1)), ones({2})));
  EXPECT_TRUE(allclose(zeros({2, 3}).t(), zeros({3, 2})));
  EXPECT_THAT(ErrorOf([] { allclose(Tensor(), zeros({1})); }),
              HasSubstr("allclose: a is an undefined Tensor"));
}

// ---- Autograd bookkeeping ----------------------------------------------------------------

TEST_F(OpsTest, RecordsAGraphOnlyWhenAnInputNeedsGrad) {
  const Tensor x = Randn({2, 3}, 101);
  EXPECT_FALSE(add(x, x).requires_grad());
  EXPECT_EQ(add(x, x).grad_fn(), nullptr);
  const Tensor w = Param(Randn({2, 3}, 102));
  EXPECT_TRUE(mul(x, w).requires_grad());
  EXPECT_EQ(mul(x, w).grad_fn()->name(), "MulBackward");
  EXPECT_EQ(matmul(x, w.t()).grad_fn()->name(), "MatmulBackward");
  {
    NoGradGuard no_grad;
    EXPECT_FALSE(mul(x, w).requires_grad());
    EXPECT_FALSE(cross_entropy(w, zeros({2}, kInt64)).requires_grad());
  }
}

TEST_F(OpsTest, BroadcastGradientsHaveTheInputsShapes) {
  Tensor a = Param(Randn({2, 3}, 111));
  Tensor b = Param(Randn({3}, 112));
  Tensor s = Param(scalar_tensor(2.0));
  sum(mul(add(a, b), s)).backward();
  ASSERT_TRUE(a.grad().defined() && b.grad().defined() && s.grad().defined());
  EXPECT_EQ(a.grad().shape(), (Shape{2, 3}));
  EXPECT_EQ(b.grad().shape(), (Shape{3}));
  EXPECT_EQ(s.grad().shape(), Shape{});
  ExpectValues(a.grad(), {2, 3}, std::vector<float>(6, 2.0f));
  ExpectValues(b.grad(), {3}, std::vector<float>(3, 4.0f));
  EXPECT_NEAR(s.grad().item(), sum(add(a, b)).item(), 1e-5);
}

TEST_F(OpsTest, MaximumSplitsTheGradientOnTies) {
  Tensor a = Param(from_vector(std::vector<float>{1, 2, 5}, {3}));
  Tensor b = Param(from_vector(std::vector<float>{1, 3, 4}, {3}));
  sum(maximum(a, b)).backward();
  ExpectValues(a.grad(), {3}, {0.5f, 0, 1});
  ExpectValues(b.grad(), {3}, {0.5f, 1, 0});
}

// ---- Gradient checks ---------------------------------------------------------------------

TEST_F(OpsTest, GradientsOfBroadcastingBinaryOps) {
  for (const BinaryCase& c : std::vector<BinaryCase>{
           {{2, 3}, {2, 3}}, {{2, 3}, {3}}, {{2, 1}, {1, 3}}, {{}, {2, 3}}, {{3, 1, 2}, {2}}}) {
    SCOPED_TRACE(ShapeToString(c.a) + " with " + ShapeToString(c.b));
    const Tensor a = Param64(Randn(c.a, 201)), b = Param64(Randn(c.b, 202));
    const Tensor positive_b = Param64(Uniform(c.b, 0.5, 1.5, 203));
    EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return add(in[0], in[1]); }, {a, b}, kLinearEps);
    EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return sub(in[0], in[1]); }, {a, b}, kLinearEps);
    EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return mul(in[0], in[1]); }, {a, b});
    EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return div(in[0], in[1]); }, {a, positive_b});
    EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return in[0] * in[1] - in[0] / in[1]; },
                           {a, positive_b});
    // One side only, and the same tensor on both sides.
    EXPECT_GRADIENTS_MATCH([b](const Inputs& in) { return mul(in[0], b.detach()); }, {a});
    EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return mul(in[0], in[0]); }, {a});
  }
}

TEST_F(OpsTest, GradientsOfMaximumAndMinimum) {
  const Tensor a = Param64(Distinct({2, 3}, 211));
  const Tensor b = Param64(Distinct({2, 3}, 212, 0.05f, 0.025f));  // never within 0.025 of a
  const Tensor row = Param64(Distinct({3}, 213, 0.05f, 0.0125f));
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return maximum(in[0], in[1]); }, {a, b},
                         kLinearEps / 4);
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return minimum(in[0], in[1]); }, {a, b},
                         kLinearEps / 4);
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return maximum(in[0], in[1]); }, {a, row},
                         kLinearEps / 4);
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return minimum(in[0], in[1]); }, {row, b},
                         kLinearEps / 4);
}

TEST_F(OpsTest, GradientsOfScalarOps) {
  const Tensor x = Param64(Randn({2, 3}, 221));
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return add(in[0], 2.5); }, {x}, kLinearEps);
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return mul(in[0], -1.5); }, {x}, kLinearEps);
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return 3.0 - in[0] / 2.0; }, {x}, kLinearEps);
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return 2.0 * in[0] + 1.0 - in[0] * 4.0; }, {x},
                         kLinearEps);
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return -in[0]; }, {x}, kLinearEps);
}

TEST_F(OpsTest, GradientsOfUnaryOps) {
  const Tensor any = Param64(Randn({2, 3}, 231));
  const Tensor positive = Param64(Uniform({2, 3}, 0.5, 2.0, 232));
  const Tensor nonzero = Param64(AwayFromZero({2, 3}, 233));
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return neg(in[0]); }, {any}, kLinearEps);
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return exp(in[0]); }, {any});
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return in[0].exp(); }, {any});
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return log(in[0]); }, {positive});
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return in[0].log(); }, {positive});
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return sqrt(in[0]); }, {positive});
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return abs(in[0]); }, {nonzero}, kLinearEps);
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return tanh(in[0]); }, {any});
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return sigmoid(in[0]); }, {any});
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return silu(in[0]); }, {any});
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return square(in[0]); }, {any});
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return relu(in[0]); }, {nonzero}, kLinearEps);
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return in[0].relu(); }, {nonzero}, kLinearEps);
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return pow(in[0], 2.5); }, {positive});
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return pow(in[0], -1.5); }, {positive});
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return pow(in[0], 3.0); }, {any});
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return pow(in[0], 1.0); }, {any}, kLinearEps);
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return pow(in[0], 0.0); }, {any});
  // A chain of them, on a strided input.
  const Tensor wide = Param64(Randn({3, 2}, 234));
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return sigmoid(tanh(in[0].t()) * exp(in[0].t())); },
                         {wide});
}

// ---- NaN and infinities, as PyTorch ---------------------------------------------------

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

Tensor FloatsOn(const std::vector<float>& values, Device device) {
  return from_vector(values, {static_cast<int64_t>(values.size())}, device);
}

std::vector<float> GradOf(const std::function<Tensor(const Tensor&)>& f,
                          const std::vector<float>& x, Device device) {
  Tensor leaf = FloatsOn(x, device);
  leaf.set_requires_grad(true);
  f(leaf).sum().backward();
  return Values(leaf.grad().to(Device::Cpu()));
}

// The values PyTorch 2.x gives for these inputs (torch.relu(torch.tensor([nan, ...])), ...).
void ExpectPyTorchNanAndInfSemanticsOn(Device device) {
  SCOPED_TRACE(device.ToString());
  const auto on_cpu = [](const Tensor& t) { return t.to(Device::Cpu()); };
  const Tensor x = FloatsOn({kNan, -kInf, kInf, -1.0f, 2.0f, 0.0f}, device);
  // relu keeps NaN and its backward passes the gradient there (threshold_backward).
  ExpectValues(on_cpu(relu(x)), {6}, {kNan, 0, kInf, 0, 2, 0});
  EXPECT_THAT(GradOf([](const Tensor& t) { return relu(t); }, {kNan, -1.0f, 2.0f, 0.0f}, device),
              ElementsAre(1.0f, 0.0f, 1.0f, 0.0f));
  // Elementwise functions at NaN and the infinities.
  ExpectValues(on_cpu(sigmoid(x)), {6}, {kNan, 0.0f, 1.0f, 0.26894142f, 0.88079708f, 0.5f});
  ExpectValues(on_cpu(tanh(x)), {6}, {kNan, -1.0f, 1.0f, -0.76159416f, 0.96402758f, 0.0f});
  ExpectValues(on_cpu(exp(x)), {6}, {kNan, 0.0f, kInf, 0.36787944f, 7.3890561f, 1.0f});
  ExpectValues(on_cpu(log(x)), {6}, {kNan, kNan, kInf, kNan, 0.69314718f, -kInf});
  ExpectValues(on_cpu(sqrt(x)), {6}, {kNan, kNan, kInf, kNan, 1.41421356f, 0.0f});
  ExpectValues(on_cpu(abs(x)), {6}, {kNan, kInf, kInf, 1.0f, 2.0f, 0.0f});
  ExpectValues(on_cpu(neg(x)), {6}, {kNan, kInf, -kInf, 1.0f, -2.0f, 0.0f});
  ExpectValues(on_cpu(square(x)), {6}, {kNan, kInf, kInf, 1.0f, 4.0f, 0.0f});
  ExpectValues(on_cpu(mul(x, 0.0)), {6}, {kNan, kNan, kNan, 0.0f, 0.0f, 0.0f});
  ExpectValues(on_cpu(add(x, -kInf)), {6}, {kNan, -kInf, kNan, -kInf, -kInf, -kInf});
  // maximum/minimum propagate NaN from either side; both inputs get the gradient there.
  const Tensor a = FloatsOn({kNan, 1.0f, -kInf, kInf, 3.0f}, device);
  const Tensor b = FloatsOn({1.0f, kNan, 2.0f, kNan, 3.0f}, device);
  ExpectValues(on_cpu(maximum(a, b)), {5}, {kNan, kNan, 2.0f, kNan, 3.0f});
  ExpectValues(on_cpu(minimum(a, b)), {5}, {kNan, kNan, -kInf, kNan, 3.0f});
  for (const bool is_max : {true, false}) {
    Tensor pa = FloatsOn({kNan, 1.0f, 1.0f, 5.0f}, device);
    Tensor pb = FloatsOn({1.0f, kNan, 1.0f, 2.0f}, device);
    pa.set_requires_grad(true);
    pb.set_requires_grad(true);
    (is_max ? maximum(pa, pb) : minimum(pa, pb)).sum().backward();
    EXPECT_THAT(Values(pa.grad().to(Device::Cpu())),
                ElementsAre(1.0f, 1.0f, 0.5f, is_max ? 1.0f : 0.0f));
    EXPECT_THAT(Values(pb.grad().to(Device::Cpu())),
                ElementsAre(1.0f, 1.0f, 0.5f, is_max ? 0.0f : 1.0f));
  }
  // Comparisons: NaN is unequal to everything, itself included; infinities equal themselves.
  const Tensor c = FloatsOn({kNan, kNan, kInf, -kInf}, device);
  const Tensor d = FloatsOn({kNan, 1.0f, kInf, 0.0f}, device);
  EXPECT_THAT(Bools(eq(c, d)), ElementsAre(false, false, true, false));
  EXPECT_THAT(Bools(ne(c, d)), ElementsAre(true, true, false, true));
  EXPECT_THAT(Bools(lt(c, d)), ElementsAre(false, false, false, true));
  EXPECT_THAT(Bools(le(c, d)), ElementsAre(false, false, true, true));
  EXPECT_THAT(Bools(gt(c, d)), ElementsAre(false, false, false, false));
  EXPECT_THAT(Bools(ge(c, d)), ElementsAre(false, false, true, false));
  // Reductions: NaN wins max/min and arg-reductions pick the first NaN.
  const Tensor rows = from_vector(std::vector<float>{1.0f, kNan, 3.0f, kNan,      //
                                                     -kInf, -kInf, -kInf, -kInf,  //
                                                     kInf, -kInf, 0.0f, kInf},
                                  {3, 4}, device);
  ExpectValues(on_cpu(amax(rows, 1)), {3}, {kNan, -kInf, kInf});
  ExpectValues(on_cpu(sum(rows, {1})), {3}, {kNan, -kInf, kNan});
  ExpectValues(on_cpu(mean(rows, {1})), {3}, {kNan, -kInf, kNan});
  EXPECT_THAT(on_cpu(argmax(rows, 1)).to_vector<int64_t>(), ElementsAre(1, 0, 0));
  EXPECT_THAT(on_cpu(argmin(rows, 1)).to_vector<int64_t>(), ElementsAre(1, 0, 1));
  EXPECT_THAT(on_cpu(argmax(rows, 0)).to_vector<int64_t>(), ElementsAre(2, 0, 0, 0));
  ExpectValues(on_cpu(amax(rows, 0)), {4}, {kInf, kNan, 3.0f, kNan});
  // Softmax: an infinite maximum or a NaN makes the whole row NaN; -inf entries get 0.
  const Tensor logits = from_vector(
      std::vector<float>{kInf, 1.0f, -kInf, 0.0f, -kInf, -kInf, kNan, 0.0f}, {4, 2}, device);
  ExpectValues(on_cpu(softmax(logits, 1)), {4, 2},
               {kNan, kNan, 0.0f, 1.0f, kNan, kNan, kNan, kNan});
  ExpectValues(on_cpu(log_softmax(logits, 1)), {4, 2},
               {kNan, kNan, -kInf, 0.0f, kNan, kNan, kNan, kNan});
  // Max pooling propagates NaN.
  const Tensor image =
      from_vector(std::vector<float>{1.0f, kNan, 3.0f, 4.0f}, {1, 1, 2, 2}, device);
  ExpectValues(on_cpu(max_pool2d(image, {2, 2})), {1, 1, 1, 1}, {kNan});
}

TEST(NanAndInfTest, MatchPyTorchOnTheCpu) { ExpectPyTorchNanAndInfSemanticsOn(Device::Cpu(0)); }

TEST(NanAndInfTest, MatchPyTorchOnCuda) {
  if (DeviceCount(DeviceType::kCUDA) == 0) GTEST_SKIP() << "no CUDA device in this process";
  ExpectPyTorchNanAndInfSemanticsOn(Device::Cuda(0));
}

}  // namespace
}  // namespace ops_testing
}  // namespace tandem
