// Optimizers with PyTorch's update rules and parameter groups: SGD (momentum, dampening,
// Nesterov, weight decay), Adam (L2 weight decay), AdamW (decoupled weight decay) and RMSprop
// (smoothing, momentum, centered). step() updates each parameter that has a gradient in
// place, under NoGradGuard; parameters without a gradient are skipped.
//
//   nn::SGD optimizer(model->parameters(), nn::SGDOptions(0.1).momentum(0.9));
//   for (...) {
//     optimizer.zero_grad();
//     criterion.forward(model->forward(x), y).backward();
//     optimizer.step();
//   }
//
// Parameter groups give some parameters other options (torch.optim's param_groups); a
// group without options takes the optimizer's defaults. Options stay readable and writable
// per group, which is how learning-rate schedulers (nn/lr_scheduler.h) work:
//
//   nn::SGD sgd({nn::ParamGroup(weights), nn::ParamGroup(biases, nn::SGDOptions(0.1))},
//               nn::SGDOptions(0.1).momentum(0.9).weight_decay(5e-4));
//   sgd.param_groups()[1].options().set_lr(0.01);
//   sgd.add_param_group(nn::ParamGroup(head->parameters()));   // defaults
//
// On the CPU an update is one fused pass over each parameter (no temporaries), split across
// the logical CPU devices' workers when there are several (or the device's threads when
// there is one): parameters live in host memory that every CPU device shares. CUDA
// parameters are updated with tensor ops on their device.
//
// An optimizer holds the parameter tensors it was given: move the module to its device
// (Module::to) before building the optimizer, as in PyTorch.
//
// state_dict() / load_state_dict() save and restore what an optimizer has learned (SGD's
// momentum buffers, Adam's moments and step counts, ...), so that a run resumed from a
// checkpoint continues exactly where it stopped:
//
//   nn::OptimizerState state = optimizer.state_dict();   // {"state.0.momentum_buffer": ...}
//   ...                                                   // e.g. through a checkpoint file
//   other_optimizer.load_state_dict(state);               // same kind, same parameters
#ifndef TANDEM_NN_OPTIM_H_
#define TANDEM_NN_OPTIM_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "tensor/base/arg.h"
#include "tensor/tensor.h"

namespace tandem::nn {

// An optimizer's per-parameter state by name: "state.<i>.<what>" for parameter i (the index
// in parameters(): the groups' parameters in order), e.g. "state.0.momentum_buffer" (SGD),
// "state.3.exp_avg", "state.3.exp_avg_sq" and "state.3.step" (Adam; the step count is a
// 0-dim int64 tensor). A parameter that has not been stepped yet has no entries. The
// options (learning rate, ...) are not part of it: they come from the code that builds
// the optimizer (and a scheduler's own state, nn/lr_scheduler.h).
using OptimizerState = std::map<std::string, Tensor>;

// What every optimizer's options have: a learning rate, read and written by schedulers.
class OptimizerOptions {
 public:
  virtual ~OptimizerOptions() = default;
  virtual double get_lr() const = 0;
  virtual void set_lr(double lr) = 0;
  virtual std::unique_ptr<OptimizerOptions> clone() const = 0;
};

// Some parameters and, optionally, their own options (of the optimizer's kind, e.g.
// SGDOptions for SGD); without options the group takes the optimizer's defaults.
class ParamGroup {
 public:
  explicit ParamGroup(std::vector<Tensor> params) : params_(std::move(params)) {}
  template <typename Options,
            typename = std::enable_if_t<std::is_base_of_v<OptimizerOptions, Options>>>
  ParamGroup(std::vector<Tensor> params, const Options& options)
      : params_(std::move(params)), options_(std::make_unique<Options>(options)) {}
  ParamGroup(const ParamGroup& other);
  ParamGroup& operator=(const ParamGroup& other);
  ParamGroup(ParamGroup&&) = default;
  ParamGroup& operator=(ParamGroup&&) = default;

