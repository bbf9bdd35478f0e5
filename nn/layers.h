// Layers: Linear, ReLU, Flatten, Conv2d, MaxPool2d and Dropout, as in PyTorch (same
// arguments, same default initialisation, same printed form). Each works on any device its
// parameters are on (move a layer with to(device)) and checks its input, naming itself,
// what it expected and what it got.
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
#include <memory>
#include <optional>
#include <ostream>
#include <vector>

#include "nn/module.h"
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
// ±1/sqrt(in_features), as in PyTorch.
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
  Conv2dOptions& stride(Size2 value) {
    stride_ = value;
    return *this;
  }
  Conv2dOptions& padding(Size2 value) {
    padding_ = value;
    return *this;
  }
  Conv2dOptions& bias(bool value) {
    bias_ = value;
    return *this;
  }

  int64_t in_channels_;
  int64_t out_channels_;
  Size2 kernel_size_;
  Size2 stride_ = 1;
  Size2 padding_ = 0;  // zeros on each side
  bool bias_ = true;
};

// 2-D convolution over [N, C_in, H, W] (or unbatched [C_in, H, W]) images, giving
// [N, C_out, H_out, W_out]. Weight [C_out, C_in, kh, kw] and bias [C_out] start uniform in
// ±1/sqrt(C_in * kh * kw), as in PyTorch.
class Conv2d : public Cloneable<Conv2d> {
 public:
  explicit Conv2d(const Conv2dOptions& options);
  Conv2d(int64_t in_channels, int64_t out_channels, Size2 kernel_size, Size2 stride = 1,
         Size2 padding = 0, bool bias = true);

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
// to the kernel size; padding (at most half the kernel) counts as -infinity.
class MaxPool2d : public Cloneable<MaxPool2d> {
 public:
  explicit MaxPool2d(Size2 kernel_size, std::optional<Size2> stride = std::nullopt,
                     Size2 padding = 0);
  void reset() override {}
  Tensor forward(const Tensor& input);
  void pretty_print(std::ostream& out) const override;

 private:
  Size2 kernel_size_;
  Size2 stride_;
  Size2 padding_;
};

// In training mode, zeroes each element with probability p and scales the others by
// 1/(1-p); in evaluation mode, the identity. Draws from the process-wide generator
// (tandem::manual_seed), or from a generator of its own when given a seed. Clones share
// the generator, so DataParallel's replicas draw different masks.
class Dropout : public Cloneable<Dropout> {
 public:
  explicit Dropout(double p = 0.5);
  Dropout(double p, uint64_t seed);

  void reset() override {}
  Tensor forward(const Tensor& input);
  void pretty_print(std::ostream& out) const override;

  double p() const { return p_; }
  // The generator masks come from (nullptr: the process-wide one).
  Generator* generator() const { return generator_.get(); }

 private:
  double p_;
  std::shared_ptr<Generator> generator_;
};

}  // namespace tandem::nn

#endif  // TANDEM_NN_LAYERS_H_
