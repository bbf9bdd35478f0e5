#include "nn/optim.h"

#include <cmath>
#include <set>
#include <string>
#include <utility>

#include "tensor/autograd.h"

namespace tandem::nn {
namespace {

// The gradient of `param` with L2 weight decay folded in (a new tensor when decaying, so
// the stored gradient is left as backward() made it).
Tensor DecayedGradient(const Tensor& param, const Tensor& grad, double weight_decay) {
  if (weight_decay == 0.0) return grad;
  return add(grad, mul(param, weight_decay));
}

}  // namespace

Optimizer::Optimizer(std::vector<Tensor> parameters, std::string name)
    : parameters_(std::move(parameters)), name_(std::move(name)) {
  TANDEM_CHECK(!parameters_.empty(), name_,
               ": got an empty parameter list; pass e.g. module->parameters() of a module that "
               "has parameters");
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const Tensor& p = parameters_[i];
    TANDEM_CHECK(p.defined(), name_, ": parameter ", i, " is undefined");
    TANDEM_CHECK(p.dtype() == kFloat32, name_, ": parameter ", i, " is ", p.dtype(),
                 " but only float32 tensors can be optimized");
    TANDEM_CHECK(p.is_leaf(), name_, ": parameter ", i, " (", ShapeToString(p.shape()),
                 ") is not a leaf but the result of ", p.grad_fn()->name(),
                 "; an optimizer updates leaves, where gradients accumulate");
  }
}

void Optimizer::zero_grad(bool set_to_none) { ZeroGrad(parameters_, set_to_none); }

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
  TANDEM_CHECK(value.dtype() == kFloat32 && value.shape() == p.shape(), name_,
               "::load_state_dict: entry '", name, "' must be float32 of shape ",
               ShapeToString(p.shape()), " (parameter ", i, "'s) but is ", value.dtype(),
               " of shape ", ShapeToString(value.shape()),
               "; was the state saved for another model?");
  NoGradGuard no_grad;
  return value.to(p.device()).clone();
}

// ---- SGD -------------------------------------------------------------------------------

SGD::SGD(std::vector<Tensor> parameters, const SGDOptions& options)
    : Optimizer(std::move(parameters), "SGD"), options_(options) {
  const SGDOptions& o = options_;
  TANDEM_CHECK(o.lr_ >= 0.0, "SGD: the learning rate must be >= 0 but is ", o.lr_);
  TANDEM_CHECK(o.momentum_ >= 0.0, "SGD: momentum must be >= 0 but is ", o.momentum_);
  TANDEM_CHECK(o.weight_decay_ >= 0.0, "SGD: weight_decay must be >= 0 but is ", o.weight_decay_);
  TANDEM_CHECK(!o.nesterov_ || (o.momentum_ > 0.0 && o.dampening_ == 0.0),
               "SGD: Nesterov momentum needs momentum > 0 and dampening 0, but momentum is ",
               o.momentum_, " and dampening ", o.dampening_);
  momentum_buffers_.resize(parameters_.size());
}

void SGD::step() {
  NoGradGuard no_grad;
  const SGDOptions& o = options_;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    Tensor& p = parameters_[i];
    const Tensor grad = p.grad();
    if (!grad.defined()) continue;
    Tensor g = DecayedGradient(p, grad, o.weight_decay_);
    if (o.momentum_ != 0.0) {
      Tensor& buffer = momentum_buffers_[i];
      if (!buffer.defined()) {
        buffer = g.clone();
      } else {
        buffer.mul_(o.momentum_).add_(g, 1.0 - o.dampening_);
      }
      g = o.nesterov_ ? add(g, mul(buffer, o.momentum_)) : buffer;
    }
    p.add_(g, -o.lr_);
  }
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

// ---- Adam ------------------------------------------------------------------------------

Adam::Adam(std::vector<Tensor> parameters, const AdamOptions& options)
    : Optimizer(std::move(parameters), "Adam"), options_(options) {
  const AdamOptions& o = options_;
  TANDEM_CHECK(o.lr_ >= 0.0, "Adam: the learning rate must be >= 0 but is ", o.lr_);
  TANDEM_CHECK(o.eps_ >= 0.0, "Adam: eps must be >= 0 but is ", o.eps_);
  TANDEM_CHECK(o.beta1_ >= 0.0 && o.beta1_ < 1.0 && o.beta2_ >= 0.0 && o.beta2_ < 1.0,
               "Adam: betas must be in [0, 1) but are (", o.beta1_, ", ", o.beta2_, ")");
  TANDEM_CHECK(o.weight_decay_ >= 0.0, "Adam: weight_decay must be >= 0 but is ", o.weight_decay_);
  steps_.assign(parameters_.size(), 0);
  exp_avg_.resize(parameters_.size());
  exp_avg_sq_.resize(parameters_.size());
}

void Adam::step() {
  NoGradGuard no_grad;
  const AdamOptions& o = options_;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    Tensor& p = parameters_[i];
    const Tensor grad = p.grad();
    if (!grad.defined()) continue;
    const Tensor g = DecayedGradient(p, grad, o.weight_decay_);
    Tensor& m = exp_avg_[i];
    Tensor& v = exp_avg_sq_[i];
    if (!m.defined()) {
      m = zeros_like(p);
      v = zeros_like(p);
    }
    const int64_t t = ++steps_[i];
    m.mul_(o.beta1_).add_(g, 1.0 - o.beta1_);
    v.mul_(o.beta2_).add_(square(g), 1.0 - o.beta2_);
    const double bias_correction1 = 1.0 - std::pow(o.beta1_, static_cast<double>(t));
    const double bias_correction2 = 1.0 - std::pow(o.beta2_, static_cast<double>(t));
    // denom = sqrt(v) / sqrt(bias_correction2) + eps, built in one temporary.
    Tensor denom = sqrt(v);
    denom.mul_(1.0 / std::sqrt(bias_correction2)).add_(o.eps_);
    p.add_(div(m, denom), -o.lr_ / bias_correction1);
  }
}

OptimizerState Adam::state_dict() const {
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

void Adam::load_state_dict(const OptimizerState& state) {
  std::vector<int64_t> steps(parameters_.size(), 0);
  std::vector<Tensor> exp_avg(parameters_.size()), exp_avg_sq(parameters_.size());
  std::vector<int> fields_seen(parameters_.size(), 0);
  for (const auto& [name, value] : state) {
    const auto [i, field] = ParseStateName(name, {"exp_avg", "exp_avg_sq", "step"});
    ++fields_seen[i];
    if (field == "step") {
      TANDEM_CHECK(value.defined() && value.dtype() == kInt64 && value.numel() == 1, name_,
                   "::load_state_dict: entry '", name, "' must be one int64 (the step count)");
      steps[i] = value.to(Device::Cpu(0)).reshape({1}).to_vector<int64_t>().at(0);
      TANDEM_CHECK(steps[i] >= 1, name_, "::load_state_dict: entry '", name,
                   "' must be a step count of at least 1 but is ", steps[i]);
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

}  // namespace tandem::nn
