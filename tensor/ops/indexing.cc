// Selection and indexing: where, masked_fill, clamp, gather, index_select and topk.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tensor/base/error.h"
#include "tensor/core/autograd.h"
#include "tensor/core/internal/tensor_impl.h"
#include "tensor/core/tensor.h"
#include "tensor/kernels/index_kernels.h"
#include "tensor/ops/internal/op_helpers.h"
#include "tensor/ops/ops.h"
#include "tensor/runtime/backend.h"

namespace tandem {

namespace {

// x where mask (0/1 in x's dtype, broadcast) is 1, exactly 0 elsewhere (no NaN * 0).
Tensor KeepWhereRaw(const Tensor& x, const Tensor& mask, const char* name) {
  return BinaryRaw(BinaryOp::kReluBackward, x, CastRaw(mask, x.dtype()), name);
}

// KeepWhereRaw of a gradient in a backward closure; under create_graph recorded, as its own
// adjoint (masking is diagonal), so where's and clamp's backwards differentiate again.
Tensor KeepWhere(const Tensor& grad, const Tensor& mask, const char* name) {
  Tensor out = KeepWhereRaw(grad, mask, name);
  if (CreatingGraph() && NeedsGrad({grad})) {
    Record(
        "KeepWhereBackward", {grad}, out,
        [mask, name](const Tensor& g) { return std::vector<Tensor>{KeepWhere(g, mask, name)}; },
        DoubleBackward::kSupported);
  }
  return out;
}

// Checks int64 `index` values lie in [0, size) now, on the CPU (two reductions, one read). On a
// GPU the kernel checks them and the next host synchronization reports a bad one (Note
// [Device-side index checks], tensor/cuda/kernels.h): reading them here would stop the host.
void CheckIndexRange(const Tensor& index, int64_t size, int64_t dim, const char* op) {
  if (index.numel() == 0 || !index.device().is_cpu()) return;
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
    Record(
        "WhereBackward", {a, b}, out,
        [grad_a, grad_b, take_a, take_b, sa = a.shape(), sb = b.shape()](const Tensor& grad) {
          return std::vector<Tensor>{
              grad_a ? sum_to(KeepWhere(grad, take_a, "where backward"), sa) : Tensor(),
              grad_b ? sum_to(KeepWhere(grad, take_b, "where backward"), sb) : Tensor()};
        },
        DoubleBackward::kSupported);
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
    Record(
        "ClampBackward", {input}, out,
        [min, max, sx = x.detach()](const Tensor& grad) {
          // PyTorch: the gradient passes where min <= x <= max (NaN x: nowhere); 1/0 masks in
          // x's dtype.
          Tensor inside = ones_like(sx);
          const auto bound = [&](double v) { return FilledRaw({}, sx.dtype(), sx.device(), v); };
          if (min)
            inside = mul(inside, BinaryRaw(BinaryOp::kGe, sx, bound(*min), "clamp backward"));
          if (max)
            inside = mul(inside, BinaryRaw(BinaryOp::kLe, sx, bound(*max), "clamp backward"));
          return std::vector<Tensor>{KeepWhere(grad, inside, "clamp backward")};
        },
        DoubleBackward::kSupported);
  }
  return out;
}

namespace {

Tensor Gather(const Tensor& input, int64_t dim, const Tensor& index, const char* op);

// gather's gradient: grad_output added at the gathered positions of zeros of the input's
// `shape` (a scatter-add into its `narrowed` part). Linear in grad_output with gather itself as
// the adjoint, and recorded so under create_graph: gather and index_select (an embedding's
// lookup) differentiate to any order.
Tensor GatherGrad(const Tensor& grad_output, const Tensor& idx, int64_t d, const Shape& narrowed,
                  const Shape& shape, int64_t outer, int64_t src_dim, int64_t idx_dim,
                  int64_t inner) {
  const Tensor grad = ContiguousRaw(grad_output);
  Tensor part = FilledRaw(narrowed, grad.dtype(), grad.device(), 0.0);
  if (grad.numel() > 0) {
    ScatterAddKernel(grad.device(), grad.dtype(), DataPtr(part), DataPtr(grad), Int64Ptr(idx),
                     outer, src_dim, idx_dim, inner);
  }
  Tensor full;
  if (NumElements(narrowed) == NumElements(shape)) {
    full = ViewRaw(part, shape);
  } else {
    full = FilledRaw(shape, grad.dtype(), grad.device(), 0.0);
    BackendOf(grad).Copy(IndexOf(grad), ToKernel(MakeView(full, narrowed, full.strides(), 0)),
                         ToKernel(part));
  }
  if (CreatingGraph() && NeedsGrad({grad_output})) {
    Record(
        "ScatterAddBackward", {grad_output}, full,
        [idx, d](const Tensor& u) { return std::vector<Tensor>{Gather(u, d, idx, "gather")}; },
        DoubleBackward::kSupported);
  }
  return full;
}

// gather, reporting bad indices as `op`'s (a string literal: the device may report it later).
Tensor Gather(const Tensor& input, int64_t dim, const Tensor& index, const char* op) {
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
  CheckIndexRange(index, in_shape[d], d, op);
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
  GatherKernel(x.device(), x.dtype(), DataPtr(out), DataPtr(x), Int64Ptr(idx), outer, src_dim,
               idx_dim, inner, op);
  if (NeedsGrad({input})) {
    Record(
        "GatherBackward", {input}, out,
        [idx, d, narrowed, outer, src_dim, idx_dim, inner,
         shape = input.shape()](const Tensor& grad_output) {
          return std::vector<Tensor>{
              GatherGrad(grad_output, idx, d, narrowed, shape, outer, src_dim, idx_dim, inner)};
        },
        DoubleBackward::kSupported);
  }
  return out;
}

}  // namespace

Tensor gather(const Tensor& input, int64_t dim, const Tensor& index) {
  return Gather(input, dim, index, "gather");
}

namespace {

// index_select's backward: the gradient adds the selected slices back into the input's
// positions. To the engine it gives them as a ScatterGradient, which it adds in place into
// a gradient already waiting for the input (a tied head's [V, C] product) instead of
// zero-filling a [V, C] buffer, scattering into it and summing the two.
class IndexSelectBackward final : public Node {
 public:
  IndexSelectBackward(Device device, Tensor index, int64_t dim, Shape shape, int64_t outer,
                      int64_t dim_size, int64_t idx_dim, int64_t inner)
      : Node(device),
        index_(std::move(index)),
        dim_(dim),
        shape_(std::move(shape)),
        outer_(outer),
        dim_size_(dim_size),
        idx_dim_(idx_dim),
        inner_(inner) {}

  std::vector<Tensor> Apply(std::vector<Tensor> grad_outputs) override {
    return {GatherGrad(grad_outputs[0], index_, dim_, shape_, shape_, outer_, dim_size_, idx_dim_,
                       inner_)};
  }
  // The engine calls Apply, not ApplyScattered, under create_graph.
  bool SupportsDoubleBackward() const override { return true; }
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

  Tensor index_;  // int64, contiguous: the index expanded to the output's shape
  int64_t dim_;
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
    out = Gather(input, d, expanded, "index_select");
  }
  if (NeedsGrad({input})) {
    const int64_t outer = Product(shape, 0, d), inner = Product(shape, d + 1, shape.size());
    const int64_t dim_size = input.dim() == 0 ? 1 : input.size(d);
    RecordOp(
        std::make_shared<IndexSelectBackward>(input.device(), ContiguousRaw(expanded), d,
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

}  // namespace tandem
