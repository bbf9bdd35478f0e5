// The operations of tensor/ops/ops.h and the op methods of Tensor.
//
// Every op validates its inputs, computes through the device's Backend kernels (never by
// touching memory from the host, so the same code runs on CUDA) and, when an input needs a
// gradient, records a backward closure. Backward closures run with grad mode off and are
// written with these same ops (or raw kernels), so they work on every device too.
//
// Conventions inside this file: functions named *Raw never record autograd; saved tensors
// are detached so that a node never keeps its inputs' graphs alive through saved values.
#include "tensor/ops/ops.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "tensor/base/error.h"
#include "tensor/core/autograd.h"
#include "tensor/core/internal/tensor_impl.h"
#include "tensor/core/tensor.h"
#include "tensor/kernels/internal/elementwise_math.h"
#include "tensor/ops/autocast.h"
#include "tensor/runtime/backend.h"

namespace tandem {
namespace {

// ---- Small helpers ---------------------------------------------------------------------

Backend& BackendOf(const Tensor& t) { return GetBackend(t.device()); }
int IndexOf(const Tensor& t) { return t.device().index(); }

// The address of a tensor's first element (storage offset included), in its dtype: `+ n`
// moves n elements, and it converts to the untyped pointers that Backend's kernels take.
class ElementPtr {
 public:
  ElementPtr() = default;
  ElementPtr(void* data, DType dtype) : data_(static_cast<char*>(data)), dtype_(dtype) {}
  ElementPtr operator+(int64_t n) const {
    return ElementPtr(data_ + n * static_cast<int64_t>(ElementSize(dtype_)), dtype_);
  }
  operator void*() const { return data_; }  // NOLINT: what Backend's kernels take.

