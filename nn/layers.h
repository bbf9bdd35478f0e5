// Layers: Linear, Identity, ReLU, GELU, Tanh, Sigmoid, Flatten, Conv2d, MaxPool2d, AvgPool2d,
// AdaptiveAvgPool2d, Dropout, BatchNorm1d and BatchNorm2d, LayerNorm, RMSNorm, Embedding, as in
// PyTorch (same arguments, same default initialisation, same printed form). Each works on
// any device its parameters are on (move a layer with to(device)) and checks its input,
// naming itself, what it expected and what it got.
//
//   nn::Conv2d conv(1, 32, /*kernel_size=*/3, /*stride=*/1, /*padding=*/1);
//   nn::MaxPool2d pool(2);
//   nn::Linear fc(32 * 14 * 14, 10);
//   Tensor logits = fc.forward(pool.forward(conv.forward(images)).flatten(1));
//   std::cout << fc;   // Linear(in_features=6272, out_features=10, bias=True)
//
// Chain layers with nn::Sequential (nn/sequential.h).
#ifndef TANDEM_NN_LAYERS_H_
#define TANDEM_NN_LAYERS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "nn/module.h"
#include "tensor/base/arg.h"
#include "tensor/tensor.h"

namespace tandem::nn {

// A (height, width) pair for kernel sizes, strides and paddings: 3 means {3, 3}.
struct Size2 {
  Size2(int64_t both) : h(both), w(both) {}  // NOLINT: lets 3 stand for {3, 3}.
  Size2(int64_t height, int64_t width) : h(height), w(width) {}
  std::vector<int64_t> vec() const { return {h, w}; }
  bool square() const { return h == w; }
  int64_t h, w;
};

// y = x W^T + b over the last dimension of x ([*, in_features] -> [*, out_features]).
// Weight [out_features, in_features] and bias [out_features] start uniform in
// ±1/sqrt(in_features), as in PyTorch (its kaiming_uniform_ with a = sqrt(5) for the weight
// has exactly that bound: sqrt(6 / ((1 + a^2) * fan_in)) = 1/sqrt(fan_in)).
class Linear : public Cloneable<Linear> {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);

  void reset() override;
  // Draws new values for weight and bias from PyTorch's default distribution.
  void reset_parameters();
  Tensor forward(const Tensor& input);
  void pretty_print(std::ostream& out) const override;

  Tensor weight() const { return *weight_; }
  Tensor bias() const { return bias_ ? *bias_ : Tensor(); }  // undefined without a bias
  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }

 private:
  int64_t in_features_;
  int64_t out_features_;
  bool with_bias_;
  Parameter weight_;
  Parameter bias_;
};

class ReLU : public Cloneable<ReLU> {
 public:
  ReLU() = default;
  void reset() override {}
  Tensor forward(const Tensor& input);
};

// Returns its input (a placeholder, e.g. for a block's shortcut).
class Identity : public Cloneable<Identity> {
 public:
  Identity() = default;
  void reset() override {}
  Tensor forward(const Tensor& input);
};

// x * Phi(x) with the exact erf form, or approximate = "tanh" for
// 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))). Prints GELU(approximate='none').
class GELU : public Cloneable<GELU> {
 public:
  explicit GELU(std::string approximate = "none");
  void reset() override {}
  Tensor forward(const Tensor& input);
  void pretty_print(std::ostream& out) const override;
  const std::string& approximate() const { return approximate_; }

 private:
  std::string approximate_;
};

class Tanh : public Cloneable<Tanh> {
 public:
  Tanh() = default;
  void reset() override {}
  Tensor forward(const Tensor& input);
};

class Sigmoid : public Cloneable<Sigmoid> {
 public:
  Sigmoid() = default;
  void reset() override {}
  Tensor forward(const Tensor& input);
};

