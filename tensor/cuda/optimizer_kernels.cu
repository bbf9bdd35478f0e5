// The fused optimizer updates: LaunchFusedOptimizerUpdate (kernels.h).
//
// Each tensor gets its own grid-stride launch of the instantiation of the shared element
// function (tensor/kernels/internal/optimizer_math.h) that its flags pick on the host, so the
// device loop has no flag branches. A launch per tensor rather than one over a device-side
// table keeps each kernel to one specialisation, and the launches are queued without waiting.
//
// This file is its own cuda_library, compiled with --fmad=false: the element functions are
// written as separate multiplies and adds, which the CPU backend (the oracle) rounds one by
// one, and nvcc would otherwise fuse them into FMAs and give different bits. Division and
// sqrt are IEEE-rounded under nvcc's defaults, so with contraction off the GPU's result is
// the CPU's, bit for bit. The update is bound by memory bandwidth, so the FMAs cost nothing.
//
// bfloat16 and float16 tensors run the same element functions in float (OpMath): each thread
// loads its element of the param, grad and states into float locals, updates them with float
// hyper-parameters, and stores each rounded once; that is the float32 update of the widened
// values, rounded, which is what the CPU backend computes for them.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "tensor/base/dtype.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/kernels.h"
#include "tensor/kernels/internal/optimizer_math.h"
#include "tensor/runtime/backend.h"

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
__global__ void SgdKernel(TypedUpdate<OpMath<T>> u, T* __restrict__ p, const T* __restrict__ g,
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

template <bool kL2, typename T>
__global__ void AdamKernel(TypedUpdate<OpMath<T>> u, T* __restrict__ p, const T* __restrict__ g,
                           T* __restrict__ m, T* __restrict__ v, int64_t n) {
  for (int64_t j = GlobalThread(); j < n; j += GridThreads()) {
    if constexpr (kIsReducedFloat<T>) {
      float pj = Load(p, j), gj = Load(g, j), mj = Load(m, j), vj = Load(v, j);
      AdamElement<kL2>(u, &pj, &gj, &mj, &vj, 0);
      p[j] = T(pj);
      m[j] = T(mj);
      v[j] = T(vj);
    } else {
      AdamElement<kL2>(u, p, g, m, v, j);
    }
  }
}

template <bool kMomentum, bool kCentered, typename T>
__global__ void RmspropKernel(TypedUpdate<OpMath<T>> u, T* __restrict__ p, const T* __restrict__ g,
                              T* __restrict__ v, T* __restrict__ b, T* __restrict__ a, int64_t n) {
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

// Hyper-parameters in OpMath<T>: float for the 16-bit types.
template <typename T>
using UpdateLauncher = void (*)(const LaunchContext&, const TypedUpdate<OpMath<T>>&,
                                const FusedUpdate&);

template <bool kDecay, bool kMomentum, bool kNesterov, bool kFirst, typename T>
void LaunchSgd(const LaunchContext& context, const TypedUpdate<OpMath<T>>& u,
               const FusedUpdate& t) {
  SgdKernel<kDecay, kMomentum, kNesterov, kFirst, T>
      <<<GridFor(context, t.numel), kThreads, 0, context.stream>>>(
          u, static_cast<T*>(t.param), static_cast<const T*>(t.grad), static_cast<T*>(t.state0),
          t.numel);
}

template <bool kL2, typename T>
void LaunchAdam(const LaunchContext& context, const TypedUpdate<OpMath<T>>& u,
                const FusedUpdate& t) {
  AdamKernel<kL2, T><<<GridFor(context, t.numel), kThreads, 0, context.stream>>>(
      u, static_cast<T*>(t.param), static_cast<const T*>(t.grad), static_cast<T*>(t.state0),
      static_cast<T*>(t.state1), t.numel);
}

template <bool kMomentum, bool kCentered, typename T>
void LaunchRmsprop(const LaunchContext& context, const TypedUpdate<OpMath<T>>& u,
                   const FusedUpdate& t) {
  RmspropKernel<kMomentum, kCentered, T>
      <<<GridFor(context, t.numel), kThreads, 0, context.stream>>>(
          u, static_cast<T*>(t.param), static_cast<const T*>(t.grad), static_cast<T*>(t.state0),
          static_cast<T*>(t.state1), static_cast<T*>(t.state2), t.numel);
}

// The instantiation for one tensor, with the CPU backend's choice of flags (cpu_backend.cc):
// SGD's momentum is its buffer's presence, and Nesterov and the first step only mean
// something with it (so the six combinations without it that the CPU compiles are never
// needed here); RMSprop's momentum and centering are their buffers' presence.
template <typename T>
UpdateLauncher<T> PickLauncher(const FusedUpdate& t) {
  switch (t.kind) {
    case OptimizerKind::kSgd: {
      const bool decay = t.weight_decay != 0.0;
      if (t.state0 == nullptr) {
        return decay ? LaunchSgd<true, false, false, false, T>
                     : LaunchSgd<false, false, false, false, T>;
      }
      static constexpr UpdateLauncher<T> kWithMomentum[8] = {
          LaunchSgd<false, true, false, false, T>, LaunchSgd<false, true, false, true, T>,
          LaunchSgd<false, true, true, false, T>,  LaunchSgd<false, true, true, true, T>,
          LaunchSgd<true, true, false, false, T>,  LaunchSgd<true, true, false, true, T>,
          LaunchSgd<true, true, true, false, T>,   LaunchSgd<true, true, true, true, T>,
      };
      return kWithMomentum[decay * 4 + t.nesterov * 2 + t.first];
    }
    case OptimizerKind::kAdam:
      return t.l2 ? LaunchAdam<true, T> : LaunchAdam<false, T>;
    case OptimizerKind::kRmsprop: {
      static constexpr UpdateLauncher<T> kRmsprop[4] = {
          LaunchRmsprop<false, false, T>, LaunchRmsprop<false, true, T>,
          LaunchRmsprop<true, false, T>, LaunchRmsprop<true, true, T>};
      return kRmsprop[(t.state1 != nullptr) * 2 + (t.state2 != nullptr)];
    }
  }
  return nullptr;  // CudaBackend rejects other kinds before launching
}

}  // namespace

void LaunchFusedOptimizerUpdate(const LaunchContext& context, DType dtype,
                                const std::vector<FusedUpdate>& updates) {
  DispatchAllFloatingTypes(dtype, "CUDA FusedOptimizerUpdate", [&](auto tag) {
    using T = typename decltype(tag)::type;
    for (const FusedUpdate& t : updates) {
      if (t.numel == 0) continue;
      PickLauncher<T>(t)(context, TypedUpdate<OpMath<T>>(t), t);
      TANDEM_CUDA_CHECK_LAUNCH(context.device);
    }
  });
}

}  // namespace cuda
}  // namespace tandem
