// Reductions (LaunchReduce of kernels.h): sum, max, min, argmax and argmin over the middle
// axis of [outer, reduce, inner].
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "tensor/base/error.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/internal/launch_utils.cuh"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/launch_work.h"

namespace tandem {
namespace cuda {
namespace {

// ---- Reductions -------------------------------------------------------------------------
// The input is [outer, reduce, inner]. Each output element is reduced by one warp when
// inner == 1 and rows are long (a row is contiguous: the 32 lanes read 32 neighbours, then
// combine with shuffles) and by one thread otherwise (neighbouring threads take neighbouring
// columns, so their reads coalesce). When there are too few outputs to fill the GPU — a full sum,
// or a sum over the batch of a small tensor — the reduced axis is cut into `splits`
// chunks: a first pass writes [outer, splits, inner] partial results to a workspace and a
// second pass reduces those. Float32 sums accumulate in double like the CPU's, so both
// agree closely whatever the order of the additions.

template <typename T>
__device__ __forceinline__ bool IsNan(T x) {
  if constexpr (std::is_floating_point_v<T>) {
    return isnan(x);
  } else {
    return false;
  }
}

template <typename T>
__device__ __forceinline__ T Lowest() {
  if constexpr (std::is_floating_point_v<T>) {
    return -INFINITY;
  } else {
    return std::numeric_limits<T>::lowest();
  }
}

template <typename T>
__device__ __forceinline__ T Highest() {
  if constexpr (std::is_floating_point_v<T>) {
    return INFINITY;
  } else {
    return std::numeric_limits<T>::max();
  }
}

constexpr int64_t kNoIndex = std::numeric_limits<int64_t>::max();

// A running sum, or a running extremum and where it was found.
template <typename Acc>
struct Partial {
  Acc value;
  int64_t index;
};

__device__ __forceinline__ bool IsMax(ReduceKind op) {
  return op == ReduceKind::kMax || op == ReduceKind::kArgMax;
}

template <typename Acc>
__device__ __forceinline__ Partial<Acc> Identity(ReduceKind op) {
  if (op == ReduceKind::kSum) return {Acc(0), kNoIndex};
  return {IsMax(op) ? Lowest<Acc>() : Highest<Acc>(), kNoIndex};
}

// The CPU's rule made order-independent: NaN beats any number, the larger (max) or smaller
// (min) value wins, and among equals (or NaNs) the smaller index wins. The result is the
// same however the elements are split between lanes, warps and passes.
template <typename Acc>
__device__ __forceinline__ void Combine(ReduceKind op, Partial<Acc>& best, Acc value,
                                        int64_t index) {
  if (op == ReduceKind::kSum) {
    best.value += value;
    return;
  }
  bool replace;
  if (IsNan(value)) {
    replace = !IsNan(best.value) || index < best.index;
  } else if (IsNan(best.value)) {
    replace = false;
  } else if (value == best.value) {
    replace = index < best.index;
  } else {
    replace = IsMax(op) ? value > best.value : value < best.value;
  }
  if (replace) {
    best.value = value;
    best.index = index;
  }
}

template <typename Acc>
__device__ __forceinline__ void WarpCombine(ReduceKind op, Partial<Acc>& partial) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const Acc value = __shfl_down_sync(kFullMask, partial.value, offset);
    const int64_t index = __shfl_down_sync(kFullMask, partial.index, offset);
    Combine(op, partial, value, index);
  }
}

// One warp per (row, split) of a [rows, reduce] input (inner == 1).
template <typename In, typename Acc, typename Out>
__global__ void ReduceRowsKernel(ReduceKind op, const In* src, const int64_t* src_index,
                                 int64_t rows, int64_t reduce, int64_t splits, int64_t chunk,
                                 Out* dst_value, int64_t* dst_index) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t warps = GridThreads() / kWarpSize;
  for (int64_t item = GlobalThread() / kWarpSize; item < rows * splits; item += warps) {
    const int64_t row = item / splits;
    const int64_t begin = (item % splits) * chunk;
    const int64_t end = min(reduce, begin + chunk);
    const int64_t base = row * reduce;
    Partial<Acc> partial = Identity<Acc>(op);
    for (int64_t r = begin + lane; r < end; r += kWarpSize) {
      Combine(op, partial, static_cast<Acc>(src[base + r]),
              src_index != nullptr ? src_index[base + r] : r);
    }
    WarpCombine(op, partial);
    if (lane == 0) {
      if (dst_value != nullptr) dst_value[item] = static_cast<Out>(partial.value);
      if (dst_index != nullptr) dst_index[item] = partial.index;
    }
  }
}

