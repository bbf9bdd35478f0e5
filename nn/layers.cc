#include "nn/layers.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tensor/core/autograd.h"
#include "tensor/tensor.h"  // TANDEM_AUTOCAST (tensor/ops/autocast.h)

namespace tandem::nn {
namespace {

// PyTorch's tuple form, "(3, 3)".
std::string Tuple(Size2 size) {
  return "(" + std::to_string(size.h) + ", " + std::to_string(size.w) + ")";
}

// PyTorch prints a pooling size as given: an int when square, else a tuple.
std::string IntOrTuple(Size2 size) { return size.square() ? std::to_string(size.h) : Tuple(size); }

const char* PythonBool(bool value) { return value ? "True" : "False"; }

// Python's repr of a float: the shortest digits that read back as `value`, in exponent
// form below 1e-4 and from 1e16 on ("1e-05", "0.1", "1.0", "1e+16").
std::string PythonFloat(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buffer[32];
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(buffer, sizeof(buffer), "%.*e", digits - 1, value);
    if (std::strtod(buffer, nullptr) == value) break;
  }
  std::string text = buffer;  // [-]d[.ddd]e(+|-)xx
  const bool negative = text[0] == '-';
  if (negative) text.erase(0, 1);
  const size_t e = text.find('e');
  const int exponent = std::atoi(text.c_str() + e + 1);
  std::string digits;
  for (size_t i = 0; i < e; ++i) {
    if (text[i] != '.') digits += text[i];
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out;
  if (exponent < -4 || exponent >= 16) {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char suffix[16];
    std::snprintf(suffix, sizeof(suffix), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    out += suffix;
  } else if (exponent < 0) {
    out = "0." + std::string(-exponent - 1, '0') + digits;
  } else if (static_cast<int>(digits.size()) <= exponent + 1) {
    out = digits + std::string(exponent + 1 - digits.size(), '0') + ".0";
  } else {
    out = digits.substr(0, exponent + 1) + "." + digits.substr(exponent + 1);
  }
  return negative ? "-" + out : out;
}

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

// ---- Activations, Identity, Flatten -----------------------------------------------------

Tensor ReLU::forward(const Tensor& input) {
  CheckDefinedInput(input, *this);
  return relu(input);
}

Tensor Identity::forward(const Tensor& input) {
  CheckDefinedInput(input, *this);
  return input;
}

GELU::GELU(std::string approximate) : approximate_(std::move(approximate)) {
  TANDEM_CHECK(approximate_ == "none" || approximate_ == "tanh",
               "GELU: approximate must be 'none' (the exact erf form) or 'tanh' but is '",
               approximate_, "'");
}

Tensor GELU::forward(const Tensor& input) {
  CheckDefinedInput(input, *this);
  return gelu(input, approximate_);
}

void GELU::pretty_print(std::ostream& out) const { out << "approximate='" << approximate_ << "'"; }

Tensor Tanh::forward(const Tensor& input) {
  CheckDefinedInput(input, *this);
  return tanh(input);
}

Tensor Sigmoid::forward(const Tensor& input) {
  CheckDefinedInput(input, *this);
  return sigmoid(input);
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
  TANDEM_CHECK(o.in_channels() > 0 && o.out_channels() > 0,
               "Conv2d: in_channels and out_channels must be positive but are ", o.in_channels(),
               " and ", o.out_channels());
  TANDEM_CHECK(o.kernel_size().h > 0 && o.kernel_size().w > 0,
               "Conv2d: kernel_size must be positive but is ", Tuple(o.kernel_size()));
  TANDEM_CHECK(o.stride().h > 0 && o.stride().w > 0, "Conv2d: stride must be positive but is ",
               Tuple(o.stride()));
  TANDEM_CHECK(o.padding().h >= 0 && o.padding().w >= 0,
               "Conv2d: padding must be non-negative but is ", Tuple(o.padding()));
  TANDEM_CHECK(o.dilation().h > 0 && o.dilation().w > 0,
               "Conv2d: dilation must be positive but is ", Tuple(o.dilation()));
  TANDEM_CHECK(o.groups() > 0, "Conv2d: groups must be positive but is ", o.groups());
  TANDEM_CHECK(o.in_channels() % o.groups() == 0, "Conv2d: in_channels (", o.in_channels(),
               ") must be divisible by groups (", o.groups(), "); choose groups among the ",
               "common divisors of in_channels and out_channels");
  TANDEM_CHECK(o.out_channels() % o.groups() == 0, "Conv2d: out_channels (", o.out_channels(),
               ") must be divisible by groups (", o.groups(), "); choose groups among the ",
               "common divisors of in_channels and out_channels");
  reset();
}

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, Size2 kernel_size, Size2 stride,
               Size2 padding, Size2 dilation, int64_t groups, bool bias)
    : Conv2d(Conv2dOptions(in_channels, out_channels, kernel_size)
                 .stride(stride)
                 .padding(padding)
                 .dilation(dilation)
                 .groups(groups)
                 .bias(bias)) {}

namespace {

// PyTorch's bound for Conv2d's weight (kaiming_uniform_ with a = sqrt(5)) and bias:
// 1/sqrt(fan_in), fan_in = in_channels / groups * kh * kw.
double ConvInitBound(const Conv2dOptions& o) {
  const int64_t fan_in = o.in_channels() / o.groups() * o.kernel_size().h * o.kernel_size().w;
  return 1.0 / std::sqrt(static_cast<double>(fan_in));
}

}  // namespace

void Conv2d::reset() {
  const Conv2dOptions& o = options_;
  const double bound = ConvInitBound(o);
  auto init = [&](const Shape& shape) {
    return cloning() ? empty(shape) : uniform(shape, -bound, bound);
  };
  weight_ = register_parameter("weight", init({o.out_channels(), o.in_channels() / o.groups(),
                                               o.kernel_size().h, o.kernel_size().w}));
  if (o.bias()) bias_ = register_parameter("bias", init({o.out_channels()}));
}

void Conv2d::reset_parameters() {
  const double bound = ConvInitBound(options_);
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
  TANDEM_CHECK(input.size(1) == o.in_channels(), ToString(), ": expected input with ",
               o.in_channels(), " channels (dimension 1 of [N, C, H, W]) but got ",
               ShapeToString(input.shape()));
  const int64_t padded_h = input.size(2) + 2 * o.padding().h;
  const int64_t padded_w = input.size(3) + 2 * o.padding().w;
  const int64_t span_h = o.dilation().h * (o.kernel_size().h - 1) + 1;
  const int64_t span_w = o.dilation().w * (o.kernel_size().w - 1) + 1;
  TANDEM_CHECK(
      padded_h >= span_h && padded_w >= span_w, ToString(), ": input ",
      ShapeToString(input.shape()), " is too small: its ", input.size(2), "x", input.size(3),
      " images (", padded_h, "x", padded_w, " with padding) are smaller than the ", span_h, "x",
      span_w, " kernel",
      span_h != o.kernel_size().h || span_w != o.kernel_size().w ? " (with dilation)" : "");
  CheckSameDevice(input, *weight_, *this);
  return conv2d(input, *weight_, bias(), o.stride().vec(), o.padding().vec(), o.dilation().vec(),
                o.groups());
}

void Conv2d::pretty_print(std::ostream& out) const {
  const Conv2dOptions& o = options_;
  out << o.in_channels() << ", " << o.out_channels() << ", kernel_size=" << Tuple(o.kernel_size())
      << ", stride=" << Tuple(o.stride());
  if (o.padding().h != 0 || o.padding().w != 0) out << ", padding=" << Tuple(o.padding());
  if (o.dilation().h != 1 || o.dilation().w != 1) out << ", dilation=" << Tuple(o.dilation());
  if (o.groups() != 1) out << ", groups=" << o.groups();
  if (!o.bias()) out << ", bias=False";
}

// ---- MaxPool2d -------------------------------------------------------------------------

namespace {

// A pooling layer's window: positive kernel and stride, padding at most half the kernel.
void CheckPoolWindow(const char* layer, Size2 kernel_size, Size2 stride, Size2 padding) {
  TANDEM_CHECK(kernel_size.h > 0 && kernel_size.w > 0, layer,
               ": kernel_size must be positive but is ", Tuple(kernel_size));
  TANDEM_CHECK(stride.h > 0 && stride.w > 0, layer, ": stride must be positive but is ",
               Tuple(stride));
  TANDEM_CHECK(padding.h >= 0 && padding.w >= 0 && 2 * padding.h <= kernel_size.h &&
                   2 * padding.w <= kernel_size.w,
               layer, ": padding must be between 0 and half the kernel size, but is ",
               Tuple(padding), " for kernel_size ", Tuple(kernel_size));
}

}  // namespace

MaxPool2d::MaxPool2d(Size2 kernel_size, std::optional<Size2> stride, Size2 padding, bool ceil_mode)
    : kernel_size_(kernel_size),
      stride_(stride.value_or(kernel_size)),
      padding_(padding),
      ceil_mode_(ceil_mode) {
  CheckPoolWindow("MaxPool2d", kernel_size_, stride_, padding_);
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
  return max_pool2d(input, kernel_size_.vec(), stride_.vec(), padding_.vec(), ceil_mode_);
}

void MaxPool2d::pretty_print(std::ostream& out) const {
  out << "kernel_size=" << IntOrTuple(kernel_size_) << ", stride=" << IntOrTuple(stride_)
      << ", padding=" << IntOrTuple(padding_)
      << ", dilation=1, ceil_mode=" << PythonBool(ceil_mode_);
}

// ---- AvgPool2d, AdaptiveAvgPool2d ----------------------------------------------------------

AvgPool2d::AvgPool2d(Size2 kernel_size, std::optional<Size2> stride, Size2 padding, bool ceil_mode,
                     bool count_include_pad)
    : kernel_size_(kernel_size),
      stride_(stride.value_or(kernel_size)),
      padding_(padding),
      ceil_mode_(ceil_mode),
      count_include_pad_(count_include_pad) {
  CheckPoolWindow("AvgPool2d", kernel_size_, stride_, padding_);
}

Tensor AvgPool2d::forward(const Tensor& input) {
  CheckDefinedInput(input, *this);
  if (input.dim() == 3) return forward(input.unsqueeze(0)).squeeze(0);
  TANDEM_CHECK(input.dim() == 4, ToString(),
               ": expected a 4-D input [N, C, H, W] (or 3-D [C, H, W]) but got ",
               ShapeToString(input.shape()));
  const int64_t padded_h = input.size(2) + 2 * padding_.h;
  const int64_t padded_w = input.size(3) + 2 * padding_.w;
  TANDEM_CHECK(padded_h >= kernel_size_.h && padded_w >= kernel_size_.w, ToString(), ": input ",
               ShapeToString(input.shape()), " is too small: its ", input.size(2), "x",
               input.size(3), " images (", padded_h, "x", padded_w,
               " with padding) are smaller than the ", kernel_size_.h, "x", kernel_size_.w,
               " window");
  return avg_pool2d(input, kernel_size_.vec(), stride_.vec(), padding_.vec(), ceil_mode_,
                    count_include_pad_);
}

void AvgPool2d::pretty_print(std::ostream& out) const {
  out << "kernel_size=" << IntOrTuple(kernel_size_) << ", stride=" << IntOrTuple(stride_)
      << ", padding=" << IntOrTuple(padding_);
}

AdaptiveAvgPool2d::AdaptiveAvgPool2d(Size2 output_size) : output_size_(output_size) {
  TANDEM_CHECK(output_size_.h > 0 && output_size_.w > 0,
               "AdaptiveAvgPool2d: output_size must be positive but is ", Tuple(output_size_));
}

Tensor AdaptiveAvgPool2d::forward(const Tensor& input) {
  CheckDefinedInput(input, *this);
  if (input.dim() == 3) return forward(input.unsqueeze(0)).squeeze(0);
  TANDEM_CHECK(input.dim() == 4, ToString(),
               ": expected a 4-D input [N, C, H, W] (or 3-D [C, H, W]) but got ",
               ShapeToString(input.shape()));
  TANDEM_CHECK(input.size(2) > 0 && input.size(3) > 0, ToString(), ": input ",
               ShapeToString(input.shape()), " has empty images; height and width must be > 0");
  return adaptive_avg_pool2d(input, output_size_.vec());
}

void AdaptiveAvgPool2d::pretty_print(std::ostream& out) const {
  out << "output_size=" << IntOrTuple(output_size_);
}

// ---- Dropout ---------------------------------------------------------------------------

Dropout::Dropout(double p) : p_(p) {
  TANDEM_CHECK(p >= 0.0 && p <= 1.0, "Dropout: p (the probability of zeroing an element) must be ",
               "in [0, 1] but is ", p);
}

Dropout::Dropout(double p, uint64_t seed) : Dropout(p) {
  generators_ = std::make_shared<DeviceGenerators>(seed);
}

std::optional<uint64_t> Dropout::seed() const {
  if (generators_ == nullptr) return std::nullopt;
  return generators_->seed();
}

Generator* Dropout::generator(Device device) const {
  return generators_ != nullptr ? &generators_->get(device) : nullptr;
}

void Dropout::manual_seed(uint64_t seed) {
  if (generators_ == nullptr) {
    generators_ = std::make_shared<DeviceGenerators>(seed);
  } else {
    generators_->manual_seed(seed);
  }
}

Tensor Dropout::forward(const Tensor& input) {
  CheckDefinedInput(input, *this);
  return dropout(input, p_, is_training(), generator(input.device()));
}

void Dropout::pretty_print(std::ostream& out) const {
  out << "p=" << PythonFloat(p_) << ", inplace=False";
}

// ---- BatchNorm1d, BatchNorm2d ----------------------------------------------------------

template <typename Derived>
BatchNormBase<Derived>::BatchNormBase(const BatchNormOptions& options) : options_(options) {
  const char* name = std::is_same_v<Derived, BatchNorm1d> ? "BatchNorm1d" : "BatchNorm2d";
  TANDEM_CHECK(options_.num_features() > 0, name, ": num_features (the number of channels) must ",
               "be positive but is ", options_.num_features());
  TANDEM_CHECK(options_.eps() >= 0.0 && std::isfinite(options_.eps()), name,
               ": eps must be a finite value >= 0 but is ", options_.eps());
  TANDEM_CHECK(!options_.momentum() || (*options_.momentum() >= 0.0 && *options_.momentum() <= 1.0),
               name, ": momentum must be in [0, 1] (or nullopt for a cumulative average) but is ",
               options_.momentum().value_or(0.0));
  reset();
}

template <typename Derived>
void BatchNormBase<Derived>::CopySettingsFrom(const Module& original) {
  // A clone synchronizes as its original does (DataParallel's replicas of a converted layer).
  if (const auto* norm = dynamic_cast<const BatchNormBase*>(&original)) {
    cross_replica_sum_ = norm->cross_replica_sum_;
  }
}

template <typename Derived>
void BatchNormBase<Derived>::reset() {
  const int64_t c = options_.num_features();
  if (options_.affine()) {
    weight_ = this->register_parameter("weight", ones({c}));
    bias_ = this->register_parameter("bias", zeros({c}));
  }
  if (options_.track_running_stats()) {
    running_mean_ = this->register_buffer("running_mean", zeros({c}));
    running_var_ = this->register_buffer("running_var", ones({c}));
    num_batches_tracked_ = this->register_buffer("num_batches_tracked", zeros({}, kInt64));
  }
}

template <typename Derived>
void BatchNormBase<Derived>::reset_running_stats() {
  if (!options_.track_running_stats()) return;
  NoGradGuard no_grad;
  Tensor(*running_mean_).zero_();
  Tensor(*running_var_).fill_(1.0);
  Tensor(*num_batches_tracked_).zero_();
}

template <typename Derived>
void BatchNormBase<Derived>::reset_parameters() {
  reset_running_stats();
  if (!options_.affine()) return;
  NoGradGuard no_grad;
  Tensor(*weight_).fill_(1.0);
  Tensor(*bias_).zero_();
}

template <typename Derived>
void BatchNormBase<Derived>::pretty_print(std::ostream& out) const {
  out << options_.num_features() << ", eps=" << PythonFloat(options_.eps()) << ", momentum="
      << (options_.momentum() ? PythonFloat(*options_.momentum()) : std::string("None"))
      << ", affine=" << PythonBool(options_.affine())
      << ", track_running_stats=" << PythonBool(options_.track_running_stats());
}

template <typename Derived>
Tensor BatchNormBase<Derived>::Normalize(const Tensor& input) {
  TANDEM_AUTOCAST(kFloat32, Normalize, input);  // norms stay in float32 under autocast
  const int64_t c = options_.num_features();
  TANDEM_CHECK(IsFloatingPoint(input.dtype()), this->ToString(),
               ": expected a floating-point input (float32 or float64) but got ", input.dtype(),
               "; convert it with .to(kFloat32)");
  TANDEM_CHECK(input.size(1) == c, this->ToString(), ": expected input with ", c,
               " channels (dimension 1) but got ", ShapeToString(input.shape()));
  const Tensor reference = weight_ ? *weight_ : running_mean();
  if (reference.defined()) CheckSameDevice(input, reference, *this);

  // Per-channel statistics broadcast as [1, C, 1, ...].
  Shape channel_shape(input.dim(), 1);
  channel_shape[1] = c;
  std::vector<int64_t> reduce_dims = {0};
  for (int64_t d = 2; d < input.dim(); ++d) reduce_dims.push_back(d);
  const int64_t per_channel = c > 0 ? input.numel() / c : 0;

  const bool use_batch_stats = this->is_training() || !options_.track_running_stats();
  Tensor normalized;
  if (use_batch_stats && cross_replica_sum_) {
    // Sums over every replica's batch: the channel sums with this replica's count appended,
    // then the squared deviations from the common mean (two passes, as the local path).
    const Tensor local = cat(
        {input.sum(reduce_dims), full({1}, static_cast<double>(per_channel),
                                      TensorOptions().dtype(input.dtype()).device(input.device()))},
        0);
    const Tensor total = cross_replica_sum_(local);
    const double count = total.narrow(0, c, 1).item();
    TANDEM_CHECK(count > 1, this->ToString(),
                 ": Expected more than 1 value per channel over every replica when training, "
                 "got ",
                 count, " (this replica's input ", ShapeToString(input.shape()),
                 "); use larger batches (or call eval() to use the running statistics)");
    const Tensor mean = (total.narrow(0, 0, c) / count).view(channel_shape);
    const Tensor centered = input - mean;
    const Tensor var = (cross_replica_sum_(square(centered).sum(reduce_dims)) / count)
                           .view(channel_shape);  // biased
    normalized = centered / sqrt(var + options_.eps());
    if (this->is_training() && options_.track_running_stats()) {
      UpdateRunningStats(mean, var, count);
    }
  } else if (use_batch_stats) {
    TANDEM_CHECK(per_channel > 1, this->ToString(),
                 ": Expected more than 1 value per channel when training, got input size ",
                 ShapeToString(input.shape()),
                 "; use a batch of at least 2 samples (or call eval() to use the running "
                 "statistics)");
    const Tensor mean = input.mean(reduce_dims, /*keepdim=*/true);
    const Tensor centered = input - mean;
    const Tensor var = square(centered).mean(reduce_dims, /*keepdim=*/true);  // biased
    normalized = centered / sqrt(var + options_.eps());
    if (this->is_training() && options_.track_running_stats()) {
      UpdateRunningStats(mean, var, static_cast<double>(per_channel));
    }
  } else {
    const Tensor mean = running_mean_->view(channel_shape);
    const Tensor var = running_var_->view(channel_shape);
    normalized = (input - mean) / sqrt(var + options_.eps());
  }
  if (!options_.affine()) return normalized;
  return normalized * weight_->view(channel_shape) + bias_->view(channel_shape);
}

template <typename Derived>
void BatchNormBase<Derived>::UpdateRunningStats(const Tensor& mean, const Tensor& var,
                                                double count) {
  NoGradGuard no_grad;
  const int64_t c = options_.num_features();
  Tensor batches = *num_batches_tracked_;
  batches.add_(1.0);
  const double factor = options_.momentum() ? *options_.momentum() : 1.0 / batches.item();
  const double unbias = count / (count - 1);
  Tensor running_mean = *running_mean_;
  Tensor running_var = *running_var_;
  running_mean.copy_(running_mean * (1.0 - factor) + mean.detach().view({c}) * factor);
  running_var.copy_(running_var * (1.0 - factor) + var.detach().view({c}) * (unbias * factor));
}

template class BatchNormBase<BatchNorm1d>;
template class BatchNormBase<BatchNorm2d>;

namespace {

BatchNormOptions MakeBatchNormOptions(int64_t num_features, double eps,
                                      std::optional<double> momentum, bool affine,
                                      bool track_running_stats) {
  return BatchNormOptions(num_features)
      .eps(eps)
      .momentum(momentum)
      .affine(affine)
      .track_running_stats(track_running_stats);
}

}  // namespace

BatchNorm1d::BatchNorm1d(const BatchNormOptions& options) : BatchNormBase(options) {}

BatchNorm1d::BatchNorm1d(int64_t num_features, double eps, std::optional<double> momentum,
                         bool affine, bool track_running_stats)
    : BatchNorm1d(MakeBatchNormOptions(num_features, eps, momentum, affine, track_running_stats)) {}

Tensor BatchNorm1d::forward(const Tensor& input) {
  CheckDefinedInput(input, *this);
  TANDEM_CHECK(input.dim() == 2 || input.dim() == 3, ToString(),
               ": expected a 2-D input [N, C] or a 3-D input [N, C, L] but got ",
               ShapeToString(input.shape()), " (", input.dim(),
               "-D); use BatchNorm2d for [N, C, H, W] images");
  return Normalize(input);
}

BatchNorm2d::BatchNorm2d(const BatchNormOptions& options) : BatchNormBase(options) {}

BatchNorm2d::BatchNorm2d(int64_t num_features, double eps, std::optional<double> momentum,
                         bool affine, bool track_running_stats)
    : BatchNorm2d(MakeBatchNormOptions(num_features, eps, momentum, affine, track_running_stats)) {}

Tensor BatchNorm2d::forward(const Tensor& input) {
  CheckDefinedInput(input, *this);
  TANDEM_CHECK(input.dim() == 4, ToString(), ": expected a 4-D input [N, C, H, W] but got ",
               ShapeToString(input.shape()), " (", input.dim(),
               "-D); use BatchNorm1d for [N, C] or [N, C, L]");
  return Normalize(input);
}

// ---- LayerNorm -------------------------------------------------------------------------

LayerNorm::LayerNorm(std::vector<int64_t> normalized_shape, double eps, bool elementwise_affine)
    : normalized_shape_(std::move(normalized_shape)),
      eps_(eps),
      elementwise_affine_(elementwise_affine) {
  TANDEM_CHECK(!normalized_shape_.empty(), "LayerNorm: normalized_shape must name at least one ",
               "dimension (e.g. {features}) but is empty");
  for (int64_t size : normalized_shape_) {
    TANDEM_CHECK(size > 0, "LayerNorm: normalized_shape must have positive sizes but is ",
                 ShapeToString(normalized_shape_));
  }
  TANDEM_CHECK(eps_ >= 0.0 && std::isfinite(eps_), "LayerNorm: eps must be a finite value >= 0 ",
               "but is ", eps_);
  reset();
}

void LayerNorm::reset() {
  if (!elementwise_affine_) return;
  weight_ = register_parameter("weight", ones(normalized_shape_));
  bias_ = register_parameter("bias", zeros(normalized_shape_));
}

void LayerNorm::reset_parameters() {
  if (!elementwise_affine_) return;
  NoGradGuard no_grad;
  Tensor(*weight_).fill_(1.0);
  Tensor(*bias_).zero_();
}

Tensor LayerNorm::forward(const Tensor& input) {
  TANDEM_AUTOCAST(kFloat32, forward, input);  // norms stay in float32 under autocast
  CheckDefinedInput(input, *this);
  const int64_t count = static_cast<int64_t>(normalized_shape_.size());
  const int64_t lead = input.dim() - count;
  const bool matches = lead >= 0 && std::equal(normalized_shape_.begin(), normalized_shape_.end(),
                                               input.shape().begin() + std::max<int64_t>(lead, 0));
  TANDEM_CHECK(matches, ToString(), ": expected an input whose last ", count, " dimension(s) are ",
               ShapeToString(normalized_shape_), " but got ", ShapeToString(input.shape()));
  TANDEM_CHECK(IsFloatingPoint(input.dtype()), ToString(),
               ": expected a floating-point input (float32 or float64) but got ", input.dtype(),
               "; convert it with .to(kFloat32)");
  if (weight_) CheckSameDevice(input, *weight_, *this);
  // One fused kernel each way (Note [Fused row norms]), instead of nine ops and nodes.
  return layer_norm(input, normalized_shape_, weight(), bias(), eps_);
}

std::pair<Tensor, Tensor> LayerNorm::forward_with_residual(const Tensor& input,
                                                           const Tensor& residual) {
  CheckDefinedInput(input, *this);
  CheckDefinedInput(residual, *this);
  return add_layer_norm(input, residual, normalized_shape_, weight(), bias(), eps_);
}

void LayerNorm::pretty_print(std::ostream& out) const {
  // normalized_shape prints as a Python tuple: (64,) or (3, 4).
  out << "(";
  for (size_t i = 0; i < normalized_shape_.size(); ++i) {
    out << (i > 0 ? ", " : "") << normalized_shape_[i];
  }
  out << (normalized_shape_.size() == 1 ? ",)" : ")") << ", eps=" << PythonFloat(eps_)
      << ", elementwise_affine=" << PythonBool(elementwise_affine_);
}

// ---- RMSNorm ---------------------------------------------------------------------------

RMSNorm::RMSNorm(const RMSNormOptions& options) : options_(options) {
  const std::vector<int64_t>& shape = options_.normalized_shape();
  TANDEM_CHECK(!shape.empty(), "RMSNorm: normalized_shape must name at least one dimension ",
               "(e.g. {features}) but is empty");
  for (int64_t size : shape) {
    TANDEM_CHECK(size > 0, "RMSNorm: normalized_shape must have positive sizes but is ",
                 ShapeToString(shape));
  }
  if (options_.eps()) {
    TANDEM_CHECK(*options_.eps() >= 0.0 && std::isfinite(*options_.eps()),
                 "RMSNorm: eps must be a finite value >= 0 (or nullopt for the input dtype's "
                 "machine epsilon) but is ",
                 *options_.eps());
  }
  reset();
}

RMSNorm::RMSNorm(std::vector<int64_t> normalized_shape, std::optional<double> eps,
                 bool elementwise_affine)
    : RMSNorm(RMSNormOptions(std::move(normalized_shape))
                  .eps(eps)
                  .elementwise_affine(elementwise_affine)) {}

void RMSNorm::reset() {
  if (!options_.elementwise_affine()) return;
  weight_ = register_parameter("weight", ones(options_.normalized_shape()));
}

void RMSNorm::reset_parameters() {
  if (!options_.elementwise_affine()) return;
  NoGradGuard no_grad;
  Tensor(*weight_).fill_(1.0);
}

Tensor RMSNorm::forward(const Tensor& input) {
  CheckDefinedInput(input, *this);
  const std::vector<int64_t>& shape = options_.normalized_shape();
  const int64_t count = static_cast<int64_t>(shape.size());
  const int64_t lead = input.dim() - count;
  const bool matches = lead >= 0 && std::equal(shape.begin(), shape.end(),
                                               input.shape().begin() + std::max<int64_t>(lead, 0));
  TANDEM_CHECK(matches, ToString(), ": expected an input whose last ", count, " dimension(s) are ",
               ShapeToString(shape), " but got ", ShapeToString(input.shape()));
  TANDEM_CHECK(IsFloatingPoint(input.dtype()), ToString(),
               ": expected a floating-point input but got ", input.dtype(),
               "; convert it with .to(kFloat32)");
  if (weight_) CheckSameDevice(input, *weight_, *this);
  return rms_norm(input, shape, weight(), options_.eps());
}

void RMSNorm::pretty_print(std::ostream& out) const {
  const std::vector<int64_t>& shape = options_.normalized_shape();
  out << "(";
  for (size_t i = 0; i < shape.size(); ++i) out << (i > 0 ? ", " : "") << shape[i];
  out << (shape.size() == 1 ? ",)" : ")")
      << ", eps=" << (options_.eps() ? PythonFloat(*options_.eps()) : std::string("None"))
      << ", elementwise_affine=" << PythonBool(options_.elementwise_affine());
}

// ---- Embedding -------------------------------------------------------------------------

namespace {

// Renormalised rows are written back one run of consecutive indices at a time while there
// are at most this many runs (a copy each: cheap for a few, a kernel launch each on a GPU);
// beyond it, by one pass that scales the whole table (by 1 outside those rows, which leaves
// them exactly as they are).
constexpr size_t kMaxRenormRunCopies = 16;

// The norm_type-norm of each row of `rows` [n, d], as [n, 1], in float32 at least (as
// PyTorch's renorm accumulates reduced-precision rows).
Tensor RowNorms(const Tensor& rows, double p) {
  const Tensor x = rows.dtype() == kFloat64 ? rows : rows.to(kFloat32);
  if (std::isinf(p)) return amax(abs(x), 1, /*keepdim=*/true);
  if (p == 1.0) return sum(abs(x), {1}, /*keepdim=*/true);
  if (p == 2.0) return sqrt(sum(square(x), {1}, /*keepdim=*/true));
  return pow(sum(pow(abs(x), p), {1}, /*keepdim=*/true), 1.0 / p);
}

// `x` with the gradient reaching it multiplied by `factor` (broadcast to x's shape) on the
// way back; the values are x's, untouched.
Tensor ScaleGradient(const Tensor& x, const Tensor& factor) {
  if (!NeedsGrad({x})) return x;
  Tensor out = x.detach();
  RecordOp(
      "EmbeddingScaleGradByFreqBackward", {x}, out,
      [factor](const Tensor& grad) {
        return std::vector<Tensor>{mul(grad, factor).to(grad.dtype())};
      },
      DoubleBackward::kSupported);
  return out;
}

}  // namespace

Embedding::Embedding(const EmbeddingOptions& options) : options_(options) {
  const int64_t num_embeddings = options_.num_embeddings();
  const int64_t embedding_dim = options_.embedding_dim();
  TANDEM_CHECK(num_embeddings > 0 && embedding_dim > 0,
               "Embedding: num_embeddings and embedding_dim must be positive but are ",
               num_embeddings, " and ", embedding_dim);
  if (const std::optional<int64_t> padding_idx = options_.padding_idx()) {
    TANDEM_CHECK(*padding_idx >= -num_embeddings && *padding_idx < num_embeddings,
                 "Embedding: padding_idx must be within num_embeddings: in [", -num_embeddings,
                 ", ", num_embeddings, ") but is ", *padding_idx);
    if (*padding_idx < 0) options_.padding_idx(*padding_idx + num_embeddings);
  }
  if (const std::optional<double> max_norm = options_.max_norm()) {
    TANDEM_CHECK(*max_norm >= 0.0,
                 "Embedding: max_norm (the largest norm a looked-up row may keep) must be >= 0 "
                 "but is ",
                 *max_norm, "; pass a non-negative bound, or leave max_norm unset for none");
  }
  TANDEM_CHECK(options_.norm_type() > 0.0,
               "Embedding: norm_type (the p of the p-norm that max_norm bounds) must be "
               "positive but is ",
               options_.norm_type(), "; 2 is the Euclidean norm, inf the largest magnitude");
  reset();
}

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim,
                     std::optional<int64_t> padding_idx)
    : Embedding(EmbeddingOptions(num_embeddings, embedding_dim).padding_idx(padding_idx)) {}

void Embedding::reset() {
  const Shape shape = {num_embeddings(), embedding_dim()};
  if (cloning()) {
    weight_ = register_parameter("weight", empty(shape));
    return;
  }
  weight_ = register_parameter("weight", randn(shape));
  if (const std::optional<int64_t> padding_idx = options_.padding_idx()) {
    NoGradGuard no_grad;
    weight_->narrow(0, *padding_idx, 1).zero_();
  }
}

void Embedding::reset_parameters() {
  NoGradGuard no_grad;
  Tensor target = *weight_;
  target.copy_(randn(target.shape(), TensorOptions().device(target.device())));
  if (const std::optional<int64_t> padding_idx = options_.padding_idx()) {
    target.narrow(0, *padding_idx, 1).zero_();
  }
}

void Embedding::Renormalize(const std::vector<int64_t>& ids) {
  NoGradGuard no_grad;
  Tensor table = *weight_;
  const Device device = table.device();
  const int64_t count = static_cast<int64_t>(ids.size());
  const Tensor rows =
      index_select(table, 0, from_vector(ids, {count}, TensorOptions().device(device)));
  // PyTorch's arithmetic: the norm accumulated in float32 (float64 for float64 rows), then
  // scale = max_norm / (norm + 1e-7) in double, by which the row is multiplied in float32 (or
  // float64) and rounded to its dtype.
  const std::vector<double> norms =
      RowNorms(rows, options_.norm_type()).to(Device::Cpu(0)).to(kFloat64).to_vector<double>();
  const double max_norm = *options_.max_norm();
  const DType scale_dtype = table.dtype() == kFloat64 ? kFloat64 : kFloat32;
  std::vector<double> scale(ids.size(), 1.0);
  // Runs of consecutive rows to write: [first position in ids, length).
  std::vector<std::pair<int64_t, int64_t>> runs;
  for (int64_t i = 0; i < count; ++i) {
    if (!(norms[i] > max_norm)) continue;
    scale[i] = max_norm / (norms[i] + 1e-7);
    if (!runs.empty() && runs.back().first + runs.back().second == i && ids[i - 1] + 1 == ids[i]) {
      ++runs.back().second;
    } else {
      runs.push_back({i, 1});
    }
  }
  if (runs.empty()) return;
  if (runs.size() <= kMaxRenormRunCopies) {
    const Tensor scaled =
        rows * from_vector(scale, {count, 1}, TensorOptions(scale_dtype).device(device));
    for (const auto& [first, length] : runs) {
      table.narrow(0, ids[first], length).copy_(scaled.narrow(0, first, length));
    }
    return;
  }
  std::vector<double> table_scale(num_embeddings(), 1.0);
  for (int64_t i = 0; i < count; ++i) table_scale[ids[i]] = scale[i];
  const Tensor factor =
      from_vector(table_scale, {num_embeddings(), 1}, TensorOptions(scale_dtype).device(device));
  if (table.dtype() == scale_dtype) {
    table.mul_(factor);
  } else {  // mul_ would round the factor to the table's reduced dtype first
    table.copy_(table * factor);
  }
}

Tensor Embedding::forward(const Tensor& indices) {
  CheckDefinedInput(indices, *this);
  TANDEM_CHECK(indices.dtype() == kInt64, ToString(), ": expected int64 indices but got ",
               indices.dtype(), "; convert them with .to(kInt64)");
  CheckSameDevice(indices, *weight_, *this);
  const Tensor flat = indices.reshape({-1});
  // On the CPU, and for max_norm's and scale_grad_by_freq's plans, the indices are read on the
  // host once, to name a bad one. On a GPU without those options they stay there: the gather
  // kernel checks them and the next host synchronization reports a bad one (Note [Device-side
  // index checks], tensor/cuda/kernels.h), so a training step need not wait for the GPU here.
  const bool read_on_host =
      flat.device().is_cpu() || options_.max_norm() || options_.scale_grad_by_freq();
  const std::vector<int64_t> values =
      read_on_host ? flat.to_vector<int64_t>() : std::vector<int64_t>{};
  for (size_t i = 0; i < values.size(); ++i) {
    TANDEM_CHECK(values[i] >= 0 && values[i] < num_embeddings(), ToString(), ": index ", values[i],
                 " (element ", i, " of the ", ShapeToString(indices.shape()),
                 " input) is out of range; indices must be in [0, ", num_embeddings(),
                 ") (num_embeddings)");
  }
  std::vector<int64_t> ids;  // distinct, sorted
  if (options_.max_norm() || options_.scale_grad_by_freq()) {
    ids = values;
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  }
  if (options_.max_norm() && !ids.empty()) Renormalize(ids);
  Tensor rows = index_select(*weight_, 0, flat);
  if (options_.scale_grad_by_freq() && NeedsGrad({rows})) {
    // Each occurrence's gradient over its index's count in this input (position of each
    // element's index in ids, then the counts).
    std::vector<int64_t> slot(values.size()), counts(ids.size(), 0);
    for (size_t i = 0; i < values.size(); ++i) {
      slot[i] = std::lower_bound(ids.begin(), ids.end(), values[i]) - ids.begin();
      ++counts[slot[i]];
    }
    std::vector<double> factor(values.size());
    for (size_t i = 0; i < values.size(); ++i) factor[i] = 1.0 / counts[slot[i]];
    const DType dtype = rows.dtype() == kFloat64 ? kFloat64 : kFloat32;
    rows = ScaleGradient(rows, from_vector(factor, {static_cast<int64_t>(factor.size()), 1},
                                           TensorOptions(dtype).device(rows.device())));
  }
  if (const std::optional<int64_t> padding_idx = options_.padding_idx()) {
    // The padding row's value, without a path for its gradient.
    const Tensor is_padding = eq(flat, full({}, static_cast<double>(*padding_idx),
                                            TensorOptions(kInt64).device(flat.device())))
                                  .unsqueeze(1);
    rows = where(is_padding, rows.detach(), rows);
  }
  Shape out_shape = indices.shape();
  out_shape.push_back(embedding_dim());
  return rows.reshape(out_shape);
}

void Embedding::pretty_print(std::ostream& out) const {
  out << num_embeddings() << ", " << embedding_dim();
  if (options_.padding_idx()) out << ", padding_idx=" << *options_.padding_idx();
  if (options_.max_norm()) out << ", max_norm=" << PythonFloat(*options_.max_norm());
  if (options_.norm_type() != 2.0) out << ", norm_type=" << PythonFloat(options_.norm_type());
  if (options_.scale_grad_by_freq()) out << ", scale_grad_by_freq=True";
}

}  // namespace tandem::nn
