#include "data/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <vector>

#include "tensor/base/error.h"

namespace tandem {
namespace data {
namespace {

std::vector<int64_t> Iota(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), int64_t{0});
  return v;
}

TEST(SequentialSamplerTest, GivesIndicesInOrderEveryEpoch) {
  SequentialSampler sampler(7);
  EXPECT_EQ(sampler.size(), 7);
  EXPECT_EQ(sampler.NextEpoch(), Iota(7));
  EXPECT_EQ(sampler.NextEpoch(), Iota(7));
  EXPECT_TRUE(SequentialSampler(0).NextEpoch().empty());
}

TEST(SequentialSamplerTest, RejectsNegativeSize) { EXPECT_THROW(SequentialSampler(-1), Error); }

TEST(RandomSamplerTest, EachEpochIsAPermutation) {
  for (const int64_t n : {0, 1, 2, 3, 100, 1001}) {
    RandomSampler sampler(n, /*seed=*/5);
    for (int epoch = 0; epoch < 3; ++epoch) {
      std::vector<int64_t> order = sampler.NextEpoch();
      ASSERT_EQ(static_cast<int64_t>(order.size()), n);
      std::sort(order.begin(), order.end());
      EXPECT_EQ(order, Iota(n)) << "n = " << n << ", epoch " << epoch;
    }
  }
}

TEST(RandomSamplerTest, NewPermutationEachEpoch) {
  RandomSampler sampler(100, /*seed=*/1);
  std::set<std::vector<int64_t>> seen;
  for (int epoch = 0; epoch < 10; ++epoch) seen.insert(sampler.NextEpoch());
  EXPECT_EQ(seen.size(), 10u);
  EXPECT_EQ(seen.count(Iota(100)), 0u);
}

TEST(RandomSamplerTest, SameSeedSameSequenceOtherSeedOther) {
  RandomSampler a(50, 42), b(50, 42), c(50, 43);
  for (int epoch = 0; epoch < 4; ++epoch) {
    const std::vector<int64_t> from_a = a.NextEpoch();
    EXPECT_EQ(from_a, b.NextEpoch());
    EXPECT_NE(from_a, c.NextEpoch());
  }
}

TEST(RandomSamplerTest, PermutationIsAPureFunctionOfSeedAndEpoch) {
  RandomSampler sampler(30, 9);
  const std::vector<int64_t> epoch0 = sampler.NextEpoch();
  const std::vector<int64_t> epoch1 = sampler.NextEpoch();
  EXPECT_EQ(sampler.epoch(), 2);
  EXPECT_EQ(sampler.Permutation(0), epoch0);
  EXPECT_EQ(sampler.Permutation(1), epoch1);
  sampler.set_epoch(1);  // resume part-way
  EXPECT_EQ(sampler.NextEpoch(), epoch1);
  EXPECT_THROW(sampler.set_epoch(-1), Error);
  EXPECT_THROW(RandomSampler(-3, 0), Error);
}

// All 24 orders of 4 items must be about equally likely. The seed is fixed, so this is
// deterministic; a biased shuffle (Sattolo's off-by-one, modulo bias on tiny ranges, a
// shuffle that never leaves an item in place) gives a chi-square far above the bound.
TEST(RandomSamplerTest, PermutationsAreUniform) {
  constexpr int kEpochs = 24000;
  RandomSampler sampler(4, 2024);
  std::map<std::vector<int64_t>, int> counts;
  for (int e = 0; e < kEpochs; ++e) ++counts[sampler.NextEpoch()];
  ASSERT_EQ(counts.size(), 24u);
  const double expected = kEpochs / 24.0;
  double chi_square = 0;
  for (const auto& entry : counts) {
    chi_square += (entry.second - expected) * (entry.second - expected) / expected;
  }
  // 23 degrees of freedom: P(chi^2 > 49.7) = 0.001 for a uniform shuffle.
  EXPECT_LT(chi_square, 49.7);
}

// Where item 0 lands must be uniform over the positions too (checks a larger n, where
// the Philox draws of one block are split across two positions).
TEST(RandomSamplerTest, PositionsAreUniform) {
  constexpr int kN = 10;
  constexpr int kEpochs = 20000;
  RandomSampler sampler(kN, 77);
  std::vector<int> position_of_first(kN, 0);
  for (int e = 0; e < kEpochs; ++e) {
    const std::vector<int64_t> order = sampler.NextEpoch();
    ++position_of_first[std::find(order.begin(), order.end(), 0) - order.begin()];
  }
  const double expected = static_cast<double>(kEpochs) / kN;
  double chi_square = 0;
  for (const int count : position_of_first) {
    chi_square += (count - expected) * (count - expected) / expected;
  }
  // 9 degrees of freedom: P(chi^2 > 27.9) = 0.001.
  EXPECT_LT(chi_square, 27.9);
}

}  // namespace
}  // namespace data
}  // namespace tandem
