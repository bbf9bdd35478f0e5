#include "nn/optim.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>
#include <string>
#include <utility>

#include "tensor/core/autograd.h"
#include "tensor/runtime/backend.h"
#include "tensor/runtime/profiler.h"

namespace tandem::nn {
namespace {

// Note [Fused optimizer updates] (tensor/runtime/backend.h): every optimizer here hands its
// whole step to the parameters' backends, one FusedOptimizerUpdate per device and dtype, so
// the update rule is written once per backend (the CPU's and CUDA's loops share
// tensor/kernels/internal/optimizer_math.h) instead of once in fused CPU loops and again in
// tensor ops for the other devices.
//
// Collects one step's updates and runs them. A parameter or gradient that is not contiguous
// (a strided view) is updated through a contiguous copy, written back after.
class FusedStep {
 public:
  // The update of `param`; the caller fills in the kind's scalars. States must be contiguous
  // tensors of the parameter's dtype and device (the optimizers make them so).
  FusedUpdate& Add(OptimizerKind kind, const Tensor& param, const Tensor& grad,
                   const Tensor& state0 = Tensor(), const Tensor& state1 = Tensor(),
                   const Tensor& state2 = Tensor()) {
    Tensor target = param;
    if (!param.is_contiguous()) {
      target = param.contiguous();
      write_back_.push_back({param, target});
    }
    const Tensor g = grad.dtype() == param.dtype() ? grad.contiguous() : grad.to(param.dtype());
    keep_alive_.push_back(g);
    FusedUpdate update;
    update.kind = kind;
    update.numel = param.numel();
    update.param = target.data_ptr();
    update.grad = g.data_ptr();
    update.state0 = state0.defined() ? state0.data_ptr() : nullptr;
    update.state1 = state1.defined() ? state1.data_ptr() : nullptr;
    update.state2 = state2.defined() ? state2.data_ptr() : nullptr;
    Group& group = GroupOf(param.device(), param.dtype());
    group.updates.push_back(update);
    return group.updates.back();
  }

  void Run() {
    for (Group& group : groups_) {
      GetBackend(group.device)
          .FusedOptimizerUpdate(group.device.index(), group.dtype, group.updates);
    }
    for (auto& [param, copy] : write_back_) param.copy_(copy);
  }

