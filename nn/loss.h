// Losses, as PyTorch has them: modules (nn::CrossEntropyLoss, ...) and the same computations
// as functions (nn::functional::cross_entropy, ...), with PyTorch's options and defaults:
//
//   CrossEntropyLoss    logits + class indices (or class probabilities); weight, ignore_index,
//                       label_smoothing
//   NLLLoss             log-probabilities + class indices; weight, ignore_index
//   BCEWithLogitsLoss   logits + 0/1 (or soft) targets of the same shape; weight, pos_weight
//   MSELoss, L1Loss, SmoothL1Loss (beta)   input and target of the same shape
//
// Every loss takes a `reduction`: Reduction::kMean (the default), kSum, or kNone (one loss per
// element, in the target's shape). Losses are composed of differentiable tensor ops, so they
// run on every device and back-propagate into the input (and a soft target).
//
//   nn::CrossEntropyLoss criterion;                     // prints "CrossEntropyLoss()"
//   Tensor loss = criterion.forward(model.forward(images), labels);   // labels int64 [N]
//   nn::CrossEntropyLoss smoothed(nn::CrossEntropyLossOptions()
//                                     .weight(class_weights)           // float32 [C]
//                                     .ignore_index(-1)
//                                     .label_smoothing(0.1));
//   namespace F = tandem::nn::functional;
//   Tensor per_pixel = F::cross_entropy(logits_nchw, labels_nhw,
//                                       nn::CrossEntropyLossOptions().reduction(
//                                           nn::Reduction::kNone));   // [N, H, W]
//
// A module keeps its weight tensors as buffers ("weight", "pos_weight"), so to(device),
// clone() and state_dict() carry them, as in PyTorch.
//
// Every loss module is also a ChunkableLoss: forward_parts() returns its reduction's parts
// for a chunk of a batch, so that the loss of the whole batch can be put together from the
// chunks' parts (parallel::DataParallel::forward_loss does, one chunk per replica).
// tandem::cross_entropy and tandem::mse_loss (tensor/ops/ops.h) are the plain mean-reduced forms
// without options.
#ifndef TANDEM_NN_LOSS_H_
#define TANDEM_NN_LOSS_H_

#include <cstdint>
#include <utility>

#include "nn/module.h"
#include "tensor/base/arg.h"
#include "tensor/tensor.h"

namespace tandem::nn {

// How per-element losses become the result: kNone keeps them (the target's shape), kSum adds
// them up, kMean averages them (for class-index losses with a weight: the sum of the weighted
// losses over the sum of the weights of the targets that are not ignored).
enum class Reduction { kNone, kMean, kSum };
const char* ReductionName(Reduction reduction);  // "none", "mean", "sum"

// A loss on a chunk of a batch before its reduction's last step:
//   kMean: numerator / denominator is forward()'s value; numerator (0-dim) is the sum of the
//          per-element losses (weighted, 0 where ignored), denominator (0-dim float32) what
//          the mean divides by: the sum of the weights of the targets not ignored
//          (class-index losses with a weight), their count (without one), the number of rows
//          (class probabilities) or of elements (the other losses). Over chunks the
//          loss is sum(numerators) / sum(denominators) (0 / 0 = NaN when every target of
//          every chunk is ignored, as in PyTorch; one chunk's 0 / 0 is harmless).
//   kSum:  numerator (0-dim) is forward()'s value; over chunks, sum(numerators).
//   kNone: numerator holds the per-element losses (forward()'s value, the target's shape);
//          over chunks, the chunks' numerators concatenated along the batch dimension.
// denominator is undefined for kSum and kNone.
struct LossParts {
  Tensor numerator;
  Tensor denominator;
  Reduction reduction = Reduction::kMean;
};

// A loss whose value over a batch can be assembled from its chunks' LossParts. The stock
// losses below implement it consistently with their forward(); a user's loss module may too.
// forward_parts() may be called from several threads at once.
class ChunkableLoss {
 public:
  virtual ~ChunkableLoss() = default;
  virtual LossParts forward_parts(const Tensor& input, const Tensor& target) const = 0;
};

// ---- Options (libtorch's names; setters chain) ------------------------------------------

struct CrossEntropyLossOptions {
  // float32 [C]: a rescaling weight per class (undefined: all ones).
  TANDEM_ARG(Tensor, weight);
  // Targets equal to this contribute nothing, to the loss nor to the mean's denominator.
  TANDEM_ARG(int64_t, ignore_index) = -100;
  TANDEM_ARG(Reduction, reduction) = Reduction::kMean;
  // In [0, 1]: the target becomes (1 - s) one-hot + s / C uniform (PyTorch's formula, also
  // with a weight).
  TANDEM_ARG(double, label_smoothing) = 0.0;
};

struct NLLLossOptions {
  TANDEM_ARG(Tensor, weight);
  TANDEM_ARG(int64_t, ignore_index) = -100;
  TANDEM_ARG(Reduction, reduction) = Reduction::kMean;
};

struct BCEWithLogitsLossOptions {
  // Multiplies each element's loss; must broadcast to the input's shape.
  TANDEM_ARG(Tensor, weight);
  // Multiplies the positive term (target * log sigmoid(x)); typically [C] = negatives /
  // positives per class. Must broadcast to the input's shape.
  TANDEM_ARG(Tensor, pos_weight);
  TANDEM_ARG(Reduction, reduction) = Reduction::kMean;
};

struct MSELossOptions {
  TANDEM_ARG(Reduction, reduction) = Reduction::kMean;
};

struct L1LossOptions {
  TANDEM_ARG(Reduction, reduction) = Reduction::kMean;
};

struct SmoothL1LossOptions {
  TANDEM_ARG(Reduction, reduction) = Reduction::kMean;
  // Where the loss turns from quadratic (|d| < beta: 0.5 d^2 / beta) to linear (|d| - beta/2);
  // >= 0, and 0 gives the L1 loss.
  TANDEM_ARG(double, beta) = 1.0;
};

// ---- Functions ---------------------------------------------------------------------------
namespace functional {

// input: float32 logits [N, C], [C] or [N, C, d1, ..., dk]. target: int64 class indices of
// input's shape without C ([N], [] or [N, d1, ..., dk]), each in [0, C) or ignore_index; or
// float32 class probabilities of input's own shape (then ignore_index must stay negative).
Tensor cross_entropy(const Tensor& input, const Tensor& target,
                     const CrossEntropyLossOptions& options = {});
// As cross_entropy with class indices, but input holds log-probabilities (log_softmax).
Tensor nll_loss(const Tensor& input, const Tensor& target, const NLLLossOptions& options = {});
// -[pos_weight t log sigmoid(x) + (1 - t) log(1 - sigmoid(x))] * weight, computed stably
// (no overflow for any x). input and target: float32, one shape.
Tensor binary_cross_entropy_with_logits(const Tensor& input, const Tensor& target,
                                        const BCEWithLogitsLossOptions& options = {});
// (input - target)^2, |input - target|, and the smooth L1 of input - target. float32, one
// shape (a broadcast here usually hides a bug, so it is refused).
Tensor mse_loss(const Tensor& input, const Tensor& target, const MSELossOptions& options = {});
Tensor l1_loss(const Tensor& input, const Tensor& target, const L1LossOptions& options = {});
Tensor smooth_l1_loss(const Tensor& input, const Tensor& target,
                      const SmoothL1LossOptions& options = {});

}  // namespace functional

// ---- Modules (forward(input, target); they print as PyTorch's do, without options) --------

class CrossEntropyLoss : public Cloneable<CrossEntropyLoss>, public ChunkableLoss {
 public:
  explicit CrossEntropyLoss(const CrossEntropyLossOptions& options = {});
  void reset() override;
  Tensor forward(const Tensor& input, const Tensor& target);
  LossParts forward_parts(const Tensor& input, const Tensor& target) const override;
  const CrossEntropyLossOptions& options() const { return options_; }
  // The registered weight buffer (wherever to() moved it); undefined without one.
  Tensor weight() const;