  const std::vector<Tensor>& params() const { return params_; }
  bool has_options() const { return options_ != nullptr; }
  // The group's options (throws for a group without options that no optimizer holds).
  OptimizerOptions& options();
  const OptimizerOptions& options() const;
  void set_options(std::unique_ptr<OptimizerOptions> options) { options_ = std::move(options); }
  // The learning rate the group had when its first scheduler was built (PyTorch's
  // "initial_lr"): what every scheduler of the group scales. Unset before that.
  std::optional<double> initial_lr() const { return initial_lr_; }
  void set_initial_lr(double lr) { initial_lr_ = lr; }

 private:
  std::vector<Tensor> params_;
  std::unique_ptr<OptimizerOptions> options_;
  std::optional<double> initial_lr_;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  virtual void step() = 0;
  // Clears the parameters' gradients (set_to_none: drops them, else fills them with 0).
  void zero_grad(bool set_to_none = true);
  // Every parameter, group after group; state entry "state.<i>..." is parameters()[i]'s.
  const std::vector<Tensor>& parameters() const { return parameters_; }

  // The groups, each with its options (filled in from the defaults where a group had none).
  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  // Adds a group, as torch.optim.Optimizer.add_param_group: its options must be of this
  // optimizer's kind (the defaults when it has none), and none of its parameters may be in
  // another group already. Its parameters' indices follow the existing ones.
  void add_param_group(const ParamGroup& group);
  // The options that groups without their own take.
  const OptimizerOptions& defaults() const { return *defaults_; }

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
  Optimizer(std::string name, std::unique_ptr<OptimizerOptions> defaults);
  // For constructors: checks the list (at least one group, or one parameter for a plain
  // list) and adds each group.
  void AddGroups(std::vector<ParamGroup> groups, bool from_parameter_list);
  // Throws when `options` are not valid for this optimizer (wrong kind or value).
  virtual void CheckOptions(const OptimizerOptions& options) const = 0;
  // Makes room for per-parameter state of `n` parameters (keeping what exists).
  virtual void ResizeState(size_t n) = 0;
  // Calls fn(group options, i) for each parameter i of each group, in order.
  template <typename Options, typename Fn>
  void ForEachParameter(Fn&& fn) {
    size_t i = 0;
    for (ParamGroup& group : groups_) {
      const Options& options = static_cast<const Options&>(group.options());
      for (size_t k = 0; k < group.params().size(); ++k, ++i) fn(options, i);
    }
  }

  // For load_state_dict: parameter index and field of "state.<i>.<field>", after checking
  // that the field is one of `fields` and i a parameter; throws otherwise.
  std::pair<size_t, std::string> ParseStateName(const std::string& name,
                                                const std::vector<std::string>& fields) const;
  // Checks that `value` fits parameter i's state (float32, the parameter's shape) and
  // returns a copy of it on the parameter's device.
  Tensor StateTensorFor(size_t i, const std::string& name, const Tensor& value) const;
  // Checks that `value` is a step count (one int64 >= 1) and returns it.
  int64_t StepCountFor(const std::string& name, const Tensor& value) const;

  std::vector<Tensor> parameters_;
  std::vector<ParamGroup> groups_;
  std::unique_ptr<OptimizerOptions> defaults_;
  std::string name_;
};

// ---- SGD -------------------------------------------------------------------------------

struct SGDOptions : OptimizerOptions {
  explicit SGDOptions(double lr) : lr_(lr) {}
  double get_lr() const override { return lr_; }
  void set_lr(double lr) override { lr_ = lr; }
  std::unique_ptr<OptimizerOptions> clone() const override {
    return std::make_unique<SGDOptions>(*this);
  }

