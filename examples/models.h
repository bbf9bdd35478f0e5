// The trainer's and the benchmarks' models for 28x28 grey images in 10 classes:
//   mlp: Flatten, Linear(784, 256), ReLU, Linear(256, 128), ReLU, Linear(128, 10)
//   cnn: two blocks of Conv2d(3x3, padding 1) + ReLU + MaxPool2d(2) (32 and 64 channels),
//        Flatten, Linear(3136, 128), ReLU, Linear(128, 10)
//   resnet: a small residual network: a Conv2d(3x3) + BatchNorm2d + ReLU stem (16 channels),
//        three stages of one BasicBlock each (16, 32, 64 channels at 28x28, 14x14, 7x7; a
//        stride-2 Conv2d + BatchNorm2d + ReLU between stages), AdaptiveAvgPool2d(1), Flatten,
//        Linear(64, 10)
//
// and the trainers' optimizers (SGD with momentum 0.9, or Adam) with their learning rate schedule.
//
//   std::shared_ptr<nn::Sequential> model = examples::MakeModel("mlp");
//   examples::TrainerOptimizer sgd = examples::MakeOptimizer("sgd", *model, 0.1, 5e-4);
//   sgd.set_lr(examples::LearningRate(0.1, "cosine", epoch, epochs));
#ifndef TANDEM_EXAMPLES_MODELS_H_
#define TANDEM_EXAMPLES_MODELS_H_

#include <cstdint>
#include <functional>
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

// An optimizer over a model's parameters and a way to set its learning rate (of every group).
struct TrainerOptimizer {
  explicit TrainerOptimizer(std::unique_ptr<nn::Optimizer> optimizer = nullptr);
  std::unique_ptr<nn::Optimizer> optimizer;
  std::function<void(double)> set_lr;
};

// "sgd" (momentum 0.9) or "adam", with L2 `weight_decay` added to the gradients as PyTorch's
// SGD and Adam do, or "adamw" (the weights decayed by lr * weight_decay, as PyTorch's AdamW),
// over `groups` (groups without options take lr and weight_decay): the trainer's optimizer,
// and the one a ZeroRedundancyOptimizer wraps over each rank's share.
// Throws examples::UsageError for another kind or a negative weight decay.
std::unique_ptr<nn::Optimizer> MakeOptimizer(const std::string& kind,
                                             std::vector<nn::ParamGroup> groups, double lr,
                                             double weight_decay);
// The same over every parameter of `model`.
TrainerOptimizer MakeOptimizer(const std::string& kind, nn::Module& model, double lr,
                               double weight_decay);

// The learning rate of `epoch` (0-based) of `epochs`: `peak` throughout for decay "none",
// or "cosine": peak * (1 + cos(pi * epoch / epochs)) / 2, one value per epoch.
double LearningRate(double peak, const std::string& decay, int epoch, int epochs);

}  // namespace tandem::examples

#endif  // TANDEM_EXAMPLES_MODELS_H_
