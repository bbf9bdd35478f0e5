// Softmax and log-softmax over one axis (LaunchSoftmax of kernels.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "tensor/base/error.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/internal/launch_utils.cuh"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/launch_work.h"
#include "tensor/kernels/internal/elementwise_math.h"

namespace tandem {
namespace cuda {
namespace {

// ---- Softmax ----------------------------------------------------------------------------
// Three passes over each row like the CPU's (max; sum of exp(x - max) in double; write), so
// both compute the same expression. A row is read three times, but from L1/L2 after the
// first, so the kernel stays close to one read and one write of the tensor.

template <typename T>
__device__ __forceinline__ T MaxPropagatingNan(T a, T b) {
  return (isnan(a) || a > b) ? a : b;
}

// Block-wide maximum (NaN wins) through one shared slot per warp, as BlockSum (launch_utils.cuh).
template <typename T>
__device__ T BlockMax(T value) {
  __shared__ T warp_results[kWarpSize];
  __shared__ T result;
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    value = MaxPropagatingNan(value, __shfl_down_sync(kFullMask, value, offset));
  }
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  if (lane == 0) warp_results[warp] = value;
  __syncthreads();
  if (warp == 0) {
    const int warps = blockDim.x / kWarpSize;
    value = lane < warps ? warp_results[lane] : T(-INFINITY);
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
      value = MaxPropagatingNan(value, __shfl_down_sync(kFullMask, value, offset));
    }
    if (lane == 0) result = value;
  }
  __syncthreads();
  return result;
}

// One block per row of a [rows, dim] input (inner == 1); the block's threads stride along
// the row so that their reads coalesce. blockDim.x is a multiple of 32. M = OpMath<T>: 16-bit
// inputs are computed in float and each output rounded once.
template <typename T>
__global__ void SoftmaxRowsKernel(bool log, T* dst, const T* src, int64_t rows, int64_t dim) {
  using M = OpMath<T>;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* x = src + row * dim;
    T* y = dst + row * dim;
    M max_value = -INFINITY;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
      max_value = MaxPropagatingNan(static_cast<M>(x[j]), max_value);
    }
    max_value = BlockMax(max_value);
    double sum = 0.0;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
      sum += math::Exp(static_cast<M>(x[j]) - max_value);
    }
    sum = BlockSum(sum);
    if (log) {
      const M log_sum = static_cast<M>(::log(sum));
      for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
        y[j] = static_cast<T>((static_cast<M>(x[j]) - max_value) - log_sum);
      }
    } else {
      const M scale = static_cast<M>(1.0 / sum);
      for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
        y[j] = static_cast<T>(math::Exp(static_cast<M>(x[j]) - max_value) * scale);
      }
    }
  }
}

// One thread per (outer, inner) column of an [outer, dim, inner] input: neighbouring
// threads read neighbouring columns, so every step along `dim` is one coalesced load.
template <typename T>
__global__ void SoftmaxColumnsKernel(bool log, T* dst, const T* src, int64_t outer, int64_t dim,
                                     int64_t inner) {
  using M = OpMath<T>;
  for (int64_t item = GlobalThread(); item < outer * inner; item += GridThreads()) {
    const int64_t start = (item / inner) * dim * inner + item % inner;
    const T* x = src + start;
    T* y = dst + start;
    M max_value = -INFINITY;
    for (int64_t j = 0; j < dim; ++j) {
      max_value = MaxPropagatingNan(static_cast<M>(x[j * inner]), max_value);
    }
    double sum = 0.0;
    for (int64_t j = 0; j < dim; ++j) sum += math::Exp(static_cast<M>(x[j * inner]) - max_value);
    if (log) {
      const M log_sum = static_cast<M>(::log(sum));
      for (int64_t j = 0; j < dim; ++j) {
        y[j * inner] = static_cast<T>((static_cast<M>(x[j * inner]) - max_value) - log_sum);
      }
    } else {
      const M scale = static_cast<M>(1.0 / sum);
      for (int64_t j = 0; j < dim; ++j) {
        y[j * inner] = static_cast<T>(math::Exp(static_cast<M>(x[j * inner]) - max_value) * scale);
      }
    }
  }
}

}  // namespace

void LaunchSoftmax(const LaunchContext& context, DType dtype, bool log, void* dst, const void* src,
                   int64_t outer, int64_t dim, int64_t inner) {
  DispatchAllFloatingTypes(dtype, "CUDA Softmax", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (outer * dim * inner == 0) return;
    T* out = static_cast<T*>(dst);
    const T* in = static_cast<const T*>(src);
    if (inner == 1) {
      // A warp per short row (10 classes), up to 512 threads for long ones.
      const int threads =
          static_cast<int>(std::min<int64_t>(512, (dim + kWarpSize - 1) / kWarpSize * kWarpSize));
      const int64_t grid = std::min<int64_t>(outer, static_cast<int64_t>(context.num_sms) * 32);
      internal::RecordLaunchWork("SoftmaxRowsKernel", grid, outer * dim);
      SoftmaxRowsKernel<T>
          <<<static_cast<int>(grid), threads, 0, context.stream>>>(log, out, in, outer, dim);
    } else {
      internal::RecordLaunchWork("SoftmaxColumnsKernel", GridFor(context, outer * inner),
                                 outer * dim * inner);
      SoftmaxColumnsKernel<T><<<GridFor(context, outer * inner), kThreads, 0, context.stream>>>(
          log, out, in, outer, dim, inner);
    }
    TANDEM_CUDA_CHECK_LAUNCH(context.device);
  });
}

}  // namespace cuda
}  // namespace tandem
