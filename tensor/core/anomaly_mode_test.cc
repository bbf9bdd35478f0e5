// AnomalyMode: the first NaN or inf of a forward output or a backward gradient throws,
// naming the node and the pass; off (the default) nothing is checked; on, a finite
// computation is unchanged.
#include "tensor/core/anomaly_mode.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <exception>
#include <limits>

#include "tensor/core/autograd.h"
#include "tensor/gradcheck.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace tandem {
namespace {

using ::tandem::testing::ErrorOf;
using ::testing::HasSubstr;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

Tensor Param(std::vector<float> values) {
  const int64_t n = static_cast<int64_t>(values.size());
  return from_vector(values, {n}, TensorOptions().requires_grad(true));
}

TEST(AnomalyModeTest, OffByDefaultAndTheGuardRestoresThePreviousSetting) {
  EXPECT_FALSE(AnomalyMode::IsEnabled());
  {
    DetectAnomalyGuard on;
    EXPECT_TRUE(AnomalyMode::IsEnabled());
    {
      DetectAnomalyGuard off(false);
      EXPECT_FALSE(AnomalyMode::IsEnabled());
    }
    EXPECT_TRUE(AnomalyMode::IsEnabled());
  }
  EXPECT_FALSE(AnomalyMode::IsEnabled());
}

TEST(AnomalyModeTest, OffNaNsFlowThroughUnchecked) {
  Tensor x = Param({-1.0f, 2.0f});
  Tensor y = log(x);
  EXPECT_TRUE(std::isnan(y.to_vector<float>()[0]));
  y.sum().backward();  // no error: nobody looks
  EXPECT_FLOAT_EQ(x.grad().to_vector<float>()[1], 0.5f);
}

TEST(AnomalyModeTest, LogOfANegativeNumberNamesTheForwardOp) {
  DetectAnomalyGuard detect;
  Tensor x = Param({-1.0f, 2.0f, -3.0f, 4.0f});
  const std::string error = ErrorOf([&] { log(x); });
  EXPECT_THAT(error, HasSubstr("anomaly detected in the forward pass: the op recorded as "
                               "LogBackward on cpu:0 produced output 0 of shape [4] with 2 NaN "
                               "and 0 inf among its 4 values"));
  EXPECT_THAT(error, HasSubstr("its inputs were all finite, so this op made them"));
  // Positive inputs pass.
  EXPECT_NO_THROW(log(Param({1.0f, 2.0f})));
}

TEST(AnomalyModeTest, DivisionByZeroInForwardIsAnInf) {
  DetectAnomalyGuard detect;
  Tensor a = Param({1.0f, 0.0f});
  Tensor b = from_vector(std::vector<float>{0.0f, 0.0f}, {2});
  EXPECT_THAT(ErrorOf([&] { div(a, b); }),
              HasSubstr("DivBackward on cpu:0 produced output 0 of shape [2] with 1 NaN and 1 "
                        "inf among its 2 values"));
}

TEST(AnomalyModeTest, AnInputThatIsAlreadyNonFiniteIsSaid) {
  DetectAnomalyGuard detect;
  Tensor x = Param({1.0f, kNaN, kInf});
  const std::string error = ErrorOf([&] { mul(x, 2.0); });
  EXPECT_THAT(error, HasSubstr("MulScalarBackward"));
  EXPECT_THAT(error, HasSubstr("1 NaN and 1 inf among its 3 values"));
  EXPECT_THAT(error, HasSubstr("its input(s) 0 already held non-finite values"));
}

TEST(AnomalyModeTest, ZeroOverZeroInBackwardNamesTheBackwardNode) {
  // sqrt's derivative at 0 is grad / (2 * sqrt(0)): with a zero incoming gradient, 0/0.
  Tensor x = Param({0.0f, 4.0f});
  Tensor loss = mul(sqrt(x), 0.0).sum();  // forward: all finite
  DetectAnomalyGuard detect;
  try {
    loss.backward();
    FAIL() << "backward should have thrown";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_THAT(what, HasSubstr("backward failed in SqrtBackward on cpu:0: anomaly detected in "
                                "the backward pass: SqrtBackward on cpu:0 returned a gradient "
                                "of shape [2] for its input 0 with 1 NaN and 0 inf among its 2 "
                                "values"));
    EXPECT_THAT(what, HasSubstr("the gradients it received were all finite"));
    // The anomaly error itself is nested inside the engine's.
    EXPECT_THROW(std::rethrow_if_nested(e), Error);
  }
  EXPECT_FALSE(x.grad().defined()) << "nothing past the failing node may run";
}

TEST(AnomalyModeTest, AnInfiniteDerivativeInBackward) {
  Tensor x = Param({0.0f, 1.0f});
  Tensor loss = sqrt(x).sum();
  DetectAnomalyGuard detect;
  EXPECT_THAT(ErrorOf([&] { loss.backward(); }),
              HasSubstr("SqrtBackward on cpu:0 returned a gradient of shape [2] for its input 0 "
                        "with 0 NaN and 1 inf among its 2 values"));
}

TEST(AnomalyModeTest, ANonFiniteGradientGivenToBackwardIsSaid) {
  Tensor x = Param({1.0f, 2.0f});
  Tensor y = mul(x, 3.0);
  DetectAnomalyGuard detect;
  const std::string error = ErrorOf([&] {
    y.backward(from_vector(std::vector<float>{kNaN, 1.0f}, {2}));
  });
  EXPECT_THAT(error, HasSubstr("MulScalarBackward on cpu:0 returned a gradient"));
  EXPECT_THAT(error, HasSubstr("for output(s) 0 were already non-finite"));
}

TEST(AnomalyModeTest, OpsThatRecordNothingAreNotChecked) {
  DetectAnomalyGuard detect;
  Tensor x = from_vector(std::vector<float>{-1.0f}, {1});  // requires no grad
  EXPECT_NO_THROW(log(x));
  Tensor p = Param({-1.0f});
  NoGradGuard no_grad;
  EXPECT_NO_THROW(log(p));
}

// A small network trained one step with and without anomaly mode: the same loss and the
// same gradients, bit for bit (the checks read tensors, never change them).
TEST(AnomalyModeTest, AFiniteStepIsUnchanged) {
  auto step = [](bool detect) {
    DetectAnomalyGuard guard(detect);
    manual_seed(11);
    Tensor w1 = randn({6, 5}).set_requires_grad(true);
    Tensor w2 = randn({3, 6}).set_requires_grad(true);
    Tensor x = randn({4, 5});
    Tensor targets = from_vector(std::vector<int64_t>{0, 2, 1, 2}, {4});
    Tensor h = relu(matmul(x, w1.t()));
    Tensor loss = cross_entropy(matmul(h, w2.t()), targets);
    loss.backward();
    std::vector<float> all = loss.to_vector<float>();
    for (const Tensor& w : {w1, w2}) {
      for (float g : w.grad().to_vector<float>()) all.push_back(g);
    }
    return all;
  };
  const std::vector<float> off = step(false);
  const std::vector<float> on = step(true);
  ASSERT_EQ(off.size(), on.size());
  for (size_t i = 0; i < off.size(); ++i) EXPECT_EQ(off[i], on[i]) << "value " << i;
}

// Gradient checks run under anomaly mode too (their ops stay finite), and agree.
TEST(AnomalyModeTest, GradcheckPassesUnderAnomalyMode) {
  DetectAnomalyGuard detect;
  manual_seed(5);
  Tensor x = add(rand({3, 4}), 0.5).set_requires_grad(true);
  EXPECT_GRADIENTS_MATCH([](const std::vector<Tensor>& in) { return log(in[0]) * in[0]; }, {x});
}

}  // namespace
}  // namespace tandem
