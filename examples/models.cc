#include "examples/models.h"

#include "examples/cli.h"

namespace tandem::examples {

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
  throw UsageError("--model must be 'mlp' or 'cnn' but is '" + kind + "'");
}

int64_t SavedActivationsPerSample(const std::string& kind) {
  if (kind == "mlp") return 784 + 256 + 128 + 10 + 10;
  if (kind == "cnn") {
    return 784 + 32 * 28 * 28 + 32 * 14 * 14 + 64 * 14 * 14 + 64 * 7 * 7 + 128 + 10 + 10;
  }
  throw UsageError("--model must be 'mlp' or 'cnn' but is '" + kind + "'");
}

}  // namespace tandem::examples