 private:
  char* data_ = nullptr;
  DType dtype_ = kFloat32;
};

ElementPtr DataPtr(const Tensor& t) { return ElementPtr(ToKernel(t).data, t.dtype()); }
int64_t* Int64Ptr(const Tensor& t) { return static_cast<int64_t*>(ToKernel(t).data); }

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

// A floating-point input (float32, float64, bfloat16 or float16).
void CheckFloat(const Tensor& t, const char* op, const char* name) {
  TANDEM_CHECK(IsFloatingPoint(t.dtype()), op, ": ", name,
               " must be a floating-point tensor (float32, float64, bfloat16 or float16) but is ",
               t.dtype(), "; convert it with .to(kFloat32)");
}

// Inputs that meet in one kernel (a matmul's operands, a layer's weight and input) must share
// a floating dtype: PyTorch refuses to mix them too, rather than casting a weight silently.
void CheckSameFloat(const Tensor& a, const char* a_name, const Tensor& b, const char* b_name,
                    const char* op) {
  CheckFloat(a, op, a_name);
  TANDEM_CHECK(a.dtype() == b.dtype(), op, ": ", a_name, " is ", a.dtype(), " but ", b_name, " is ",
               b.dtype(), "; both must have one dtype: convert one with .to(", a.dtype(), ")");
}

// A possibly negative dim of a tensor with `ndim` dimensions; zero-dimensional tensors
// accept 0 and -1, as in PyTorch.
int64_t Dim(int64_t dim, int64_t ndim, const char* op) {
  return WrapDim(dim, std::max<int64_t>(ndim, 1), op);
}

// A contiguous tensor with `t`'s data and the given shape (t must be contiguous).
Tensor ViewRaw(const Tensor& t, const Shape& shape) {
  return MakeView(t, shape, ContiguousStrides(shape), t.storage_offset());
}

// The last two dimensions swapped, as a view.
Tensor TransposedRaw(const Tensor& t) {
  Shape shape = t.shape();
  std::vector<int64_t> strides = t.strides();
  const size_t n = shape.size();
  std::swap(shape[n - 1], shape[n - 2]);
  std::swap(strides[n - 1], strides[n - 2]);
  return MakeView(t, shape, strides, t.storage_offset());
}

// `t` broadcast to `shape`, materialised as a new contiguous tensor (converting dtype).
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

// a and b of one dtype; the result has their broadcast shape.
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

// A comparison of a and b (one dtype, broadcast) as a bool tensor, PyTorch's result dtype.
// The kernel writes 1/0 in the inputs' dtype and Copy turns that into bool: every backend
// does both today. Backend contract (2) lets a comparison write a kBool dst directly, which
// saves the second pass once every backend on the branch implements it.
Tensor CompareRaw(BinaryOp op, const Tensor& a, const Tensor& b, const char* name) {
  return CastRaw(BinaryRaw(op, a, b, name), kBool);
}

// The dtype of `t` op `scalar`, as PyTorch types a tensor with a Python number: a floating
// tensor keeps its dtype (a bfloat16 tensor times 0.5 stays bfloat16), an integral one keeps
// its dtype with an integral scalar and becomes float32 (the default dtype) with a
// fractional one, and bool becomes int64 (or float32) since bool arithmetic has no numbers.
DType ScalarResultType(DType t, double scalar) {
  if (IsFloatingPoint(t)) return t;
  if (!IsWholeNumber(scalar)) return kFloat32;
  return t == kBool ? kInt64 : t;
}

// ---- Reductions --------------------------------------------------------------------------

// Sorted, de-duplicated, non-negative dims; an empty list means every dimension.
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

// The shape after reducing `dims` (sorted) of `shape`.
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

// Reduces `a` over the sorted dims with Backend::Reduce, one run of adjacent dims at a
// time (last run first, so earlier dims keep their positions). The result has the keepdim
// shape; kArgMax/kArgMin give int64 and take a single dim.
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

// `grad` (of the reduced shape) broadcast back to `input_shape` as a stride-0 view: the
// engine copies gradients before accumulating into them, so a view saves a full copy.
Tensor ExpandGradRaw(const Tensor& grad, const Shape& kept_shape, const Shape& input_shape) {
  const Tensor kept = grad.shape() == kept_shape ? grad : ViewRaw(ContiguousRaw(grad), kept_shape);
  const size_t lead = input_shape.size() - kept_shape.size();
  std::vector<int64_t> strides(input_shape.size(), 0);
  for (size_t d = lead; d < input_shape.size(); ++d) {
    if (kept_shape[d - lead] == input_shape[d]) strides[d] = kept.strides()[d - lead];
  }
  return MakeView(kept, input_shape, strides, kept.storage_offset());
}

// ---- Elementwise with autograd -------------------------------------------------------

struct Promoted {
  Tensor a, b;
};

// Checks a binary op's inputs and converts both to their promoted dtype (PyTorch's
// result_type: int64 + float32 -> float32, float32 + float64 -> float64).
Promoted PromoteBinary(const Tensor& a, const Tensor& b, const char* op) {
  CheckDefined(a, op, "a");
  CheckDefined(b, op, "b");
  CheckSameDevice(a, "a", b, "b", op);
  const DType dtype = result_type(a, b);
  return {CastRaw(a, dtype), CastRaw(b, dtype)};
}

// A floating version of `a`: integral and bool inputs become float32, the default dtype, as
// PyTorch promotes them for exp, log, ...; floating inputs (16-bit ones too) stay as they are.
Tensor FloatInput(const Tensor& a, const char* op) {
  CheckDefined(a, op, "input");
  return IsFloatingPoint(a.dtype()) ? a : CastRaw(a, kFloat32);
}

template <typename Backward>
void Record(const char* name, const std::vector<Tensor>& inputs, Tensor& out, Backward backward) {
  RecordOp(name, inputs, out, FunctionNode::Backward(std::move(backward)));
}

// Float unary op `op` whose gradient is grad * derivative(input, output).
template <typename Derivative>
Tensor FloatUnaryOp(const Tensor& a, UnaryOp op, double scalar, const char* name,
                    const char* node_name, Derivative derivative) {
  Tensor x = FloatInput(a, name);
  Tensor out = UnaryRaw(op, x, scalar);
  if (NeedsGrad({a})) {
    Tensor saved_in = x.detach();
    Tensor saved_out = out.detach();
    Record(node_name, {a}, out, [saved_in, saved_out, derivative](const Tensor& grad) {
      return std::vector<Tensor>{derivative(grad, saved_in, saved_out)};
    });
  }
  return out;
}

// ---- Matrix products ---------------------------------------------------------------------

// How Gemm reads a 2-D [rows, cols] (or 3-D [batch, rows, cols]) float32 tensor without
// copying: row-major (trans = false) or column-major (trans = true, e.g. a transposed view).
struct GemmOperand {
  Tensor holder;  // keeps a contiguous copy alive when the layout needed one
  ElementPtr data;
  bool trans = false;
  int64_t ld = 1;
  int64_t batch_stride = 0;
};

bool TryGemmLayout(const Tensor& t, GemmOperand* operand) {
  const int64_t n = t.dim();
  const int64_t rows = t.shape()[n - 2], cols = t.shape()[n - 1];
  const int64_t row_stride = t.strides()[n - 2], col_stride = t.strides()[n - 1];
  const bool row_major =
      (cols <= 1 || col_stride == 1) && (rows <= 1 || row_stride >= std::max<int64_t>(cols, 1));
  const bool col_major =
      (rows <= 1 || row_stride == 1) && (cols <= 1 || col_stride >= std::max<int64_t>(rows, 1));
  if (row_major) {
    operand->trans = false;
    operand->ld = rows <= 1 ? std::max<int64_t>(cols, 1) : row_stride;
  } else if (col_major) {
    operand->trans = true;
    operand->ld = cols <= 1 ? std::max<int64_t>(rows, 1) : col_stride;
  } else {
    return false;
  }
  operand->batch_stride = (n == 3 && t.shape()[0] > 1) ? t.strides()[0] : 0;
  operand->data = DataPtr(t);
  return true;
}

GemmOperand MakeGemmOperand(const Tensor& t) {
  GemmOperand operand;
  if (TryGemmLayout(t, &operand)) return operand;
  operand.holder = BroadcastCopyRaw(t, t.shape(), t.dtype());
  TryGemmLayout(operand.holder, &operand);
  return operand;
}

// out (contiguous [m, n] or [batch, m, n]) = a · b + beta · out, where a is [m, k] or
// [batch, m, k] and b is [k, n] or [batch, k, n]; a 2-D operand is reused for every batch.
void GemmIntoRaw(const Tensor& out, const Tensor& a, const Tensor& b, double beta) {
  const int64_t batch = out.dim() == 3 ? out.shape()[0] : 1;
  const int64_t m = a.shape()[a.dim() - 2], k = a.shape()[a.dim() - 1];
  const int64_t n = b.shape()[b.dim() - 1];
  if (out.numel() == 0) return;
  if (k == 0) {
    if (beta == 0.0) BackendOf(out).Fill(IndexOf(out), ToKernel(out), 0.0);
    return;
  }
  const GemmOperand lhs = MakeGemmOperand(a);
  const GemmOperand rhs = MakeGemmOperand(b);
  BackendOf(out).Gemm(IndexOf(out), out.dtype(), lhs.trans, rhs.trans, m, n, k, 1.0f, lhs.data,
                      lhs.ld, lhs.batch_stride, rhs.data, rhs.ld, rhs.batch_stride, beta,
                      DataPtr(out), n, m * n, batch);
}

Tensor MatmulRaw(const Tensor& a, const Tensor& b) {
  const int64_t m = a.shape()[a.dim() - 2], n = b.shape()[b.dim() - 1];
  Shape shape = {m, n};
  if (a.dim() == 3) {
    shape.insert(shape.begin(), a.shape()[0]);
  } else if (b.dim() == 3) {
    shape.insert(shape.begin(), b.shape()[0]);
  }
  Tensor out = NewTensor(shape, a.dtype(), a.device());
  GemmIntoRaw(out, a, b, 0.0f);
  return out;
}

// 2-D x 2-D, 3-D x 3-D (equal batches), 3-D x 2-D or 2-D x 3-D, with autograd.
Tensor MatmulCore(const Tensor& a, const Tensor& b) {
  Tensor out = MatmulRaw(a, b);
  if (NeedsGrad({a, b})) {
    const bool grad_a = NeedsGrad({a}), grad_b = NeedsGrad({b});
    Tensor sa = a.detach(), sb = b.detach();
    Record("MatmulBackward", {a, b}, out, [sa, sb, grad_a, grad_b](const Tensor& grad) {
      Tensor da, db;
      if (grad_a) {
        // dA = G · B^T, summed over the batch when A was shared by every batch.
        da = MatmulRaw(grad, TransposedRaw(sb));
        if (sa.dim() == 2 && da.dim() == 3)
          da = ViewRaw(ReduceRaw(da, {0}, ReduceKind::kSum, "matmul"), sa.shape());
      }
      if (grad_b) {
        if (sb.dim() == 2 && sa.dim() == 3) {
          // dB = sum_b A_b^T · G_b = A'^T · G' with the batch folded into the rows.
          const int64_t rows = sa.shape()[0] * sa.shape()[1];
          Tensor folded_a = ViewRaw(ContiguousRaw(sa), {rows, sa.shape()[2]});
          Tensor folded_g = ViewRaw(ContiguousRaw(grad), {rows, grad.shape()[2]});
          db = MatmulRaw(TransposedRaw(folded_a), folded_g);
        } else {
          db = MatmulRaw(TransposedRaw(sa), grad);
        }
      }
      return std::vector<Tensor>{da, db};
    });
  }
  return out;
}

// ---- Losses ----------------------------------------------------------------------------

// Checks that int64 `targets` [N] hold class indices in [0, classes), on any device: two
// reductions and a single two-element read back, not a walk over host memory.
void CheckTargets(const Tensor& targets, int64_t classes, const char* op) {
  if (targets.numel() == 0) return;
  const Tensor largest = ViewRaw(ReduceRaw(targets, {0}, ReduceKind::kMax, op), {1});
  const Tensor smallest = ViewRaw(ReduceRaw(targets, {0}, ReduceKind::kMin, op), {1});
  const std::vector<int64_t> range = cat({smallest, largest}).to_vector<int64_t>();
  TANDEM_CHECK(range[0] >= 0 && range[1] < classes, op,
               ": targets must be class indices in [0, C) = [0, ", classes, ") but range over [",
               range[0], ", ", range[1], "]; check the labels and the number of classes ",
               "(negative ignore_index values are not supported)");
}

// Mean NLL of `targets` under `log_probs` [N, C]; validated by the caller.
Tensor NllLossCore(const Tensor& log_probs, const Tensor& targets) {
  const int64_t rows = log_probs.shape()[0], cols = log_probs.shape()[1];
  Tensor lp = ContiguousRaw(log_probs);
  Tensor idx = ContiguousRaw(targets);
  Tensor picked = NewTensor({rows}, lp.dtype(), lp.device());
  if (rows > 0) {
    BackendOf(lp).GatherColumns(IndexOf(lp), lp.dtype(), DataPtr(picked), DataPtr(lp),
                                Int64Ptr(idx), rows, cols);
  }
  // Mean over zero rows is NaN, as in PyTorch.
  const double scale =
      rows > 0 ? -1.0 / static_cast<double>(rows) : std::numeric_limits<double>::quiet_NaN();
  Tensor out = UnaryRaw(UnaryOp::kMulScalar, SumAllRaw(picked), scale);
  if (NeedsGrad({log_probs})) {
    Record("NllLossBackward", {log_probs}, out, [idx, rows, cols, scale](const Tensor& grad) {
      Tensor grad_lp = FilledRaw({rows, cols}, grad.dtype(), grad.device(), 0.0);
      if (rows > 0) {
        Tensor per_row =
            BroadcastCopyRaw(UnaryRaw(UnaryOp::kMulScalar, grad, scale), {rows}, grad_lp.dtype());
        BackendOf(grad).ScatterAddColumns(IndexOf(grad), grad_lp.dtype(), DataPtr(grad_lp),
                                          DataPtr(per_row), Int64Ptr(idx), rows, cols);
      }
      return std::vector<Tensor>{grad_lp};
    });
  }
  return out;
}

void CheckClassification(const Tensor& scores, const Tensor& targets, const char* op,
                         const char* scores_name) {
  CheckDefined(scores, op, scores_name);
  CheckDefined(targets, op, "targets");
  CheckSameDevice(scores, scores_name, targets, "targets", op);
  CheckFloat(scores, op, scores_name);
  TANDEM_CHECK(scores.dim() == 2, op, ": ", scores_name, " must be 2-D [N, C] but is ",
               ShapeToString(scores.shape()), "; flatten extra dimensions into N first");
  TANDEM_CHECK(targets.dtype() == kInt64, op, ": targets must be int64 class indices but are ",
               targets.dtype(), "; convert them with .to(kInt64)");
  TANDEM_CHECK(targets.dim() == 1 && targets.shape()[0] == scores.shape()[0], op, ": ", scores_name,
               " is ", ShapeToString(scores.shape()), " so targets must be [", scores.shape()[0],
               "] but are ", ShapeToString(targets.shape()));
  CheckTargets(targets, scores.shape()[1], op);
}

// ---- Convolution and pooling -------------------------------------------------------------

std::pair<int64_t, int64_t> Pair(const std::vector<int64_t>& values, const char* op,
                                 const char* what) {
  TANDEM_CHECK(values.size() == 1 || values.size() == 2, op, ": ", what,
               " must have 1 or 2 values (height, width) but has ", values.size());
  return {values[0], values.size() == 2 ? values[1] : values[0]};
}

void CheckImageInput(const Tensor& input, const char* op) {
  CheckDefined(input, op, "input");
  CheckFloat(input, op, "input");
  TANDEM_CHECK(input.dim() == 4, op, ": input must be 4-D [N, C, H, W] but is ",
               ShapeToString(input.shape()), "; add a batch dimension with unsqueeze(0)");
}

}  // namespace

// ---- Elementwise ---------------------------------------------------------------------------

Tensor sum_to(const Tensor& a, const std::vector<int64_t>& shape) {
  CheckDefined(a, "sum_to", "a");
  const int64_t lead = a.dim() - static_cast<int64_t>(shape.size());
  bool broadcastable = lead >= 0;
  std::vector<int64_t> dims;
  for (int64_t d = 0; broadcastable && d < a.dim(); ++d) {
    if (d < lead) {
      dims.push_back(d);
    } else if (shape[d - lead] != a.shape()[d]) {
      if (shape[d - lead] == 1) {
        dims.push_back(d);
      } else {
        broadcastable = false;
      }
    }
  }
  TANDEM_CHECK(broadcastable, "sum_to: cannot sum ", ShapeToString(a.shape()), " down to ",
               ShapeToString(shape), "; the target must broadcast to the input's shape");
  if (a.shape() == shape) return a;
  Tensor reduced = dims.empty() ? a : sum(a, dims, /*keepdim=*/true);
  return reduced.reshape(shape);
}

Tensor add(const Tensor& a, const Tensor& b) {
  const Promoted p = PromoteBinary(a, b, "add");
  Tensor out = BinaryRaw(BinaryOp::kAdd, p.a, p.b, "add");
  if (NeedsGrad({a, b})) {
    const bool grad_a = NeedsGrad({a}), grad_b = NeedsGrad({b});
    Record("AddBackward", {a, b}, out,
           [grad_a, grad_b, sa = a.shape(), sb = b.shape()](const Tensor& grad) {
             return std::vector<Tensor>{grad_a ? sum_to(grad, sa) : Tensor(),
                                        grad_b ? sum_to(grad, sb) : Tensor()};
           });
  }
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b) {
  const Promoted p = PromoteBinary(a, b, "sub");
  TANDEM_CHECK(p.a.dtype() != kBool,
               "sub: subtracting two bool tensors is not supported (as in PyTorch); use "
               "logical_xor(a, b) or convert them with .to(kInt64) first");
  Tensor out = BinaryRaw(BinaryOp::kSub, p.a, p.b, "sub");
  if (NeedsGrad({a, b})) {
    const bool grad_a = NeedsGrad({a}), grad_b = NeedsGrad({b});
    Record("SubBackward", {a, b}, out,
           [grad_a, grad_b, sa = a.shape(), sb = b.shape()](const Tensor& grad) {
             return std::vector<Tensor>{grad_a ? sum_to(grad, sa) : Tensor(),
                                        grad_b ? neg(sum_to(grad, sb)) : Tensor()};
           });
  }
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  const Promoted p = PromoteBinary(a, b, "mul");
  Tensor out = BinaryRaw(BinaryOp::kMul, p.a, p.b, "mul");
  if (NeedsGrad({a, b})) {
    const bool grad_a = NeedsGrad({a}), grad_b = NeedsGrad({b});
    Record("MulBackward", {a, b}, out,
           [grad_a, grad_b, sa = p.a.detach(), sb = p.b.detach()](const Tensor& grad) {
             return std::vector<Tensor>{grad_a ? sum_to(mul(grad, sb), sa.shape()) : Tensor(),
                                        grad_b ? sum_to(mul(grad, sa), sb.shape()) : Tensor()};
           });
  }
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  // True division: int64 operands promote to float32, as in PyTorch.
  Promoted p = PromoteBinary(a, b, "div");
  p.a = FloatInput(p.a, "div");
  p.b = FloatInput(p.b, "div");
  Tensor out = BinaryRaw(BinaryOp::kDiv, p.a, p.b, "div");
  if (NeedsGrad({a, b})) {
    const bool grad_a = NeedsGrad({a}), grad_b = NeedsGrad({b});
    Record(
        "DivBackward", {a, b}, out,
        [grad_a, grad_b, sa = a.shape(), sb = p.b.detach(), so = out.detach()](const Tensor& grad) {
          Tensor grad_over_b = div(grad, sb);
          // d(a/b)/db = -(a/b)/b.
          return std::vector<Tensor>{
              grad_a ? sum_to(grad_over_b, sa) : Tensor(),
              grad_b ? neg(sum_to(mul(grad_over_b, so), sb.shape())) : Tensor()};
        });
  }
  return out;
}

namespace {

// maximum/minimum: the gradient goes to the chosen input and is split evenly on ties, as
// in PyTorch. As there, an input loses its gradient only where it compares strictly worse,
// so where either is NaN (the output is NaN) both inputs receive the full gradient.
Tensor MaxMin(const Tensor& a, const Tensor& b, bool is_max) {
  const char* name = is_max ? "maximum" : "minimum";
  const Promoted p = PromoteBinary(a, b, name);
  Tensor out = BinaryRaw(is_max ? BinaryOp::kMaximum : BinaryOp::kMinimum, p.a, p.b, name);
  if (NeedsGrad({a, b})) {
    const bool grad_a = NeedsGrad({a}), grad_b = NeedsGrad({b});
    Record(is_max ? "MaximumBackward" : "MinimumBackward", {a, b}, out,
           [grad_a, grad_b, is_max, sa = p.a.detach(), sb = p.b.detach()](const Tensor& grad) {
             // 1/0 masks in the inputs' dtype (not bool: they are arithmetic here).
             const auto compare = [&](BinaryOp op) { return BinaryRaw(op, sa, sb, "maximum"); };
             const Tensor half_ties = mul(compare(BinaryOp::kEq), 0.5);
             const Tensor a_loses = compare(is_max ? BinaryOp::kLt : BinaryOp::kGt);
             const Tensor b_loses = compare(is_max ? BinaryOp::kGt : BinaryOp::kLt);
             const Tensor a_wins = 1.0 - add(a_loses, half_ties);
             const Tensor b_wins = 1.0 - add(b_loses, half_ties);
             return std::vector<Tensor>{grad_a ? sum_to(mul(grad, a_wins), sa.shape()) : Tensor(),
                                        grad_b ? sum_to(mul(grad, b_wins), sb.shape()) : Tensor()};
           });
  }
  return out;
}

Tensor Compare(const Tensor& a, const Tensor& b, BinaryOp op, const char* name) {
  const Promoted p = PromoteBinary(a, b, name);
  return CompareRaw(op, p.a, p.b, name);
}

// PyTorch's categories for result_type: a zero-dimensional tensor wins only from a higher one.
int Category(DType t) { return t == kBool ? 0 : IsFloatingPoint(t) ? 2 : 1; }

}  // namespace

DType result_type(const Tensor& a, const Tensor& b) {
  CheckDefined(a, "result_type", "a");
  CheckDefined(b, "result_type", "b");
  if (a.dtype() == b.dtype()) return a.dtype();
  // PyTorch's rule: zero-dimensional tensors take part only when they are of a higher category
  // (floating over integral) than the dimensioned ones: float32 [3] with a float64 scalar
  // tensor stays float32, int64 [3] with a float64 scalar tensor becomes float64.
  if ((a.dim() == 0) == (b.dim() == 0)) return PromoteTypes(a.dtype(), b.dtype());
  const DType dimensioned = a.dim() > 0 ? a.dtype() : b.dtype();
  const DType zero_dim = a.dim() > 0 ? b.dtype() : a.dtype();
  if (Category(zero_dim) <= Category(dimensioned)) return dimensioned;
  return PromoteTypes(dimensioned, zero_dim);
}

Tensor maximum(const Tensor& a, const Tensor& b) { return MaxMin(a, b, true); }
Tensor minimum(const Tensor& a, const Tensor& b) { return MaxMin(a, b, false); }

Tensor add(const Tensor& a, double b) {
  CheckDefined(a, "add", "a");
  // An integral tensor keeps its dtype with an integral scalar and promotes otherwise.
  Tensor x = CastRaw(a, ScalarResultType(a.dtype(), b));
  Tensor out = UnaryRaw(UnaryOp::kAddScalar, x, b);
  if (NeedsGrad({a})) {
    Record("AddScalarBackward", {a}, out,
           [](const Tensor& grad) { return std::vector<Tensor>{grad}; });
  }
  return out;
}

Tensor mul(const Tensor& a, double b) {
  CheckDefined(a, "mul", "a");
  Tensor x = CastRaw(a, ScalarResultType(a.dtype(), b));
  Tensor out = UnaryRaw(UnaryOp::kMulScalar, x, b);
  if (NeedsGrad({a})) {
    Record("MulScalarBackward", {a}, out,
           [b](const Tensor& grad) { return std::vector<Tensor>{mul(grad, b)}; });
  }
  return out;
}

Tensor pow(const Tensor& a, double exponent) {
  TANDEM_AUTOCAST(kFloat32, pow, a, exponent);
  return FloatUnaryOp(a, UnaryOp::kPowScalar, exponent, "pow", "PowBackward",
                      [exponent](const Tensor& grad, const Tensor& x, const Tensor&) {
                        if (exponent == 0.0) return zeros_like(grad);
                        if (exponent == 1.0) return grad;
                        return mul(grad, mul(pow(x, exponent - 1.0), exponent));
                      });
}

Tensor neg(const Tensor& a) {
  CheckDefined(a, "neg", "input");
  TANDEM_CHECK(a.dtype() != kBool,
               "neg: negating a bool tensor is not supported (as in PyTorch); use "
               "logical_not for a bool tensor or convert it with .to(kInt64) first");
  Tensor out = UnaryRaw(UnaryOp::kNeg, a, 0.0);
  if (NeedsGrad({a})) {
    Record("NegBackward", {a}, out,
           [](const Tensor& grad) { return std::vector<Tensor>{neg(grad)}; });
  }
  return out;
}

Tensor exp(const Tensor& a) {
  TANDEM_AUTOCAST(kFloat32, exp, a);
  return FloatUnaryOp(
      a, UnaryOp::kExp, 0.0, "exp", "ExpBackward",
      [](const Tensor& grad, const Tensor&, const Tensor& y) { return mul(grad, y); });
}

Tensor log(const Tensor& a) {
  TANDEM_AUTOCAST(kFloat32, log, a);
  return FloatUnaryOp(
      a, UnaryOp::kLog, 0.0, "log", "LogBackward",
      [](const Tensor& grad, const Tensor& x, const Tensor&) { return div(grad, x); });
}

Tensor sqrt(const Tensor& a) {
  return FloatUnaryOp(
      a, UnaryOp::kSqrt, 0.0, "sqrt", "SqrtBackward",
      [](const Tensor& grad, const Tensor&, const Tensor& y) { return mul(div(grad, y), 0.5); });
}

Tensor abs(const Tensor& a) {
  CheckDefined(a, "abs", "input");
  Tensor out = UnaryRaw(UnaryOp::kAbs, a, 0.0);
  if (NeedsGrad({a})) {
    Record("AbsBackward", {a}, out, [x = a.detach()](const Tensor& grad) {
      // sign(x), with sign(0) = 0 as in PyTorch (1/0 masks in x's dtype).
      const Tensor zero = FilledRaw({}, x.dtype(), x.device(), 0.0);
      const Tensor sign = sub(BinaryRaw(BinaryOp::kGt, x, zero, "abs backward"),
                              BinaryRaw(BinaryOp::kLt, x, zero, "abs backward"));
      return std::vector<Tensor>{mul(grad, sign)};
    });
  }
  return out;
}

Tensor tanh(const Tensor& a) {
  return FloatUnaryOp(a, UnaryOp::kTanh, 0.0, "tanh", "TanhBackward",
                      [](const Tensor& grad, const Tensor&, const Tensor& y) {
                        return BinaryRaw(BinaryOp::kTanhBackward, grad, y, "tanh backward");
                      });
}

Tensor sigmoid(const Tensor& a) {
  return FloatUnaryOp(a, UnaryOp::kSigmoid, 0.0, "sigmoid", "SigmoidBackward",
                      [](const Tensor& grad, const Tensor&, const Tensor& y) {
                        return BinaryRaw(BinaryOp::kSigmoidBackward, grad, y, "sigmoid backward");
                      });
}

Tensor gelu(const Tensor& a, const std::string& approximate) {
  TANDEM_CHECK(approximate == "none" || approximate == "tanh",
               "gelu: approximate must be \"none\" (the exact erf form) or \"tanh\" but is \"",
               approximate, "\"");
  if (approximate == "tanh") {
    // One fused elementwise kernel each way (the formula composed is 8 ops with a pow).
    return FloatUnaryOp(a, UnaryOp::kGeluTanh, 0.0, "gelu", "GeluTanhBackward",
                        [](const Tensor& grad, const Tensor& x, const Tensor&) {
                          return BinaryRaw(BinaryOp::kGeluTanhBackward, grad, x, "gelu backward");
                        });
  }
  return FloatUnaryOp(a, UnaryOp::kGelu, 0.0, "gelu", "GeluBackward",
                      [](const Tensor& grad, const Tensor& x, const Tensor&) {
                        return BinaryRaw(BinaryOp::kGeluBackward, grad, x, "gelu backward");
                      });
}

Tensor silu(const Tensor& a) {
  // One fused kernel each way, as PyTorch's: in 16 bits, x * sigmoid(x) as two ops would round
  // sigmoid(x) first, and its backward through mul and sigmoid three times more.
  return FloatUnaryOp(a, UnaryOp::kSilu, 0.0, "silu", "SiluBackward",
                      [](const Tensor& grad, const Tensor& x, const Tensor&) {
                        return BinaryRaw(BinaryOp::kSiluBackward, grad, x, "silu backward");
                      });
}

Tensor square(const Tensor& a) {
  CheckDefined(a, "square", "input");
  // Integers square exactly by multiplication; bool squares to int64, as in PyTorch.
  const Tensor x = a.dtype() == kBool ? CastRaw(a, kInt64) : a;
  Tensor out = IsIntegral(x.dtype()) ? BinaryRaw(BinaryOp::kMul, x, x, "square")
                                     : UnaryRaw(UnaryOp::kSquare, x, 0.0);
  if (NeedsGrad({a})) {
    Record("SquareBackward", {a}, out, [x = a.detach()](const Tensor& grad) {
      return std::vector<Tensor>{mul(grad, mul(x, 2.0))};
    });
  }
  return out;
}

Tensor relu(const Tensor& a) {
  CheckDefined(a, "relu", "input");
  TANDEM_CHECK(a.dtype() != kBool, "relu: not defined for bool tensors (as in PyTorch); ",
               "convert the input with .to(kFloat32) first");
  if (IsIntegral(a.dtype())) {
    return BinaryRaw(BinaryOp::kMaximum, a, FilledRaw({}, a.dtype(), a.device(), 0.0), "relu");
  }
  Tensor out = UnaryRaw(UnaryOp::kRelu, a, 0.0);
  if (NeedsGrad({a})) {
    Record("ReluBackward", {a}, out, [y = out.detach()](const Tensor& grad) {
      // relu's output is positive exactly where its input is.
      return std::vector<Tensor>{BinaryRaw(BinaryOp::kReluBackward, grad, y, "relu backward")};
    });
  }
  return out;
}

Tensor eq(const Tensor& a, const Tensor& b) { return Compare(a, b, BinaryOp::kEq, "eq"); }
Tensor ne(const Tensor& a, const Tensor& b) { return Compare(a, b, BinaryOp::kNe, "ne"); }
Tensor lt(const Tensor& a, const Tensor& b) { return Compare(a, b, BinaryOp::kLt, "lt"); }
Tensor le(const Tensor& a, const Tensor& b) { return Compare(a, b, BinaryOp::kLe, "le"); }
Tensor gt(const Tensor& a, const Tensor& b) { return Compare(a, b, BinaryOp::kGt, "gt"); }
Tensor ge(const Tensor& a, const Tensor& b) { return Compare(a, b, BinaryOp::kGe, "ge"); }

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator+(const Tensor& a, double b) { return add(a, b); }
Tensor operator-(const Tensor& a, double b) { return add(a, -b); }
Tensor operator*(const Tensor& a, double b) { return mul(a, b); }
// Multiplies by the reciprocal (exact for powers of two, within an ulp otherwise); an
// int64 tensor promotes to float32 unless 1/b is integral.
Tensor operator/(const Tensor& a, double b) {
  CheckDefined(a, "div", "a");
  return mul(FloatInput(a, "div"), 1.0 / b);
}
Tensor operator+(double a, const Tensor& b) { return add(b, a); }
Tensor operator-(double a, const Tensor& b) { return add(neg(b), a); }
Tensor operator*(double a, const Tensor& b) { return mul(b, a); }
Tensor operator-(const Tensor& a) { return neg(a); }

// ---- Reductions ----------------------------------------------------------------------------

namespace {

// What sum adds up: integral and bool inputs as int64, as PyTorch's sum (the backends keep
// an integral dtype, so an int32 or uint8 sum would wrap, and a bool one would stay bool).
Tensor SumInput(const Tensor& a) { return IsIntegral(a.dtype(), true) ? CastRaw(a, kInt64) : a; }

void CheckMeanInput(const Tensor& a) {
  TANDEM_CHECK(IsFloatingPoint(a.dtype()),
               "mean: could not infer the output dtype; the input must be floating-point "
               "(float32, float64, bfloat16 or float16) but is ",
               a.dtype(), " (as in PyTorch): convert it with .to(kFloat32) first");
}

}  // namespace

Tensor sum(const Tensor& a) {
  TANDEM_AUTOCAST(kFloat32, sum, a);
  CheckDefined(a, "sum", "input");
  Tensor out = SumAllRaw(SumInput(a));
  if (NeedsGrad({a})) {
    Record("SumBackward", {a}, out, [shape = a.shape()](const Tensor& grad) {
      return std::vector<Tensor>{ExpandGradRaw(grad, {}, shape)};
    });
  }
  return out;
}

Tensor sum(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  TANDEM_AUTOCAST(kFloat32, sum, a, dims, keepdim);
  CheckDefined(a, "sum", "input");
  const std::vector<int64_t> reduced = NormalizeDims(dims, a.dim(), "sum");
  const Shape kept_shape = ReducedShape(a.shape(), reduced, true);
  Tensor kept = ReduceRaw(SumInput(a), reduced, ReduceKind::kSum, "sum");
  Tensor out = keepdim ? kept : ViewRaw(kept, ReducedShape(a.shape(), reduced, false));
  if (NeedsGrad({a})) {
    Record("SumBackward", {a}, out, [kept_shape, shape = a.shape()](const Tensor& grad) {
      return std::vector<Tensor>{ExpandGradRaw(grad, kept_shape, shape)};
    });
  }
  return out;
}

Tensor mean(const Tensor& a) {
  CheckDefined(a, "mean", "input");
  CheckMeanInput(a);
  // Mean of no elements is NaN, as in PyTorch.
  const double scale = a.numel() > 0 ? 1.0 / static_cast<double>(a.numel())
                                     : std::numeric_limits<double>::quiet_NaN();
  return mul(sum(a), scale);
}

Tensor mean(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  CheckDefined(a, "mean", "input");
  CheckMeanInput(a);
  const std::vector<int64_t> reduced = NormalizeDims(dims, a.dim(), "mean");
  int64_t count = 1;
  for (int64_t d : reduced) count *= a.dim() == 0 ? 1 : a.shape()[d];
  const double scale =
      count > 0 ? 1.0 / static_cast<double>(count) : std::numeric_limits<double>::quiet_NaN();
  return mul(sum(a, reduced, keepdim), scale);
}

Tensor amax(const Tensor& a, int64_t dim, bool keepdim) {
  CheckDefined(a, "amax", "input");
  const std::vector<int64_t> reduced = {Dim(dim, a.dim(), "amax")};
  const Shape kept_shape = ReducedShape(a.shape(), reduced, true);
  Tensor kept = ReduceRaw(a, reduced, ReduceKind::kMax, "amax");
  Tensor out = keepdim ? kept : ViewRaw(kept, ReducedShape(a.shape(), reduced, false));
  if (NeedsGrad({a})) {
    Record("AmaxBackward", {a}, out,
           [kept_shape, reduced, x = a.detach(), m = kept.detach()](const Tensor& grad) {
             // Ties share the gradient evenly, as PyTorch's amax does (1/0 in x's dtype).
             const Tensor is_max = BinaryRaw(BinaryOp::kEq, x, m, "amax backward");
             const Tensor ties = sum(is_max, reduced, /*keepdim=*/true);
             const Tensor g = grad.shape() == kept_shape ? grad : grad.reshape(kept_shape);
             return std::vector<Tensor>{mul(is_max, div(g, ties))};
           });
  }
  return out;
}

namespace {

Tensor ArgReduce(const Tensor& a, int64_t dim, bool keepdim, ReduceKind op, const char* name) {
  CheckDefined(a, name, "input");
  const std::vector<int64_t> reduced = {Dim(dim, a.dim(), name)};
  Tensor kept = ReduceRaw(a, reduced, op, name);
  return keepdim ? kept : ViewRaw(kept, ReducedShape(a.shape(), reduced, false));
}

}  // namespace

Tensor argmax(const Tensor& a, int64_t dim, bool keepdim) {
  return ArgReduce(a, dim, keepdim, ReduceKind::kArgMax, "argmax");
}

Tensor argmin(const Tensor& a, int64_t dim, bool keepdim) {
  return ArgReduce(a, dim, keepdim, ReduceKind::kArgMin, "argmin");
}

// ---- Neural-network functions ------------------------------------------------------------

namespace {

Tensor SoftmaxImpl(const Tensor& a, int64_t dim, bool log) {
  const char* name = log ? "log_softmax" : "softmax";
  CheckDefined(a, name, "input");
  CheckFloat(a, name, "input");
  const int64_t d = Dim(dim, a.dim(), name);
  const Shape shape = a.dim() == 0 ? Shape{1} : a.shape();
  Tensor x = ContiguousRaw(a);
  Tensor out = NewTensor(a.shape(), a.dtype(), a.device());
  if (out.numel() > 0) {
    const auto split = static_cast<size_t>(d);
    BackendOf(a).Softmax(IndexOf(a), x.dtype(), log, DataPtr(out), DataPtr(x),
                         Product(shape, 0, split), shape[split],
                         Product(shape, split + 1, shape.size()));
  }
  if (NeedsGrad({a})) {
    Record(log ? "LogSoftmaxBackward" : "SoftmaxBackward", {a}, out,
           [log, d, y = out.detach()](const Tensor& grad) {
             const std::vector<int64_t> dims = {d};
             if (log) {
               // d log_softmax: g - softmax * sum(g).
               return std::vector<Tensor>{sub(grad, mul(exp(y), sum(grad, dims, true)))};
             }
             // d softmax: y * (g - sum(g * y)).
             return std::vector<Tensor>{mul(y, sub(grad, sum(mul(grad, y), dims, true)))};
           });
  }
  return out;
}

}  // namespace

Tensor softmax(const Tensor& a, int64_t dim) {
  TANDEM_AUTOCAST(kFloat32, softmax, a, dim);
  return SoftmaxImpl(a, dim, false);
}
Tensor log_softmax(const Tensor& a, int64_t dim) {
  TANDEM_AUTOCAST(kFloat32, log_softmax, a, dim);
  return SoftmaxImpl(a, dim, true);
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  TANDEM_AUTOCAST(kLowerPrecision, matmul, a, b);
  CheckDefined(a, "matmul", "a");
  CheckDefined(b, "matmul", "b");
  CheckSameDevice(a, "a", b, "b", "matmul");
  CheckSameFloat(a, "a", b, "b", "matmul");
  TANDEM_CHECK(a.dim() >= 1 && b.dim() >= 1,
               "matmul: both operands must have at least one dimension but a is ",
               ShapeToString(a.shape()), " and b is ", ShapeToString(b.shape()),
               "; use mul for a zero-dimensional (scalar) operand");
  if (a.dim() == 1 || b.dim() == 1) {
    // Vectors become a 1-row / 1-column matrix and that dimension is dropped afterwards.
    Tensor result = matmul(a.dim() == 1 ? a.unsqueeze(0) : a, b.dim() == 1 ? b.unsqueeze(1) : b);
    if (b.dim() == 1) result = result.squeeze(-1);
    if (a.dim() == 1) result = result.squeeze(b.dim() == 1 ? -1 : -2);
    return result;
  }
  TANDEM_CHECK(a.size(-1) == b.size(-2), "matmul: a is ", ShapeToString(a.shape()), " and b is ",
               ShapeToString(b.shape()), "; a.size(-1) (", a.size(-1), ") must equal b.size(-2) (",
               b.size(-2), ")");
  if (a.dim() > 3 || b.dim() > 3) {
    // Any number of batch dimensions, broadcast as in PyTorch; folded into one.
    const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
    if (b.dim() == 2) {
      // [..., m, k] x [k, n]: one big 2-D product over the folded rows.
      Shape out_shape(a.shape().begin(), a.shape().end() - 1);
      out_shape.push_back(n);
      return MatmulCore(a.reshape({-1, k}), b).reshape(out_shape);
    }
    const Shape batch_a(a.shape().begin(), a.shape().end() - 2);
    const Shape batch_b(b.shape().begin(), b.shape().end() - 2);
    Shape batch;
    try {
      batch = BroadcastShapes(batch_a, batch_b, "matmul");
    } catch (const Error&) {
      TANDEM_FAIL("matmul: a is ", ShapeToString(a.shape()), " and b is ", ShapeToString(b.shape()),
                  "; their batch dimensions ", ShapeToString(batch_a), " and ",
                  ShapeToString(batch_b), " cannot be broadcast together");
    }
    const int64_t count = NumElements(batch);
    const auto fold = [&](const Tensor& t, int64_t rows, int64_t cols) {
      Shape full = batch;
      full.push_back(rows);
      full.push_back(cols);
      return t.expand(full).reshape({count, rows, cols});
    };
    Shape out_shape = batch;
    out_shape.push_back(m);
    out_shape.push_back(n);
    const Tensor a3 = a.dim() == 2 ? a : fold(a, m, k);
    return MatmulCore(a3, fold(b, k, n)).reshape(out_shape);
  }
  if (a.dim() == 3 && b.dim() == 3 && a.size(0) != b.size(0)) {
    TANDEM_CHECK(a.size(0) == 1 || b.size(0) == 1, "matmul: a is ", ShapeToString(a.shape()),
                 " and b is ", ShapeToString(b.shape()), "; the batch sizes (", a.size(0), " and ",
                 b.size(0), ") must be equal or one of them 1");
    // A batch of one is shared by every batch of the other operand.
    return a.size(0) == 1 ? MatmulCore(a.squeeze(0), b) : MatmulCore(a, b.squeeze(0));
  }
  return MatmulCore(a, b);
}

namespace {

// a · b (2-D) computed in a's 16-bit dtype as a new float32 [m, n] tensor: the backend's GEMM
// into float where it has one, else the product in a's dtype, converted. b is in a's dtype or
// float32, rounded to a's dtype as CastRaw rounds: by the backend block by block where it can
// (no whole 16-bit copy of b), else by CastRaw here.
Tensor MatmulIntoFloatRaw(const Tensor& a, const Tensor& b) {
  const int64_t m = a.shape()[0], k = a.shape()[1], n = b.shape()[1];
  Tensor out = NewTensor({m, n}, kFloat32, a.device());
  if (out.numel() == 0) return out;
  const auto into_out = [&](const Tensor& rounded_or_not) {
    const GemmOperand lhs = MakeGemmOperand(a);
    const GemmOperand rhs = MakeGemmOperand(rounded_or_not);
    return BackendOf(out).GemmFloatOutput(IndexOf(out), a.dtype(), lhs.trans, rhs.trans, m, n, k,
                                          lhs.data, lhs.ld, rounded_or_not.dtype(), rhs.data,
                                          rhs.ld,
                                          static_cast<float*>(static_cast<void*>(DataPtr(out))), n);
  };
  if (k > 0 && b.dtype() != a.dtype() && into_out(b)) return out;
  const Tensor b_low = b.dtype() == a.dtype() ? b : CastRaw(b, a.dtype());
  if (k > 0 && into_out(b_low)) return out;
  return CastRaw(MatmulRaw(a, b_low), kFloat32);
}

// Note [Autocast linear]: under autocast, linear with a float32 weight is one node whose edges go
// to the uncast x, weight and bias, where PyTorch records a cast node per operand and a 16-bit
// linear:
//   - The weight (and bias) are cast outside the graph (CastWeightOutsideGraph), so the weight's
//     gradient comes out of the GEMM in float32 (Backend::GemmFloatOutput: 16-bit products
//     summed in float, never rounded to 16 bits) rather than as a 16-bit gradient converted
//     in another pass over a 16-bit copy of every weight's gradient (GPT-2: 248 MB).
//   - A float32 input that needs no gradient (the batch) is kept as the caller passed it: the
//     caller holds it through backward anyway, so keeping its 16-bit copy held a second copy
//     of the batch through the step. On the CPU it is never cast whole: forward rounds
//     kRoundedRowsAtOnce rows at a time, each block multiplied into its rows of y, and
//     backward's weight gradient has the backend round each block's own columns of it
//     (GemmFloatOutput with a float32 B): a whole 16-bit copy beside the first weight's cast
//     was what made a small model's 16-bit step hold more than its float32 step. An input that
//     needs a gradient (an activation) keeps its 16-bit copy, half its size. The first layer's
//     weight cast, which its gradient does not need, is then freed after the product, not
//     cached.
//   - The input's gradient is computed in 16 bits and converted to the input's dtype in the
//     node, as the cast node's backward would.

// Rows of a float32 batch rounded to 16 bits at once in AutocastLinear's forward: enough for a
// GEMM that still splits over a device's threads by columns, few enough that the block is
// small next to the weight's cast.
constexpr int64_t kRoundedRowsAtOnce = 64;

Tensor AutocastLinear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  const DType low = AutocastMode::GetDType(weight.device().type());
  const bool grad_x = NeedsGrad({x}), grad_w = NeedsGrad({weight});
  const bool has_bias = bias.defined(), grad_b = has_bias && NeedsGrad({bias});
  // Cached where the node keeps the cast for x's gradient anyway, and without grad (evaluation,
  // sampling), where nothing is kept and a guard may span many forwards.
  const Tensor w_low =
      autocast::CastWeightOutsideGraph(weight, /*keep=*/grad_x || !GradMode::IsEnabled());
  const Tensor b_low = has_bias ? autocast::CastWeightOutsideGraph(bias, /*keep=*/true) : bias;
  Tensor x_low, y;
  const int64_t in = weight.size(1), out_features = weight.size(0);
  const int64_t rows = NumElements(Shape(x.shape().begin(), x.shape().end() - 1));
  if (!grad_x && x.dtype() != low && rows > kRoundedRowsAtOnce &&
      x.device().type() == DeviceType::kCPU) {
    // A batch is rounded kRoundedRowsAtOnce rows at a time, each block multiplied into its
    // rows of y as soon as it is rounded. Not on a GPU: there one GEMM over the whole batch
    // beats many narrow ones, and the copy is small next to the device's memory.
    NoGradGuard no_grad;
    Shape out_shape(x.shape().begin(), x.shape().end() - 1);
    out_shape.push_back(out_features);
    const Tensor x2 = x.reshape({rows, in}), w_t = TransposedRaw(w_low);
    Tensor y2 = has_bias ? BroadcastCopyRaw(b_low, {rows, out_features}, low)
                         : NewTensor({rows, out_features}, low, x.device());
    for (int64_t r = 0; r < rows; r += kRoundedRowsAtOnce) {
      const int64_t count = std::min(kRoundedRowsAtOnce, rows - r);
      GemmIntoRaw(y2.narrow(0, r, count), CastRaw(x2.narrow(0, r, count), low), w_t,
                  has_bias ? 1.0 : 0.0);
    }
    y = y2.reshape(out_shape);
  } else {
    NoGradGuard no_grad;  // the node is recorded below
    x_low = x.to(low);
    y = linear(x_low, w_low, b_low);
  }
  const std::vector<Tensor> inputs =
      has_bias ? std::vector<Tensor>{x, weight, bias} : std::vector<Tensor>{x, weight};
  if (!NeedsGrad(inputs)) return y;
  const bool recast = grad_w && !grad_x && x.dtype() != low;
  Record("AutocastLinearBackward", inputs, y,
         [grad_x, grad_w, has_bias, grad_b, low, in, out_features, rows, x_dtype = x.dtype(),
          x_shape = x.shape(),
          sx = !grad_w  ? Tensor()
               : recast ? x.detach()
                        : x_low.reshape({rows, in}).detach(),
          sw = grad_x ? w_low : Tensor()](const Tensor& grad_y) {
           const Tensor grad = grad_y.reshape({rows, out_features});
           std::vector<Tensor> grads(2);
           if (grad_x) grads[0] = CastRaw(MatmulRaw(grad, sw), x_dtype).reshape(x_shape);
           if (grad_w) grads[1] = MatmulIntoFloatRaw(TransposedRaw(grad), sx.reshape({rows, in}));
           if (has_bias) {
             grads.push_back(grad_b
                                 ? CastRaw(ViewRaw(ReduceRaw(grad, {0}, ReduceKind::kSum, "linear"),
                                                   {out_features}),
                                           kFloat32)
                                 : Tensor());
           }
           return grads;
         });
  return y;
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  if (AutocastMode::IsAnyEnabled() && autocast::IsEligible(x) && autocast::IsEligible(weight) &&
      weight.dtype() == kFloat32 && (!bias.defined() || bias.dtype() == kFloat32) && x.dim() >= 1 &&
      weight.dim() == 2 && x.size(-1) == weight.size(1) &&
      (!bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0))) &&
      x.device() == weight.device() && (!bias.defined() || bias.device() == weight.device())) {
    return AutocastLinear(x, weight, bias);  // shapes checked: the node reshapes with them
  }
  TANDEM_AUTOCAST(kLowerPrecision, linear, x, weight, bias);
  CheckDefined(x, "linear", "x");
  CheckDefined(weight, "linear", "weight");
  CheckSameDevice(x, "x", weight, "weight", "linear");
  CheckSameFloat(x, "x", weight, "weight", "linear");
  TANDEM_CHECK(weight.dim() == 2, "linear: weight must be 2-D [out_features, in_features] but is ",
               ShapeToString(weight.shape()));
  TANDEM_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1), "linear: x is ",
               ShapeToString(x.shape()), " and weight is ", ShapeToString(weight.shape()),
               "; x.size(-1) must equal weight.size(1) (in_features = ", weight.size(1), ")");
  const int64_t in = weight.size(1), out_features = weight.size(0);
  if (bias.defined()) {
    CheckSameDevice(x, "x", bias, "bias", "linear");
    CheckSameFloat(x, "x", bias, "bias", "linear");
    TANDEM_CHECK(bias.dim() == 1 && bias.size(0) == out_features, "linear: bias must be [",
                 out_features, "] (out_features) but is ", ShapeToString(bias.shape()));
  }
  Shape out_shape(x.shape().begin(), x.shape().end() - 1);
  const int64_t rows = NumElements(out_shape);
  out_shape.push_back(out_features);
  const Tensor x2 = x.dim() == 2 ? x : x.reshape({rows, in});

  // y = x2 · weight^T (+ bias): the bias is broadcast into y first and Gemm adds onto it.
  Tensor y = bias.defined() ? BroadcastCopyRaw(bias, {rows, out_features}, x.dtype())
                            : NewTensor({rows, out_features}, x.dtype(), x.device());
  GemmIntoRaw(y, x2, TransposedRaw(weight), bias.defined() ? 1.0f : 0.0f);
  std::vector<Tensor> inputs = {x2, weight};
  if (bias.defined()) inputs.push_back(bias);
  if (NeedsGrad(inputs)) {
    const bool grad_x = NeedsGrad({x2}), grad_w = NeedsGrad({weight});
    const bool has_bias = bias.defined(), grad_b = has_bias && NeedsGrad({bias});
    Record("LinearBackward", inputs, y,
           // Only what the gradients need stays alive until backward: a first layer's input
           // needs no gradient, so its (autocast) weight is not kept.
           [grad_x, grad_w, has_bias, grad_b, sx = grad_w ? x2.detach() : Tensor(),
            sw = grad_x ? weight.detach() : Tensor()](const Tensor& grad) {
             std::vector<Tensor> grads = {grad_x ? MatmulRaw(grad, sw) : Tensor(),
                                          grad_w ? MatmulRaw(TransposedRaw(grad), sx) : Tensor()};
             if (has_bias) {
               grads.push_back(grad_b ? ViewRaw(ReduceRaw(grad, {0}, ReduceKind::kSum, "linear"),
                                                {grad.shape()[1]})
                                      : Tensor());
             }
             return grads;
           });
  }
  return x.dim() == 2 ? y : y.reshape(out_shape);
}

