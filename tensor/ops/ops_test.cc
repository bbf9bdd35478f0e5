// Tests of tensor/ops/ops.h: every op against a plain host reference on random inputs, the
// dtype, broadcasting and error rules, and a finite-difference check of every gradient.
#include "tensor/ops/ops.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "tensor/core/autograd.h"
#include "tensor/gradcheck.h"
#include "tensor/runtime/devices.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace tandem {
namespace {

using ::tandem::testing::ErrorOf;

using ::testing::ElementsAre;
using ::testing::HasSubstr;

using Inputs = std::vector<Tensor>;

// ---- Helpers -------------------------------------------------------------------------------

std::vector<float> Values(const Tensor& t) { return t.to_vector<float>(); }

// An int64 tensor (class labels, indices) from host values.
Tensor Labels(const std::vector<int64_t>& values, const Shape& shape,
              Device device = Device::Cpu(0)) {
  return from_vector(values, shape, TensorOptions(kInt64).device(device));
}

Tensor Randn(const Shape& shape, uint64_t seed) {
  Generator gen(seed);
  return randn(shape, {}, &gen);
}

Tensor Uniform(const Shape& shape, double low, double high, uint64_t seed) {
  Generator gen(seed);
  return uniform(shape, low, high, {}, &gen);
}

// A leaf that requires grad.
Tensor Param(Tensor t) {
  Tensor leaf = t.detach();
  leaf.set_requires_grad(true);
  return leaf;
}

// A float64 leaf: gradient checks run in float64, where finite differences resolve a wrong
// gradient to about 1e-10 instead of float32's 1e-4.
Tensor Param64(const Tensor& t) { return Param(t.to(kFloat64)); }

// Values in [-1.2, -0.2] or [0.2, 1.2]: away from the kinks of relu and abs at 0.
Tensor AwayFromZero(const Shape& shape, uint64_t seed) {
  const std::vector<float> u = Values(Uniform(shape, -1.0, 1.0, seed));
  std::vector<float> v(u.size());
  for (size_t i = 0; i < u.size(); ++i) v[i] = u[i] < 0 ? u[i] - 0.2f : u[i] + 0.2f;
  return from_vector(v, shape);
}

// Distinct values spaced `spacing` apart in random order: no ties within a finite step.
Tensor Distinct(const Shape& shape, uint64_t seed, float spacing = 0.05f, float shift = 0.0f) {
  Generator gen(seed);
  const std::vector<int64_t> perm = randperm(NumElements(shape), &gen).to_vector<int64_t>();
  std::vector<float> v(perm.size());
  const float center = 0.5f * static_cast<float>(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) v[i] = (perm[i] - center) * spacing + shift;
  return from_vector(v, shape);
}

void ExpectValues(const Tensor& actual, const Shape& shape, const std::vector<float>& expected,
                  double tol = 1e-5) {
  ASSERT_TRUE(actual.defined());
  ASSERT_EQ(actual.shape(), shape);
  ASSERT_EQ(actual.dtype(), kFloat32);
  const std::vector<float> got = Values(actual);
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(expected[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << "element " << i << " is " << got[i] << ", not NaN";
      continue;
    }
    if (std::isinf(expected[i])) {
      EXPECT_EQ(got[i], expected[i]) << "element " << i;
      continue;
    }
    EXPECT_NEAR(got[i], expected[i], tol * std::max(1.0f, std::fabs(expected[i])))
        << "element " << i << " of " << ShapeToString(shape);
  }
}

// Flat index into `in` of element `flat` of `out` under NumPy broadcasting.
int64_t BroadcastSource(int64_t flat, const Shape& out, const Shape& in) {
  int64_t source = 0, stride = 1;
  const int64_t lead = static_cast<int64_t>(out.size() - in.size());
  for (int64_t d = static_cast<int64_t>(out.size()) - 1; d >= 0; --d) {
    const int64_t coord = flat % out[d];
    flat /= out[d];
    if (d >= lead) {
      if (in[d - lead] != 1) source += coord * stride;
      stride *= in[d - lead];
    }
  }
  return source;
}

Shape BroadcastShape(const Shape& a, const Shape& b) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    out[i] = da == 1 ? db : da;
  }
  return out;
}

// Reduces contiguous host values of `shape` over the sorted `dims` (keepdim shape).
std::vector<double> HostReduce(const std::vector<float>& values, const Shape& shape,
                               const std::vector<int64_t>& dims, double init,
                               const std::function<double(double, double)>& combine) {
  Shape kept = shape;
  for (int64_t d : dims) kept[d] = 1;
  std::vector<double> out(NumElements(kept), init);
  for (int64_t flat = 0; flat < static_cast<int64_t>(values.size()); ++flat) {
    int64_t rest = flat, target = 0, stride = 1;
    for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
      const int64_t coord = rest % shape[d];
      rest /= shape[d];
      if (kept[d] != 1) target += coord * stride;
      stride *= kept[d];
    }
    out[target] = combine(out[target], values[flat]);
  }
  return out;
}

std::vector<float> ToFloat(const std::vector<double>& v) {
  return std::vector<float>(v.begin(), v.end());
}

// Host matrix product of [batch, m, k] and [batch, k, n] (batch stride 0 when shared).
std::vector<float> HostMatmul(const std::vector<float>& a, const std::vector<float>& b,
                              int64_t batch, int64_t m, int64_t k, int64_t n, bool a_shared,
                              bool b_shared) {
  std::vector<float> c(batch * m * n, 0.0f);
  for (int64_t p = 0; p < batch; ++p) {
    const float* ap = a.data() + (a_shared ? 0 : p * m * k);
    const float* bp = b.data() + (b_shared ? 0 : p * k * n);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t q = 0; q < k; ++q) s += static_cast<double>(ap[i * k + q]) * bp[q * n + j];
        c[(p * m + i) * n + j] = static_cast<float>(s);
      }
    }
  }
  return c;
}

class OpsTest : public ::testing::Test {
 protected:
  void SetUp() override { SetCpuDeviceCount(2); }
};

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

// ---- Reductions ----------------------------------------------------------------------------

TEST_F(OpsTest, SumAndMeanOverDimsMatchTheHost) {
  const Shape shape = {3, 4, 5};
  const Tensor x = Randn(shape, 7);
  const std::vector<float> xv = Values(x);
  const auto add_fn = [](double acc, double v) { return acc + v; };
  struct Case {
    std::vector<int64_t> dims;        // as passed
    std::vector<int64_t> normalized;  // sorted, non-negative
  };
  for (const Case& c : std::vector<Case>{{{0}, {0}},
                                         {{1}, {1}},
                                         {{-1}, {2}},
                                         {{0, 2}, {0, 2}},
                                         {{2, 0}, {0, 2}},
                                         {{-2, -1}, {1, 2}},
                                         {{0, 1, 2}, {0, 1, 2}},
                                         {{}, {0, 1, 2}}}) {
    SCOPED_TRACE("dims " + ShapeToString(c.dims));
    const std::vector<double> sums = HostReduce(xv, shape, c.normalized, 0.0, add_fn);
    int64_t count = 1;
    for (int64_t d : c.normalized) count *= shape[d];
    std::vector<double> means;
    for (double s : sums) means.push_back(s / count);
    Shape kept = shape, dropped;
    for (int64_t d : c.normalized) kept[d] = 1;
    for (int64_t d = 0; d < 3; ++d) {
      if (!std::count(c.normalized.begin(), c.normalized.end(), d)) dropped.push_back(shape[d]);
    }
    ExpectValues(sum(x, c.dims, true), kept, ToFloat(sums));
    ExpectValues(sum(x, c.dims), dropped, ToFloat(sums));
    ExpectValues(x.sum(c.dims, true), kept, ToFloat(sums));
    ExpectValues(mean(x, c.dims, true), kept, ToFloat(means));
    ExpectValues(x.mean(c.dims), dropped, ToFloat(means));
  }
  const std::vector<double> total = HostReduce(xv, shape, {0, 1, 2}, 0.0, add_fn);
  ExpectValues(sum(x), {}, {static_cast<float>(total[0])});
  ExpectValues(x.sum(), {}, {static_cast<float>(total[0])});
  ExpectValues(mean(x), {}, {static_cast<float>(total[0] / 60)});
  ExpectValues(x.mean(), {}, {static_cast<float>(total[0] / 60)});
  // A non-contiguous input.
  const Tensor xt = x.transpose(0, 2);
  const std::vector<double> by_first = HostReduce(xv, shape, {1, 2}, 0.0, add_fn);
  ExpectValues(sum(xt, {0, 1}), {3}, ToFloat(by_first));
}

