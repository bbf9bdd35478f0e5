// Fused optimizer steps on lists of tensors, as PyTorch's torch._fused_sgd_, _fused_adam_
// (also AdamW's) and a fused RMSprop: each updates every parameter and its state in place in
// one pass (tensor/kernels/optimizer_kernels.h), on whatever devices and floating dtypes the
// parameters have (one kernel call per device and dtype). nn/'s optimizers are built on them;
// use them directly for an update rule of your own bookkeeping.
//
//   FusedSgdOptions o;
//   o.lr = 0.1;
//   o.momentum = 0.9;
//   o.first_step = !initialised;      // the buffers start as this step's gradients
//   fused_sgd_(params, grads, momentum_buffers, o);
//
// For parameter i, grads[i] and every state list's [i] must have params[i]'s dtype, shape and
// device (a state list that the options do not use may be empty); the checks throw
// tandem::Error naming the list and index before anything is updated. Tensors may be strided
// views: those are updated through contiguous copies, written back after. No autograd is
// recorded (call under NoGradGuard or on tensors that do not require grad, as optimizers do).
#ifndef TANDEM_TENSOR_OPS_FUSED_OPTIMIZERS_H_
#define TANDEM_TENSOR_OPS_FUSED_OPTIMIZERS_H_

#include <cstdint>
#include <vector>

#include "tensor/core/tensor.h"
#include "tensor/kernels/optimizer_kernels.h"  // FusedSgdOptions, FusedAdamOptions, ...

namespace tandem {

// torch.optim.SGD's step: d = ±g + weight_decay p; with momentum b = first_step ? d :
// momentum b + (1 - dampening) d, d = nesterov ? d + momentum b : b; p -= lr d.
// `momentum_buffers` is used (one per parameter) when options.momentum != 0.
void fused_sgd_(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                const std::vector<Tensor>& momentum_buffers, const FusedSgdOptions& options);

// torch.optim.Adam's (AdamW's, with options.decoupled_weight_decay) step. steps[i] is
// parameter i's step count including this step (1 on its first), as PyTorch's state_steps
// after their increment. `max_exp_avg_sqs` is used (one per parameter) with options.amsgrad.
void fused_adam_(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                 const std::vector<Tensor>& exp_avgs, const std::vector<Tensor>& exp_avg_sqs,
                 const std::vector<Tensor>& max_exp_avg_sqs, const std::vector<int64_t>& steps,
                 const FusedAdamOptions& options);

// torch.optim.RMSprop's step. `momentum_buffers` is used with options.momentum > 0,
// `grad_avgs` with options.centered.
void fused_rmsprop_(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                    const std::vector<Tensor>& square_avgs,
                    const std::vector<Tensor>& momentum_buffers,
                    const std::vector<Tensor>& grad_avgs, const FusedRmspropOptions& options);

}  // namespace tandem

#endif  // TANDEM_TENSOR_OPS_FUSED_OPTIMIZERS_H_