  TANDEM_ARG(double, lr);
  TANDEM_ARG(double, momentum) = 0.0;
  TANDEM_ARG(double, dampening) = 0.0;
  TANDEM_ARG(double, weight_decay) = 0.0;
  TANDEM_ARG(bool, nesterov) = false;
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
  SGD(std::vector<ParamGroup> groups, const SGDOptions& defaults);
  void step() override;
  // The first group's options (the only group's, for an optimizer built from a list);
  // mutable, e.g. for a learning-rate schedule.
  SGDOptions& options() { return static_cast<SGDOptions&>(groups_.at(0).options()); }
  // The momentum buffer of parameter i (undefined before its first step with momentum).
  const Tensor& momentum_buffer(size_t i) const { return momentum_buffers_.at(i); }
  OptimizerState state_dict() const override;
  void load_state_dict(const OptimizerState& state) override;

 private:
  void CheckOptions(const OptimizerOptions& options) const override;
  void ResizeState(size_t n) override { momentum_buffers_.resize(n); }

  std::vector<Tensor> momentum_buffers_;
};

// ---- Adam and AdamW --------------------------------------------------------------------

struct AdamOptions : OptimizerOptions {
  // (beta1, beta2); named, since a macro argument cannot hold a bare comma.
  using Betas = std::tuple<double, double>;

  explicit AdamOptions(double lr = 1e-3) : lr_(lr) {}
  // Beside TANDEM_ARG's betas({beta1, beta2}): the two-number form callers already use.
  AdamOptions& betas(double beta1, double beta2) { return betas(std::make_tuple(beta1, beta2)); }
  double get_lr() const override { return lr_; }
  void set_lr(double lr) override { lr_ = lr; }
  std::unique_ptr<OptimizerOptions> clone() const override {
    return std::make_unique<AdamOptions>(*this);
  }

  TANDEM_ARG(double, lr);
  TANDEM_ARG(Betas, betas) = std::make_tuple(0.9, 0.999);
  TANDEM_ARG(double, eps) = 1e-8;
  TANDEM_ARG(double, weight_decay) = 0.0;
};

// AdamW's options: Adam's, with weight decay 1e-2 by default (torch.optim.AdamW).
struct AdamWOptions : OptimizerOptions {
  // (beta1, beta2); named, since a macro argument cannot hold a bare comma.
  using Betas = std::tuple<double, double>;

  explicit AdamWOptions(double lr = 1e-3) : lr_(lr) {}
  // Beside TANDEM_ARG's betas({beta1, beta2}): the two-number form callers already use.
  AdamWOptions& betas(double beta1, double beta2) { return betas(std::make_tuple(beta1, beta2)); }
  double get_lr() const override { return lr_; }
  void set_lr(double lr) override { lr_ = lr; }
  std::unique_ptr<OptimizerOptions> clone() const override {
    return std::make_unique<AdamWOptions>(*this);
  }

  TANDEM_ARG(double, lr);
  TANDEM_ARG(Betas, betas) = std::make_tuple(0.9, 0.999);
  TANDEM_ARG(double, eps) = 1e-8;
  TANDEM_ARG(double, weight_decay) = 1e-2;
};

namespace internal {
// What Adam and AdamW share: the moments, the step counts and the update; `decoupled`
// selects AdamW's weight decay. Use nn::Adam or nn::AdamW.
class AdamBase : public Optimizer {
 public:
  void step() override;
  // Steps taken by parameter i (those with a gradient), and its moment estimates.
  int64_t step_count(size_t i) const { return steps_.at(i); }
  const Tensor& exp_avg(size_t i) const { return exp_avg_.at(i); }
  const Tensor& exp_avg_sq(size_t i) const { return exp_avg_sq_.at(i); }
  OptimizerState state_dict() const override;
  void load_state_dict(const OptimizerState& state) override;

 protected:
  AdamBase(std::string name, std::unique_ptr<OptimizerOptions> defaults, bool decoupled)
      : Optimizer(std::move(name), std::move(defaults)), decoupled_(decoupled) {}

 private:
  void CheckOptions(const OptimizerOptions& options) const override;
  void ResizeState(size_t n) override;

