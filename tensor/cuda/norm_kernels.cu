// Fused row norms: LayerNorm and RMSNorm forward and backward over the last axis
// (LaunchRowNorm, LaunchRowNormBackward of kernels.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "tensor/base/error.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/internal/launch_utils.cuh"
#include "tensor/cuda/kernels.h"
#include "tensor/kernels/internal/elementwise_math.h"

namespace tandem {
namespace cuda {
namespace {

// ---- Fused row norms and triangles (Note [Fused row norms] in tensor/kernels/norm_kernels.h)

// One block per row; the block's threads stride along the row (coalesced), which is read
// twice more from L1/L2 after the first pass.
template <typename T>
__global__ void RowNormKernel(bool rms, int64_t rows, int64_t cols, OpMath<T> eps, const T* x,
                              const T* weight, const T* bias, T* y, OpMath<T>* mean_out,
                              OpMath<T>* rstd_out) {
  using M = OpMath<T>;
  const M inv_cols = M(1) / static_cast<M>(cols);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * cols;
    T* yr = y + row * cols;
    M mean = 0;
    if (!rms) {
      M sum = 0;
      for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) sum += static_cast<M>(xr[j]);
      mean = BlockSum(sum) * inv_cols;
    }
    M squares = 0;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      const M d = static_cast<M>(xr[j]) - mean;
      squares += d * d;
    }
    const M rstd = M(1) / math::Sqrt(BlockSum(squares) * inv_cols + eps);
    if (threadIdx.x == 0) {
      if (mean_out != nullptr) mean_out[row] = mean;
      rstd_out[row] = rstd;
    }
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      M v = (static_cast<M>(xr[j]) - mean) * rstd;
      if (weight != nullptr) v *= static_cast<M>(weight[j]);
      if (bias != nullptr) v += static_cast<M>(bias[j]);
      yr[j] = static_cast<T>(v);
    }
  }
}

// grad_x, one block per row.
template <typename T>
__global__ void RowNormBackwardInputKernel(bool rms, int64_t rows, int64_t cols, const T* dy,
                                           const T* x, const OpMath<T>* mean_in,
                                           const OpMath<T>* rstd_in, const T* weight, T* dx) {
  using M = OpMath<T>;
  const M inv_cols = M(1) / static_cast<M>(cols);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * cols;
    const T* gr = dy + row * cols;
    const M mean = rms ? M(0) : mean_in[row];
    const M rstd = rstd_in[row];
    M sum_g = 0, sum_gx = 0;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      const M g = static_cast<M>(gr[j]) * (weight != nullptr ? static_cast<M>(weight[j]) : M(1));
      sum_g += g;
      sum_gx += g * (static_cast<M>(xr[j]) - mean) * rstd;
    }
    const M mean_g = rms ? M(0) : BlockSum(sum_g) * inv_cols;
    const M mean_gx = BlockSum(sum_gx) * inv_cols;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      const M g = static_cast<M>(gr[j]) * (weight != nullptr ? static_cast<M>(weight[j]) : M(1));
      const M xhat = (static_cast<M>(xr[j]) - mean) * rstd;
      dx[row * cols + j] = static_cast<T>(rstd * (g - mean_g - xhat * mean_gx));
    }
  }
}

constexpr int kNormColumnTile = 32;  // columns per block of the weight/bias sums
constexpr int kNormRowLanes = 8;     // threads per column, striding over the rows

