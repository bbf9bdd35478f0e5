// DistributedSampler: each rank of a distributed job (parallel/distributed) visits its own
// share of a dataset each epoch, as torch.utils.data.distributed.DistributedSampler does.
// The shares are disjoint and of equal length: without drop_last the index list is padded by
// wrapping around to a multiple of world_size (so a few samples are seen twice an epoch); with
// drop_last the tail that does not divide evenly is dropped. With shuffle, every rank draws the
// same permutation of (seed, epoch) and takes every world_size-th index from its rank on, so
// the ranks need not talk to each other. Give it to a DataLoader (without shuffle there):
//
//   auto sampler = std::make_unique<data::DistributedSampler>(
//       dataset->size(), group->rank(), group->size(), /*shuffle=*/true, /*seed=*/1);
//   data::DistributedSampler* shares = sampler.get();
//   data::DataLoader loader(dataset, std::move(sampler), DataLoaderOptions().batch_size(64));
//   for (int epoch = 0; epoch < epochs; ++epoch) {
//     shares->set_epoch(epoch);        // as in PyTorch (optional here: see NextEpoch)
//     for (data::Batch& batch : loader) ...
//   }
//
// One difference from PyTorch: NextEpoch() (what each DataLoader epoch calls) advances the
// epoch, as RandomSampler does, so a loop that forgets set_epoch still reshuffles; calling
// set_epoch(epoch) before each epoch gives PyTorch's order exactly as it would.
#ifndef TANDEM_DATA_DISTRIBUTED_SAMPLER_H_
#define TANDEM_DATA_DISTRIBUTED_SAMPLER_H_

#include <cstdint>
#include <vector>

#include "data/sampler.h"

namespace tandem {
namespace data {

class DistributedSampler : public Sampler {
 public:
  // Throws unless world_size >= 1, 0 <= rank < world_size and dataset_size >= 0.
  // even = false: every index once an epoch, the ranks' shares differing by one at most (no
  // padding, no dropping: for uneven inputs under parallel/distributed/join.h); not with
  // drop_last.
  DistributedSampler(int64_t dataset_size, int rank, int world_size, bool shuffle = true,
                     uint64_t seed = 0, bool drop_last = false, bool even = true);

  // This rank's indices per epoch: ceil(dataset_size / world_size), or with drop_last
  // floor(dataset_size / world_size); not even: the positions rank, rank + world_size, ...
  int64_t size() const override { return num_samples_; }
  // Indices(epoch()), then advances to the next epoch.
  std::vector<int64_t> NextEpoch() override;

  // This rank's indices in a given epoch, without changing the sampler's state.
  std::vector<int64_t> Indices(int64_t epoch) const;
  // The epoch the next NextEpoch() returns; every rank must set the same one.
  int64_t epoch() const { return epoch_; }
  void set_epoch(int64_t epoch);

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  // Indices over all ranks per epoch: size() * world_size() (dataset_size when not even).
  int64_t total_size() const { return even_ ? num_samples_ * world_size_ : dataset_size_; }
  bool even() const { return even_; }

 private:
  int64_t dataset_size_;
  int rank_;
  int world_size_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
  bool even_;
  int64_t num_samples_;
  int64_t epoch_ = 0;
};

}  // namespace data
}  // namespace tandem

#endif  // TANDEM_DATA_DISTRIBUTED_SAMPLER_H_
