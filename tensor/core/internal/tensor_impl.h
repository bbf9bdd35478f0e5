// The implementation behind a Tensor handle and the helpers that ops and backends use to
// build tensors. Internal to Tandem's tensor library and its extensions (tensor/cuda,
// parallel/comm); users include tensor/tensor.h.
#ifndef TANDEM_TENSOR_CORE_INTERNAL_TENSOR_IMPL_H_
#define TANDEM_TENSOR_CORE_INTERNAL_TENSOR_IMPL_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "tensor/core/tensor.h"
#include "tensor/runtime/backend.h"

namespace tandem {

struct Storage {
  std::shared_ptr<void> data;
  size_t bytes = 0;
  // An alias of another storage's memory (alias_on_cpu_device): the first in-place write
  // through it copies the memory first (Note [Copy-on-write aliases], tensor.cc).
  bool copy_on_write = false;
  Device device;
  bool pinned = false;
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  int64_t offset = 0;  // in elements
  Shape shape;
  std::vector<int64_t> strides;
  DType dtype = kFloat32;

  // Autograd state.
  bool requires_grad = false;
  std::shared_ptr<Node> grad_fn;
  uint32_t output_nr = 0;  // which of grad_fn's outputs this tensor is
  std::mutex grad_mutex;   // guards grad, grad_accumulator and grad_hooks
  Tensor grad;
  std::weak_ptr<Node> grad_accumulator;
  std::vector<std::function<void(const Tensor&)>> grad_hooks;

  Device device() const { return storage->device; }
  void* data() const {
    return static_cast<char*>(storage->data.get()) +
           offset * static_cast<int64_t>(ElementSize(dtype));
  }
};

std::vector<int64_t> ContiguousStrides(const Shape& shape);

// A new, uninitialised, contiguous tensor.
Tensor NewTensor(const Shape& shape, DType dtype, Device device, bool pinned = false);
// A view of `base`'s storage with other geometry; no autograd recorded.
Tensor MakeView(const Tensor& base, const Shape& shape, const std::vector<int64_t>& strides,
                int64_t offset);
// The kernel-facing description of a tensor (throws beyond kMaxDims dimensions).
KernelTensor ToKernel(const Tensor& tensor);
// `tensor` viewed with `shape`'s rank and broadcast to it (strides 0), for kernels.
KernelTensor ToKernelBroadcast(const Tensor& tensor, const Shape& shape);
// The broadcast shape of two shapes, or a clear error naming the op.
Shape BroadcastShapes(const Shape& a, const Shape& b, const char* op);

}  // namespace tandem

#endif  // TANDEM_TENSOR_CORE_INTERNAL_TENSOR_IMPL_H_
