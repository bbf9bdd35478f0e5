// Fused row normalisations: layer_norm, rms_norm and add_layer_norm (Notes [Fused row norms]
// and [Fused residual norm] in tensor/kernels/norm_kernels.h).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tensor/base/autocast_mode.h"
#include "tensor/base/error.h"
#include "tensor/core/autograd.h"
#include "tensor/core/internal/tensor_impl.h"
#include "tensor/core/tensor.h"
#include "tensor/kernels/norm_kernels.h"
#include "tensor/ops/autocast.h"
#include "tensor/ops/internal/op_helpers.h"
#include "tensor/ops/ops.h"
#include "tensor/runtime/backend.h"

namespace tandem {

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

// The gradients of layer_norm (rms_norm with `rms`) written with differentiable ops, for
// backward under create_graph: with xhat = (x - mean) * rstd and g = grad * weight per row,
// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) (no mean(g) term for rms_norm),
// dweight = sum over rows of grad * xhat, dbias = sum over rows of grad.
std::vector<Tensor> RowNormBackwardDifferentiable(bool rms, int64_t rows, int64_t cols, double eps,
                                                  bool grad_x, bool grad_w, bool grad_b,
                                                  bool has_bias, const Tensor& x, const Tensor& w,
                                                  const Shape& param_shape,
                                                  const Tensor& grad_output) {
  const std::vector<int64_t> row = {1};
  const Tensor x2 = x.reshape({rows, cols});
  const Tensor grad = grad_output.to(x.dtype()).reshape({rows, cols});
  const Tensor centred = rms ? x2 : sub(x2, mean(x2, row, true));
  const Tensor rstd = pow(add(mean(square(centred), row, true), eps), -0.5);
  const Tensor xhat = mul(centred, rstd);
  Tensor dx, dw, db;
  if (grad_x) {
    const Tensor g = w.defined() ? mul(grad, w.reshape({1, cols})) : grad;
    Tensor inner = sub(g, mul(xhat, mean(mul(g, xhat), row, true)));
    if (!rms) inner = sub(inner, mean(g, row, true));
    dx = mul(inner, rstd).reshape(x.shape());
  }
  if (grad_w) dw = sum(mul(grad, xhat), {0}).reshape(param_shape);
  if (grad_b) db = sum(grad, {0}).reshape(param_shape);
  std::vector<Tensor> grads = {dx};
  if (w.defined()) grads.push_back(dw);
  if (has_bias) grads.push_back(db);
  return grads;
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
    RunRowNorm(x.device(), x.dtype(), x.dtype(), rms, rows, cols, eps, DataPtr(x), nullptr,
               OptionalData(w), OptionalData(b), DataPtr(out), nullptr, OptionalData(mean),
               DataPtr(rstd));
  }
  std::vector<Tensor> inputs = {input};
  if (weight.defined()) inputs.push_back(weight);
  if (bias.defined()) inputs.push_back(bias);
  if (NeedsGrad(inputs)) {
    const bool grad_x = NeedsGrad({input});
    const bool grad_w = weight.defined() && NeedsGrad({weight});
    const bool grad_b = bias.defined() && NeedsGrad({bias});
    // x and w are saved with their graphs (the input and weight themselves when contiguous):
    // under create_graph the closure writes the same gradients with differentiable ops.
    Record(
        node_name, inputs, out,
        [rms, rows, cols, eps, grad_x, grad_w, grad_b, has_weight = weight.defined(),
         has_bias = bias.defined(), sx = x, sw = w,
         param_shape = Shape(normalized_shape.begin(), normalized_shape.end()), mean,
         rstd](const Tensor& grad_output) {
          if (CreatingGraph()) {
            return RowNormBackwardDifferentiable(rms, rows, cols, eps, grad_x, grad_w, grad_b,
                                                 has_bias, sx, sw, param_shape, grad_output);
          }
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
            RunRowNormBackward(sx.device(), sx.dtype(), sx.dtype(), rms, rows, cols, DataPtr(dy),
                               nullptr, DataPtr(sx), OptionalData(mean), DataPtr(rstd),
                               OptionalData(sw), OptionalData(dx), nullptr, OptionalData(dw),
                               OptionalData(db));
          }
          std::vector<Tensor> grads = {dx};
          if (has_weight) grads.push_back(dw);
          if (has_bias) grads.push_back(db);
          return grads;
        },
        SupportedIfSame({{x, input}, {w, weight}}));
  }
  return out;
}

