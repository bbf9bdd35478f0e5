#include "nn/adam.h"

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "tensor/ops/fused_optimizers.h"
#include "tensor/runtime/profiler.h"
#include "tensor/runtime/stream.h"

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

bool CapturableOf(const OptimizerOptions& options) {
  if (const auto* o = dynamic_cast<const AdamOptions*>(&options)) return o->capturable();
  return static_cast<const AdamWOptions&>(options).capturable();
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
  if (capturable_state_.size() < groups_.size()) capturable_state_.resize(groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) {
    ParamGroup& group = groups_[g];
    FusedAdamOptions o = HyperOf(group.options());
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
    if (params.empty()) continue;
    if (CapturableOf(group.options())) {
      Tensor& state = CapturableState(g, params, steps.front());
      if (!tandem::internal::GraphCaptureUnderway()) state.narrow(0, 0, 1).fill_(o.lr);
      o.capturable_state = static_cast<double*>(state.raw_data());
    }
    fused_adam_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, o);
  }
}

Tensor& AdamBase::CapturableState(size_t g, const std::vector<Tensor>& params, int64_t step) {
  Tensor& state = capturable_state_[g];
  const Device device = params.front().device();
  for (const Tensor& p : params) {
    TANDEM_CHECK(p.device().is_cuda() && p.device() == device && p.dtype() == params[0].dtype(),
                 name_, " with capturable(true): parameter group ", g,
                 " must have all its parameters on one CUDA device in one dtype (its step count "
                 "and learning rate live there); found ",
                 p.device(), " ", p.dtype(), " beside ", device, " ", params[0].dtype());
  }
  if (state.defined()) {
    TANDEM_CHECK(state.device() == device, name_, " with capturable(true): parameter group ", g,
                 " moved from ", state.device(), " to ", device,
                 "; build the optimizer after moving the model");
    return state;
  }
  TANDEM_CHECK(!tandem::internal::GraphCaptureUnderway(), name_,
               " with capturable(true): the first step() of parameter group ", g,
               " makes its device state, which a CUDA Graph capture cannot; run a warm-up step "
               "before capturing, as torch.cuda.graph requires");
  // {lr, the step before this one, scratch}: the step kernel advances the count.
  state =
      from_vector(std::vector<double>{0.0, static_cast<double>(step - 1), 0.0, 0.0, 0.0}, Shape{5})
          .to(device);
  return state;
}

void AdamBase::SyncLearningRates() {
  NoGradGuard no_grad;
  for (size_t g = 0; g < capturable_state_.size() && g < groups_.size(); ++g) {
    if (!capturable_state_[g].defined()) continue;
    TANDEM_CHECK(!tandem::internal::GraphCaptureUnderway(), name_,
                 "::SyncLearningRates during a CUDA Graph capture would freeze the learning rate "
                 "into the graph; set it between replays");
    capturable_state_[g].narrow(0, 0, 1).fill_(groups_[g].options().get_lr());
  }
}

int64_t AdamBase::StepOf(size_t i) const {
  size_t first = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const size_t end = first + groups_[g].params().size();
    if (i < end) {
      // A capturable group's count advances on the device (replays do not tell the host).
      if (g < capturable_state_.size() && capturable_state_[g].defined()) {
        return static_cast<int64_t>(capturable_state_[g].narrow(0, 1, 1).item());
      }
      break;
    }
    first = end;
  }
  return steps_[i];
}

OptimizerState AdamBase::state_dict() const {
  NoGradGuard no_grad;
  OptimizerState state;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    if (!exp_avg_[i].defined()) continue;
    const std::string prefix = "state." + std::to_string(i) + ".";
    state[prefix + "exp_avg"] = exp_avg_[i].clone();
    state[prefix + "exp_avg_sq"] = exp_avg_sq_[i].clone();
    state[prefix + "step"] = from_vector(std::vector<int64_t>{StepOf(i)}, Shape{});
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
  capturable_state_.clear();  // remade from steps_ by the next step()
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
