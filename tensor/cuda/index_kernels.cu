// Gather and scatter-add, of one column per row or along an axis (kernels.h). Scatter-add
// runs 16-bit dtypes through float copies (Note [16-bit via float], internal/float_copies.cuh).
// Indices are range-checked on the device (Note [Device-side index checks], kernels.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>

#include "tensor/base/error.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/internal/float_copies.cuh"
#include "tensor/cuda/internal/launch_utils.cuh"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/launch_work.h"
#include "tools/cuda/device_counters.h"

namespace tandem {
namespace cuda {
namespace {

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

// ---- Scatter-add as a sorted segmented sum ---------------------------------------------------
// Note [Sorted scatter-add]: an embedding's backward scatters [tokens, C] gradient rows into
// [V, C] with an index that is the same along C (index_select's, expanded). ScatterAddKernel
// has then only C threads (3 blocks for GPT-2's 768), each adding every token's row in turn.
// Instead the positions j of each outer slice are sorted by (index, j) (SortPositionsKernel:
// each position's rank is the number of keys before it, a quadratic count that is cheap for
// the few thousand tokens of a batch and needs no sort library), and a thread per (sorted
// position, column) that starts a run of equal indices adds that run's rows in j order
// (SegmentSumKernel): tokens x C threads, and each destination element receives exactly the
// additions the CPU makes, in the CPU's order, so the result is the CPU's to the bit. An index
// that differs along the inner axis (torch.gather's general backward) is seen on the device
// (`varies`), and the same launch then adds column by column in j order as ScatterAddKernel.

// Rank of each position j of outer slice o among its slice's keys (idx[o, j, 0], j), written
// as order[o, rank] = j, by a warp per position: its lanes count a stripe of the keys each
// (then add their counts) and compare row j's index along the inner axis (coalesced), setting
// varies[o] if it is not the same everywhere.
__global__ void SortPositionsKernel(const int64_t* idx, int64_t outer, int64_t idx_dim,
                                    int64_t inner, int64_t* order, int* varies) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t warps = GridThreads() / kWarpSize;
  for (int64_t item = GlobalThread() / kWarpSize; item < outer * idx_dim; item += warps) {
    const int64_t o = item / idx_dim, j = item % idx_dim;
    const int64_t* slice = idx + o * idx_dim * inner;
    const int64_t key = slice[j * inner];
    int64_t rank = 0;
    for (int64_t k = lane; k < idx_dim; k += kWarpSize) {
      const int64_t other = slice[k * inner];
      rank += other < key || (other == key && k < j);
    }
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
      rank += __shfl_down_sync(kFullMask, rank, offset);
    }
    if (lane == 0) order[o * idx_dim + rank] = j;
    for (int64_t i = lane; i < inner; i += kWarpSize) {
      // Every writer stores the same 1: the result does not depend on their order.
      if (slice[j * inner + i] != key) varies[o] = 1;
    }
  }
}

// Blocks of 128 threads (4 warps, 4 positions) for SortPositionsKernel: a batch of 2048 tokens
// is then 512 blocks.
constexpr int kSortThreads = 128;

// A thread per (o, sorted position p, column i); see Note [Sorted scatter-add].
template <typename Acc, typename T>
__global__ void SegmentSumKernel(Acc* dst, const T* src, const int64_t* idx, const int64_t* order,
                                 const int* varies, int64_t outer, int64_t dst_dim, int64_t idx_dim,
                                 int64_t inner) {
  const int64_t n = outer * idx_dim * inner;
  for (int64_t item = GlobalThread(); item < n; item += GridThreads()) {
    const int64_t i = item % inner, p = (item / inner) % idx_dim, o = item / (idx_dim * inner);
    const int64_t* slice = idx + o * idx_dim * inner;
    if (varies[o] != 0) {
      if (p != 0) continue;  // the column's one thread, as ScatterAddKernel
      for (int64_t j = 0; j < idx_dim; ++j) {
        const int64_t at = (o * idx_dim + j) * inner + i;
        if (!IndexInRange(idx[at], dst_dim, nullptr, 0)) continue;
        dst[(o * dst_dim + idx[at]) * inner + i] += static_cast<Acc>(src[at]);
      }
      continue;
    }
    const int64_t* positions = order + o * idx_dim;
    const int64_t v = slice[positions[p] * inner];
    if (p > 0 && slice[positions[p - 1] * inner] == v) continue;  // not the run's start
    if (!IndexInRange(v, dst_dim, nullptr, 0)) continue;
    Acc& element = dst[(o * dst_dim + v) * inner + i];
    Acc sum = element;
    for (int64_t q = p; q < idx_dim && slice[positions[q] * inner] == v; ++q) {
      sum += static_cast<Acc>(src[(o * idx_dim + positions[q]) * inner + i]);
    }
    element = sum;
  }
}

// Whether the sorted segmented sum pays: ScatterAddKernel's thread per column would leave the
// GPU idle, and the quadratic ranking stays small (2^28 key comparisons: 16384 tokens).
bool UseSortedScatterAdd(const LaunchContext& context, int64_t outer, int64_t idx_dim,
                         int64_t inner) {
  const int64_t gpu_threads = static_cast<int64_t>(context.num_sms) * kThreadsPerSm;
  return idx_dim > 1 && outer * inner < gpu_threads &&
         outer * idx_dim <= (int64_t{1} << 28) / idx_dim;
}

// The work of a scatter-add pass: each of the outer * idx_dim * inner values read (T) and added
// into its destination (Acc, read and written); an index per (outer, position).
template <typename Acc, typename T>
void DeclareScatterWork(int64_t outer, int64_t idx_dim, int64_t inner) {
  const double elements = static_cast<double>(outer * idx_dim * inner);
  DeclareKernelWork(elements,
                    elements * (sizeof(T) + 2 * sizeof(Acc)) +
                        static_cast<double>(outer * idx_dim) * sizeof(int64_t),
                    RooflineMath(sizeof(Acc)));
}

// ScatterAddKernel's result, through the sorted segmented sum when it pays. Acc* dst is T's
// destination or its float copy (16-bit T).
template <typename Acc, typename T>
void ScatterAddInto(const LaunchContext& context, Acc* dst, const T* src, const int64_t* idx,
                    int64_t outer, int64_t dst_dim, int64_t idx_dim, int64_t inner) {
  const int64_t elements = outer * idx_dim * inner;
  if (!UseSortedScatterAdd(context, outer, idx_dim, inner)) {
    const int grid = GridFor(context, outer * inner);
    internal::RecordLaunchWork("ScatterAddKernel", grid, elements);
    ScatterAddKernel<Acc, T>
        <<<grid, kThreads, 0, context.stream>>>(dst, src, idx, outer, dst_dim, idx_dim, inner);
    TANDEM_CUDA_CHECK_LAUNCH(context.device);
    // Each value read and added into its destination (read and written); the indices once.
    DeclareScatterWork<Acc, T>(outer, idx_dim, inner);
    return;
  }
  // Returned to the allocator at the end of this scope while the kernels may be queued: safe,
  // as it is handed out again only to later work on this stream.
  const std::shared_ptr<void> order =
      context.workspace->Allocate(outer * idx_dim * sizeof(int64_t));
  const std::shared_ptr<void> varies = context.workspace->Allocate(outer * sizeof(int));
  int64_t* order_data = static_cast<int64_t*>(order.get());
  int* varies_data = static_cast<int*>(varies.get());
  TANDEM_CUDA_CHECK(cudaMemsetAsync(varies_data, 0, outer * sizeof(int), context.stream),
                    context.device);
  // Work: the key comparisons and the index reads.
  const int sort_grid = GridFor(context, outer * idx_dim * kWarpSize, kSortThreads);
  internal::RecordLaunchWork("SortPositionsKernel", sort_grid, outer * idx_dim * (idx_dim + inner));
  SortPositionsKernel<<<sort_grid, kSortThreads, 0, context.stream>>>(idx, outer, idx_dim, inner,
                                                                      order_data, varies_data);
  TANDEM_CUDA_CHECK_LAUNCH(context.device);
  // A key comparison per pair of positions (from cache); the indices read, the order written.
  DeclareKernelWork(static_cast<double>(outer * idx_dim) * idx_dim,
                    2.0 * outer * idx_dim * sizeof(int64_t) + outer * sizeof(int));
  const int grid = GridFor(context, elements);
  internal::RecordLaunchWork("SegmentSumKernel", grid, elements);
  SegmentSumKernel<Acc, T><<<grid, kThreads, 0, context.stream>>>(
      dst, src, idx, order_data, varies_data, outer, dst_dim, idx_dim, inner);
  TANDEM_CUDA_CHECK_LAUNCH(context.device);
  DeclareScatterWork<Acc, T>(outer, idx_dim, inner);
}

}  // namespace

