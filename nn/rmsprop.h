// nn::RMSprop (torch.optim.RMSprop): smoothing, momentum, centered, weight decay and maximize,
// over parameter groups (nn/optimizer.h). step() updates each parameter that has a gradient in
// place, in one fused pass (tensor/ops/fused_optimizers.h); parameters without one are skipped.
//
//   nn::RMSprop optimizer(model->parameters(), nn::RMSpropOptions(1e-3).momentum(0.9));
//   optimizer.zero_grad();
//   loss.backward();
//   optimizer.step();
#ifndef TANDEM_NN_RMSPROP_H_
#define TANDEM_NN_RMSPROP_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "nn/optimizer.h"
#include "tensor/base/arg.h"
#include "tensor/tensor.h"

namespace tandem::nn {

struct RMSpropOptions : OptimizerOptions {
  explicit RMSpropOptions(double lr = 1e-2) : lr_(lr) {}
  double get_lr() const override { return lr_; }
  void set_lr(double lr) override { lr_ = lr; }
  std::unique_ptr<OptimizerOptions> clone() const override {
    return std::make_unique<RMSpropOptions>(*this);
  }
  std::optional<double> get_momentum() const override { return momentum_; }
  void set_momentum(double momentum) override { momentum_ = momentum; }

  TANDEM_ARG(double, lr);
  TANDEM_ARG(double, alpha) = 0.99;
  TANDEM_ARG(double, eps) = 1e-8;
  TANDEM_ARG(double, weight_decay) = 0.0;
  TANDEM_ARG(double, momentum) = 0.0;
  TANDEM_ARG(bool, centered) = false;
  // Ascend the objective: the step follows -g (PyTorch's maximize).
  TANDEM_ARG(bool, maximize) = false;
};

// For each parameter p with gradient g (torch.optim.RMSprop):
//   g = -g if maximize
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

#endif  // TANDEM_NN_RMSPROP_H_
