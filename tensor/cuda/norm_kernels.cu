// Fused row norms: LayerNorm and RMSNorm forward and backward over the last axis
// (LaunchRowNorm, LaunchRowNormBackward of kernels.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>

#include "tensor/base/error.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/internal/launch_utils.cuh"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/launch_work.h"
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

constexpr int kNormColumnTile = 32;    // columns per block of the weight/bias sums
constexpr int kNormRowLanes = 8;       // threads per column, striding over the rows
constexpr int64_t kNormMinChunk = 64;  // rows per block of a split sum: 8 per thread

// grad_weight and grad_bias over the rows [split * chunk, (split + 1) * chunk) of split
// blockIdx.y: a block per 32 columns and split, 8 threads per column summing every 8th row
// (neighbouring threads read neighbouring columns: coalesced), then the 8 partial sums added
// through shared memory. With one split the block writes dw and db; with more it writes its
// sums to partial_w/partial_b ([splits, cols] in M) and RowNormParamsFinishKernel adds them.
// Splitting the rows is what fills the GPU: GPT-2's 768 columns are 24 blocks otherwise.
template <typename T>
__global__ void RowNormBackwardParamsKernel(bool rms, int64_t rows, int64_t cols, int64_t chunk,
                                            const T* dy, const T* x, const OpMath<T>* mean_in,
                                            const OpMath<T>* rstd_in, T* dw, T* db,
                                            OpMath<T>* partial_w, OpMath<T>* partial_b) {
  using M = OpMath<T>;
  __shared__ M lanes_w[kNormRowLanes][kNormColumnTile];
  __shared__ M lanes_b[kNormRowLanes][kNormColumnTile];
  const int column_lane = threadIdx.x % kNormColumnTile, row_lane = threadIdx.x / kNormColumnTile;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kNormColumnTile + column_lane;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * chunk;
  const int64_t end = min(rows, begin + chunk);
  M sum_w = 0, sum_b = 0;
  if (j < cols) {
    for (int64_t r = begin + row_lane; r < end; r += kNormRowLanes) {
      const M g = static_cast<M>(dy[r * cols + j]);
      const M mean = rms ? M(0) : mean_in[r];
      sum_w += g * (static_cast<M>(x[r * cols + j]) - mean) * rstd_in[r];
      sum_b += g;
    }
  }
  lanes_w[row_lane][column_lane] = sum_w;
  lanes_b[row_lane][column_lane] = sum_b;
  __syncthreads();
  if (row_lane == 0 && j < cols) {
    for (int lane = 1; lane < kNormRowLanes; ++lane) {
      sum_w += lanes_w[lane][column_lane];
      sum_b += lanes_b[lane][column_lane];
    }
    if (partial_w != nullptr) {
      partial_w[blockIdx.y * cols + j] = sum_w;
      partial_b[blockIdx.y * cols + j] = sum_b;
    } else {
      if (dw != nullptr) dw[j] = static_cast<T>(sum_w);
      if (db != nullptr) db[j] = static_cast<T>(sum_b);
    }
  }
}

// The second pass of a split: a thread per column adds its `splits` partial sums in split
// order (deterministic: no atomics).
template <typename T>
__global__ void RowNormParamsFinishKernel(int64_t cols, int64_t splits, const OpMath<T>* partial_w,
                                          const OpMath<T>* partial_b, T* dw, T* db) {
  using M = OpMath<T>;
  for (int64_t j = GlobalThread(); j < cols; j += GridThreads()) {
    M sum_w = 0, sum_b = 0;
    for (int64_t s = 0; s < splits; ++s) {
      sum_w += partial_w[s * cols + j];
      sum_b += partial_b[s * cols + j];
    }
    if (dw != nullptr) dw[j] = static_cast<T>(sum_w);
    if (db != nullptr) db[j] = static_cast<T>(sum_b);
  }
}

// Row splits for the parameter sums: enough blocks to occupy every SM fully (8 blocks of 256
// each), at least kNormMinChunk rows a split.
int64_t NormParamSplits(const LaunchContext& context, int64_t rows, int64_t tiles) {
  const int64_t wanted =
      (static_cast<int64_t>(context.num_sms) * (kThreadsPerSm / kThreads) + tiles - 1) / tiles;
  return std::max<int64_t>(1, std::min({wanted, rows / kNormMinChunk, int64_t{65535}}));
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
    internal::RecordLaunchWork("RowNormKernel", grid, rows * cols);
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
      internal::RecordLaunchWork("RowNormBackwardInputKernel", grid, rows * cols);
      RowNormBackwardInputKernel<T>
          <<<static_cast<int>(grid), RowThreads(cols), 0, context.stream>>>(
              rms, rows, cols, dy, in, mean_in, rstd_in, static_cast<const T*>(weight),
              static_cast<T*>(grad_x));
      TANDEM_CUDA_CHECK_LAUNCH(context.device);
    }
    if (grad_weight != nullptr || grad_bias != nullptr) {
      const int64_t tiles = (cols + kNormColumnTile - 1) / kNormColumnTile;
      int64_t splits = NormParamSplits(context, rows, tiles);
      const int64_t chunk = std::max<int64_t>(1, (rows + splits - 1) / splits);
      splits = std::max<int64_t>(1, (rows + chunk - 1) / chunk);  // no empty split at the end
      // Returned to the allocator at the end of this scope while the kernels may be queued:
      // safe, as it is handed out again only to later work on this stream.
      std::shared_ptr<void> partials =
          splits > 1 ? context.workspace->Allocate(2 * splits * cols * sizeof(M)) : nullptr;
      M* partial_w = static_cast<M*>(partials.get());
      M* partial_b = partial_w == nullptr ? nullptr : partial_w + splits * cols;
      internal::RecordLaunchWork("RowNormBackwardParamsKernel", tiles * splits, rows * cols);
      RowNormBackwardParamsKernel<T>
          <<<dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(splits)),
             kNormColumnTile * kNormRowLanes, 0, context.stream>>>(
              rms, rows, cols, chunk, dy, in, mean_in, rstd_in, static_cast<T*>(grad_weight),
              static_cast<T*>(grad_bias), partial_w, partial_b);
      TANDEM_CUDA_CHECK_LAUNCH(context.device);
      if (splits > 1) {
        const int grid = GridFor(context, cols);
        internal::RecordLaunchWork("RowNormParamsFinishKernel", grid, splits * cols);
        RowNormParamsFinishKernel<T><<<grid, kThreads, 0, context.stream>>>(
            cols, splits, partial_w, partial_b, static_cast<T*>(grad_weight),
            static_cast<T*>(grad_bias));
        TANDEM_CUDA_CHECK_LAUNCH(context.device);
      }
    }
  });
}

}  // namespace cuda
}  // namespace tandem
