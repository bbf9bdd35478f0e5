// Gather and scatter-add, of one column per row or along an axis (kernels.h). Scatter-add
// runs 16-bit dtypes through float copies (Note [16-bit via float], internal/float_copies.cuh).
// Indices are range-checked on the device (Note [Device-side index checks], kernels.h).
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "tensor/base/error.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/internal/float_copies.cuh"
#include "tensor/cuda/internal/launch_utils.cuh"
#include "tensor/cuda/kernels.h"

namespace tandem {
namespace cuda {
namespace {

// Whether 0 <= value < size; records the first bad value in `check` (Note [Device-side index
// checks], kernels.h) when it is not. Scatters pass no record: their gather did.
__device__ inline bool IndexInRange(int64_t value, int64_t size, DeviceAssert* check,
                                    unsigned long long op) {
  // One unsigned comparison: a negative value wraps past any size.
  if (static_cast<uint64_t>(value) < static_cast<uint64_t>(size)) return true;
  if (check != nullptr && atomicCAS(&check->flag, 0, 1) == 0) {
    check->value = static_cast<long long>(value);
    check->size = static_cast<long long>(size);
    // The op last: a host reading the record while this kernel still runs (a sync of another
    // stream) sees op == 0 and leaves the record for a later synchronization.
    __threadfence();
    check->op = op;
  }
  return false;
}

// ---- Gather / scatter of one column per row -------------------------------------------------

template <typename T>
__global__ void GatherColumnsKernel(T* dst, const T* src, const int64_t* idx, int64_t rows,
                                    int64_t cols, DeviceAssert* check, unsigned long long op) {
  for (int64_t r = GlobalThread(); r < rows; r += GridThreads()) {
    const int64_t c = idx[r];
    dst[r] = IndexInRange(c, cols, check, op) ? src[r * cols + c] : T(0);
  }
}

// Row r only ever touches row r of dst, so threads never collide: a plain read-modify-write
// is race-free and, unlike atomicAdd, deterministic.
template <typename T>
__global__ void ScatterAddColumnsKernel(T* dst, const T* src, const int64_t* idx, int64_t rows,
                                        int64_t cols) {
  using M = OpMath<T>;
  for (int64_t r = GlobalThread(); r < rows; r += GridThreads()) {
    if (!IndexInRange(idx[r], cols, nullptr, 0)) continue;
    T& element = dst[r * cols + idx[r]];
    element = static_cast<T>(static_cast<M>(element) + static_cast<M>(src[r]));
  }
}

// torch.gather over the middle axis: one thread per output element.
template <typename T>
__global__ void GatherKernel(T* dst, const T* src, const int64_t* idx, int64_t outer,
                             int64_t src_dim, int64_t idx_dim, int64_t inner, DeviceAssert* check,
                             unsigned long long op) {
  const int64_t n = outer * idx_dim * inner;
  for (int64_t e = GlobalThread(); e < n; e += GridThreads()) {
    const int64_t o = e / (idx_dim * inner), i = e % inner;
    const int64_t j = idx[e];
    dst[e] = IndexInRange(j, src_dim, check, op) ? src[(o * src_dim + j) * inner + i] : T(0);
  }
}

// One thread per column (o, i) of dst, adding in j order like the CPU: no collisions, no
// atomics, the same result. Acc is T, or float for 16-bit T: then dst is a float copy of the
// destination (LaunchScatterAdd), so that repeated indices accumulate in float and each
// element is rounded once, when the copy is narrowed back.
template <typename Acc, typename T>
__global__ void ScatterAddKernel(Acc* dst, const T* src, const int64_t* idx, int64_t outer,
                                 int64_t dst_dim, int64_t idx_dim, int64_t inner) {
  const int64_t columns = outer * inner;
  for (int64_t column = GlobalThread(); column < columns; column += GridThreads()) {
    const int64_t o = column / inner, i = column % inner;
    for (int64_t j = 0; j < idx_dim; ++j) {
      const int64_t at = (o * idx_dim + j) * inner + i;
      if (!IndexInRange(idx[at], dst_dim, nullptr, 0)) continue;
      dst[(o * dst_dim + idx[at]) * inner + i] += static_cast<Acc>(src[at]);
    }
  }
}

}  // namespace

void LaunchGatherColumns(const LaunchContext& context, DType dtype, void* dst, const void* src,
                         const int64_t* idx, int64_t rows, int64_t cols, DeviceAssert* check,
                         const char* op) {
  DispatchAllFloatingTypes(dtype, "CUDA GatherColumns", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (rows <= 0) return;
    GatherColumnsKernel<T><<<GridFor(context, rows), kThreads, 0, context.stream>>>(
        static_cast<T*>(dst), static_cast<const T*>(src), idx, rows, cols, check,
        reinterpret_cast<unsigned long long>(op));
    TANDEM_CUDA_CHECK_LAUNCH(context.device);
  });
}

void LaunchScatterAddColumns(const LaunchContext& context, DType dtype, void* dst, const void* src,
                             const int64_t* idx, int64_t rows, int64_t cols) {
  DispatchAllFloatingTypes(dtype, "CUDA ScatterAddColumns", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (rows <= 0) return;
    ScatterAddColumnsKernel<T><<<GridFor(context, rows), kThreads, 0, context.stream>>>(
        static_cast<T*>(dst), static_cast<const T*>(src), idx, rows, cols);
    TANDEM_CUDA_CHECK_LAUNCH(context.device);
  });
}

void LaunchGather(const LaunchContext& context, DType dtype, void* dst, const void* src,
                  const int64_t* idx, int64_t outer, int64_t src_dim, int64_t idx_dim,
                  int64_t inner, DeviceAssert* check, const char* op) {
  DispatchAllFloatingTypes(dtype, "CUDA Gather", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t n = outer * idx_dim * inner;
    if (n <= 0) return;
    GatherKernel<T><<<GridFor(context, n), kThreads, 0, context.stream>>>(
        static_cast<T*>(dst), static_cast<const T*>(src), idx, outer, src_dim, idx_dim, inner,
        check, reinterpret_cast<unsigned long long>(op));
    TANDEM_CUDA_CHECK_LAUNCH(context.device);
  });
}

void LaunchScatterAdd(const LaunchContext& context, DType dtype, void* dst, const void* src,
                      const int64_t* idx, int64_t outer, int64_t dst_dim, int64_t idx_dim,
                      int64_t inner) {
  DispatchAllFloatingTypes(dtype, "CUDA ScatterAdd", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (outer * idx_dim * inner <= 0) return;
    const T* values = static_cast<const T*>(src);
    if constexpr (kIsReducedFloat<T>) {
      // Into a float copy of dst (Note [16-bit via float]): repeated indices add in float.
      const int64_t n = outer * dst_dim * inner;
      const std::shared_ptr<void> wide = WidenedCopy(context, static_cast<const T*>(dst), n);
      ScatterAddKernel<float, T><<<GridFor(context, outer * inner), kThreads, 0, context.stream>>>(
          static_cast<float*>(wide.get()), values, idx, outer, dst_dim, idx_dim, inner);
      TANDEM_CUDA_CHECK_LAUNCH(context.device);
      NarrowInto(context, static_cast<T*>(dst), wide.get(), n);
    } else {
      ScatterAddKernel<T, T><<<GridFor(context, outer * inner), kThreads, 0, context.stream>>>(
          static_cast<T*>(dst), values, idx, outer, dst_dim, idx_dim, inner);
      TANDEM_CUDA_CHECK_LAUNCH(context.device);
    }
  });
}

}  // namespace cuda
}  // namespace tandem