TEST_F(OpsTest, ReductionsOfEmptyAndZeroDimensionalTensors) {
  ExpectValues(sum(zeros({0, 3})), {}, {0.0f});
  ExpectValues(sum(zeros({0, 3}), {0}), {3}, {0, 0, 0});
  ExpectValues(sum(zeros({3, 0}), {0}), {0}, {});
  EXPECT_TRUE(std::isnan(mean(zeros({0})).item()));
  ExpectValues(mean(zeros({0, 2}), {0}), {2}, {NAN, NAN});
  const Tensor s = scalar_tensor(2.5);
  ExpectValues(sum(s), {}, {2.5f});
  ExpectValues(sum(s, {0}), {}, {2.5f});
  ExpectValues(sum(s, {-1}, true), {}, {2.5f});
  ExpectValues(amax(s, 0), {}, {2.5f});
  EXPECT_EQ(argmax(s, 0).item<int64_t>(), 0);
  EXPECT_THAT(ErrorOf([] {
                amax(zeros({2, 0}), 1);
              }),
              HasSubstr("amax: cannot reduce over a dimension of size 0"));
  EXPECT_THAT(ErrorOf([] {
                argmax(zeros({0, 2}), 0);
              }),
              HasSubstr("argmax: cannot reduce over a dimension of size 0"));
  ExpectValues(amax(zeros({0, 2}), 1), {0}, {});
}

TEST_F(OpsTest, ReductionErrorsNameTheBadDimension) {
  EXPECT_THAT(ErrorOf([] {
                sum(zeros({2, 3}), {2});
              }),
              HasSubstr("sum: dimension 2 is out of range for a tensor with 2 dimension(s)"));
  EXPECT_THAT(ErrorOf([] { mean(zeros({2, 3}), {-3}); }), HasSubstr("mean: dimension -3"));
  EXPECT_THAT(ErrorOf([] {
                sum(zeros({2, 3}), {1, -1});
              }),
              HasSubstr("sum: dimension 1 appears more than once"));
  EXPECT_THAT(ErrorOf([] { amax(zeros({2, 3}), 5); }), HasSubstr("amax: dimension 5"));
  EXPECT_THAT(ErrorOf([] { argmin(zeros({2}), 1); }), HasSubstr("argmin: dimension 1"));
  EXPECT_THAT(ErrorOf([] { softmax(zeros({2}), -2); }), HasSubstr("softmax: dimension -2"));
}

TEST_F(OpsTest, AmaxArgmaxArgminMatchTheHost) {
  const Shape shape = {4, 6};
  const Tensor x = Randn(shape, 11);
  const std::vector<float> xv = Values(x);
  for (int64_t dim : {0, 1, -1, -2}) {
    SCOPED_TRACE("dim " + std::to_string(dim));
    const int64_t d = dim < 0 ? dim + 2 : dim;
    const int64_t other = 1 - d;
    std::vector<float> maxima;
    std::vector<int64_t> arg_max, arg_min;
    for (int64_t i = 0; i < shape[other]; ++i) {
      float best = -INFINITY, worst = INFINITY;
      int64_t best_j = 0, worst_j = 0;
      for (int64_t j = 0; j < shape[d]; ++j) {
        const float v = d == 1 ? xv[i * 6 + j] : xv[j * 6 + i];
        if (v > best) best = v, best_j = j;
        if (v < worst) worst = v, worst_j = j;
      }
      maxima.push_back(best);
      arg_max.push_back(best_j);
      arg_min.push_back(worst_j);
    }
    ExpectValues(amax(x, dim), {shape[other]}, maxima, 0);
    Shape kept = shape;
    kept[d] = 1;
    ExpectValues(amax(x, dim, true), kept, maxima, 0);
    EXPECT_EQ(argmax(x, dim).to_vector<int64_t>(), arg_max);
    EXPECT_EQ(argmax(x, dim).dtype(), kInt64);
    EXPECT_EQ(x.argmax(dim, true).shape(), kept);
    EXPECT_EQ(argmin(x, dim, true).to_vector<int64_t>(), arg_min);
  }
  // Ties pick the first index, as PyTorch does.
  const Tensor ties = from_vector(std::vector<float>{1, 3, 3, 0, 0, -1}, {2, 3});
  EXPECT_THAT(argmax(ties, 1).to_vector<int64_t>(), ElementsAre(1, 0));
  EXPECT_THAT(argmin(ties, 1).to_vector<int64_t>(), ElementsAre(0, 2));
}

TEST_F(OpsTest, SumToReducesBroadcastDimensions) {
  const Tensor x = Randn({2, 3, 4}, 13);
  const std::vector<float> xv = Values(x);
  const auto add_fn = [](double acc, double v) { return acc + v; };
  ExpectValues(sum_to(x, {3, 1}), {3, 1}, ToFloat(HostReduce(xv, {2, 3, 4}, {0, 2}, 0, add_fn)));
  ExpectValues(sum_to(x, {4}), {4}, ToFloat(HostReduce(xv, {2, 3, 4}, {0, 1}, 0, add_fn)));
  ExpectValues(sum_to(x, {}), {}, ToFloat(HostReduce(xv, {2, 3, 4}, {0, 1, 2}, 0, add_fn)));
  ExpectValues(sum_to(x, {2, 1, 4}), {2, 1, 4}, ToFloat(HostReduce(xv, {2, 3, 4}, {1}, 0, add_fn)));
  ExpectValues(sum_to(x, {2, 3, 4}), {2, 3, 4}, xv);
  ExpectValues(sum_to(ones({1, 3}), {3}), {3}, {1, 1, 1});
  EXPECT_THAT(ErrorOf([&] { sum_to(x, {5}); }),
              HasSubstr("sum_to: cannot sum [2, 3, 4] down to [5]"));
  EXPECT_THAT(ErrorOf([&] { sum_to(x, {1, 2, 3, 4}); }), HasSubstr("sum_to: cannot sum"));
}

// ---- Neural-network functions --------------------------------------------------------------

std::vector<float> HostSoftmax(const std::vector<float>& x, const Shape& shape, int64_t dim,
                               bool log) {
  const int64_t n = shape[dim];
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= shape[d];
  for (int64_t d = dim + 1; d < static_cast<int64_t>(shape.size()); ++d) inner *= shape[d];
  std::vector<float> out(x.size());
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      const auto at = [&](int64_t j) { return (o * n + j) * inner + i; };
      double m = -INFINITY;
      for (int64_t j = 0; j < n; ++j) m = std::max(m, static_cast<double>(x[at(j)]));
      double total = 0;
      for (int64_t j = 0; j < n; ++j) total += std::exp(x[at(j)] - m);
      for (int64_t j = 0; j < n; ++j) {
        const double z = x[at(j)] - m;
        out[at(j)] = static_cast<float>(log ? z - std::log(total) : std::exp(z) / total);
      }
    }
  }
  return out;
}

TEST_F(OpsTest, SoftmaxAndLogSoftmaxMatchTheHostAndStayFinite) {
  const Shape shape = {3, 4, 5};
  const Tensor x = mul(Randn(shape, 17), 3.0);
  for (int64_t dim : {0, 1, 2, -1}) {
    SCOPED_TRACE("dim " + std::to_string(dim));
    const int64_t d = dim < 0 ? dim + 3 : dim;
    ExpectValues(softmax(x, dim), shape, HostSoftmax(Values(x), shape, d, false), 1e-5);
    ExpectValues(log_softmax(x, dim), shape, HostSoftmax(Values(x), shape, d, true), 1e-5);
  }
  const Tensor huge = from_vector(std::vector<float>{1000, -1000, 0, 999}, {1, 4});
  ExpectValues(softmax(huge, 1), {1, 4}, HostSoftmax(Values(huge), {1, 4}, 1, false), 1e-6);
  ExpectValues(log_softmax(huge, 1), {1, 4}, HostSoftmax(Values(huge), {1, 4}, 1, true), 1e-6);
  ExpectValues(softmax(zeros({2, 0}), 1), {2, 0}, {});
  ExpectValues(softmax(scalar_tensor(5.0), 0), {}, {1.0f});
}

struct MatmulCase {
  Shape a, b, out;
};

