// AnomalyMode: finds the op that produced the first NaN or infinity, as PyTorch's
// torch.autograd.detect_anomaly does. Use it when a loss turns NaN and you want to know
// where; it slows training down (every checked tensor is read once more), so leave it off
// otherwise. Off, it costs one relaxed atomic load per recorded op and per backward node.
//
// While it is on, every op that records an autograd node (any op with an input that
// requires grad, in grad mode) has its outputs checked after the forward computation, and
// every backward node has the gradients it returns checked. The first NaN or inf found
// throws a tandem::Error naming the node (e.g. "LogBackward"), its device, whether it was
// the forward or the backward pass, how many values were NaN and inf, and whether the op's
// own inputs were already non-finite (then the culprit is earlier: data or a parameter).
// A backward failure reaches the caller of backward() wrapped by the engine ("backward
// failed in LogBackward on cpu:0: anomaly detected in the backward pass: ...").
//
// The mode is process-wide, as in PyTorch, so the replicas that DataParallel runs on the
// devices' workers are checked too. Ops run without recording (NoGradGuard, inputs that
// need no grad) are not checked.
//
//   {
//     tandem::DetectAnomalyGuard detect;      // on for this scope
//     Tensor loss = criterion.forward(model.forward(x), y);   // throws at the first NaN
//     loss.backward();                                        // so does backward
//   }
#ifndef TANDEM_TENSOR_CORE_ANOMALY_MODE_H_
#define TANDEM_TENSOR_CORE_ANOMALY_MODE_H_

#include <atomic>

namespace tandem {

class AnomalyMode {
 public:
  static bool IsEnabled() { return enabled_.load(std::memory_order_relaxed); }
  static void SetEnabled(bool enabled) { enabled_.store(enabled, std::memory_order_relaxed); }

 private:
  static inline std::atomic<bool> enabled_{false};
};

// Turns anomaly detection on (or, with false, off) for its lifetime and restores the
// previous setting after (PyTorch's `with torch.autograd.detect_anomaly():`). Process-wide:
// do not nest guards on several threads at once.
class DetectAnomalyGuard {
 public:
  explicit DetectAnomalyGuard(bool enabled = true) : previous_(AnomalyMode::IsEnabled()) {
    AnomalyMode::SetEnabled(enabled);
  }
  ~DetectAnomalyGuard() { AnomalyMode::SetEnabled(previous_); }
  DetectAnomalyGuard(const DetectAnomalyGuard&) = delete;
  DetectAnomalyGuard& operator=(const DetectAnomalyGuard&) = delete;

 private:
  bool previous_;
};

}  // namespace tandem

#endif  // TANDEM_TENSOR_CORE_ANOMALY_MODE_H_