  bool decoupled_;
  std::vector<int64_t> steps_;
  std::vector<Tensor> exp_avg_;
  std::vector<Tensor> exp_avg_sq_;
};
}  // namespace internal

// For each parameter p with gradient g, at its step t = 1, 2, ... (torch.optim.Adam):
//   g = g + weight_decay * p
//   m = beta1 * m + (1 - beta1) * g          v = beta2 * v + (1 - beta2) * g^2
//   p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
class Adam : public internal::AdamBase {
 public:
  Adam(std::vector<Tensor> parameters, const AdamOptions& options = AdamOptions());
  Adam(std::vector<ParamGroup> groups, const AdamOptions& defaults);
  AdamOptions& options() { return static_cast<AdamOptions&>(groups_.at(0).options()); }
};

// Adam with decoupled weight decay (torch.optim.AdamW, Loshchilov & Hutter): first
//   p = p * (1 - lr * weight_decay)
// then Adam's update with the gradient as it is (no L2 term). Weight decay 1e-2 by default.
class AdamW : public internal::AdamBase {
 public:
  AdamW(std::vector<Tensor> parameters, const AdamWOptions& options = AdamWOptions());
  AdamW(std::vector<ParamGroup> groups, const AdamWOptions& defaults);
  AdamWOptions& options() { return static_cast<AdamWOptions&>(groups_.at(0).options()); }
};

// ---- RMSprop ---------------------------------------------------------------------------

struct RMSpropOptions : OptimizerOptions {
  explicit RMSpropOptions(double lr = 1e-2) : lr_(lr) {}
  double get_lr() const override { return lr_; }
  void set_lr(double lr) override { lr_ = lr; }
  std::unique_ptr<OptimizerOptions> clone() const override {
    return std::make_unique<RMSpropOptions>(*this);
  }

  TANDEM_ARG(double, lr);
  TANDEM_ARG(double, alpha) = 0.99;
  TANDEM_ARG(double, eps) = 1e-8;
  TANDEM_ARG(double, weight_decay) = 0.0;
  TANDEM_ARG(double, momentum) = 0.0;
  TANDEM_ARG(bool, centered) = false;
};

// For each parameter p with gradient g (torch.optim.RMSprop):
//   g = g + weight_decay * p
//   v = alpha * v + (1 - alpha) * g^2
//   if centered: a = alpha * a + (1 - alpha) * g;  d = sqrt(v - a^2) + eps
//   else:        d = sqrt(v) + eps
//   if momentum > 0: b = momentum * b + g / d;  p = p - lr * b
//   else:            p = p - lr * g / d
// State: "square_avg" (v), "step", and "momentum_buffer" (b) with momentum, "grad_avg" (a)
// when centered.
class RMSprop : public Optimizer {
 public:
  RMSprop(std::vector<Tensor> parameters, const RMSpropOptions& options = RMSpropOptions());
  RMSprop(std::vector<ParamGroup> groups, const RMSpropOptions& defaults);
  void step() override;
  RMSpropOptions& options() { return static_cast<RMSpropOptions&>(groups_.at(0).options()); }
  int64_t step_count(size_t i) const { return steps_.at(i); }
  const Tensor& square_avg(size_t i) const { return square_avg_.at(i); }
  const Tensor& momentum_buffer(size_t i) const { return momentum_buffers_.at(i); }
  const Tensor& grad_avg(size_t i) const { return grad_avg_.at(i); }
  OptimizerState state_dict() const override;
  void load_state_dict(const OptimizerState& state) override;

 private:
  void CheckOptions(const OptimizerOptions& options) const override;
  void ResizeState(size_t n) override;

  std::vector<int64_t> steps_;
  std::vector<Tensor> square_avg_;
  std::vector<Tensor> momentum_buffers_;
  std::vector<Tensor> grad_avg_;
};

}  // namespace tandem::nn

#endif  // TANDEM_NN_OPTIM_H_
