// Convolution and pooling: conv2d, max_pool2d, avg_pool2d and adaptive_avg_pool2d.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tensor/base/error.h"
#include "tensor/core/autograd.h"
#include "tensor/core/internal/tensor_impl.h"
#include "tensor/core/tensor.h"
#include "tensor/kernels/conv_kernels.h"
#include "tensor/kernels/pooling_kernels.h"
#include "tensor/ops/autocast.h"
#include "tensor/ops/internal/op_helpers.h"
#include "tensor/ops/ops.h"
#include "tensor/runtime/backend.h"

namespace tandem {

namespace {

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
  const Device device = grad_output.device();
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
    RunCol2Im(device, dtype, g, DataPtr(grad_columns), DataPtr(grad_input));
  }
  if (grad_w) {
    // Per image: grad_n[group] [O_g, L] · columns_n[group]^T [L, K_g]; summed over images.
    Tensor columns = NewTensor({batch, patch, plane}, dtype, grad_output.device());
    RunIm2Col(device, dtype, g, DataPtr(sx), DataPtr(columns));
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

// What conv2d's backward needs to know of its forward.
struct Conv2dSaved {
  Conv2dGeometry g;
  int64_t groups, out_channels;
  bool work;  // a non-empty problem
  std::vector<int64_t> stride, padding, dilation;
  Shape input_shape, weight_shape;
  Device input_device;
};

// conv2d's gradients with raw kernels: {input's, weight's (, bias's)}, each undefined where
// not asked for. sx is the contiguous input (for the weight's), sw the contiguous weight (for
// the input's).
std::vector<Tensor> Conv2dGradsRaw(const Conv2dSaved& s, bool grad_x, bool grad_w, bool has_bias,
                                   bool grad_b, const Tensor& sx, const Tensor& sw,
                                   const Tensor& grad_output) {
  const int64_t batch = s.g.batch, plane = s.g.out_h() * s.g.out_w();
  const int64_t patch = s.g.channels * s.g.kernel_h * s.g.kernel_w;
  const int64_t group_out = s.out_channels / s.groups, group_patch = patch / s.groups;
  const int64_t cols = batch * plane;
  Backend& backend = BackendOf(grad_output);
  const DType dtype = grad_output.dtype();
  const int index = IndexOf(grad_output);
  const Device device = grad_output.device();
  if (s.work && s.groups == 1) {
    // The backend's own kernels where it has them, as in the forward.
    const Tensor grad = ContiguousRaw(grad_output);
    Tensor grad_input, grad_weight, grad_bias;
    bool done = true;
    if (grad_x) {
      grad_input = NewTensor(s.input_shape, dtype, s.input_device);
      const auto conv = Conv2dBackwardDataKernel.Find(device.type());
      done = conv != nullptr && conv(index, dtype, s.g, s.out_channels, DataPtr(grad), DataPtr(sw),
                                     DataPtr(grad_input));
    }
    if (done && grad_w) {
      grad_weight = NewTensor(s.weight_shape, dtype, s.input_device);
      if (grad_b) grad_bias = NewTensor({s.out_channels}, dtype, s.input_device);
      const auto conv = Conv2dBackwardWeightsKernel.Find(device.type());
      done = conv != nullptr &&
             conv(index, dtype, s.g, s.out_channels, DataPtr(sx), DataPtr(grad),
                  DataPtr(grad_weight), grad_b ? static_cast<void*>(DataPtr(grad_bias)) : nullptr);
    }
    if (done) {
      if (grad_b && !grad_bias.defined()) {
        grad_bias =
            ViewRaw(ReduceRaw(grad, {0, 2, 3}, ReduceKind::kSum, "conv2d"), {s.out_channels});
      }
      std::vector<Tensor> grads = {grad_input, grad_weight};
      if (has_bias) grads.push_back(grad_bias);
      return grads;
    }
  }
  if (s.work && !s.g.batch_in_columns) {
    return PerImageConv2dBackward(s.g, s.groups, grad_x, grad_w, has_bias, grad_b, s.out_channels,
                                  sx, sw, s.weight_shape, grad_output);
  }
  // The gradient as [O, N*L], the layout of the forward's product.
  Tensor grad;
  if (s.work) {
    const Tensor g3 = ContiguousRaw(grad_output);
    grad = ContiguousRaw(MakeView(g3, {s.out_channels, batch, plane},
                                  {plane, s.out_channels * plane, 1}, g3.storage_offset()));
  }
  Tensor grad_input, grad_weight, grad_bias;
  if (grad_x) {
    // Col2Im overwrites every element, so only an empty problem needs a fill.
    grad_input = s.work ? NewTensor(s.input_shape, dtype, s.input_device)
                        : FilledRaw(s.input_shape, dtype, s.input_device, 0.0);
    if (s.work) {
      // columns_g [K_g, N*L] = W_g^T [K_g, O_g] · grad_g [O_g, N*L], then folded back.
      Tensor grad_columns = NewTensor({patch, batch, plane}, dtype, s.input_device);
      backend.Gemm(index, dtype, true, false, group_patch, cols, group_out, 1.0f, DataPtr(sw),
                   group_patch, group_out * group_patch, DataPtr(grad), cols, group_out * cols,
                   0.0f, DataPtr(grad_columns), cols, group_patch * cols, s.groups);
      RunCol2Im(device, dtype, s.g, DataPtr(grad_columns), DataPtr(grad_input));
    }
  }
  if (grad_w) {
    if (s.work) {
      // W_g [O_g, K_g] = grad_g [O_g, N*L] · columns_g^T [N*L, K_g]: the sum over
      // images is the GEMM's inner dimension.
      Tensor columns = NewTensor({patch, batch, plane}, dtype, s.input_device);
      RunIm2Col(device, dtype, s.g, DataPtr(sx), DataPtr(columns));
      grad_weight = NewTensor(s.weight_shape, dtype, s.input_device);
      backend.Gemm(index, dtype, false, true, group_out, group_patch, cols, 1.0f, DataPtr(grad),
                   cols, group_out * cols, DataPtr(columns), cols, group_patch * cols, 0.0f,
                   DataPtr(grad_weight), group_patch, group_out * group_patch, s.groups);
    } else {
      grad_weight = FilledRaw(s.weight_shape, dtype, s.input_device, 0.0);
    }
  }
  if (grad_b) {
    grad_bias = s.work
                    ? ViewRaw(ReduceRaw(grad, {1, 2}, ReduceKind::kSum, "conv2d"), {s.out_channels})
                    : FilledRaw({s.out_channels}, dtype, s.input_device, 0.0);
  }
  std::vector<Tensor> grads = {grad_input, grad_weight};
  if (has_bias) grads.push_back(grad_bias);
  return grads;
}

Tensor Conv2dWeightGrad(const Conv2dSaved& s, const Tensor& input, const Tensor& grad);

// conv2d's gradient with respect to its input (the transposed convolution of `grad` with
// `weight`), for backward under create_graph. It is linear in both, and <Dx(g, w), u> =
// <g, conv2d(u, w)>, so its own backward is conv2d for `grad` and the weight's gradient of
// conv2d(u, .) for `weight`: the three functions differentiate each other to any order.
Tensor Conv2dInputGrad(const Conv2dSaved& s, const Tensor& grad, const Tensor& weight) {
  Tensor out =
      Conv2dGradsRaw(s, true, false, false, false, Tensor(), ContiguousRaw(weight), grad)[0];
  if (NeedsGrad({grad, weight})) {
    Record(
        "Conv2dBackwardBackward", {grad, weight}, out,
        [s, grad, weight, need_grad = NeedsGrad({grad}),
         need_weight = NeedsGrad({weight})](const Tensor& u) {
          return std::vector<Tensor>{
              need_grad ? conv2d(u, weight, Tensor(), s.stride, s.padding, s.dilation, s.groups)
                        : Tensor(),
              need_weight ? Conv2dWeightGrad(s, u, grad) : Tensor()};
        },
        DoubleBackward::kSupported);
  }
  return out;
}

// conv2d's gradient with respect to its weight, for backward under create_graph: bilinear in
// input and grad, with <Dw(x, g), v> = <g, conv2d(x, v)>.
Tensor Conv2dWeightGrad(const Conv2dSaved& s, const Tensor& input, const Tensor& grad) {
  Tensor out =
      Conv2dGradsRaw(s, false, true, false, false, ContiguousRaw(input), Tensor(), grad)[1];
  if (NeedsGrad({input, grad})) {
    Record(
        "Conv2dBackwardBackward", {input, grad}, out,
        [s, input, grad, need_input = NeedsGrad({input}),
         need_grad = NeedsGrad({grad})](const Tensor& v) {
          return std::vector<Tensor>{
              need_input ? Conv2dInputGrad(s, grad, v) : Tensor(),
              need_grad ? conv2d(input, v, Tensor(), s.stride, s.padding, s.dilation, s.groups)
                        : Tensor()};
        },
        DoubleBackward::kSupported);
  }
  return out;
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
  const Device device = x.device();

  Tensor out;
  // The backend's own convolution first (oneDNN's on the CPU for bfloat16): im2col's columns
  // are K times the image, and in bfloat16 building them costs more than the GEMM saves.
  bool direct = false;
  if (work && groups == 1) {
    const Tensor b = bias.defined() ? ContiguousRaw(bias) : Tensor();
    out = NewTensor({batch, out_channels, oh, ow}, dtype, x.device());
    // Device types without a kernel of their own (CUDA) take im2col + GEMM.
    const auto conv = Conv2dForwardKernel.Find(device.type());
    direct = conv != nullptr &&
             conv(index, dtype, g, out_channels, DataPtr(x), DataPtr(w),
                  b.defined() ? static_cast<void*>(DataPtr(b)) : nullptr, DataPtr(out));
    if (!direct) out = Tensor();  // not held while the im2col path below runs
  }
  if (direct) {
    // Computed above.
  } else if (work && !g.batch_in_columns) {
    Tensor columns = NewTensor({batch, patch, plane}, x.dtype(), x.device());
    RunIm2Col(device, dtype, g, DataPtr(x), DataPtr(columns));
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
    RunIm2Col(device, dtype, g, DataPtr(x), DataPtr(columns));
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
    const Conv2dSaved saved{g,
                            groups,
                            out_channels,
                            work,
                            {stride_h, stride_w},
                            {pad_h, pad_w},
                            {dilation_h, dilation_w},
                            input.shape(),
                            weight.shape(),
                            input.device()};
    // Only what the gradients need stays alive until backward: x for the weight's, w for the
    // input's (an image model's first layer needs no input gradient). They keep their graphs
    // (x and w are input and weight themselves when those are contiguous), so that under
    // create_graph the gradients differentiate again.
    const Tensor sx = grad_w ? x : Tensor(), sw = grad_x ? w : Tensor();
    Record(
        "Conv2dBackward", inputs, out,
        [saved, grad_x, grad_w, has_bias, grad_b, sx, sw](const Tensor& grad_output) {
          if (CreatingGraph()) {
            std::vector<Tensor> grads = {
                grad_x ? Conv2dInputGrad(saved, grad_output, sw) : Tensor(),
                grad_w ? Conv2dWeightGrad(saved, sx, grad_output) : Tensor()};
            if (has_bias) grads.push_back(grad_b ? sum(grad_output, {0, 2, 3}) : Tensor());
            return grads;
          }
          return Conv2dGradsRaw(saved, grad_x, grad_w, has_bias, grad_b, sx, sw, grad_output);
        },
        SupportedIfSame({{sx, input}, {sw, weight}}));
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

// The pooling gradients are linear in the output's gradient; each is recorded under
// create_graph with its adjoint as backward (the pooling itself, or for max pooling a gather
// at the chosen positions), so they differentiate again to any order.

// max_pool2d's gradient: grad_output added at the argmax positions of each plane.
Tensor MaxPool2dGrad(const Conv2dGeometry& g, const Tensor& argmax, const Shape& input_shape,
                     const Tensor& grad_output) {
  const Tensor grad = ContiguousRaw(grad_output);
  Tensor grad_input = NewTensor(input_shape, grad.dtype(), grad.device());
  if (grad.numel() > 0) {
    RunMaxPool2dBackward(grad.device(), grad.dtype(), g, DataPtr(grad), Int64Ptr(argmax),
                         DataPtr(grad_input));
  } else if (grad_input.numel() > 0) {
    BackendOf(grad).Fill(IndexOf(grad), ToKernel(grad_input), 0.0);
  }
  if (CreatingGraph() && NeedsGrad({grad_output})) {
    Record(
        "MaxPool2dBackwardBackward", {grad_output}, grad_input,
        [argmax, out_shape = grad_output.shape()](const Tensor& u) {
          const Shape& o = out_shape;
          const Tensor planes = u.reshape({u.size(0), u.size(1), u.size(2) * u.size(3)});
          return std::vector<Tensor>{
              gather(planes, 2, argmax.reshape({o[0], o[1], o[2] * o[3]})).reshape(o)};
        },
        DoubleBackward::kSupported);
  }
  return grad_input;
}

// What avg_pool2d's backward needs to run it again (its adjoint's adjoint).
struct AvgPoolArgs {
  Conv2dGeometry g;
  std::vector<int64_t> kernel_size, stride, padding;
  bool ceil_mode, count_include_pad;
};

Tensor AvgPool2dGrad(const AvgPoolArgs& a, const Shape& input_shape, const Tensor& grad_output) {
  const Tensor grad = ContiguousRaw(grad_output);
  Tensor grad_input = NewTensor(input_shape, grad.dtype(), grad.device());
  if (grad_input.numel() > 0) {
    RunAvgPool2dBackward(grad.device(), grad.dtype(), a.g, a.count_include_pad, DataPtr(grad),
                         DataPtr(grad_input));
  }
  if (CreatingGraph() && NeedsGrad({grad_output})) {
    Record(
        "AvgPool2dBackwardBackward", {grad_output}, grad_input,
        [a](const Tensor& u) {
          return std::vector<Tensor>{
              avg_pool2d(u, a.kernel_size, a.stride, a.padding, a.ceil_mode, a.count_include_pad)};
        },
        DoubleBackward::kSupported);
  }
  return grad_input;
}

Tensor AdaptiveAvgPool2dGrad(const Shape& input_shape, int64_t out_h, int64_t out_w,
                             const Tensor& grad_output) {
  const Tensor grad = ContiguousRaw(grad_output);
  Tensor grad_input = NewTensor(input_shape, grad.dtype(), grad.device());
  const int64_t planes = input_shape[0] * input_shape[1];
  if (planes > 0) {
    AdaptiveAvgPool2dBackwardKernel(grad.device(), grad.dtype(), planes, input_shape[2],
                                    input_shape[3], out_h, out_w, DataPtr(grad),
                                    DataPtr(grad_input));
  }
  if (CreatingGraph() && NeedsGrad({grad_output})) {
    Record(
        "AdaptiveAvgPool2dBackwardBackward", {grad_output}, grad_input,
        [out_h, out_w](const Tensor& u) {
          return std::vector<Tensor>{adaptive_avg_pool2d(u, {out_h, out_w})};
        },
        DoubleBackward::kSupported);
  }
  return grad_input;
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
    RunMaxPool2d(x.device(), x.dtype(), g, DataPtr(x), DataPtr(out), Int64Ptr(argmax));
  }
  if (NeedsGrad({input})) {
    Record(
        "MaxPool2dBackward", {input}, out,
        [g, argmax, input_shape = input.shape()](const Tensor& grad_output) {
          return std::vector<Tensor>{MaxPool2dGrad(g, argmax, input_shape, grad_output)};
        },
        DoubleBackward::kSupported);
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
    RunAvgPool2d(x.device(), x.dtype(), g, count_include_pad, DataPtr(x), DataPtr(out));
  }
  if (NeedsGrad({input})) {
    const AvgPoolArgs args{g, kernel_size, stride, padding, ceil_mode, count_include_pad};
    Record(
        "AvgPool2dBackward", {input}, out,
        [args, input_shape = input.shape()](const Tensor& grad_output) {
          return std::vector<Tensor>{AvgPool2dGrad(args, input_shape, grad_output)};
        },
        DoubleBackward::kSupported);
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
    AdaptiveAvgPool2dKernel(x.device(), x.dtype(), planes, height, width, out_h, out_w, DataPtr(x),
                            DataPtr(out));
  }
  if (NeedsGrad({input})) {
    Record(
        "AdaptiveAvgPool2dBackward", {input}, out,
        [input_shape = input.shape(), out_h = out_h, out_w = out_w](const Tensor& grad_output) {
          return std::vector<Tensor>{AdaptiveAvgPool2dGrad(input_shape, out_h, out_w, grad_output)};
        },
        DoubleBackward::kSupported);
  }
  return out;
}

}  // namespace tandem
