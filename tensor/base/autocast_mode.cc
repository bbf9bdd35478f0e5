#include "tensor/base/autocast_mode.h"

#include <utility>

namespace tandem {
namespace {

// The mask lives apart from the rest so that the ops' check (IsAnyEnabled) and the engine's
// suspend touch one trivially constructed byte, not the state with its shared_ptr.
thread_local uint8_t t_enabled_mask = 0;
thread_local AutocastState t_state;  // enabled_mask mirrored from t_enabled_mask on GetState

}  // namespace

DType AutocastMode::DefaultDType(DeviceType type) {
  return type == DeviceType::kCUDA ? kFloat16 : kBFloat16;
}

bool AutocastMode::IsEnabled(DeviceType type) {
  return (t_enabled_mask >> static_cast<int>(type)) & 1;
}

bool AutocastMode::IsAnyEnabled() { return t_enabled_mask != 0; }

DType AutocastMode::GetDType(DeviceType type) { return t_state.dtype(type); }

const AutocastState& AutocastMode::GetState() {
  t_state.enabled_mask = t_enabled_mask;
  return t_state;
}

void AutocastMode::SetState(AutocastState state) {
  t_enabled_mask = state.enabled_mask;
  t_state = std::move(state);
}

AutocastStateGuard::AutocastStateGuard(AutocastState state) : previous_(AutocastMode::GetState()) {
  AutocastMode::SetState(std::move(state));
}

AutocastStateGuard::~AutocastStateGuard() { AutocastMode::SetState(std::move(previous_)); }

AutocastSuspendGuard::AutocastSuspendGuard() : previous_mask_(t_enabled_mask) {
  t_enabled_mask = 0;
}

AutocastSuspendGuard::~AutocastSuspendGuard() { t_enabled_mask = previous_mask_; }

}  // namespace tandem
