#include "nn/optimizer.h"

#include <set>
#include <string>
#include <utility>

#include "tensor/core/autograd.h"
#include "tensor/runtime/profiler.h"

namespace tandem::nn {

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

void Optimizer::EnsureState(Tensor& state, const Tensor& param) {
  if (!state.defined()) {
    state = zeros_like(param);
  } else if (!state.is_contiguous()) {
    state = state.contiguous();
  }
}

}  // namespace tandem::nn