TEST_F(OpsTest, MatmulAllFormsMatchTheHost) {
  const std::vector<MatmulCase> cases = {{{3, 4}, {4, 5}, {3, 5}},
                                         {{2, 3, 4}, {2, 4, 5}, {2, 3, 5}},
                                         {{2, 3, 4}, {4, 5}, {2, 3, 5}},
                                         {{3, 4}, {2, 4, 5}, {2, 3, 5}},
                                         {{1, 3, 4}, {2, 4, 5}, {2, 3, 5}},
                                         {{2, 3, 4}, {1, 4, 5}, {2, 3, 5}},
                                         {{1, 1}, {1, 1}, {1, 1}},
                                         {{4}, {4, 5}, {5}},
                                         {{3, 4}, {4}, {3}},
                                         {{4}, {4}, {}},
                                         {{2, 3, 4}, {4}, {2, 3}},
                                         {{0, 4}, {4, 5}, {0, 5}},
                                         {{3, 0}, {0, 5}, {3, 5}},
                                         {{3, 4}, {4, 0}, {3, 0}}};
  uint64_t seed = 500;
  for (const MatmulCase& c : cases) {
    SCOPED_TRACE(ShapeToString(c.a) + " x " + ShapeToString(c.b));
    const Tensor a = Randn(c.a, ++seed), b = Randn(c.b, ++seed);
    // Host reference with vectors as 1-row / 1-column matrices.
    const Shape a3 = c.a.size() == 1   ? Shape{1, 1, c.a[0]}
                     : c.a.size() == 2 ? Shape{1, c.a[0], c.a[1]}
                                       : c.a;
    const Shape b3 = c.b.size() == 1   ? Shape{1, c.b[0], 1}
                     : c.b.size() == 2 ? Shape{1, c.b[0], c.b[1]}
                                       : c.b;
    const int64_t batch = std::max(a3[0], b3[0]);
    const std::vector<float> expected =
        HostMatmul(Values(a), Values(b), batch, a3[1], a3[2], b3[2], a3[0] == 1, b3[0] == 1);
    ExpectValues(matmul(a, b), c.out, expected, 1e-5);
    ExpectValues(a.matmul(b), c.out, expected, 1e-5);
  }
}

TEST_F(OpsTest, MatmulReadsTransposedAndStridedOperandsInPlace) {
  const Tensor a = Randn({4, 3}, 21), b = Randn({5, 4}, 22);
  const std::vector<float> at = Values(a.t().contiguous()), bt = Values(b.t().contiguous());
  // a.t() and b.t() are column-major views: Gemm's transpose flags read them directly.
  ExpectValues(matmul(a.t(), b.t()), {3, 5}, HostMatmul(at, bt, 1, 3, 4, 5, true, true), 1e-5);
  // A row stride larger than the row (a narrowed view) and a zero-stride (expanded) operand.
  const Tensor wide = Randn({3, 7}, 23);
  const Tensor narrowed = wide.narrow(1, 2, 4);
  const Tensor bv = Randn({4, 2}, 24);
  ExpectValues(matmul(narrowed, bv), {3, 2},
               HostMatmul(Values(narrowed.contiguous()), Values(bv), 1, 3, 4, 2, true, true), 1e-5);
  const Tensor row = Randn({1, 4}, 25).expand({3, 4});
  ExpectValues(matmul(row, bv), {3, 2},
               HostMatmul(Values(row.contiguous()), Values(bv), 1, 3, 4, 2, true, true), 1e-5);
  // Batched, with transposed matrices inside each batch and a permuted batch dimension.
  const Tensor a3 = Randn({4, 2, 3}, 26).permute({1, 2, 0});  // [2, 3, 4]
  const Tensor b3 = Randn({2, 5, 4}, 27).transpose(1, 2);     // [2, 4, 5]
  ExpectValues(
      matmul(a3, b3), {2, 3, 5},
      HostMatmul(Values(a3.contiguous()), Values(b3.contiguous()), 2, 3, 4, 5, false, false), 1e-5);
}

TEST_F(OpsTest, MatmulErrorsSayWhatToFix) {
  EXPECT_THAT(ErrorOf([] {
                matmul(zeros({2, 3}), zeros({4, 5}));
              }),
              HasSubstr("matmul: a is [2, 3] and b is [4, 5]; a.size(-1) (3) must equal "
                        "b.size(-2) (4)"));
  EXPECT_THAT(ErrorOf([] {
                matmul(zeros({2, 3, 4}), zeros({3, 4, 5}));
              }),
              HasSubstr("the batch sizes (2 and 3) must be equal or one of them 1"));
  EXPECT_THAT(ErrorOf([] {
                matmul(zeros({2, 2, 3, 4}), zeros({3, 5}));
              }),
              HasSubstr("a.size(-1) (4) must equal b.size(-2) (3)"));
  EXPECT_THAT(ErrorOf([] {
                matmul(zeros({}), zeros({4, 5}));
              }),
              HasSubstr("matmul: both operands must have at least one dimension"));
  EXPECT_THAT(ErrorOf([] {
                matmul(zeros({2, 3}), zeros({3, 5}, Device::Cpu(1)));
              }),
              HasSubstr("matmul: a is on cpu:0 and b on cpu:1"));
  EXPECT_THAT(ErrorOf([] {
                matmul(zeros({2, 3}), Tensor());
              }),
              HasSubstr("matmul: b is an undefined Tensor"));
}

TEST_F(OpsTest, LinearMatchesTheHostWithAndWithoutBias) {
  const Tensor w = Randn({5, 4}, 31), bias = Randn({5}, 32);
  const std::vector<float> wt = Values(w.t().contiguous()), bv = Values(bias);
  for (const Shape& shape : {Shape{3, 4}, Shape{2, 3, 4}, Shape{4}, Shape{0, 4}}) {
    SCOPED_TRACE(ShapeToString(shape));
    const Tensor x = Randn(shape, 33);
    const int64_t rows = NumElements(shape) / 4;
    std::vector<float> expected = HostMatmul(Values(x), wt, 1, rows, 4, 5, true, true);
    Shape out_shape(shape.begin(), shape.end() - 1);
    out_shape.push_back(5);
    ExpectValues(linear(x, w, Tensor()), out_shape, expected, 1e-5);
    for (size_t i = 0; i < expected.size(); ++i) expected[i] += bv[i % 5];
    ExpectValues(linear(x, w, bias), out_shape, expected, 1e-5);
  }
  EXPECT_THAT(ErrorOf([&] {
                linear(zeros({2, 3}), w, bias);
              }),
              HasSubstr("linear: x is [2, 3] and weight is [5, 4]; x.size(-1) must equal "
                        "weight.size(1) (in_features = 4)"));
  EXPECT_THAT(ErrorOf([&] {
                linear(zeros({2, 4}), w, zeros({4}));
              }),
              HasSubstr("linear: bias must be [5] (out_features) but is [4]"));
  EXPECT_THAT(ErrorOf([&] {
                linear(zeros({2, 4}), zeros({5, 4, 1}), bias);
              }),
              HasSubstr("linear: weight must be 2-D"));
  EXPECT_THAT(ErrorOf([&] {
                linear(zeros({2, 4}), w, zeros({5}, Device::Cpu(1)));
              }),
              HasSubstr("linear: x is on cpu:0 and bias on cpu:1"));
}

// ---- Losses --------------------------------------------------------------------------------

double HostCrossEntropy(const std::vector<float>& logits, const std::vector<int64_t>& targets,
                        int64_t classes) {
  double total = 0;
  for (size_t r = 0; r < targets.size(); ++r) {
    const float* row = logits.data() + r * classes;
    const double m = *std::max_element(row, row + classes);
    double s = 0;
    for (int64_t c = 0; c < classes; ++c) s += std::exp(row[c] - m);
    total += -(row[targets[r]] - m - std::log(s));
  }
  return total / targets.size();
}

TEST_F(OpsTest, CrossEntropyMatchesAHandComputedValue) {
  // Row 0: logits (0, ln 3) -> p = (1/4, 3/4), target 1: -ln(3/4).
  // Row 1: logits (2, 2)    -> p = (1/2, 1/2), target 0: ln 2.
  const Tensor logits = from_vector(std::vector<float>{0.0f, std::log(3.0f), 2.0f, 2.0f}, {2, 2});
  const Tensor targets = Labels(std::vector<int64_t>{1, 0}, {2});
  const double expected = (-std::log(0.75) + std::log(2.0)) / 2;  // 0.490414...
  EXPECT_NEAR(cross_entropy(logits, targets).item(), expected, 1e-6);
  EXPECT_NEAR(nll_loss(log_softmax(logits, 1), targets).item(), expected, 1e-6);
  EXPECT_EQ(cross_entropy(logits, targets).dim(), 0);
}

