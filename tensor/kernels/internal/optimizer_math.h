// The per-element arithmetic of the fused optimizer updates (Backend::FusedOptimizerUpdate):
// SGD (momentum, dampening, Nesterov, weight decay), Adam/AdamW and RMSprop (momentum,
// centered), as PyTorch's update rules. Shared by the CPU and CUDA backends so that both
// compute exactly the same function in the same order (the CPU is the oracle for the GPU).
// The flags are template parameters so that the CPU loops around an element vectorise.
//
//   tandem::SgdElement<true, true, false, false>(update, p, g, buffer, j);   // element j
#ifndef TANDEM_TENSOR_KERNELS_INTERNAL_OPTIMIZER_MATH_H_
#define TANDEM_TENSOR_KERNELS_INTERNAL_OPTIMIZER_MATH_H_

#include <cstdint>

#include "tensor/base/philox.h"  // TANDEM_HOST_DEVICE
#include "tensor/kernels/internal/elementwise_math.h"
#include "tensor/runtime/backend.h"

namespace tandem {

// One tensor's hyper-parameters in its element type.
template <typename T>
struct TypedUpdate {
  T lr, momentum, keep /* 1 - dampening */, weight_decay, beta1, beta2, eps, step_size,
      inv_bc2_sqrt, decay_factor, alpha;
  explicit TypedUpdate(const FusedUpdate& u)
      : lr(static_cast<T>(u.lr)),
        momentum(static_cast<T>(u.momentum)),
        keep(T(1) - static_cast<T>(u.dampening)),
        weight_decay(static_cast<T>(u.weight_decay)),
        beta1(static_cast<T>(u.beta1)),
        beta2(static_cast<T>(u.beta2)),
        eps(static_cast<T>(u.eps)),
        step_size(static_cast<T>(u.step_size)),
        inv_bc2_sqrt(static_cast<T>(u.inv_bc2_sqrt)),
        decay_factor(static_cast<T>(u.decay_factor)),
        alpha(static_cast<T>(u.alpha)) {}
};

// SGD: d = g + weight_decay p; with momentum b = first ? d : momentum b + (1 - dampening) d,
// d = nesterov ? d + momentum b : b; then p -= lr d.
template <bool kDecay, bool kMomentum, bool kNesterov, bool kFirst, typename T>
TANDEM_HOST_DEVICE void SgdElement(const TypedUpdate<T>& u, T* __restrict p, const T* __restrict g,
                                   T* __restrict b, int64_t j) {
  T d = g[j];
  if (kDecay) d += u.weight_decay * p[j];
  if (kMomentum) {
    const T bj = kFirst ? d : u.momentum * b[j] + u.keep * d;
    b[j] = bj;
    d = kNesterov ? d + u.momentum * bj : bj;
  }
  p[j] -= u.lr * d;
}

// Adam (kL2: weight decay added to the gradient) and AdamW (p scaled by decay_factor first):
// m = beta1 m + (1 - beta1) d, v = beta2 v + (1 - beta2) d^2,
// p -= step_size m / (sqrt(v) / sqrt(bias_correction2) + eps).
template <bool kL2, typename T>
TANDEM_HOST_DEVICE void AdamElement(const TypedUpdate<T>& u, T* __restrict p, const T* __restrict g,
                                    T* __restrict m, T* __restrict v, int64_t j) {
  const T pj = p[j] * u.decay_factor;
  const T d = kL2 ? g[j] + u.weight_decay * pj : g[j];
  const T mj = u.beta1 * m[j] + (T(1) - u.beta1) * d;
  const T vj = u.beta2 * v[j] + (T(1) - u.beta2) * (d * d);
  m[j] = mj;
  v[j] = vj;
  p[j] = pj - u.step_size * (mj / (math::Sqrt(vj) * u.inv_bc2_sqrt + u.eps));
}

// RMSprop: d = g + weight_decay p, v = alpha v + (1 - alpha) d^2; centered: a = alpha a +
// (1 - alpha) d and the denominator is sqrt(v - a^2) + eps, else sqrt(v) + eps; with momentum
// b = momentum b + d / denominator, p -= lr b; else p -= lr d / denominator.
template <bool kMomentum, bool kCentered, typename T>
TANDEM_HOST_DEVICE void RmspropElement(const TypedUpdate<T>& u, T* __restrict p,
                                       const T* __restrict g, T* __restrict v, T* __restrict b,
                                       T* __restrict a, int64_t j) {
  const T d = g[j] + u.weight_decay * p[j];
  const T vj = u.alpha * v[j] + (T(1) - u.alpha) * (d * d);
  v[j] = vj;
  T denom;
  if (kCentered) {
    const T aj = u.alpha * a[j] + (T(1) - u.alpha) * d;
    a[j] = aj;
    denom = math::Sqrt(vj - aj * aj) + u.eps;
  } else {
    denom = math::Sqrt(vj) + u.eps;
  }
  if (kMomentum) {
    const T bj = u.momentum * b[j] + d / denom;
    b[j] = bj;
    p[j] -= u.lr * bj;
  } else {
    p[j] -= u.lr * (d / denom);
  }
}

}  // namespace tandem

#endif  // TANDEM_TENSOR_KERNELS_INTERNAL_OPTIMIZER_MATH_H_