Tensor nll_loss(const Tensor& log_probs, const Tensor& targets) {
  TANDEM_AUTOCAST(kFloat32, nll_loss, log_probs, targets);
  CheckClassification(log_probs, targets, "nll_loss", "log_probs");
  return NllLossCore(log_probs, targets);
}

Tensor cross_entropy(const Tensor& logits, const Tensor& targets) {
  TANDEM_AUTOCAST(kFloat32, cross_entropy, logits, targets);
  CheckClassification(logits, targets, "cross_entropy", "logits");
  Tensor out, log_probs;
  {
    NoGradGuard no_grad;  // one node for the whole loss, recorded below
    log_probs = log_softmax(logits, 1);
    out = NllLossCore(log_probs, targets);
  }
  if (NeedsGrad({logits})) {
    // d loss / d logits = (softmax(logits) - onehot(targets)) * grad / rows, written in two
    // streaming passes over [rows, cols] (exp, then the scale in place) and a scatter of one
    // element per row, where log_softmax's and nll_loss's backwards took six passes and four
    // [rows, cols] buffers.
    const int64_t rows = logits.size(0), cols = logits.size(1);
    Record("CrossEntropyBackward", {logits}, out,
           [lp = log_probs.detach(), idx = ContiguousRaw(targets), rows, cols](const Tensor& grad) {
             Tensor grad_logits = NewTensor({rows, cols}, lp.dtype(), lp.device());
             if (grad_logits.numel() == 0) return std::vector<Tensor>{grad_logits};
             Backend& backend = BackendOf(lp);
             const int device = IndexOf(lp);
             const Tensor per_row = UnaryRaw(UnaryOp::kMulScalar, CastRaw(grad, lp.dtype()),
                                             1.0 / static_cast<double>(rows));
             backend.Unary(device, UnaryOp::kExp, ToKernel(grad_logits), ToKernel(lp), 0.0);
             backend.Binary(device, BinaryOp::kMul, ToKernel(grad_logits), ToKernel(grad_logits),
                            ToKernelBroadcast(per_row, {rows, cols}));
             const Tensor minus =
                 BroadcastCopyRaw(UnaryRaw(UnaryOp::kNeg, per_row, 0.0), {rows}, lp.dtype());
             backend.ScatterAddColumns(device, lp.dtype(), DataPtr(grad_logits), DataPtr(minus),
                                       Int64Ptr(idx), rows, cols);
             return std::vector<Tensor>{grad_logits};
           });
  }
  return out;
}

