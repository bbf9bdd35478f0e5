#include "nn/rmsprop.h"

#include <string>
#include <utility>

#include "tensor/ops/fused_optimizers.h"
#include "tensor/runtime/profiler.h"

namespace tandem::nn {

RMSprop::RMSprop(std::vector<Tensor> parameters, const RMSpropOptions& options)
    : Optimizer("RMSprop", options.clone()) {
  AddGroups({ParamGroup(std::move(parameters))}, /*from_parameter_list=*/true);
}

RMSprop::RMSprop(std::vector<ParamGroup> groups, const RMSpropOptions& defaults)
    : Optimizer("RMSprop", defaults.clone()) {
  AddGroups(std::move(groups), /*from_parameter_list=*/false);
}

void RMSprop::CheckOptions(const OptimizerOptions& options) const {
  const auto* o = dynamic_cast<const RMSpropOptions*>(&options);
  TANDEM_CHECK(o != nullptr, "RMSprop: a parameter group's options must be nn::RMSpropOptions");
  TANDEM_CHECK(o->lr() >= 0.0, "RMSprop: the learning rate must be >= 0 but is ", o->lr());
  TANDEM_CHECK(o->alpha() >= 0.0, "RMSprop: alpha must be >= 0 but is ", o->alpha());
  TANDEM_CHECK(o->eps() >= 0.0, "RMSprop: eps must be >= 0 but is ", o->eps());
  TANDEM_CHECK(o->momentum() >= 0.0, "RMSprop: momentum must be >= 0 but is ", o->momentum());
  TANDEM_CHECK(o->weight_decay() >= 0.0, "RMSprop: weight_decay must be >= 0 but is ",
               o->weight_decay());
}

void RMSprop::ResizeState(size_t n) {
  steps_.resize(n, 0);
  square_avg_.resize(n);
  momentum_buffers_.resize(n);
  grad_avg_.resize(n);
}

void RMSprop::step() {
  NoGradGuard no_grad;
  TANDEM_PROFILE_SCOPE("optim", name_ + ".step");
  size_t i = 0;
  for (ParamGroup& group : groups_) {
    const auto& o = static_cast<const RMSpropOptions&>(group.options());
    const bool momentum = o.momentum() > 0.0;
    std::vector<Tensor> params, grads, square_avgs, buffers, grad_avgs;
    for (size_t k = 0; k < group.params().size(); ++k, ++i) {
      const Tensor& p = parameters_[i];
      const Tensor grad = p.grad();
      if (!grad.defined()) continue;
      // Options may change between steps (a group's momentum set later): buffers start at 0.
      EnsureState(square_avg_[i], p);
      if (momentum) EnsureState(momentum_buffers_[i], p);
      if (o.centered()) EnsureState(grad_avg_[i], p);
      ++steps_[i];
      params.push_back(p);
      grads.push_back(GradFor(p, grad));
      square_avgs.push_back(square_avg_[i]);
      if (momentum) buffers.push_back(momentum_buffers_[i]);
      if (o.centered()) grad_avgs.push_back(grad_avg_[i]);
    }
    if (params.empty()) continue;
    FusedRmspropOptions fused;
    fused.lr = o.lr();
    fused.alpha = o.alpha();
    fused.eps = o.eps();
    fused.weight_decay = o.weight_decay();
    fused.momentum = o.momentum();
    fused.centered = o.centered();
    fused.maximize = o.maximize();
    fused_rmsprop_(params, grads, square_avgs, buffers, grad_avgs, fused);
  }
}

OptimizerState RMSprop::state_dict() const {
  NoGradGuard no_grad;
  OptimizerState state;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    if (!square_avg_[i].defined()) continue;
    const std::string prefix = "state." + std::to_string(i) + ".";
    state[prefix + "square_avg"] = square_avg_[i].clone();
    state[prefix + "step"] = from_vector(std::vector<int64_t>{steps_[i]}, Shape{});
    if (momentum_buffers_[i].defined()) {
      state[prefix + "momentum_buffer"] = momentum_buffers_[i].clone();
    }
    if (grad_avg_[i].defined()) state[prefix + "grad_avg"] = grad_avg_[i].clone();
  }
  return state;
}

void RMSprop::load_state_dict(const OptimizerState& state) {
  const size_t n = parameters_.size();
  std::vector<int64_t> steps(n, 0);
  std::vector<Tensor> square_avg(n), buffers(n), grad_avg(n);
  for (const auto& [name, value] : state) {
    const auto [i, field] =
        ParseStateName(name, {"square_avg", "step", "momentum_buffer", "grad_avg"});
    if (field == "step") {
      steps[i] = StepCountFor(name, value);
    } else if (field == "square_avg") {
      square_avg[i] = StateTensorFor(i, name, value);
    } else if (field == "momentum_buffer") {
      buffers[i] = StateTensorFor(i, name, value);
    } else {
      grad_avg[i] = StateTensorFor(i, name, value);
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const bool any =
        steps[i] != 0 || square_avg[i].defined() || buffers[i].defined() || grad_avg[i].defined();
    TANDEM_CHECK(!any || (steps[i] != 0 && square_avg[i].defined()), name_,
                 "::load_state_dict: parameter ", i,
                 " has state but lacks square_avg or step; expected both (and momentum_buffer, "
                 "grad_avg where momentum or centered are on)");
  }
  steps_ = std::move(steps);
  square_avg_ = std::move(square_avg);
  momentum_buffers_ = std::move(buffers);
  grad_avg_ = std::move(grad_avg);
}

}  // namespace tandem::nn