// One thread per (outer, split, inner) output of an [outer, reduce, inner] input.
template <typename In, typename Acc, typename Out>
__global__ void ReduceColumnsKernel(ReduceKind op, const In* src, const int64_t* src_index,
                                    int64_t outer, int64_t reduce, int64_t inner, int64_t splits,
                                    int64_t chunk, Out* dst_value, int64_t* dst_index) {
  for (int64_t item = GlobalThread(); item < outer * splits * inner; item += GridThreads()) {
    const int64_t column = item % inner;
    const int64_t split = (item / inner) % splits;
    const int64_t o = item / (inner * splits);
    const int64_t begin = split * chunk;
    const int64_t end = min(reduce, begin + chunk);
    Partial<Acc> partial = Identity<Acc>(op);
    for (int64_t r = begin; r < end; ++r) {
      const int64_t at = (o * reduce + r) * inner + column;
      Combine(op, partial, static_cast<Acc>(src[at]), src_index != nullptr ? src_index[at] : r);
    }
    if (dst_value != nullptr) dst_value[item] = static_cast<Out>(partial.value);
    if (dst_index != nullptr) dst_index[item] = partial.index;
  }
}

// A warp per output for contiguous rows long enough to keep its lanes busy; a thread per
// output otherwise (short rows: a warp then reads 32 neighbouring rows, which coalesces
// through L1 as well).
bool UseWarpPerOutput(int64_t reduce, int64_t inner) { return inner == 1 && reduce >= kWarpSize; }

// One pass: reduces each `chunk` of the reduced axis (`splits` of them), writing [outer,
// splits, inner] values and/or indices. With src_index, the index of element r is
// src_index[...] (the second pass of a split reduction), else r itself. `second_pass` only
// names the launch in the launch-work record (launch_work.h).
template <typename In, typename Acc, typename Out>
void ReducePass(const LaunchContext& context, ReduceKind op, const In* src,
                const int64_t* src_index, int64_t outer, int64_t reduce, int64_t inner,
                int64_t splits, int64_t chunk, Out* dst_value, int64_t* dst_index,
                bool second_pass = false) {
  if (UseWarpPerOutput(reduce, inner)) {
    const int64_t threads = outer * splits * kWarpSize;
    const int grid = GridFor(context, threads);
    internal::RecordLaunchWork(second_pass ? "ReduceRowsKernel (second pass)" : "ReduceRowsKernel",
                               grid, outer * reduce);
    ReduceRowsKernel<In, Acc, Out><<<grid, kThreads, 0, context.stream>>>(
        op, src, src_index, outer, reduce, splits, chunk, dst_value, dst_index);
  } else {
    const int64_t threads = outer * splits * inner;
    const int grid = GridFor(context, threads);
    internal::RecordLaunchWork(
        second_pass ? "ReduceColumnsKernel (second pass)" : "ReduceColumnsKernel", grid,
        outer * reduce * inner);
    ReduceColumnsKernel<In, Acc, Out><<<grid, kThreads, 0, context.stream>>>(
        op, src, src_index, outer, reduce, inner, splits, chunk, dst_value, dst_index);
  }
  TANDEM_CUDA_CHECK_LAUNCH(context.device);
}