// Flattens dimensions start_dim..end_dim into one (by default all but the batch dimension).
class Flatten : public Cloneable<Flatten> {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1);
  void reset() override {}
  Tensor forward(const Tensor& input);
  void pretty_print(std::ostream& out) const override;

 private:
  int64_t start_dim_;
  int64_t end_dim_;
};

struct Conv2dOptions {
  Conv2dOptions(int64_t in_channels, int64_t out_channels, Size2 kernel_size)
      : in_channels_(in_channels), out_channels_(out_channels), kernel_size_(kernel_size) {}

  TANDEM_ARG(int64_t, in_channels);
  TANDEM_ARG(int64_t, out_channels);
  TANDEM_ARG(Size2, kernel_size);
  TANDEM_ARG(Size2, stride) = 1;
  TANDEM_ARG(Size2, padding) = 0;   // zeros on each side
  TANDEM_ARG(Size2, dilation) = 1;  // spacing between kernel taps
  TANDEM_ARG(int64_t, groups) = 1;  // in_channels and out_channels must both be divisible by it
  TANDEM_ARG(bool, bias) = true;
};

// 2-D convolution over [N, C_in, H, W] (or unbatched [C_in, H, W]) images, giving
// [N, C_out, H_out, W_out] with H_out = (H + 2 padding - dilation (kh - 1) - 1) / stride + 1.
// With groups g, the channels split into g groups and output group i sees input group i
// only (g = C_in = C_out: depthwise). Weight [C_out, C_in / g, kh, kw] and bias [C_out]
// start uniform in ±1/sqrt(fan_in), fan_in = C_in / g * kh * kw, as in PyTorch (see Linear).
//
//   nn::Conv2d depthwise(nn::Conv2dOptions(32, 32, 3).padding(1).groups(32));
//   std::cout << depthwise;   // Conv2d(32, 32, kernel_size=(3, 3), stride=(1, 1), ...
class Conv2d : public Cloneable<Conv2d> {
 public:
  explicit Conv2d(const Conv2dOptions& options);
  Conv2d(int64_t in_channels, int64_t out_channels, Size2 kernel_size, Size2 stride = 1,
         Size2 padding = 0, Size2 dilation = 1, int64_t groups = 1, bool bias = true);

  void reset() override;
  void reset_parameters();
  Tensor forward(const Tensor& input);
  void pretty_print(std::ostream& out) const override;

  Tensor weight() const { return *weight_; }
  Tensor bias() const { return bias_ ? *bias_ : Tensor(); }
  const Conv2dOptions& options() const { return options_; }

 private:
  Conv2dOptions options_;
  Parameter weight_;
  Parameter bias_;
};

// Max over kernel_size windows of [N, C, H, W] (or [C, H, W]) images. The stride defaults
// to the kernel size; padding (at most half the kernel) counts as -infinity. ceil_mode
// rounds the output size up (a last, partial window), as PyTorch: H_out =
// ceil((H + 2 padding - kernel) / stride) + 1, less one if that last window would start in
// the right padding.
class MaxPool2d : public Cloneable<MaxPool2d> {
 public:
  explicit MaxPool2d(Size2 kernel_size, std::optional<Size2> stride = std::nullopt,
                     Size2 padding = 0, bool ceil_mode = false);
  void reset() override {}
  Tensor forward(const Tensor& input);
  void pretty_print(std::ostream& out) const override;

 private:
  Size2 kernel_size_;
  Size2 stride_;
  Size2 padding_;
  bool ceil_mode_;
};

// Mean over kernel_size windows of [N, C, H, W] (or [C, H, W]) images, as
// torch.nn.AvgPool2d: stride defaults to the kernel size, padding (at most half the kernel)
// adds zeros, ceil_mode as MaxPool2d's. count_include_pad: the zeros of the padding count in
// the divisor (the window clipped to the padded input); otherwise only the pixels inside.
//
//   nn::AvgPool2d pool(3, /*stride=*/2, /*padding=*/1);
//   std::cout << pool;   // AvgPool2d(kernel_size=3, stride=2, padding=1)
class AvgPool2d : public Cloneable<AvgPool2d> {
 public:
  explicit AvgPool2d(Size2 kernel_size, std::optional<Size2> stride = std::nullopt,
                     Size2 padding = 0, bool ceil_mode = false, bool count_include_pad = true);
  void reset() override {}
  Tensor forward(const Tensor& input);
  void pretty_print(std::ostream& out) const override;

