#include "tensor/ops/fused_optimizers.h"

#include <string>
#include <utility>

#include "tensor/base/error.h"
#include "tensor/base/grad_mode.h"

namespace tandem {
namespace {

// One call's tensors, checked, as the kernels take them: contiguous (a strided tensor through a
// copy, written back by Finish), grouped by device and dtype.
template <typename KernelTensor>
class Lists {
 public:
  Lists(const char* op, const std::vector<Tensor>& params, const std::vector<Tensor>& grads)
      : op_(op), params_(params) {
    CheckLength("grads", grads.size(), true);
    for (size_t i = 0; i < params.size(); ++i) {
      const Tensor& p = params[i];
      TANDEM_CHECK(p.defined(), op_, ": params[", i, "] is undefined");
      TANDEM_CHECK(IsFloatingPoint(p.dtype()), op_, ": params[", i, "] is ", p.dtype(),
                   " but only floating-point tensors (float32, float64, bfloat16, float16) can "
                   "be optimized");
      TANDEM_CHECK(grads[i].defined(), op_, ": grads[", i,
                   "] is undefined; pass only the "
                   "parameters that have a gradient");
      CheckMatches("grads", grads[i], i);
    }
  }

  // A state list: one tensor per parameter when `used`, else ignored (it may be empty).
  void CheckState(const char* list, const std::vector<Tensor>& states, bool used, const char* why) {
    if (!used) return;
    CheckLength(list, states.size(), false, why);
    for (size_t i = 0; i < states.size(); ++i) {
      TANDEM_CHECK(states[i].defined(), op_, ": ", list, "[", i, "] is undefined but ", why,
                   "; pass a tensor of zeros (or the state so far) for each parameter");
      CheckMatches(list, states[i], i);
    }
  }

  // Where the kernel reads `t` from / writes it to.
  const void* Read(const Tensor& t) {
    if (t.is_contiguous()) return t.data_ptr();
    keep_alive_.push_back(t.contiguous());
    return keep_alive_.back().data_ptr();
  }
  void* Write(const Tensor& t) {
    if (t.is_contiguous()) return t.data_ptr();
    write_back_.emplace_back(t, t.contiguous());
    return write_back_.back().second.data_ptr();
  }

  // Adds parameter i's kernel tensor to its device and dtype's call.
  void Add(size_t i, const KernelTensor& tensor) {
    const Tensor& p = params_[i];
    for (Group& g : groups_) {
      if (g.device == p.device() && g.dtype == p.dtype()) {
        g.tensors.push_back(tensor);
        return;
      }
    }
    groups_.push_back({p.device(), p.dtype(), {tensor}});
  }

  // Runs run(device, dtype, tensors) for each device and dtype, then writes strided tensors back.
  template <typename Run>
  void Finish(Run&& run) {
    for (const Group& g : groups_) run(g.device, g.dtype, g.tensors);
    for (auto& [target, copy] : write_back_) target.copy_(copy);
  }

 private:
  struct Group {
    Device device;
    DType dtype;
    std::vector<KernelTensor> tensors;
  };

  void CheckLength(const char* list, size_t n, bool always, const char* why = "") {
    TANDEM_CHECK(n == params_.size(), op_, ": ", list, " has ", n, " tensors but params has ",
                 params_.size(), always ? "" : " and ", why,
                 "; pass one per parameter, in the same order");
  }

  void CheckMatches(const char* list, const Tensor& t, size_t i) const {
    const Tensor& p = params_[i];
    TANDEM_CHECK(t.dtype() == p.dtype() && t.shape() == p.shape() && t.device() == p.device(), op_,
                 ": ", list, "[", i, "] is ", t.dtype(), " ", ShapeToString(t.shape()), " on ",
                 t.device(), " but params[", i, "] is ", p.dtype(), " ", ShapeToString(p.shape()),
                 " on ", p.device(), "; each ", list,
                 " tensor must have its parameter's dtype, shape and device");
  }