TEST_F(OpsTest, CrossEntropyAndNllLossMatchTheHostOnRandomInputs) {
  const Tensor logits = mul(Randn({6, 5}, 41), 2.0);
  const std::vector<int64_t> labels = {0, 4, 2, 2, 1, 3};
  const Tensor targets = Labels(labels, {6});
  const double expected = HostCrossEntropy(Values(logits), labels, 5);
  EXPECT_NEAR(cross_entropy(logits, targets).item(), expected, 1e-5);
  // nll_loss just picks -log_probs[r, target[r]] and averages.
  const std::vector<float> lp = Values(logits);
  double picked = 0;
  for (size_t r = 0; r < labels.size(); ++r) picked -= lp[r * 5 + labels[r]];
  EXPECT_NEAR(nll_loss(logits, targets).item(), picked / 6, 1e-5);
  // Non-contiguous logits.
  const Tensor lt_logits = logits.t().contiguous().t();
  EXPECT_NEAR(cross_entropy(lt_logits, targets).item(), expected, 1e-5);
}

TEST_F(OpsTest, CrossEntropyStaysFiniteForHugeLogits) {
  const Tensor logits = from_vector(std::vector<float>{1000, -1000, 0, -1000, 1000, 0}, {2, 3});
  const Tensor targets = Labels(std::vector<int64_t>{0, 0}, {2});
  Tensor x = Param(logits);
  Tensor loss = cross_entropy(x, targets);
  ASSERT_TRUE(std::isfinite(loss.item()));
  // Row 0 is right with certainty (loss 0); row 1 is wrong by 2000 (loss 2000).
  EXPECT_NEAR(loss.item(), 1000.0, 1e-3);
  loss.backward();
  for (float g : Values(x.grad())) EXPECT_TRUE(std::isfinite(g));
  ExpectValues(x.grad(), {2, 3}, {0, 0, 0, -0.5f, 0.5f, 0}, 1e-6);
}

TEST_F(OpsTest, LossErrorsSayWhatToFix) {
  const Tensor logits = zeros({3, 4});
  EXPECT_THAT(ErrorOf([&] {
                cross_entropy(logits, Labels(std::vector<int64_t>{0, 4, 1}, {3}));
              }),
              HasSubstr("cross_entropy: targets must be class indices in [0, C) = [0, 4) but "
                        "range over [0, 4]"));
  EXPECT_THAT(ErrorOf([&] {
                nll_loss(logits, Labels(std::vector<int64_t>{0, -1, 1}, {3}));
              }),
              HasSubstr("nll_loss: targets must be class indices in [0, C) = [0, 4) but range "
                        "over [-1, 1]"));
  EXPECT_THAT(ErrorOf([&] { cross_entropy(logits, zeros({3})); }),
              HasSubstr("cross_entropy: targets must be int64 class indices but are float32; "
                        "convert them with .to(kInt64)"));
  EXPECT_THAT(ErrorOf([&] { cross_entropy(logits, zeros({2}, kInt64)); }),
              HasSubstr("cross_entropy: logits is [3, 4] so targets must be [3] but are [2]"));
  EXPECT_THAT(ErrorOf([&] {
                cross_entropy(zeros({3, 4, 2}), zeros({3}, kInt64));
              }),
              HasSubstr("cross_entropy: logits must be 2-D [N, C] but is [3, 4, 2]"));
  EXPECT_THAT(ErrorOf([&] {
                cross_entropy(logits, zeros({3}, TensorOptions(kInt64).device(Device::Cpu(1))));
              }),
              HasSubstr("cross_entropy: logits is on cpu:0 and targets on cpu:1"));
  EXPECT_THAT(ErrorOf([&] {
                mse_loss(zeros({4, 1}), zeros({4}));
              }),
              HasSubstr("mse_loss: input is [4, 1] and target is [4]; they must have the same "
                        "shape"));
}

TEST_F(OpsTest, MseLossMatchesTheHost) {
  const Tensor a = Randn({3, 4}, 43), b = Randn({3, 4}, 44);
  const std::vector<float> av = Values(a), bv = Values(b);
  double expected = 0;
  for (size_t i = 0; i < av.size(); ++i) expected += (av[i] - bv[i]) * (av[i] - bv[i]);
  EXPECT_NEAR(mse_loss(a, b).item(), expected / 12, 1e-5);
  EXPECT_EQ(mse_loss(a, b).dim(), 0);
}

// ---- Convolution and pooling -----------------------------------------------------------------

std::vector<float> HostConv2d(const std::vector<float>& x, const Shape& xs,
                              const std::vector<float>& w, const Shape& ws,
                              const std::vector<float>* bias, int64_t stride, int64_t pad) {
  const int64_t n = xs[0], c = xs[1], h = xs[2], wd = xs[3];
  const int64_t o = ws[0], kh = ws[2], kw = ws[3];
  const int64_t oh = (h + 2 * pad - kh) / stride + 1, ow = (wd + 2 * pad - kw) / stride + 1;
  std::vector<float> out(n * o * oh * ow);
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t f = 0; f < o; ++f) {
      for (int64_t i = 0; i < oh; ++i) {
        for (int64_t j = 0; j < ow; ++j) {
          double s = bias ? (*bias)[f] : 0.0;
          for (int64_t ch = 0; ch < c; ++ch) {
            for (int64_t p = 0; p < kh; ++p) {
              for (int64_t q = 0; q < kw; ++q) {
                const int64_t y = i * stride - pad + p, xx = j * stride - pad + q;
                if (y < 0 || y >= h || xx < 0 || xx >= wd) continue;
                s += static_cast<double>(x[((b * c + ch) * h + y) * wd + xx]) *
                     w[((f * c + ch) * kh + p) * kw + q];
              }
            }
          }
          out[((b * o + f) * oh + i) * ow + j] = static_cast<float>(s);
        }
      }
    }
  }
  return out;
}

TEST_F(OpsTest, Conv2dMatchesTheHost) {
  struct Case {
    Shape x, w;
    int64_t stride, pad;
    bool bias;
  };
  uint64_t seed = 600;
  for (const Case& c : std::vector<Case>{{{2, 3, 7, 6}, {4, 3, 3, 3}, 1, 0, true},
                                         {{2, 3, 7, 6}, {4, 3, 3, 3}, 2, 1, false},
                                         {{1, 1, 5, 5}, {2, 1, 5, 5}, 1, 0, true},
                                         {{3, 2, 4, 5}, {1, 2, 1, 1}, 1, 0, true},
                                         {{1, 2, 6, 6}, {3, 2, 2, 3}, 3, 2, true},
                                         {{0, 2, 6, 6}, {3, 2, 3, 3}, 1, 1, true}}) {
    SCOPED_TRACE(ShapeToString(c.x) + " * " + ShapeToString(c.w) + " stride " +
                 std::to_string(c.stride) + " pad " + std::to_string(c.pad));
    const Tensor x = Randn(c.x, ++seed), w = Randn(c.w, ++seed), b = Randn({c.w[0]}, ++seed);
    const std::vector<float> bv = Values(b);
    const std::vector<float> expected =
        HostConv2d(Values(x), c.x, Values(w), c.w, c.bias ? &bv : nullptr, c.stride, c.pad);
    const Tensor y = conv2d(x, w, c.bias ? b : Tensor(), {c.stride, c.stride}, {c.pad, c.pad});
    const int64_t oh = (c.x[2] + 2 * c.pad - c.w[2]) / c.stride + 1;
    const int64_t ow = (c.x[3] + 2 * c.pad - c.w[3]) / c.stride + 1;
    ExpectValues(y, {c.x[0], c.w[0], oh, ow}, expected, 1e-5);
  }
}

