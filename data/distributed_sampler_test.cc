#include "data/distributed_sampler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <vector>

#include "data/dataloader.h"
#include "data/sampler.h"
#include "data/tensor_dataset.h"
#include "tensor/tensor.h"

namespace tandem::data {
namespace {

using ::testing::HasSubstr;

// Every rank's indices of one epoch, rank 0's first.
std::vector<std::vector<int64_t>> Shares(int64_t n, int world, bool shuffle, bool drop_last,
                                         int64_t epoch, uint64_t seed = 7) {
  std::vector<std::vector<int64_t>> shares;
  for (int r = 0; r < world; ++r) {
    shares.push_back(DistributedSampler(n, r, world, shuffle, seed, drop_last).Indices(epoch));
  }
  return shares;
}

// How often each index occurs over all shares.
std::map<int64_t, int> Counts(const std::vector<std::vector<int64_t>>& shares) {
  std::map<int64_t, int> counts;
  for (const auto& share : shares) {
    for (int64_t i : share) ++counts[i];
  }
  return counts;
}

TEST(DistributedSamplerTest, SharesAreDisjointCoveringAndEqualWhenTheSizeDivides) {
  for (bool shuffle : {false, true}) {
    for (bool drop_last : {false, true}) {
      for (auto [n, world] : std::vector<std::pair<int64_t, int>>{{12, 3}, {10, 2}, {7, 1}}) {
        auto shares = Shares(n, world, shuffle, drop_last, /*epoch=*/0);
        std::map<int64_t, int> counts = Counts(shares);
        ASSERT_EQ(static_cast<int64_t>(counts.size()), n);
        for (auto [index, count] : counts) {
          EXPECT_TRUE(index >= 0 && index < n && count == 1) << index << " x" << count;
        }
        for (const auto& share : shares) EXPECT_EQ(static_cast<int64_t>(share.size()), n / world);
      }
    }
  }
}

TEST(DistributedSamplerTest, WithoutDropLastPadsByWrappingAround) {
  for (bool shuffle : {false, true}) {
    for (auto [n, world] : std::vector<std::pair<int64_t, int>>{{10, 3}, {5, 2}, {2, 3}, {1, 4}}) {
      const int64_t per_rank = (n + world - 1) / world;
      DistributedSampler rank0(n, 0, world, shuffle, 7);
      EXPECT_EQ(rank0.size(), per_rank);
      EXPECT_EQ(rank0.total_size(), per_rank * world);
      auto shares = Shares(n, world, shuffle, false, 3);
      // Interleaving the shares back gives the epoch's order followed by its own beginning.
      std::vector<int64_t> order =
          shuffle ? RandomSampler(n, 7).Permutation(3) : SequentialSampler(n).NextEpoch();
      for (int64_t k = 0; k < per_rank * world; ++k) {
        ASSERT_EQ(static_cast<int64_t>(shares[k % world].size()), per_rank);
        EXPECT_EQ(shares[k % world][k / world], order[k % n]) << "n " << n << " position " << k;
      }
      // Every index at least once, none more often than the padding allows.
      std::map<int64_t, int> counts = Counts(shares);
      EXPECT_EQ(static_cast<int64_t>(counts.size()), n);
    }
  }
  // PyTorch's example: 5 samples on 2 ranks without shuffling.
  EXPECT_EQ(DistributedSampler(5, 0, 2, false).Indices(0), (std::vector<int64_t>{0, 2, 4}));
  EXPECT_EQ(DistributedSampler(5, 1, 2, false).Indices(0), (std::vector<int64_t>{1, 3, 0}));
}

TEST(DistributedSamplerTest, DropLastDropsTheTailThatDoesNotDivide) {
  for (bool shuffle : {false, true}) {
    auto shares = Shares(10, 3, shuffle, /*drop_last=*/true, 1);
    std::map<int64_t, int> counts = Counts(shares);
    EXPECT_EQ(counts.size(), 9u);  // 3 each, all distinct
    for (auto [index, count] : counts) EXPECT_EQ(count, 1) << index;
    for (const auto& share : shares) EXPECT_EQ(share.size(), 3u);
  }
  EXPECT_EQ(DistributedSampler(2, 1, 3, true, 0, true).size(), 0);
  EXPECT_TRUE(DistributedSampler(2, 1, 3, true, 0, true).Indices(0).empty());
  EXPECT_TRUE(DistributedSampler(0, 1, 3).NextEpoch().empty());
}

TEST(DistributedSamplerTest, NotEvenSharesEveryIndexOnceWithSharesDifferingByOne) {
  // 10 over 3 ranks: 4, 3, 3, every index once, nothing padded or dropped.
  std::vector<int64_t> all;
  for (int rank = 0; rank < 3; ++rank) {
    DistributedSampler sampler(10, rank, 3, /*shuffle=*/true, /*seed=*/4, /*drop_last=*/false,
                               /*even=*/false);
    EXPECT_EQ(sampler.size(), rank == 0 ? 4 : 3);
    EXPECT_EQ(sampler.total_size(), 10);
    const std::vector<int64_t> mine = sampler.Indices(1);
    EXPECT_EQ(static_cast<int64_t>(mine.size()), sampler.size());
    all.insert(all.end(), mine.begin(), mine.end());
  }
  std::sort(all.begin(), all.end());
  std::vector<int64_t> every(10);
  std::iota(every.begin(), every.end(), int64_t{0});
  EXPECT_EQ(all, every);
  EXPECT_EQ(DistributedSampler(1, 1, 2, true, 0, false, false).size(), 0);
  try {
    DistributedSampler(10, 0, 3, true, 0, true, false);
    ADD_FAILURE() << "drop_last with even = false was taken";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("drop_last drops the tail"));
  }
}

TEST(DistributedSamplerTest, SetEpochReshufflesTheSameWayOnEveryRank) {
  const int64_t n = 100;
  const int world = 3;
  auto epoch0 = Shares(n, world, true, false, 0);
  auto epoch1 = Shares(n, world, true, false, 1);
  EXPECT_NE(epoch0, epoch1);
  EXPECT_EQ(Shares(n, world, true, false, 1), epoch1);  // a pure function of (seed, epoch)
  EXPECT_NE(Shares(n, world, true, false, 1, /*seed=*/8), epoch1);
  // Ranks made separately, each set to epoch 1, still take disjoint parts of one permutation.
  std::vector<std::vector<int64_t>> separately;
  for (int r = 0; r < world; ++r) {
    DistributedSampler sampler(n, r, world, true, 7);
    sampler.set_epoch(1);
    EXPECT_EQ(sampler.epoch(), 1);
    separately.push_back(sampler.NextEpoch());
    EXPECT_EQ(sampler.epoch(), 2);  // NextEpoch advances, as RandomSampler does
    EXPECT_EQ(sampler.NextEpoch(), sampler.Indices(2));
  }
  EXPECT_EQ(separately, epoch1);
  EXPECT_EQ(Counts(separately).size(), static_cast<size_t>(n));
  // Without shuffle every epoch is the same.
  EXPECT_EQ(Shares(n, world, false, false, 0), Shares(n, world, false, false, 5));
}

TEST(DistributedSamplerTest, WorksWithTheDataLoader) {
  const int64_t n = 11;
  std::vector<int64_t> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[i] = 100 + i;
  Tensor values = from_vector(ids, {n});
  for (int rank = 0; rank < 2; ++rank) {
    auto sampler = std::make_unique<DistributedSampler>(n, rank, 2, true, 3);
    DistributedSampler* shares = sampler.get();
    DataLoader loader(TensorDataset({values}), std::move(sampler),
                      DataLoaderOptions().batch_size(4));
    EXPECT_EQ(loader.size(), 2);  // 6 samples per rank
    for (int64_t epoch : {4, 9}) {
      shares->set_epoch(epoch);
      std::vector<int64_t> expected = shares->Indices(epoch);
      std::vector<int64_t> seen;
      for (Batch& batch : loader) {
        for (int64_t v : batch.data().to_vector<int64_t>()) seen.push_back(v - 100);
      }
      EXPECT_EQ(seen, expected) << "rank " << rank << " epoch " << epoch;
    }
  }
}

TEST(DistributedSamplerTest, BadArgumentsAreClearErrors) {
  try {
    DistributedSampler(10, 3, 3);
    FAIL() << "rank 3 of 3 was accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("rank must be in [0, 3) (world_size) but is 3"));
  }
  EXPECT_THROW(DistributedSampler(10, 0, 0), Error);
  EXPECT_THROW(DistributedSampler(10, -1, 2), Error);
  EXPECT_THROW(DistributedSampler(-1, 0, 2), Error);
  DistributedSampler sampler(10, 0, 2);
  EXPECT_THROW(sampler.set_epoch(-1), Error);
  EXPECT_THROW(sampler.Indices(-2), Error);
}

}  // namespace
}  // namespace tandem::data
