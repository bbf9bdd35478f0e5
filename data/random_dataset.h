// RandomDataset: `length` rows of `size` standard-normal float32 values, the dataset of
// PyTorch's DataParallel tutorial. Row i holds the Philox normals at counters
// i * size ... i * size + size - 1 of `seed`, i.e. row i of
// randn({length, size}, {}, &Generator(seed)); it is computed on demand, so a row is the
// same however and in whatever order the dataset is loaded, and no memory is held.
//
//   tandem::data::RandomDataset dataset(/*size=*/5, /*length=*/100, /*seed=*/0);
//   tandem::Tensor row = dataset.get(7)[0];   // float32 [5]
#ifndef TANDEM_DATA_RANDOM_DATASET_H_
#define TANDEM_DATA_RANDOM_DATASET_H_

#include <cstdint>
#include <vector>

#include "data/dataset.h"

namespace tandem {
namespace data {

class RandomDataset : public Dataset {
 public:
  RandomDataset(int64_t size, int64_t length, uint64_t seed = 0);

  int64_t size() const override { return length_; }
  // One field: row `index`, float32 [row_size()].
  Example get(int64_t index) const override;
  // Fills the batch tensor directly, without per-row tensors.
  Batch get_batch(const std::vector<int64_t>& indices, bool pinned = false) const override;

  int64_t row_size() const { return row_size_; }
  uint64_t seed() const { return seed_; }

 private:
  void FillRow(int64_t index, float* out) const;

  int64_t row_size_;
  int64_t length_;
  uint64_t seed_;
};

}  // namespace data
}  // namespace tandem

#endif  // TANDEM_DATA_RANDOM_DATASET_H_
