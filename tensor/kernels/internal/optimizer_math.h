// The per-element arithmetic of the fused optimizer kernels (tensor/kernels/optimizer_kernels.h):
// SGD (momentum, dampening, Nesterov, weight decay), Adam/AdamW (amsgrad) and RMSprop
// (momentum, centered), all with maximize, as PyTorch's update rules. Shared by the CPU and
// CUDA kernels so that both compute exactly the same function in the same order (the CPU is
// the oracle for the GPU). The flags are template parameters so that the CPU loops around an
// element vectorise. Tensors hold element type T (float, double, BFloat16, Half); the
// arithmetic is in M = OpMath<T> (float for the 16-bit types), with the hyper-parameters in M,
// and every stored value (parameter and state) is rounded once.
//
//   tandem::SgdScalars<float> u(options);                  // for float or 16-bit tensors
//   tandem::SgdElement<true, true, false, false>(u, p, g, buffer, j);   // element j
//
// maximize is a multiplier of the gradient, 1 or -1: both exact, so a step without it gives the
// same bits as a rule without the multiply.
#ifndef TANDEM_TENSOR_KERNELS_INTERNAL_OPTIMIZER_MATH_H_
#define TANDEM_TENSOR_KERNELS_INTERNAL_OPTIMIZER_MATH_H_

#include <cmath>
#include <cstdint>

#include "tensor/base/philox.h"  // TANDEM_HOST_DEVICE
#include "tensor/kernels/internal/elementwise_math.h"
#include "tensor/kernels/optimizer_kernels.h"

