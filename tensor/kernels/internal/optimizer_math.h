// The per-element arithmetic of the fused optimizer updates (Backend::FusedOptimizerUpdate):
// SGD (momentum, dampening, Nesterov, weight decay), Adam/AdamW and RMSprop (momentum,
// centered), as PyTorch's update rules. Shared by the CPU and CUDA backends so that both
// compute exactly the same function in the same order (the CPU is the oracle for the GPU).
// The flags are template parameters so that the CPU loops around an element vectorise.
// Tensors hold element type T (float, double, BFloat16, Half); the arithmetic is in
// M = OpMath<T> (float for the 16-bit types), with the hyper-parameters in M, and every stored
// value (parameter and state) is rounded once.
//
//   tandem::TypedUpdate<float> update(fused_update);        // for float or 16-bit tensors
//   tandem::SgdElement<true, true, false, false>(update, p, g, buffer, j);   // element j
#ifndef TANDEM_TENSOR_KERNELS_INTERNAL_OPTIMIZER_MATH_H_
#define TANDEM_TENSOR_KERNELS_INTERNAL_OPTIMIZER_MATH_H_

#include <cstdint>

#include "tensor/base/philox.h"  // TANDEM_HOST_DEVICE
#include "tensor/kernels/internal/elementwise_math.h"
#include "tensor/runtime/backend.h"

namespace tandem {

// One tensor's hyper-parameters in the type the update computes in (OpMath of its elements).
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
template <bool kDecay, bool kMomentum, bool kNesterov, bool kFirst, typename M, typename T>
TANDEM_HOST_DEVICE void SgdElement(const TypedUpdate<M>& u, T* __restrict p, const T* __restrict g,
                                   T* __restrict b, int64_t j) {
  M d = static_cast<M>(g[j]);
  if (kDecay) d += u.weight_decay * static_cast<M>(p[j]);
  if (kMomentum) {
    const M bj = kFirst ? d : u.momentum * static_cast<M>(b[j]) + u.keep * d;
    b[j] = static_cast<T>(bj);
    d = kNesterov ? d + u.momentum * bj : bj;
  }
  p[j] = static_cast<T>(static_cast<M>(p[j]) - u.lr * d);
}

// Adam (kL2: weight decay added to the gradient) and AdamW (p scaled by decay_factor first):
// m = beta1 m + (1 - beta1) d, v = beta2 v + (1 - beta2) d^2,
// p -= step_size m / (sqrt(v) / sqrt(bias_correction2) + eps).
template <bool kL2, typename M, typename T>
TANDEM_HOST_DEVICE void AdamElement(const TypedUpdate<M>& u, T* __restrict p, const T* __restrict g,
                                    T* __restrict m, T* __restrict v, int64_t j) {
  const M pj = static_cast<M>(p[j]) * u.decay_factor;
  const M gj = static_cast<M>(g[j]);
  const M d = kL2 ? gj + u.weight_decay * pj : gj;
  const M mj = u.beta1 * static_cast<M>(m[j]) + (M(1) - u.beta1) * d;
  const M vj = u.beta2 * static_cast<M>(v[j]) + (M(1) - u.beta2) * (d * d);
  m[j] = static_cast<T>(mj);
  v[j] = static_cast<T>(vj);
  p[j] = static_cast<T>(pj - u.step_size * (mj / (math::Sqrt(vj) * u.inv_bc2_sqrt + u.eps)));
}

// RMSprop: d = g + weight_decay p, v = alpha v + (1 - alpha) d^2; centered: a = alpha a +
// (1 - alpha) d and the denominator is sqrt(v - a^2) + eps, else sqrt(v) + eps; with momentum
// b = momentum b + d / denominator, p -= lr b; else p -= lr d / denominator.
template <bool kMomentum, bool kCentered, typename M, typename T>
TANDEM_HOST_DEVICE void RmspropElement(const TypedUpdate<M>& u, T* __restrict p,
                                       const T* __restrict g, T* __restrict v, T* __restrict b,
                                       T* __restrict a, int64_t j) {
  const M pj = static_cast<M>(p[j]);
  const M d = static_cast<M>(g[j]) + u.weight_decay * pj;
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
