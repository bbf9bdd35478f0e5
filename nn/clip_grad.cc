#include "nn/clip_grad.h"

#include <algorithm>
#include <cmath>

#include "tensor/base/grad_mode.h"
#include "tensor/ops/ops.h"

namespace tandem::nn {

double clip_grad_norm_(const std::vector<Tensor>& parameters, double max_norm, double norm_type,
                       bool error_if_nonfinite) {
  const bool infinity = std::isinf(norm_type) && norm_type > 0;
  TANDEM_CHECK(infinity || (std::isfinite(norm_type) && norm_type > 0.0),
               "clip_grad_norm_: norm_type must be > 0 or infinity but is ", norm_type,
               "; use 2 for the Euclidean norm");
  TANDEM_CHECK(!std::isnan(max_norm), "clip_grad_norm_: max_norm is NaN");
  NoGradGuard no_grad;
  std::vector<Tensor> grads;
  for (const Tensor& p : parameters) {
    if (p.defined() && p.grad().defined()) grads.push_back(p.grad());
  }
  if (grads.empty()) return 0.0;
  // Each gradient's norm (in its dtype, on its device), then the norm of those norms.
  double total = 0.0;
  for (const Tensor& g : grads) {
    if (g.numel() == 0) continue;
    if (infinity) {
      const double largest = amax(abs(g).reshape({-1}), 0).item();
      total = std::isnan(largest) ? largest : std::max(total, largest);
      if (std::isnan(total)) break;
      continue;
    }
    double norm;
    if (norm_type == 2.0) {
      norm = std::sqrt(sum(square(g)).item());
    } else if (norm_type == 1.0) {
      norm = sum(abs(g)).item();
    } else {
      norm = std::pow(sum(pow(abs(g), norm_type)).item(), 1.0 / norm_type);
    }
    total += std::pow(norm, norm_type);
  }
  if (!infinity) total = std::pow(total, 1.0 / norm_type);
  TANDEM_CHECK(!error_if_nonfinite || std::isfinite(total), "clip_grad_norm_: the total norm of ",
               "order ", norm_type, " of the gradients is ", total,
               ", so they cannot be clipped; find where the loss or a gradient became NaN or "
               "infinite, or pass error_if_nonfinite=false to scale them by it anyway");
  const double coef = std::min(max_norm / (total + 1e-6), 1.0);
  if (coef < 1.0 || std::isnan(coef)) {
    for (Tensor& g : grads) g.mul_(coef);
  }
  return total;
}

void clip_grad_value_(const std::vector<Tensor>& parameters, double clip_value) {
  TANDEM_CHECK(clip_value >= 0.0, "clip_grad_value_: clip_value must be >= 0 but is ", clip_value);
  NoGradGuard no_grad;
  for (const Tensor& p : parameters) {
    if (!p.defined() || !p.grad().defined()) continue;
    Tensor g = p.grad();
    g.copy_(clamp(g, -clip_value, clip_value));
  }
}

}  // namespace tandem::nn
