// Helpers shared by the op families of //tensor/ops (elementwise.cc, reduce.cc, linalg.cc, ...):
// argument checks, raw kernel calls that never record autograd, and Record, which attaches a
// backward closure. Private to //tensor/ops; ops outside it use tensor/ops/ops.h.
//
//   CheckDefined(a, "exp", "input");
//   Tensor out = UnaryRaw(UnaryOp::kExp, CastRaw(a, kFloat32), 0.0);  // no autograd
//   if (NeedsGrad({a})) Record("ExpBackward", {a}, out, backward);
//
// Conventions of the ops: every op validates its inputs, computes through the device's Backend
// kernels (never by touching memory from the host, so the same code runs on CUDA) and, when an
// input needs a gradient, records a backward closure. Backward closures run with grad mode off
// and are written with these same ops (or raw kernels), so they work on every device too.
// Functions named *Raw never record autograd; saved outputs are detached (a node holding its
// own output would be a reference cycle). A closure that is differentiable in everything it
// reads records with DoubleBackward::kSupported: under create_graph (grad mode on in the
// backward) its ops then record the gradient's graph. For that it keeps saved inputs
// undetached (the node already keeps their graphs alive through its edges), reads saved
// outputs through SavedOutput, and takes a differentiable path where its fast one calls raw
// kernels:
//
//   Record("ExpBackward", {a}, out, [y = out.detach()](const Tensor& grad) {
//     return std::vector<Tensor>{mul(grad, SavedOutput(y))};
//   }, DoubleBackward::kSupported);
#ifndef TANDEM_TENSOR_OPS_INTERNAL_OP_HELPERS_H_
#define TANDEM_TENSOR_OPS_INTERNAL_OP_HELPERS_H_

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "tensor/base/dtype.h"
#include "tensor/core/autograd.h"
#include "tensor/core/internal/tensor_impl.h"
#include "tensor/core/tensor.h"
#include "tensor/runtime/backend.h"

namespace tandem {

inline Backend& BackendOf(const Tensor& t) { return GetBackend(t.device()); }

inline int IndexOf(const Tensor& t) { return t.device().index(); }

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

inline ElementPtr DataPtr(const Tensor& t) { return ElementPtr(ToKernel(t).data, t.dtype()); }

inline int64_t* Int64Ptr(const Tensor& t) { return static_cast<int64_t*>(ToKernel(t).data); }

int64_t Product(const Shape& shape, size_t begin, size_t end);

void CheckDefined(const Tensor& t, const char* op, const char* name);

void CheckSameDevice(const Tensor& a, const char* a_name, const Tensor& b, const char* b_name,
                     const char* op);

// A floating-point input (float32, float64, bfloat16 or float16).
void CheckFloat(const Tensor& t, const char* op, const char* name);

// Inputs that meet in one kernel (a matmul's operands, a layer's weight and input) must share
// a floating dtype: PyTorch refuses to mix them too, rather than casting a weight silently.
void CheckSameFloat(const Tensor& a, const char* a_name, const Tensor& b, const char* b_name,
                    const char* op);

// A possibly negative dim of a tensor with `ndim` dimensions; zero-dimensional tensors
// accept 0 and -1, as in PyTorch.
int64_t Dim(int64_t dim, int64_t ndim, const char* op);

// A contiguous tensor with `t`'s data and the given shape (t must be contiguous).
Tensor ViewRaw(const Tensor& t, const Shape& shape);

// The last two dimensions swapped, as a view.
Tensor TransposedRaw(const Tensor& t);

// `t` broadcast to `shape`, materialised as a new contiguous tensor (converting dtype).
Tensor BroadcastCopyRaw(const Tensor& t, const Shape& shape, DType dtype);

Tensor ContiguousRaw(const Tensor& t);

Tensor CastRaw(const Tensor& t, DType dtype);

Tensor FilledRaw(const Shape& shape, DType dtype, Device device, double value);

Tensor UnaryRaw(UnaryOp op, const Tensor& a, double scalar);

// a and b of one dtype; the result has their broadcast shape.
Tensor BinaryRaw(BinaryOp op, const Tensor& a, const Tensor& b, const char* name);

bool IsWholeNumber(double value);

// A comparison of a and b (one dtype, broadcast) as a bool tensor, PyTorch's result dtype.
// The kernel writes 1/0 in the inputs' dtype and Copy turns that into bool: every backend
// does both today. Backend contract (2) lets a comparison write a kBool dst directly, which
// saves the second pass once every backend on the branch implements it.
Tensor CompareRaw(BinaryOp op, const Tensor& a, const Tensor& b, const char* name);

// ---- Reductions ----

// Sorted, de-duplicated, non-negative dims; an empty list means every dimension.
std::vector<int64_t> NormalizeDims(const std::vector<int64_t>& dims, int64_t ndim, const char* op);

// The shape after reducing `dims` (sorted) of `shape`.
Shape ReducedShape(const Shape& shape, const std::vector<int64_t>& dims, bool keepdim);

// Reduces `a` over the sorted dims with Backend::Reduce, one run of adjacent dims at a
// time (last run first, so earlier dims keep their positions). The result has the keepdim
// shape; kArgMax/kArgMin give int64 and take a single dim.
Tensor ReduceRaw(const Tensor& a, const std::vector<int64_t>& dims, ReduceKind op,
                 const char* name);

Tensor SumAllRaw(const Tensor& a);

// ---- Elementwise with autograd ----

struct Promoted {
  Tensor a, b;
};

// Checks a binary op's inputs and converts both to their promoted dtype (PyTorch's
// result_type: int64 + float32 -> float32, float32 + float64 -> float64).
Promoted PromoteBinary(const Tensor& a, const Tensor& b, const char* op);

// A node named `name` for `out`, whose gradients `backward` computes from out's gradient.
template <typename Backward>
void Record(const char* name, const std::vector<Tensor>& inputs, Tensor& out, Backward backward,
            DoubleBackward double_backward = DoubleBackward::kRefused) {
  RecordOp(name, inputs, out, FunctionNode::Backward(std::move(backward)), double_backward);
}

// kSupported when every saved value is its input itself (not a converted copy that lost the
// input's graph), so a closure written with differentiable ops is differentiable again.
inline DoubleBackward SupportedIfSame(std::initializer_list<std::pair<Tensor, Tensor>> saved) {
  for (const auto& [value, input] : saved) {
    if (value.defined() && value.impl() != input.impl()) return DoubleBackward::kRefused;
  }
  return DoubleBackward::kSupported;
}

// True inside a backward that runs under create_graph: a closure takes its differentiable
// path then instead of a fused raw kernel.
inline bool CreatingGraph() { return GradMode::IsEnabled(); }

// The differentiable path of a fused op's backward under create_graph: the gradients at `grad`
// of `recompute()` (the op written with differentiable ops, from the saved `inputs`, which keep
// their graphs) with respect to those inputs, carrying their own graph. An input that needs no
// gradient gets an undefined one.
//
//   if (CreatingGraph()) return RecomputedGradients([&] { return gelu(linear(x, w, b)); },
//                                                   {x, w, b}, grad);
std::vector<Tensor> RecomputedGradients(const std::function<Tensor()>& recompute,
                                        const std::vector<Tensor>& inputs, const Tensor& grad);

}  // namespace tandem

#endif  // TANDEM_TENSOR_OPS_INTERNAL_OP_HELPERS_H_
