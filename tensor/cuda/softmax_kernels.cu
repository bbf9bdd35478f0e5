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
#include "tools/cuda/device_counters.h"

namespace tandem {
namespace cuda {
namespace {

// ---- Softmax ----------------------------------------------------------------------------
// Two passes over each row: the maximum and the sum of exp(x - max) (in double) together, as
// an online softmax (Milakov and Gimelshein, 2018: a running maximum, the running sum rescaled
// by exp(old max - new max) whenever the maximum grows), then the output. The CPU's three
// passes take each exp(x - max) against the final maximum; here a term may be taken against a
// running one and rescaled, so the two sums differ by float rounding (about one unit in the
// last place of float per term), far inside the outputs' tolerance. A GPT-2 vocabulary row is
// 200 KB: one read fewer of it per row.

template <typename T>
__device__ __forceinline__ T MaxPropagatingNan(T a, T b) {
  return (isnan(a) || a > b) ? a : b;
}

// A running (maximum, sum of exp(x - maximum)) pair. -inf terms add nothing (exp(-inf) = 0), so
// they are skipped: a row of only -inf keeps max -inf and sum 0, whose output (0 * inf, or
// -inf - log 0) is NaN as the CPU's exp(-inf - -inf) makes it. A NaN makes the maximum NaN and
// the sum NaN (NaN wins, as on the CPU).
template <typename M>
struct OnlineSum {
  M max = -INFINITY;
  double sum = 0.0;

  __device__ __forceinline__ void Add(M x) {
    if (x == M(-INFINITY)) return;
    const M grown = MaxPropagatingNan(x, max);
    if (!(grown == max)) {  // a larger maximum (or a NaN): rescale what was summed
      sum = max == M(-INFINITY) ? 0.0 : sum * ::exp(static_cast<double>(max - grown));
      max = grown;
    }
    sum += math::Exp(x - max);
  }

  __device__ __forceinline__ void Merge(M other_max, double other_sum) {
    const M merged = MaxPropagatingNan(other_max, max);
    sum = (max == M(-INFINITY) ? 0.0 : sum * ::exp(static_cast<double>(max - merged))) +
          (other_max == M(-INFINITY) ? 0.0
                                     : other_sum * ::exp(static_cast<double>(other_max - merged)));
    max = merged;
  }
};

// Block-wide merge of every thread's OnlineSum through one shared slot per warp, as BlockSum
// (launch_utils.cuh); every thread gets the result.
template <typename M>
__device__ OnlineSum<M> BlockOnlineSum(OnlineSum<M> value) {
  __shared__ M warp_max[kWarpSize];
  __shared__ double warp_sum[kWarpSize];
  __shared__ M result_max;
  __shared__ double result_sum;
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const M other_max = __shfl_down_sync(kFullMask, value.max, offset);
    const double other_sum = __shfl_down_sync(kFullMask, value.sum, offset);
    value.Merge(other_max, other_sum);
  }
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  if (lane == 0) {
    warp_max[warp] = value.max;
    warp_sum[warp] = value.sum;
  }
  __syncthreads();
  if (warp == 0) {
    const int warps = blockDim.x / kWarpSize;
    value = OnlineSum<M>();
    if (lane < warps) {
      value.max = warp_max[lane];
      value.sum = warp_sum[lane];
    }
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
      const M other_max = __shfl_down_sync(kFullMask, value.max, offset);
      const double other_sum = __shfl_down_sync(kFullMask, value.sum, offset);
      value.Merge(other_max, other_sum);
    }
    if (lane == 0) {
      result_max = value.max;
      result_sum = value.sum;
    }
  }
  __syncthreads();
  OnlineSum<M> out;
  out.max = result_max;
  out.sum = result_sum;
  return out;
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
    OnlineSum<M> online;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) online.Add(static_cast<M>(x[j]));
    online = BlockOnlineSum(online);
    const M max_value = online.max;
    const double sum = online.sum;
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
    OnlineSum<M> online;
    for (int64_t j = 0; j < dim; ++j) online.Add(static_cast<M>(x[j * inner]));
    const M max_value = online.max;
    const double sum = online.sum;
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

// ---- Fused cross-entropy (Note [Fused cross-entropy], tensor/kernels/softmax_kernels.h) ------

// A block per row: the online softmax's maximum and sum, then thread 0 writes the row's
// log-sum-exp and loss (log_softmax's value at the target, negated, as the CPU computes it).
template <typename T>
__global__ void CrossEntropyForwardKernel(OpMath<T>* row_loss, OpMath<T>* lse, const T* logits,
                                          const int64_t* targets, int64_t rows, int64_t cols,
                                          DeviceAssert* check, unsigned long long op) {
  using M = OpMath<T>;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* x = logits + row * cols;
    OnlineSum<M> online;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) online.Add(static_cast<M>(x[j]));
    online = BlockOnlineSum(online);
    if (threadIdx.x == 0) {
      const M log_sum = static_cast<M>(::log(online.sum));
      lse[row] = online.max + log_sum;
      const int64_t t = targets[row];
      row_loss[row] =
          IndexInRange(t, cols, check, op) ? log_sum - (static_cast<M>(x[t]) - online.max) : M(0);
    }
  }
}

