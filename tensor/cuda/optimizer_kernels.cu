// The fused optimizer launchers (optimizer_kernels.h).
//
// All tensors of a call go into as few launches as their lists need (multi_tensor_apply.h: 59
// tensors a launch for Adam in float32, 93 for SGD), each an instantiation of the shared
// element function (tensor/kernels/internal/optimizer_math.h) that the call's flags pick on the
// host, so the device loop has no flag branches. The element math is the per-tensor path's: a
// tensor's elements see the same scalars and functions whichever launch and block they land in.
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
#include "tensor/cuda/launch_work.h"
#include "tensor/cuda/multi_tensor_apply.h"
#include "tensor/cuda/optimizer_kernels.h"
#include "tensor/kernels/internal/optimizer_math.h"
#include "tools/cuda/device_counters.h"

namespace tandem {
namespace cuda {
namespace {

// The lists of one launch: SGD's param, grad and momentum buffer; Adam's param, grad, exp_avg,
// exp_avg_sq and max_exp_avg_sq with each tensor's step-dependent scalars; RMSprop's param, grad,
// square_avg, momentum buffer and grad_avg. A list a call's flags do not use holds nulls.
template <typename M>
struct AdamStepScalars {
  M step_size, inv_bc2_sqrt;  // AdamScalars' two members that depend on the tensor's step
};
using SgdList = TensorChunkList<3, NoChunkExtra>;
template <typename T>
using AdamList = TensorChunkList<5, AdamStepScalars<OpMath<T>>>;
using RmspropList = TensorChunkList<5, NoChunkExtra>;

// A 16-bit element widened into a float local (zero for a state the update does not read:
// SGD's buffer on its first step), and stored back rounded.
template <typename T>
__device__ __forceinline__ float Load(const T* x, int64_t j, bool read = true) {
  return read ? static_cast<float>(x[j]) : 0.0f;
}

template <typename T>
__device__ __forceinline__ T* At(const void* list_ptr) {
  return static_cast<T*>(const_cast<void*>(list_ptr));
}

template <bool kDecay, bool kMomentum, bool kNesterov, bool kFirst, typename T>
__global__ void SgdKernel(SgdScalars<OpMath<T>> u, SgdList list, int64_t chunks) {
  ForEachChunk(list, chunks, [&](int s, int64_t begin, int64_t end) {
    T* __restrict__ p = At<T>(list.ptr[0][s]);
    const T* __restrict__ g = At<T>(list.ptr[1][s]);
    T* __restrict__ b = At<T>(list.ptr[2][s]);
    for (int64_t j = begin + threadIdx.x; j < end; j += blockDim.x) {
      if constexpr (kIsReducedFloat<T>) {
        float pj = Load(p, j), gj = Load(g, j), bj = kMomentum ? Load(b, j, !kFirst) : 0.0f;
        SgdElement<kDecay, kMomentum, kNesterov, kFirst>(u, &pj, &gj, &bj, 0);
        p[j] = T(pj);
        if (kMomentum) b[j] = T(bj);
      } else {
        SgdElement<kDecay, kMomentum, kNesterov, kFirst>(u, p, g, b, j);
      }
    }
  });
}

// Note [Capturable Adam]: with FusedAdamOptions::capturable_state the step count and the learning
// rate live in device memory, {lr, step, step_size, inv_bc2_sqrt, decay_factor} as float64, so
// that a CUDA Graph replays each step with that step's values (PyTorch's capturable=True). One
// thread advances the step and computes the step-dependent scalars with AdamScalars' double
// formulas; the update kernels then read them in place of the per-tensor ones. Under cudasim
// the formulas run on the host's libm, so a capturable step equals the host-computed one bit
// for bit; on a GPU, CUDA's double pow may differ from glibc's in the last bit of a double,
// which the rounding to float almost always hides (owed: a check on a GPU).
__global__ void AdamAdvanceKernel(double* state, double beta1, double beta2, double weight_decay,
                                  bool decoupled) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  const double lr = state[0];
  const double step = state[1] + 1.0;
  state[1] = step;
  state[2] = lr / (1.0 - pow(beta1, step));
  state[3] = 1.0 / sqrt(1.0 - pow(beta2, step));
  state[4] = decoupled ? 1.0 - lr * weight_decay : 1.0;
}

template <bool kL2, bool kAmsgrad, bool kCapturable, typename T>
__global__ void AdamKernel(AdamScalars<OpMath<T>> common, AdamList<T> list, int64_t chunks,
                           const double* capturable_state) {
  using M = OpMath<T>;
  if constexpr (kCapturable) {
    common.step_size = static_cast<M>(capturable_state[2]);
    common.inv_bc2_sqrt = static_cast<M>(capturable_state[3]);
    common.decay_factor = static_cast<M>(capturable_state[4]);
  }
  ForEachChunk(list, chunks, [&](int s, int64_t begin, int64_t end) {
    AdamScalars<OpMath<T>> u = common;
    if constexpr (!kCapturable) {
      u.step_size = list.extra[s].step_size;
      u.inv_bc2_sqrt = list.extra[s].inv_bc2_sqrt;
    }
    T* __restrict__ p = At<T>(list.ptr[0][s]);
    const T* __restrict__ g = At<T>(list.ptr[1][s]);
    T* __restrict__ m = At<T>(list.ptr[2][s]);
    T* __restrict__ v = At<T>(list.ptr[3][s]);
    T* __restrict__ vmax = At<T>(list.ptr[4][s]);
    for (int64_t j = begin + threadIdx.x; j < end; j += blockDim.x) {
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
  });
}

template <bool kMomentum, bool kCentered, typename T>
__global__ void RmspropKernel(RmspropScalars<OpMath<T>> u, RmspropList list, int64_t chunks) {
  ForEachChunk(list, chunks, [&](int s, int64_t begin, int64_t end) {
    T* __restrict__ p = At<T>(list.ptr[0][s]);
    const T* __restrict__ g = At<T>(list.ptr[1][s]);
    T* __restrict__ v = At<T>(list.ptr[2][s]);
    T* __restrict__ b = At<T>(list.ptr[3][s]);
    T* __restrict__ a = At<T>(list.ptr[4][s]);
    for (int64_t j = begin + threadIdx.x; j < end; j += blockDim.x) {
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
  });
}

template <bool kDecay, bool kMomentum, bool kNesterov, bool kFirst, typename T>
void LaunchSgd(const LaunchContext& context, const SgdScalars<OpMath<T>>& u, const SgdList& list,
               int64_t chunks) {
  SgdKernel<kDecay, kMomentum, kNesterov, kFirst, T>
      <<<ChunkGrid(context, chunks), kChunkThreads, 0, context.stream>>>(u, list, chunks);
}

template <bool kL2, bool kAmsgrad, bool kCapturable, typename T>
void LaunchAdam(const LaunchContext& context, const AdamScalars<OpMath<T>>& u,
                const AdamList<T>& list, int64_t chunks, const double* capturable_state) {
  AdamKernel<kL2, kAmsgrad, kCapturable, T>
      <<<ChunkGrid(context, chunks), kChunkThreads, 0, context.stream>>>(u, list, chunks,
                                                                         capturable_state);
}

template <bool kMomentum, bool kCentered, typename T>
void LaunchRmsprop(const LaunchContext& context, const RmspropScalars<OpMath<T>>& u,
                   const RmspropList& list, int64_t chunks) {
  RmspropKernel<kMomentum, kCentered, T>
      <<<ChunkGrid(context, chunks), kChunkThreads, 0, context.stream>>>(u, list, chunks);
}

template <typename T>
using SgdLauncher = void (*)(const LaunchContext&, const SgdScalars<OpMath<T>>&, const SgdList&,
                             int64_t);

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

// The lists' slots, from the tensors of each optimizer.
void FillSgd(SgdList& list, int s, const FusedSgdTensor& t) {
  list.ptr[0][s] = t.param;
  list.ptr[1][s] = const_cast<void*>(t.grad);
  list.ptr[2][s] = t.momentum_buffer;
}

template <typename T>
void FillAdam(const FusedAdamOptions& options, AdamList<T>& list, int s, const FusedAdamTensor& t) {
  list.ptr[0][s] = t.param;
  list.ptr[1][s] = const_cast<void*>(t.grad);
  list.ptr[2][s] = t.exp_avg;
  list.ptr[3][s] = t.exp_avg_sq;
  list.ptr[4][s] = t.max_exp_avg_sq;
  const AdamScalars<OpMath<T>> u(options, t.step);  // the host's double math, as the CPU's
  list.extra[s] = {u.step_size, u.inv_bc2_sqrt};
}

void FillRmsprop(RmspropList& list, int s, const FusedRmspropTensor& t) {
  list.ptr[0][s] = t.param;
  list.ptr[1][s] = const_cast<void*>(t.grad);
  list.ptr[2][s] = t.square_avg;
  list.ptr[3][s] = t.momentum_buffer;
  list.ptr[4][s] = t.grad_avg;
}

// Declares a multi-tensor update's work for the roofline (tools/cuda/device_counters.h): each
// element's `tensors` state tensors (the parameter, its gradient and the update's buffers) read
// and `written` of them written once, and about `flops` FLOPs an element in OpMath<T>. An
// optimizer step moves its state once: it is memory-bound on any GPU.
template <typename T, typename List>
void DeclareUpdateWork(const char* kernel, const LaunchContext& context, const List& list,
                       int64_t chunks, int read, int written, double flops) {
  const double elements = static_cast<double>(ListElements(list));
  internal::RecordLaunchWork(kernel, ChunkGrid(context, chunks), static_cast<long long>(elements));
  DeclareKernelWork(flops * elements, elements * (read + written) * sizeof(T),
                    RooflineMath(sizeof(OpMath<T>)));
}

// A launch callback that only counts (PackChunkLists returns the count).
struct NoLaunch {
  template <typename List>
  void operator()(const List&, int64_t) const {}
};

}  // namespace

void LaunchFusedSgd(const LaunchContext& context, DType dtype, const FusedSgdOptions& options,
                    const std::vector<FusedSgdTensor>& tensors) {
  DispatchAllFloatingTypes(dtype, "CUDA FusedSgdKernel", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const SgdScalars<OpMath<T>> u(options);
    const SgdLauncher<T> launch = PickSgd<T>(options);
    // p and g read, p written; with momentum its buffer read (but on the first step) and written.
    const bool buffer = options.momentum != 0.0;
    const int read = 2 + (buffer && !options.first_step), written = 1 + buffer;
    PackChunkLists<SgdList>(tensors, FillSgd, [&](const SgdList& list, int64_t chunks) {
      launch(context, u, list, chunks);
      TANDEM_CUDA_CHECK_LAUNCH(context.device);
      DeclareUpdateWork<T>("SgdKernel", context, list, chunks, read, written, 4);
    });
  });
}

void LaunchFusedAdam(const LaunchContext& context, DType dtype, const FusedAdamOptions& options,
                     const std::vector<FusedAdamTensor>& tensors) {
  DispatchAllFloatingTypes(dtype, "CUDA FusedAdamKernel", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Launcher = void (*)(const LaunchContext&, const AdamScalars<OpMath<T>>&,
                              const AdamList<T>&, int64_t, const double*);
    static constexpr Launcher kLaunchers[8] = {
        LaunchAdam<false, false, false, T>, LaunchAdam<false, true, false, T>,
        LaunchAdam<true, false, false, T>,  LaunchAdam<true, true, false, T>,
        LaunchAdam<false, false, true, T>,  LaunchAdam<false, true, true, T>,
        LaunchAdam<true, false, true, T>,   LaunchAdam<true, true, true, T>};
    const bool capturable = options.capturable_state != nullptr;
    const Launcher launch =
        kLaunchers[capturable * 4 + !options.decoupled_weight_decay * 2 + options.amsgrad];
    if (capturable) {
      AdamAdvanceKernel<<<1, 32, 0, context.stream>>>(options.capturable_state, options.beta1,
                                                      options.beta2, options.weight_decay,
                                                      options.decoupled_weight_decay);
      TANDEM_CUDA_CHECK_LAUNCH(context.device);
      // The step and the rate's few doubles, read and written.
      DeclareKernelWork(16, 8 * sizeof(double), "fp64");
    }
    // The step-independent scalars; each tensor's list slot carries its bias corrections.
    const AdamScalars<OpMath<T>> common(options, 1);
    PackChunkLists<AdamList<T>>(
        tensors,
        [&](AdamList<T>& list, int s, const FusedAdamTensor& t) {
          FillAdam<T>(options, list, s, t);
        },
        [&](const AdamList<T>& list, int64_t chunks) {
          launch(context, common, list, chunks, options.capturable_state);
          TANDEM_CUDA_CHECK_LAUNCH(context.device);
          // p, g, exp_avg, exp_avg_sq (and max_exp_avg_sq) read; all but g written; the two
          // moments, the square root, the division and the decay: about 15 FLOPs an element.
          DeclareUpdateWork<T>("AdamKernel", context, list, chunks, 4 + options.amsgrad,
                               3 + options.amsgrad, 15);
        });
  });
}

void LaunchFusedRmsprop(const LaunchContext& context, DType dtype,
                        const FusedRmspropOptions& options,
                        const std::vector<FusedRmspropTensor>& tensors) {
  DispatchAllFloatingTypes(dtype, "CUDA FusedRmspropKernel", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Launcher = void (*)(const LaunchContext&, const RmspropScalars<OpMath<T>>&,
                              const RmspropList&, int64_t);
    static constexpr Launcher kLaunchers[4] = {
        LaunchRmsprop<false, false, T>, LaunchRmsprop<false, true, T>,
        LaunchRmsprop<true, false, T>, LaunchRmsprop<true, true, T>};
    const Launcher launch = kLaunchers[(options.momentum > 0.0) * 2 + options.centered];
    const RmspropScalars<OpMath<T>> u(options);
    // p, g and square_avg, with momentum its buffer, centered the gradients' average: read and
    // (but g) written.
    const int buffers = 1 + (options.momentum > 0.0) + options.centered;
    PackChunkLists<RmspropList>(tensors, FillRmsprop, [&](const RmspropList& list, int64_t chunks) {
      launch(context, u, list, chunks);
      TANDEM_CUDA_CHECK_LAUNCH(context.device);
      DeclareUpdateWork<T>("RmspropKernel", context, list, chunks, 2 + buffers, 1 + buffers, 10);
    });
  });
}

int64_t CountFusedSgdLaunches(const std::vector<FusedSgdTensor>& tensors) {
  return PackChunkLists<SgdList>(tensors, FillSgd, NoLaunch());
}

int64_t CountFusedAdamLaunches(DType dtype, const FusedAdamOptions& options,
                               const std::vector<FusedAdamTensor>& tensors) {
  int64_t launches = 0;
  DispatchAllFloatingTypes(dtype, "CUDA FusedAdamKernel", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launches = PackChunkLists<AdamList<T>>(
        tensors,
        [&](AdamList<T>& list, int s, const FusedAdamTensor& t) {
          FillAdam<T>(options, list, s, t);
        },
        NoLaunch());
  });
  // A capturable step advances its device step count first (Note [Capturable Adam]).
  return launches + (options.capturable_state != nullptr ? 1 : 0);
}

int64_t CountFusedRmspropLaunches(const std::vector<FusedRmspropTensor>& tensors) {
  return PackChunkLists<RmspropList>(tensors, FillRmsprop, NoLaunch());
}

}  // namespace cuda
}  // namespace tandem
