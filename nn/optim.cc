#include "nn/optim.h"

#include <cmath>

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

}  // namespace tandem::nn
