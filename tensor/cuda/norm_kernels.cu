// Fused row norms: LayerNorm and RMSNorm forward and backward over the last axis
// (LaunchRowNorm, LaunchRowNormBackward of kernels.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <utility>

#include "tensor/base/error.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/internal/launch_utils.cuh"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/launch_work.h"
#include "tensor/kernels/internal/elementwise_math.h"
#include "tensor/kernels/internal/row_norm_types.h"
#include "tools/cuda/device_counters.h"

namespace tandem {
namespace cuda {
namespace {

// ---- Fused row norms and triangles (Note [Fused row norms] in tensor/kernels/norm_kernels.h)

// One block per row; the block's threads stride along the row (coalesced), which is read
// twice more from L1/L2 after the first pass. Each thread takes kVec neighbouring elements at
// a time: 8 (kNormVector) where the rows allow it (see RowsPack), else 1. T is x's, the sum's and
// the parameters' type, L the residual's and y's (Note [Autocast residual norm]).
template <typename T, typename L, int kVec>
__global__ void RowNormKernel(bool rms, int64_t rows, int64_t cols, OpMath<T> eps, const T* x,
                              const L* residual, const T* weight, const T* bias, L* y, T* sum,
                              OpMath<T>* mean_out, OpMath<T>* rstd_out) {
  using M = OpMath<T>;
  using P = Pack<T, kVec>;
  using PL = Pack<L, kVec>;
  const M inv_cols = M(1) / static_cast<M>(cols);
  const int64_t chunks = cols / kVec;
  const P* w = reinterpret_cast<const P*>(weight);
  const P* b = reinterpret_cast<const P*>(bias);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const P* xr = reinterpret_cast<const P*>(x + row * cols);
    PL* yr = reinterpret_cast<PL*>(y + row * cols);
    if (residual != nullptr) {
      // Note [Fused residual norm]: the rounded sum written, then normalised. Each thread reads
      // back only the chunks it wrote, so no barrier is needed before the passes below.
      const PL* rr = reinterpret_cast<const PL*>(residual + row * cols);
      P* sr = reinterpret_cast<P*>(sum + row * cols);
      for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
        const P a = xr[c];
        const PL b = rr[c];
        P s;
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          s.v[k] = static_cast<T>(static_cast<M>(a.v[k]) + static_cast<M>(b.v[k]));
        }
        sr[c] = s;
      }
      xr = sr;
    }
    M mean = 0;
    if (!rms) {
      M sum = 0;
      for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
        const P v = xr[c];
#pragma unroll
        for (int k = 0; k < kVec; ++k) sum += static_cast<M>(v.v[k]);
      }
      mean = BlockSum(sum) * inv_cols;
    }
    M squares = 0;
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
      const P v = xr[c];
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const M d = static_cast<M>(v.v[k]) - mean;
        squares += d * d;
      }
    }
    const M rstd = M(1) / math::Sqrt(BlockSum(squares) * inv_cols + eps);
    if (threadIdx.x == 0) {
      if (mean_out != nullptr) mean_out[row] = mean;
      rstd_out[row] = rstd;
    }
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
      const P v = xr[c];
      P wv, bv;
      PL out;
      if (w != nullptr) wv = w[c];
      if (b != nullptr) bv = b[c];
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        M value = (static_cast<M>(v.v[k]) - mean) * rstd;
        if (w != nullptr) value *= static_cast<M>(wv.v[k]);
        if (b != nullptr) value += static_cast<M>(bv.v[k]);
        out.v[k] = static_cast<L>(value);
      }
      yr[c] = out;
    }
  }
}

// Where RowNormBackwardKernel<..., kSums = true> puts its column sums and how its blocks add
// them (Note [One-launch column sums]).
template <typename T>
struct RowNormSums {
  OpMath<T>* partial_w = nullptr;  // [blocks, cols]: each block's sums of dy * xhat
  OpMath<T>* partial_b = nullptr;  // [blocks, cols]: each block's sums of dy
  OpMath<T>* group_w = nullptr;    // [groups, cols]: each group's blocks' sums added
  OpMath<T>* group_b = nullptr;
  int64_t group_size = 1;          // consecutive blocks a group (the last one may have fewer)
  unsigned* semaphores = nullptr;  // [groups + 1], zero: each group's arrivals, then the groups'
  T* dw = nullptr;                 // either may be null
  T* db = nullptr;
};