// A block per row: grad_logits = (exp(x - lse) - onehot) * grad[0] * scale, rounded once.
template <typename T>
__global__ void CrossEntropyBackwardKernel(T* grad_logits, const T* logits, const OpMath<T>* lse,
                                           const int64_t* targets, const OpMath<T>* grad,
                                           double scale, int64_t rows, int64_t cols) {
  using M = OpMath<T>;
  const M g = static_cast<M>(static_cast<double>(*grad) * scale);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* x = logits + row * cols;
    T* dx = grad_logits + row * cols;
    const M row_lse = lse[row];
    const int64_t t = targets[row];
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      const M p = math::Exp(static_cast<M>(x[j]) - row_lse);
      dx[j] = static_cast<T>((p - (j == t ? M(1) : M(0))) * g);
    }
  }
}

// Threads for a row kernel: a warp per short row (10 classes), up to 512 for long ones.
int RowThreads(int64_t cols) {
  return static_cast<int>(std::min<int64_t>(512, (cols + kWarpSize - 1) / kWarpSize * kWarpSize));
}

// Blocks for a block-per-row kernel: every row, up to 32 a SM (then rows are strided).
int RowGrid(const LaunchContext& context, int64_t rows) {
  return static_cast<int>(std::min<int64_t>(rows, static_cast<int64_t>(context.num_sms) * 32));
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
      const int grid = RowGrid(context, outer);
      internal::RecordLaunchWork("SoftmaxRowsKernel", grid, outer * dim);
      SoftmaxRowsKernel<T><<<grid, RowThreads(dim), 0, context.stream>>>(log, out, in, outer, dim);
    } else {
      internal::RecordLaunchWork("SoftmaxColumnsKernel", GridFor(context, outer * inner),
                                 outer * dim * inner);
      SoftmaxColumnsKernel<T><<<GridFor(context, outer * inner), kThreads, 0, context.stream>>>(
          log, out, in, outer, dim, inner);
    }
    TANDEM_CUDA_CHECK_LAUNCH(context.device);
    // Two reads of the input (the online maximum and sum, then the output) and a write; an
    // exp, a rescale and a division (or log) an element, about 6 FLOPs.
    const double elements = static_cast<double>(outer * dim * inner);
    DeclareKernelWork(6 * elements, 3 * elements * sizeof(T), RooflineMath(sizeof(OpMath<T>)));
  });
}

void LaunchCrossEntropyForward(const LaunchContext& context, DType dtype, void* row_loss, void* lse,
                               const void* logits, const int64_t* targets, int64_t rows,
                               int64_t cols, DeviceAssert* check, const char* op) {
  DispatchAllFloatingTypes(dtype, "CUDA CrossEntropyForward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = OpMath<T>;
    if (rows == 0) return;
    const int grid = RowGrid(context, rows);
    internal::RecordLaunchWork("CrossEntropyForwardKernel", grid, rows * cols);
    CrossEntropyForwardKernel<T><<<grid, RowThreads(cols), 0, context.stream>>>(
        static_cast<M*>(row_loss), static_cast<M*>(lse), static_cast<const T*>(logits), targets,
        rows, cols, check, reinterpret_cast<unsigned long long>(op));
    TANDEM_CUDA_CHECK_LAUNCH(context.device);
    // The logits read once (the online softmax), a target, loss and log-sum-exp a row.
    const double elements = static_cast<double>(rows * cols);
    DeclareKernelWork(4 * elements, elements * sizeof(T) + rows * (sizeof(int64_t) + 2 * sizeof(M)),
                      RooflineMath(sizeof(M)));
  });
}

void LaunchCrossEntropyBackward(const LaunchContext& context, DType dtype, void* grad_logits,
                                const void* logits, const void* lse, const int64_t* targets,
                                const void* grad, double scale, int64_t rows, int64_t cols) {
  DispatchAllFloatingTypes(dtype, "CUDA CrossEntropyBackward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (rows * cols == 0) return;
    const int grid = RowGrid(context, rows);
    internal::RecordLaunchWork("CrossEntropyBackwardKernel", grid, rows * cols);
    CrossEntropyBackwardKernel<T><<<grid, RowThreads(cols), 0, context.stream>>>(
        static_cast<T*>(grad_logits), static_cast<const T*>(logits),
        static_cast<const OpMath<T>*>(lse), targets, static_cast<const OpMath<T>*>(grad), scale,
        rows, cols);
    TANDEM_CUDA_CHECK_LAUNCH(context.device);
    // The logits read and their gradient written; an exp and a scale an element.
    const double elements = static_cast<double>(rows * cols);
    DeclareKernelWork(
        4 * elements,
        2 * elements * sizeof(T) + rows * (sizeof(int64_t) + sizeof(OpMath<T>)) + sizeof(OpMath<T>),
        RooflineMath(sizeof(OpMath<T>)));
  });
}

}  // namespace cuda
}  // namespace tandem