TEST_F(OpsTest, Conv2dErrorsSayWhatToFix) {
  const Tensor w = zeros({32, 1, 3, 3});
  EXPECT_THAT(ErrorOf([&] {
                conv2d(zeros({2, 3, 8, 8}), w, Tensor());
              }),
              HasSubstr("conv2d: input has 3 channels but weight expects 1 (weight is "
                        "[32, 1, 3, 3]"));
  EXPECT_THAT(ErrorOf([&] {
                conv2d(zeros({2, 1, 2, 8}), w, Tensor());
              }),
              HasSubstr("conv2d: input is [2, 1, 2, 8] (2x8 with padding [0, 0]) but the kernel "
                        "is 3x3; the padded input must be at least as large as the kernel"));
  EXPECT_NO_THROW(conv2d(zeros({2, 1, 2, 8}), w, Tensor(), {1, 1}, {1, 1}));
  EXPECT_THAT(ErrorOf([&] {
                conv2d(zeros({1, 8, 8}), w, Tensor());
              }),
              HasSubstr("conv2d: input must be 4-D [N, C, H, W] but is [1, 8, 8]; add a batch "
                        "dimension with unsqueeze(0)"));
  EXPECT_THAT(ErrorOf([&] {
                conv2d(zeros({1, 1, 8, 8}), w, zeros({31}));
              }),
              HasSubstr("conv2d: bias must be [32] (out_channels) but is [31]"));
  EXPECT_THAT(ErrorOf([&] {
                conv2d(zeros({1, 1, 8, 8}), w, Tensor(), {0, 1});
              }),
              HasSubstr("conv2d: stride must be positive"));
  EXPECT_THAT(ErrorOf([&] {
                conv2d(zeros({1, 1, 8, 8}), w, Tensor(), {1, 1, 1});
              }),
              HasSubstr("conv2d: stride must have 1 or 2 values"));
  EXPECT_THAT(ErrorOf([&] {
                conv2d(zeros({1, 1, 8, 8}), w, Tensor(), {1, 1}, {-1, 0});
              }),
              HasSubstr("conv2d: padding must be non-negative"));
  EXPECT_THAT(ErrorOf([&] {
                conv2d(zeros({1, 1, 8, 8}), zeros({3, 3}), Tensor());
              }),
              HasSubstr("conv2d: weight must be 4-D"));
  EXPECT_THAT(ErrorOf([&] {
                conv2d(zeros({1, 1, 8, 8}, Device::Cpu(1)), w, Tensor());
              }),
              HasSubstr("conv2d: input is on cpu:1 and weight on cpu:0"));
}

std::vector<float> HostMaxPool(const std::vector<float>& x, const Shape& xs, int64_t k,
                               int64_t stride, int64_t pad) {
  const int64_t planes = xs[0] * xs[1], h = xs[2], w = xs[3];
  const int64_t oh = (h + 2 * pad - k) / stride + 1, ow = (w + 2 * pad - k) / stride + 1;
  std::vector<float> out;
  for (int64_t p = 0; p < planes; ++p) {
    for (int64_t i = 0; i < oh; ++i) {
      for (int64_t j = 0; j < ow; ++j) {
        float best = -INFINITY;
        for (int64_t a = 0; a < k; ++a) {
          for (int64_t b = 0; b < k; ++b) {
            const int64_t y = i * stride - pad + a, xx = j * stride - pad + b;
            if (y >= 0 && y < h && xx >= 0 && xx < w)
              best = std::max(best, x[(p * h + y) * w + xx]);
          }
        }
        out.push_back(best);
      }
    }
  }
  return out;
}

TEST_F(OpsTest, MaxPool2dMatchesTheHost) {
  const Shape shape = {2, 3, 7, 6};
  const Tensor x = Randn(shape, 61);
  const std::vector<float> xv = Values(x);
  ExpectValues(max_pool2d(x, {2, 2}), {2, 3, 3, 3}, HostMaxPool(xv, shape, 2, 2, 0), 0);
  ExpectValues(max_pool2d(x, {2}), {2, 3, 3, 3}, HostMaxPool(xv, shape, 2, 2, 0), 0);
  ExpectValues(max_pool2d(x, {3, 3}, {1, 1}), {2, 3, 5, 4}, HostMaxPool(xv, shape, 3, 1, 0), 0);
  ExpectValues(max_pool2d(x, {3, 3}, {2, 2}, {1, 1}), {2, 3, 4, 3}, HostMaxPool(xv, shape, 3, 2, 1),
               0);
  EXPECT_THAT(ErrorOf([&] {
                max_pool2d(x, {2, 2}, {2, 2}, {2, 2});
              }),
              HasSubstr("max_pool2d: padding must be between 0 and half the kernel size"));
  EXPECT_THAT(ErrorOf([&] {
                max_pool2d(x, {8, 8});
              }),
              HasSubstr("max_pool2d: input is [2, 3, 7, 6] (7x6 with padding [0, 0]) but the "
                        "window is 8x8"));
  EXPECT_THAT(ErrorOf([&] {
                max_pool2d(x, {0, 2});
              }),
              HasSubstr("max_pool2d: kernel_size must be positive"));
  EXPECT_THAT(ErrorOf([&] {
                max_pool2d(zeros({3, 4}), {2, 2});
              }),
              HasSubstr("max_pool2d: input must be 4-D"));
}

// ---- Dropout -------------------------------------------------------------------------------

TEST_F(OpsTest, DropoutIsTheIdentityWhenNotTrainingOrPIsZero) {
  const Tensor x = Randn({4, 5}, 71);
  EXPECT_TRUE(dropout(x, 0.5, /*training=*/false).shares_storage_with(x));
  EXPECT_TRUE(dropout(x, 0.0, /*training=*/true).shares_storage_with(x));
  EXPECT_THAT(ErrorOf([&] { dropout(x, 1.5, true); }),
              HasSubstr("dropout: p (the probability of zeroing an element) must be in [0, 1] "
                        "but is 1.5"));
  EXPECT_THAT(ErrorOf([&] { dropout(x, -0.1, false); }), HasSubstr("must be in [0, 1]"));
}

TEST_F(OpsTest, DropoutWithPOneZeroesEverythingWhenTraining) {
  // As PyTorch: input * 0, so NaN stays NaN and the gradient is zero.
  const Tensor x = from_vector(std::vector<float>{1.0f, -2.0f, NAN, 4.0f}, {2, 2});
  ExpectValues(dropout(x, 1.0, /*training=*/true), {2, 2}, {0.0f, 0.0f, NAN, 0.0f}, 0.0);
  EXPECT_TRUE(dropout(x, 1.0, /*training=*/false).shares_storage_with(x));
  Tensor leaf = Param(Randn({3}, 72));
  dropout(leaf, 1.0, true).sum().backward();
  EXPECT_THAT(Values(leaf.grad()), ElementsAre(0.0f, 0.0f, 0.0f));
}

TEST_F(OpsTest, DropoutZeroesAboutPAndScalesTheRest) {
  const double p = 0.3;
  const Tensor x = Uniform({100, 100}, 1.0, 2.0, 72);
  Generator gen(5);
  const Tensor y = dropout(x, p, true, &gen);
  const std::vector<float> xv = Values(x), yv = Values(y);
  int64_t zeros_seen = 0;
  for (size_t i = 0; i < xv.size(); ++i) {
    if (yv[i] == 0.0f) {
      ++zeros_seen;
    } else {
      EXPECT_NEAR(yv[i], xv[i] / (1 - p), 1e-5);
    }
  }
  // 10,000 Bernoulli(0.3) draws: the standard deviation of the count is about 46.
  EXPECT_NEAR(zeros_seen, 3000, 250);
  // The same seed gives the same mask; the stream moves on between calls.
  Generator again(5);
  EXPECT_EQ(Values(dropout(x, p, true, &again)), yv);
  EXPECT_NE(Values(dropout(x, p, true, &again)), yv);
}

// ---- Joining -------------------------------------------------------------------------------

TEST_F(OpsTest, CatJoinsAlongAnyDimension) {
  const Tensor a = Randn({2, 3}, 81), b = Randn({2, 1}, 82), c = Randn({2, 2}, 83);
  const std::vector<float> av = Values(a), bv = Values(b), cv = Values(c);
  std::vector<float> expected;
  for (int r = 0; r < 2; ++r) {
    expected.insert(expected.end(), av.begin() + r * 3, av.begin() + r * 3 + 3);
    expected.push_back(bv[r]);
    expected.insert(expected.end(), cv.begin() + r * 2, cv.begin() + r * 2 + 2);
  }
  ExpectValues(cat({a, b, c}, 1), {2, 6}, expected, 0);
  ExpectValues(cat({a, b, c}, -1), {2, 6}, expected, 0);
  std::vector<float> rows = av;
  rows.insert(rows.end(), av.begin(), av.end());
  ExpectValues(cat({a, a}), {4, 3}, rows, 0);
  ExpectValues(cat({a, zeros({0, 3})}), {2, 3}, av, 0);
  ExpectValues(cat({a.t().contiguous().t(), a}), {4, 3}, rows, 0);  // a strided input
  const Tensor ints = cat({arange(3, kInt64), arange(2, kInt64)});
  EXPECT_EQ(ints.dtype(), kInt64);
  EXPECT_THAT(ints.to_vector<int64_t>(), ElementsAre(0, 1, 2, 0, 1));
  ExpectValues(cat({a}, 0), {2, 3}, av, 0);
  EXPECT_FALSE(cat({a}, 0).shares_storage_with(a));
}

