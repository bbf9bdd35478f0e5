// Tests of dropout (tensor/ops/dropout.cc).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "tensor/gradcheck.h"
#include "tensor/ops/ops_testing.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace tandem {
namespace ops_testing {
namespace {

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

}  // namespace
}  // namespace ops_testing
}  // namespace tandem
