// The helpers shared by the op families of //tensor/ops (tensor/ops/internal/op_helpers.h).
#include "tensor/ops/internal/op_helpers.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "tensor/base/error.h"
#include "tensor/core/internal/tensor_impl.h"
#include "tensor/core/tensor.h"
#include "tensor/ops/ops.h"
#include "tensor/runtime/backend.h"

namespace tandem {

int64_t Product(const Shape& shape, size_t begin, size_t end) {
  int64_t n = 1;
  for (size_t i = begin; i < end; ++i) n *= shape[i];
  return n;
}

void CheckDefined(const Tensor& t, const char* op, const char* name) {
  TANDEM_CHECK(t.defined(), op, ": ", name,
               " is an undefined Tensor; pass a tensor made by a factory (zeros, randn, "
               "from_vector, ...) or by another op");
}

void CheckSameDevice(const Tensor& a, const char* a_name, const Tensor& b, const char* b_name,
                     const char* op) {
  TANDEM_CHECK(a.device() == b.device(), op, ": ", a_name, " is on ", a.device(), " and ", b_name,
               " on ", b.device(), "; all inputs of an op must be on one device: move one ",
               "with .to(", a.device(), ")");
}

void CheckFloat(const Tensor& t, const char* op, const char* name) {
  TANDEM_CHECK(IsFloatingPoint(t.dtype()), op, ": ", name,
               " must be a floating-point tensor (float32, float64, bfloat16 or float16) but is ",
               t.dtype(), "; convert it with .to(kFloat32)");
}

void CheckSameFloat(const Tensor& a, const char* a_name, const Tensor& b, const char* b_name,
                    const char* op) {
  CheckFloat(a, op, a_name);
  TANDEM_CHECK(a.dtype() == b.dtype(), op, ": ", a_name, " is ", a.dtype(), " but ", b_name, " is ",
               b.dtype(), "; both must have one dtype: convert one with .to(", a.dtype(), ")");
}

int64_t Dim(int64_t dim, int64_t ndim, const char* op) {
  return WrapDim(dim, std::max<int64_t>(ndim, 1), op);
}

Tensor ViewRaw(const Tensor& t, const Shape& shape) {
  return MakeView(t, shape, ContiguousStrides(shape), t.storage_offset());
}

Tensor TransposedRaw(const Tensor& t) {
  Shape shape = t.shape();
  std::vector<int64_t> strides = t.strides();
  const size_t n = shape.size();
  std::swap(shape[n - 1], shape[n - 2]);
  std::swap(strides[n - 1], strides[n - 2]);
  return MakeView(t, shape, strides, t.storage_offset());
}

Tensor BroadcastCopyRaw(const Tensor& t, const Shape& shape, DType dtype) {
  Tensor out = NewTensor(shape, dtype, t.device());
  if (out.numel() > 0) BackendOf(t).Copy(IndexOf(t), ToKernel(out), ToKernelBroadcast(t, shape));
  return out;
}

Tensor ContiguousRaw(const Tensor& t) {
  if (t.is_contiguous()) return t;
  return BroadcastCopyRaw(t, t.shape(), t.dtype());
}

Tensor CastRaw(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  return BroadcastCopyRaw(t, t.shape(), dtype);
}

Tensor FilledRaw(const Shape& shape, DType dtype, Device device, double value) {
  Tensor out = NewTensor(shape, dtype, device);
  if (out.numel() > 0) GetBackend(device).Fill(device.index(), ToKernel(out), value);
  return out;
}

Tensor UnaryRaw(UnaryOp op, const Tensor& a, double scalar) {
  Tensor out = NewTensor(a.shape(), a.dtype(), a.device());
  if (out.numel() > 0) BackendOf(a).Unary(IndexOf(a), op, ToKernel(out), ToKernel(a), scalar);
  return out;
}

Tensor BinaryRaw(BinaryOp op, const Tensor& a, const Tensor& b, const char* name) {
  const Shape shape = BroadcastShapes(a.shape(), b.shape(), name);
  Tensor out = NewTensor(shape, a.dtype(), a.device());
  if (out.numel() > 0) {
    BackendOf(a).Binary(IndexOf(a), op, ToKernel(out), ToKernelBroadcast(a, shape),
                        ToKernelBroadcast(b, shape));
  }
  return out;
}

bool IsWholeNumber(double value) { return std::isfinite(value) && value == std::floor(value); }

Tensor CompareRaw(BinaryOp op, const Tensor& a, const Tensor& b, const char* name) {
  return CastRaw(BinaryRaw(op, a, b, name), kBool);
}

std::vector<int64_t> NormalizeDims(const std::vector<int64_t>& dims, int64_t ndim, const char* op) {
  std::vector<int64_t> out;
  if (dims.empty()) {
    for (int64_t d = 0; d < std::max<int64_t>(ndim, 1); ++d) out.push_back(d);
    return out;
  }
  for (int64_t d : dims) out.push_back(Dim(d, ndim, op));
  std::sort(out.begin(), out.end());
  for (size_t i = 1; i < out.size(); ++i) {
    TANDEM_CHECK(out[i] != out[i - 1], op, ": dimension ", out[i],
                 " appears more than once in the list of dimensions to reduce");
  }
  return out;
}

Shape ReducedShape(const Shape& shape, const std::vector<int64_t>& dims, bool keepdim) {
  Shape out;
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
    const bool reduced = std::binary_search(dims.begin(), dims.end(), d);
    if (!reduced) {
      out.push_back(shape[d]);
    } else if (keepdim) {
      out.push_back(1);
    }
  }
  return out;
}

