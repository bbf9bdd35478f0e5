// GradMode: whether ops record the autograd graph on this thread, and guards that set it.
//
// Recording is on by default in every thread. Work that a device worker runs on a caller's
// behalf (DeviceWorker::Post/Submit, the autograd engine, parallel_apply) runs with the
// grad mode the caller had when it queued the work, as PyTorch carries grad mode into its
// engine's tasks, so a replica's forward under NoGradGuard records nothing either.
//
//   {
//     tandem::NoGradGuard no_grad;      // evaluation, optimizer steps
//     Tensor y = model.forward(x);      // no graph recorded
//   }
//   tandem::AutoGradMode enable(true);  // sets it either way for a scope
#ifndef TANDEM_TENSOR_BASE_GRAD_MODE_H_
#define TANDEM_TENSOR_BASE_GRAD_MODE_H_

namespace tandem {

class GradMode {
 public:
  static bool IsEnabled();
  static void SetEnabled(bool enabled);
};

// Sets grad mode for its lifetime on this thread and restores the previous mode after.
class AutoGradMode {
 public:
  explicit AutoGradMode(bool enabled) : previous_(GradMode::IsEnabled()) {
    GradMode::SetEnabled(enabled);
  }
  ~AutoGradMode() { GradMode::SetEnabled(previous_); }
  AutoGradMode(const AutoGradMode&) = delete;
  AutoGradMode& operator=(const AutoGradMode&) = delete;

 private:
  bool previous_;
};

// Turns recording off for its lifetime on this thread (optimizer steps, evaluation).
class NoGradGuard : public AutoGradMode {
 public:
  NoGradGuard() : AutoGradMode(false) {}
};

}  // namespace tandem

#endif  // TANDEM_TENSOR_BASE_GRAD_MODE_H_