TEST_F(OpsTest, CatAndStackErrorsNameTheOffendingTensor) {
  EXPECT_THAT(ErrorOf([] { cat({}); }), HasSubstr("cat: expected at least one tensor"));
  EXPECT_THAT(ErrorOf([] {
                cat({zeros({2, 3}), zeros({3, 3})}, 1);
              }),
              HasSubstr("cat: tensor 1 is [3, 3] but tensor 0 is [2, 3]; all sizes except "
                        "dimension 1 must match"));
  EXPECT_THAT(ErrorOf([] {
                cat({zeros({2, 3}), zeros({2, 3}), zeros({2})});
              }),
              HasSubstr("cat: tensor 2 is [2] but tensor 0 is [2, 3]"));
  EXPECT_THAT(ErrorOf([] {
                cat({zeros({2}), zeros({2}, Device::Cpu(1))});
              }),
              HasSubstr("cat: tensor 1 is on cpu:1 but tensor 0 is on cpu:0"));
  EXPECT_THAT(ErrorOf([] { cat({zeros({2}), zeros({2})}, 1); }), HasSubstr("cat: dimension 1"));
  EXPECT_THAT(ErrorOf([] { cat({scalar_tensor(1.0)}); }),
              HasSubstr("cat: tensor 0 is zero-dimensional"));
  EXPECT_THAT(ErrorOf([] {
                cat({zeros({2}), Tensor()});
              }),
              HasSubstr("cat: tensor 1 is an undefined Tensor"));
  EXPECT_THAT(ErrorOf([] { stack({}); }), HasSubstr("stack: expected at least one tensor"));
  EXPECT_THAT(ErrorOf([] {
                stack({zeros({2, 3}), zeros({2, 4})});
              }),
              HasSubstr("stack: tensor 1 is [2, 4] but tensor 0 is [2, 3]; all tensors must "
                        "have the same shape"));
  EXPECT_THAT(ErrorOf([] { stack({zeros({2, 3})}, 3); }), HasSubstr("stack: dimension 3"));
}

TEST_F(OpsTest, StackAddsANewDimension) {
  const Tensor a = Randn({2, 3}, 91), b = Randn({2, 3}, 92);
  const std::vector<float> av = Values(a), bv = Values(b);
  std::vector<float> along0 = av;
  along0.insert(along0.end(), bv.begin(), bv.end());
  ExpectValues(stack({a, b}), {2, 2, 3}, along0, 0);
  std::vector<float> along2;
  for (size_t i = 0; i < av.size(); ++i) {
    along2.push_back(av[i]);
    along2.push_back(bv[i]);
  }
  ExpectValues(stack({a, b}, 2), {2, 3, 2}, along2, 0);
  ExpectValues(stack({a, b}, -1), {2, 3, 2}, along2, 0);
  EXPECT_EQ(stack({a, b}, 1).shape(), (Shape{2, 2, 3}));
  ExpectValues(stack({scalar_tensor(1.0), scalar_tensor(2.0)}), {2}, {1, 2}, 0);
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

// ---- Autograd bookkeeping ------------------------------------------------------------------

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

TEST_F(OpsTest, AmaxSplitsTheGradientEvenlyAmongTies) {
  Tensor x = Param(from_vector(std::vector<float>{3, 1, 3, 3, 2, 0, 1, 2, 2}, {3, 3}));
  sum(amax(x, 1)).backward();
  ExpectValues(x.grad(), {3, 3}, {0.5f, 0, 0.5f, 1, 0, 0, 0, 0.5f, 0.5f});
}

TEST_F(OpsTest, IntegerTargetsAndConstantsGetNoGradient) {
  Tensor logits = Param(Randn({3, 4}, 121));
  const Tensor targets = Labels(std::vector<int64_t>{0, 3, 1}, {3});
  Tensor loss = cross_entropy(logits, targets);
  loss.backward();
  EXPECT_EQ(logits.grad().shape(), (Shape{3, 4}));
  EXPECT_FALSE(targets.requires_grad());
}

// ---- Gradient checks: one for every differentiable op --------------------------------------

// Linear (or piecewise-linear) functions are exact under central differences, so a larger
// step loses less to float32 rounding.
constexpr double kLinearEps = 1e-2;

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

TEST_F(OpsTest, GradientsOfSumAndMean) {
  const Tensor x = Param64(Randn({2, 3, 4}, 241));
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return sum(in[0]); }, {x}, kLinearEps);
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return in[0].sum(); }, {x}, kLinearEps);
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return mean(in[0]); }, {x}, kLinearEps);
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return in[0].mean(); }, {x}, kLinearEps);
  for (bool keepdim : {false, true}) {
    for (const std::vector<int64_t>& dims :
         std::vector<std::vector<int64_t>>{{0}, {1}, {-1}, {0, 2}, {-1, 1}, {}}) {
      SCOPED_TRACE("dims " + ShapeToString(dims) + (keepdim ? " keepdim" : ""));
      EXPECT_GRADIENTS_MATCH([&](const Inputs& in) { return sum(in[0], dims, keepdim); }, {x},
                             kLinearEps);
      EXPECT_GRADIENTS_MATCH([&](const Inputs& in) { return mean(in[0], dims, keepdim); }, {x},
                             kLinearEps);
    }
  }
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return sum_to(in[0], {3, 1}); }, {x}, kLinearEps);
  // A non-contiguous input.
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return sum(in[0].transpose(0, 2), {1}); }, {x},
                         kLinearEps);
}

TEST_F(OpsTest, GradientsOfAmax) {
  const Tensor x = Param64(Distinct({3, 4}, 251));
  for (int64_t dim : {0, 1, -1}) {
    for (bool keepdim : {false, true}) {
      EXPECT_GRADIENTS_MATCH([&](const Inputs& in) { return amax(in[0], dim, keepdim); }, {x},
                             kLinearEps);
    }
  }
}

TEST_F(OpsTest, GradientsOfSoftmaxAndLogSoftmax) {
  const Tensor x = Param64(Randn({3, 5}, 261));
  const Tensor x3 = Param64(Randn({2, 3, 4}, 262));
  for (int64_t dim : {0, 1, -1}) {
    SCOPED_TRACE("dim " + std::to_string(dim));
    EXPECT_GRADIENTS_MATCH([&](const Inputs& in) { return softmax(in[0], dim); }, {x});
    EXPECT_GRADIENTS_MATCH([&](const Inputs& in) { return log_softmax(in[0], dim); }, {x});
    EXPECT_GRADIENTS_MATCH([&](const Inputs& in) { return softmax(in[0], dim); }, {x3});
    EXPECT_GRADIENTS_MATCH([&](const Inputs& in) { return log_softmax(in[0], dim); }, {x3});
  }
}

TEST_F(OpsTest, GradientsOfMatmulInAllForms) {
  const std::vector<MatmulCase> cases = {{{3, 4}, {4, 2}, {}},       {{2, 3, 4}, {2, 4, 2}, {}},
                                         {{2, 3, 4}, {4, 2}, {}},    {{3, 4}, {2, 4, 2}, {}},
                                         {{1, 3, 4}, {2, 4, 2}, {}}, {{4}, {4, 2}, {}},
                                         {{3, 4}, {4}, {}},          {{4}, {4}, {}}};
  uint64_t seed = 270;
  for (const MatmulCase& c : cases) {
    SCOPED_TRACE(ShapeToString(c.a) + " x " + ShapeToString(c.b));
    const Tensor a = Param64(Randn(c.a, ++seed)), b = Param64(Randn(c.b, ++seed));
    EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return matmul(in[0], in[1]); }, {a, b},
                           kLinearEps);
  }
  // Transposed operands (Gemm's transpose flags, forward and backward).
  const Tensor a = Param64(Randn({4, 3}, 281)), b = Param64(Randn({2, 4}, 282));
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return matmul(in[0].t(), in[1].t()); }, {a, b},
                         kLinearEps);
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return in[0].t().matmul(in[1].t()); }, {a, b},
                         kLinearEps);
}