// out[j] = the sum of the `n` rows of in (row stride `cols`) at column j, for the weight's and the
// bias's sums, by every thread of the block: 32 columns at a time, blockDim.x / 32 lanes per
// column, lane l adding rows l, l + lanes, ... in order, then the lanes added in order through
// `scratch` (2 * blockDim.x of M). A fixed order, so the same bits whatever ran before; and
// loads of several rows in flight per column where one thread per column would wait on each in
// turn. Out is M, or T (rounded once; a null output is skipped).
template <typename M, typename Out>
__device__ void SumRowsInOrder(int64_t n, int64_t cols, const M* in_w, const M* in_b, Out* out_w,
                               Out* out_b, M* scratch) {
  const int lanes = blockDim.x / kWarpSize;
  const int column_lane = threadIdx.x % kWarpSize, row_lane = threadIdx.x / kWarpSize;
  M* lanes_w = scratch;
  M* lanes_b = scratch + blockDim.x;
  for (int64_t tile = 0; tile < cols; tile += kWarpSize) {
    const int64_t j = tile + column_lane;
    M sum_w = 0, sum_b = 0;
    if (j < cols) {
      for (int64_t r = row_lane; r < n; r += lanes) {
        sum_w += in_w[r * cols + j];
        sum_b += in_b[r * cols + j];
      }
    }
    lanes_w[threadIdx.x] = sum_w;
    lanes_b[threadIdx.x] = sum_b;
    __syncthreads();
    if (row_lane == 0 && j < cols) {
      for (int lane = 1; lane < lanes; ++lane) {
        sum_w += lanes_w[lane * kWarpSize + column_lane];
        sum_b += lanes_b[lane * kWarpSize + column_lane];
      }
      if (out_w != nullptr) out_w[j] = static_cast<Out>(sum_w);
      if (out_b != nullptr) out_b[j] = static_cast<Out>(sum_b);
    }
    __syncthreads();  // the lanes' slots are the next tile's
  }
}

// Whether the calling block is the last of `expected` to arrive at *counter, told to the whole
// block; each block calls it once per counter, after its writes that the last one reads. The
// fence before the count makes those writes visible device-wide before the count is; the one
// after it (in the last block) orders the reads that follow after every other block's count.
__device__ bool LastToArrive(unsigned* counter, unsigned expected) {
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(counter, 1u) + 1 == expected;
    __threadfence();
  }
  __syncthreads();
  return last;
}

