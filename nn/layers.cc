#include "nn/layers.h"

#include <cmath>
#include <sstream>
#include <string>

#include "tensor/autograd.h"

namespace tandem::nn {
namespace {

// PyTorch's tuple form, "(3, 3)".
std::string Tuple(Size2 size) {
  return "(" + std::to_string(size.h) + ", " + std::to_string(size.w) + ")";
}

// PyTorch prints a pooling size as given: an int when square, else a tuple.
std::string IntOrTuple(Size2 size) { return size.square() ? std::to_string(size.h) : Tuple(size); }

const char* PythonBool(bool value) { return value ? "True" : "False"; }

// The module's description is built only when a check fails: forward() stays cheap.
void CheckDefinedInput(const Tensor& input, const Module& module) {
  TANDEM_CHECK(input.defined(), module.ToString(), ": the input tensor is undefined");
}

void CheckSameDevice(const Tensor& input, const Tensor& weight, const Module& module) {
  TANDEM_CHECK(input.device() == weight.device(), module.ToString(), ": the input is on ",
               input.device(), " but the parameters are on ", weight.device(),
               "; move the input with .to(", weight.device(), ") or the module with .to(",
               input.device(), ")");
}

// A copy of `tensor` with values drawn uniformly from [-bound, bound], on its device.
void FillUniform(const Tensor& tensor, double bound) {
  NoGradGuard no_grad;
  Tensor target = tensor;
  target.copy_(uniform(tensor.shape(), -bound, bound, TensorOptions().device(tensor.device())));
}

}  // namespace

// ---- Linear ----------------------------------------------------------------------------

Linear::Linear(int64_t in_features, int64_t out_features, bool bias)
    : in_features_(in_features), out_features_(out_features), with_bias_(bias) {
  TANDEM_CHECK(in_features > 0 && out_features > 0,
               "Linear: in_features and out_features must be positive but are ", in_features,
               " and ", out_features);
  reset();
}

void Linear::reset() {
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_features_));
  auto init = [&](const Shape& shape) {
    return cloning() ? empty(shape) : uniform(shape, -bound, bound);
  };
  weight_ = register_parameter("weight", init({out_features_, in_features_}));
  if (with_bias_) bias_ = register_parameter("bias", init({out_features_}));
}

void Linear::reset_parameters() {
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_features_));
  FillUniform(*weight_, bound);
  if (bias_) FillUniform(*bias_, bound);
}

Tensor Linear::forward(const Tensor& input) {
  const auto describe = [&] {
    return "Linear(in_features=" + std::to_string(in_features_) +
           ", out_features=" + std::to_string(out_features_) + ")";
  };
  TANDEM_CHECK(input.defined(), describe(), ": the input tensor is undefined");
  TANDEM_CHECK(input.dim() >= 1 && input.size(-1) == in_features_, describe(),
               ": expected input with last dimension ", in_features_, " but got ",
               ShapeToString(input.shape()));
  CheckSameDevice(input, *weight_, *this);
  return linear(input, *weight_, bias());
}

void Linear::pretty_print(std::ostream& out) const {
  out << "in_features=" << in_features_ << ", out_features=" << out_features_
      << ", bias=" << PythonBool(with_bias_);
}

// ---- ReLU, Flatten ---------------------------------------------------------------------

Tensor ReLU::forward(const Tensor& input) {
  CheckDefinedInput(input, *this);
  return relu(input);
}

Flatten::Flatten(int64_t start_dim, int64_t end_dim) : start_dim_(start_dim), end_dim_(end_dim) {}

Tensor Flatten::forward(const Tensor& input) {
  CheckDefinedInput(input, *this);
  const int64_t ndim = input.dim();
  const int64_t start = start_dim_ < 0 ? start_dim_ + ndim : start_dim_;
  const int64_t end = end_dim_ < 0 ? end_dim_ + ndim : end_dim_;
  TANDEM_CHECK(start >= 0 && start < ndim && end >= 0 && end < ndim && start <= end, ToString(),
               ": cannot flatten dimensions ", start_dim_, "..", end_dim_, " of an input of shape ",
               ShapeToString(input.shape()), " (", ndim, " dimensions)");
  return input.flatten(start, end);
}

void Flatten::pretty_print(std::ostream& out) const {
  out << "start_dim=" << start_dim_ << ", end_dim=" << end_dim_;
}

// ---- Conv2d ----------------------------------------------------------------------------

Conv2d::Conv2d(const Conv2dOptions& options) : options_(options) {
  const Conv2dOptions& o = options_;
  TANDEM_CHECK(o.in_channels_ > 0 && o.out_channels_ > 0,
               "Conv2d: in_channels and out_channels must be positive but are ", o.in_channels_,
               " and ", o.out_channels_);
  TANDEM_CHECK(o.kernel_size_.h > 0 && o.kernel_size_.w > 0,
               "Conv2d: kernel_size must be positive but is ", Tuple(o.kernel_size_));
  TANDEM_CHECK(o.stride_.h > 0 && o.stride_.w > 0, "Conv2d: stride must be positive but is ",
               Tuple(o.stride_));
  TANDEM_CHECK(o.padding_.h >= 0 && o.padding_.w >= 0,
               "Conv2d: padding must be non-negative but is ", Tuple(o.padding_));
  reset();
}

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, Size2 kernel_size, Size2 stride,
               Size2 padding, bool bias)
    : Conv2d(Conv2dOptions(in_channels, out_channels, kernel_size)
                 .stride(stride)
                 .padding(padding)
                 .bias(bias)) {}