// How many chunks to cut the reduced axis into: enough that the first pass keeps every SM
// busy (a bias gradient, [rows, 768] summed over its rows, has only 768 outputs: 3 blocks
// without a split), with chunks long enough that the second pass stays small: 16 rows for a
// thread per output (a column's thread then still reads 16 values for each one the second
// pass reads), 256 elements (8 per lane) for a warp per output.
int64_t ChooseSplits(const LaunchContext& context, int64_t outputs, int64_t reduce, int64_t inner) {
  const bool warp = UseWarpPerOutput(reduce, inner);
  const int64_t min_chunk = warp ? 256 : 16;
  const int64_t busy_threads = outputs * (warp ? kWarpSize : 1);
  const int64_t gpu_threads = static_cast<int64_t>(context.num_sms) * kThreadsPerSm;
  if (busy_threads >= gpu_threads || reduce < 2 * min_chunk) return 1;
  const int64_t wanted = (gpu_threads + busy_threads - 1) / busy_threads;
  return std::max<int64_t>(1, std::min(wanted, reduce / min_chunk));
}

template <typename In, typename Acc>
void ReduceTyped(const LaunchContext& context, ReduceKind op, void* dst, const In* src,
                 int64_t outer, int64_t reduce, int64_t inner) {
  const bool arg = op == ReduceKind::kArgMax || op == ReduceKind::kArgMin;
  In* dst_value = arg ? nullptr : static_cast<In*>(dst);
  int64_t* dst_index = arg ? static_cast<int64_t*>(dst) : nullptr;
  int64_t splits = ChooseSplits(context, outer * inner, reduce, inner);
  if (splits == 1) {
    ReducePass<In, Acc, In>(context, op, src, nullptr, outer, reduce, inner, 1, reduce, dst_value,
                            dst_index);
    return;
  }
  const int64_t chunk = (reduce + splits - 1) / splits;
  splits = (reduce + chunk - 1) / chunk;  // no empty chunk at the end
  // The workspace goes back to the allocator when this function returns, while the passes
  // may still be queued: that is safe because the allocator hands it out again only to
  // work on this same stream, which runs after them.
  const int64_t partials = outer * splits * inner;
  std::shared_ptr<void> values = context.workspace->Allocate(partials * sizeof(Acc));
  std::shared_ptr<void> indices =
      arg ? context.workspace->Allocate(partials * sizeof(int64_t)) : nullptr;
  Acc* partial_values = static_cast<Acc*>(values.get());
  int64_t* partial_indices = static_cast<int64_t*>(indices.get());
  ReducePass<In, Acc, Acc>(context, op, src, nullptr, outer, reduce, inner, splits, chunk,
                           partial_values, partial_indices);
  ReducePass<Acc, Acc, In>(context, op, partial_values, partial_indices, outer, splits, inner, 1,
                           splits, dst_value, dst_index, /*second_pass=*/true);
}

}  // namespace

void LaunchReduce(const LaunchContext& context, ReduceKind op, const KernelTensor& dst,
                  const KernelTensor& src, int64_t outer, int64_t reduce, int64_t inner) {
  if (outer * inner == 0) return;
  if (reduce == 0) return LaunchFill(context, dst, 0.0);  // an empty sum
  DispatchDType(src.dtype, "CUDA Reduce", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_integral_v<T>) {
      // Integers and bool in int64: exact extrema, and sums that wrap around in T's width
      // when narrowed (bool: any nonzero is true) without signed overflow along the way.
      return ReduceTyped<T, int64_t>(context, op, dst.data, src.ptr<const T>(), outer, reduce,
                                     inner);
    } else {
      if constexpr (std::is_same_v<T, float>) {
        // float32 sums accumulate in double (as on the CPU); extrema are exact in float.
        if (op == ReduceKind::kSum) {
          return ReduceTyped<float, double>(context, op, dst.data, src.ptr<const float>(), outer,
                                            reduce, inner);
        }
      }
      // 16-bit floats in float (sums and extrema; an extremum is exact and narrows to the
      // element it came from), float64 in double.
      ReduceTyped<T, OpMath<T>>(context, op, dst.data, src.ptr<const T>(), outer, reduce, inner);
    }
  });
}

}  // namespace cuda
}  // namespace tandem