TEST_F(OpsTest, GradientsOfLinear) {
  const Tensor w = Param64(Randn({3, 4}, 291)), b = Param64(Randn({3}, 292));
  for (const Shape& shape : {Shape{2, 4}, Shape{2, 2, 4}, Shape{4}}) {
    SCOPED_TRACE(ShapeToString(shape));
    const Tensor x = Param64(Randn(shape, 293));
    EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return linear(in[0], in[1], in[2]); }, {x, w, b},
                           kLinearEps);
    EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return linear(in[0], in[1], Tensor()); }, {x, w},
                           kLinearEps);
  }
  // Only the weight needs a gradient (the first layer of a network).
  const Tensor x = Randn({2, 4}, 294).to(kFloat64);
  EXPECT_GRADIENTS_MATCH([x](const Inputs& in) { return linear(x, in[0], in[1]); }, {w, b},
                         kLinearEps);
}

TEST_F(OpsTest, GradientsOfLosses) {
  const Tensor scores = Param64(Randn({4, 5}, 301));
  const Tensor targets = Labels(std::vector<int64_t>{1, 0, 4, 1}, {4});
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return nll_loss(in[0], in[1]); }, {scores, targets},
                         kLinearEps);
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return cross_entropy(in[0], in[1]); },
                         {scores, targets});
  const Tensor a = Param64(Randn({3, 4}, 302)), b = Param64(Randn({3, 4}, 303));
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return mse_loss(in[0], in[1]); }, {a, b});
}

TEST_F(OpsTest, GradientsOfConv2d) {
  struct Case {
    Shape x, w;
    std::vector<int64_t> stride, padding;
    bool bias;
  };
  uint64_t seed = 310;
  for (const Case& c : std::vector<Case>{{{2, 2, 5, 5}, {3, 2, 3, 3}, {1, 1}, {0, 0}, true},
                                         {{1, 2, 5, 6}, {2, 2, 3, 2}, {2, 1}, {1, 0}, false},
                                         {{2, 1, 4, 4}, {2, 1, 2, 2}, {2, 2}, {1, 1}, true},
                                         {{1, 3, 3, 3}, {2, 3, 1, 1}, {1, 1}, {0, 0}, true}}) {
    SCOPED_TRACE(ShapeToString(c.x) + " * " + ShapeToString(c.w));
    const Tensor x = Param64(Randn(c.x, ++seed)), w = Param64(Randn(c.w, ++seed));
    const Tensor b = Param64(Randn({c.w[0]}, ++seed));
    if (c.bias) {
      EXPECT_GRADIENTS_MATCH(
          [&](const Inputs& in) { return conv2d(in[0], in[1], in[2], c.stride, c.padding); },
          {x, w, b}, kLinearEps);
    } else {
      EXPECT_GRADIENTS_MATCH(
          [&](const Inputs& in) { return conv2d(in[0], in[1], Tensor(), c.stride, c.padding); },
          {x, w}, kLinearEps);
    }
  }
}

TEST_F(OpsTest, GradientsOfMaxPool2d) {
  const Tensor x = Param64(Distinct({2, 2, 5, 5}, 321));
  EXPECT_GRADIENTS_MATCH(
      [](const Inputs& in) {
        return max_pool2d(in[0], {2, 2});
      },
      {x}, kLinearEps);
  EXPECT_GRADIENTS_MATCH(
      [](const Inputs& in) {
        return max_pool2d(in[0], {3, 3}, {1, 1});
      },
      {x}, kLinearEps);
  EXPECT_GRADIENTS_MATCH(
      [](const Inputs& in) {
        return max_pool2d(in[0], {3, 2}, {2, 1}, {1, 1});
      },
      {x}, kLinearEps);
}

TEST_F(OpsTest, GradientsOfDropout) {
  const Tensor x = Param64(Randn({4, 5}, 331));
  // A fresh generator with a fixed seed per call, so every evaluation draws the same mask.
  EXPECT_GRADIENTS_MATCH(
      [](const Inputs& in) {
        Generator gen(3);
        return dropout(in[0], 0.4, true, &gen);
      },
      {x}, kLinearEps);
}

TEST_F(OpsTest, GradientsOfCatAndStack) {
  const Tensor a = Param64(Randn({2, 3}, 341)), b = Param64(Randn({2, 1}, 342));
  const Tensor c = Param64(Randn({2, 3}, 343));
  EXPECT_GRADIENTS_MATCH(
      [](const Inputs& in) {
        return cat({in[0], in[1], in[2]}, 1);
      },
      {a, b, c}, kLinearEps);
  EXPECT_GRADIENTS_MATCH(
      [](const Inputs& in) {
        return cat({in[0], in[1]}, 0);
      },
      {a, c}, kLinearEps);
  EXPECT_GRADIENTS_MATCH(
      [b](const Inputs& in) {
        return cat({in[0], b.detach(), in[0]}, -1);
      },
      {a}, kLinearEps);
  for (int64_t dim : {0, 1, 2, -1}) {
    EXPECT_GRADIENTS_MATCH(
        [dim](const Inputs& in) {
          return stack({in[0], in[1]}, dim);
        },
        {a, c}, kLinearEps);
  }
}

TEST_F(OpsTest, GradientsFlowAcrossDevices) {
  const Tensor w = Param64(Randn({3, 4}, 351));
  const Tensor x = Randn({2, 4}, 352).to(kFloat64).to(Device::Cpu(1));
  EXPECT_GRADIENTS_MATCH(
      [x](const Inputs& in) { return tanh(linear(x, in[0].to(Device::Cpu(1)), Tensor())); }, {w});
  const Tensor on_cpu1 = Param64(Randn({3, 4}, 353).to(Device::Cpu(1)));
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return log_softmax(in[0], 1); }, {on_cpu1});
}

// ---- Every op on CUDA against the CPU (skipped without a GPU) -------------------------------

struct DeviceCase {
  std::string name;
  Inputs inputs;  // on the CPU; float inputs get gradients
  std::function<Tensor(const Inputs&)> f;
};

// f's output and the gradients of sum(f * projection) with respect to the float inputs.
std::vector<Tensor> RunOn(const DeviceCase& c, Device device) {
  Inputs inputs;
  for (const Tensor& t : c.inputs) {
    Tensor moved = t.detach().to(device);
    if (moved.dtype() == kFloat32) moved.set_requires_grad(true);
    inputs.push_back(moved);
  }
  const Tensor y = c.f(inputs);
  EXPECT_EQ(y.device(), device);
  std::vector<Tensor> results = {y.to(Device::Cpu(0))};
  if (y.requires_grad()) {
    Generator gen(99);
    y.backward(randn(y.shape(), {}, &gen).to(device));
  }
  for (const Tensor& t : inputs) {
    if (t.dtype() == kFloat32) {
      results.push_back(t.grad().defined() ? t.grad().to(Device::Cpu(0)) : Tensor());
    }
  }
  return results;
}