void LaunchGatherColumns(const LaunchContext& context, DType dtype, void* dst, const void* src,
                         const int64_t* idx, int64_t rows, int64_t cols, DeviceAssert* check,
                         const char* op) {
  DispatchAllFloatingTypes(dtype, "CUDA GatherColumns", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (rows <= 0) return;
    internal::RecordLaunchWork("GatherColumnsKernel", GridFor(context, rows), rows);
    GatherColumnsKernel<T><<<GridFor(context, rows), kThreads, 0, context.stream>>>(
        static_cast<T*>(dst), static_cast<const T*>(src), idx, rows, cols, check,
        reinterpret_cast<unsigned long long>(op));
    TANDEM_CUDA_CHECK_LAUNCH(context.device);
    // An index and a value read and a value written a row.
    DeclareKernelWork(0, static_cast<double>(rows) * (sizeof(int64_t) + 2 * sizeof(T)));
  });
}

void LaunchScatterAddColumns(const LaunchContext& context, DType dtype, void* dst, const void* src,
                             const int64_t* idx, int64_t rows, int64_t cols) {
  DispatchAllFloatingTypes(dtype, "CUDA ScatterAddColumns", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (rows <= 0) return;
    internal::RecordLaunchWork("ScatterAddColumnsKernel", GridFor(context, rows), rows);
    ScatterAddColumnsKernel<T><<<GridFor(context, rows), kThreads, 0, context.stream>>>(
        static_cast<T*>(dst), static_cast<const T*>(src), idx, rows, cols);
    TANDEM_CUDA_CHECK_LAUNCH(context.device);
    // An index and a value read and one destination value read and written a row.
    DeclareKernelWork(static_cast<double>(rows),
                      static_cast<double>(rows) * (sizeof(int64_t) + 3 * sizeof(T)));
  });
}