// grad_x, and with kSums the weight's and bias's gradients in the same pass over dy and x (llm.c's
// LayerNorm backward), kVec elements a thread at a time as RowNormKernel: block blockIdx.x takes
// the rows [blockIdx.x * chunk, + chunk), each with all its threads. With kSums each thread also
// adds dy * xhat and dy of its own columns (the same ones every row: no races, no atomics) into
// shared memory, [2][cols] in M, and the block's sums go to sums.partial_w/partial_b.
//
// Note [One-launch column sums]: the blocks' sums are added in the same launch by the blocks that
// finish last, in a fixed order, so the result has the same bits whichever blocks finish first.
// The blocks form groups of group_size consecutive ones (about sqrt(blocks) groups of
// sqrt(blocks)): the last block of a group to finish adds the group's rows in block order into
// its group row; the last group to finish adds the group rows in group order into dw and db.
// Two levels keep the tail short: one finishing block adding every block's row would read
// blocks x cols alone while the rest of the GPU idles. The counters are the stream's
// (LaunchContext::semaphores, Note [Stream semaphores] in cuda_device.h): zero when the kernel
// starts without a memset launch, because each finishing block puts back to zero the counter it
// completed. dy and dresidual (null, or grad_x rounded to L) are L (Note [Autocast residual norm]).
template <typename T, typename L, int kVec, bool kSums>
__global__ void RowNormBackwardKernel(bool rms, int64_t rows, int64_t cols, int64_t chunk,
                                      const L* dy, const T* dsum, const T* x,
                                      const OpMath<T>* mean_in, const OpMath<T>* rstd_in,
                                      const T* weight, T* dx, L* dresidual, RowNormSums<T> sums) {
  using M = OpMath<T>;
  using P = Pack<T, kVec>;
  using PL = Pack<L, kVec>;
  extern __shared__ unsigned char shared_raw[];
  M* acc_w = reinterpret_cast<M*>(shared_raw);
  M* acc_b = acc_w + cols;
  const M inv_cols = M(1) / static_cast<M>(cols);
  const int64_t chunks = cols / kVec;
  const P* w = reinterpret_cast<const P*>(weight);
  if (kSums) {
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
#pragma unroll
      for (int k = 0; k < kVec; ++k) acc_w[c * kVec + k] = acc_b[c * kVec + k] = M(0);
    }
  }
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * chunk;
  const int64_t end = min(rows, begin + chunk);
  for (int64_t row = begin; row < end; ++row) {
    const P* xr = reinterpret_cast<const P*>(x + row * cols);
    const PL* gr = reinterpret_cast<const PL*>(dy + row * cols);
    P* dxr = reinterpret_cast<P*>(dx + row * cols);
    PL* drr = dresidual == nullptr ? nullptr : reinterpret_cast<PL*>(dresidual + row * cols);
    const P* dsr = dsum == nullptr ? nullptr : reinterpret_cast<const P*>(dsum + row * cols);
    const M mean = rms ? M(0) : mean_in[row];
    const M rstd = rstd_in[row];
    M sum_g = 0, sum_gx = 0;
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
      const P xv = xr[c];
      const PL gv = gr[c];
      P wv;
      if (w != nullptr) wv = w[c];
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const M g = static_cast<M>(gv.v[k]) * (w != nullptr ? static_cast<M>(wv.v[k]) : M(1));
        sum_g += g;
        sum_gx += g * (static_cast<M>(xv.v[k]) - mean) * rstd;
      }
    }
    const M mean_g = rms ? M(0) : BlockSum(sum_g) * inv_cols;
    const M mean_gx = BlockSum(sum_gx) * inv_cols;
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
      const P xv = xr[c];
      const PL gv = gr[c];
      P wv, sv, out;
      PL rounded;
      if (w != nullptr) wv = w[c];
      if (dsr != nullptr) sv = dsr[c];
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const M dyv = static_cast<M>(gv.v[k]);
        const M g = dyv * (w != nullptr ? static_cast<M>(wv.v[k]) : M(1));
        const M xhat = (static_cast<M>(xv.v[k]) - mean) * rstd;
        const M through = dsr != nullptr ? static_cast<M>(sv.v[k]) : M(0);
        const M grad = through + rstd * (g - mean_g - xhat * mean_gx);
        out.v[k] = static_cast<T>(grad);
        rounded.v[k] = static_cast<L>(grad);
        if (kSums) {
          acc_w[c * kVec + k] += dyv * xhat;
          acc_b[c * kVec + k] += dyv;
        }
      }
      dxr[c] = out;
      if (drr != nullptr) drr[c] = rounded;
    }
  }
  if (!kSums) return;
  for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      sums.partial_w[blockIdx.x * cols + c * kVec + k] = acc_w[c * kVec + k];
      sums.partial_b[blockIdx.x * cols + c * kVec + k] = acc_b[c * kVec + k];
    }
  }
  // Note [One-launch column sums]. Past the first barrier of LastToArrive the accumulators are
  // in global memory, so their shared memory is the finishing sums' scratch.
  const int64_t group = blockIdx.x / sums.group_size;
  const int64_t first = group * sums.group_size;
  const int64_t members = min(sums.group_size, static_cast<int64_t>(gridDim.x) - first);
  const int64_t groups = (gridDim.x + sums.group_size - 1) / sums.group_size;
  if (!LastToArrive(&sums.semaphores[group], static_cast<unsigned>(members))) return;
  SumRowsInOrder(members, cols, sums.partial_w + first * cols, sums.partial_b + first * cols,
                 sums.group_w + group * cols, sums.group_b + group * cols, acc_w);
  // Every block of the group has counted: none reads this counter again in this launch.
  if (threadIdx.x == 0) sums.semaphores[group] = 0;
  if (!LastToArrive(&sums.semaphores[groups], static_cast<unsigned>(groups))) return;
  SumRowsInOrder(groups, cols, sums.group_w, sums.group_b, sums.dw, sums.db, acc_w);
  if (threadIdx.x == 0) sums.semaphores[groups] = 0;
}