namespace tandem {

// One call's SGD hyper-parameters in the type the update computes in (OpMath of its elements).
template <typename T>
struct SgdScalars {
  T lr, momentum, keep /* 1 - dampening */, weight_decay, grad_sign;
  explicit SgdScalars(const FusedSgdOptions& o)
      : lr(static_cast<T>(o.lr)),
        momentum(static_cast<T>(o.momentum)),
        keep(T(1) - static_cast<T>(o.dampening)),
        weight_decay(static_cast<T>(o.weight_decay)),
        grad_sign(o.maximize ? T(-1) : T(1)) {}
};

// One tensor's Adam hyper-parameters: the bias corrections depend on its step, computed on the
// host in double as torch.optim.Adam does, then rounded to T once.
template <typename T>
struct AdamScalars {
  T beta1, beta2, eps, weight_decay, step_size /* lr / bias_correction1 */,
      inv_bc2_sqrt /* 1 / sqrt(bias_correction2) */,
      decay_factor /* AdamW: 1 - lr * weight_decay; 1 for Adam */, grad_sign;
  AdamScalars(const FusedAdamOptions& o, int64_t step)
      : beta1(static_cast<T>(o.beta1)),
        beta2(static_cast<T>(o.beta2)),
        eps(static_cast<T>(o.eps)),
        weight_decay(static_cast<T>(o.weight_decay)),
        step_size(static_cast<T>(o.lr / (1.0 - std::pow(o.beta1, static_cast<double>(step))))),
        inv_bc2_sqrt(
            static_cast<T>(1.0 / std::sqrt(1.0 - std::pow(o.beta2, static_cast<double>(step))))),
        decay_factor(static_cast<T>(o.decoupled_weight_decay ? 1.0 - o.lr * o.weight_decay : 1.0)),
        grad_sign(o.maximize ? T(-1) : T(1)) {}
};

template <typename T>
struct RmspropScalars {
  T lr, alpha, eps, weight_decay, momentum, grad_sign;
  explicit RmspropScalars(const FusedRmspropOptions& o)
      : lr(static_cast<T>(o.lr)),
        alpha(static_cast<T>(o.alpha)),
        eps(static_cast<T>(o.eps)),
        weight_decay(static_cast<T>(o.weight_decay)),
        momentum(static_cast<T>(o.momentum)),
        grad_sign(o.maximize ? T(-1) : T(1)) {}
};

// SGD: d = ±g + weight_decay p; with momentum b = first ? d : momentum b + (1 - dampening) d,
// d = nesterov ? d + momentum b : b; then p -= lr d.
template <bool kDecay, bool kMomentum, bool kNesterov, bool kFirst, typename M, typename T>
TANDEM_HOST_DEVICE void SgdElement(const SgdScalars<M>& u, T* __restrict p, const T* __restrict g,
                                   T* __restrict b, int64_t j) {
  M d = u.grad_sign * static_cast<M>(g[j]);
  if (kDecay) d += u.weight_decay * static_cast<M>(p[j]);
  if (kMomentum) {
    const M bj = kFirst ? d : u.momentum * static_cast<M>(b[j]) + u.keep * d;
    b[j] = static_cast<T>(bj);
    d = kNesterov ? d + u.momentum * bj : bj;
  }
  p[j] = static_cast<T>(static_cast<M>(p[j]) - u.lr * d);
}

// Adam (kL2: weight decay added to the gradient) and AdamW (p scaled by decay_factor first):
// d = ±g, m = beta1 m + (1 - beta1) d, v = beta2 v + (1 - beta2) d^2; with amsgrad
// vmax = max(vmax, v) takes v's place in the denominator;
// p -= step_size m / (sqrt(v) / sqrt(bias_correction2) + eps).
template <bool kL2, bool kAmsgrad, typename M, typename T>
TANDEM_HOST_DEVICE void AdamElement(const AdamScalars<M>& u, T* __restrict p, const T* __restrict g,
                                    T* __restrict m, T* __restrict v, T* __restrict vmax,
                                    int64_t j) {
  const M pj = static_cast<M>(p[j]) * u.decay_factor;
  const M gj = u.grad_sign * static_cast<M>(g[j]);
  const M d = kL2 ? gj + u.weight_decay * pj : gj;
  const M mj = u.beta1 * static_cast<M>(m[j]) + (M(1) - u.beta1) * d;
  M vj = u.beta2 * static_cast<M>(v[j]) + (M(1) - u.beta2) * (d * d);
  m[j] = static_cast<T>(mj);
  v[j] = static_cast<T>(vj);
  if (kAmsgrad) {
    // torch.maximum (NaN wins), of v before rounding, so that 16-bit tensors stay the float
    // update of their widened values, rounded.
    const M previous = static_cast<M>(vmax[j]);
    vj = previous > vj || previous != previous ? previous : vj;
    vmax[j] = static_cast<T>(vj);
  }
  p[j] = static_cast<T>(pj - u.step_size * (mj / (math::Sqrt(vj) * u.inv_bc2_sqrt + u.eps)));
}

// RMSprop: d = ±g + weight_decay p, v = alpha v + (1 - alpha) d^2; centered: a = alpha a +
// (1 - alpha) d and the denominator is sqrt(v - a^2) + eps, else sqrt(v) + eps; with momentum
// b = momentum b + d / denominator, p -= lr b; else p -= lr d / denominator.
template <bool kMomentum, bool kCentered, typename M, typename T>
TANDEM_HOST_DEVICE void RmspropElement(const RmspropScalars<M>& u, T* __restrict p,
                                       const T* __restrict g, T* __restrict v, T* __restrict b,
                                       T* __restrict a, int64_t j) {
  const M pj = static_cast<M>(p[j]);
  const M d = u.grad_sign * static_cast<M>(g[j]) + u.weight_decay * pj;
  const M vj = u.alpha * static_cast<M>(v[j]) + (M(1) - u.alpha) * (d * d);
  v[j] = static_cast<T>(vj);
  M denom;
  if (kCentered) {
    const M aj = u.alpha * static_cast<M>(a[j]) + (M(1) - u.alpha) * d;
    a[j] = static_cast<T>(aj);
    denom = math::Sqrt(vj - aj * aj) + u.eps;
  } else {
    denom = math::Sqrt(vj) + u.eps;
  }
  if (kMomentum) {
    const M bj = u.momentum * static_cast<M>(b[j]) + d / denom;
    b[j] = static_cast<T>(bj);
    p[j] = static_cast<T>(pj - u.lr * bj);
  } else {
    p[j] = static_cast<T>(pj - u.lr * (d / denom));
  }
}

}  // namespace tandem

#endif  // TANDEM_TENSOR_KERNELS_INTERNAL_OPTIMIZER_MATH_H_