void LaunchGather(const LaunchContext& context, DType dtype, void* dst, const void* src,
                  const int64_t* idx, int64_t outer, int64_t src_dim, int64_t idx_dim,
                  int64_t inner, DeviceAssert* check, const char* op) {
  DispatchAllFloatingTypes(dtype, "CUDA Gather", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t n = outer * idx_dim * inner;
    if (n <= 0) return;
    internal::RecordLaunchWork("GatherKernel", GridFor(context, n), n);
    GatherKernel<T><<<GridFor(context, n), kThreads, 0, context.stream>>>(
        static_cast<T*>(dst), static_cast<const T*>(src), idx, outer, src_dim, idx_dim, inner,
        check, reinterpret_cast<unsigned long long>(op));
    TANDEM_CUDA_CHECK_LAUNCH(context.device);
    // Each element read and written; an index per (outer, position).
    DeclareKernelWork(0,
                      2.0 * n * sizeof(T) + static_cast<double>(outer * idx_dim) * sizeof(int64_t));
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
      ScatterAddInto(context, static_cast<float*>(wide.get()), values, idx, outer, dst_dim, idx_dim,
                     inner);
      NarrowInto(context, static_cast<T*>(dst), wide.get(), n);
    } else {
      ScatterAddInto(context, static_cast<T*>(dst), values, idx, outer, dst_dim, idx_dim, inner);
    }
  });
}

}  // namespace cuda
}  // namespace tandem