Tensor mse_loss(const Tensor& input, const Tensor& target) {
  TANDEM_AUTOCAST(kFloat32, mse_loss, input, target);
  CheckDefined(input, "mse_loss", "input");
  CheckDefined(target, "mse_loss", "target");
  CheckSameDevice(input, "input", target, "target", "mse_loss");
  CheckFloat(input, "mse_loss", "input");
  TANDEM_CHECK(input.shape() == target.shape(), "mse_loss: input is ", ShapeToString(input.shape()),
               " and target is ", ShapeToString(target.shape()),
               "; they must have the same shape (broadcasting here usually hides a bug: ",
               "reshape one of them)");
  return mean(square(sub(input, target)));
}

namespace {

// conv2d puts the images side by side in one GEMM when each group reads at least this many
// column rows (C/groups * kh * kw), and runs one GEMM per image otherwise.
constexpr int64_t kBatchedConvMinRows = 32;

// conv2d's backward with [N, K, L] columns (one GEMM per image), for a non-empty problem.
std::vector<Tensor> PerImageConv2dBackward(const Conv2dGeometry& g, int64_t groups, bool grad_x,
                                           bool grad_w, bool has_bias, bool grad_b,
                                           int64_t out_channels, const Tensor& sx, const Tensor& sw,
                                           const Shape& weight_shape, const Tensor& grad_output) {
  const int64_t batch = g.batch, plane = g.out_h() * g.out_w();
  const int64_t patch = g.channels * g.kernel_h * g.kernel_w;
  const int64_t group_out = out_channels / groups, group_patch = patch / groups;
  Backend& backend = BackendOf(grad_output);
  const DType dtype = grad_output.dtype();
  const int index = IndexOf(grad_output);
  const Tensor grad = ContiguousRaw(grad_output);
  Tensor grad_input, grad_weight, grad_bias;
  if (grad_x) {
    // columns_n[group] [K_g, L] = W_g^T [K_g, O_g] · grad_n[group] [O_g, L], then folded back
    // (Col2Im overwrites every element).
    Tensor grad_columns = NewTensor({batch, patch, plane}, dtype, grad_output.device());
    for (int64_t group = 0; group < groups; ++group) {
      backend.Gemm(index, dtype, true, false, group_patch, plane, group_out, 1.0f,
                   DataPtr(sw) + group * group_out * group_patch, group_patch, 0,
                   DataPtr(grad) + group * group_out * plane, plane, out_channels * plane, 0.0f,
                   DataPtr(grad_columns) + group * group_patch * plane, plane, patch * plane,
                   batch);
    }
    grad_input =
        NewTensor(Shape{g.batch, g.channels, g.height, g.width}, dtype, grad_output.device());
    backend.Col2Im(index, dtype, g, DataPtr(grad_columns), DataPtr(grad_input));
  }
  if (grad_w) {
    // Per image: grad_n[group] [O_g, L] · columns_n[group]^T [L, K_g]; summed over images.
    Tensor columns = NewTensor({batch, patch, plane}, dtype, grad_output.device());
    backend.Im2Col(index, dtype, g, DataPtr(sx), DataPtr(columns));
    Tensor per_image = NewTensor({batch, out_channels, group_patch}, dtype, grad_output.device());
    for (int64_t group = 0; group < groups; ++group) {
      backend.Gemm(index, dtype, false, true, group_out, group_patch, plane, 1.0f,
                   DataPtr(grad) + group * group_out * plane, plane, out_channels * plane,
                   DataPtr(columns) + group * group_patch * plane, plane, patch * plane, 0.0f,
                   DataPtr(per_image) + group * group_out * group_patch, group_patch,
                   out_channels * group_patch, batch);
    }
    grad_weight = ViewRaw(ReduceRaw(per_image, {0}, ReduceKind::kSum, "conv2d"), weight_shape);
  }
  if (grad_b) {
    grad_bias = ViewRaw(ReduceRaw(grad, {0, 2, 3}, ReduceKind::kSum, "conv2d"), {out_channels});
  }
  std::vector<Tensor> grads = {grad_input, grad_weight};
  if (has_bias) grads.push_back(grad_bias);
  return grads;
}

}  // namespace

Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias,
              std::vector<int64_t> stride, std::vector<int64_t> padding,
              std::vector<int64_t> dilation, int64_t groups) {
  TANDEM_AUTOCAST(kLowerPrecision, conv2d, input, weight, bias, stride, padding, dilation, groups);
  CheckImageInput(input, "conv2d");
  CheckDefined(weight, "conv2d", "weight");
  CheckSameDevice(input, "input", weight, "weight", "conv2d");
  CheckSameFloat(input, "input", weight, "weight", "conv2d");
  TANDEM_CHECK(weight.dim() == 4,
               "conv2d: weight must be 4-D [out_channels, in_channels / groups, ",
               "kh, kw] but is ", ShapeToString(weight.shape()));
  TANDEM_CHECK(groups > 0, "conv2d: groups must be positive but is ", groups);
  TANDEM_CHECK(input.size(1) == weight.size(1) * groups, "conv2d: input has ", input.size(1),
               " channels but weight expects ", weight.size(1) * groups, " (weight is ",
               ShapeToString(weight.shape()), ", input is ", ShapeToString(input.shape()),
               ", groups=", groups, ": weight.size(1) * groups channels)");
  const int64_t out_channels = weight.size(0);
  TANDEM_CHECK(out_channels % groups == 0, "conv2d: out_channels (weight.size(0) = ", out_channels,
               ") must be divisible by groups (", groups, ")");
  if (bias.defined()) {
    CheckSameDevice(input, "input", bias, "bias", "conv2d");
    CheckSameFloat(input, "input", bias, "bias", "conv2d");
    TANDEM_CHECK(bias.dim() == 1 && bias.size(0) == out_channels, "conv2d: bias must be [",
                 out_channels, "] (out_channels) but is ", ShapeToString(bias.shape()));
  }
  const auto [stride_h, stride_w] = Pair(stride, "conv2d", "stride");
  const auto [pad_h, pad_w] = Pair(padding, "conv2d", "padding");
  const auto [dilation_h, dilation_w] = Pair(dilation, "conv2d", "dilation");
  TANDEM_CHECK(stride_h > 0 && stride_w > 0, "conv2d: stride must be positive but is [", stride_h,
               ", ", stride_w, "]");
  TANDEM_CHECK(pad_h >= 0 && pad_w >= 0, "conv2d: padding must be non-negative but is [", pad_h,
               ", ", pad_w, "]");
  TANDEM_CHECK(dilation_h > 0 && dilation_w > 0, "conv2d: dilation must be positive but is [",
               dilation_h, ", ", dilation_w, "]");
  Conv2dGeometry g =
      Conv2dGeometry::Make(input.size(0), input.size(1), input.size(2), input.size(3),
                           weight.size(2), weight.size(3), stride_h, stride_w, pad_h, pad_w);
  g.dilation_h = dilation_h;
  g.dilation_w = dilation_w;
  // Two layouts of the im2col columns (K = C*kh*kw rows, L = out_h*out_w):
  //   - [K, N, L], every image side by side: each product is one large GEMM over the whole
  //     batch (batched over groups), at the cost of permuting the output and its gradient
  //     between [O, N, L] and [N, O, L]. It wins when each group reads many rows (K_g).
  //   - [N, K, L], one small GEMM per image: no permutes, so it wins for few rows (the first
  //     layer of an image model: 1 channel, 3x3 = 9 rows), where the GEMMs are memory-bound.
  g.batch_in_columns = g.channels / groups * g.kernel_h * g.kernel_w >= kBatchedConvMinRows;
  TANDEM_CHECK(
      g.height + 2 * pad_h >= g.span_h() && g.width + 2 * pad_w >= g.span_w(), "conv2d: input is ",
      ShapeToString(input.shape()), " (", g.height, "x", g.width, " with padding [", pad_h, ", ",
      pad_w, "]) but the kernel is ", g.kernel_h, "x", g.kernel_w,
      dilation_h == 1 && dilation_w == 1 ? std::string()
                                         : " (spanning " + std::to_string(g.span_h()) + "x" +
                                               std::to_string(g.span_w()) + " with dilation)",
      "; the padded input must be at least as large as the kernel");

  const int64_t batch = g.batch, oh = g.out_h(), ow = g.out_w();
  const int64_t plane = oh * ow, patch = g.channels * g.kernel_h * g.kernel_w;
  // Per group: O_g output channels, each reading K_g column rows.
  const int64_t group_out = out_channels / groups, group_patch = patch / groups;
  const int64_t cols = batch * plane;  // columns of the [K, N*L] matrix
  const bool work = batch > 0 && plane > 0 && patch > 0 && out_channels > 0;
  Tensor x = ContiguousRaw(input);
  Tensor w = ContiguousRaw(weight);
  Backend& backend = BackendOf(x);
  const DType dtype = x.dtype();
  const int index = IndexOf(x);

  Tensor out;
  // The backend's own convolution first (oneDNN's on the CPU for bfloat16): im2col's columns
  // are K times the image, and in bfloat16 building them costs more than the GEMM saves.
  bool direct = false;
  if (work && groups == 1) {
    const Tensor b = bias.defined() ? ContiguousRaw(bias) : Tensor();
    out = NewTensor({batch, out_channels, oh, ow}, dtype, x.device());
    direct =
        backend.Conv2dForward(index, dtype, g, out_channels, DataPtr(x), DataPtr(w),
                              b.defined() ? static_cast<void*>(DataPtr(b)) : nullptr, DataPtr(out));
    if (!direct) out = Tensor();  // not held while the im2col path below runs
  }
  if (direct) {
    // Computed above.
  } else if (work && !g.batch_in_columns) {
    Tensor columns = NewTensor({batch, patch, plane}, x.dtype(), x.device());
    backend.Im2Col(index, dtype, g, DataPtr(x), DataPtr(columns));
    if (bias.defined()) {
      const Tensor bias_column =
          MakeView(bias, {out_channels, 1}, {bias.strides()[0], 1}, bias.storage_offset());
      out = BroadcastCopyRaw(bias_column, {batch, out_channels, plane}, x.dtype());
    } else {
      out = NewTensor({batch, out_channels, plane}, x.dtype(), x.device());
    }
    // out_n[group] [O_g, L] (+)= W_g [O_g, K_g] · columns_n[group] [K_g, L], every image n.
    for (int64_t group = 0; group < groups; ++group) {
      backend.Gemm(index, dtype, false, false, group_out, plane, group_patch, 1.0f,
                   DataPtr(w) + group * group_out * group_patch, group_patch, 0,
                   DataPtr(columns) + group * group_patch * plane, plane, patch * plane,
                   bias.defined() ? 1.0f : 0.0f, DataPtr(out) + group * group_out * plane, plane,
                   out_channels * plane, batch);
    }
    out = ViewRaw(out, {batch, out_channels, oh, ow});
  } else if (work) {
    Tensor columns = NewTensor({patch, batch, plane}, x.dtype(), x.device());
    backend.Im2Col(index, dtype, g, DataPtr(x), DataPtr(columns));
    // product_g [O_g, N*L] = W_g [O_g, K_g] · columns_g [K_g, N*L], one GEMM per group.
    Tensor product = NewTensor({out_channels, batch, plane}, x.dtype(), x.device());
    backend.Gemm(index, dtype, false, false, group_out, cols, group_patch, 1.0f, DataPtr(w),
                 group_patch, group_out * group_patch, DataPtr(columns), cols, group_patch * cols,
                 0.0f, DataPtr(product), cols, group_out * cols, groups);
    // [O, N, L] -> [N, O, L], adding the bias in the same pass.
    const Tensor permuted = MakeView(product, {batch, out_channels, plane},
                                     {plane, batch * plane, 1}, product.storage_offset());
    if (bias.defined()) {
      const Tensor bias_column =
          MakeView(bias, {1, out_channels, 1}, {0, bias.strides()[0], 0}, bias.storage_offset());
      out = BinaryRaw(BinaryOp::kAdd, permuted, bias_column, "conv2d");
    } else {
      out = ContiguousRaw(permuted);
    }
    out = ViewRaw(out, {batch, out_channels, oh, ow});
  } else if (bias.defined()) {
    const Tensor bias_column =
        MakeView(bias, {out_channels, 1}, {bias.strides()[0], 1}, bias.storage_offset());
    out = ViewRaw(BroadcastCopyRaw(bias_column, {batch, out_channels, plane}, x.dtype()),
                  {batch, out_channels, oh, ow});
  } else {
    out = FilledRaw({batch, out_channels, oh, ow}, x.dtype(), x.device(), 0.0);
  }
  std::vector<Tensor> inputs = {input, weight};
  if (bias.defined()) inputs.push_back(bias);
  if (NeedsGrad(inputs)) {
    const bool grad_x = NeedsGrad({input}), grad_w = NeedsGrad({weight});
    const bool has_bias = bias.defined(), grad_b = has_bias && NeedsGrad({bias});
    // Only what the gradients need stays alive until backward: x for the weight's, w for
    // the input's (an image model's first layer needs no input gradient).
    Record(
        "Conv2dBackward", inputs, out,
        [g, groups, work, grad_x, grad_w, has_bias, grad_b, out_channels,
         sx = grad_w ? x.detach() : Tensor(), sw = grad_x ? w.detach() : Tensor(),
         input_shape = input.shape(), input_device = input.device(),
         weight_shape = weight.shape()](const Tensor& grad_output) {
          const int64_t batch = g.batch, plane = g.out_h() * g.out_w();
          const int64_t patch = g.channels * g.kernel_h * g.kernel_w;
          const int64_t group_out = out_channels / groups, group_patch = patch / groups;
          const int64_t cols = batch * plane;
          Backend& backend = BackendOf(grad_output);
          const DType dtype = grad_output.dtype();
          const int index = IndexOf(grad_output);
          if (work && groups == 1) {
            // The backend's own kernels where it has them, as in the forward.
            const Tensor grad = ContiguousRaw(grad_output);
            Tensor grad_input, grad_weight, grad_bias;
            bool done = true;
            if (grad_x) {
              grad_input = NewTensor(input_shape, dtype, input_device);
              done = backend.Conv2dBackwardData(index, dtype, g, out_channels, DataPtr(grad),
                                                DataPtr(sw), DataPtr(grad_input));
            }
            if (done && grad_w) {
              grad_weight = NewTensor(weight_shape, dtype, input_device);
              if (grad_b) grad_bias = NewTensor({out_channels}, dtype, input_device);
              done = backend.Conv2dBackwardWeights(
                  index, dtype, g, out_channels, DataPtr(sx), DataPtr(grad), DataPtr(grad_weight),
                  grad_b ? static_cast<void*>(DataPtr(grad_bias)) : nullptr);
            }
            if (done) {
              if (grad_b && !grad_bias.defined()) {
                grad_bias =
                    ViewRaw(ReduceRaw(grad, {0, 2, 3}, ReduceKind::kSum, "conv2d"), {out_channels});
              }
              std::vector<Tensor> grads = {grad_input, grad_weight};
              if (has_bias) grads.push_back(grad_bias);
              return grads;
            }
          }
          if (work && !g.batch_in_columns) {
            return PerImageConv2dBackward(g, groups, grad_x, grad_w, has_bias, grad_b, out_channels,
                                          sx, sw, weight_shape, grad_output);
          }
          // The gradient as [O, N*L], the layout of the forward's product.
          Tensor grad;
          if (work) {
            const Tensor g3 = ContiguousRaw(grad_output);
            grad = ContiguousRaw(MakeView(g3, {out_channels, batch, plane},
                                          {plane, out_channels * plane, 1}, g3.storage_offset()));
          }
          Tensor grad_input, grad_weight, grad_bias;
          if (grad_x) {
            // Col2Im overwrites every element, so only an empty problem needs a fill.
            grad_input = work ? NewTensor(input_shape, dtype, input_device)
                              : FilledRaw(input_shape, dtype, input_device, 0.0);
            if (work) {
              // columns_g [K_g, N*L] = W_g^T [K_g, O_g] · grad_g [O_g, N*L], then folded back.
              Tensor grad_columns = NewTensor({patch, batch, plane}, dtype, input_device);
              backend.Gemm(index, dtype, true, false, group_patch, cols, group_out, 1.0f,
                           DataPtr(sw), group_patch, group_out * group_patch, DataPtr(grad), cols,
                           group_out * cols, 0.0f, DataPtr(grad_columns), cols, group_patch * cols,
                           groups);
              backend.Col2Im(index, dtype, g, DataPtr(grad_columns), DataPtr(grad_input));
            }
          }
          if (grad_w) {
            if (work) {
              // W_g [O_g, K_g] = grad_g [O_g, N*L] · columns_g^T [N*L, K_g]: the sum over
              // images is the GEMM's inner dimension.
              Tensor columns = NewTensor({patch, batch, plane}, dtype, input_device);
              backend.Im2Col(index, dtype, g, DataPtr(sx), DataPtr(columns));
              grad_weight = NewTensor(weight_shape, dtype, input_device);
              backend.Gemm(index, dtype, false, true, group_out, group_patch, cols, 1.0f,
                           DataPtr(grad), cols, group_out * cols, DataPtr(columns), cols,
                           group_patch * cols, 0.0f, DataPtr(grad_weight), group_patch,
                           group_out * group_patch, groups);
            } else {
              grad_weight = FilledRaw(weight_shape, dtype, input_device, 0.0);
            }
          }
          if (grad_b) {
            grad_bias =
                work ? ViewRaw(ReduceRaw(grad, {1, 2}, ReduceKind::kSum, "conv2d"), {out_channels})
                     : FilledRaw({out_channels}, dtype, input_device, 0.0);
          }
          std::vector<Tensor> grads = {grad_input, grad_weight};
          if (has_bias) grads.push_back(grad_bias);
          return grads;
        });
  }
  return out;
}