// RowNormBackwardKernel's launch, one function per instantiation, so that the launcher can pick
// one through a pointer.
template <typename T, typename L, int kVec, bool kSums>
void LaunchRowNormBackwardKernel(const LaunchContext& context, unsigned blocks, int threads,
                                 size_t shared, bool rms, int64_t rows, int64_t cols, int64_t chunk,
                                 const L* dy, const T* dsum, const T* x, const OpMath<T>* mean,
                                 const OpMath<T>* rstd, const T* weight, T* dx, L* dresidual,
                                 const RowNormSums<T>& sums) {
  RowNormBackwardKernel<T, L, kVec, kSums><<<blocks, threads, shared, context.stream>>>(
      rms, rows, cols, chunk, dy, dsum, x, mean, rstd, weight, dx, dresidual, sums);
}

// The elements a thread of the row kernels takes at a time (a Pack) where the rows allow it
// (RowsPack): 8 for the 16-bit floats (one 128-bit access) and for float32 (two), 1 for float64.
// Float32 packs as the 16-bit floats do so that a norm with 16-bit i/o (Note [Autocast residual
// norm]) splits its rows over the same threads, and so adds its sums in the same order, as the
// float32 norm between casts: the two give the same bits on a GPU as on the CPU. (Float32 rows
// are not bound by memory instructions the way 2-byte accesses are; float64's, of 8-byte
// elements, load one at a time.)
template <typename T>
constexpr int kNormVector = sizeof(T) <= 4 ? 8 : 1;
template <typename T, typename L>
constexpr int kNormPairVector = std::max(kNormVector<T>, kNormVector<L>);

// Whether every operand of T (`t_operands`) and of L (`l_operands`) is aligned to a Pack of
// kNormPairVector<T, L> elements and the rows are whole Packs.
template <typename T, typename L>
bool RowsPack(int64_t cols, std::initializer_list<const void*> t_operands,
              std::initializer_list<const void*> l_operands) {
  constexpr int kN = kNormPairVector<T, L>;
  if (kN == 1 || cols % kN != 0) return false;
  for (const void* p : t_operands) {
    if (p != nullptr && !PackAligned<kN>(static_cast<const T*>(p))) return false;
  }
  for (const void* p : l_operands) {
    if (p != nullptr && !PackAligned<kN>(static_cast<const L*>(p))) return false;
  }
  return true;
}

constexpr int kNormColumnTile = 32;    // columns per block of the weight/bias sums
constexpr int kNormRowLanes = 8;       // threads per column, striding over the rows
constexpr int64_t kNormMinChunk = 64;  // rows per block of a split sum: 8 per thread
// The fused backward's column sums live in static-launch shared memory (no opt-in): rows of up to
// 5,888 float (2,944 double) columns; longer ones take the two kernels.
constexpr size_t kNormFusedSharedBytes = 46 * 1024;  // BlockSum's slots fit beside them