 private:
  Size2 kernel_size_;
  Size2 stride_;
  Size2 padding_;
  bool ceil_mode_;
  bool count_include_pad_;
};

// Mean over the cells of an output_size grid laid over each image of [N, C, H, W] (or
// [C, H, W]), as torch.nn.AdaptiveAvgPool2d: output (i, j) averages rows
// [floor(i H / h), ceil((i + 1) H / h)) and columns [floor(j W / w), ceil((j + 1) W / w)).
// AdaptiveAvgPool2d(1) is global average pooling.
class AdaptiveAvgPool2d : public Cloneable<AdaptiveAvgPool2d> {
 public:
  explicit AdaptiveAvgPool2d(Size2 output_size);
  void reset() override {}
  Tensor forward(const Tensor& input);
  void pretty_print(std::ostream& out) const override;

 private:
  Size2 output_size_;
};

// In training mode, zeroes each element with probability p (in [0, 1]) and scales the
// others by 1/(1-p); p = 1 gives all zeros, as in PyTorch. In evaluation mode, the identity.
//
// Where the masks come from:
//   - Without a seed: from the default generator of the input's device
//     (tandem::default_generator(device), seeded by tandem::manual_seed).
//   - With a seed: from generators of its own, one per device, all derived from that seed
//     (device index d's stream starts at counter DeviceOffsetBase(d), as the default ones
//     do). Clones share them, so a replica on device d draws from (seed, d): DataParallel's
//     replicas draw different masks, each replica's masks depend only on what ran on its
//     device, and a run is reproducible whatever the thread timing. Restart every device's
//     stream with manual_seed(seed).
// Either way, two replicas on the same device draw from one stream, in the order they run.
class Dropout : public Cloneable<Dropout> {
 public:
  explicit Dropout(double p = 0.5);
  Dropout(double p, uint64_t seed);

  void reset() override {}
  Tensor forward(const Tensor& input);
  void pretty_print(std::ostream& out) const override;

  double p() const { return p_; }
  // The seed of the layer's own generators; nullopt when it draws from the default ones.
  std::optional<uint64_t> seed() const;
  // The generator masks on `device` come from: the layer's own, or nullptr when it draws
  // from tandem::default_generator(device).
  Generator* generator(Device device = Device::Cpu(0)) const;
  // Restarts the layer's own streams on every device from `seed` (for a layer made without
  // a seed: gives it generators of its own, which clones made from then on share).
  void manual_seed(uint64_t seed);

 private:
  double p_;
  std::shared_ptr<DeviceGenerators> generators_;  // shared with clones; null: the defaults
};

// ---- Batch normalisation -----------------------------------------------------------------

// The arguments of BatchNorm1d / BatchNorm2d, with PyTorch's defaults.
struct BatchNormOptions {
  explicit BatchNormOptions(int64_t num_features) : num_features_(num_features) {}

  TANDEM_ARG(int64_t, num_features);
  TANDEM_ARG(double, eps) = 1e-5;
  // nullopt: running statistics are the cumulative (equal-weight) average of every batch.
  TANDEM_ARG(std::optional<double>, momentum) = 0.1;
  TANDEM_ARG(bool, affine) = true;
  TANDEM_ARG(bool, track_running_stats) = true;
};

