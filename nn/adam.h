// nn::Adam and nn::AdamW (torch.optim.Adam, torch.optim.AdamW): bias-corrected moments, L2 or
// decoupled weight decay, amsgrad and maximize, over parameter groups (nn/optimizer.h). step()
// updates each parameter that has a gradient in place, in one fused pass
// (tensor/ops/fused_optimizers.h); parameters without one are skipped.
//
//   nn::AdamW optimizer(model->parameters(), nn::AdamWOptions(3e-4).amsgrad(true));
//   optimizer.zero_grad();
//   loss.backward();
//   optimizer.step();
#ifndef TANDEM_NN_ADAM_H_
#define TANDEM_NN_ADAM_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "nn/optimizer.h"
#include "tensor/base/arg.h"
#include "tensor/tensor.h"

namespace tandem::nn {

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
  std::optional<double> get_momentum() const override { return std::get<0>(betas_); }
  void set_momentum(double beta1) override { std::get<0>(betas_) = beta1; }

  TANDEM_ARG(double, lr);
  TANDEM_ARG(Betas, betas) = std::make_tuple(0.9, 0.999);
  TANDEM_ARG(double, eps) = 1e-8;
  TANDEM_ARG(double, weight_decay) = 0.0;
  // AMSGrad (Reddi et al.): the denominator uses the largest second moment seen so far.
  TANDEM_ARG(bool, amsgrad) = false;
  // Ascend the objective: the step follows -g (PyTorch's maximize).
  TANDEM_ARG(bool, maximize) = false;
  // PyTorch's capturable: the step count and learning rate live on the parameters' CUDA device,
  // read and advanced by the step's kernels, so that the step can be captured in a CUDA Graph
  // (tensor/cuda/cuda_graph.h) and each replay takes that step's values. The learning rate is
  // written there by each eager step() and by LR schedulers (Optimizer::SyncLearningRates).
  // Needs every parameter of a group on one CUDA device, in one dtype.
  TANDEM_ARG(bool, capturable) = false;
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
  std::optional<double> get_momentum() const override { return std::get<0>(betas_); }
  void set_momentum(double beta1) override { std::get<0>(betas_) = beta1; }

  TANDEM_ARG(double, lr);
  TANDEM_ARG(Betas, betas) = std::make_tuple(0.9, 0.999);
  TANDEM_ARG(double, eps) = 1e-8;
  TANDEM_ARG(double, weight_decay) = 1e-2;
  TANDEM_ARG(bool, amsgrad) = false;
  TANDEM_ARG(bool, maximize) = false;
  TANDEM_ARG(bool, capturable) = false;  // as AdamOptions::capturable
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
  // With amsgrad: the largest exp_avg_sq so far (undefined before its first amsgrad step).
  const Tensor& max_exp_avg_sq(size_t i) const { return max_exp_avg_sq_.at(i); }
  OptimizerState state_dict() const override;
  void load_state_dict(const OptimizerState& state) override;
  // Capturable groups: writes each group's learning rate into its device state (a kernel; not
  // during a capture, where the graph must read it instead).
  void SyncLearningRates() override;

 protected:
  AdamBase(std::string name, std::unique_ptr<OptimizerOptions> defaults, bool decoupled)
      : Optimizer(std::move(name), std::move(defaults)), decoupled_(decoupled) {}

 private:
  void CheckOptions(const OptimizerOptions& options) const override;
  void ResizeState(size_t n) override;

  // Capturable: group g's {lr, step, scratch} on its device (Note [Capturable Adam]), made by
  // its first step.
  Tensor& CapturableState(size_t g, const std::vector<Tensor>& params, int64_t step);
  // Parameter i's step count: the device's for a capturable group.
  int64_t StepOf(size_t i) const;

  bool decoupled_;
  std::vector<Tensor> capturable_state_;
  std::vector<int64_t> steps_;
  std::vector<Tensor> exp_avg_;
  std::vector<Tensor> exp_avg_sq_;
  std::vector<Tensor> max_exp_avg_sq_;
};
}  // namespace internal

// For each parameter p with gradient g, at its step t = 1, 2, ... (torch.optim.Adam):
//   g = -g if maximize
//   g = g + weight_decay * p
//   m = beta1 * m + (1 - beta1) * g          v = beta2 * v + (1 - beta2) * g^2
//   if amsgrad: v_max = max(v_max, v), used for v below
//   p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// State: "exp_avg" (m), "exp_avg_sq" (v), "step", and "max_exp_avg_sq" with amsgrad.
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

}  // namespace tandem::nn

#endif  // TANDEM_NN_ADAM_H_