namespace {

// The checked geometry of a 2-D pooling window over `input` (max_pool2d, avg_pool2d): an
// empty stride means the kernel size, as in PyTorch.
Conv2dGeometry PoolGeometry(const Tensor& input, const std::vector<int64_t>& kernel_size,
                            const std::vector<int64_t>& stride, const std::vector<int64_t>& padding,
                            bool ceil_mode, const char* name) {
  CheckImageInput(input, name);
  const auto [kernel_h, kernel_w] = Pair(kernel_size, name, "kernel_size");
  const auto [stride_h, stride_w] = stride.empty() ? std::pair<int64_t, int64_t>{kernel_h, kernel_w}
                                                   : Pair(stride, name, "stride");
  const auto [pad_h, pad_w] = Pair(padding, name, "padding");
  TANDEM_CHECK(kernel_h > 0 && kernel_w > 0, name, ": kernel_size must be positive but is [",
               kernel_h, ", ", kernel_w, "]");
  TANDEM_CHECK(stride_h > 0 && stride_w > 0, name, ": stride must be positive but is [", stride_h,
               ", ", stride_w, "]");
  TANDEM_CHECK(pad_h >= 0 && pad_w >= 0 && 2 * pad_h <= kernel_h && 2 * pad_w <= kernel_w, name,
               ": padding must be between 0 and half the kernel size, but padding is [", pad_h,
               ", ", pad_w, "] for a ", kernel_h, "x", kernel_w, " kernel");
  Conv2dGeometry g =
      Conv2dGeometry::Make(input.size(0), input.size(1), input.size(2), input.size(3), kernel_h,
                           kernel_w, stride_h, stride_w, pad_h, pad_w);
  g.ceil_mode = ceil_mode;
  TANDEM_CHECK(g.height + 2 * pad_h >= kernel_h && g.width + 2 * pad_w >= kernel_w, name,
               ": input is ", ShapeToString(input.shape()), " (", g.height, "x", g.width,
               " with padding [", pad_h, ", ", pad_w, "]) but the window is ", kernel_h, "x",
               kernel_w, "; the padded input must be at least as large as the window");
  return g;
}

}  // namespace

