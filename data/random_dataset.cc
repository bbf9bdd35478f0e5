#include "data/random_dataset.h"

#include <limits>

#include "tensor/base/philox.h"

namespace tandem {
namespace data {

RandomDataset::RandomDataset(int64_t size, int64_t length, uint64_t seed)
    : row_size_(size), length_(length), seed_(seed) {
  TANDEM_CHECK(size > 0, "RandomDataset: size (values per row) must be positive but is ", size);
  TANDEM_CHECK(length >= 0, "RandomDataset: length (rows) must be >= 0 but is ", length);
  TANDEM_CHECK(length == 0 || size <= std::numeric_limits<int64_t>::max() / length,
               "RandomDataset: ", length, " rows of ", size,
               " values overflow the 64-bit counter space");
}

void RandomDataset::FillRow(int64_t index, float* out) const {
  const uint64_t first = static_cast<uint64_t>(index) * static_cast<uint64_t>(row_size_);
  for (int64_t j = 0; j < row_size_; ++j) {
    out[j] = philox::Normal(seed_, first + static_cast<uint64_t>(j));
  }
}

Example RandomDataset::get(int64_t index) const {
  CheckIndex(index, "RandomDataset::get");
  Tensor row = empty({row_size_});
  FillRow(index, row.data<float>());
  return {row};
}

Batch RandomDataset::get_batch(const std::vector<int64_t>& indices, bool pinned) const {
  TANDEM_CHECK(!indices.empty(), "RandomDataset::get_batch needs at least one index but got none");
  for (const int64_t index : indices) CheckIndex(index, "RandomDataset::get_batch");
  const auto batch_size = static_cast<int64_t>(indices.size());
  Tensor rows = empty({batch_size, row_size_}, TensorOptions().pinned(pinned));
  float* out = rows.data<float>();
  for (int64_t b = 0; b < batch_size; ++b) FillRow(indices[b], out + b * row_size_);
  Batch batch;
  batch.fields = {rows};
  batch.indices = indices;
  return batch;
}

}  // namespace data
}  // namespace tandem
