#include "tensor/gradcheck.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest-spi.h"
#include "gtest/gtest.h"
#include "tensor/core/autograd.h"
#include "tensor/tensor.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

// x * x with a backward chosen by the test: the true 2x, or a deliberately wrong one.
Tensor SquareWithBackward(const Tensor& x, double factor) {
  Tensor out;
  {
    NoGradGuard no_grad;
    out = mul(x, x);
  }
  if (NeedsGrad({x})) {
    RecordOp("TestSquareBackward", {x}, out, [x = x.detach(), factor](const Tensor& grad) {
      return std::vector<Tensor>{mul(grad, mul(x, factor))};
    });
  }
  return out;
}

Tensor Leaf(const Shape& shape, uint64_t seed) {
  Generator gen(seed);
  Tensor t = randn(shape, {}, &gen);
  t.set_requires_grad(true);
  return t;
}

TEST(GradCheckTest, PassesForACorrectBackward) {
  const GradCheckResult result =
      CheckGradients([](const std::vector<Tensor>& in) { return SquareWithBackward(in[0], 2.0); },
                     {Leaf({3, 4}, 1)});
  EXPECT_TRUE(result.ok) << result.message;
  EXPECT_EQ(result.checked_elements, 12);
  EXPECT_EQ(result.mismatched_elements, 0);
  EXPECT_LT(result.max_abs_error, 1e-3);
}

TEST(GradCheckTest, CatchesAWrongBackwardAndSaysWhere) {
  const GradCheckResult result =
      CheckGradients([](const std::vector<Tensor>& in) { return SquareWithBackward(in[0], 2.2); },
                     {Leaf({2, 3}, 2)});
  EXPECT_FALSE(result.ok);
  EXPECT_FALSE(static_cast<bool>(result));
  EXPECT_EQ(result.mismatched_elements, 6);
  EXPECT_THAT(result.message, HasSubstr("6 of 6 elements differ"));
  EXPECT_THAT(result.message, HasSubstr("input 0 [2, 3] element (0, 0): analytic"));
  EXPECT_THAT(result.message, HasSubstr("numeric"));
}

TEST(GradCheckTest, CatchesAGradientThatIsOffForOneElementOnly) {
  const auto f = [](const std::vector<Tensor>& in) {
    Tensor out;
    {
      NoGradGuard no_grad;
      out = mul(in[0], 3.0);
    }
    RecordOp("OneWrongElementBackward", {in[0]}, out, [](const Tensor& grad) {
      std::vector<float> bump(6, 0.0f);
      bump[4] = 0.5f;
      return std::vector<Tensor>{add(mul(grad, 3.0), from_vector(bump, {2, 3}))};
    });
    return out;
  };
  const GradCheckResult result = CheckGradients(f, {Leaf({2, 3}, 3)});
  EXPECT_FALSE(result.ok);
  EXPECT_EQ(result.mismatched_elements, 1);
  EXPECT_THAT(result.message, HasSubstr("element (1, 1)"));
}

TEST(GradCheckTest, ChecksEveryInputThatRequiresGradAndSkipsTheOthers) {
  Tensor a = Leaf({2, 3}, 4);
  Tensor b = Leaf({3}, 5);
  Tensor constant = randn({2, 3});
  Tensor labels = from_vector(std::vector<int64_t>{0, 1}, {2}, kInt64);
  const auto f = [](const std::vector<Tensor>& in) {
    return add(mul(in[0], in[1]), mul(in[2], in[3].to(kFloat32).unsqueeze(1)));
  };
  const GradCheckResult result = CheckGradients(f, {a, b, constant, labels});
  EXPECT_TRUE(result.ok) << result.message;
  EXPECT_EQ(result.checked_elements, 6 + 3);
}

TEST(GradCheckTest, NamesTheInputWhoseGradientIsWrong) {
  const auto f = [](const std::vector<Tensor>& in) {
    return add(in[0], SquareWithBackward(in[1], 1.0));
  };
  const GradCheckResult result = CheckGradients(f, {Leaf({2}, 6), Leaf({2}, 7)});
  EXPECT_FALSE(result.ok);
  EXPECT_THAT(result.message, HasSubstr("input 1 [2] element (0)"));
  EXPECT_THAT(result.message, ::testing::Not(HasSubstr("input 0")));
}

TEST(GradCheckTest, LeavesTheCallersTensorsAndGradientsAlone) {
  Tensor x = Leaf({4}, 8);
  const std::vector<float> before = x.to_vector<float>();
  EXPECT_GRADIENTS_MATCH([](const std::vector<Tensor>& in) { return tanh(in[0]); }, {x});
  EXPECT_FALSE(x.grad().defined());
  EXPECT_EQ(x.to_vector<float>(), before);
}

TEST(GradCheckTest, AnOutputThatDoesNotDependOnTheInputHasZeroGradient) {
  Tensor x = Leaf({3}, 9);
  Tensor other = randn({3});
  EXPECT_GRADIENTS_MATCH([other](const std::vector<Tensor>&) { return mul(other, 2.0); }, {x});
  const GradCheckResult wrong =
      CheckGradients([](const std::vector<Tensor>& in) { return in[0].detach(); }, {x});
  EXPECT_FALSE(wrong.ok) << "a detached output hides the true gradient of 1";
}

TEST(GradCheckTest, RejectsCallsWithNothingToCheck) {
  try {
    CheckGradients([](const std::vector<Tensor>& in) { return in[0]; }, {randn({2})});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("no input is a floating-point tensor that requires grad"));
  }
}

TEST(GradCheckTest, MacrosReportTheMessage) {
  EXPECT_NONFATAL_FAILURE(
      EXPECT_GRADIENTS_MATCH(
          [](const std::vector<Tensor>& in) { return SquareWithBackward(in[0], 3.0); },
          {Leaf({2}, 10)}),
      "gradient check failed");
}

}  // namespace
}  // namespace tandem
