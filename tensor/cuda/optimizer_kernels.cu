// The fused optimizer launchers (optimizer_kernels.h).
//
// Each tensor gets its own grid-stride launch of the instantiation of the shared element
// function (tensor/kernels/internal/optimizer_math.h) that the call's flags pick on the host, so
// the device loop has no flag branches. A launch per tensor rather than one over a device-side
// table keeps each kernel to one specialisation, and the launches are queued without waiting.
//
// This file is its own cuda_library, compiled with --fmad=false: the element functions are
// written as separate multiplies and adds, which the CPU kernels (the oracle) round one by
// one, and nvcc would otherwise fuse them into FMAs and give different bits. Division and
// sqrt are IEEE-rounded under nvcc's defaults, so with contraction off the GPU's result is
// the CPU's, bit for bit. The update is bound by memory bandwidth, so the FMAs cost nothing.
//
// bfloat16 and float16 tensors run the same element functions in float (OpMath): each thread
// loads its element of the param, grad and states into float locals, updates them with float
// hyper-parameters, and stores each rounded once; that is the float32 update of the widened
// values, rounded, which is what the CPU computes for them.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "tensor/base/dtype.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/optimizer_kernels.h"
#include "tensor/kernels/internal/optimizer_math.h"

namespace tandem {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kThreadsPerSm = 2048;

// As in kernels.cu: enough blocks to cover `items`, at most two waves of full SMs.
int GridFor(const LaunchContext& context, int64_t items) {
  const int64_t needed = (items + kThreads - 1) / kThreads;
  const int64_t cap = static_cast<int64_t>(context.num_sms) * (kThreadsPerSm / kThreads) * 2;
  return static_cast<int>(std::max<int64_t>(1, std::min(needed, cap)));
}

__device__ __forceinline__ int64_t GlobalThread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t GridThreads() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

// A 16-bit element widened into a float local (zero for a state the update does not read:
// SGD's buffer on its first step), and stored back rounded.
template <typename T>
__device__ __forceinline__ float Load(const T* x, int64_t j, bool read = true) {
  return read ? static_cast<float>(x[j]) : 0.0f;
}

template <bool kDecay, bool kMomentum, bool kNesterov, bool kFirst, typename T>
__global__ void SgdKernel(SgdScalars<OpMath<T>> u, T* __restrict__ p, const T* __restrict__ g,
                          T* __restrict__ b, int64_t n) {
  for (int64_t j = GlobalThread(); j < n; j += GridThreads()) {
    if constexpr (kIsReducedFloat<T>) {
      float pj = Load(p, j), gj = Load(g, j), bj = kMomentum ? Load(b, j, !kFirst) : 0.0f;
      SgdElement<kDecay, kMomentum, kNesterov, kFirst>(u, &pj, &gj, &bj, 0);
      p[j] = T(pj);
      if (kMomentum) b[j] = T(bj);
    } else {
      SgdElement<kDecay, kMomentum, kNesterov, kFirst>(u, p, g, b, j);
    }
  }
}

template <bool kL2, bool kAmsgrad, typename T>
__global__ void AdamKernel(AdamScalars<OpMath<T>> u, T* __restrict__ p, const T* __restrict__ g,
                           T* __restrict__ m, T* __restrict__ v, T* __restrict__ vmax, int64_t n) {
  for (int64_t j = GlobalThread(); j < n; j += GridThreads()) {
    if constexpr (kIsReducedFloat<T>) {
      float pj = Load(p, j), gj = Load(g, j), mj = Load(m, j), vj = Load(v, j);
      float vmaxj = kAmsgrad ? Load(vmax, j) : 0.0f;
      AdamElement<kL2, kAmsgrad>(u, &pj, &gj, &mj, &vj, &vmaxj, 0);
      p[j] = T(pj);
      m[j] = T(mj);
      v[j] = T(vj);
      if (kAmsgrad) vmax[j] = T(vmaxj);
    } else {
      AdamElement<kL2, kAmsgrad>(u, p, g, m, v, vmax, j);
    }
  }
}

template <bool kMomentum, bool kCentered, typename T>
__global__ void RmspropKernel(RmspropScalars<OpMath<T>> u, T* __restrict__ p,
                              const T* __restrict__ g, T* __restrict__ v, T* __restrict__ b,
                              T* __restrict__ a, int64_t n) {
  for (int64_t j = GlobalThread(); j < n; j += GridThreads()) {
    if constexpr (kIsReducedFloat<T>) {
      float pj = Load(p, j), gj = Load(g, j), vj = Load(v, j);
      float bj = kMomentum ? Load(b, j) : 0.0f, aj = kCentered ? Load(a, j) : 0.0f;
      RmspropElement<kMomentum, kCentered>(u, &pj, &gj, &vj, &bj, &aj, 0);
      p[j] = T(pj);
      v[j] = T(vj);
      if (kMomentum) b[j] = T(bj);
      if (kCentered) a[j] = T(aj);
    } else {
      RmspropElement<kMomentum, kCentered>(u, p, g, v, b, a, j);
    }
  }
}

template <bool kDecay, bool kMomentum, bool kNesterov, bool kFirst, typename T>
void LaunchSgd(const LaunchContext& context, const SgdScalars<OpMath<T>>& u,
               const FusedSgdTensor& t) {
  SgdKernel<kDecay, kMomentum, kNesterov, kFirst, T>
      <<<GridFor(context, t.numel), kThreads, 0, context.stream>>>(
          u, static_cast<T*>(t.param), static_cast<const T*>(t.grad),
          static_cast<T*>(t.momentum_buffer), t.numel);
}

template <bool kL2, bool kAmsgrad, typename T>
void LaunchAdam(const LaunchContext& context, const AdamScalars<OpMath<T>>& u,
                const FusedAdamTensor& t) {
  AdamKernel<kL2, kAmsgrad, T><<<GridFor(context, t.numel), kThreads, 0, context.stream>>>(
      u, static_cast<T*>(t.param), static_cast<const T*>(t.grad), static_cast<T*>(t.exp_avg),
      static_cast<T*>(t.exp_avg_sq), static_cast<T*>(t.max_exp_avg_sq), t.numel);
}

template <bool kMomentum, bool kCentered, typename T>
void LaunchRmsprop(const LaunchContext& context, const RmspropScalars<OpMath<T>>& u,
                   const FusedRmspropTensor& t) {
  RmspropKernel<kMomentum, kCentered, T>
      <<<GridFor(context, t.numel), kThreads, 0, context.stream>>>(
          u, static_cast<T*>(t.param), static_cast<const T*>(t.grad), static_cast<T*>(t.square_avg),
          static_cast<T*>(t.momentum_buffer), static_cast<T*>(t.grad_avg), t.numel);
}

template <typename T>
using SgdLauncher = void (*)(const LaunchContext&, const SgdScalars<OpMath<T>>&,
                             const FusedSgdTensor&);

// The CPU's choice of flags (tensor/cpu/optimizer_kernels.cc): Nesterov and the first step
// only mean something with momentum (so the six combinations without it that the CPU compiles
// are never needed here).
template <typename T>
SgdLauncher<T> PickSgd(const FusedSgdOptions& o) {
  const bool decay = o.weight_decay != 0.0;
  if (o.momentum == 0.0) {
    return decay ? LaunchSgd<true, false, false, false, T>
                 : LaunchSgd<false, false, false, false, T>;
  }
  static constexpr SgdLauncher<T> kWithMomentum[8] = {
      LaunchSgd<false, true, false, false, T>, LaunchSgd<false, true, false, true, T>,
      LaunchSgd<false, true, true, false, T>,  LaunchSgd<false, true, true, true, T>,
      LaunchSgd<true, true, false, false, T>,  LaunchSgd<true, true, false, true, T>,
      LaunchSgd<true, true, true, false, T>,   LaunchSgd<true, true, true, true, T>,
  };
  return kWithMomentum[decay * 4 + o.nesterov * 2 + o.first_step];
}

}  // namespace

