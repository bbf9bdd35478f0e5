// The optimizers' base (torch.optim.Optimizer): parameter groups with their own options,
// zero_grad, and the state dict. The optimizers are nn/sgd.h, nn/adam.h (Adam, AdamW) and
// nn/rmsprop.h, all behind nn/optim.h; each updates its parameters with the fused steps of
// tensor/ops/fused_optimizers.h (one pass over each parameter, no temporaries).
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
#ifndef TANDEM_NN_OPTIMIZER_H_
#define TANDEM_NN_OPTIMIZER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

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
  // The momentum a scheduler may cycle (OneCycleLR's cycle_momentum): SGD's and RMSprop's
  // momentum, Adam's and AdamW's beta1; nullopt for options without one.
  virtual std::optional<double> get_momentum() const { return std::nullopt; }
  virtual void set_momentum(double momentum) {}
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
  // Virtual so that a wrapper that steps other tensors (the trainer's FSDP optimizer steps
  // flat shards) clears theirs.
  virtual void zero_grad(bool set_to_none = true);
  // For optimizers that keep learning rates in device memory (capturable Adam, for CUDA
  // Graphs): copies each group's options().get_lr() there. LR schedulers call it after setting
  // the rates; a no-op for the rest.
  virtual void SyncLearningRates() {}
  // Every parameter, group after group; state entry "state.<i>..." is parameters()[i]'s.
  const std::vector<Tensor>& parameters() const { return parameters_; }

  // The groups, each with its options (filled in from the defaults where a group had none).
  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  // Adds a group, as torch.optim.Optimizer.add_param_group: its options must be of this
  // optimizer's kind (the defaults when it has none), and none of its parameters may be in
  // another group already. Its parameters' indices follow the existing ones. Virtual so that
  // a wrapper (parallel::distributed::ZeroRedundancyOptimizer) can place the new parameters.
  virtual void add_param_group(const ParamGroup& group);
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

  // For load_state_dict: parameter index and field of "state.<i>.<field>", after checking
  // that the field is one of `fields` and i a parameter; throws otherwise.
  std::pair<size_t, std::string> ParseStateName(const std::string& name,
                                                const std::vector<std::string>& fields) const;
  // Checks that `value` fits parameter i's state (float32, the parameter's shape) and
  // returns a copy of it on the parameter's device.
  Tensor StateTensorFor(size_t i, const std::string& name, const Tensor& value) const;
  // Checks that `value` is a step count (one int64 >= 1) and returns it.
  int64_t StepCountFor(const std::string& name, const Tensor& value) const;
  // A state tensor for `param`: zeros, or `state` made contiguous (a loaded state may not be).
  static void EnsureState(Tensor& state, const Tensor& param);
  // `grad` in `param`'s dtype, as the fused steps take it.
  static Tensor GradFor(const Tensor& param, const Tensor& grad) {
    return grad.dtype() == param.dtype() ? grad : grad.to(param.dtype());
  }

  std::vector<Tensor> parameters_;
  std::vector<ParamGroup> groups_;
  std::unique_ptr<OptimizerOptions> defaults_;
  std::string name_;
};

}  // namespace tandem::nn

#endif  // TANDEM_NN_OPTIMIZER_H_
