// AutocastMode: this thread's autocast state (which device types autocast is on for, the
// lower-precision dtype of each, and the weight-cast cache that is live), the raw get/set that
// carries it into work other threads run for this one, and the guard autograd uses to run
// backward functions with autocast off.
//
// Users open autocast with tandem::AutocastGuard (tensor/ops/autocast.h), which also owns the
// weight cache; this base-layer header is for the runtime (DeviceWorker::Post carries the
// state into its tasks, as it carries grad mode) and the engine, which know no Tensor:
//
//   AutocastState state = AutocastMode::GetState();        // on the posting thread
//   worker.Post([state] { AutocastStateGuard g(state); ... });  // the task sees it
//
// Defaults, as PyTorch's torch.autocast: off everywhere; bfloat16 on the CPU, float16 on CUDA.
#ifndef TANDEM_TENSOR_BASE_AUTOCAST_MODE_H_
#define TANDEM_TENSOR_BASE_AUTOCAST_MODE_H_

#include <array>
#include <cstdint>
#include <memory>

#include "tensor/base/device.h"
#include "tensor/base/dtype.h"

namespace tandem {

// The weight-cast cache of an outermost AutocastGuard. Opaque here (the ops layer, which knows
// Tensor, implements it); shared by every thread that inherits the guard's state, so it must be
// safe to use from several threads at once.
class AutocastCache {
 public:
  virtual ~AutocastCache() = default;
};

struct AutocastState {
  // Bit DeviceType of enabled_mask: autocast is on for that device type.
  uint8_t enabled_mask = 0;
  std::array<DType, kNumDeviceTypes> dtypes = {kBFloat16, kFloat16};
  // The live weight cache (null outside any guard, or when its guard turned caching off).
  std::shared_ptr<AutocastCache> cache;

  bool enabled(DeviceType type) const { return (enabled_mask >> static_cast<int>(type)) & 1; }
  DType dtype(DeviceType type) const { return dtypes[static_cast<int>(type)]; }
};

class AutocastMode {
 public:
  // kBFloat16 for the CPU, kFloat16 for CUDA (torch.get_autocast_dtype's defaults).
  static DType DefaultDType(DeviceType type);
  static bool IsEnabled(DeviceType type);
  // Whether autocast is on for any device type: the ops' fast path checks only this.
  static bool IsAnyEnabled();
  // The dtype autocast casts to on `type` (meaningful while it is enabled there).
  static DType GetDType(DeviceType type);
  // This thread's whole state, to carry it into work another thread does on its behalf.
  static const AutocastState& GetState();
  static void SetState(AutocastState state);
};

// Sets this thread's whole autocast state for its lifetime and restores the previous one.
class AutocastStateGuard {
 public:
  explicit AutocastStateGuard(AutocastState state);
  ~AutocastStateGuard();
  AutocastStateGuard(const AutocastStateGuard&) = delete;
  AutocastStateGuard& operator=(const AutocastStateGuard&) = delete;

 private:
  AutocastState previous_;
};

// Turns autocast off on every device type for its lifetime (dtypes and cache kept), and back
// after. The autograd engine runs each backward function under it: a backward computes in the
// dtypes its forward chose (PyTorch: "backward ops run in the same type that autocast used for
// corresponding forward ops"), so it must not be cast again.
class AutocastSuspendGuard {
 public:
  AutocastSuspendGuard();
  ~AutocastSuspendGuard();
  AutocastSuspendGuard(const AutocastSuspendGuard&) = delete;
  AutocastSuspendGuard& operator=(const AutocastSuspendGuard&) = delete;

 private:
  uint8_t previous_mask_;
};

}  // namespace tandem

#endif  // TANDEM_TENSOR_BASE_AUTOCAST_MODE_H_