void LaunchFusedSgd(const LaunchContext& context, DType dtype, const FusedSgdOptions& options,
                    const std::vector<FusedSgdTensor>& tensors) {
  DispatchAllFloatingTypes(dtype, "CUDA FusedSgdKernel", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const SgdScalars<OpMath<T>> u(options);
    const SgdLauncher<T> launch = PickSgd<T>(options);
    for (const FusedSgdTensor& t : tensors) {
      if (t.numel == 0) continue;
      launch(context, u, t);
      TANDEM_CUDA_CHECK_LAUNCH(context.device);
    }
  });
}

void LaunchFusedAdam(const LaunchContext& context, DType dtype, const FusedAdamOptions& options,
                     const std::vector<FusedAdamTensor>& tensors) {
  DispatchAllFloatingTypes(dtype, "CUDA FusedAdamKernel", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Launcher =
        void (*)(const LaunchContext&, const AdamScalars<OpMath<T>>&, const FusedAdamTensor&);
    static constexpr Launcher kLaunchers[4] = {
        LaunchAdam<false, false, T>, LaunchAdam<false, true, T>, LaunchAdam<true, false, T>,
        LaunchAdam<true, true, T>};
    const Launcher launch = kLaunchers[!options.decoupled_weight_decay * 2 + options.amsgrad];
    for (const FusedAdamTensor& t : tensors) {
      if (t.numel == 0) continue;
      launch(context, AdamScalars<OpMath<T>>(options, t.step), t);
      TANDEM_CUDA_CHECK_LAUNCH(context.device);
    }
  });
}

void LaunchFusedRmsprop(const LaunchContext& context, DType dtype,
                        const FusedRmspropOptions& options,
                        const std::vector<FusedRmspropTensor>& tensors) {
  DispatchAllFloatingTypes(dtype, "CUDA FusedRmspropKernel", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Launcher =
        void (*)(const LaunchContext&, const RmspropScalars<OpMath<T>>&, const FusedRmspropTensor&);
    static constexpr Launcher kLaunchers[4] = {
        LaunchRmsprop<false, false, T>, LaunchRmsprop<false, true, T>,
        LaunchRmsprop<true, false, T>, LaunchRmsprop<true, true, T>};
    const Launcher launch = kLaunchers[(options.momentum > 0.0) * 2 + options.centered];
    const RmspropScalars<OpMath<T>> u(options);
    for (const FusedRmspropTensor& t : tensors) {
      if (t.numel == 0) continue;
      launch(context, u, t);
      TANDEM_CUDA_CHECK_LAUNCH(context.device);
    }
  });
}

}  // namespace cuda
}  // namespace tandem