// Batch normalisation over the channel dimension (dimension 1) of [N, C, *] inputs, as
// torch.nn.BatchNorm1d/2d: y = (x - mean) / sqrt(var + eps) * weight + bias per channel.
//   - Training mode (or track_running_stats=false): mean and the biased variance of the
//     batch (over N and the spatial dimensions). With running statistics, each training
//     forward also updates, without recording gradients and in place (copy_, so that handles
//     and DataParallel's re-bound replica buffers see it):
//       running_mean = (1 - m) * running_mean + m * mean
//       running_var  = (1 - m) * running_var  + m * var * n / (n - 1)   (unbiased)
//       num_batches_tracked += 1
//     with m = momentum, or 1 / num_batches_tracked when momentum is nullopt.
//   - Evaluation mode with running statistics: running_mean and running_var.
// Parameters (affine=true): weight [C] (ones) and bias [C] (zeros). Buffers
// (track_running_stats=true): running_mean [C] (zeros), running_var [C] (ones),
// num_batches_tracked (int64 scalar, 0). Built from differentiable ops, so autograd works.
// With a CrossReplicaSum (set_cross_replica_sum; parallel::distributed::ConvertSyncBatchNorm
// sets one, PyTorch's SyncBatchNorm) the batch statistics are those of every replica's batch
// together, and n counts them all.
//
//   nn::BatchNorm2d bn(16);
//   Tensor y = bn.forward(x);   // x [N, 16, H, W]
//   std::cout << bn;   // BatchNorm2d(16, eps=1e-05, momentum=0.1, affine=True, ...)
// A differentiable sum of a tensor over every replica that normalises together (each passes
// its own partial sums and gets the total): what makes a BatchNorm synchronized.
using CrossReplicaSum = std::function<Tensor(const Tensor&)>;

template <typename Derived>
class BatchNormBase : public Cloneable<Derived> {
 public:
  explicit BatchNormBase(const BatchNormOptions& options);

  // Training-mode statistics over every replica through `sum` (empty: this batch alone).
  void set_cross_replica_sum(CrossReplicaSum sum) { cross_replica_sum_ = std::move(sum); }
  bool synchronized() const { return static_cast<bool>(cross_replica_sum_); }

  void reset() override;
  void CopySettingsFrom(const Module& original) override;
  // Running statistics back to zeros, ones and 0 batches (no-op without them).
  void reset_running_stats();
  // reset_running_stats(), and weight and bias back to ones and zeros.
  void reset_parameters();
  void pretty_print(std::ostream& out) const override;

  const BatchNormOptions& options() const { return options_; }
  int64_t num_features() const { return options_.num_features(); }
  // Undefined when the layer has none (affine=false, track_running_stats=false).
  Tensor weight() const { return weight_ ? *weight_ : Tensor(); }
  Tensor bias() const { return bias_ ? *bias_ : Tensor(); }
  Tensor running_mean() const { return running_mean_ ? *running_mean_ : Tensor(); }
  Tensor running_var() const { return running_var_ ? *running_var_ : Tensor(); }
  Tensor num_batches_tracked() const {
    return num_batches_tracked_ ? *num_batches_tracked_ : Tensor();
  }

 protected:
  // Normalises an input whose shape the derived class has checked is [N, C, *].
  Tensor Normalize(const Tensor& input);

 private:
  // The running statistics' update from a batch's mean and biased variance over `count`
  // values per channel (unbiased with count / (count - 1), as PyTorch).
  void UpdateRunningStats(const Tensor& mean, const Tensor& var, double count);

  BatchNormOptions options_;
  Parameter weight_;
  Parameter bias_;
  Buffer running_mean_;
  Buffer running_var_;
  Buffer num_batches_tracked_;
  CrossReplicaSum cross_replica_sum_;
};

// Over [N, C] or [N, C, L] inputs.
class BatchNorm1d : public BatchNormBase<BatchNorm1d> {
 public:
  explicit BatchNorm1d(const BatchNormOptions& options);
  explicit BatchNorm1d(int64_t num_features, double eps = 1e-5,
                       std::optional<double> momentum = 0.1, bool affine = true,
                       bool track_running_stats = true);
  Tensor forward(const Tensor& input);
};

