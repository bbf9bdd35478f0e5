// Joining tensors along a dimension: cat and stack.
#include <cstdint>
#include <vector>

#include "tensor/base/error.h"
#include "tensor/core/autograd.h"
#include "tensor/core/internal/tensor_impl.h"
#include "tensor/core/tensor.h"
#include "tensor/ops/autocast.h"
#include "tensor/ops/internal/op_helpers.h"
#include "tensor/ops/ops.h"
#include "tensor/runtime/backend.h"

namespace tandem {

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  TANDEM_AUTOCAST(kPromote, cat, tensors, dim);
  TANDEM_CHECK(!tensors.empty(), "cat: expected at least one tensor but got an empty list");
  for (size_t i = 0; i < tensors.size(); ++i) {
    TANDEM_CHECK(tensors[i].defined(), "cat: tensor ", i, " is an undefined Tensor");
  }
  const Tensor& first = tensors[0];
  TANDEM_CHECK(first.dim() > 0, "cat: tensor 0 is zero-dimensional and has no dimension to ",
               "join along; use stack, or unsqueeze(0) each tensor first");
  const int64_t d = WrapDim(dim, first.dim(), "cat");
  Shape shape = first.shape();
  shape[d] = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    TANDEM_CHECK(t.device() == first.device(), "cat: tensor ", i, " is on ", t.device(),
                 " but tensor 0 is on ", first.device(), "; move them to one device with .to()");
    bool same = t.dim() == first.dim();
    for (int64_t k = 0; same && k < t.dim(); ++k) {
      same = k == d || t.shape()[k] == first.shape()[k];
    }
    TANDEM_CHECK(same, "cat: tensor ", i, " is ", ShapeToString(t.shape()), " but tensor 0 is ",
                 ShapeToString(first.shape()), "; all sizes except dimension ", d, " must match");
    shape[d] += t.shape()[d];
  }
  // Mixed dtypes promote as binary ops do (PyTorch's cat); Copy converts into the slots.
  DType dtype = first.dtype();
  for (const Tensor& t : tensors) dtype = PromoteTypes(dtype, t.dtype());
  Tensor out = NewTensor(shape, dtype, first.device());
  std::vector<int64_t> starts;
  int64_t start = 0;
  for (const Tensor& t : tensors) {
    starts.push_back(start);
    if (t.numel() > 0) {
      const Tensor slot =
          MakeView(out, t.shape(), out.strides(), out.storage_offset() + start * out.strides()[d]);
      BackendOf(out).Copy(IndexOf(out), ToKernel(slot), ToKernel(t));
    }
    start += t.shape()[d];
  }
  if (NeedsGrad(tensors)) {
    std::vector<bool> needed;
    std::vector<Shape> shapes;
    std::vector<DType> dtypes;
    for (const Tensor& t : tensors) {
      needed.push_back(NeedsGrad({t}));
      shapes.push_back(t.shape());
      dtypes.push_back(t.dtype());
    }
    Record(
        "CatBackward", tensors, out,
        [d, needed, shapes, dtypes, starts](const Tensor& grad) {
          std::vector<Tensor> grads(shapes.size());
          for (size_t i = 0; i < shapes.size(); ++i) {
            if (!needed[i]) continue;
            if (CreatingGraph()) {  // the same slice, recorded
              grads[i] = grad.narrow(d, starts[i], shapes[i][d]).to(dtypes[i]);
              continue;
            }
            // A view of the gradient's slice (the engine copies before it accumulates), in the
            // input's own dtype when cat promoted it.
            grads[i] = CastRaw(MakeView(grad, shapes[i], grad.strides(),
                                        grad.storage_offset() + starts[i] * grad.strides()[d]),
                               dtypes[i]);
          }
          return grads;
        },
        DoubleBackward::kSupported);
  }
  return out;
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  TANDEM_CHECK(!tensors.empty(), "stack: expected at least one tensor but got an empty list");
  for (size_t i = 0; i < tensors.size(); ++i) {
    TANDEM_CHECK(tensors[i].defined(), "stack: tensor ", i, " is an undefined Tensor");
    TANDEM_CHECK(tensors[i].shape() == tensors[0].shape(), "stack: tensor ", i, " is ",
                 ShapeToString(tensors[i].shape()), " but tensor 0 is ",
                 ShapeToString(tensors[0].shape()), "; all tensors must have the same shape");
  }
  const int64_t d = WrapDim(dim, tensors[0].dim() + 1, "stack");
  std::vector<Tensor> unsqueezed;
  unsqueezed.reserve(tensors.size());
  for (const Tensor& t : tensors) unsqueezed.push_back(t.unsqueeze(d));
  return cat(unsqueezed, d);
}

}  // namespace tandem
