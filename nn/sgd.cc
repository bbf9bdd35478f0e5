#include "nn/sgd.h"

#include <string>
#include <utility>

#include "tensor/ops/fused_optimizers.h"
#include "tensor/runtime/profiler.h"

namespace tandem::nn {

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
  size_t i = 0;
  for (ParamGroup& group : groups_) {
    const auto& o = static_cast<const SGDOptions&>(group.options());
    const bool momentum = o.momentum() != 0.0;
    // [1]: parameters whose momentum buffer starts this step (fused_sgd_'s first_step).
    std::vector<Tensor> params[2], grads[2], buffers[2];
    for (size_t k = 0; k < group.params().size(); ++k, ++i) {
      const Tensor& p = parameters_[i];
      const Tensor grad = p.grad();
      if (!grad.defined()) continue;
      Tensor& buffer = momentum_buffers_[i];
      const bool first = momentum && !buffer.defined();
      if (first) {
        buffer = empty(p.shape(), TensorOptions().dtype(p.dtype()).device(p.device()));
      } else if (momentum) {
        EnsureState(buffer, p);
      }
      params[first].push_back(p);
      grads[first].push_back(GradFor(p, grad));
      if (momentum) buffers[first].push_back(buffer);
    }
    for (int first = 0; first < 2; ++first) {
      if (params[first].empty()) continue;
      FusedSgdOptions fused;
      fused.lr = o.lr();
      fused.momentum = o.momentum();
      fused.dampening = o.dampening();
      fused.weight_decay = o.weight_decay();
      fused.nesterov = o.nesterov();
      fused.maximize = o.maximize();
      fused.first_step = first == 1;
      fused_sgd_(params[first], grads[first], buffers[first], fused);
    }
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

}  // namespace tandem::nn