Tensor max_pool2d(const Tensor& input, std::vector<int64_t> kernel_size,
                  std::vector<int64_t> stride, std::vector<int64_t> padding, bool ceil_mode) {
  const Conv2dGeometry g =
      PoolGeometry(input, kernel_size, stride, padding, ceil_mode, "max_pool2d");
  const Shape out_shape = {g.batch, g.channels, g.out_h(), g.out_w()};
  Tensor x = ContiguousRaw(input);
  Tensor out = NewTensor(out_shape, x.dtype(), x.device());
  Tensor argmax = NewTensor(out_shape, kInt64, x.device());
  if (out.numel() > 0) {
    BackendOf(x).MaxPool2d(IndexOf(x), x.dtype(), g, DataPtr(x), DataPtr(out), Int64Ptr(argmax));
  }
  if (NeedsGrad({input})) {
    Record("MaxPool2dBackward", {input}, out,
           [g, argmax, input_shape = input.shape()](const Tensor& grad_output) {
             const Tensor grad = ContiguousRaw(grad_output);
             Tensor grad_input = NewTensor(input_shape, grad.dtype(), grad.device());
             if (grad.numel() > 0) {
               BackendOf(grad).MaxPool2dBackward(IndexOf(grad), grad.dtype(), g, DataPtr(grad),
                                                 Int64Ptr(argmax), DataPtr(grad_input));
             } else if (grad_input.numel() > 0) {
               BackendOf(grad).Fill(IndexOf(grad), ToKernel(grad_input), 0.0);
             }
             return std::vector<Tensor>{grad_input};
           });
  }
  return out;
}

Tensor avg_pool2d(const Tensor& input, std::vector<int64_t> kernel_size,
                  std::vector<int64_t> stride, std::vector<int64_t> padding, bool ceil_mode,
                  bool count_include_pad) {
  const Conv2dGeometry g =
      PoolGeometry(input, kernel_size, stride, padding, ceil_mode, "avg_pool2d");
  const Shape out_shape = {g.batch, g.channels, g.out_h(), g.out_w()};
  Tensor x = ContiguousRaw(input);
  Tensor out = NewTensor(out_shape, x.dtype(), x.device());
  if (out.numel() > 0) {
    BackendOf(x).AvgPool2d(IndexOf(x), x.dtype(), g, count_include_pad, DataPtr(x), DataPtr(out));
  }
  if (NeedsGrad({input})) {
    Record("AvgPool2dBackward", {input}, out,
           [g, count_include_pad, input_shape = input.shape()](const Tensor& grad_output) {
             const Tensor grad = ContiguousRaw(grad_output);
             Tensor grad_input = NewTensor(input_shape, grad.dtype(), grad.device());
             if (grad_input.numel() > 0) {
               BackendOf(grad).AvgPool2dBackward(IndexOf(grad), grad.dtype(), g, count_include_pad,
                                                 DataPtr(grad), DataPtr(grad_input));
             }
             return std::vector<Tensor>{grad_input};
           });
  }
  return out;
}

Tensor adaptive_avg_pool2d(const Tensor& input, std::vector<int64_t> output_size) {
  CheckImageInput(input, "adaptive_avg_pool2d");
  const auto [out_h, out_w] = Pair(output_size, "adaptive_avg_pool2d", "output_size");
  TANDEM_CHECK(out_h > 0 && out_w > 0, "adaptive_avg_pool2d: output_size must be positive but is [",
               out_h, ", ", out_w, "]");
  const int64_t height = input.size(2), width = input.size(3);
  TANDEM_CHECK(height > 0 && width > 0, "adaptive_avg_pool2d: input is ",
               ShapeToString(input.shape()),
               "; its images must have at least one pixel (height and width > 0)");
  const int64_t planes = input.size(0) * input.size(1);
  Tensor x = ContiguousRaw(input);
  Tensor out = NewTensor({input.size(0), input.size(1), out_h, out_w}, x.dtype(), x.device());
  if (planes > 0) {
    BackendOf(x).AdaptiveAvgPool2d(IndexOf(x), x.dtype(), planes, height, width, out_h, out_w,
                                   DataPtr(x), DataPtr(out));
  }
  if (NeedsGrad({input})) {
    Record("AdaptiveAvgPool2dBackward", {input}, out,
           [planes, height, width, out_h = out_h, out_w = out_w,
            input_shape = input.shape()](const Tensor& grad_output) {
             const Tensor grad = ContiguousRaw(grad_output);
             Tensor grad_input = NewTensor(input_shape, grad.dtype(), grad.device());
             if (planes > 0) {
               BackendOf(grad).AdaptiveAvgPool2dBackward(IndexOf(grad), grad.dtype(), planes,
                                                         height, width, out_h, out_w, DataPtr(grad),
                                                         DataPtr(grad_input));
             }
             return std::vector<Tensor>{grad_input};
           });
  }
  return out;
}

Tensor dropout(const Tensor& input, double p, bool training, Generator* gen) {
  CheckDefined(input, "dropout", "input");
  CheckFloat(input, "dropout", "input");
  TANDEM_CHECK(p >= 0.0 && p <= 1.0, "dropout: p (the probability of zeroing an element) must ",
               "be in [0, 1] but is ", p);
  if (!training || p == 0.0) return input;
  // p = 1 zeroes everything (NaN * 0 stays NaN, and the gradient is 0), as PyTorch does.
  if (p == 1.0) return mul(input, FilledRaw({}, input.dtype(), input.device(), 0.0));
  // The input's device draws from its own default generator (see "Random numbers" in
  // tensor/tensor.h), so replicas on different devices never race for one stream.
  Generator& generator = gen != nullptr ? *gen : default_generator(input.device());
  const int64_t n = input.numel();
  const GeneratorState claimed = generator.Claim(static_cast<uint64_t>(n));
  const uint64_t seed = claimed.seed;
  const uint64_t offset = claimed.offset;
  // 16-bit inputs draw and scale their mask in float32, as PyTorch's fused dropout computes
  // in float: the same seed keeps the same elements whatever the dtype (a uniform rounded to
  // bfloat16 would move elements across p), and the kept values are rounded once.
  const DType mask_dtype = IsReducedFloatingPoint(input.dtype()) ? kFloat32 : input.dtype();
  Tensor mask = NewTensor(input.shape(), mask_dtype, input.device());
  if (n > 0) {
    Backend& backend = BackendOf(input);
    const int index = IndexOf(input);
    backend.RandomUniform(index, mask.dtype(), DataPtr(mask), n, seed, offset, 0.0f, 1.0f);
    // Keep where u >= p (probability 1 - p), scaled so that the expectation is unchanged.
    backend.Unary(index, UnaryOp::kGeScalar, ToKernel(mask), ToKernel(mask), p);
    backend.Unary(index, UnaryOp::kMulScalar, ToKernel(mask), ToKernel(mask), 1.0 / (1.0 - p));
  }
  Tensor out = CastRaw(BinaryRaw(BinaryOp::kMul, CastRaw(input, mask_dtype), mask, "dropout"),
                       input.dtype());
  if (NeedsGrad({input})) {
    Record("DropoutBackward", {input}, out, [mask](const Tensor& grad) {
      return std::vector<Tensor>{mul(grad, mask).to(grad.dtype())};
    });
  }
  return out;
}

// ---- Joining -------------------------------------------------------------------------------

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
    Record("CatBackward", tensors, out, [d, needed, shapes, dtypes, starts](const Tensor& grad) {
      std::vector<Tensor> grads(shapes.size());
      for (size_t i = 0; i < shapes.size(); ++i) {
        if (!needed[i]) continue;
        // A view of the gradient's slice (the engine copies before it accumulates), in the
        // input's own dtype when cat promoted it.
        grads[i] = CastRaw(MakeView(grad, shapes[i], grad.strides(),
                                    grad.storage_offset() + starts[i] * grad.strides()[d]),
                           dtypes[i]);
      }
      return grads;
    });
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

// ---- Selection and indexing ------------------------------------------------------------------