void Conv2d::reset() {
  const Conv2dOptions& o = options_;
  const int64_t fan_in = o.in_channels_ * o.kernel_size_.h * o.kernel_size_.w;
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  auto init = [&](const Shape& shape) {
    return cloning() ? empty(shape) : uniform(shape, -bound, bound);
  };
  weight_ = register_parameter(
      "weight", init({o.out_channels_, o.in_channels_, o.kernel_size_.h, o.kernel_size_.w}));
  if (o.bias_) bias_ = register_parameter("bias", init({o.out_channels_}));
}

void Conv2d::reset_parameters() {
  const Conv2dOptions& o = options_;
  const int64_t fan_in = o.in_channels_ * o.kernel_size_.h * o.kernel_size_.w;
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  FillUniform(*weight_, bound);
  if (bias_) FillUniform(*bias_, bound);
}

Tensor Conv2d::forward(const Tensor& input) {
  const Conv2dOptions& o = options_;
  CheckDefinedInput(input, *this);
  if (input.dim() == 3) return forward(input.unsqueeze(0)).squeeze(0);
  TANDEM_CHECK(input.dim() == 4, ToString(),
               ": expected a 4-D input [N, C, H, W] (or 3-D [C, H, W]) ", "but got ",
               ShapeToString(input.shape()));
  TANDEM_CHECK(input.size(1) == o.in_channels_, ToString(), ": expected input with ",
               o.in_channels_, " channels (dimension 1 of [N, C, H, W]) but got ",
               ShapeToString(input.shape()));
  const int64_t padded_h = input.size(2) + 2 * o.padding_.h;
  const int64_t padded_w = input.size(3) + 2 * o.padding_.w;
  TANDEM_CHECK(padded_h >= o.kernel_size_.h && padded_w >= o.kernel_size_.w, ToString(), ": input ",
               ShapeToString(input.shape()), " is too small: its ", input.size(2), "x",
               input.size(3), " images (", padded_h, "x", padded_w,
               " with padding) are smaller than the ", o.kernel_size_.h, "x", o.kernel_size_.w,
               " kernel");
  CheckSameDevice(input, *weight_, *this);
  return conv2d(input, *weight_, bias(), o.stride_.vec(), o.padding_.vec());
}

void Conv2d::pretty_print(std::ostream& out) const {
  const Conv2dOptions& o = options_;
  out << o.in_channels_ << ", " << o.out_channels_ << ", kernel_size=" << Tuple(o.kernel_size_)
      << ", stride=" << Tuple(o.stride_);
  if (o.padding_.h != 0 || o.padding_.w != 0) out << ", padding=" << Tuple(o.padding_);
  if (!o.bias_) out << ", bias=False";
}

// ---- MaxPool2d -------------------------------------------------------------------------

MaxPool2d::MaxPool2d(Size2 kernel_size, std::optional<Size2> stride, Size2 padding)
    : kernel_size_(kernel_size), stride_(stride.value_or(kernel_size)), padding_(padding) {
  TANDEM_CHECK(kernel_size_.h > 0 && kernel_size_.w > 0,
               "MaxPool2d: kernel_size must be positive but is ", Tuple(kernel_size_));
  TANDEM_CHECK(stride_.h > 0 && stride_.w > 0, "MaxPool2d: stride must be positive but is ",
               Tuple(stride_));
  TANDEM_CHECK(padding_.h >= 0 && padding_.w >= 0 && 2 * padding_.h <= kernel_size_.h &&
                   2 * padding_.w <= kernel_size_.w,
               "MaxPool2d: padding must be between 0 and half the kernel size, but is ",
               Tuple(padding_), " for kernel_size ", Tuple(kernel_size_));
}

Tensor MaxPool2d::forward(const Tensor& input) {
  CheckDefinedInput(input, *this);
  if (input.dim() == 3) return forward(input.unsqueeze(0)).squeeze(0);
  TANDEM_CHECK(input.dim() == 4, ToString(),
               ": expected a 4-D input [N, C, H, W] (or 3-D [C, H, W]) ", "but got ",
               ShapeToString(input.shape()));
  const int64_t padded_h = input.size(2) + 2 * padding_.h;
  const int64_t padded_w = input.size(3) + 2 * padding_.w;
  TANDEM_CHECK(padded_h >= kernel_size_.h && padded_w >= kernel_size_.w, ToString(), ": input ",
               ShapeToString(input.shape()), " is too small: its ", input.size(2), "x",
               input.size(3), " images (", padded_h, "x", padded_w,
               " with padding) are smaller than the ", kernel_size_.h, "x", kernel_size_.w,
               " window");
  return max_pool2d(input, kernel_size_.vec(), stride_.vec(), padding_.vec());
}

void MaxPool2d::pretty_print(std::ostream& out) const {
  out << "kernel_size=" << IntOrTuple(kernel_size_) << ", stride=" << IntOrTuple(stride_)
      << ", padding=" << IntOrTuple(padding_) << ", dilation=1, ceil_mode=False";
}

// ---- Dropout ---------------------------------------------------------------------------

Dropout::Dropout(double p) : p_(p) {
  TANDEM_CHECK(p >= 0.0 && p < 1.0, "Dropout: p (the probability of zeroing an element) must be ",
               "in [0, 1) but is ", p);
}

Dropout::Dropout(double p, uint64_t seed) : Dropout(p) {
  generator_ = std::make_shared<Generator>(seed);
}

Tensor Dropout::forward(const Tensor& input) {
  CheckDefinedInput(input, *this);
  return dropout(input, p_, is_training(), generator_.get());
}

void Dropout::pretty_print(std::ostream& out) const { out << "p=" << p_ << ", inplace=False"; }

}  // namespace tandem::nn
