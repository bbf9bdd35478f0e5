#include "data/distributed_sampler.h"

#include <numeric>

#include "tensor/base/error.h"

namespace tandem {
namespace data {

DistributedSampler::DistributedSampler(int64_t dataset_size, int rank, int world_size, bool shuffle,
                                       uint64_t seed, bool drop_last, bool even)
    : dataset_size_(dataset_size),
      rank_(rank),
      world_size_(world_size),
      shuffle_(shuffle),
      seed_(seed),
      drop_last_(drop_last),
      even_(even) {
  TANDEM_CHECK(world_size >= 1, "DistributedSampler: world_size must be >= 1 but is ", world_size);
  TANDEM_CHECK(rank >= 0 && rank < world_size, "DistributedSampler: rank must be in [0, ",
               world_size, ") (world_size) but is ", rank);
  TANDEM_CHECK(dataset_size >= 0, "DistributedSampler: dataset_size must be >= 0 but is ",
               dataset_size);
  TANDEM_CHECK(even || !drop_last,
               "DistributedSampler: drop_last drops the tail to give every rank the same number, "
               "which even = false does not ask for; pass one of them");
  // PyTorch: drop the tail so that every rank gets the same number, or pad up to it; not even:
  // the positions rank, rank + world_size, ... below dataset_size.
  num_samples_ = !even       ? (dataset_size - rank + world_size - 1) / world_size
                 : drop_last ? dataset_size / world_size
                             : (dataset_size + world_size - 1) / world_size;
}

std::vector<int64_t> DistributedSampler::NextEpoch() { return Indices(epoch_++); }

void DistributedSampler::set_epoch(int64_t epoch) {
  TANDEM_CHECK(epoch >= 0, "DistributedSampler: epoch must be >= 0 but is ", epoch);
  epoch_ = epoch;
}

std::vector<int64_t> DistributedSampler::Indices(int64_t epoch) const {
  TANDEM_CHECK(epoch >= 0, "DistributedSampler: epoch must be >= 0 but is ", epoch);
  std::vector<int64_t> order;
  if (shuffle_) {
    order = RandomSampler(dataset_size_, seed_).Permutation(epoch);
  } else {
    order.resize(static_cast<size_t>(dataset_size_));
    std::iota(order.begin(), order.end(), int64_t{0});
  }
  const int64_t total = total_size();
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(num_samples_));
  // Position k of the padded list is order[k % dataset_size] (wrapping around as often as
  // needed); with drop_last, total <= dataset_size and nothing wraps.
  for (int64_t k = rank_; k < total; k += world_size_) {
    mine.push_back(order[static_cast<size_t>(k % dataset_size_)]);
  }
  return mine;
}

}  // namespace data
}  // namespace tandem
