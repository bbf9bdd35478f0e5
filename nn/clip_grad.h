// Gradient clipping, as torch.nn.utils: clip_grad_norm_ scales all the gradients together
// so that their total norm is at most max_norm; clip_grad_value_ clamps each gradient element
// to [-clip_value, clip_value]. Call them between backward() and the optimizer's step().
//
//   loss.backward();
//   double norm = nn::clip_grad_norm_(model->parameters(), /*max_norm=*/1.0);
//   optimizer.step();
//
// On a GPU, clip_grad_norm_'s double is one host read; a training step that must not wait for
// the GPU (CUDA Graphs, an overlapped input pipeline) uses the Tensor-valued pair, as PyTorch's
// torch.nn.utils.get_total_norm and clip_grads_with_norm_, which stay on the device:
//
//   const Tensor norm = nn::get_total_norm(grads);           // 0-dim float64, on grads' device
//   nn::clip_grads_with_norm_(model->parameters(), 1.0, norm);
#ifndef TANDEM_NN_CLIP_GRAD_H_
#define TANDEM_NN_CLIP_GRAD_H_

#include <limits>
#include <vector>

#include "tensor/tensor.h"

namespace tandem::nn {

// The norm of order `norm_type` (> 0, or infinity for the largest magnitude) of all the
// parameters' gradients together (parameters without a gradient are skipped), as if they
// were one vector; returns it, the norm before clipping (0 when no parameter has a
// gradient). When it exceeds max_norm, every gradient is multiplied by
// max_norm / (norm + 1e-6), as PyTorch does. A NaN or infinite norm throws with
// error_if_nonfinite; otherwise the gradients are scaled by it anyway (and become NaN),
// as PyTorch's default does. CPU gradients are computed on the host as before; gradients on
// another device go through get_total_norm and clip_grads_with_norm_, and the returned double
// is their single host read.
double clip_grad_norm_(const std::vector<Tensor>& parameters, double max_norm,
                       double norm_type = 2.0, bool error_if_nonfinite = false);

// The norm of order `norm_type` of `tensors` together (undefined tensors skipped), as a 0-dim
// float64 tensor on the first tensor's device (on the CPU when there is none), computed there
// without reading anything back to the host: one reduction per tensor, their results combined
// on the device. error_if_nonfinite needs to read the norm, so it costs one host
// synchronization (on a GPU); leave it false in a step that must not wait.
Tensor get_total_norm(const std::vector<Tensor>& tensors, double norm_type = 2.0,
                      bool error_if_nonfinite = false);

// Multiplies every parameter's gradient by min(1, max_norm / (total_norm + 1e-6)), computed on
// the device from `total_norm` (a 0-dim tensor, get_total_norm's): no host read. A NaN norm
// makes the gradients NaN, as PyTorch's default does.
void clip_grads_with_norm_(const std::vector<Tensor>& parameters, double max_norm,
                           const Tensor& total_norm);

// Clamps every gradient element into [-clip_value, clip_value] (clip_value >= 0), in place.
void clip_grad_value_(const std::vector<Tensor>& parameters, double clip_value);

}  // namespace tandem::nn

#endif  // TANDEM_NN_CLIP_GRAD_H_