// add_layer_norm's node: outputs {sum, y}; inputs {input, residual[, weight][, bias]}. With a
// 16-bit residual under autocast (Note [Autocast residual norm]) y and its gradient are in the
// residual's dtype, and the kernel writes the residual's gradient rounded beside the input's.
class AddLayerNormBackward final : public Node {
 public:
  struct Saved {
    int64_t rows = 0, cols = 0;
    double eps = 0;
    DType io_dtype = kFloat32;  // the residual's and y's
    bool grad_x = false, grad_w = false, grad_b = false, has_bias = false;
    Shape param_shape;
    Tensor sum, weight, mean, rstd;  // sum detached (an output); weight with its graph
  };
  AddLayerNormBackward(Device device, Saved saved)
      : Node(device, {device, device}), saved_(std::move(saved)) {}

  std::vector<Tensor> Apply(std::vector<Tensor> grads) override {
    TANDEM_CHECK(saved_.sum.defined(),
                 "Trying to backward through the graph a second time: ", name(),
                 " freed its saved tensors when the first backward through it ended. ",
                 "Pass retain_graph=true to the first backward to keep them");
    const Saved& s = saved_;
    const Tensor& grad_sum = grads[0];
    const Tensor& grad_y = grads[1];
    Tensor dx, dres, dw, db;
    if (!grad_y.defined()) {
      dx = grad_sum;  // only the stream's gradient: the add passes it through
    } else if (CreatingGraph()) {
      const std::vector<Tensor> ln = RowNormBackwardDifferentiable(
          false, s.rows, s.cols, s.eps, s.grad_x, s.grad_w, s.grad_b, s.has_bias,
          SavedOutput(s.sum, 0), s.weight, s.param_shape, grad_y);
      dx = ln[0];
      if (dx.defined() && grad_sum.defined()) dx = add(dx, grad_sum);
      if (s.weight.defined()) dw = ln[1];
      if (s.has_bias) db = ln.back();
    } else {
      const DType dtype = s.sum.dtype();
      const Device device = s.sum.device();
      const Tensor dy = ContiguousRaw(CastRaw(grad_y, s.io_dtype));
      const Tensor ds =
          s.grad_x && grad_sum.defined() ? ContiguousRaw(CastRaw(grad_sum, dtype)) : Tensor();
      if (s.grad_x) dx = NewTensor(s.sum.shape(), dtype, device);
      if (s.grad_x && s.io_dtype != dtype) dres = NewTensor(s.sum.shape(), s.io_dtype, device);
      if (s.grad_w) dw = NewTensor(s.param_shape, dtype, device);
      if (s.grad_b) db = NewTensor(s.param_shape, dtype, device);
      if (s.rows == 0) {
        if (s.grad_w) dw = FilledRaw(s.param_shape, dtype, device, 0.0);
        if (s.grad_b) db = FilledRaw(s.param_shape, dtype, device, 0.0);
      } else if (s.grad_x || s.grad_w || s.grad_b) {
        RunRowNormBackward(device, dtype, s.io_dtype, false, s.rows, s.cols, DataPtr(dy),
                           OptionalData(ds), DataPtr(s.sum), DataPtr(s.mean), DataPtr(s.rstd),
                           OptionalData(s.weight), OptionalData(dx), OptionalData(dres),
                           OptionalData(dw), OptionalData(db));
      }
    }
    // The sum's gradient is both addends' (the engine casts it for a residual of another dtype
    // where the kernel did not write it rounded).
    std::vector<Tensor> out = {dx, dres.defined() ? dres : dx};
    if (s.weight.defined()) out.push_back(dw);
    if (s.has_bias) out.push_back(db);
    return out;
  }
  std::string name() const override { return "AddLayerNormBackward"; }
  bool SupportsDoubleBackward() const override { return true; }
  void ReleaseVariables() override { saved_ = Saved(); }

 private:
  Saved saved_;
};

