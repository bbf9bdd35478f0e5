// GradScaler: dynamic loss scaling for float16 training, as PyTorch's torch.amp.GradScaler.
// float16's smallest normal number is 6.1e-5, so the small gradients of a float16 backward
// underflow to zero; scaling the loss by a large factor (65536 at first) moves them into
// float16's range, and unscaling the gradients before the optimizer's step undoes it. When a
// step's gradients hold an inf or NaN (the scale overflowed something), the step is skipped
// and the scale halved; after growth_interval clean steps in a row it doubles again. bfloat16
// has float32's range and needs no scaler (keep it disabled: every call passes through).
//
//   nn::GradScaler scaler;                        // GradScalerOptions() for the defaults
//   for (...) {
//     optimizer.zero_grad();
//     // float32 parameters; activations in float16 (autocast, or inputs cast to float16)
//     Tensor loss = criterion.forward(model->forward(x), y);
//     scaler.scale(loss).backward();              // gradients of loss * scale
//     scaler.step(optimizer);                     // unscales; steps unless inf/NaN was found
//     scaler.update();                            // backs off or grows the scale
//   }
//
// Clipping (or reading) gradients needs them unscaled first: call unscale_ before, and step()
// will not unscale them again.
//
//   scaler.scale(loss).backward();
//   scaler.unscale_(optimizer);                   // gradients now in their true units
//   nn::clip_grad_norm_(model->parameters(), 1.0);
//   scaler.step(optimizer);
//   scaler.update();
//
// Gradients may live on any devices, several at once (each optimizer's parameters may be
// spread over devices): unscale_ multiplies each gradient by 1/scale on its device and sums
// each device's gradients times 0 there (NaN exactly when some element is inf or NaN), so the
// check stays on the devices; the host reads the per-device results once per step, not once
// per tensor. Gradients must not be float16 (as PyTorch: keep float32 parameters, whose
// gradients are float32 whatever dtype the activations have). Under DistributedDataParallel
// every rank holds the same averaged gradients, so every rank skips the same steps.
//
// state_dict() / load_state_dict() save and restore the scale and the growth tracker (and the
// options) for a resumed run, as a name -> tensor map like nn::OptimizerState, which a
// checkpoint stores as it stores an optimizer's state (see examples/trainer_state.cc).
#ifndef TANDEM_NN_GRAD_SCALER_H_
#define TANDEM_NN_GRAD_SCALER_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "nn/optim.h"
#include "tensor/base/arg.h"
#include "tensor/tensor.h"

namespace tandem::nn {

struct GradScalerOptions {
  TANDEM_ARG(double, init_scale) = 65536.0;  // 2^16
  // What the scale is multiplied by after growth_interval steps without inf/NaN (> 1).
  TANDEM_ARG(double, growth_factor) = 2.0;
  // What the scale is multiplied by after a step with inf/NaN gradients (in (0, 1)).
  TANDEM_ARG(double, backoff_factor) = 0.5;
  TANDEM_ARG(int64_t, growth_interval) = 2000;
  // A disabled scaler passes everything through: scale(loss) is loss, step() is
  // optimizer.step(), update() and unscale_() do nothing (for code that runs with and
  // without float16 alike).
  TANDEM_ARG(bool, enabled) = true;
};

// The scaler's state by name: "scale" (0-dim float64), "growth_factor", "backoff_factor"
// (0-dim float64), "growth_interval" and "growth_tracker" (0-dim int64: clean steps in a row
// since the scale last changed). Empty for a disabled scaler, as PyTorch's.
using GradScalerState = std::map<std::string, Tensor>;

class GradScaler {
 public:
  explicit GradScaler(const GradScalerOptions& options = GradScalerOptions());
  virtual ~GradScaler() = default;

  // loss * scale, differentiable (the gradients of backward() are scaled alike). A float16
  // or bfloat16 loss is multiplied in float32 (PyTorch's 0-dim promotion): loss * 65536 may
  // exceed float16's 65504. Disabled: `loss` itself.
  Tensor scale(const Tensor& loss) const;

  // Divides the gradients of `optimizer`'s parameters by the scale, in place, and records
  // whether any element is inf or NaN. At most once per optimizer between update() calls
  // (a second call throws); step() then does not unscale again. Disabled: does nothing.
  void unscale_(Optimizer& optimizer);

  // Unscales (unless unscale_ was called) and calls optimizer.step() unless a gradient held
  // inf or NaN; returns whether it stepped. Once per optimizer between update() calls.
  // Disabled: optimizer.step(), returning true.
  bool step(Optimizer& optimizer);

  // Ends the iteration: after a step that found inf/NaN (in any optimizer), scale *=
  // backoff_factor and the tracker restarts; otherwise the tracker counts one more clean
  // step, and at growth_interval scale *= growth_factor (kept unless that overflows float32)
  // and the tracker restarts. With `new_scale`, sets the scale to it instead (the tracker
  // is kept). Needs a step() (or unscale_) since the last update(). Disabled: does nothing.
  void update(std::optional<double> new_scale = std::nullopt);

  // The current scale (1.0 when disabled, as PyTorch's get_scale).
  double get_scale() const;
  double get_growth_factor() const { return options_.growth_factor(); }
  double get_backoff_factor() const { return options_.backoff_factor(); }
  int64_t get_growth_interval() const { return options_.growth_interval(); }
  int64_t get_growth_tracker() const { return growth_tracker_; }
  bool is_enabled() const { return options_.enabled(); }
  const GradScalerOptions& options() const { return options_; }

  GradScalerState state_dict() const;
  // Restores a state_dict() (checked first: a missing, unknown or ill-typed entry, or an
  // invalid value, throws and leaves the scaler as it was). An enabled scaler refuses an
  // empty state (one saved from a disabled scaler); a disabled scaler ignores any state.
  void load_state_dict(const GradScalerState& state);

 protected:
  // Whether some holder of the gradients found inf or NaN, given what this one found: this
  // scaler holds them all. ShardedGradScaler (parallel/distributed) asks every rank, each
  // holding a shard of them. Called once per optimizer per iteration, in step() (or in
  // update() for an optimizer that was only unscaled).
  virtual bool FoundInfAnywhere(bool found_here) { return found_here; }

 private:
  enum class Stage { kReady, kUnscaled, kStepped };
  struct PerOptimizer {
    Stage stage = Stage::kReady;
    // Per device: the sum of gradients * 0 (NaN if some gradient held inf/NaN), until read.
    std::map<Device, Tensor> found_inf_per_device;
    std::optional<bool> found_inf;  // read from found_inf_per_device once
  };

  bool ReadFoundInf(PerOptimizer& state);

  GradScalerOptions options_;
  float scale_;  // float32, as PyTorch's scale tensor: the same growth and backoff sequence
  int64_t growth_tracker_ = 0;
  // Keyed by the optimizer's address, as PyTorch's by id(optimizer); cleared by update().
  std::map<const Optimizer*, PerOptimizer> per_optimizer_;
};

}  // namespace tandem::nn

#endif  // TANDEM_NN_GRAD_SCALER_H_
