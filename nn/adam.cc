#include "nn/adam.h"

#include <string>
#include <tuple>
#include <utility>

#include "tensor/ops/fused_optimizers.h"
#include "tensor/runtime/profiler.h"

namespace tandem::nn {

namespace internal {
namespace {

// Adam's and AdamW's options, as the fused step takes them.
template <typename Options>
FusedAdamOptions FusedOf(const Options& o, bool decoupled) {
  FusedAdamOptions f;
  f.lr = o.lr();
  f.beta1 = std::get<0>(o.betas());
  f.beta2 = std::get<1>(o.betas());
  f.eps = o.eps();
  f.weight_decay = o.weight_decay();
  f.decoupled_weight_decay = decoupled;
  f.amsgrad = o.amsgrad();
  f.maximize = o.maximize();
  return f;
}

FusedAdamOptions HyperOf(const OptimizerOptions& options) {
  if (const auto* o = dynamic_cast<const AdamOptions*>(&options)) return FusedOf(*o, false);
  return FusedOf(static_cast<const AdamWOptions&>(options), true);
}

}  // namespace

void AdamBase::CheckOptions(const OptimizerOptions& options) const {
  const bool right_kind = decoupled_ ? dynamic_cast<const AdamWOptions*>(&options) != nullptr
                                     : dynamic_cast<const AdamOptions*>(&options) != nullptr;
  TANDEM_CHECK(right_kind, name_, ": a parameter group's options must be nn::", name_, "Options");
  const FusedAdamOptions o = HyperOf(options);
  TANDEM_CHECK(o.lr >= 0.0, name_, ": the learning rate must be >= 0 but is ", o.lr);
  TANDEM_CHECK(o.eps >= 0.0, name_, ": eps must be >= 0 but is ", o.eps);
  TANDEM_CHECK(o.beta1 >= 0.0 && o.beta1 < 1.0 && o.beta2 >= 0.0 && o.beta2 < 1.0, name_,
               ": betas must be in [0, 1) but are (", o.beta1, ", ", o.beta2, ")");
  TANDEM_CHECK(o.weight_decay >= 0.0, name_, ": weight_decay must be >= 0 but is ", o.weight_decay);
}

void AdamBase::ResizeState(size_t n) {
  steps_.resize(n, 0);
  exp_avg_.resize(n);
  exp_avg_sq_.resize(n);
  max_exp_avg_sq_.resize(n);
}

void AdamBase::step() {
  NoGradGuard no_grad;
  TANDEM_PROFILE_SCOPE("optim", name_ + ".step");
  size_t i = 0;
  for (ParamGroup& group : groups_) {
    const FusedAdamOptions o = HyperOf(group.options());
    std::vector<Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs;
    std::vector<int64_t> steps;
    for (size_t k = 0; k < group.params().size(); ++k, ++i) {
      const Tensor& p = parameters_[i];
      const Tensor grad = p.grad();
      if (!grad.defined()) continue;
      EnsureState(exp_avg_[i], p);
      EnsureState(exp_avg_sq_[i], p);
      params.push_back(p);
      grads.push_back(GradFor(p, grad));
      exp_avgs.push_back(exp_avg_[i]);
      exp_avg_sqs.push_back(exp_avg_sq_[i]);
      if (o.amsgrad) {
        EnsureState(max_exp_avg_sq_[i], p);
        max_exp_avg_sqs.push_back(max_exp_avg_sq_[i]);
      }
      steps.push_back(++steps_[i]);
    }
    if (!params.empty())
      fused_adam_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, o);
  }
}

OptimizerState AdamBase::state_dict() const {
  NoGradGuard no_grad;
  OptimizerState state;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    if (!exp_avg_[i].defined()) continue;
    const std::string prefix = "state." + std::to_string(i) + ".";
    state[prefix + "exp_avg"] = exp_avg_[i].clone();
    state[prefix + "exp_avg_sq"] = exp_avg_sq_[i].clone();
    state[prefix + "step"] = from_vector(std::vector<int64_t>{steps_[i]}, Shape{});
    if (max_exp_avg_sq_[i].defined()) state[prefix + "max_exp_avg_sq"] = max_exp_avg_sq_[i].clone();
  }
  return state;
}

void AdamBase::load_state_dict(const OptimizerState& state) {
  std::vector<int64_t> steps(parameters_.size(), 0);
  std::vector<Tensor> exp_avg(parameters_.size()), exp_avg_sq(parameters_.size()),
      max_exp_avg_sq(parameters_.size());
  std::vector<int> fields_seen(parameters_.size(), 0);
  for (const auto& [name, value] : state) {
    const auto [i, field] =
        ParseStateName(name, {"exp_avg", "exp_avg_sq", "step", "max_exp_avg_sq"});
    if (field == "step") {
      ++fields_seen[i];
      steps[i] = StepCountFor(name, value);
    } else if (field == "max_exp_avg_sq") {
      max_exp_avg_sq[i] = StateTensorFor(i, name, value);
    } else {
      ++fields_seen[i];
      (field == "exp_avg" ? exp_avg : exp_avg_sq)[i] = StateTensorFor(i, name, value);
    }
  }
  for (size_t i = 0; i < parameters_.size(); ++i) {
    TANDEM_CHECK(fields_seen[i] == 3 || (fields_seen[i] == 0 && !max_exp_avg_sq[i].defined()),
                 name_, "::load_state_dict: parameter ", i,
                 " has only some of exp_avg, exp_avg_sq and step; expected all three (and "
                 "max_exp_avg_sq with amsgrad) or none");
  }
  steps_ = std::move(steps);
  exp_avg_ = std::move(exp_avg);
  exp_avg_sq_ = std::move(exp_avg_sq);
  max_exp_avg_sq_ = std::move(max_exp_avg_sq);
}

}  // namespace internal

Adam::Adam(std::vector<Tensor> parameters, const AdamOptions& options)
    : AdamBase("Adam", options.clone(), /*decoupled=*/false) {
  AddGroups({ParamGroup(std::move(parameters))}, /*from_parameter_list=*/true);
}

Adam::Adam(std::vector<ParamGroup> groups, const AdamOptions& defaults)
    : AdamBase("Adam", defaults.clone(), /*decoupled=*/false) {
  AddGroups(std::move(groups), /*from_parameter_list=*/false);
}

AdamW::AdamW(std::vector<Tensor> parameters, const AdamWOptions& options)
    : AdamBase("AdamW", options.clone(), /*decoupled=*/true) {
  AddGroups({ParamGroup(std::move(parameters))}, /*from_parameter_list=*/true);
}

AdamW::AdamW(std::vector<ParamGroup> groups, const AdamWOptions& defaults)
    : AdamBase("AdamW", defaults.clone(), /*decoupled=*/true) {
  AddGroups(std::move(groups), /*from_parameter_list=*/false);
}

}  // namespace tandem::nn