namespace {

// x where mask (0/1 in x's dtype, broadcast) is 1, exactly 0 elsewhere (no NaN * 0).
Tensor KeepWhereRaw(const Tensor& x, const Tensor& mask, const char* name) {
  return BinaryRaw(BinaryOp::kReluBackward, x, CastRaw(mask, x.dtype()), name);
}

// Checks int64 `index` values lie in [0, size), on any device (two reductions, one read).
void CheckIndexRange(const Tensor& index, int64_t size, int64_t dim, const char* op) {
  if (index.numel() == 0) return;
  const Tensor flat = ViewRaw(ContiguousRaw(index), {index.numel()});
  const Tensor largest = ViewRaw(ReduceRaw(flat, {0}, ReduceKind::kMax, op), {1});
  const Tensor smallest = ViewRaw(ReduceRaw(flat, {0}, ReduceKind::kMin, op), {1});
  const std::vector<int64_t> range = cat({smallest, largest}).to_vector<int64_t>();
  TANDEM_CHECK(range[0] >= 0 && range[1] < size, op, ": index values must be in [0, ", size,
               ") (the size of dimension ", dim, ") but range over [", range[0], ", ", range[1],
               "]");
}

}  // namespace

Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b) {
  CheckDefined(condition, "where", "condition");
  CheckSameDevice(condition, "condition", a, "a", "where");
  TANDEM_CHECK(condition.dtype() == kBool, "where: the condition must be a bool tensor (as in ",
               "PyTorch) but is ", condition.dtype(),
               "; comparisons (gt, eq, ...) give bool, or convert with .to(kBool) (nonzero is "
               "true)");
  const Promoted p = PromoteBinary(a, b, "where");
  const Shape shape =
      BroadcastShapes(condition.shape(), BroadcastShapes(a.shape(), b.shape(), "where"), "where");
  // Bool values are selected as uint8 (0/1), which has arithmetic, and converted back.
  const DType result = p.a.dtype();
  const DType work = result == kBool ? kUInt8 : result;
  // 1 where the condition holds, in the working dtype.
  const Tensor take_a = CastRaw(condition, work);
  const Tensor take_b = CastRaw(
      CompareRaw(BinaryOp::kEq, take_a, FilledRaw({}, work, condition.device(), 0.0), "where"),
      work);
  const Tensor from_a = KeepWhereRaw(BroadcastCopyRaw(p.a, shape, work), take_a, "where");
  const Tensor from_b = KeepWhereRaw(BroadcastCopyRaw(p.b, shape, work), take_b, "where");
  Tensor out = CastRaw(BinaryRaw(BinaryOp::kAdd, from_a, from_b, "where"), result);
  if (NeedsGrad({a, b})) {
    const bool grad_a = NeedsGrad({a}), grad_b = NeedsGrad({b});
    Record("WhereBackward", {a, b}, out,
           [grad_a, grad_b, take_a, take_b, sa = a.shape(), sb = b.shape()](const Tensor& grad) {
             return std::vector<Tensor>{
                 grad_a ? sum_to(KeepWhereRaw(grad, take_a, "where backward"), sa) : Tensor(),
                 grad_b ? sum_to(KeepWhereRaw(grad, take_b, "where backward"), sb) : Tensor()};
           });
  }
  return out;
}

Tensor masked_fill(const Tensor& input, const Tensor& mask, double value) {
  CheckDefined(input, "masked_fill", "input");
  CheckDefined(mask, "masked_fill", "mask");
  TANDEM_CHECK(mask.dtype() == kBool, "masked_fill: the mask must be a bool tensor (as in ",
               "PyTorch) but is ", mask.dtype(),
               "; comparisons (eq, gt, ...) give bool, or convert with .to(kBool) (nonzero is "
               "true)");
  const Shape shape = BroadcastShapes(mask.shape(), input.shape(), "masked_fill");
  TANDEM_CHECK(shape == input.shape(), "masked_fill: mask ", ShapeToString(mask.shape()),
               " must broadcast to input's shape ", ShapeToString(input.shape()),
               " without enlarging it");
  // The result keeps input's dtype, the value converted to it (PyTorch's masked_fill).
  return where(mask, FilledRaw({}, input.dtype(), input.device(), value), input);
}

Tensor clamp(const Tensor& input, std::optional<double> min, std::optional<double> max) {
  CheckDefined(input, "clamp", "input");
  TANDEM_CHECK(min.has_value() || max.has_value(),
               "clamp: at least one of min and max must be given (both are nullopt)");
  const bool fractional = (min && !IsWholeNumber(*min)) || (max && !IsWholeNumber(*max));
  const Tensor x = IsIntegral(input.dtype(), true) && fractional ? CastRaw(input, kFloat32) : input;
  Tensor out = x;
  // maximum/minimum keep NaN; min > max gives max everywhere (min applied first).
  if (min)
    out = BinaryRaw(BinaryOp::kMaximum, out, FilledRaw({}, x.dtype(), x.device(), *min), "clamp");
  if (max)
    out = BinaryRaw(BinaryOp::kMinimum, out, FilledRaw({}, x.dtype(), x.device(), *max), "clamp");
  if (NeedsGrad({input})) {
    Record("ClampBackward", {input}, out, [min, max, sx = x.detach()](const Tensor& grad) {
      // PyTorch: the gradient passes where min <= x <= max (NaN x: nowhere); 1/0 masks in
      // x's dtype.
      Tensor inside = ones_like(sx);
      const auto bound = [&](double v) { return FilledRaw({}, sx.dtype(), sx.device(), v); };
      if (min) inside = mul(inside, BinaryRaw(BinaryOp::kGe, sx, bound(*min), "clamp backward"));
      if (max) inside = mul(inside, BinaryRaw(BinaryOp::kLe, sx, bound(*max), "clamp backward"));
      return std::vector<Tensor>{KeepWhereRaw(grad, inside, "clamp backward")};
    });
  }
  return out;
}

Tensor gather(const Tensor& input, int64_t dim, const Tensor& index) {
  CheckDefined(input, "gather", "input");
  CheckDefined(index, "gather", "index");
  CheckSameDevice(input, "input", index, "index", "gather");
  CheckFloat(input, "gather", "input");
  TANDEM_CHECK(index.dtype() == kInt64, "gather: index must be int64 but is ", index.dtype(),
               "; convert it with .to(kInt64)");
  const int64_t ndim = std::max<int64_t>(input.dim(), 1);
  const int64_t d = Dim(dim, input.dim(), "gather");
  const Shape in_shape = input.dim() == 0 ? Shape{1} : input.shape();
  const Shape idx_shape = index.dim() == 0 ? Shape{1} : index.shape();
  bool fits = static_cast<int64_t>(idx_shape.size()) == ndim;
  for (int64_t k = 0; fits && k < ndim; ++k) fits = k == d || idx_shape[k] <= in_shape[k];
  TANDEM_CHECK(fits, "gather: index is ", ShapeToString(index.shape()), " and input is ",
               ShapeToString(input.shape()), "; index must have input's number of dimensions and",
               " sizes no larger than input's except along dim ", d);
  CheckIndexRange(index, in_shape[d], d, "gather");
  // Input narrowed to index's sizes outside dim, so both are [outer, *, inner].
  Shape narrowed = idx_shape;
  narrowed[d] = in_shape[d];
  const Tensor in_view =
      MakeView(input, narrowed, input.dim() == 0 ? std::vector<int64_t>{1} : input.strides(),
               input.storage_offset());
  const Tensor x = ContiguousRaw(in_view);
  const Tensor idx = ContiguousRaw(index);
  const int64_t outer = Product(idx_shape, 0, d), inner = Product(idx_shape, d + 1, ndim);
  const int64_t src_dim = in_shape[d], idx_dim = idx_shape[d];
  Tensor out = NewTensor(index.shape(), input.dtype(), input.device());
  BackendOf(x).Gather(IndexOf(x), x.dtype(), DataPtr(out), DataPtr(x), Int64Ptr(idx), outer,
                      src_dim, idx_dim, inner);
  if (NeedsGrad({input})) {
    Record("GatherBackward", {input}, out,
           [idx, narrowed, outer, src_dim, idx_dim, inner,
            shape = input.shape()](const Tensor& grad_output) {
             const Tensor grad = ContiguousRaw(grad_output);
             Tensor part = FilledRaw(narrowed, grad.dtype(), grad.device(), 0.0);
             BackendOf(grad).ScatterAdd(IndexOf(grad), grad.dtype(), DataPtr(part), DataPtr(grad),
                                        Int64Ptr(idx), outer, src_dim, idx_dim, inner);
             if (NumElements(narrowed) == NumElements(shape)) {
               return std::vector<Tensor>{ViewRaw(part, shape)};
             }
             Tensor full = FilledRaw(shape, grad.dtype(), grad.device(), 0.0);
             BackendOf(grad).Copy(IndexOf(grad),
                                  ToKernel(MakeView(full, narrowed, full.strides(), 0)),
                                  ToKernel(part));
             return std::vector<Tensor>{full};
           });
  }
  return out;
}

namespace {

// index_select's backward: the gradient adds the selected slices back into the input's
// positions. To the engine it gives them as a ScatterGradient, which it adds in place into
// a gradient already waiting for the input (a tied head's [V, C] product) instead of
// zero-filling a [V, C] buffer, scattering into it and summing the two.
class IndexSelectBackward final : public Node {
 public:
  IndexSelectBackward(Device device, Tensor index, Shape shape, int64_t outer, int64_t dim_size,
                      int64_t idx_dim, int64_t inner)
      : Node(device),
        index_(std::move(index)),
        shape_(std::move(shape)),
        outer_(outer),
        dim_size_(dim_size),
        idx_dim_(idx_dim),
        inner_(inner) {}

  std::vector<Tensor> Apply(std::vector<Tensor> grad_outputs) override {
    const ScatterGradient part = Part(grad_outputs[0]);
    Tensor dense = FilledRaw(shape_, part.values.dtype(), part.values.device(), 0.0);
    if (part.values.numel() > 0) {
      BackendOf(dense).ScatterAdd(IndexOf(dense), dense.dtype(), DataPtr(dense),
                                  DataPtr(part.values), Int64Ptr(part.index), outer_, dim_size_,
                                  idx_dim_, inner_);
    }
    return {dense};
  }
  std::vector<Tensor> ApplyScattered(
      std::vector<Tensor> grad_outputs,
      std::vector<std::optional<ScatterGradient>>& scattered) override {
    scattered.resize(1);
    scattered[0] = Part(grad_outputs[0]);
    return {Tensor()};
  }
  std::string name() const override { return "IndexSelectBackward"; }

 private:
  ScatterGradient Part(const Tensor& grad_output) const {
    ScatterGradient part;
    part.index = index_;
    part.values = ContiguousRaw(grad_output);
    part.shape = shape_;
    part.outer = outer_;
    part.dim_size = dim_size_;
    part.idx_dim = idx_dim_;
    part.inner = inner_;
    return part;
  }

  Tensor index_;  // int64 [outer, idx_dim, inner], contiguous
  Shape shape_;
  int64_t outer_, dim_size_, idx_dim_, inner_;
};

}  // namespace

Tensor index_select(const Tensor& input, int64_t dim, const Tensor& index) {
  CheckDefined(input, "index_select", "input");
  CheckDefined(index, "index_select", "index");
  TANDEM_CHECK(index.dim() <= 1, "index_select: index must be 1-D (or 0-D) but is ",
               ShapeToString(index.shape()), "; flatten it, or use gather for per-row indices");
  TANDEM_CHECK(index.dtype() == kInt64, "index_select: index must be int64 but is ", index.dtype(),
               "; convert it with .to(kInt64)");
  const int64_t d = Dim(dim, input.dim(), "index_select");
  Shape shape = input.dim() == 0 ? Shape{1} : input.shape();
  Shape line(shape.size(), 1);
  line[d] = index.numel();
  shape[d] = index.numel();
  // Every position along the other dimensions picks the same entries: gather with the index
  // broadcast over them.
  const Tensor expanded = index.reshape(line).expand(shape);
  Tensor out;
  {
    NoGradGuard no_grad;  // recorded below, as a node whose gradient scatters
    out = gather(input, d, expanded);
  }
  if (NeedsGrad({input})) {
    const int64_t outer = Product(shape, 0, d), inner = Product(shape, d + 1, shape.size());
    const int64_t dim_size = input.dim() == 0 ? 1 : input.size(d);
    RecordOp(
        std::make_shared<IndexSelectBackward>(input.device(), ContiguousRaw(expanded),
                                              input.shape(), outer, dim_size, index.numel(), inner),
        {input}, out);
  }
  return input.dim() == 0 ? out.reshape({index.numel()}) : out;
}

std::pair<Tensor, Tensor> topk(const Tensor& input, int64_t k, int64_t dim, bool largest,
                               bool sorted) {
  CheckDefined(input, "topk", "input");
  CheckFloat(input, "topk", "input");
  TANDEM_CHECK(input.dim() >= 1, "topk: input is zero-dimensional; unsqueeze(0) it first");
  const int64_t d = Dim(dim, input.dim(), "topk");
  const Shape& shape = input.shape();
  const int64_t n = shape[d];
  TANDEM_CHECK(k >= 0 && k <= n, "topk: k must be in [0, ", n, "] (the size of dimension ", d,
               ") but is ", k);
  // Positions chosen on the host: [outer, n, inner] values, one sort per line.
  const int64_t outer = Product(shape, 0, d), inner = Product(shape, d + 1, shape.size());
  // In float64, which holds every float32 exactly (so the order is the same).
  const std::vector<double> values = input.detach().to(kFloat64).contiguous().to_vector<double>();
  std::vector<int64_t> chosen(static_cast<size_t>(outer * k * inner));
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      const auto at = [&](int64_t j) { return values[(o * n + j) * inner + i]; };
      // NaN above every number; ties by lower index (a strict weak order on indices).
      const auto before = [&](int64_t p, int64_t q) {
        const double x = at(p), y = at(q);
        const bool x_nan = std::isnan(x), y_nan = std::isnan(y);
        if (x_nan || y_nan) {
          if (x_nan && y_nan) return p < q;
          return largest ? x_nan : y_nan;
        }
        if (x != y) return largest ? x > y : x < y;
        return p < q;
      };
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
      for (int64_t j = 0; j < k; ++j) chosen[(o * k + j) * inner + i] = order[j];
    }
  }
  (void)sorted;  // always sorted: the order PyTorch gives with sorted=true is also valid without
  Shape out_shape = shape;
  out_shape[d] = k;
  Tensor indices = from_vector(chosen, out_shape, TensorOptions(kInt64).device(input.device()));
  return {gather(input, d, indices), indices};
}