// grad_weight and grad_bias: a block per 32 columns, 8 threads per column summing every 8th
// row (neighbouring threads read neighbouring columns: coalesced), then the 8 partial sums
// added through shared memory.
template <typename T>
__global__ void RowNormBackwardParamsKernel(bool rms, int64_t rows, int64_t cols, const T* dy,
                                            const T* x, const OpMath<T>* mean_in,
                                            const OpMath<T>* rstd_in, T* dw, T* db) {
  using M = OpMath<T>;
  __shared__ M partial_w[kNormRowLanes][kNormColumnTile];
  __shared__ M partial_b[kNormRowLanes][kNormColumnTile];
  const int column_lane = threadIdx.x % kNormColumnTile, row_lane = threadIdx.x / kNormColumnTile;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kNormColumnTile + column_lane;
  M sum_w = 0, sum_b = 0;
  if (j < cols) {
    for (int64_t r = row_lane; r < rows; r += kNormRowLanes) {
      const M g = static_cast<M>(dy[r * cols + j]);
      const M mean = rms ? M(0) : mean_in[r];
      sum_w += g * (static_cast<M>(x[r * cols + j]) - mean) * rstd_in[r];
      sum_b += g;
    }
  }
  partial_w[row_lane][column_lane] = sum_w;
  partial_b[row_lane][column_lane] = sum_b;
  __syncthreads();
  if (row_lane == 0 && j < cols) {
    for (int lane = 1; lane < kNormRowLanes; ++lane) {
      sum_w += partial_w[lane][column_lane];
      sum_b += partial_b[lane][column_lane];
    }
    if (dw != nullptr) dw[j] = static_cast<T>(sum_w);
    if (db != nullptr) db[j] = static_cast<T>(sum_b);
  }
}

// Threads for a row kernel: a warp per short row, up to 512 for long ones.
int RowThreads(int64_t cols) {
  return static_cast<int>(std::min<int64_t>(512, (cols + kWarpSize - 1) / kWarpSize * kWarpSize));
}

}  // namespace

void LaunchRowNorm(const LaunchContext& context, DType dtype, bool rms, int64_t rows, int64_t cols,
                   double eps, const void* x, const void* weight, const void* bias, void* y,
                   void* mean, void* rstd) {
  DispatchAllFloatingTypes(dtype, "CUDA RowNorm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = OpMath<T>;
    if (rows == 0 || cols == 0) return;
    const int64_t grid = std::min<int64_t>(rows, static_cast<int64_t>(context.num_sms) * 32);
    RowNormKernel<T><<<static_cast<int>(grid), RowThreads(cols), 0, context.stream>>>(
        rms, rows, cols, static_cast<M>(eps), static_cast<const T*>(x),
        static_cast<const T*>(weight), static_cast<const T*>(bias), static_cast<T*>(y),
        static_cast<M*>(mean), static_cast<M*>(rstd));
    TANDEM_CUDA_CHECK_LAUNCH(context.device);
  });
}

void LaunchRowNormBackward(const LaunchContext& context, DType dtype, bool rms, int64_t rows,
                           int64_t cols, const void* grad_y, const void* x, const void* mean,
                           const void* rstd, const void* weight, void* grad_x, void* grad_weight,
                           void* grad_bias) {
  DispatchAllFloatingTypes(dtype, "CUDA RowNormBackward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = OpMath<T>;
    if (cols == 0) return;
    const T* dy = static_cast<const T*>(grad_y);
    const T* in = static_cast<const T*>(x);
    const M* mean_in = static_cast<const M*>(mean);
    const M* rstd_in = static_cast<const M*>(rstd);
    if (grad_x != nullptr && rows > 0) {
      const int64_t grid = std::min<int64_t>(rows, static_cast<int64_t>(context.num_sms) * 32);
      RowNormBackwardInputKernel<T>
          <<<static_cast<int>(grid), RowThreads(cols), 0, context.stream>>>(
              rms, rows, cols, dy, in, mean_in, rstd_in, static_cast<const T*>(weight),
              static_cast<T*>(grad_x));
      TANDEM_CUDA_CHECK_LAUNCH(context.device);
    }
    if (grad_weight != nullptr || grad_bias != nullptr) {
      const int64_t grid = (cols + kNormColumnTile - 1) / kNormColumnTile;
      RowNormBackwardParamsKernel<T>
          <<<static_cast<int>(grid), kNormColumnTile * kNormRowLanes, 0, context.stream>>>(
              rms, rows, cols, dy, in, mean_in, rstd_in, static_cast<T*>(grad_weight),
              static_cast<T*>(grad_bias));
      TANDEM_CUDA_CHECK_LAUNCH(context.device);
    }
  });
}

}  // namespace cuda
}  // namespace tandem
