// nn::SGD (torch.optim.SGD): momentum, dampening, Nesterov, weight decay and maximize, over
// parameter groups (nn/optimizer.h). step() updates each parameter that has a gradient in
// place, in one fused pass (tensor/ops/fused_optimizers.h); parameters without one are skipped.
//
//   nn::SGD optimizer(model->parameters(), nn::SGDOptions(0.1).momentum(0.9));
//   for (...) {
//     optimizer.zero_grad();
//     criterion.forward(model->forward(x), y).backward();
//     optimizer.step();
//   }
#ifndef TANDEM_NN_SGD_H_
#define TANDEM_NN_SGD_H_

#include <memory>
#include <optional>
#include <vector>

#include "nn/optimizer.h"
#include "tensor/base/arg.h"
#include "tensor/tensor.h"

namespace tandem::nn {

struct SGDOptions : OptimizerOptions {
  explicit SGDOptions(double lr) : lr_(lr) {}
  double get_lr() const override { return lr_; }
  void set_lr(double lr) override { lr_ = lr; }
  std::unique_ptr<OptimizerOptions> clone() const override {
    return std::make_unique<SGDOptions>(*this);
  }
  std::optional<double> get_momentum() const override { return momentum_; }
  void set_momentum(double momentum) override { momentum_ = momentum; }

  TANDEM_ARG(double, lr);
  TANDEM_ARG(double, momentum) = 0.0;
  TANDEM_ARG(double, dampening) = 0.0;
  TANDEM_ARG(double, weight_decay) = 0.0;
  TANDEM_ARG(bool, nesterov) = false;
  // Ascend the objective: the step follows -g (PyTorch's maximize).
  TANDEM_ARG(bool, maximize) = false;
};

// For each parameter p with gradient g (PyTorch's torch.optim.SGD):
//   g = -g if maximize
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

}  // namespace tandem::nn

#endif  // TANDEM_NN_SGD_H_