// add_layer_norm without autocast's casts. `io` allows a residual of another dtype than the
// input's where the kernel takes the pair (Note [Autocast residual norm]): y is then in the
// residual's dtype. Anything else of another shape, dtype or device composes add and layer_norm.
std::pair<Tensor, Tensor> AddLayerNormImpl(const Tensor& input, const Tensor& residual,
                                           const std::vector<int64_t>& normalized_shape,
                                           const Tensor& weight, const Tensor& bias, double eps,
                                           bool io) {
  CheckDefined(input, "add_layer_norm", "input");
  CheckDefined(residual, "add_layer_norm", "residual");
  const bool dtypes_fuse =
      input.dtype() == residual.dtype() || (io && IsFloatingPoint(input.dtype()) &&
                                            RowNormTakesIoDType(input.dtype(), residual.dtype()));
  if (input.shape() != residual.shape() || !dtypes_fuse || input.device() != residual.device()) {
    // Broadcasting, promotion and the errors are add's and layer_norm's.
    const Tensor sum = add(input, residual);
    return {sum, layer_norm(sum, normalized_shape, weight, bias, eps)};
  }
  CheckFloat(residual, "add_layer_norm", "residual");
  const int64_t cols = NormalizedCols(input, normalized_shape, weight, bias, "add_layer_norm");
  TANDEM_CHECK(eps >= 0.0 && std::isfinite(eps),
               "add_layer_norm: eps must be a finite value >= 0 but is ", eps);
  const Tensor x = ContiguousRaw(input), r = ContiguousRaw(residual);
  const Tensor w = weight.defined() ? ContiguousRaw(weight) : Tensor();
  const Tensor b = bias.defined() ? ContiguousRaw(bias) : Tensor();
  const int64_t rows = x.numel() / cols;
  const DType stat_dtype = x.dtype() == kFloat64 ? kFloat64 : kFloat32;
  Tensor sum = NewTensor(x.shape(), x.dtype(), x.device());
  Tensor out = NewTensor(x.shape(), r.dtype(), x.device());
  Tensor mean = NewTensor({rows}, stat_dtype, x.device());
  Tensor rstd = NewTensor({rows}, stat_dtype, x.device());
  if (rows > 0) {
    RunRowNorm(x.device(), x.dtype(), r.dtype(), false, rows, cols, eps, DataPtr(x), DataPtr(r),
               OptionalData(w), OptionalData(b), DataPtr(out), DataPtr(sum), DataPtr(mean),
               DataPtr(rstd));
  }
  std::vector<Tensor> inputs = {input, residual};
  if (weight.defined()) inputs.push_back(weight);
  if (bias.defined()) inputs.push_back(bias);
  if (NeedsGrad(inputs)) {
    AddLayerNormBackward::Saved saved;
    saved.rows = rows;
    saved.cols = cols;
    saved.eps = eps;
    saved.io_dtype = r.dtype();
    saved.grad_x = NeedsGrad({input, residual});
    saved.grad_w = weight.defined() && NeedsGrad({weight});
    saved.grad_b = bias.defined() && NeedsGrad({bias});
    saved.has_bias = bias.defined();
    saved.param_shape = Shape(normalized_shape.begin(), normalized_shape.end());
    saved.sum = sum.detach();  // an output: saved detached (no cycle), as SavedOutput expects
    saved.weight = w;          // with its graph (weight itself when contiguous)
    saved.mean = mean;
    saved.rstd = rstd;
    std::vector<Tensor> outputs = {sum, out};
    RecordMultiOutputOp(std::make_shared<AddLayerNormBackward>(x.device(), std::move(saved)),
                        inputs, outputs);
    return {outputs[0], outputs[1]};
  }
  return {sum, out};
}

}  // namespace

std::pair<Tensor, Tensor> add_layer_norm(const Tensor& input, const Tensor& residual,
                                         const std::vector<int64_t>& normalized_shape,
                                         const Tensor& weight, const Tensor& bias, double eps) {
  CheckDefined(input, "add_layer_norm", "input");
  if (!AutocastMode::IsEnabled(input.device().type()) || !autocast::IsEligible(input)) {
    return AddLayerNormImpl(input, residual, normalized_shape, weight, bias, eps, false);
  }
  // Note [Autocast residual norm]: the stream and the statistics in float32, y in the autocast
  // dtype for the GEMM that reads it; a 16-bit residual read as it is, without its cast.
  const DType lower = AutocastMode::GetDType(input.device().type());
  const auto to_float = [](const Tensor& t) {
    return t.defined() ? autocast::CastToFloat32(t) : t;
  };
  const Tensor x = to_float(input);
  const Tensor r = residual.defined() && residual.dtype() == lower ? residual : to_float(residual);
  auto [sum, y] = AddLayerNormImpl(x, r, normalized_shape, to_float(weight), to_float(bias), eps,
                                   /*io=*/true);
  if (y.dtype() != lower) y = y.to(lower);
  return {sum, y};
}

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

}  // namespace tandem
