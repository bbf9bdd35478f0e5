#include "data/tensor_dataset.h"

#include <cstring>

namespace tandem {
namespace data {

TensorDataset::TensorDataset(std::vector<Tensor> tensors) {
  TANDEM_CHECK(!tensors.empty(), "TensorDataset needs at least one tensor but got none");
  for (size_t t = 0; t < tensors.size(); ++t) {
    TANDEM_CHECK(tensors[t].defined(), "TensorDataset: tensor ", t, " is undefined");
    TANDEM_CHECK(tensors[t].dim() >= 1, "TensorDataset: tensor ", t,
                 " must have at least one dimension (its rows are the examples) but is a "
                 "0-dimensional scalar; reshape it to [1] or [N]");
    TANDEM_CHECK(tensors[t].size(0) == tensors[0].size(0),
                 "TensorDataset: all tensors must have the same size in dimension 0, but tensor "
                 "0 is ",
                 ShapeToString(tensors[0].shape()), " and tensor ", t, " is ",
                 ShapeToString(tensors[t].shape()));
  }
  size_ = tensors[0].size(0);
  tensors_.reserve(tensors.size());
  for (const Tensor& t : tensors) tensors_.push_back(t.detach().contiguous());
}

Example TensorDataset::get(int64_t index) const {
  CheckIndex(index, "TensorDataset::get");
  Example example;
  example.reserve(tensors_.size());
  for (const Tensor& t : tensors_) example.push_back(t.select(0, index));
  return example;
}

Batch TensorDataset::get_batch(const std::vector<int64_t>& indices, bool pinned) const {
  for (const Tensor& t : tensors_) {
    if (!t.device().is_cpu()) return Dataset::get_batch(indices, pinned);
  }
  TANDEM_CHECK(!indices.empty(), "TensorDataset::get_batch needs at least one index but got none");
  for (const int64_t index : indices) CheckIndex(index, "TensorDataset::get_batch");
  const auto batch_size = static_cast<int64_t>(indices.size());
  Batch batch;
  batch.indices = indices;
  batch.fields.reserve(tensors_.size());
  for (const Tensor& t : tensors_) {
    Shape shape = t.shape();
    shape[0] = batch_size;
    Tensor out = empty(shape, TensorOptions().dtype(t.dtype()).pinned(pinned));
    const size_t row_bytes = static_cast<size_t>(t.numel() / t.size(0)) * ElementSize(t.dtype());
    if (row_bytes > 0) {
      const char* src = static_cast<const char*>(t.raw_data());
      char* dst = static_cast<char*>(out.raw_data());
      for (int64_t b = 0; b < batch_size; ++b) {
        std::memcpy(dst + b * row_bytes, src + indices[b] * row_bytes, row_bytes);
      }
    }
    batch.fields.push_back(std::move(out));
  }
  return batch;
}

}  // namespace data
}  // namespace tandem
