// The trainer's and the benchmarks' models for 28x28 grey images in 10 classes:
//   mlp: Flatten, Linear(784, 256), ReLU, Linear(256, 128), ReLU, Linear(128, 10)
//   cnn: two blocks of Conv2d(3x3, padding 1) + ReLU + MaxPool2d(2) (32 and 64 channels),
//        Flatten, Linear(3136, 128), ReLU, Linear(128, 10)
//
//   std::shared_ptr<nn::Sequential> model = examples::MakeModel("mlp");
#ifndef TANDEM_EXAMPLES_MODELS_H_
#define TANDEM_EXAMPLES_MODELS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "nn/nn.h"

namespace tandem::examples {

// Throws examples::UsageError for a kind other than "mlp" or "cnn".
std::shared_ptr<nn::Sequential> MakeModel(const std::string& kind);

// Floats per sample that a training step must keep from forward for backward, at least:
// the input, the output of every ReLU and max-pool, the logits and their log-softmax (what
// PyTorch's autograd saves for these layers, without max-pool's indices).
int64_t SavedActivationsPerSample(const std::string& kind);

}  // namespace tandem::examples

#endif  // TANDEM_EXAMPLES_MODELS_H_
