// The trainer's and the benchmarks' models for 28x28 grey images in 10 classes:
//   mlp: Flatten, Linear(784, 256), ReLU, Linear(256, 128), ReLU, Linear(128, 10)
//   cnn: two blocks of Conv2d(3x3, padding 1) + ReLU + MaxPool2d(2) (32 and 64 channels),
//        Flatten, Linear(3136, 128), ReLU, Linear(128, 10)
//   resnet: a small residual network: a Conv2d(3x3) + BatchNorm2d + ReLU stem (16 channels),
//        three stages of one BasicBlock each (16, 32, 64 channels at 28x28, 14x14, 7x7; a
//        stride-2 Conv2d + BatchNorm2d + ReLU between stages), AdaptiveAvgPool2d(1), Flatten,
//        Linear(64, 10)
//
//   std::shared_ptr<nn::Sequential> model = examples::MakeModel("mlp");
#ifndef TANDEM_EXAMPLES_MODELS_H_
#define TANDEM_EXAMPLES_MODELS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "nn/nn.h"

namespace tandem::examples {

// ResNet's basic block with an identity shortcut, for `channels` in and out:
//   relu(x + bn2(conv2(relu(bn1(conv1(x))))))   (3x3 convolutions, padding 1, no bias)
class BasicBlock : public nn::Cloneable<BasicBlock> {
 public:
  explicit BasicBlock(int64_t channels);
  void reset() override;
  Tensor forward(const Tensor& x);

 private:
  int64_t channels_;
  std::shared_ptr<nn::Conv2d> conv1_, conv2_;
  std::shared_ptr<nn::BatchNorm2d> bn1_, bn2_;
};

// Throws examples::UsageError for a kind other than "mlp", "cnn" or "resnet".
std::shared_ptr<nn::Sequential> MakeModel(const std::string& kind);

// Floats per sample that a training step must keep from forward for backward, at least:
// the input, the output of every ReLU and max-pool, the logits and their log-softmax (what
// PyTorch's autograd saves for these layers, without max-pool's indices).
int64_t SavedActivationsPerSample(const std::string& kind);

}  // namespace tandem::examples

#endif  // TANDEM_EXAMPLES_MODELS_H_