// Over [N, C, H, W] inputs.
class BatchNorm2d : public BatchNormBase<BatchNorm2d> {
 public:
  explicit BatchNorm2d(const BatchNormOptions& options);
  explicit BatchNorm2d(int64_t num_features, double eps = 1e-5,
                       std::optional<double> momentum = 0.1, bool affine = true,
                       bool track_running_stats = true);
  Tensor forward(const Tensor& input);
};

// ---- Layer normalisation, embeddings -------------------------------------------------------

// Normalises over the last dimensions of the input (normalized_shape, e.g. {C} or {C, H, W}),
// as torch.nn.LayerNorm: y = (x - mean) / sqrt(var + eps) * weight + bias, with the mean and
// biased variance of each sample over those dimensions, in training and evaluation alike, by
// the fused layer_norm op (one kernel forward, one backward). With elementwise_affine: weight
// (ones) and bias (zeros) of shape normalized_shape.
//
//   nn::LayerNorm norm({64});
//   Tensor y = norm.forward(x);   // x [*, 64]
//   std::cout << norm;            // LayerNorm((64,), eps=1e-05, elementwise_affine=True)
class LayerNorm : public Cloneable<LayerNorm> {
 public:
  explicit LayerNorm(std::vector<int64_t> normalized_shape, double eps = 1e-5,
                     bool elementwise_affine = true);

  void reset() override;
  // Weight back to ones, bias to zeros.
  void reset_parameters();
  Tensor forward(const Tensor& input);
  // {input + residual, forward(input + residual)} in one kernel each way (add_layer_norm,
  // tensor/ops/ops.h): a transformer block's residual add and the norm after it. Under autocast
  // the sum is float32 and the normalised output in the autocast dtype (add_layer_norm).
  //   auto [stream, h] = ln_2.forward_with_residual(x, attn_out);
  std::pair<Tensor, Tensor> forward_with_residual(const Tensor& input, const Tensor& residual);
  void pretty_print(std::ostream& out) const override;

  const std::vector<int64_t>& normalized_shape() const { return normalized_shape_; }
  double eps() const { return eps_; }
  Tensor weight() const { return weight_ ? *weight_ : Tensor(); }  // undefined without affine
  Tensor bias() const { return bias_ ? *bias_ : Tensor(); }

 private:
  std::vector<int64_t> normalized_shape_;
  double eps_;
  bool elementwise_affine_;
  Parameter weight_;
  Parameter bias_;
};

// torch.nn.RMSNorm's arguments. eps nullopt: rms_norm's default, as PyTorch's (float32's
// machine epsilon, float64's for float64 inputs).
struct RMSNormOptions {
  explicit RMSNormOptions(std::vector<int64_t> normalized_shape)
      : normalized_shape_(std::move(normalized_shape)) {}

  TANDEM_ARG(std::vector<int64_t>, normalized_shape);
  TANDEM_ARG(std::optional<double>, eps) = std::nullopt;
  TANDEM_ARG(bool, elementwise_affine) = true;
};

// Root-mean-square normalisation over the last dimensions (normalized_shape), as
// torch.nn.RMSNorm: y = x / sqrt(mean(x^2) + eps) * weight, one fused kernel each way. With
// elementwise_affine: a weight (ones) of shape normalized_shape, no bias.
//
//   nn::RMSNorm norm(nn::RMSNormOptions({64}).eps(1e-6));
//   Tensor y = norm.forward(x);   // x [*, 64]
//   std::cout << norm;            // RMSNorm((64,), eps=1e-06, elementwise_affine=True)
class RMSNorm : public Cloneable<RMSNorm> {
 public:
  explicit RMSNorm(const RMSNormOptions& options);
  explicit RMSNorm(std::vector<int64_t> normalized_shape, std::optional<double> eps = std::nullopt,
                   bool elementwise_affine = true);

  void reset() override;
  // Weight back to ones.
  void reset_parameters();
  Tensor forward(const Tensor& input);
  void pretty_print(std::ostream& out) const override;

