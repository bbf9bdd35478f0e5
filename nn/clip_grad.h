// Gradient clipping, as torch.nn.utils: clip_grad_norm_ scales all the gradients together
// so that their total norm is at most max_norm; clip_grad_value_ clamps each gradient element
// to [-clip_value, clip_value]. Call them between backward() and the optimizer's step().
//
//   loss.backward();
//   double norm = nn::clip_grad_norm_(model->parameters(), /*max_norm=*/1.0);
//   optimizer.step();
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
// as PyTorch's default does.
double clip_grad_norm_(const std::vector<Tensor>& parameters, double max_norm,
                       double norm_type = 2.0, bool error_if_nonfinite = false);

// Clamps every gradient element into [-clip_value, clip_value] (clip_value >= 0), in place.
void clip_grad_value_(const std::vector<Tensor>& parameters, double clip_value);

}  // namespace tandem::nn

#endif  // TANDEM_NN_CLIP_GRAD_H_
