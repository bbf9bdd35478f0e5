// TensorDataset: a dataset whose example i is row i of each of one or more tensors that
// share their first dimension, as torch.utils.data.TensorDataset. The tensors are held
// (detached from autograd, made contiguous) and rows are views of them.
//
//   tandem::Tensor x = tandem::randn({100, 3});
//   tandem::Tensor y = tandem::arange(100);   // int64
//   tandem::data::TensorDataset dataset({x, y});
//   tandem::data::Example e = dataset.get(4);   // {x[4] float32 [3], y[4] int64 []}
#ifndef TANDEM_DATA_TENSOR_DATASET_H_
#define TANDEM_DATA_TENSOR_DATASET_H_

#include <cstdint>
#include <vector>

#include "data/dataset.h"

namespace tandem {
namespace data {

class TensorDataset : public Dataset {
 public:
  // Throws unless there is at least one tensor, each has at least one dimension and all
  // have the same size in dimension 0.
  explicit TensorDataset(std::vector<Tensor> tensors);

  int64_t size() const override { return size_; }
  // Row `index` of each tensor (views sharing storage with the tensors).
  Example get(int64_t index) const override;
  // Copies the rows of CPU tensors straight into the batch.
  Batch get_batch(const std::vector<int64_t>& indices, bool pinned = false) const override;

  const std::vector<Tensor>& tensors() const { return tensors_; }

 private:
  std::vector<Tensor> tensors_;
  int64_t size_ = 0;
};

}  // namespace data
}  // namespace tandem

#endif  // TANDEM_DATA_TENSOR_DATASET_H_