  const RMSNormOptions& options() const { return options_; }
  Tensor weight() const { return weight_ ? *weight_ : Tensor(); }  // undefined without affine

 private:
  RMSNormOptions options_;
  Parameter weight_;
};

// torch.nn.Embedding's arguments, with its defaults.
struct EmbeddingOptions {
  EmbeddingOptions(int64_t num_embeddings, int64_t embedding_dim)
      : num_embeddings_(num_embeddings), embedding_dim_(embedding_dim) {}

  TANDEM_ARG(int64_t, num_embeddings);
  TANDEM_ARG(int64_t, embedding_dim);
  // This row starts at zeros and gets no gradient; negative counts from the end.
  TANDEM_ARG(std::optional<int64_t>, padding_idx) = std::nullopt;
  // Each forward first scales down, in place and without gradient, every row it looks up
  // whose norm_type-norm exceeds max_norm (>= 0): row *= max_norm / (norm + 1e-7).
  TANDEM_ARG(std::optional<double>, max_norm) = std::nullopt;
  // The p of that norm: positive, inf allowed.
  TANDEM_ARG(double, norm_type) = 2.0;
  // Each row's gradient is divided by how often its index occurs in the forward's input.
  TANDEM_ARG(bool, scale_grad_by_freq) = false;
};

// A lookup table: int64 indices of any shape [*] in [0, num_embeddings) give rows of the
// weight [num_embeddings, embedding_dim], as [*, embedding_dim], with torch.nn.Embedding's
// options and semantics (see EmbeddingOptions). The weight starts normal(0, 1). An index out
// of range is an error naming it. Every option works on every device: the lookup is an
// index_select, max_norm's renormalisation and scale_grad_by_freq's counts are tensor ops
// planned from the indices, which the forward reads on the host anyway to check them.
//
// max_norm writes the weight in place, as PyTorch does: the parameter itself, or under
// DataParallel the replica's copy (replica 0's writes reach the module, the others' are
// dropped, as any in-place write inside a replica). So, as PyTorch warns, a graph recorded
// before this forward that holds the weight (a tied output head's) must not be run backward
// after it: give that graph weight().clone(). Its cost: one small copy per run of
// consecutive renormalised rows, or one pass over the table when there are many.
//
//   nn::Embedding embed(1000, 64, /*padding_idx=*/0);
//   Tensor vectors = embed.forward(token_ids);   // int64 [B, T] -> [B, T, 64]
//   std::cout << embed;   // Embedding(1000, 64, padding_idx=0)
//   nn::Embedding bounded(nn::EmbeddingOptions(1000, 64).max_norm(1.0).scale_grad_by_freq(true));
//   std::cout << bounded;   // Embedding(1000, 64, max_norm=1.0, scale_grad_by_freq=True)
class Embedding : public Cloneable<Embedding> {
 public:
  explicit Embedding(const EmbeddingOptions& options);
  Embedding(int64_t num_embeddings, int64_t embedding_dim,
            std::optional<int64_t> padding_idx = std::nullopt);

  void reset() override;
  // Redraws the weight from normal(0, 1), zeroing the padding row.
  void reset_parameters();
  Tensor forward(const Tensor& indices);
  void pretty_print(std::ostream& out) const override;

  Tensor weight() const { return *weight_; }
  // padding_idx, when set, is in [0, num_embeddings).
  const EmbeddingOptions& options() const { return options_; }
  int64_t num_embeddings() const { return options_.num_embeddings(); }
  int64_t embedding_dim() const { return options_.embedding_dim(); }
  std::optional<int64_t> padding_idx() const { return options_.padding_idx(); }

 private:
  // max_norm: scales down the rows of the weight at `ids` (sorted, distinct) in place.
  void Renormalize(const std::vector<int64_t>& ids);

  EmbeddingOptions options_;
  Parameter weight_;
};

}  // namespace tandem::nn

#endif  // TANDEM_NN_LAYERS_H_
