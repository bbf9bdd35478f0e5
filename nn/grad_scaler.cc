#include "nn/grad_scaler.h"

#include <cmath>
#include <limits>
#include <set>
#include <utility>
#include <vector>

#include "tensor/base/error.h"
#include "tensor/base/grad_mode.h"
#include "tensor/ops/ops.h"

namespace tandem::nn {
namespace {

constexpr char kScale[] = "scale";
constexpr char kGrowthFactor[] = "growth_factor";
constexpr char kBackoffFactor[] = "backoff_factor";
constexpr char kGrowthInterval[] = "growth_interval";
constexpr char kGrowthTracker[] = "growth_tracker";

void CheckOptions(const GradScalerOptions& o, const std::string& where) {
  TANDEM_CHECK(std::isfinite(o.init_scale()) && o.init_scale() > 0 &&
                   o.init_scale() <= std::numeric_limits<float>::max(),
               where, ": the scale must be positive and finite in float32 but is ", o.init_scale(),
               "; the default is 65536");
  TANDEM_CHECK(std::isfinite(o.growth_factor()) && o.growth_factor() > 1.0, where,
               ": growth_factor must be > 1 but is ", o.growth_factor(), "; the default is 2");
  TANDEM_CHECK(o.backoff_factor() > 0.0 && o.backoff_factor() < 1.0, where,
               ": backoff_factor must be in (0, 1) but is ", o.backoff_factor(),
               "; the default is 0.5");
  TANDEM_CHECK(o.growth_interval() >= 1, where, ": growth_interval must be >= 1 but is ",
               o.growth_interval(), "; the default is 2000");
}

// The one value of state entry `name`, checked to be a single element of `dtype`.
Tensor StateValue(const GradScalerState& state, const char* name, DType dtype) {
  auto it = state.find(name);
  TANDEM_CHECK(it != state.end(), "GradScaler::load_state_dict: the state has no '", name,
               "' entry; pass a state from GradScaler::state_dict() (it holds scale, "
               "growth_factor, backoff_factor, growth_interval and growth_tracker)");
  const Tensor& value = it->second;
  TANDEM_CHECK(
      value.defined() && value.numel() == 1 && value.dtype() == dtype,
      "GradScaler::load_state_dict: entry '", name, "' must be one ", dtype, " value but is ",
      value.defined() ? tandem::internal::Concat(value.numel(), " ", value.dtype(), " element(s)")
                      : std::string("undefined"),
      "; pass a state from GradScaler::state_dict()");
  return value;
}

}  // namespace

GradScaler::GradScaler(const GradScalerOptions& options)
    : options_(options), scale_(static_cast<float>(options.init_scale())) {
  if (options_.enabled()) CheckOptions(options_, "GradScaler");
}

Tensor GradScaler::scale(const Tensor& loss) const {
  if (!options_.enabled()) return loss;
  TANDEM_CHECK(loss.defined(), "GradScaler::scale: the loss is undefined");
  TANDEM_CHECK(IsFloatingPoint(loss.dtype()),
               "GradScaler::scale: the loss must be floating "
               "point but is ",
               loss.dtype(), "; scale the loss, not integer outputs");
  const Tensor wide = IsReducedFloatingPoint(loss.dtype()) ? loss.to(kFloat32) : loss;
  return mul(wide, static_cast<double>(scale_));
}

void GradScaler::unscale_(Optimizer& optimizer) {
  if (!options_.enabled()) return;
  PerOptimizer& state = per_optimizer_[&optimizer];
  TANDEM_CHECK(state.stage != Stage::kUnscaled,
               "GradScaler::unscale_: unscale_() has already been called on this optimizer ("
               "",
               optimizer.name(),
               ") since the last update(); call it at most once per "
               "optimizer per iteration (step() does not unscale again after it)");
  TANDEM_CHECK(state.stage != Stage::kStepped,
               "GradScaler::unscale_: unscale_() is being called after step() on this optimizer "
               "(",
               optimizer.name(),
               ") without an update() in between; call unscale_ before "
               "step(), and update() at the end of each iteration");
  NoGradGuard no_grad;
  // 1/scale rounded to float32 as PyTorch's inv_scale tensor: the same unscaled values.
  const double inv_scale = static_cast<float>(1.0 / static_cast<double>(scale_));
  for (const Tensor& p : optimizer.parameters()) {
    if (!p.defined()) continue;
    Tensor g = p.grad();
    if (!g.defined()) continue;
    TANDEM_CHECK(
        g.dtype() != kFloat16, "GradScaler::unscale_: a parameter of shape ",
        ShapeToString(p.shape()),
        " has a float16 gradient (attempting to unscale float16 "
        "gradients, which PyTorch refuses too: they lose the small values that scaling "
        "saved); keep the parameters in float32 and run the forward in float16 (autocast)");
    TANDEM_CHECK(IsFloatingPoint(g.dtype()), "GradScaler::unscale_: a parameter of shape ",
                 ShapeToString(p.shape()), " has a ", g.dtype(),
                 " gradient; gradients must be floating point");
    g.mul_(inv_scale);
    // x * 0 is 0 for every finite x and NaN for inf and NaN: the sum is NaN exactly when
    // some element is not finite (a plain sum could overflow on large finite values).
    Tensor nonfinite = sum(mul(g, 0.0)).to(kFloat32);
    Tensor& found = state.found_inf_per_device[g.device()];
    found = found.defined() ? add(found, nonfinite) : nonfinite;
  }
  state.stage = Stage::kUnscaled;
}

bool GradScaler::ReadFoundInf(PerOptimizer& state) {
  if (!state.found_inf.has_value()) {
    // One host read for all devices: each device's flag comes to the host, then one item().
    Tensor total;
    for (const auto& [device, flag] : state.found_inf_per_device) {
      Tensor host = flag.to(Device::Cpu(0));
      total = total.defined() ? add(total, host) : host;
    }
    const double value = total.defined() ? total.item() : 0.0;
    state.found_inf = FoundInfAnywhere(!(value == 0.0));  // NaN compares unequal
  }
  return *state.found_inf;
}

bool GradScaler::step(Optimizer& optimizer) {
  if (!options_.enabled()) {
    optimizer.step();
    return true;
  }
  {
    auto it = per_optimizer_.find(&optimizer);
    TANDEM_CHECK(it == per_optimizer_.end() || it->second.stage != Stage::kStepped,
                 "GradScaler::step: step() has already been called on this optimizer (",
                 optimizer.name(), ") since the last update(); call update() after each step()");
  }
  PerOptimizer& state = per_optimizer_[&optimizer];
  if (state.stage == Stage::kReady) unscale_(optimizer);
  const bool found_inf = ReadFoundInf(state);
  state.stage = Stage::kStepped;
  if (found_inf) return false;
  optimizer.step();
  return true;
}

void GradScaler::update(std::optional<double> new_scale) {
  if (!options_.enabled()) return;
  if (new_scale.has_value()) {
    TANDEM_CHECK(std::isfinite(*new_scale) && *new_scale > 0 &&
                     *new_scale <= std::numeric_limits<float>::max(),
                 "GradScaler::update: new_scale must be positive and finite in float32 but is ",
                 *new_scale);
    scale_ = static_cast<float>(*new_scale);
  } else {
    bool any_checked = false;
    bool found_inf = false;
    for (auto& [optimizer, state] : per_optimizer_) {
      if (state.stage == Stage::kReady) continue;
      any_checked = true;
      found_inf = ReadFoundInf(state) || found_inf;
    }
    TANDEM_CHECK(any_checked,
                 "GradScaler::update: no inf checks were recorded prior to update(): call "
                 "step(optimizer) (or unscale_(optimizer)) between scale(loss).backward() and "
                 "update()");
    // PyTorch's _amp_update_scale_, in float32.
    if (found_inf) {
      scale_ = static_cast<float>(scale_ * options_.backoff_factor());
      growth_tracker_ = 0;
    } else if (growth_tracker_ + 1 == options_.growth_interval()) {
      // Kept only while float32 holds it (converting a larger double is undefined).
      const double grown = static_cast<double>(scale_) * options_.growth_factor();
      if (grown <= std::numeric_limits<float>::max()) scale_ = static_cast<float>(grown);
      growth_tracker_ = 0;
    } else {
      ++growth_tracker_;
    }
  }
  per_optimizer_.clear();
}

double GradScaler::get_scale() const { return options_.enabled() ? scale_ : 1.0; }

GradScalerState GradScaler::state_dict() const {
  if (!options_.enabled()) return {};
  return {
      {kScale, scalar_tensor(scale_, kFloat64)},
      {kGrowthFactor, scalar_tensor(options_.growth_factor(), kFloat64)},
      {kBackoffFactor, scalar_tensor(options_.backoff_factor(), kFloat64)},
      {kGrowthInterval, scalar_tensor(static_cast<double>(options_.growth_interval()), kInt64)},
      {kGrowthTracker, scalar_tensor(static_cast<double>(growth_tracker_), kInt64)},
  };
}

void GradScaler::load_state_dict(const GradScalerState& state) {
  if (!options_.enabled()) return;
  TANDEM_CHECK(!state.empty(),
               "GradScaler::load_state_dict: the state is empty, possibly because it was saved "
               "from a disabled GradScaler; load a state saved with the scaler enabled, or skip "
               "loading to start from init_scale");
  const std::set<std::string> known = {kScale, kGrowthFactor, kBackoffFactor, kGrowthInterval,
                                       kGrowthTracker};
  for (const auto& [name, value] : state) {
    TANDEM_CHECK(known.count(name), "GradScaler::load_state_dict: unknown entry '", name,
                 "'; expected only scale, growth_factor, backoff_factor, growth_interval and "
                 "growth_tracker (from GradScaler::state_dict())");
  }
  GradScalerOptions options = options_;
  options.init_scale(StateValue(state, kScale, kFloat64).item());
  options.growth_factor(StateValue(state, kGrowthFactor, kFloat64).item());
  options.backoff_factor(StateValue(state, kBackoffFactor, kFloat64).item());
  options.growth_interval(StateValue(state, kGrowthInterval, kInt64).item<int64_t>());
  const int64_t tracker = StateValue(state, kGrowthTracker, kInt64).item<int64_t>();
  CheckOptions(options, "GradScaler::load_state_dict");
  TANDEM_CHECK(tracker >= 0 && tracker < options.growth_interval(),
               "GradScaler::load_state_dict: growth_tracker must be in [0, growth_interval = ",
               options.growth_interval(), ") but is ", tracker);
  scale_ = static_cast<float>(options.init_scale());
  options.init_scale(options_.init_scale());  // the constructor's, as PyTorch keeps it
  options_ = options;
  growth_tracker_ = tracker;
}

}  // namespace tandem::nn
