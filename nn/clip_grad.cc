#include "nn/clip_grad.h"

#include <algorithm>
#include <cmath>

#include "tensor/base/grad_mode.h"
#include "tensor/ops/ops.h"

namespace tandem::nn {

namespace {

bool IsInfinity(double norm_type) { return std::isinf(norm_type) && norm_type > 0; }

void CheckNormType(double norm_type, const char* op) {
  TANDEM_CHECK(IsInfinity(norm_type) || (std::isfinite(norm_type) && norm_type > 0.0), op,
               ": norm_type must be > 0 or infinity but is ", norm_type,
               "; use 2 for the Euclidean norm");
}

void CheckFinite(double total, double norm_type, const char* op) {
  TANDEM_CHECK(std::isfinite(total), op, ": the total norm of order ", norm_type,
               " of the gradients is ", total,
               ", so they cannot be clipped; find where the loss or a gradient became NaN or "
               "infinite, or pass error_if_nonfinite=false to scale them by it anyway");
}

std::vector<Tensor> Gradients(const std::vector<Tensor>& parameters) {
  std::vector<Tensor> grads;
  for (const Tensor& p : parameters) {
    if (p.defined() && p.grad().defined()) grads.push_back(p.grad());
  }
  return grads;
}

// The device's clip coefficient min(1, max_norm / (norm + 1e-6)), NaN for a NaN norm (as the
// host's std::min(NaN, 1.0) gives).
Tensor ClipCoefficient(const Tensor& total_norm, double max_norm) {
  const Tensor limit = full({}, max_norm, TensorOptions(kFloat64).device(total_norm.device()));
  return clamp(div(limit, add(total_norm.to(kFloat64), 1e-6)), std::nullopt, 1.0);
}

}  // namespace

Tensor get_total_norm(const std::vector<Tensor>& tensors, double norm_type,
                      bool error_if_nonfinite) {
  CheckNormType(norm_type, "get_total_norm");
  NoGradGuard no_grad;
  const bool infinity = IsInfinity(norm_type);
  std::vector<Tensor> parts;  // float64, 0-dim, on the first tensor's device
  Device device = Device::Cpu();
  bool found = false;
  for (const Tensor& t : tensors) {
    if (!t.defined()) continue;
    if (!found) device = t.device();
    found = true;
    if (t.numel() == 0) continue;
    // Each tensor's norm in its dtype, then widened, as the host path reads it.
    Tensor part;
    if (infinity) {
      part = amax(abs(t).reshape({-1}), 0).to(kFloat64);
    } else if (norm_type == 2.0) {
      part = sum(square(t)).to(kFloat64);  // its square: the root comes once, at the end
    } else if (norm_type == 1.0) {
      part = sum(abs(t)).to(kFloat64);
    } else {
      part = pow(pow(sum(pow(abs(t), norm_type)).to(kFloat64), 1.0 / norm_type), norm_type);
    }
    parts.push_back(part.to(device));
  }
  Tensor total;
  if (parts.empty()) {
    total = zeros({}, TensorOptions(kFloat64).device(device));
  } else if (infinity) {
    total = amax(stack(parts), 0);
  } else {
    const Tensor summed = sum(stack(parts));
    total = norm_type == 2.0 ? sqrt(summed) : pow(summed, 1.0 / norm_type);
  }
  if (error_if_nonfinite) CheckFinite(total.item(), norm_type, "get_total_norm");
  return total;
}

void clip_grads_with_norm_(const std::vector<Tensor>& parameters, double max_norm,
                           const Tensor& total_norm) {
  TANDEM_CHECK(!std::isnan(max_norm), "clip_grads_with_norm_: max_norm is NaN");
  TANDEM_CHECK(total_norm.defined() && total_norm.numel() == 1,
               "clip_grads_with_norm_: total_norm must be a one-element tensor (get_total_norm's)",
               " but is ", total_norm.defined() ? ShapeToString(total_norm.shape()) : "undefined");
  NoGradGuard no_grad;
  const Tensor coef = ClipCoefficient(total_norm.reshape({}), max_norm);
  // The coefficient once per device and dtype: float64 for float64 gradients, float32 (their
  // arithmetic type) for the others; 16-bit gradients are multiplied in float32 and rounded once.
  std::vector<Tensor> coefs;
  for (const Tensor& p : parameters) {
    if (!p.defined() || !p.grad().defined()) continue;
    Tensor g = p.grad();
    const DType dtype = g.dtype() == kFloat64 ? kFloat64 : kFloat32;
    auto it = std::find_if(coefs.begin(), coefs.end(), [&](const Tensor& c) {
      return c.device() == g.device() && c.dtype() == dtype;
    });
    if (it == coefs.end()) it = coefs.insert(coefs.end(), coef.to(g.device()).to(dtype));
    const Tensor& c = *it;
    if (g.dtype() == dtype) {
      g.mul_(c);
    } else {
      g.copy_(mul(g.to(dtype), c));
    }
  }
}

double clip_grad_norm_(const std::vector<Tensor>& parameters, double max_norm, double norm_type,
                       bool error_if_nonfinite) {
  CheckNormType(norm_type, "clip_grad_norm_");
  const bool infinity = IsInfinity(norm_type);
  TANDEM_CHECK(!std::isnan(max_norm), "clip_grad_norm_: max_norm is NaN");
  NoGradGuard no_grad;
  std::vector<Tensor> grads = Gradients(parameters);
  if (grads.empty()) return 0.0;
  if (!grads.front().device().is_cpu()) {
    // On the device: the norm and the scaling without a host read, then the one read of the
    // norm for the caller.
    const Tensor total = get_total_norm(grads, norm_type, error_if_nonfinite);
    clip_grads_with_norm_(parameters, max_norm, total);
    return total.item();
  }
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
  if (error_if_nonfinite) CheckFinite(total, norm_type, "clip_grad_norm_");
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