  const char* op_;
  const std::vector<Tensor>& params_;
  std::vector<Group> groups_;
  std::vector<Tensor> keep_alive_;  // contiguous copies of strided inputs
  std::vector<std::pair<Tensor, Tensor>> write_back_;
};

template <typename K>
void* WriteIf(bool used, Lists<K>& lists, const std::vector<Tensor>& states, size_t i) {
  return used ? lists.Write(states[i]) : nullptr;
}

}  // namespace

void fused_sgd_(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                const std::vector<Tensor>& momentum_buffers, const FusedSgdOptions& options) {
  NoGradGuard no_grad;
  const bool momentum = options.momentum != 0.0;
  Lists<FusedSgdTensor> lists("fused_sgd_", params, grads);
  lists.CheckState("momentum_buffers", momentum_buffers, momentum, "momentum is not 0");
  for (size_t i = 0; i < params.size(); ++i) {
    FusedSgdTensor t;
    t.numel = params[i].numel();
    t.param = lists.Write(params[i]);
    t.grad = lists.Read(grads[i]);
    t.momentum_buffer = WriteIf(momentum, lists, momentum_buffers, i);
    lists.Add(i, t);
  }
  lists.Finish([&](Device device, DType dtype, const std::vector<FusedSgdTensor>& tensors) {
    RunFusedSgd(device, dtype, options, tensors);
  });
}

void fused_adam_(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                 const std::vector<Tensor>& exp_avgs, const std::vector<Tensor>& exp_avg_sqs,
                 const std::vector<Tensor>& max_exp_avg_sqs, const std::vector<int64_t>& steps,
                 const FusedAdamOptions& options) {
  NoGradGuard no_grad;
  const char* op = options.decoupled_weight_decay ? "fused_adamw_" : "fused_adam_";
  Lists<FusedAdamTensor> lists(op, params, grads);
  lists.CheckState("exp_avgs", exp_avgs, true, "every step reads them");
  lists.CheckState("exp_avg_sqs", exp_avg_sqs, true, "every step reads them");
  lists.CheckState("max_exp_avg_sqs", max_exp_avg_sqs, options.amsgrad, "amsgrad is on");
  TANDEM_CHECK(steps.size() == params.size(), op, ": steps has ", steps.size(),
               " counts but params has ", params.size(), " tensors; pass each parameter's step ",
               "count (1 on its first step)");
  for (size_t i = 0; i < params.size(); ++i) {
    TANDEM_CHECK(steps[i] >= 1, op, ": steps[", i, "] is ", steps[i],
                 " but a step count is at least 1 (this step included)");
    FusedAdamTensor t;
    t.numel = params[i].numel();
    t.param = lists.Write(params[i]);
    t.grad = lists.Read(grads[i]);
    t.exp_avg = lists.Write(exp_avgs[i]);
    t.exp_avg_sq = lists.Write(exp_avg_sqs[i]);
    t.max_exp_avg_sq = WriteIf(options.amsgrad, lists, max_exp_avg_sqs, i);
    t.step = steps[i];
    lists.Add(i, t);
  }
  lists.Finish([&](Device device, DType dtype, const std::vector<FusedAdamTensor>& tensors) {
    RunFusedAdam(device, dtype, options, tensors);
  });
}

void fused_rmsprop_(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                    const std::vector<Tensor>& square_avgs,
                    const std::vector<Tensor>& momentum_buffers,
                    const std::vector<Tensor>& grad_avgs, const FusedRmspropOptions& options) {
  NoGradGuard no_grad;
  const bool momentum = options.momentum > 0.0;
  Lists<FusedRmspropTensor> lists("fused_rmsprop_", params, grads);
  lists.CheckState("square_avgs", square_avgs, true, "every step reads them");
  lists.CheckState("momentum_buffers", momentum_buffers, momentum, "momentum is > 0");
  lists.CheckState("grad_avgs", grad_avgs, options.centered, "centered is on");
  for (size_t i = 0; i < params.size(); ++i) {
    FusedRmspropTensor t;
    t.numel = params[i].numel();
    t.param = lists.Write(params[i]);
    t.grad = lists.Read(grads[i]);
    t.square_avg = lists.Write(square_avgs[i]);
    t.momentum_buffer = WriteIf(momentum, lists, momentum_buffers, i);
    t.grad_avg = WriteIf(options.centered, lists, grad_avgs, i);
    lists.Add(i, t);
  }
  lists.Finish([&](Device device, DType dtype, const std::vector<FusedRmspropTensor>& tensors) {
    RunFusedRmsprop(device, dtype, options, tensors);
  });
}

}  // namespace tandem
