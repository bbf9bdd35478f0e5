#include "tensor/core/anomaly_mode.h"

#include <cmath>
#include <cstdint>
#include <string>

#include "tensor/base/grad_mode.h"
#include "tensor/core/internal/anomaly.h"
#include "tensor/core/internal/tensor_impl.h"
#include "tensor/runtime/backend.h"

namespace tandem::internal {
namespace {

// Non-finite values of a tensor: quick to rule out (one pass on the tensor's device), and
// counted only when there are some.
struct NonFinite {
  int64_t nan = 0;
  int64_t inf = 0;
  bool any() const { return nan + inf > 0; }
};

bool Checkable(const Tensor& t) {
  return t.defined() && IsFloatingPoint(t.dtype()) && t.numel() > 0;
}

bool AllFinite(const Tensor& t) {
  if (!Checkable(t)) return true;
  NoGradGuard no_grad;
  // x * 0 is 0 for every finite x and NaN for NaN and +-inf; the sum never overflows. With
  // the backend's kernels (one pass on the tensor's device): the ops sit a layer above.
  const Tensor x = t.detach().contiguous();
  Backend& backend = GetBackend(x.device());
  const int index = x.device().index();
  const Tensor zeros = NewTensor(x.shape(), x.dtype(), x.device());
  backend.Unary(index, UnaryOp::kMulScalar, ToKernel(zeros), ToKernel(x), 0.0);
  const Tensor total = NewTensor({}, x.dtype(), x.device());
  backend.Reduce(index, ReduceKind::kSum, ToKernel(total), ToKernel(zeros), 1, x.numel(), 1);
  return std::isfinite(total.item());
}

NonFinite Count(const Tensor& t) {
  NonFinite count;
  for (double v : t.detach().to(kFloat64).to_vector<double>()) {
    if (std::isnan(v)) {
      ++count.nan;
    } else if (std::isinf(v)) {
      ++count.inf;
    }
  }
  return count;
}

std::string Describe(const Tensor& t) {
  const NonFinite count = Count(t);
  return Concat(count.nan, " NaN and ", count.inf, " inf among its ", t.numel(), " values");
}

// "" when every tensor of `tensors` is finite, else "0, 2" (their positions).
std::string NonFinitePositions(const std::vector<Tensor>& tensors) {
  std::string positions;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (AllFinite(tensors[i])) continue;
    if (!positions.empty()) positions += ", ";
    positions += std::to_string(i);
  }
  return positions;
}

}  // namespace

void CheckForwardAnomaly(const Node& node, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& outputs) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (AllFinite(outputs[i])) continue;
    const std::string bad_inputs = NonFinitePositions(inputs);
    TANDEM_FAIL(
        "anomaly detected in the forward pass: the op recorded as ", node.name(), " on ",
        outputs[i].device(), " produced output ", i, " of shape ",
        ShapeToString(outputs[i].shape()), " with ", Describe(outputs[i]), "; ",
        bad_inputs.empty()
            ? "its inputs were all finite, so this op made them (a log or sqrt of a negative "
              "number, a division by zero, an overflow?): fix its inputs, or lower the "
              "learning rate if parameters grow without bound"
            : "its input(s) " + bad_inputs +
                  " already held non-finite values, so they come from earlier: from data or "
                  "parameters (anomaly mode checks only the outputs of ops that record "
                  "autograd nodes); check the data and lower the learning rate");
  }
}

void CheckBackwardAnomaly(const Node& node, const std::vector<Tensor>& grad_outputs,
                          const std::vector<Tensor>& grad_inputs) {
  for (size_t i = 0; i < grad_inputs.size(); ++i) {
    if (AllFinite(grad_inputs[i])) continue;
    const std::string bad_received = NonFinitePositions(grad_outputs);
    TANDEM_FAIL(
        "anomaly detected in the backward pass: ", node.name(), " on ", node.device(),
        " returned a gradient of shape ", ShapeToString(grad_inputs[i].shape()), " for its input ",
        i, " with ", Describe(grad_inputs[i]), "; ",
        bad_received.empty()
            ? "the gradients it received were all finite, so this node made them (a "
              "derivative that is infinite where the forward was evaluated, 0/0, an "
              "overflow?): keep the forward away from such points (e.g. clamp before log or "
              "sqrt)"
            : "the gradient(s) it received for output(s) " + bad_received +
                  " were already non-finite: the gradient given to backward() holds them");
  }
}

}  // namespace tandem::internal