// ---- Logical ---------------------------------------------------------------------------------

Tensor logical_not(const Tensor& a) {
  CheckDefined(a, "logical_not", "input");
  return CompareRaw(BinaryOp::kEq, a, FilledRaw({}, a.dtype(), a.device(), 0.0), "logical_not");
}

namespace {

// a and b as bool (nonzero is true), then combined as uint8 0/1 by `op` (kMinimum: and,
// kMaximum: or, kNe: xor).
Tensor LogicalBinary(const Tensor& a, const Tensor& b, BinaryOp op, const char* name) {
  CheckDefined(a, name, "a");
  CheckDefined(b, name, "b");
  CheckSameDevice(a, "a", b, "b", name);
  const Tensor x = CastRaw(CastRaw(a, kBool), kUInt8);
  const Tensor y = CastRaw(CastRaw(b, kBool), kUInt8);
  return CastRaw(BinaryRaw(op, x, y, name), kBool);
}

// Whether any element along `dims` is nonzero: the count of nonzero elements (int64, so it
// cannot wrap) compared with zero. Empty reductions give false, as in PyTorch.
Tensor AnyRaw(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim, const char* name) {
  const std::vector<int64_t> reduced = NormalizeDims(dims, a.dim(), name);
  const Tensor count =
      ReduceRaw(CastRaw(CastRaw(a, kBool), kInt64), reduced, ReduceKind::kSum, name);
  const Tensor kept = keepdim ? count : ViewRaw(count, ReducedShape(a.shape(), reduced, false));
  return CompareRaw(BinaryOp::kNe, kept, FilledRaw({}, kInt64, a.device(), 0.0), name);
}

}  // namespace

Tensor logical_and(const Tensor& a, const Tensor& b) {
  return LogicalBinary(a, b, BinaryOp::kMinimum, "logical_and");
}
Tensor logical_or(const Tensor& a, const Tensor& b) {
  return LogicalBinary(a, b, BinaryOp::kMaximum, "logical_or");
}
Tensor logical_xor(const Tensor& a, const Tensor& b) {
  return LogicalBinary(a, b, BinaryOp::kNe, "logical_xor");
}

Tensor any(const Tensor& a) {
  CheckDefined(a, "any", "input");
  return ViewRaw(AnyRaw(a, {}, false, "any"), {});
}
Tensor any(const Tensor& a, int64_t dim, bool keepdim) {
  CheckDefined(a, "any", "input");
  return AnyRaw(a, {dim}, keepdim, "any");
}
// all(a) = not any(not a).
Tensor all(const Tensor& a) {
  CheckDefined(a, "all", "input");
  return logical_not(any(logical_not(a)));
}
Tensor all(const Tensor& a, int64_t dim, bool keepdim) {
  CheckDefined(a, "all", "input");
  return logical_not(any(logical_not(a), dim, keepdim));
}

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol) {
  CheckDefined(a, "allclose", "a");
  CheckDefined(b, "allclose", "b");
  if (a.shape() != b.shape()) return false;
  const auto host_values = [](const Tensor& t) {
    return t.detach().to(Device::Cpu()).to(kFloat64).contiguous().to_vector<double>();
  };
  const std::vector<double> x = host_values(a), y = host_values(b);
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i] == y[i]) continue;  // equal infinities included
    if (!std::isfinite(x[i]) || !std::isfinite(y[i])) return false;
    if (!(std::fabs(x[i] - y[i]) <= atol + rtol * std::fabs(y[i]))) return false;
  }
  return true;
}

// Defined here rather than with the other views in tensor/core/tensor.cc: its backward
// is a reduction (sum_to), an op.
Tensor Tensor::expand(const Shape& target) const {
  TANDEM_CHECK(static_cast<int64_t>(target.size()) >= dim(), "expand: cannot expand shape ",
               ShapeToString(shape()), " to fewer dimensions ", ShapeToString(target));
  const int64_t lead = static_cast<int64_t>(target.size()) - dim();
  std::vector<int64_t> st(target.size(), 0);
  Shape s = target;
  for (int64_t d = 0; d < static_cast<int64_t>(target.size()); ++d) {
    if (d < lead) continue;
    const int64_t size = shape()[d - lead];
    if (target[d] == -1) s[d] = size;
    TANDEM_CHECK(s[d] == size || size == 1, "expand: the size ", size, " of dimension ", d - lead,
                 " of ", ShapeToString(shape()), " must be 1 or match ", s[d], " in ",
                 ShapeToString(target));
    st[d] = s[d] == size ? strides()[d - lead] : 0;
  }
  Tensor out = MakeView(*this, s, st, storage_offset());
  const Shape original = shape();
  if (NeedsGrad({*this})) {
    Record("ExpandBackward", {*this}, out,
           [original](const Tensor& g) { return std::vector<Tensor>{sum_to(g, original)}; });
  }
  return out;
}

// ---- Tensor methods -------------------------------------------------------------------------

Tensor Tensor::relu() const { return tandem::relu(*this); }
Tensor Tensor::exp() const { return tandem::exp(*this); }
Tensor Tensor::log() const { return tandem::log(*this); }
Tensor Tensor::sum() const { return tandem::sum(*this); }
Tensor Tensor::sum(const std::vector<int64_t>& dims, bool keepdim) const {
  return tandem::sum(*this, dims, keepdim);
}
Tensor Tensor::mean() const { return tandem::mean(*this); }
Tensor Tensor::mean(const std::vector<int64_t>& dims, bool keepdim) const {
  return tandem::mean(*this, dims, keepdim);
}
Tensor Tensor::argmax(int64_t dim, bool keepdim) const {
  return tandem::argmax(*this, dim, keepdim);
}
Tensor Tensor::matmul(const Tensor& other) const { return tandem::matmul(*this, other); }

// ---- Fused normalisation and triangles (Note [Fused row norms] in tensor/runtime/backend.h) --

namespace {

// Checks layer_norm/rms_norm's arguments and returns the number of elements each row
// normalises (the product of normalized_shape).
int64_t NormalizedCols(const Tensor& input, const std::vector<int64_t>& normalized_shape,
                       const Tensor& weight, const Tensor& bias, const char* op) {
  CheckDefined(input, op, "input");
  CheckFloat(input, op, "input");
  TANDEM_CHECK(!normalized_shape.empty(), op,
               ": normalized_shape must name at least one dimension (e.g. {features}) but is "
               "empty");
  for (int64_t size : normalized_shape) {
    TANDEM_CHECK(size > 0, op, ": normalized_shape must have positive sizes but is ",
                 ShapeToString(normalized_shape));
  }
  const int64_t count = static_cast<int64_t>(normalized_shape.size());
  const int64_t lead = input.dim() - count;
  const bool matches = lead >= 0 && std::equal(normalized_shape.begin(), normalized_shape.end(),
                                               input.shape().begin() + std::max<int64_t>(lead, 0));
  TANDEM_CHECK(matches, op, ": normalized_shape ", ShapeToString(normalized_shape),
               " must equal the last ", count, " dimension(s) of the input, but the input is ",
               ShapeToString(input.shape()),
               "; pass the sizes of the dimensions to normalise over, e.g. {",
               input.dim() > 0 ? input.shape().back() : 1, "} for the last one");
  for (const auto& [param, name] : {std::pair<const Tensor&, const char*>{weight, "weight"},
                                    std::pair<const Tensor&, const char*>{bias, "bias"}}) {
    if (!param.defined()) continue;
    CheckSameDevice(input, "input", param, name, op);
    CheckSameFloat(input, "input", param, name, op);
    TANDEM_CHECK(param.shape() == Shape(normalized_shape.begin(), normalized_shape.end()), op, ": ",
                 name, " must have normalized_shape ", ShapeToString(normalized_shape), " but has ",
                 ShapeToString(param.shape()), "; pass an undefined Tensor() for none");
  }
  return Product(Shape(normalized_shape.begin(), normalized_shape.end()), 0,
                 normalized_shape.size());
}

// Data pointer of a defined tensor (made contiguous), null for an undefined one.
void* OptionalData(const Tensor& t) {
  return t.defined() ? static_cast<void*>(DataPtr(t)) : nullptr;
}

Tensor RowNormImpl(bool rms, const Tensor& input, const std::vector<int64_t>& normalized_shape,
                   const Tensor& weight, const Tensor& bias, double eps, const char* op,
                   const char* node_name) {
  const int64_t cols = NormalizedCols(input, normalized_shape, weight, bias, op);
  TANDEM_CHECK(eps >= 0.0 && std::isfinite(eps), op, ": eps must be a finite value >= 0 but is ",
               eps);
  const Tensor x = ContiguousRaw(input);
  const Tensor w = weight.defined() ? ContiguousRaw(weight) : Tensor();
  const Tensor b = bias.defined() ? ContiguousRaw(bias) : Tensor();
  const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
  // Statistics in OpMath: float for float32 and the 16-bit floats, double for float64.
  const DType stat_dtype = x.dtype() == kFloat64 ? kFloat64 : kFloat32;
  Tensor out = NewTensor(x.shape(), x.dtype(), x.device());
  Tensor mean = rms ? Tensor() : NewTensor({rows}, stat_dtype, x.device());
  Tensor rstd = NewTensor({rows}, stat_dtype, x.device());
  if (rows > 0) {
    BackendOf(x).RowNorm(IndexOf(x), x.dtype(), rms, rows, cols, eps, DataPtr(x), OptionalData(w),
                         OptionalData(b), DataPtr(out), OptionalData(mean), DataPtr(rstd));
  }
  std::vector<Tensor> inputs = {input};
  if (weight.defined()) inputs.push_back(weight);
  if (bias.defined()) inputs.push_back(bias);
  if (NeedsGrad(inputs)) {
    const bool grad_x = NeedsGrad({input});
    const bool grad_w = weight.defined() && NeedsGrad({weight});
    const bool grad_b = bias.defined() && NeedsGrad({bias});
    Record(node_name, inputs, out,
           [rms, rows, cols, grad_x, grad_w, grad_b, has_weight = weight.defined(),
            has_bias = bias.defined(), sx = x.detach(), sw = w.defined() ? w.detach() : Tensor(),
            param_shape = Shape(normalized_shape.begin(), normalized_shape.end()), mean,
            rstd](const Tensor& grad_output) {
             const Tensor dy = ContiguousRaw(CastRaw(grad_output, sx.dtype()));
             Tensor dx, dw, db;
             if (grad_x) dx = NewTensor(sx.shape(), sx.dtype(), sx.device());
             if (grad_w) dw = NewTensor(param_shape, sx.dtype(), sx.device());
             if (grad_b) db = NewTensor(param_shape, sx.dtype(), sx.device());
             if (rows == 0) {
               // No rows: the parameters' sums are over nothing.
               if (grad_w) dw = FilledRaw(param_shape, sx.dtype(), sx.device(), 0.0);
               if (grad_b) db = FilledRaw(param_shape, sx.dtype(), sx.device(), 0.0);
             } else if (grad_x || grad_w || grad_b) {
               BackendOf(sx).RowNormBackward(IndexOf(sx), sx.dtype(), rms, rows, cols, DataPtr(dy),
                                             DataPtr(sx), OptionalData(mean), DataPtr(rstd),
                                             OptionalData(sw), OptionalData(dx), OptionalData(dw),
                                             OptionalData(db));
             }
             std::vector<Tensor> grads = {dx};
             if (has_weight) grads.push_back(dw);
             if (has_bias) grads.push_back(db);
             return grads;
           });
  }
  return out;
}

Tensor TriangleImpl(bool lower, const Tensor& input, int64_t diagonal, const char* op) {
  CheckDefined(input, op, "input");
  TANDEM_CHECK(input.dim() >= 2, op,
               ": expected a tensor with at least 2 dimensions (its last two "
               "are the matrix) but got ",
               ShapeToString(input.shape()), " (", input.dim(), "-D); unsqueeze a vector first");
  const Tensor x = ContiguousRaw(input);
  const Shape& shape = x.shape();
  const int64_t rows = shape[shape.size() - 2], cols = shape.back();
  Tensor out = NewTensor(shape, x.dtype(), x.device());
  if (out.numel() > 0) {
    BackendOf(x).Triangle(IndexOf(x), x.dtype(), lower, diagonal, x.numel() / (rows * cols), rows,
                          cols, DataPtr(x), DataPtr(out));
  }
  if (NeedsGrad({input})) {
    Record(lower ? "TrilBackward" : "TriuBackward", {input}, out,
           [lower, diagonal, op](const Tensor& grad) {
             return std::vector<Tensor>{TriangleImpl(lower, grad, diagonal, op)};
           });
  }
  return out;
}

}  // namespace

Tensor layer_norm(const Tensor& input, const std::vector<int64_t>& normalized_shape,
                  const Tensor& weight, const Tensor& bias, double eps) {
  TANDEM_AUTOCAST(kFloat32, layer_norm, input, normalized_shape, weight, bias, eps);
  return RowNormImpl(false, input, normalized_shape, weight, bias, eps, "layer_norm",
                     "LayerNormBackward");
}

Tensor rms_norm(const Tensor& input, const std::vector<int64_t>& normalized_shape,
                const Tensor& weight, std::optional<double> eps) {
  TANDEM_AUTOCAST(kFloat32, rms_norm, input, normalized_shape, weight, eps);
  CheckDefined(input, "rms_norm", "input");
  // PyTorch's default: the machine epsilon of the type the statistics are computed in
  // (opmath): float64's for float64, float32's for float32 and the 16-bit floats.
  const double e = eps                         ? *eps
                   : input.dtype() == kFloat64 ? std::numeric_limits<double>::epsilon()
                                               : std::numeric_limits<float>::epsilon();
  return RowNormImpl(true, input, normalized_shape, weight, Tensor(), e, "rms_norm",
                     "RmsNormBackward");
}

Tensor tril(const Tensor& input, int64_t diagonal) {
  return TriangleImpl(true, input, diagonal, "tril");
}

Tensor triu(const Tensor& input, int64_t diagonal) {
  return TriangleImpl(false, input, diagonal, "triu");
}

}  // namespace tandem