 private:
  struct Group {
    Device device;
    DType dtype;
    std::vector<FusedUpdate> updates;
  };
  Group& GroupOf(Device device, DType dtype) {
    for (Group& g : groups_) {
      if (g.device == device && g.dtype == dtype) return g;
    }
    groups_.push_back({device, dtype, {}});
    return groups_.back();
  }
  std::vector<Group> groups_;
  std::vector<Tensor> keep_alive_;  // contiguous or converted gradients
  std::vector<std::pair<Tensor, Tensor>> write_back_;
};

struct AdamHyper {
  double lr, beta1, beta2, eps, weight_decay;
};

// A state tensor for `param`: zeros, or `state` made contiguous (a loaded state may not be).
void EnsureState(Tensor& state, const Tensor& param) {
  if (!state.defined()) {
    state = zeros_like(param);
  } else if (!state.is_contiguous()) {
    state = state.contiguous();
  }
}

}  // namespace

// ---- ParamGroup and Optimizer ----------------------------------------------------------

ParamGroup::ParamGroup(const ParamGroup& other)
    : params_(other.params_),
      options_(other.options_ ? other.options_->clone() : nullptr),
      initial_lr_(other.initial_lr_) {}

ParamGroup& ParamGroup::operator=(const ParamGroup& other) {
  if (this != &other) {
    params_ = other.params_;
    options_ = other.options_ ? other.options_->clone() : nullptr;
    initial_lr_ = other.initial_lr_;
  }
  return *this;
}

OptimizerOptions& ParamGroup::options() {
  TANDEM_CHECK(options_ != nullptr,
               "ParamGroup::options: this group has no options of its own; an optimizer fills "
               "them in from its defaults when the group is added (read them through "
               "optimizer.param_groups())");
  return *options_;
}

const OptimizerOptions& ParamGroup::options() const {
  return const_cast<ParamGroup*>(this)->options();
}

Optimizer::Optimizer(std::string name, std::unique_ptr<OptimizerOptions> defaults)
    : defaults_(std::move(defaults)), name_(std::move(name)) {}

void Optimizer::AddGroups(std::vector<ParamGroup> groups, bool from_parameter_list) {
  if (from_parameter_list) {
    TANDEM_CHECK(!groups.empty() && !groups[0].params().empty(), name_,
                 ": got an empty parameter list; pass e.g. module->parameters() of a module "
                 "that has parameters");
  } else {
    TANDEM_CHECK(!groups.empty(), name_,
                 ": got no parameter groups; pass at least one nn::ParamGroup");
  }
  CheckOptions(*defaults_);
  for (const ParamGroup& group : groups) add_param_group(group);
}

void Optimizer::add_param_group(const ParamGroup& group) {
  const size_t g = groups_.size();
  std::unique_ptr<OptimizerOptions> options =
      group.has_options() ? group.options().clone() : defaults_->clone();
  CheckOptions(*options);
  std::set<const void*> seen;
  for (const Tensor& p : parameters_) seen.insert(p.impl());
  for (size_t k = 0; k < group.params().size(); ++k) {
    const Tensor& p = group.params()[k];
    const size_t i = parameters_.size() + k;
    TANDEM_CHECK(p.defined(), name_, ": parameter ", i, " is undefined");
    TANDEM_CHECK(IsFloatingPoint(p.dtype()), name_, ": parameter ", i, " is ", p.dtype(),
                 " but only floating-point tensors (float32, float64) can be optimized");
    TANDEM_CHECK(p.is_leaf(), name_, ": parameter ", i, " (", ShapeToString(p.shape()),
                 ") is not a leaf but the result of ", p.grad_fn()->name(),
                 "; an optimizer updates leaves, where gradients accumulate");
    TANDEM_CHECK(seen.insert(p.impl()).second, name_, ": parameter ", i, " (",
                 ShapeToString(p.shape()), ") of group ", g,
                 " appears more than once in this optimizer; give each parameter to one "
                 "group only");
  }
  ParamGroup added(group.params());
  added.set_options(std::move(options));
  if (group.initial_lr()) added.set_initial_lr(*group.initial_lr());
  groups_.push_back(std::move(added));
  parameters_.insert(parameters_.end(), group.params().begin(), group.params().end());
  ResizeState(parameters_.size());
}

void Optimizer::zero_grad(bool set_to_none) {
  TANDEM_PROFILE_SCOPE("optim", name_ + ".zero_grad");
  ZeroGrad(parameters_, set_to_none);
}

std::pair<size_t, std::string> Optimizer::ParseStateName(
    const std::string& name, const std::vector<std::string>& fields) const {
  std::string known;
  for (const std::string& f : fields) known += (known.empty() ? "" : ", ") + f;
  const std::string expected =
      "\"state.<parameter index>.<field>\" with a field of " + name_ + " (" + known + ")";
  TANDEM_CHECK(name.rfind("state.", 0) == 0, name_, "::load_state_dict: unknown entry '", name,
               "': expected ", expected, "; was the state saved by another kind of optimizer?");
  const size_t dot = name.find('.', 6);
  const std::string index_text = name.substr(6, dot == std::string::npos ? dot : dot - 6);
  const bool digits = !index_text.empty() && index_text.size() < 10 &&
                      index_text.find_first_not_of("0123456789") == std::string::npos;
  TANDEM_CHECK(digits && dot != std::string::npos, name_, "::load_state_dict: malformed entry '",
               name, "': expected ", expected);
  const size_t index = std::stoul(index_text);
  TANDEM_CHECK(index < parameters_.size(), name_, "::load_state_dict: entry '", name,
               "' is for parameter ", index, " but this optimizer has ", parameters_.size(),
               " parameters; was the state saved for another model?");
  const std::string field = name.substr(dot + 1);
  bool found = false;
  for (const std::string& f : fields) found = found || f == field;
  TANDEM_CHECK(found, name_, "::load_state_dict: unknown entry '", name, "': expected ", expected,
               "; was the state saved by another kind of optimizer?");
  return {index, field};
}

Tensor Optimizer::StateTensorFor(size_t i, const std::string& name, const Tensor& value) const {
  const Tensor& p = parameters_[i];
  TANDEM_CHECK(value.defined(), name_, "::load_state_dict: entry '", name, "' is undefined");
  TANDEM_CHECK(value.dtype() == p.dtype() && value.shape() == p.shape(), name_,
               "::load_state_dict: entry '", name, "' must be ", p.dtype(), " of shape ",
               ShapeToString(p.shape()), " (parameter ", i, "'s) but is ", value.dtype(),
               " of shape ", ShapeToString(value.shape()),
               "; was the state saved for another model?");
  NoGradGuard no_grad;
  return value.to(p.device()).clone();
}

int64_t Optimizer::StepCountFor(const std::string& name, const Tensor& value) const {
  TANDEM_CHECK(value.defined() && value.dtype() == kInt64 && value.numel() == 1, name_,
               "::load_state_dict: entry '", name, "' must be one int64 (the step count)");
  const int64_t step = value.to(Device::Cpu(0)).reshape({1}).to_vector<int64_t>().at(0);
  TANDEM_CHECK(step >= 1, name_, "::load_state_dict: entry '", name,
               "' must be a step count of at least 1 but is ", step);
  return step;
}

// ---- SGD -------------------------------------------------------------------------------

SGD::SGD(std::vector<Tensor> parameters, const SGDOptions& options)
    : Optimizer("SGD", options.clone()) {
  AddGroups({ParamGroup(std::move(parameters))}, /*from_parameter_list=*/true);
}

SGD::SGD(std::vector<ParamGroup> groups, const SGDOptions& defaults)
    : Optimizer("SGD", defaults.clone()) {
  AddGroups(std::move(groups), /*from_parameter_list=*/false);
}

void SGD::CheckOptions(const OptimizerOptions& options) const {
  const auto* o = dynamic_cast<const SGDOptions*>(&options);
  TANDEM_CHECK(o != nullptr, "SGD: a parameter group's options must be nn::SGDOptions");
  TANDEM_CHECK(o->lr() >= 0.0, "SGD: the learning rate must be >= 0 but is ", o->lr());
  TANDEM_CHECK(o->momentum() >= 0.0, "SGD: momentum must be >= 0 but is ", o->momentum());
  TANDEM_CHECK(o->weight_decay() >= 0.0, "SGD: weight_decay must be >= 0 but is ",
               o->weight_decay());
  TANDEM_CHECK(!o->nesterov() || (o->momentum() > 0.0 && o->dampening() == 0.0),
               "SGD: Nesterov momentum needs momentum > 0 and dampening 0, but momentum is ",
               o->momentum(), " and dampening ", o->dampening());
}

void SGD::step() {
  NoGradGuard no_grad;
  TANDEM_PROFILE_SCOPE("optim", name_ + ".step");
  FusedStep fused;
  ForEachParameter<SGDOptions>([&](const SGDOptions& o, size_t i) {
    Tensor& p = parameters_[i];
    const Tensor grad = p.grad();
    if (!grad.defined()) return;
    Tensor& buffer = momentum_buffers_[i];
    const bool momentum = o.momentum() != 0.0;
    const bool first = momentum && !buffer.defined();
    if (first) {
      buffer = empty(p.shape(), TensorOptions().dtype(p.dtype()).device(p.device()));
    } else if (momentum) {
      EnsureState(buffer, p);
    }
    FusedUpdate& u = fused.Add(OptimizerKind::kSgd, p, grad, momentum ? buffer : Tensor());
    u.lr = o.lr();
    u.momentum = o.momentum();
    u.dampening = o.dampening();
    u.weight_decay = o.weight_decay();
    u.nesterov = o.nesterov();
    u.first = first;
  });
  fused.Run();
}

OptimizerState SGD::state_dict() const {
  NoGradGuard no_grad;
  OptimizerState state;
  for (size_t i = 0; i < momentum_buffers_.size(); ++i) {
    if (momentum_buffers_[i].defined()) {
      state["state." + std::to_string(i) + ".momentum_buffer"] = momentum_buffers_[i].clone();
    }
  }
  return state;
}

void SGD::load_state_dict(const OptimizerState& state) {
  std::vector<Tensor> buffers(parameters_.size());
  for (const auto& [name, value] : state) {
    const size_t i = ParseStateName(name, {"momentum_buffer"}).first;
    buffers[i] = StateTensorFor(i, name, value);
  }
  momentum_buffers_ = std::move(buffers);
}

// ---- Adam and AdamW --------------------------------------------------------------------

namespace internal {
namespace {

AdamHyper HyperOf(const OptimizerOptions& options) {
  if (const auto* o = dynamic_cast<const AdamOptions*>(&options)) {
    return {o->lr(), std::get<0>(o->betas()), std::get<1>(o->betas()), o->eps(), o->weight_decay()};
  }
  const auto& o = static_cast<const AdamWOptions&>(options);
  return {o.lr(), std::get<0>(o.betas()), std::get<1>(o.betas()), o.eps(), o.weight_decay()};
}

}  // namespace

void AdamBase::CheckOptions(const OptimizerOptions& options) const {
  const bool right_kind = decoupled_ ? dynamic_cast<const AdamWOptions*>(&options) != nullptr
                                     : dynamic_cast<const AdamOptions*>(&options) != nullptr;
  TANDEM_CHECK(right_kind, name_, ": a parameter group's options must be nn::", name_, "Options");
  const AdamHyper o = HyperOf(options);
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
}

void AdamBase::step() {
  NoGradGuard no_grad;
  TANDEM_PROFILE_SCOPE("optim", name_ + ".step");
  FusedStep fused;
  ForEachParameter<OptimizerOptions>([&](const OptimizerOptions& options, size_t i) {
    const AdamHyper o = HyperOf(options);
    Tensor& p = parameters_[i];
    const Tensor grad = p.grad();
    if (!grad.defined()) return;
    EnsureState(exp_avg_[i], p);
    EnsureState(exp_avg_sq_[i], p);
    const int64_t t = ++steps_[i];
    const double bias_correction1 = 1.0 - std::pow(o.beta1, static_cast<double>(t));
    const double bias_correction2 = 1.0 - std::pow(o.beta2, static_cast<double>(t));
    FusedUpdate& u = fused.Add(OptimizerKind::kAdam, p, grad, exp_avg_[i], exp_avg_sq_[i]);
    u.beta1 = o.beta1;
    u.beta2 = o.beta2;
    u.eps = o.eps;
    u.weight_decay = o.weight_decay;
    u.step_size = o.lr / bias_correction1;
    u.inv_bc2_sqrt = 1.0 / std::sqrt(bias_correction2);
    u.decay_factor = decoupled_ ? 1.0 - o.lr * o.weight_decay : 1.0;
    u.l2 = !decoupled_;
  });
  fused.Run();
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
  }
  return state;
}

void AdamBase::load_state_dict(const OptimizerState& state) {
  std::vector<int64_t> steps(parameters_.size(), 0);
  std::vector<Tensor> exp_avg(parameters_.size()), exp_avg_sq(parameters_.size());
  std::vector<int> fields_seen(parameters_.size(), 0);
  for (const auto& [name, value] : state) {
    const auto [i, field] = ParseStateName(name, {"exp_avg", "exp_avg_sq", "step"});
    ++fields_seen[i];
    if (field == "step") {
      steps[i] = StepCountFor(name, value);
    } else {
      (field == "exp_avg" ? exp_avg : exp_avg_sq)[i] = StateTensorFor(i, name, value);
    }
  }
  for (size_t i = 0; i < parameters_.size(); ++i) {
    TANDEM_CHECK(fields_seen[i] == 0 || fields_seen[i] == 3, name_, "::load_state_dict: parameter ",
                 i, " has only some of exp_avg, exp_avg_sq and step; expected all three or none");
  }
  steps_ = std::move(steps);
  exp_avg_ = std::move(exp_avg);
  exp_avg_sq_ = std::move(exp_avg_sq);
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

// ---- RMSprop ---------------------------------------------------------------------------

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
  FusedStep fused;
  ForEachParameter<RMSpropOptions>([&](const RMSpropOptions& o, size_t i) {
    Tensor& p = parameters_[i];
    const Tensor grad = p.grad();
    if (!grad.defined()) return;
    // Options may change between steps (a group's momentum set later): buffers start at 0.
    EnsureState(square_avg_[i], p);
    if (o.momentum() > 0.0) EnsureState(momentum_buffers_[i], p);
    if (o.centered()) EnsureState(grad_avg_[i], p);
    ++steps_[i];
    FusedUpdate& u = fused.Add(OptimizerKind::kRmsprop, p, grad, square_avg_[i],
                               o.momentum() > 0.0 ? momentum_buffers_[i] : Tensor(),
                               o.centered() ? grad_avg_[i] : Tensor());
    u.lr = o.lr();
    u.alpha = o.alpha();
    u.eps = o.eps();
    u.weight_decay = o.weight_decay();
    u.momentum = o.momentum();
  });
  fused.Run();
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
