// Joining tensors along a dimension, cat and stack, and split_heads, a join's adjoint.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
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

namespace {

// split_heads's node: one output per part, one input (the packed tensor).
class SplitHeadsBackward final : public Node {
 public:
  SplitHeadsBackward(Device device, Shape packed_shape, DType dtype, int64_t parts, int64_t n_head)
      : Node(device, std::vector<Device>(static_cast<size_t>(parts), device)),
        packed_shape_(std::move(packed_shape)),
        dtype_(dtype),
        parts_(parts),
        n_head_(n_head) {}

  std::vector<Tensor> Apply(std::vector<Tensor> grads) override {
    const int64_t b = packed_shape_[0], t = packed_shape_[1];
    const int64_t d = packed_shape_[2] / (parts_ * n_head_);
    const TensorOptions options = TensorOptions(dtype_).device(device());
    if (CreatingGraph()) {
      // With differentiable ops: the parts stacked [parts, B, H, T, D], then packed back.
      std::vector<Tensor> full;
      for (const Tensor& g : grads) {
        full.push_back(g.defined() ? g : zeros({b, n_head_, t, d}, options));
      }
      return {stack(full, 0).permute({1, 3, 0, 2, 4}).reshape(packed_shape_)};
    }
    NoGradGuard no_grad;
    if (Tensor packed = PackedBlock(grads); packed.defined()) return {packed};
    Tensor packed = empty(packed_shape_, options);
    const Tensor parts = packed.view({b, t, parts_, n_head_, d});
    for (int64_t i = 0; i < parts_; ++i) {
      Tensor slot = parts.select(2, i).transpose(1, 2);  // [B, H, T, D], strided
      if (grads[i].defined()) {
        slot.copy_(grads[i]);
      } else {
        slot.zero_();
      }
    }
    return {packed};
  }
  std::string name() const override { return "SplitHeadsBackward"; }
  bool SupportsDoubleBackward() const override { return true; }

 private:
  // The packed gradient itself when the parts' gradients are views of one block laid out as
  // `packed` is (attention's backward writes them so: NewTiledLike in attention.cc), so that
  // nothing is copied; undefined otherwise.
  Tensor PackedBlock(const std::vector<Tensor>& grads) const {
    const int64_t b = packed_shape_[0], t = packed_shape_[1], width = packed_shape_[2];
    const int64_t d = width / (parts_ * n_head_);
    const Shape part_shape = {b, n_head_, t, d};
    const std::vector<int64_t> part_strides = {t * width, d, width, 1};  // of a contiguous pack
    if (!grads[0].defined()) return Tensor();
    const int64_t base = grads[0].storage_offset();
    for (int64_t i = 0; i < parts_; ++i) {
      const Tensor& g = grads[static_cast<size_t>(i)];
      if (!g.defined() || !g.shares_storage_with(grads[0]) || g.dtype() != dtype_ ||
          g.shape() != part_shape || g.storage_offset() != base + i * n_head_ * d) {
        return Tensor();
      }
      for (size_t k = 0; k < part_shape.size(); ++k) {
        if (part_shape[k] > 1 && g.strides()[k] != part_strides[k]) return Tensor();
      }
    }
    return MakeView(grads[0], packed_shape_, ContiguousStrides(packed_shape_), base);
  }

  Shape packed_shape_;
  DType dtype_;
  int64_t parts_, n_head_;
};

}  // namespace

std::vector<Tensor> split_heads(const Tensor& packed, int64_t parts, int64_t n_head) {
  CheckDefined(packed, "split_heads", "packed");
  TANDEM_CHECK(packed.dim() == 3, "split_heads: expected packed [B, T, parts * n_head * D] but ",
               "got ", ShapeToString(packed.shape()), "; reshape it to three dimensions first");
  TANDEM_CHECK(parts >= 1 && n_head >= 1, "split_heads: parts and n_head must be >= 1 but are ",
               parts, " and ", n_head);
  TANDEM_CHECK(packed.size(2) % (parts * n_head) == 0, "split_heads: the last dimension of ",
               ShapeToString(packed.shape()),
               " must be a multiple of parts * n_head = ", parts * n_head, " (", parts,
               " parts of ", n_head, " heads); check n_head");
  const int64_t b = packed.size(0), t = packed.size(1), d = packed.size(2) / (parts * n_head);
  Tensor all;
  {
    NoGradGuard no_grad;  // one node for all the parts, recorded below
    // Views of packed [B, T, parts, H, D], no copy: attention reads them in place as
    // [B, H, T, D] and lays its output out as they are, so the head merge after it is a view.
    all = packed.reshape({b, t, parts, n_head, d});
  }
  std::vector<Tensor> outputs;
  for (int64_t i = 0; i < parts; ++i) {
    // detach: the node becomes their grad_fn, not the view of `all`.
    outputs.push_back(all.select(2, i).transpose(1, 2).detach());
  }
  if (NeedsGrad({packed})) {
    RecordMultiOutputOp(std::make_shared<SplitHeadsBackward>(packed.device(), packed.shape(),
                                                             packed.dtype(), parts, n_head),
                        {packed}, outputs);
  }
  return outputs;
}

}  // namespace tandem
