// Reductions: sum, mean, amax, argmax and argmin, over every dimension or a list of them.
#include <cstdint>
#include <limits>
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

namespace {

// `grad` (of the reduced shape) broadcast back to `input_shape` as a stride-0 view: the
// engine copies gradients before accumulating into them, so a view saves a full copy.
Tensor ExpandGradRaw(const Tensor& grad, const Shape& kept_shape, const Shape& input_shape) {
  // Under create_graph the same view, recorded.
  if (CreatingGraph()) return grad.reshape(kept_shape).expand(input_shape);
  const Tensor kept = grad.shape() == kept_shape ? grad : ViewRaw(ContiguousRaw(grad), kept_shape);
  const size_t lead = input_shape.size() - kept_shape.size();
  std::vector<int64_t> strides(input_shape.size(), 0);
  for (size_t d = lead; d < input_shape.size(); ++d) {
    if (kept_shape[d - lead] == input_shape[d]) strides[d] = kept.strides()[d - lead];
  }
  return MakeView(kept, input_shape, strides, kept.storage_offset());
}

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
    Record(
        "SumBackward", {a}, out,
        [shape = a.shape()](const Tensor& grad) {
          return std::vector<Tensor>{ExpandGradRaw(grad, {}, shape)};
        },
        DoubleBackward::kSupported);
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
    Record(
        "SumBackward", {a}, out,
        [kept_shape, shape = a.shape()](const Tensor& grad) {
          return std::vector<Tensor>{ExpandGradRaw(grad, kept_shape, shape)};
        },
        DoubleBackward::kSupported);
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
    Record(
        "AmaxBackward", {a}, out,
        [kept_shape, reduced, x = a.detach(), m = kept.detach()](const Tensor& grad) {
          // Ties share the gradient evenly, as PyTorch's amax does (1/0 in x's dtype).
          const Tensor is_max = BinaryRaw(BinaryOp::kEq, x, m, "amax backward");
          const Tensor ties = sum(is_max, reduced, /*keepdim=*/true);
          const Tensor g = grad.shape() == kept_shape ? grad : grad.reshape(kept_shape);
          return std::vector<Tensor>{mul(is_max, div(g, ties))};
        },
        DoubleBackward::kSupported);
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

}  // namespace tandem
