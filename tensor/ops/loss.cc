// Losses: nll_loss, cross_entropy and mse_loss.
#include <cstdint>
#include <limits>
#include <vector>

#include "tensor/base/error.h"
#include "tensor/core/autograd.h"
#include "tensor/core/internal/tensor_impl.h"
#include "tensor/core/tensor.h"
#include "tensor/kernels/index_kernels.h"
#include "tensor/kernels/softmax_kernels.h"
#include "tensor/ops/autocast.h"
#include "tensor/ops/internal/op_helpers.h"
#include "tensor/ops/ops.h"
#include "tensor/runtime/backend.h"

namespace tandem {

namespace {

// Checks that int64 `targets` [N] hold class indices in [0, classes) now, on the CPU: two
// reductions and a single two-element read. On a GPU the gather kernel checks them and the next
// host synchronization reports a bad one (Note [Device-side index checks],
// tensor/cuda/kernels.h): reading them here would stop the host in every training step.
void CheckTargets(const Tensor& targets, int64_t classes, const char* op) {
  if (targets.numel() == 0 || !targets.device().is_cpu()) return;
  const Tensor largest = ViewRaw(ReduceRaw(targets, {0}, ReduceKind::kMax, op), {1});
  const Tensor smallest = ViewRaw(ReduceRaw(targets, {0}, ReduceKind::kMin, op), {1});
  const std::vector<int64_t> range = cat({smallest, largest}).to_vector<int64_t>();
  TANDEM_CHECK(range[0] >= 0 && range[1] < classes, op,
               ": targets must be class indices in [0, C) = [0, ", classes, ") but range over [",
               range[0], ", ", range[1], "]; check the labels and the number of classes ",
               "(negative ignore_index values are not supported)");
}

// [rows, cols] of `like`'s dtype and device: 1 at (i, idx[i]), 0 elsewhere. A constant of the
// backwards written with differentiable ops (under create_graph).
Tensor OneHotRaw(const Tensor& idx, int64_t rows, int64_t cols, const Tensor& like) {
  Tensor onehot = FilledRaw({rows, cols}, like.dtype(), like.device(), 0.0);
  const Tensor ones_per_row = FilledRaw({rows}, like.dtype(), like.device(), 1.0);
  ScatterAddColumnsKernel(like.device(), like.dtype(), DataPtr(onehot), DataPtr(ones_per_row),
                          Int64Ptr(idx), rows, cols);
  return onehot;
}

// Mean NLL of `targets` under `log_probs` [N, C]; validated by the caller (on the device, as
// `op`, a string literal).
Tensor NllLossCore(const Tensor& log_probs, const Tensor& targets, const char* op) {
  const int64_t rows = log_probs.shape()[0], cols = log_probs.shape()[1];
  Tensor lp = ContiguousRaw(log_probs);
  Tensor idx = ContiguousRaw(targets);
  Tensor picked = NewTensor({rows}, lp.dtype(), lp.device());
  if (rows > 0) {
    GatherColumnsKernel(lp.device(), lp.dtype(), DataPtr(picked), DataPtr(lp), Int64Ptr(idx), rows,
                        cols, op);
  }
  // Mean over zero rows is NaN, as in PyTorch.
  const double scale =
      rows > 0 ? -1.0 / static_cast<double>(rows) : std::numeric_limits<double>::quiet_NaN();
  Tensor out = UnaryRaw(UnaryOp::kMulScalar, SumAllRaw(picked), scale);
  if (NeedsGrad({log_probs})) {
    Record(
        "NllLossBackward", {log_probs}, out,
        [idx, rows, cols, scale](const Tensor& grad) {
          if (rows > 0 && CreatingGraph()) {
            // Linear in grad, constant in log_probs: onehot * grad * scale keeps grad's graph.
            return std::vector<Tensor>{mul(OneHotRaw(idx, rows, cols, grad), mul(grad, scale))};
          }
          Tensor grad_lp = FilledRaw({rows, cols}, grad.dtype(), grad.device(), 0.0);
          if (rows > 0) {
            Tensor per_row = BroadcastCopyRaw(UnaryRaw(UnaryOp::kMulScalar, grad, scale), {rows},
                                              grad_lp.dtype());
            ScatterAddColumnsKernel(grad.device(), grad_lp.dtype(), DataPtr(grad_lp),
                                    DataPtr(per_row), Int64Ptr(idx), rows, cols);
          }
          return std::vector<Tensor>{grad_lp};
        },
        DoubleBackward::kSupported);
  }
  return out;
}

// cross_entropy's gradient (softmax(logits) - onehot(targets)) * grad / rows written with
// differentiable ops, for backward under create_graph: the saved log-probabilities become a
// function of the logits again (log_softmax's own backward), so it differentiates further.
std::vector<Tensor> CrossEntropyBackwardDifferentiable(const Tensor& lp, const Tensor& idx,
                                                       const Tensor& grad) {
  const int64_t rows = lp.size(0), cols = lp.size(1);
  const Tensor log_probs = SavedIntermediate(lp, "LogSoftmaxBackward", [lp](const Tensor& g) {
    const std::vector<int64_t> dims = {1};
    return std::vector<Tensor>{sub(g, mul(exp(SavedOutput(lp)), sum(g, dims, true)))};
  });
  const Tensor onehot = OneHotRaw(idx, rows, cols, lp);
  const Tensor scale = mul(grad.to(lp.dtype()), 1.0 / static_cast<double>(rows));
  return {mul(sub(exp(log_probs), onehot), scale)};
}

void CheckClassification(const Tensor& scores, const Tensor& targets, const char* op,
                         const char* scores_name) {
  CheckDefined(scores, op, scores_name);
  CheckDefined(targets, op, "targets");
  CheckSameDevice(scores, scores_name, targets, "targets", op);
  CheckFloat(scores, op, scores_name);
  TANDEM_CHECK(scores.dim() == 2, op, ": ", scores_name, " must be 2-D [N, C] but is ",
               ShapeToString(scores.shape()), "; flatten extra dimensions into N first");
  TANDEM_CHECK(targets.dtype() == kInt64, op, ": targets must be int64 class indices but are ",
               targets.dtype(), "; convert them with .to(kInt64)");
  TANDEM_CHECK(targets.dim() == 1 && targets.shape()[0] == scores.shape()[0], op, ": ", scores_name,
               " is ", ShapeToString(scores.shape()), " so targets must be [", scores.shape()[0],
               "] but are ", ShapeToString(targets.shape()));
  CheckTargets(targets, scores.shape()[1], op);
}

}  // namespace

Tensor nll_loss(const Tensor& log_probs, const Tensor& targets) {
  TANDEM_AUTOCAST(kFloat32, nll_loss, log_probs, targets);
  CheckClassification(log_probs, targets, "nll_loss", "log_probs");
  return NllLossCore(log_probs, targets, "nll_loss");
}

// Note [Autocast cross-entropy]: cross_entropy is on autocast's float32 list, but 16-bit logits
// are not cast to float32 first: the fused kernels widen each logit as they read it and compute
// in float32, so the loss is the cast logits' to the bit, and the gradient, computed in float32
// and rounded once to the logits' dtype, is what the cast's backward would have rounded. Where
// the cast would have written float32 logits and read them back, and the gradient gone through a
// float32 [rows, vocab] and a cast back, the 16-bit logits are read once each way (GPT-2 at
// 8 x 1024 tokens under bfloat16: 24 bytes a logit become 6, 7.4 GB fewer per step, and two
// launches fewer).
Tensor cross_entropy(const Tensor& logits, const Tensor& targets) {
  const bool widened_in_kernel = AutocastMode::IsAnyEnabled() && autocast::IsEligible(logits) &&
                                 IsReducedFloatingPoint(logits.dtype());
  if (!widened_in_kernel) TANDEM_AUTOCAST(kFloat32, cross_entropy, logits, targets);
  CheckClassification(logits, targets, "cross_entropy", "logits");
  // Note [Fused cross-entropy] (tensor/kernels/softmax_kernels.h): one kernel each way. Backward
  // keeps the logits (which exist already) and a log-sum-exp per row instead of [rows, cols]
  // log-probabilities (412 MB for GPT-2's vocabulary at 2048 tokens), and computes
  // (softmax - onehot) * grad / rows in one pass. Each row's loss is log_softmax's value at the
  // target, negated, so on the CPU the loss is nll_loss(log_softmax(logits))'s to the bit.
  const int64_t rows = logits.size(0), cols = logits.size(1);
  const Tensor x = ContiguousRaw(logits).detach();
  const Tensor idx = ContiguousRaw(targets);
  const DType math = CrossEntropyLseType(x.dtype());
  Tensor row_loss = NewTensor({rows}, math, x.device());
  Tensor lse = NewTensor({rows}, math, x.device());
  if (rows > 0) {
    CrossEntropyForwardKernel(x.device(), x.dtype(), DataPtr(row_loss), DataPtr(lse), DataPtr(x),
                              Int64Ptr(idx), rows, cols, "cross_entropy");
  }
  // Mean over zero rows is NaN, as in PyTorch. Summed in float32 (as PyTorch's accumulate type),
  // then rounded to 16-bit logits' dtype, except under autocast.
  const double scale =
      rows > 0 ? 1.0 / static_cast<double>(rows) : std::numeric_limits<double>::quiet_NaN();
  Tensor out = UnaryRaw(UnaryOp::kMulScalar, SumAllRaw(row_loss), scale);
  if (!widened_in_kernel) out = CastRaw(out, x.dtype());
  if (NeedsGrad({logits})) {
    Record(
        "CrossEntropyBackward", {logits}, out,
        [x, lse, idx, rows, cols, math, widened_in_kernel](const Tensor& grad) {
          Tensor grad_logits = NewTensor({rows, cols}, x.dtype(), x.device());
          if (grad_logits.numel() == 0) return std::vector<Tensor>{grad_logits};
          if (CreatingGraph()) {
            // Rare (gradients of gradients): the log-probabilities, recomputed (in float32 where
            // the forward widened), the gradient converted to the logits' dtype.
            Tensor log_probs;
            {
              NoGradGuard no_grad;
              log_probs = log_softmax(widened_in_kernel ? x.to(math) : x, 1);
            }
            std::vector<Tensor> grads = CrossEntropyBackwardDifferentiable(log_probs, idx, grad);
            grads[0] = grads[0].to(x.dtype());
            return grads;
          }
          const Tensor g = ContiguousRaw(CastRaw(grad, math));
          CrossEntropyBackwardKernel(x.device(), x.dtype(), DataPtr(grad_logits), DataPtr(x),
                                     DataPtr(lse), Int64Ptr(idx), DataPtr(g),
                                     1.0 / static_cast<double>(rows), rows, cols);
          return std::vector<Tensor>{grad_logits};
        },
        DoubleBackward::kSupported);
  }
  return out;
}

Tensor mse_loss(const Tensor& input, const Tensor& target) {
  TANDEM_AUTOCAST(kFloat32, mse_loss, input, target);
  CheckDefined(input, "mse_loss", "input");
  CheckDefined(target, "mse_loss", "target");
  CheckSameDevice(input, "input", target, "target", "mse_loss");
  CheckFloat(input, "mse_loss", "input");
  TANDEM_CHECK(input.shape() == target.shape(), "mse_loss: input is ", ShapeToString(input.shape()),
               " and target is ", ShapeToString(target.shape()),
               "; they must have the same shape (broadcasting here usually hides a bug: ",
               "reshape one of them)");
  return mean(square(sub(input, target)));
}

}  // namespace tandem
