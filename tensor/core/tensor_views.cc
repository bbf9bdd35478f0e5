// Tensor's views (view, reshape, flatten, narrow, select, chunk, split, transpose, permute,
// unsqueeze, squeeze), each recording its backward, and contiguous and clone, the copies whose
// gradient passes through unchanged as a view's does.
#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "tensor/core/autograd.h"
#include "tensor/core/internal/tensor_impl.h"
#include "tensor/core/tensor.h"
#include "tensor/runtime/backend.h"

namespace tandem {

namespace {

Shape InferShape(Shape shape, int64_t numel, const Shape& from) {
  int64_t known = 1;
  int infer = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      TANDEM_CHECK(infer < 0, "view/reshape: only one dimension can be -1 in ",
                   ShapeToString(shape));
      infer = static_cast<int>(i);
    } else {
      TANDEM_CHECK(shape[i] >= 0, "view/reshape: invalid size ", shape[i], " in ",
                   ShapeToString(shape));
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    TANDEM_CHECK(known != 0 && numel % known == 0, "view/reshape: cannot infer -1 in ",
                 ShapeToString(shape), " for a tensor of shape ", ShapeToString(from), " (", numel,
                 " elements)");
    shape[infer] = numel / known;
    known *= shape[infer];
  }
  TANDEM_CHECK(known == numel, "view/reshape: shape ", ShapeToString(shape), " has ", known,
               " elements but the tensor of shape ", ShapeToString(from), " has ", numel);
  return shape;
}

// Records a backward for a view-like op whose gradient is `backward(grad)`, written with
// differentiable view ops (so double backward is supported).
Tensor RecordView(const Tensor& input, Tensor out, const char* name,
                  FunctionNode::Backward backward) {
  if (NeedsGrad({input})) {
    RecordOp(name, {input}, out, std::move(backward), DoubleBackward::kSupported);
  }
  return out;
}

}  // namespace

Tensor Tensor::view(const Shape& new_shape) const {
  const Shape target = InferShape(new_shape, numel(), shape());
  TANDEM_CHECK(is_contiguous(), "view: the tensor of shape ", ShapeToString(shape()),
               " is not contiguous (strides ", ShapeToString(strides()),
               "), so it cannot be viewed as ", ShapeToString(target),
               "; use reshape() or contiguous() first");
  Tensor out = MakeView(*this, target, ContiguousStrides(target), storage_offset());
  const Shape original = shape();
  return RecordView(*this, out, "ViewBackward", [original](const Tensor& g) {
    return std::vector<Tensor>{g.reshape(original)};
  });
}

Tensor Tensor::reshape(const Shape& new_shape) const {
  return is_contiguous() ? view(new_shape) : contiguous().view(new_shape);
}

Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  if (dim() == 0) return reshape({1});
  const int64_t start = WrapDim(start_dim, dim(), "flatten");
  const int64_t end = WrapDim(end_dim, dim(), "flatten");
  TANDEM_CHECK(start <= end, "flatten: start_dim (", start_dim, ") must not come after end_dim (",
               end_dim, ")");
  Shape target(shape().begin(), shape().begin() + start);
  int64_t merged = 1;
  for (int64_t d = start; d <= end; ++d) merged *= shape()[d];
  target.push_back(merged);
  target.insert(target.end(), shape().begin() + end + 1, shape().end());
  return reshape(target);
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  TANDEM_CHECK(dim() > 0, "narrow: cannot narrow a 0-dimensional tensor");
  const int64_t axis = WrapDim(d, dim(), "narrow");
  const int64_t n = shape()[axis];
  TANDEM_CHECK(start >= 0 && length >= 0 && start + length <= n, "narrow: start ", start,
               " and length ", length, " are out of range for dimension ", axis, " of size ", n,
               " (shape ", ShapeToString(shape()), "); need 0 <= start and start + length <= ", n);
  Shape target = shape();
  target[axis] = length;
  Tensor out = MakeView(*this, target, strides(), storage_offset() + start * strides()[axis]);
  const Shape original = shape();
  const Device device = this->device();
  const DType type = dtype();
  return RecordView(*this, out, "NarrowBackward",
                    [original, device, type, axis, start, length](const Tensor& g) {
                      Tensor grad = zeros(original, TensorOptions().device(device).dtype(type));
                      if (GradMode::IsEnabled() && g.requires_grad()) {
                        // create_graph: copy_ records nothing; the gradient is g between zeros.
                        // Recorded as the adjoint of narrow (a narrow of its gradient).
                        Tensor padded = grad;
                        NoGradGuard no_grad;
                        padded.narrow(axis, start, length).copy_(g);
                        RecordOp(
                            "NarrowAdjointBackward", {g}, padded,
                            [axis, start, length](const Tensor& gg) {
                              return std::vector<Tensor>{gg.narrow(axis, start, length)};
                            },
                            DoubleBackward::kSupported);
                        return std::vector<Tensor>{padded};
                      }
                      grad.narrow(axis, start, length).copy_(g);
                      return std::vector<Tensor>{grad};
                    });
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  const int64_t axis = WrapDim(d, dim(), "select");
  const int64_t n = shape()[axis];
  TANDEM_CHECK(index >= -n && index < n, "select: index ", index, " is out of range for dimension ",
               axis, " of size ", n);
  return narrow(axis, index < 0 ? index + n : index, 1).squeeze(axis);
}

