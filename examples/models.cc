#include "examples/models.h"

#include <cmath>

#include "examples/cli.h"

namespace tandem::examples {

BasicBlock::BasicBlock(int64_t channels) : channels_(channels) { reset(); }

void BasicBlock::reset() {
  const auto conv = [&] {
    return nn::Conv2d(nn::Conv2dOptions(channels_, channels_, 3).padding(1).bias(false));
  };
  conv1_ = register_module("conv1", conv());
  bn1_ = register_module("bn1", nn::BatchNorm2d(channels_));
  conv2_ = register_module("conv2", conv());
  bn2_ = register_module("bn2", nn::BatchNorm2d(channels_));
}

Tensor BasicBlock::forward(const Tensor& x) {
  const Tensor y = relu(bn1_->forward(conv1_->forward(x)));
  return relu(x + bn2_->forward(conv2_->forward(y)));
}

namespace {

// Conv2d(3x3, padding 1, no bias) + BatchNorm2d + ReLU.
void AddConvBnRelu(nn::Sequential& model, int64_t in, int64_t out, int64_t stride) {
  model.push_back(nn::Conv2d(nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false)));
  model.push_back(nn::BatchNorm2d(out));
  model.push_back(nn::ReLU());
}

// The resnet's channels per stage (28x28, 14x14, 7x7).
constexpr int64_t kResnetWidths[] = {16, 32, 64};

}  // namespace

std::shared_ptr<nn::Sequential> MakeModel(const std::string& kind) {
  if (kind == "mlp") {
    return std::make_shared<nn::Sequential>(nn::Flatten(), nn::Linear(784, 256), nn::ReLU(),
                                            nn::Linear(256, 128), nn::ReLU(), nn::Linear(128, 10));
  }
  if (kind == "cnn") {
    return std::make_shared<nn::Sequential>(
        nn::Conv2d(nn::Conv2dOptions(1, 32, 3).padding(1)), nn::ReLU(), nn::MaxPool2d(2),
        nn::Conv2d(nn::Conv2dOptions(32, 64, 3).padding(1)), nn::ReLU(), nn::MaxPool2d(2),
        nn::Flatten(), nn::Linear(64 * 7 * 7, 128), nn::ReLU(), nn::Linear(128, 10));
  }
  if (kind == "resnet") {
    auto model = std::make_shared<nn::Sequential>();
    int64_t in = 1;
    for (int64_t stage = 0; stage < 3; ++stage) {
      const int64_t width = kResnetWidths[stage];
      AddConvBnRelu(*model, in, width, stage == 0 ? 1 : 2);
      model->push_back(BasicBlock(width));
      in = width;
    }
    model->push_back(nn::AdaptiveAvgPool2d(1));
    model->push_back(nn::Flatten());
    model->push_back(nn::Linear(in, 10));
    return model;
  }
  throw UsageError("--model must be 'mlp', 'cnn' or 'resnet' but is '" + kind + "'");
}

int64_t SavedActivationsPerSample(const std::string& kind) {
  if (kind == "mlp") return 784 + 256 + 128 + 10 + 10;
  if (kind == "cnn") {
    return 784 + 32 * 28 * 28 + 32 * 14 * 14 + 64 * 14 * 14 + 64 * 7 * 7 + 128 + 10 + 10;
  }
  if (kind == "resnet") {
    // Per stage of c channels on s x s pixels: three Conv2d + BatchNorm2d (+ ReLU) units, each
    // keeping the convolution's output (BatchNorm's input) and the ReLU's output, plus the
    // block's sum; then the pooled features, the logits and their log-softmax.
    int64_t total = 784;
    int64_t side = 28;
    for (int64_t width : kResnetWidths) {
      total += 7 * width * side * side;
      side = (side + 1) / 2;
    }
    return total + kResnetWidths[2] + 10 + 10;
  }
  throw UsageError("--model must be 'mlp', 'cnn' or 'resnet' but is '" + kind + "'");
}

TrainerOptimizer::TrainerOptimizer(std::unique_ptr<nn::Optimizer> o) : optimizer(std::move(o)) {
  nn::Optimizer* raw = optimizer.get();
  set_lr = [raw](double lr) {
    for (nn::ParamGroup& group : raw->param_groups()) group.options().set_lr(lr);
  };
}

std::unique_ptr<nn::Optimizer> MakeOptimizer(const std::string& kind,
                                             std::vector<nn::ParamGroup> groups, double lr,
                                             double weight_decay) {
  Require(std::isfinite(weight_decay) && weight_decay >= 0,
          "--weight_decay must be a finite number of at least 0 but is ", weight_decay,
          "; try --weight_decay=5e-4");
  if (kind == "sgd") {
    return std::make_unique<nn::SGD>(std::move(groups),
                                     nn::SGDOptions(lr).momentum(0.9).weight_decay(weight_decay));
  }
  if (kind == "adam") {
    return std::make_unique<nn::Adam>(std::move(groups),
                                      nn::AdamOptions(lr).weight_decay(weight_decay));
  }
  if (kind == "adamw") {
    return std::make_unique<nn::AdamW>(std::move(groups),
                                       nn::AdamWOptions(lr).weight_decay(weight_decay));
  }
  throw UsageError("--optimizer must be 'sgd', 'adam' or 'adamw' but is '" + kind + "'");
}

TrainerOptimizer MakeOptimizer(const std::string& kind, nn::Module& model, double lr,
                               double weight_decay) {
  std::vector<nn::ParamGroup> groups;
  groups.emplace_back(model.parameters());
  return TrainerOptimizer(MakeOptimizer(kind, std::move(groups), lr, weight_decay));
}

double LearningRate(double peak, const std::string& decay, int epoch, int epochs) {
  if (decay == "none") return peak;
  constexpr double kPi = 3.14159265358979323846;
  return peak * 0.5 * (1.0 + std::cos(kPi * epoch / epochs));
}

}  // namespace tandem::examples