Tensor ReduceRaw(const Tensor& a, const std::vector<int64_t>& dims, ReduceKind op,
                 const char* name) {
  const bool zero_dim = a.dim() == 0;
  Shape shape = zero_dim ? Shape{1} : a.shape();
  const DType out_dtype =
      (op == ReduceKind::kArgMax || op == ReduceKind::kArgMin) ? kInt64 : a.dtype();
  Tensor current = ContiguousRaw(a);
  size_t run_end = dims.size();
  while (run_end > 0) {
    size_t run_begin = run_end - 1;
    while (run_begin > 0 && dims[run_begin - 1] + 1 == dims[run_begin]) --run_begin;
    const size_t first = static_cast<size_t>(dims[run_begin]);
    const size_t last = static_cast<size_t>(dims[run_end - 1]);
    const int64_t outer = Product(shape, 0, first);
    const int64_t reduce = Product(shape, first, last + 1);
    const int64_t inner = Product(shape, last + 1, shape.size());
    Shape next = shape;
    for (size_t d = first; d <= last; ++d) next[d] = 1;
    Tensor out = NewTensor(zero_dim ? Shape{} : next, out_dtype, a.device());
    if (outer * inner > 0) {
      if (reduce == 0) {
        TANDEM_CHECK(op == ReduceKind::kSum, name, ": cannot reduce over a dimension of size 0 (",
                     "input is ", ShapeToString(a.shape()),
                     "); a maximum, minimum or arg-reduction over no elements is undefined");
        BackendOf(a).Fill(IndexOf(a), ToKernel(out), 0.0);
      } else {
        BackendOf(a).Reduce(IndexOf(a), op, ToKernel(out), ToKernel(current), outer, reduce, inner);
      }
    }
    current = out;
    shape = next;
    run_end = run_begin;
  }
  return current;
}

Tensor SumAllRaw(const Tensor& a) {
  return ViewRaw(ReduceRaw(a, NormalizeDims({}, a.dim(), "sum"), ReduceKind::kSum, "sum"), {});
}

Promoted PromoteBinary(const Tensor& a, const Tensor& b, const char* op) {
  CheckDefined(a, op, "a");
  CheckDefined(b, op, "b");
  CheckSameDevice(a, "a", b, "b", op);
  const DType dtype = result_type(a, b);
  return {CastRaw(a, dtype), CastRaw(b, dtype)};
}

std::vector<Tensor> RecomputedGradients(const std::function<Tensor()>& recompute,
                                        const std::vector<Tensor>& inputs, const Tensor& grad) {
  std::vector<Tensor> wrt;
  for (const Tensor& t : inputs) {
    if (t.defined() && t.requires_grad()) wrt.push_back(t);
  }
  std::vector<Tensor> grads(inputs.size());
  if (wrt.empty()) return grads;
  const std::vector<Tensor> found =
      autograd::grad({recompute()}, wrt, {grad}, /*create_graph=*/true,
                     /*retain_graph=*/std::nullopt, /*allow_unused=*/true);
  for (size_t i = 0, j = 0; i < inputs.size(); ++i) {
    if (inputs[i].defined() && inputs[i].requires_grad()) grads[i] = found[j++];
  }
  return grads;
}

}  // namespace tandem
