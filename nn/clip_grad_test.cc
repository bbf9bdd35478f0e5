#include "nn/clip_grad.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "nn/test_util.h"

namespace tandem::nn {
namespace {

using testing::ErrorOf;
using ::testing::HasSubstr;

// A parameter whose gradient is `grad` (backward of sum(p * grad)).
Tensor WithGradient(const std::vector<float>& grad) {
  const int64_t n = static_cast<int64_t>(grad.size());
  Tensor p = zeros({n});
  p.set_requires_grad(true);
  (p * from_vector(grad, {n})).sum().backward();
  return p;
}

std::vector<float> Grad(const Tensor& p) { return p.grad().to_vector<float>(); }

TEST(ClipGradTest, ScalesAllGradientsTogetherToMaxNorm) {
  // The gradients (3, 4) and (12) form one vector of norm 13.
  Tensor a = WithGradient({3, 4}), b = WithGradient({12});
  Tensor no_grad = zeros({2});
  no_grad.set_requires_grad(true);
  const double norm = clip_grad_norm_({a, no_grad, b}, /*max_norm=*/1.3);
  EXPECT_NEAR(norm, 13.0, 1e-5);
  const double coef = 1.3 / (13.0 + 1e-6);  // PyTorch's clip coefficient
  EXPECT_NEAR(Grad(a)[0], 3 * coef, 1e-6);
  EXPECT_NEAR(Grad(a)[1], 4 * coef, 1e-6);
  EXPECT_NEAR(Grad(b)[0], 12 * coef, 1e-6);
  EXPECT_FALSE(no_grad.grad().defined());
}

TEST(ClipGradTest, LeavesGradientsWithinTheNormAlone) {
  Tensor a = WithGradient({3, -4});
  EXPECT_NEAR(clip_grad_norm_({a}, 10.0), 5.0, 1e-6);
  EXPECT_EQ(Grad(a), (std::vector<float>{3, -4}));
  EXPECT_EQ(clip_grad_norm_({zeros({2})}, 1.0), 0.0);  // no gradients: norm 0
}

TEST(ClipGradTest, OtherNormTypes) {
  Tensor a = WithGradient({3, -4}), b = WithGradient({-1});
  EXPECT_NEAR(clip_grad_norm_({a, b}, 100.0, 1.0), 8.0, 1e-6);
  EXPECT_NEAR(clip_grad_norm_({a, b}, 100.0, 3.0), std::cbrt(27.0 + 64.0 + 1.0), 1e-5);
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_NEAR(clip_grad_norm_({a, b}, 2.0, inf), 4.0, 1e-6);
  EXPECT_NEAR(Grad(a)[1], -4 * 2.0 / (4.0 + 1e-6), 1e-6);  // largest magnitude scaled to 2
  EXPECT_THAT(ErrorOf([&] { clip_grad_norm_({a}, 1.0, 0.0); }),
              HasSubstr("norm_type must be > 0 or infinity but is 0"));
}

TEST(ClipGradTest, NonFiniteNormsThrowOnlyWhenAsked) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor a = WithGradient({1, nan});
  EXPECT_THAT(ErrorOf([&] { clip_grad_norm_({a}, 1.0, 2.0, /*error_if_nonfinite=*/true); }),
              HasSubstr("total norm of order 2 of the gradients is nan"));
  EXPECT_EQ(Grad(a)[0], 1.0f);  // nothing scaled
  EXPECT_TRUE(std::isnan(clip_grad_norm_({a}, 1.0)));
  EXPECT_TRUE(std::isnan(Grad(a)[0]));  // scaled by NaN, as PyTorch does
  Tensor b = WithGradient({1, nan});
  EXPECT_TRUE(std::isnan(clip_grad_norm_({b}, 1.0, std::numeric_limits<double>::infinity())));
}

TEST(ClipGradTest, ClipGradValueClampsEachElement) {
  Tensor a = WithGradient({-3, 0.5, 2});
  clip_grad_value_({a}, 1.0);
  EXPECT_EQ(Grad(a), (std::vector<float>{-1, 0.5, 1}));
  EXPECT_THAT(ErrorOf([&] { clip_grad_value_({a}, -1.0); }),
              HasSubstr("clip_value must be >= 0 but is -1"));
}

}  // namespace
}  // namespace tandem::nn
