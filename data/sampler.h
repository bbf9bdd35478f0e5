// Samplers: the order in which a DataLoader visits a dataset's indices, one epoch at a
// time. SequentialSampler gives 0, 1, ..., n-1 every epoch; RandomSampler gives a new
// random permutation each epoch, a pure function of (seed, epoch), so the same seed
// always gives the same sequence of epochs on every machine.
//
//   tandem::data::RandomSampler sampler(/*size=*/5, /*seed=*/42);
//   std::vector<int64_t> first = sampler.NextEpoch();   // e.g. {3, 0, 4, 1, 2}
//   std::vector<int64_t> second = sampler.NextEpoch();  // another permutation
//   assert(first == sampler.Permutation(0));
#ifndef TANDEM_DATA_SAMPLER_H_
#define TANDEM_DATA_SAMPLER_H_

#include <cstdint>
#include <vector>

namespace tandem {
namespace data {

class Sampler {
 public:
  virtual ~Sampler() = default;
  // Number of indices in each epoch.
  virtual int64_t size() const = 0;
  // The indices of the next epoch, in order; each call starts a new epoch.
  virtual std::vector<int64_t> NextEpoch() = 0;
};

// 0, 1, ..., size-1 every epoch.
class SequentialSampler : public Sampler {
 public:
  explicit SequentialSampler(int64_t size);
  int64_t size() const override { return size_; }
  std::vector<int64_t> NextEpoch() override;

 private:
  int64_t size_;
};

// A uniformly random permutation of 0..size-1 per epoch (Fisher-Yates driven by Philox).
class RandomSampler : public Sampler {
 public:
  RandomSampler(int64_t size, uint64_t seed);
  int64_t size() const override { return size_; }
  // Permutation(epoch()), then advances to the next epoch.
  std::vector<int64_t> NextEpoch() override;

  // The permutation of a given epoch, without changing the sampler's state.
  std::vector<int64_t> Permutation(int64_t epoch) const;
  uint64_t seed() const { return seed_; }
  // The epoch that the next NextEpoch() returns; set it to resume a run part-way.
  int64_t epoch() const { return epoch_; }
  void set_epoch(int64_t epoch);

 private:
  int64_t size_;
  uint64_t seed_;
  int64_t epoch_ = 0;
};

}  // namespace data
}  // namespace tandem

#endif  // TANDEM_DATA_SAMPLER_H_