 private:
  CrossEntropyLossOptions options_;
  Buffer weight_;
};

class NLLLoss : public Cloneable<NLLLoss>, public ChunkableLoss {
 public:
  explicit NLLLoss(const NLLLossOptions& options = {});
  void reset() override;
  Tensor forward(const Tensor& input, const Tensor& target);
  LossParts forward_parts(const Tensor& input, const Tensor& target) const override;
  const NLLLossOptions& options() const { return options_; }
  Tensor weight() const;

 private:
  NLLLossOptions options_;
  Buffer weight_;
};

class BCEWithLogitsLoss : public Cloneable<BCEWithLogitsLoss>, public ChunkableLoss {
 public:
  explicit BCEWithLogitsLoss(const BCEWithLogitsLossOptions& options = {});
  void reset() override;
  Tensor forward(const Tensor& input, const Tensor& target);
  LossParts forward_parts(const Tensor& input, const Tensor& target) const override;
  const BCEWithLogitsLossOptions& options() const { return options_; }
  Tensor weight() const;
  Tensor pos_weight() const;

 private:
  BCEWithLogitsLossOptions options_;
  Buffer weight_;
  Buffer pos_weight_;
};

class MSELoss : public Cloneable<MSELoss>, public ChunkableLoss {
 public:
  explicit MSELoss(const MSELossOptions& options = {}) : options_(options) {}
  void reset() override {}
  Tensor forward(const Tensor& input, const Tensor& target);
  LossParts forward_parts(const Tensor& input, const Tensor& target) const override;
  const MSELossOptions& options() const { return options_; }

 private:
  MSELossOptions options_;
};

class L1Loss : public Cloneable<L1Loss>, public ChunkableLoss {
 public:
  explicit L1Loss(const L1LossOptions& options = {}) : options_(options) {}
  void reset() override {}
  Tensor forward(const Tensor& input, const Tensor& target);
  LossParts forward_parts(const Tensor& input, const Tensor& target) const override;
  const L1LossOptions& options() const { return options_; }

 private:
  L1LossOptions options_;
};

class SmoothL1Loss : public Cloneable<SmoothL1Loss>, public ChunkableLoss {
 public:
  explicit SmoothL1Loss(const SmoothL1LossOptions& options = {});
  void reset() override {}
  Tensor forward(const Tensor& input, const Tensor& target);
  LossParts forward_parts(const Tensor& input, const Tensor& target) const override;
  const SmoothL1LossOptions& options() const { return options_; }

 private:
  SmoothL1LossOptions options_;
};

}  // namespace tandem::nn

#endif  // TANDEM_NN_LOSS_H_
