// Losses as modules, as in PyTorch: CrossEntropyLoss (logits and int64 class targets) and
// MSELoss, both averaging over the batch. Both take two tensors, so they also show how a
// module's forward takes several inputs.
//
//   nn::CrossEntropyLoss criterion;
//   Tensor loss = criterion.forward(model.forward(images), labels);   // labels int64 [N]
//   loss.backward();
//
// The functions tandem::cross_entropy and tandem::mse_loss (tensor/ops.h) do the same
// without the module.
#ifndef TANDEM_NN_LOSS_H_
#define TANDEM_NN_LOSS_H_

#include "nn/module.h"
#include "tensor/tensor.h"

namespace tandem::nn {

// Mean over the batch of -log softmax(logits)[target], computed stably (log-sum-exp).
// logits: float32 [N, C]; targets: int64 [N] with values in [0, C).
class CrossEntropyLoss : public Cloneable<CrossEntropyLoss> {
 public:
  CrossEntropyLoss() = default;
  void reset() override {}
  Tensor forward(const Tensor& logits, const Tensor& targets);
};

// Mean of (input - target)^2 over all elements; both of the same shape.
class MSELoss : public Cloneable<MSELoss> {
 public:
  MSELoss() = default;
  void reset() override {}
  Tensor forward(const Tensor& input, const Tensor& target);
};

}  // namespace tandem::nn

#endif  // TANDEM_NN_LOSS_H_