std::vector<Tensor> Tensor::chunk(int64_t chunks, int64_t d) const {
  TANDEM_CHECK(chunks > 0, "chunk: the number of chunks must be positive but is ", chunks);
  TANDEM_CHECK(dim() > 0, "chunk: cannot chunk a 0-dimensional tensor");
  const int64_t axis = WrapDim(d, dim(), "chunk");
  const int64_t n = shape()[axis];
  // torch.chunk: pieces of ceil(n / chunks), so fewer than `chunks` pieces may come back.
  const int64_t piece = std::max<int64_t>(1, (n + chunks - 1) / chunks);
  if (n == 0) return {*this};
  return split(piece, axis);
}

std::vector<Tensor> Tensor::split(int64_t split_size, int64_t d) const {
  TANDEM_CHECK(split_size > 0, "split: split_size must be positive but is ", split_size);
  TANDEM_CHECK(dim() > 0, "split: cannot split a 0-dimensional tensor");
  const int64_t axis = WrapDim(d, dim(), "split");
  const int64_t n = shape()[axis];
  std::vector<int64_t> sizes;
  for (int64_t start = 0; start < n; start += split_size) {
    sizes.push_back(std::min(split_size, n - start));
  }
  if (sizes.empty()) sizes.push_back(0);
  return split_with_sizes(sizes, axis);
}

std::vector<Tensor> Tensor::split_with_sizes(const std::vector<int64_t>& sizes, int64_t d) const {
  TANDEM_CHECK(dim() > 0, "split_with_sizes: cannot split a 0-dimensional tensor");
  const int64_t axis = WrapDim(d, dim(), "split_with_sizes");
  int64_t total = 0;
  for (int64_t s : sizes) {
    TANDEM_CHECK(s >= 0, "split_with_sizes: sizes must be >= 0 but got ", ShapeToString(sizes));
    total += s;
  }
  TANDEM_CHECK(total == shape()[axis], "split_with_sizes: sizes ", ShapeToString(sizes),
               " add up to ", total, " but dimension ", axis, " has size ", shape()[axis]);
  std::vector<Tensor> pieces;
  int64_t start = 0;
  for (int64_t s : sizes) {
    pieces.push_back(narrow(axis, start, s));
    start += s;
  }
  return pieces;
}

Tensor Tensor::transpose(int64_t dim0, int64_t dim1) const {
  if (dim() == 0) return *this;
  const int64_t a = WrapDim(dim0, dim(), "transpose");
  const int64_t b = WrapDim(dim1, dim(), "transpose");
  Shape s = shape();
  std::vector<int64_t> st = strides();
  std::swap(s[a], s[b]);
  std::swap(st[a], st[b]);
  Tensor out = MakeView(*this, s, st, storage_offset());
  return RecordView(*this, out, "TransposeBackward",
                    [a, b](const Tensor& g) { return std::vector<Tensor>{g.transpose(a, b)}; });
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  TANDEM_CHECK(static_cast<int64_t>(dims.size()) == dim(), "permute: got ", dims.size(),
               " dimensions ", ShapeToString(dims), " for a tensor with ", dim());
  std::vector<int64_t> order(dims.size()), inverse(dims.size());
  std::vector<bool> seen(dims.size(), false);
  Shape s(dims.size());
  std::vector<int64_t> st(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = WrapDim(dims[i], dim(), "permute");
    TANDEM_CHECK(!seen[d], "permute: dimension ", d, " appears twice in ", ShapeToString(dims));
    seen[d] = true;
    order[i] = d;
    inverse[d] = static_cast<int64_t>(i);
    s[i] = shape()[d];
    st[i] = strides()[d];
  }
  Tensor out = MakeView(*this, s, st, storage_offset());
  return RecordView(*this, out, "PermuteBackward",
                    [inverse](const Tensor& g) { return std::vector<Tensor>{g.permute(inverse)}; });
}

Tensor Tensor::unsqueeze(int64_t d) const {
  const int64_t axis = WrapDim(d, dim() + 1, "unsqueeze");
  Shape s = shape();
  std::vector<int64_t> st = strides();
  const int64_t stride = axis < dim() ? st[axis] * s[axis] : 1;
  s.insert(s.begin() + axis, 1);
  st.insert(st.begin() + axis, stride);
  Tensor out = MakeView(*this, s, st, storage_offset());
  const Shape original = shape();
  return RecordView(*this, out, "UnsqueezeBackward", [original](const Tensor& g) {
    return std::vector<Tensor>{g.reshape(original)};
  });
}

Tensor Tensor::squeeze(int64_t d) const {
  if (dim() == 0) return *this;
  const int64_t axis = WrapDim(d, dim(), "squeeze");
  if (shape()[axis] != 1) return *this;
  Shape s = shape();
  std::vector<int64_t> st = strides();
  s.erase(s.begin() + axis);
  st.erase(st.begin() + axis);
  Tensor out = MakeView(*this, s, st, storage_offset());
  const Shape original = shape();
  return RecordView(*this, out, "SqueezeBackward", [original](const Tensor& g) {
    return std::vector<Tensor>{g.reshape(original)};
  });
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  Tensor out = NewTensor(shape(), dtype(), device());
  GetBackend(device()).Copy(device().index(), ToKernel(out), ToKernel(*this));
  return RecordView(*this, out, "ContiguousBackward",
                    [](const Tensor& g) { return std::vector<Tensor>{g}; });
}

Tensor Tensor::clone() const {
  Tensor out = NewTensor(shape(), dtype(), device());
  GetBackend(device()).Copy(device().index(), ToKernel(out), ToKernel(*this));
  return RecordView(*this, out, "CloneBackward",
                    [](const Tensor& g) { return std::vector<Tensor>{g}; });
}

}  // namespace tandem