std::vector<DeviceCase> DeviceCases() {
  const Tensor a = Randn({4, 5}, 401), b = Randn({5}, 402), col = Randn({4, 1}, 403);
  const Tensor positive = Uniform({4, 5}, 0.5, 2.0, 404);
  const Tensor nonzero = AwayFromZero({4, 5}, 405), distinct = Distinct({4, 5}, 406);
  const Tensor x3 = Randn({2, 3, 4}, 407);
  const Tensor labels = Labels({1, 0, 4, 2}, {4});
  const Tensor ints = Labels({3, -1, 4, 1, -5, 9}, {2, 3});
  const Tensor image = Randn({2, 3, 7, 6}, 408), kernel = Randn({4, 3, 3, 3}, 409);
  const Tensor conv_bias = Randn({4}, 410), pool_input = Distinct({2, 3, 7, 6}, 411);
  const Tensor w = Randn({3, 5}, 412), bias = Randn({3}, 413);
  std::vector<DeviceCase> cases = {
      {"add broadcast", {a, b}, [](const Inputs& in) { return add(in[0], in[1]); }},
      {"sub broadcast", {a, col}, [](const Inputs& in) { return sub(in[0], in[1]); }},
      {"mul broadcast", {col, b}, [](const Inputs& in) { return mul(in[0], in[1]); }},
      {"div broadcast", {a, positive}, [](const Inputs& in) { return div(in[0], in[1]); }},
      {"maximum", {distinct, b}, [](const Inputs& in) { return maximum(in[0], in[1]); }},
      {"minimum", {distinct, col}, [](const Inputs& in) { return minimum(in[0], in[1]); }},
      {"scalars", {a}, [](const Inputs& in) { return 2.0 - in[0] * 3.0 + 1.0 / 4.0; }},
      {"pow", {positive}, [](const Inputs& in) { return pow(in[0], 2.5); }},
      {"neg exp", {a}, [](const Inputs& in) { return exp(neg(in[0])); }},
      {"log sqrt", {positive}, [](const Inputs& in) { return log(in[0]) + sqrt(in[0]); }},
      {"abs relu", {nonzero}, [](const Inputs& in) { return abs(in[0]) * relu(in[0]); }},
      {"tanh sigmoid square",
       {a},
       [](const Inputs& in) { return tanh(in[0]) + sigmoid(in[0]) * square(in[0]); }},
      {"comparisons",
       {a, b},
       [](const Inputs& in) {
         return eq(in[0], in[0]) + ne(in[0], in[1]) * 2.0 + lt(in[0], in[1]) * 4.0 +
                le(in[0], in[1]) * 8.0 + gt(in[0], in[1]) * 16.0 + ge(in[0], in[1]) * 32.0;
       }},
      {"sum mean",
       {x3},
       [](const Inputs& in) {
         return sum(in[0], {0, 2}) + mean(in[0], {1}).sum();
       }},
      {"sum keepdim", {x3}, [](const Inputs& in) { return sum(in[0], {-1}, true) * mean(in[0]); }},
      {"sum strided", {x3}, [](const Inputs& in) { return sum(in[0].transpose(0, 2), {1}); }},
      {"amax", {distinct}, [](const Inputs& in) { return amax(in[0], 0) + amax(in[0], 1).sum(); }},
      {"argmax argmin",
       {a},
       [](const Inputs& in) {
         return (argmax(in[0], 1, true) + argmin(in[0], 0, true)).to(kFloat32);
       }},
      {"sum_to",
       {x3},
       [](const Inputs& in) {
         return sum_to(in[0], {3, 1});
       }},
      {"softmax", {x3}, [](const Inputs& in) { return softmax(in[0], 1); }},
      {"log_softmax", {x3}, [](const Inputs& in) { return log_softmax(in[0], -1); }},
      {"matmul 2d", {a, Randn({5, 3}, 414)}, [](const Inputs& in) { return matmul(in[0], in[1]); }},
      {"matmul transposed",
       {Randn({5, 4}, 415), Randn({3, 5}, 416)},
       [](const Inputs& in) { return matmul(in[0].t(), in[1].t()); }},
      {"matmul narrowed",
       {Randn({4, 9}, 417), Randn({5, 3}, 418)},
       [](const Inputs& in) { return matmul(in[0].narrow(1, 2, 5), in[1]); }},
      {"matmul batched",
       {x3, Randn({2, 4, 3}, 419)},
       [](const Inputs& in) { return matmul(in[0], in[1]); }},
      {"matmul 3d x 2d",
       {x3, Randn({4, 3}, 420)},
       [](const Inputs& in) { return matmul(in[0], in[1]); }},
      {"matmul 2d x 3d",
       {Randn({3, 3}, 421), x3},
       [](const Inputs& in) { return matmul(in[0], in[1]); }},
      {"matmul permuted",
       {Randn({4, 2, 3}, 422), Randn({2, 5, 4}, 423)},
       [](const Inputs& in) {
         return matmul(in[0].permute({1, 2, 0}), in[1].transpose(1, 2));
       }},
      {"matmul vectors",
       {b, Randn({5}, 424)},
       [](const Inputs& in) { return matmul(in[0], in[1]); }},
      {"linear", {a, w, bias}, [](const Inputs& in) { return linear(in[0], in[1], in[2]); }},
      {"linear 3d no bias",
       {Randn({2, 3, 5}, 425), w},
       [](const Inputs& in) { return linear(in[0], in[1], Tensor()); }},
      {"nll_loss", {a, labels}, [](const Inputs& in) { return nll_loss(in[0], in[1]); }},
      {"cross_entropy", {a, labels}, [](const Inputs& in) { return cross_entropy(in[0], in[1]); }},
      {"cross_entropy huge",
       {mul(a, 1000.0), labels},
       [](const Inputs& in) { return cross_entropy(in[0], in[1]); }},
      {"mse_loss", {a, positive}, [](const Inputs& in) { return mse_loss(in[0], in[1]); }},
      {"conv2d",
       {image, kernel, conv_bias},
       [](const Inputs& in) { return conv2d(in[0], in[1], in[2]); }},
      {"conv2d stride padding",
       {image, kernel},
       [](const Inputs& in) {
         return conv2d(in[0], in[1], Tensor(), {2, 1}, {1, 2});
       }},
      {"max_pool2d",
       {pool_input},
       [](const Inputs& in) {
         return max_pool2d(in[0], {2, 2});
       }},
      {"max_pool2d padding stride",
       {pool_input},
       [](const Inputs& in) {
         return max_pool2d(in[0], {3, 3}, {2, 1}, {1, 1});
       }},
      {"dropout",
       {a},
       [](const Inputs& in) {
         Generator gen(17);  // the same Philox stream on every device
         return dropout(in[0], 0.3, true, &gen);
       }},
      {"cat",
       {a, col, a},
       [](const Inputs& in) {
         return cat({in[0], in[1], in[2]}, 1);
       }},
      {"stack",
       {a, positive},
       [](const Inputs& in) {
         return stack({in[0], in[1]}, 1);
       }},
      {"int64",
       {ints},
       [](const Inputs& in) {
         const Tensor t = in[0];
         return cat({add(t, t), mul(t, 3.0), maximum(t, neg(t)), relu(t), abs(t), square(t),
                     sum(t, {0}, true), amax(t, 0, true)})
             .to(kFloat32);
       }},
  };
  return cases;
}

// Runs every case on cpu:0 and on `device`; outputs and gradients must agree and every
// result must come back from `device` (checked by RunOn's to()).
void ExpectEveryOpMatchesCpu0On(Device device) {
  for (const DeviceCase& c : DeviceCases()) {
    SCOPED_TRACE(c.name + " on " + device.ToString());
    const std::vector<Tensor> reference = RunOn(c, Device::Cpu(0));
    const std::vector<Tensor> other = RunOn(c, device);
    ASSERT_EQ(reference.size(), other.size());
    for (size_t i = 0; i < reference.size(); ++i) {
      ASSERT_EQ(reference[i].defined(), other[i].defined()) << "result " << i;
      if (!reference[i].defined()) continue;
      ASSERT_EQ(reference[i].shape(), other[i].shape()) << "result " << i;
      EXPECT_TRUE(allclose(other[i], reference[i], 1e-4, 1e-4))
          << "result " << i << " (0: output, then gradients)\ncpu:0 " << reference[i] << "\n"
          << device << " " << other[i];
    }
  }
}

TEST_F(OpsTest, EveryOpGivesTheSameResultsOnAnotherCpuDevice) {
  ExpectEveryOpMatchesCpu0On(Device::Cpu(1));
}

TEST(OpsOnCudaTest, EveryOpMatchesTheCpuForwardAndBackward) {
  if (DeviceCount(DeviceType::kCUDA) == 0) GTEST_SKIP() << "no CUDA device in this process";
  ExpectEveryOpMatchesCpu0On(Device::Cuda(0));
}

TEST(OpsOnCudaTest, FiniteDifferencesAndErrorsOnCuda) {
  if (DeviceCount(DeviceType::kCUDA) == 0) GTEST_SKIP() << "no CUDA device in this process";
  const Device cuda = Device::Cuda(0);
  const Tensor logits = Param(Randn({3, 4}, 431).to(cuda));
  const Tensor targets = Labels({0, 3, 1}, {3}, cuda);
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return cross_entropy(in[0], in[1]); },
                         {logits, targets});
  const Tensor x = Param(Randn({2, 2, 5, 5}, 432).to(cuda));
  const Tensor k = Param(Randn({3, 2, 3, 3}, 433).to(cuda));
  EXPECT_GRADIENTS_MATCH(
      [](const Inputs& in) {
        return conv2d(in[0], in[1], Tensor(), {1, 1}, {1, 1});
      },
      {x, k}, kLinearEps);
  // Targets on the GPU are validated there, without reading device memory from the host.
  EXPECT_THAT(ErrorOf([&] {
                cross_entropy(logits, Labels({0, 4, 1}, {3}, cuda));
              }),
              HasSubstr("targets must be class indices in [0, C) = [0, 4) but range over [0, 4]"));
  EXPECT_THAT(ErrorOf([&] {
                add(logits, zeros({3, 4}));
              }),
              HasSubstr("add: a is on cuda:0 and b on cpu:0"));
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
}  // namespace tandem