// grad_weight and grad_bias over the rows [split * chunk, (split + 1) * chunk) of split
// blockIdx.y: a block per 32 columns and split, 8 threads per column summing every 8th row
// (neighbouring threads read neighbouring columns: coalesced), then the 8 partial sums added
// through shared memory. With one split the block writes dw and db; with more it writes its
// sums to partial_w/partial_b ([splits, cols] in M) and RowNormParamsFinishKernel adds them.
// Splitting the rows is what fills the GPU: GPT-2's 768 columns are 24 blocks otherwise.
template <typename T, typename L>
__global__ void RowNormBackwardParamsKernel(bool rms, int64_t rows, int64_t cols, int64_t chunk,
                                            const L* dy, const T* x, const OpMath<T>* mean_in,
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

// The second pass of a split: the `splits` partial sums of each column added, a block per 32
// columns with 8 threads per column (each the splits s = lane mod 8, in order) whose sums are then
// added lane by lane: a fixed order, so deterministic (no atomics), and 8 loads in flight per
// column where one thread per column would wait on each in turn.
template <typename T>
__global__ void RowNormParamsFinishKernel(int64_t cols, int64_t splits, const OpMath<T>* partial_w,
                                          const OpMath<T>* partial_b, T* dw, T* db) {
  using M = OpMath<T>;
  __shared__ M lanes_w[kNormRowLanes][kNormColumnTile];
  __shared__ M lanes_b[kNormRowLanes][kNormColumnTile];
  const int column_lane = threadIdx.x % kNormColumnTile, row_lane = threadIdx.x / kNormColumnTile;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kNormColumnTile + column_lane;
  M sum_w = 0, sum_b = 0;
  if (j < cols) {
    for (int64_t s = row_lane; s < splits; s += kNormRowLanes) {
      sum_w += partial_w[s * cols + j];
      sum_b += partial_b[s * cols + j];
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

void LaunchRowNorm(const LaunchContext& context, DType dtype, DType io_dtype, bool rms,
                   int64_t rows, int64_t cols, double eps, const void* x, const void* residual,
                   const void* weight, const void* bias, void* y, void* sum, void* mean,
                   void* rstd) {
  DispatchRowNormTypes(dtype, io_dtype, "CUDA RowNorm", [&](auto t_tag, auto l_tag) {
    using T = typename decltype(t_tag)::type;
    using L = typename decltype(l_tag)::type;
    using M = OpMath<T>;
    if (rows == 0 || cols == 0) return;
    const int64_t grid = std::min<int64_t>(rows, static_cast<int64_t>(context.num_sms) * 32);
    internal::RecordLaunchWork("RowNormKernel", grid, rows * cols);
    const T* in = static_cast<const T*>(x);
    const L* r = static_cast<const L*>(residual);
    const T* w = static_cast<const T*>(weight);
    const T* b = static_cast<const T*>(bias);
    L* out = static_cast<L*>(y);
    T* s = static_cast<T*>(sum);
    constexpr int kVec = kNormPairVector<T, L>;
    if (RowsPack<T, L>(cols, {in, w, b, s}, {r, out})) {
      RowNormKernel<T, L, kVec>
          <<<static_cast<int>(grid), RowThreads(cols / kVec), 0, context.stream>>>(
              rms, rows, cols, static_cast<M>(eps), in, r, w, b, out, s, static_cast<M*>(mean),
              static_cast<M*>(rstd));
    } else {
      RowNormKernel<T, L, 1><<<static_cast<int>(grid), RowThreads(cols), 0, context.stream>>>(
          rms, rows, cols, static_cast<M>(eps), in, r, w, b, out, s, static_cast<M*>(mean),
          static_cast<M*>(rstd));
    }
    TANDEM_CUDA_CHECK_LAUNCH(context.device);
    // x read (its later passes hit L1) and y written; the parameters; the saved statistics.
    // About 8 FLOPs an element: the two sums, then centre, scale, weight and bias.
    const double elements = static_cast<double>(rows * cols);
    // With a residual: it is read too and the sum written (its reads back hit L1).
    const double t_bytes =
        ((r != nullptr ? 2 : 1) * elements + cols * ((w != nullptr) + (b != nullptr))) * sizeof(T);
    const double l_bytes = (r != nullptr ? 2 : 1) * elements * sizeof(L);
    DeclareKernelWork(8 * elements + (r != nullptr ? elements : 0),
                      t_bytes + l_bytes + rows * sizeof(M) * (mean != nullptr ? 2 : 1),
                      RooflineMath(sizeof(M)));
  });
}

void LaunchRowNormBackward(const LaunchContext& context, DType dtype, DType io_dtype, bool rms,
                           int64_t rows, int64_t cols, const void* grad_y, const void* grad_sum,
                           const void* x, const void* mean, const void* rstd, const void* weight,
                           void* grad_x, void* grad_residual, void* grad_weight, void* grad_bias) {
  DispatchRowNormTypes(dtype, io_dtype, "CUDA RowNormBackward", [&](auto t_tag, auto l_tag) {
    using T = typename decltype(t_tag)::type;
    using L = typename decltype(l_tag)::type;
    using M = OpMath<T>;
    if (cols == 0) return;
    const L* dy = static_cast<const L*>(grad_y);
    L* dresidual = static_cast<L*>(grad_residual);
    const T* in = static_cast<const T*>(x);
    const M* mean_in = static_cast<const M*>(mean);
    const M* rstd_in = static_cast<const M*>(rstd);
    const T* w = static_cast<const T*>(weight);
    const T* dsum = static_cast<const T*>(grad_sum);
    T* dx = static_cast<T*>(grad_x);
    T* dw = static_cast<T*>(grad_weight);
    T* db = static_cast<T*>(grad_bias);
    const double elements = static_cast<double>(rows * cols);
    const double statistics_bytes = rows * sizeof(M) * (mean_in != nullptr ? 2 : 1);
    constexpr int kVec = kNormPairVector<T, L>;
    const bool pack = RowsPack<T, L>(cols, {dsum, in, w, dx}, {dy, dresidual});
    // The blocks' partial sums of the weight's and bias's gradients added in block order.
    const auto finish = [&](int64_t splits, const M* partial_w, const M* partial_b) {
      const int64_t tiles = (cols + kNormColumnTile - 1) / kNormColumnTile;
      internal::RecordLaunchWork("RowNormParamsFinishKernel", tiles, splits * cols);
      RowNormParamsFinishKernel<T>
          <<<static_cast<unsigned>(tiles), kNormColumnTile * kNormRowLanes, 0, context.stream>>>(
              cols, splits, partial_w, partial_b, dw, db);
      TANDEM_CUDA_CHECK_LAUNCH(context.device);
      DeclareKernelWork(2.0 * splits * cols,
                        2.0 * splits * cols * sizeof(M) + 2.0 * cols * sizeof(T),
                        RooflineMath(sizeof(M)));
    };
    const int threads = RowThreads(pack ? cols / kVec : cols);
    // grad_x, and with `sums` the weight's and bias's gradients (Note [One-launch column sums]),
    // over `blocks` blocks of `chunk` consecutive rows: RowNormBackwardKernel.
    const auto backward = [&](int64_t chunk, int64_t blocks, const RowNormSums<T>* sums,
                              size_t shared) {
      internal::RecordLaunchWork("RowNormBackwardKernel", blocks, rows * cols);
      using Launcher = void (*)(const LaunchContext&, unsigned, int, size_t, bool, int64_t, int64_t,
                                int64_t, const L*, const T*, const T*, const M*, const M*, const T*,
                                T*, L*, const RowNormSums<T>&);
      const Launcher launch =
          pack ? (sums != nullptr ? LaunchRowNormBackwardKernel<T, L, kVec, true>
                                  : LaunchRowNormBackwardKernel<T, L, kVec, false>)
               : (sums != nullptr ? LaunchRowNormBackwardKernel<T, L, 1, true>
                                  : LaunchRowNormBackwardKernel<T, L, 1, false>);
      launch(context, static_cast<unsigned>(blocks), threads, shared, rms, rows, cols, chunk, dy,
             dsum, in, mean_in, rstd_in, w, dx, dresidual,
             sums != nullptr ? *sums : RowNormSums<T>{});
      TANDEM_CUDA_CHECK_LAUNCH(context.device);
    };
    // Rows a block for about `wanted` blocks, and the blocks (none empty at the end).
    const auto split = [&](int64_t wanted) {
      const int64_t chunk = (rows + wanted - 1) / wanted;
      return std::make_pair(chunk, (rows + chunk - 1) / chunk);
    };
    // dy and x read (twice, the second time from L1), dx (and its rounding for a 16-bit
    // residual) written; about 12 FLOPs an element.
    const double backward_flops = 12 * elements;
    const double backward_bytes =
        ((dsum != nullptr ? 3 : 2) * elements + (w != nullptr ? cols : 0)) * sizeof(T) +
        (dresidual != nullptr ? 2 : 1) * elements * sizeof(L) + statistics_bytes;
    if (dx != nullptr && rows > 0 && (dw != nullptr || db != nullptr) &&
        2 * static_cast<size_t>(cols) * sizeof(M) <= kNormFusedSharedBytes) {
      // All three in one launch over a full wave of blocks (Note [One-launch column sums]).
      TANDEM_CHECK(context.semaphores != nullptr,
                   "CUDA RowNormBackward: the launch context has no stream semaphores, which the "
                   "one-launch weight and bias gradients count on; expected the LaunchContext of "
                   "CudaDevice::Launch() (or set LaunchContext::semaphores to the stream's)");
      const int64_t wave = std::min<int64_t>(
          rows, static_cast<int64_t>(context.num_sms) * std::max(1, kThreadsPerSm / threads));
      const auto [chunk, blocks] = split(wave);
      // About sqrt(blocks) groups of about sqrt(blocks) blocks, so that each of the two finishing
      // steps adds about sqrt(blocks) rows; one counter a group and one for the groups.
      const int64_t wanted_groups = std::min<int64_t>(
          kStreamSemaphores - 1,
          static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(blocks)))));
      RowNormSums<T> sums;
      sums.group_size = (blocks + wanted_groups - 1) / wanted_groups;
      const int64_t groups = (blocks + sums.group_size - 1) / sums.group_size;
      // Returned to the allocator at the end of this scope while the kernel may be queued: safe,
      // as it is handed out again only to later work on this stream.
      const std::shared_ptr<void> partials =
          context.workspace->Allocate(2 * (blocks + groups) * cols * sizeof(M));
      sums.partial_w = static_cast<M*>(partials.get());
      sums.partial_b = sums.partial_w + blocks * cols;
      sums.group_w = sums.partial_b + blocks * cols;
      sums.group_b = sums.group_w + groups * cols;
      sums.semaphores = context.semaphores;
      sums.dw = dw;
      sums.db = db;
      // The column sums while the rows run; then the finishing sums' lanes (SumRowsInOrder),
      // which may need more for short rows.
      const size_t shared = 2 * std::max<size_t>(cols, threads) * sizeof(M);
      backward(chunk, blocks, &sums, shared);
      // With the sums: 4 FLOPs more an element; each block's sums written and read back, then
      // each group's, and the gradients written; an add for each of those reads.
      const double sum_rows = static_cast<double>(blocks + groups);
      DeclareKernelWork(backward_flops + 4 * elements + 2.0 * sum_rows * cols,
                        backward_bytes + 4.0 * sum_rows * cols * sizeof(M) +
                            ((dw != nullptr) + (db != nullptr)) * cols * sizeof(T),
                        RooflineMath(sizeof(M)));
      return;
    }
    if (dx != nullptr && rows > 0) {
      const auto [chunk, blocks] =
          split(std::min<int64_t>(rows, static_cast<int64_t>(context.num_sms) * 32));
      backward(chunk, blocks, nullptr, 0);
      DeclareKernelWork(backward_flops, backward_bytes, RooflineMath(sizeof(M)));
    }
    if (dw != nullptr || db != nullptr) {
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
      RowNormBackwardParamsKernel<T, L>
          <<<dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(splits)),
             kNormColumnTile * kNormRowLanes, 0, context.stream>>>(
              rms, rows, cols, chunk, dy, in, mean_in, rstd_in, dw, db, partial_w, partial_b);
      TANDEM_CUDA_CHECK_LAUNCH(context.device);
      // dy and x read once, a sum per split and column written; 5 FLOPs an element.
      DeclareKernelWork(5 * elements,
                        elements * (sizeof(T) + sizeof(L)) + statistics_bytes +
                            2.0 * splits * cols * (splits > 1 ? sizeof(M) : sizeof(T)),
                        RooflineMath(sizeof(M)));
      if (splits > 1) finish(splits, partial_w, partial_b);
    }
  });
}

}  // namespace cuda
}  // namespace tandem
