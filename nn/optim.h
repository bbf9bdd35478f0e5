// Optimizers: SGD (momentum, dampening, Nesterov, weight decay) and Adam (bias-corrected,
// L2 weight decay), with PyTorch's update rules. step() updates each parameter that has a
// gradient in place, under NoGradGuard; parameters without a gradient are skipped.
//
//   nn::SGD optimizer(model->parameters(), nn::SGDOptions(0.1).momentum(0.9));
//   for (...) {
//     optimizer.zero_grad();
//     criterion.forward(model->forward(x), y).backward();
//     optimizer.step();
//   }
//
// An optimizer holds the parameter tensors it was given: move the module to its device
// (Module::to) before building the optimizer, as in PyTorch.
//
// state_dict() / load_state_dict() save and restore what an optimizer has learned (SGD's
// momentum buffers, Adam's moments and step counts), as PyTorch's do, so that a run resumed
// from a checkpoint continues exactly where it stopped:
//
//   nn::OptimizerState state = optimizer.state_dict();   // {"state.0.momentum_buffer": ...}
//   ...                                                   // e.g. through a checkpoint file
//   other_optimizer.load_state_dict(state);               // same kind, same parameters
#ifndef TANDEM_NN_OPTIM_H_
#define TANDEM_NN_OPTIM_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace tandem::nn {

// An optimizer's per-parameter state by name: "state.<i>.<what>" for parameter i (the index
// in the list the optimizer was built with), e.g. "state.0.momentum_buffer" (SGD),
// "state.3.exp_avg", "state.3.exp_avg_sq" and "state.3.step" (Adam; the step count is a
// 0-dim int64 tensor). A parameter that has not been stepped yet has no entries. The
// options (learning rate, ...) are not part of it: they come from the code that builds
// the optimizer.
using OptimizerState = std::map<std::string, Tensor>;

class Optimizer {
 public:
  // Every parameter must be a defined float32 leaf (what Module::parameters() gives).
  Optimizer(std::vector<Tensor> parameters, std::string name);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  virtual void step() = 0;
  // Clears the parameters' gradients (set_to_none: drops them, else fills them with 0).
  void zero_grad(bool set_to_none = true);
  const std::vector<Tensor>& parameters() const { return parameters_; }

  // The state as it is now. Tensors are copies (on the parameters' devices): stepping on
  // does not change a state taken before.
  virtual OptimizerState state_dict() const = 0;
  // Replaces the state with `state` (from state_dict() of an optimizer of the same kind
  // over parameters of the same shapes), copying values onto each parameter's device.
  // Checks everything first: an unknown name, a parameter index out of range, a wrong shape
  // or dtype, or a partial entry (Adam's exp_avg without its step) throws an error saying
  // which, and leaves the optimizer as it was.
  virtual void load_state_dict(const OptimizerState& state) = 0;
  const std::string& name() const { return name_; }

 protected:
  // For load_state_dict: parameter index and field of "state.<i>.<field>", after checking
  // that the field is one of `fields` and i a parameter; throws otherwise.
  std::pair<size_t, std::string> ParseStateName(const std::string& name,
                                                const std::vector<std::string>& fields) const;
  // Checks that `value` fits parameter i's state (float32, the parameter's shape) and
  // returns a copy of it on the parameter's device.
  Tensor StateTensorFor(size_t i, const std::string& name, const Tensor& value) const;

  std::vector<Tensor> parameters_;
  std::string name_;
};

struct SGDOptions {
  explicit SGDOptions(double lr) : lr_(lr) {}
  SGDOptions& lr(double value) {
    lr_ = value;
    return *this;
  }
  SGDOptions& momentum(double value) {
    momentum_ = value;
    return *this;
  }
  SGDOptions& dampening(double value) {
    dampening_ = value;
    return *this;
  }
  SGDOptions& weight_decay(double value) {
    weight_decay_ = value;
    return *this;
  }
  SGDOptions& nesterov(bool value) {
    nesterov_ = value;
    return *this;
  }

  double lr_;
  double momentum_ = 0.0;
  double dampening_ = 0.0;
  double weight_decay_ = 0.0;
  bool nesterov_ = false;
};

// For each parameter p with gradient g (PyTorch's torch.optim.SGD):
//   g = g + weight_decay * p
//   if momentum != 0:
//     b = g on the first step, else b = momentum * b + (1 - dampening) * g
//     g = g + momentum * b if nesterov, else b
//   p = p - lr * g
class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> parameters, const SGDOptions& options);
  void step() override;
  // Mutable, e.g. for a learning-rate schedule.
  SGDOptions& options() { return options_; }
  // The momentum buffer of parameter i (undefined before its first step with momentum).
  const Tensor& momentum_buffer(size_t i) const { return momentum_buffers_.at(i); }
  OptimizerState state_dict() const override;
  void load_state_dict(const OptimizerState& state) override;

 private:
  SGDOptions options_;
  std::vector<Tensor> momentum_buffers_;
};

struct AdamOptions {
  explicit AdamOptions(double lr = 1e-3) : lr_(lr) {}
  AdamOptions& lr(double value) {
    lr_ = value;
    return *this;
  }
  AdamOptions& betas(double beta1, double beta2) {
    beta1_ = beta1;
    beta2_ = beta2;
    return *this;
  }
  AdamOptions& eps(double value) {
    eps_ = value;
    return *this;
  }
  AdamOptions& weight_decay(double value) {
    weight_decay_ = value;
    return *this;
  }

  double lr_;
  double beta1_ = 0.9;
  double beta2_ = 0.999;
  double eps_ = 1e-8;
  double weight_decay_ = 0.0;
};

// For each parameter p with gradient g, at its step t = 1, 2, ... (torch.optim.Adam):
//   g = g + weight_decay * p
//   m = beta1 * m + (1 - beta1) * g          v = beta2 * v + (1 - beta2) * g^2
//   p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> parameters, const AdamOptions& options = AdamOptions());
  void step() override;
  AdamOptions& options() { return options_; }
  // Steps taken by parameter i (those with a gradient), and its moment estimates.
  int64_t step_count(size_t i) const { return steps_.at(i); }
  const Tensor& exp_avg(size_t i) const { return exp_avg_.at(i); }
  const Tensor& exp_avg_sq(size_t i) const { return exp_avg_sq_.at(i); }
  OptimizerState state_dict() const override;
  void load_state_dict(const OptimizerState& state) override;

 private:
  AdamOptions options_;
  std::vector<int64_t> steps_;
  std::vector<Tensor> exp_avg_;
  std::vector<Tensor> exp_avg_sq_;
};

}  // namespace tandem::nn

#endif  // TANDEM_NN_OPTIM_H_
