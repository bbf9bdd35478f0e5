#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "tensor/philox.h"
#include "tensor/tensor.h"

namespace tandem {
namespace {

TEST(RandomTest, SameSeedSameNumbersOnEveryLogicalDevice) {
  SetCpuDeviceCount(2);
  Generator a(7), b(7);
  const std::vector<float> x = rand({1000}, Device::Cpu(0), &a).to_vector<float>();
  const std::vector<float> y = rand({1000}, Device::Cpu(1), &b).to_vector<float>();
  EXPECT_EQ(x, y);
  // The next request continues the stream rather than repeating it.
  EXPECT_NE(rand({1000}, Device::Cpu(0), &a).to_vector<float>(), x);
  a.manual_seed(7);
  EXPECT_EQ(rand({1000}, Device::Cpu(0), &a).to_vector<float>(), x);
}

TEST(RandomTest, ValuesAreThePhiloxStream) {
  Generator g(123);
  const std::vector<float> x = rand({10}, {}, &g).to_vector<float>();
  for (int i = 0; i < 10; ++i) EXPECT_EQ(x[i], philox::Uniform(123, i));
}

TEST(RandomTest, UniformAndNormalHaveTheRightMoments) {
  Generator g(1);
  const int n = 200000;
  const std::vector<float> u = rand({n}, {}, &g).to_vector<float>();
  const std::vector<float> z = randn({n}, {}, &g).to_vector<float>();
  double mu = 0, mz = 0, vz = 0;
  for (int i = 0; i < n; ++i) {
    ASSERT_GE(u[i], 0.0f);
    ASSERT_LT(u[i], 1.0f);
    ASSERT_TRUE(std::isfinite(z[i]));
    mu += u[i];
    mz += z[i];
  }
  mu /= n;
  mz /= n;
  for (float v : z) vz += (v - mz) * (v - mz);
  vz /= n;
  EXPECT_NEAR(mu, 0.5, 0.005);
  EXPECT_NEAR(mz, 0.0, 0.01);
  EXPECT_NEAR(vz, 1.0, 0.02);
  const std::vector<float> r = uniform({1000}, -2.0, 3.0, {}, &g).to_vector<float>();
  EXPECT_GE(*std::min_element(r.begin(), r.end()), -2.0f);
  EXPECT_LT(*std::max_element(r.begin(), r.end()), 3.0f);
}

TEST(RandomTest, RandpermIsASeededPermutation) {
  Generator g(5), h(5);
  std::vector<int64_t> p = randperm(1000, &g).to_vector<int64_t>();
  EXPECT_EQ(p, randperm(1000, &h).to_vector<int64_t>());
  EXPECT_NE(p, randperm(1000, &g).to_vector<int64_t>());
  std::vector<int64_t> sorted = p;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(sorted[i], i);
  int fixed_points = 0;
  for (int64_t i = 0; i < 1000; ++i) fixed_points += p[i] == i;
  EXPECT_LT(fixed_points, 10);
  EXPECT_EQ(randperm(0).numel(), 0);
}

}  // namespace
}  // namespace tandem
