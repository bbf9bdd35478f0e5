// CUDA kernels for CudaBackend. See kernels.h for the contract.
//
// Shapes used throughout:
//   - Elementwise kernels are grid-stride loops over the output's elements: a grid of a
//     few blocks per SM covers any size, and each thread walks the tensor in steps of the
//     whole grid so that neighbouring threads touch neighbouring elements (coalesced).
//   - Contiguous float32 operands that are 16-byte aligned go four at a time through
//     float4 loads and stores, which halves the memory instructions of a bandwidth-bound
//     loop; the last n % 4 elements take a scalar tail.
//   - Anything else takes a strided path: dimensions are merged where every operand is
//     contiguous across them (as in the CPU backend), then each thread turns its linear
//     index into an offset per operand. Index arithmetic is 32-bit whenever every offset
//     fits, because 64-bit division is emulated on the GPU and would dominate the loop.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>

#include "tensor/base/error.h"
#include "tensor/base/philox.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/kernels.h"
#include "tensor/kernels/internal/elementwise_math.h"
#include "tensor/kernels/internal/pooling_math.h"
#include "tensor/kernels/internal/strided_layout.h"

namespace tandem {
namespace cuda {
namespace {

constexpr int kThreads = 256;  // threads per block for grid-stride kernels
constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;
// Resident threads per SM on Hopper (and Ampere): 2048, i.e. 8 blocks of 256.
constexpr int kThreadsPerSm = 2048;

// Blocks for a grid-stride loop over `items`: enough to cover them, at most two waves of
// fully occupied SMs (more blocks only add scheduling overhead).
int GridFor(const LaunchContext& context, int64_t items, int threads = kThreads) {
  const int64_t needed = (items + threads - 1) / threads;
  const int64_t cap = static_cast<int64_t>(context.num_sms) * (kThreadsPerSm / threads) * 2;
  return static_cast<int>(std::max<int64_t>(1, std::min(needed, cap)));
}

__device__ __forceinline__ int64_t GlobalThread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t GridThreads() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// ---- Strided layouts ------------------------------------------------------------------

// StridedLayout in the kernel's index type; passed to kernels by value.
template <int kArity, typename Index>
struct DeviceLayout {
  int ndim;
  Index sizes[kMaxDims];
  Index strides[kArity][kMaxDims];

  // Offsets in each operand of the element with row-major linear index `i`. The loop is
  // unrolled over kMaxDims so that every array index is a constant: indexing the kernel's
  // parameters with a runtime value would make the compiler copy them to local memory.
  __device__ __forceinline__ void Offsets(Index i, Index (&offsets)[kArity]) const {
#pragma unroll
    for (int a = 0; a < kArity; ++a) offsets[a] = 0;
#pragma unroll
    for (int d = kMaxDims - 1; d >= 0; --d) {
      if (d >= ndim) continue;
      const Index coordinate = i % sizes[d];
      i /= sizes[d];
#pragma unroll
      for (int a = 0; a < kArity; ++a) offsets[a] += coordinate * strides[a][d];
    }
  }
};

template <typename Index, int kArity>
DeviceLayout<kArity, Index> ToDevice(const StridedLayout<kArity>& host) {
  DeviceLayout<kArity, Index> layout;
  layout.ndim = host.ndim;
  for (int d = 0; d < kMaxDims; ++d) {
    layout.sizes[d] = static_cast<Index>(host.sizes[d]);
    for (int a = 0; a < kArity; ++a) layout.strides[a][d] = static_cast<Index>(host.strides[a][d]);
  }
  return layout;
}

// ---- Elementwise functors ---------------------------------------------------------------
// Note [16-bit elementwise]: bfloat16 and float16 load as float, compute the float function
// (OpMath<T>) and round once on store, so each result is bitwise the float32 kernel's on the
// widened inputs, rounded: what the CPU backend computes. Integer and bool types go through
// ApplyUnary's integer overload in int64 and narrow on store (two's complement wrap-around,
// nonzero -> true for bool), as PyTorch's integer arithmetic does.

// The scalar a Unary op takes for T: OpMath<T> for floating types (float for the 16-bit ones,
// as PyTorch keeps a Python scalar in opmath), double for the integral types.
template <typename T>
using UnaryScalar = std::conditional_t<std::is_integral_v<T>, double, OpMath<T>>;

template <typename T>
struct UnaryFn {
  UnaryOp op;
  UnaryScalar<T> scalar;
  __device__ __forceinline__ T operator()(T x) const {
    if constexpr (std::is_integral_v<T>) {
      return static_cast<T>(ApplyUnary(op, static_cast<int64_t>(x), scalar));
    } else {
      return static_cast<T>(ApplyUnary(op, static_cast<OpMath<T>>(x), scalar));
    }
  }
};

// Copy's conversions: to bool, nonzero (NaN included) is true; to or from a 16-bit float,
// through float (its constructor from float rounds to nearest even; from double or int64 it
// rounds to float first, as PyTorch's c10::BFloat16 and c10::Half do); otherwise C++'s own.
template <typename To, typename From>
struct ConvertFn {
  __device__ __forceinline__ To operator()(From x) const {
    if constexpr (std::is_same_v<To, bool>) {
      return static_cast<OpMath<From>>(x) != OpMath<From>(0);
    } else if constexpr (kIsReducedFloat<To> || kIsReducedFloat<From>) {
      return static_cast<To>(static_cast<float>(x));
    } else {
      return static_cast<To>(x);
    }
  }
};

// Out is T, or bool for a comparison into a kBool output (ApplyBinary's 1 or 0 as bool).
template <typename T, typename Out>
struct BinaryFn {
  BinaryOp op;
  __device__ __forceinline__ Out operator()(T a, T b) const {
    using M = OpMath<T>;
    return static_cast<Out>(ApplyBinary(op, static_cast<M>(a), static_cast<M>(b)));
  }
};

// ---- Elementwise kernels ----------------------------------------------------------------
// Map0 writes a value, Map1 maps one input, Map2 combines two. Each has a contiguous
// kernel, a float4 kernel for aligned contiguous float32, and a strided kernel.

template <typename T>
__global__ void FillContiguousKernel(T* dst, int64_t n, T value) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) dst[i] = value;
}

__global__ void FillContiguousVec4Kernel(float* dst, int64_t n, float value) {
  const int64_t n4 = n / 4;
  const float4 v = make_float4(value, value, value, value);
  float4* dst4 = reinterpret_cast<float4*>(dst);
  for (int64_t i = GlobalThread(); i < n4; i += GridThreads()) dst4[i] = v;
  for (int64_t i = 4 * n4 + GlobalThread(); i < n; i += GridThreads()) dst[i] = value;
}

template <typename T, typename Index>
__global__ void FillStridedKernel(T* dst, DeviceLayout<1, Index> layout, Index n, T value) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    Index offsets[1];
    layout.Offsets(static_cast<Index>(i), offsets);
    dst[offsets[0]] = value;
  }
}

template <typename Out, typename In, typename Fn>
__global__ void Map1ContiguousKernel(Out* dst, const In* src, int64_t n, Fn fn) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) dst[i] = fn(src[i]);
}

template <typename Fn>
__global__ void Map1Vec4Kernel(float* dst, const float* src, int64_t n, Fn fn) {
  const int64_t n4 = n / 4;
  const float4* src4 = reinterpret_cast<const float4*>(src);
  float4* dst4 = reinterpret_cast<float4*>(dst);
  for (int64_t i = GlobalThread(); i < n4; i += GridThreads()) {
    const float4 x = src4[i];
    dst4[i] = make_float4(fn(x.x), fn(x.y), fn(x.z), fn(x.w));
  }
  for (int64_t i = 4 * n4 + GlobalThread(); i < n; i += GridThreads()) dst[i] = fn(src[i]);
}

template <typename Out, typename In, typename Fn, typename Index>
__global__ void Map1StridedKernel(Out* dst, const In* src, DeviceLayout<2, Index> layout, Index n,
                                  Fn fn) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    Index offsets[2];
    layout.Offsets(static_cast<Index>(i), offsets);
    dst[offsets[0]] = fn(src[offsets[1]]);
  }
}

template <typename Out, typename T, typename Fn>
__global__ void Map2ContiguousKernel(Out* dst, const T* a, const T* b, int64_t n, Fn fn) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) dst[i] = fn(a[i], b[i]);
}

template <typename Fn>
__global__ void Map2Vec4Kernel(float* dst, const float* a, const float* b, int64_t n, Fn fn) {
  const int64_t n4 = n / 4;
  const float4* a4 = reinterpret_cast<const float4*>(a);
  const float4* b4 = reinterpret_cast<const float4*>(b);
  float4* dst4 = reinterpret_cast<float4*>(dst);
  for (int64_t i = GlobalThread(); i < n4; i += GridThreads()) {
    const float4 x = a4[i];
    const float4 y = b4[i];
    dst4[i] = make_float4(fn(x.x, y.x), fn(x.y, y.y), fn(x.z, y.z), fn(x.w, y.w));
  }
  for (int64_t i = 4 * n4 + GlobalThread(); i < n; i += GridThreads()) dst[i] = fn(a[i], b[i]);
}

template <typename Out, typename T, typename Fn, typename Index>
__global__ void Map2StridedKernel(Out* dst, const T* a, const T* b, DeviceLayout<3, Index> layout,
                                  Index n, Fn fn) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    Index offsets[3];
    layout.Offsets(static_cast<Index>(i), offsets);
    dst[offsets[0]] = fn(a[offsets[1]], b[offsets[2]]);
  }
}

// ---- Elementwise launchers --------------------------------------------------------------

template <typename T>
void RunFill(const LaunchContext& context, const KernelTensor& dst, T value) {
  const int64_t n = dst.numel();
  const KernelTensor* operands[1] = {&dst};
  const StridedLayout<1> layout = MakeStridedLayout(operands);
  T* out = dst.ptr<T>();
  if (layout.IsContiguous()) {
    if (static_cast<double>(value) == 0.0 && !std::signbit(static_cast<double>(value))) {
      // All-zero bytes: the copy engine's memset is the fastest fill there is.
      TANDEM_CUDA_CHECK(cudaMemsetAsync(out, 0, n * sizeof(T), context.stream), context.device);
      return;
    }
    if constexpr (std::is_same_v<T, float>) {
      if (Aligned16(out)) {
        FillContiguousVec4Kernel<<<GridFor(context, (n + 3) / 4), kThreads, 0, context.stream>>>(
            out, n, value);
        TANDEM_CUDA_CHECK_LAUNCH(context.device);
        return;
      }
    }
    FillContiguousKernel<T><<<GridFor(context, n), kThreads, 0, context.stream>>>(out, n, value);
  } else if (layout.FitsInt32(n)) {
    FillStridedKernel<T, int32_t><<<GridFor(context, n), kThreads, 0, context.stream>>>(
        out, ToDevice<int32_t>(layout), static_cast<int32_t>(n), value);
  } else {
    FillStridedKernel<T, int64_t><<<GridFor(context, n), kThreads, 0, context.stream>>>(
        out, ToDevice<int64_t>(layout), n, value);
  }
  TANDEM_CUDA_CHECK_LAUNCH(context.device);
}

template <typename Out, typename In, typename Fn>
void RunMap1(const LaunchContext& context, const KernelTensor& dst, const KernelTensor& src,
             Fn fn) {
  const int64_t n = dst.numel();
  const KernelTensor* operands[2] = {&dst, &src};
  const StridedLayout<2> layout = MakeStridedLayout(operands);
  Out* out = dst.ptr<Out>();
  const In* in = src.ptr<const In>();
  if (layout.IsContiguous()) {
    if constexpr (std::is_same_v<Out, float> && std::is_same_v<In, float>) {
      if (Aligned16(out) && Aligned16(in)) {
        Map1Vec4Kernel<<<GridFor(context, (n + 3) / 4), kThreads, 0, context.stream>>>(out, in, n,
                                                                                       fn);
        TANDEM_CUDA_CHECK_LAUNCH(context.device);
        return;
      }
    }
    Map1ContiguousKernel<<<GridFor(context, n), kThreads, 0, context.stream>>>(out, in, n, fn);
  } else if (layout.FitsInt32(n)) {
    Map1StridedKernel<<<GridFor(context, n), kThreads, 0, context.stream>>>(
        out, in, ToDevice<int32_t>(layout), static_cast<int32_t>(n), fn);
  } else {
    Map1StridedKernel<<<GridFor(context, n), kThreads, 0, context.stream>>>(
        out, in, ToDevice<int64_t>(layout), n, fn);
  }
  TANDEM_CUDA_CHECK_LAUNCH(context.device);
}

template <typename Out, typename T, typename Fn>
void RunMap2(const LaunchContext& context, const KernelTensor& dst, const KernelTensor& a,
             const KernelTensor& b, Fn fn) {
  const int64_t n = dst.numel();
  const KernelTensor* operands[3] = {&dst, &a, &b};
  const StridedLayout<3> layout = MakeStridedLayout(operands);
  Out* out = dst.ptr<Out>();
  const T* x = a.ptr<const T>();
  const T* y = b.ptr<const T>();
  if (layout.IsContiguous()) {
    if constexpr (std::is_same_v<T, float> && std::is_same_v<Out, float>) {
      if (Aligned16(out) && Aligned16(x) && Aligned16(y)) {
        Map2Vec4Kernel<<<GridFor(context, (n + 3) / 4), kThreads, 0, context.stream>>>(out, x, y, n,
                                                                                       fn);
        TANDEM_CUDA_CHECK_LAUNCH(context.device);
        return;
      }
    }
    Map2ContiguousKernel<<<GridFor(context, n), kThreads, 0, context.stream>>>(out, x, y, n, fn);
  } else if (layout.FitsInt32(n)) {
    Map2StridedKernel<<<GridFor(context, n), kThreads, 0, context.stream>>>(
        out, x, y, ToDevice<int32_t>(layout), static_cast<int32_t>(n), fn);
  } else {
    Map2StridedKernel<<<GridFor(context, n), kThreads, 0, context.stream>>>(
        out, x, y, ToDevice<int64_t>(layout), n, fn);
  }
  TANDEM_CUDA_CHECK_LAUNCH(context.device);
}

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
// src_index[...] (the second pass of a split reduction), else r itself.
template <typename In, typename Acc, typename Out>
void ReducePass(const LaunchContext& context, ReduceKind op, const In* src,
                const int64_t* src_index, int64_t outer, int64_t reduce, int64_t inner,
                int64_t splits, int64_t chunk, Out* dst_value, int64_t* dst_index) {
  if (UseWarpPerOutput(reduce, inner)) {
    const int64_t threads = outer * splits * kWarpSize;
    ReduceRowsKernel<In, Acc, Out><<<GridFor(context, threads), kThreads, 0, context.stream>>>(
        op, src, src_index, outer, reduce, splits, chunk, dst_value, dst_index);
  } else {
    const int64_t threads = outer * splits * inner;
    ReduceColumnsKernel<In, Acc, Out><<<GridFor(context, threads), kThreads, 0, context.stream>>>(
        op, src, src_index, outer, reduce, inner, splits, chunk, dst_value, dst_index);
  }
  TANDEM_CUDA_CHECK_LAUNCH(context.device);
}

// How many chunks to cut the reduced axis into: enough that the first pass keeps every SM
// busy, with chunks of at least kMinChunk elements so the second pass stays small.
int64_t ChooseSplits(const LaunchContext& context, int64_t outputs, int64_t reduce, int64_t inner) {
  constexpr int64_t kMinChunk = 1024;
  const int64_t busy_threads = outputs * (UseWarpPerOutput(reduce, inner) ? kWarpSize : 1);
  const int64_t gpu_threads = static_cast<int64_t>(context.num_sms) * kThreadsPerSm;
  if (busy_threads >= gpu_threads || reduce < 2 * kMinChunk) return 1;
  const int64_t wanted = (gpu_threads + busy_threads - 1) / busy_threads;
  return std::max<int64_t>(1, std::min(wanted, reduce / kMinChunk));
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
                           splits, dst_value, dst_index);
}

// ---- Softmax ----------------------------------------------------------------------------
// Three passes over each row like the CPU's (max; sum of exp(x - max) in double; write), so
// both compute the same expression. A row is read three times, but from L1/L2 after the
// first, so the kernel stays close to one read and one write of the tensor.

template <typename T>
__device__ __forceinline__ T MaxPropagatingNan(T a, T b) {
  return (isnan(a) || a > b) ? a : b;
}

// Block-wide reductions through one shared slot per warp. Every thread gets the result.
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

__device__ double BlockSum(double value) {
  __shared__ double warp_results[kWarpSize];
  __shared__ double result;
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    value += __shfl_down_sync(kFullMask, value, offset);
  }
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  if (lane == 0) warp_results[warp] = value;
  __syncthreads();
  if (warp == 0) {
    const int warps = blockDim.x / kWarpSize;
    value = lane < warps ? warp_results[lane] : 0.0;
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
      value += __shfl_down_sync(kFullMask, value, offset);
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

// ---- GEMM helper --------------------------------------------------------------------------

// C = beta * C over `batch` strided m x n matrices; beta == 0 writes zeros (BLAS semantics:
// C is not read, so NaN in C does not survive).
template <typename T>
__global__ void ScaleMatricesKernel(OpMath<T> beta, T* c, int64_t m, int64_t n, int64_t ldc,
                                    int64_t stride_c, int64_t batch) {
  using M = OpMath<T>;
  for (int64_t i = GlobalThread(); i < batch * m * n; i += GridThreads()) {
    const int64_t column = i % n, row = (i / n) % m, matrix = i / (m * n);
    T& element = c[matrix * stride_c + row * ldc + column];
    element = beta == M(0) ? T(0) : static_cast<T>(static_cast<M>(element) * beta);
  }
}

// ---- Convolution and pooling --------------------------------------------------------------

// One thread per (image plane, output position), looping over the kernel window: the
// index arithmetic is paid once per window, and for each (ky, kx) neighbouring threads write
// neighbouring column elements.
template <typename T>
__global__ void Im2ColKernel(Conv2dGeometry g, int64_t out_h, int64_t out_w, const T* image,
                             T* columns) {
  const int64_t out_plane = out_h * out_w;
  const int64_t total = g.batch * g.channels * out_plane;
  for (int64_t i = GlobalThread(); i < total; i += GridThreads()) {
    const int64_t plane = i / out_plane;  // b * channels + c
    const int64_t oy = (i % out_plane) / out_w, ox = i % out_w;
    const T* in = image + plane * g.height * g.width;
    T* out = columns + g.columns_start(plane / g.channels, plane % g.channels, out_plane) +
             oy * out_w + ox;
    const int64_t tap_stride = g.columns_tap_stride(out_plane);
    for (int64_t ky = 0; ky < g.kernel_h; ++ky) {
      const int64_t y = oy * g.stride_h - g.pad_h + ky * g.dilation_h;
      for (int64_t kx = 0; kx < g.kernel_w; ++kx) {
        const int64_t x = ox * g.stride_w - g.pad_w + kx * g.dilation_w;
        const bool inside = y >= 0 && y < g.height && x >= 0 && x < g.width;
        out[(ky * g.kernel_w + kx) * tap_stride] = inside ? in[y * g.width + x] : T(0);
      }
    }
  }
}

// One thread per image element, gathering the column entries that came from it, in the
// order the CPU adds them (ky, then kx): no atomics, and the result is bitwise the CPU's.
template <typename T>
__global__ void Col2ImKernel(Conv2dGeometry g, int64_t out_h, int64_t out_w, const T* columns,
                             T* image) {
  const int64_t plane_size = g.height * g.width;
  const int64_t out_plane = out_h * out_w;
  const int64_t total = g.batch * g.channels * plane_size;
  for (int64_t i = GlobalThread(); i < total; i += GridThreads()) {
    const int64_t plane = i / plane_size;
    const int64_t y = (i % plane_size) / g.width, x = i % g.width;
    const T* in = columns + g.columns_start(plane / g.channels, plane % g.channels, out_plane);
    const int64_t tap_stride = g.columns_tap_stride(out_plane);
    OpMath<T> sum = 0;  // 16-bit: summed in float, rounded once
    for (int64_t ky = 0; ky < g.kernel_h; ++ky) {
      const int64_t oy_scaled = y + g.pad_h - ky * g.dilation_h;  // oy * stride_h when paired
      if (oy_scaled < 0 || oy_scaled % g.stride_h != 0 || oy_scaled / g.stride_h >= out_h) {
        continue;
      }
      const int64_t oy = oy_scaled / g.stride_h;
      for (int64_t kx = 0; kx < g.kernel_w; ++kx) {
        const int64_t ox_scaled = x + g.pad_w - kx * g.dilation_w;
        if (ox_scaled < 0 || ox_scaled % g.stride_w != 0 || ox_scaled / g.stride_w >= out_w) {
          continue;
        }
        const int64_t ox = ox_scaled / g.stride_w;
        sum += static_cast<OpMath<T>>(in[(ky * g.kernel_w + kx) * tap_stride + oy * out_w + ox]);
      }
    }
    image[i] = static_cast<T>(sum);
  }
}

template <typename T>
__device__ __forceinline__ bool ReplacesMax(T candidate, T best) {
  if (isnan(candidate)) return !isnan(best);
  return candidate > best;
}

// One thread per output element; the window scan is the CPU's, element for element.
template <typename T>
__global__ void MaxPool2dKernel(Conv2dGeometry g, int64_t out_h, int64_t out_w, const T* input,
                                T* output, int64_t* argmax) {
  const int64_t out_plane = out_h * out_w;
  const int64_t total = g.batch * g.channels * out_plane;
  for (int64_t i = GlobalThread(); i < total; i += GridThreads()) {
    const int64_t plane = i / out_plane;
    const int64_t oy = (i % out_plane) / out_w, ox = i % out_w;
    const T* in = input + plane * g.height * g.width;
    const int64_t y0 = max(oy * g.stride_h - g.pad_h, int64_t{0});
    const int64_t y1 = min(oy * g.stride_h - g.pad_h + g.kernel_h, g.height);
    const int64_t x0 = max(ox * g.stride_w - g.pad_w, int64_t{0});
    const int64_t x1 = min(ox * g.stride_w - g.pad_w + g.kernel_w, g.width);
    int64_t best_at = y0 * g.width + x0;
    OpMath<T> best = static_cast<OpMath<T>>(in[best_at]);
    for (int64_t y = y0; y < y1; ++y) {
      for (int64_t x = x0; x < x1; ++x) {
        const int64_t at = y * g.width + x;
        const OpMath<T> value = static_cast<OpMath<T>>(in[at]);
        if (ReplacesMax(value, best)) {
          best = value;
          best_at = at;
        }
      }
    }
    output[i] = in[best_at];  // the element itself: its bits, NaN payloads included
    argmax[i] = best_at;
  }
}

// One thread per input element, summing the gradients of the outputs whose window covers
// it and chose it. A gather rather than atomicAdd scatters: deterministic, no separate
// zeroing pass, and it adds in the CPU's order (ascending output index), so the result is
// bitwise the CPU's even where windows overlap.
template <typename T>
__global__ void MaxPool2dBackwardKernel(Conv2dGeometry g, int64_t out_h, int64_t out_w,
                                        const T* grad_output, const int64_t* argmax,
                                        T* grad_input) {
  const int64_t plane_size = g.height * g.width;
  const int64_t out_plane = out_h * out_w;
  const int64_t total = g.batch * g.channels * plane_size;
  for (int64_t i = GlobalThread(); i < total; i += GridThreads()) {
    const int64_t plane = i / plane_size;
    const int64_t at = i % plane_size;
    const int64_t y = at / g.width, x = at % g.width;
    // Outputs oy whose window [oy * stride - pad, oy * stride - pad + kernel) holds y.
    const int64_t oy_begin =
        y + g.pad_h < g.kernel_h ? 0 : (y + g.pad_h - g.kernel_h) / g.stride_h + 1;
    const int64_t oy_end = min((y + g.pad_h) / g.stride_h + 1, out_h);
    const int64_t ox_begin =
        x + g.pad_w < g.kernel_w ? 0 : (x + g.pad_w - g.kernel_w) / g.stride_w + 1;
    const int64_t ox_end = min((x + g.pad_w) / g.stride_w + 1, out_w);
    const int64_t* chosen = argmax + plane * out_plane;
    const T* grad = grad_output + plane * out_plane;
    OpMath<T> sum = 0;  // 16-bit: summed in float, rounded once
    for (int64_t oy = oy_begin; oy < oy_end; ++oy) {
      for (int64_t ox = ox_begin; ox < ox_end; ++ox) {
        const int64_t o = oy * out_w + ox;
        if (chosen[o] == at) sum += static_cast<OpMath<T>>(grad[o]);
      }
    }
    grad_input[i] = static_cast<T>(sum);
  }
}

// Average pooling: one thread per output element (forward) or input element (backward, a
// gather), computing exactly what the CPU computes (tensor/kernels/internal/pooling_math.h).
template <typename T>
__global__ void AvgPool2dKernel(Conv2dGeometry g, bool count_include_pad, int64_t out_h,
                                int64_t out_w, const T* input, T* output) {
  const int64_t out_plane = out_h * out_w;
  const int64_t total = g.batch * g.channels * out_plane;
  for (int64_t i = GlobalThread(); i < total; i += GridThreads()) {
    const int64_t plane = i / out_plane;
    const int64_t oy = (i % out_plane) / out_w, ox = i % out_w;
    output[i] = AvgPoolOutput(g, count_include_pad, input + plane * g.height * g.width, oy, ox);
  }
}

template <typename T>
__global__ void AvgPool2dBackwardKernel(Conv2dGeometry g, bool count_include_pad, int64_t out_h,
                                        int64_t out_w, const T* grad_output, T* grad_input) {
  const int64_t plane_size = g.height * g.width;
  const int64_t total = g.batch * g.channels * plane_size;
  for (int64_t i = GlobalThread(); i < total; i += GridThreads()) {
    const int64_t plane = i / plane_size;
    const int64_t y = (i % plane_size) / g.width, x = i % g.width;
    grad_input[i] = AvgPoolInputGrad(g, count_include_pad, out_h, out_w,
                                     grad_output + plane * out_h * out_w, y, x);
  }
}

template <typename T>
__global__ void AdaptiveAvgPool2dKernel(int64_t planes, int64_t height, int64_t width,
                                        int64_t out_h, int64_t out_w, const T* input, T* output) {
  const int64_t out_plane = out_h * out_w;
  const int64_t total = planes * out_plane;
  for (int64_t i = GlobalThread(); i < total; i += GridThreads()) {
    const int64_t plane = i / out_plane;
    const int64_t oy = (i % out_plane) / out_w, ox = i % out_w;
    output[i] =
        AdaptiveAvgPoolOutput(height, width, out_h, out_w, input + plane * height * width, oy, ox);
  }
}

template <typename T>
__global__ void AdaptiveAvgPool2dBackwardKernel(int64_t planes, int64_t height, int64_t width,
                                                int64_t out_h, int64_t out_w, const T* grad_output,
                                                T* grad_input) {
  const int64_t plane_size = height * width;
  const int64_t total = planes * plane_size;
  for (int64_t i = GlobalThread(); i < total; i += GridThreads()) {
    const int64_t plane = i / plane_size;
    const int64_t y = (i % plane_size) / width, x = i % width;
    grad_input[i] = AdaptiveAvgPoolInputGrad(height, width, out_h, out_w,
                                             grad_output + plane * out_h * out_w, y, x);
  }
}

// ---- Gather / scatter of one column per row -------------------------------------------------

template <typename T>
__global__ void GatherColumnsKernel(T* dst, const T* src, const int64_t* idx, int64_t rows,
                                    int64_t cols) {
  for (int64_t r = GlobalThread(); r < rows; r += GridThreads()) dst[r] = src[r * cols + idx[r]];
}

// Row r only ever touches row r of dst, so threads never collide: a plain read-modify-write
// is race-free and, unlike atomicAdd, deterministic.
template <typename T>
__global__ void ScatterAddColumnsKernel(T* dst, const T* src, const int64_t* idx, int64_t rows,
                                        int64_t cols) {
  using M = OpMath<T>;
  for (int64_t r = GlobalThread(); r < rows; r += GridThreads()) {
    T& element = dst[r * cols + idx[r]];
    element = static_cast<T>(static_cast<M>(element) + static_cast<M>(src[r]));
  }
}

// torch.gather over the middle axis: one thread per output element.
template <typename T>
__global__ void GatherKernel(T* dst, const T* src, const int64_t* idx, int64_t outer,
                             int64_t src_dim, int64_t idx_dim, int64_t inner) {
  const int64_t n = outer * idx_dim * inner;
  for (int64_t e = GlobalThread(); e < n; e += GridThreads()) {
    const int64_t o = e / (idx_dim * inner), i = e % inner;
    dst[e] = src[(o * src_dim + idx[e]) * inner + i];
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
      dst[(o * dst_dim + idx[at]) * inner + i] += static_cast<Acc>(src[at]);
    }
  }
}

// ---- Random numbers ---------------------------------------------------------------------
// Element i is a function of counter offset + i alone (tensor/base/philox.h). Each thread owns
// one Philox block — 4 counters for uniforms, 2 for normals — and writes the elements of
// the request that fall in it, so a block is generated once and the output is the same
// whatever the grid. __fmul_rn/__fadd_rn keep nvcc from fusing a * b + c into an FMA,
// whose single rounding would differ from the CPU's two. T is only the stored type: float64
// requests compute in float32 too and widen (Note [Random float64] in tensor/runtime/backend.h).

template <typename T>
__global__ void RandomUniformKernel(T* dst, int64_t n, uint64_t key, uint64_t offset, float low,
                                    float range, float high, float below_high) {
  const uint64_t first_block = offset / 4;
  const uint64_t blocks = (offset + n + 3) / 4 - first_block;
  for (int64_t b = GlobalThread(); b < static_cast<int64_t>(blocks); b += GridThreads()) {
    const uint64_t block_index = first_block + b;
    const philox::Block block = philox::Generate(key, block_index);
#pragma unroll
    for (int lane = 0; lane < 4; ++lane) {
      const uint64_t counter = block_index * 4 + lane;
      if (counter < offset || counter >= offset + n) continue;
      const float value = __fadd_rn(low, __fmul_rn(range, philox::ToUnit(block.x[lane])));
      dst[counter - offset] = static_cast<T>(value >= high && high > low ? below_high : value);
    }
  }
}

template <typename T>
__global__ void RandomNormalKernel(T* dst, int64_t n, uint64_t key, uint64_t offset, float mean,
                                   float stddev) {
  const uint64_t first_block = offset / 2;
  const uint64_t blocks = (offset + n + 1) / 2 - first_block;
  for (int64_t b = GlobalThread(); b < static_cast<int64_t>(blocks); b += GridThreads()) {
    const uint64_t block_index = first_block + b;
    const philox::Block block = philox::Generate(key, block_index);
#pragma unroll
    for (int lane = 0; lane < 2; ++lane) {
      const uint64_t counter = block_index * 2 + lane;
      if (counter < offset || counter >= offset + n) continue;
      // The arithmetic of philox::Normal (and of the CPU backend), step by step.
      const float u1 = ((block.x[2 * lane] >> 8) + 1) * (1.0f / 16777216.0f);
      const float u2 = philox::ToUnit(block.x[2 * lane + 1]);
      const float radius = sqrtf(-2.0f * logf(u1));
      const float z = __fmul_rn(radius, cosf(__fmul_rn(6.2831853071795864769f, u2)));
      dst[counter - offset] = static_cast<T>(__fadd_rn(mean, __fmul_rn(stddev, z)));
    }
  }
}

// ---- Test only ---------------------------------------------------------------------------

// The one thing here a CPU cannot run: PTX's global timer. Under --config=cudasim
// (TANDEM_CUDASIM) the simulator's clock stands in.
__device__ __forceinline__ uint64_t GlobalTimerNanoseconds() {
#if defined(TANDEM_CUDASIM)
  return ::cudasim::internal::GlobalTimerNanoseconds();
#else
  uint64_t now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  return now;
#endif
}

__global__ void SpinKernel(uint64_t nanoseconds) {
  const uint64_t start = GlobalTimerNanoseconds();
  while (GlobalTimerNanoseconds() - start < nanoseconds) __nanosleep(1000);
}

// ---- 16-bit kernels through float copies ------------------------------------------------
// Note [16-bit via float]: kernels whose shared math (pooling_math.h) reads and sums in its
// element type run for bfloat16/float16 on float copies in workspace memory: the input
// widened (exact), the float32 kernel, the output rounded once per element. The result is by
// construction the float32 kernel's on the widened input, rounded (the contract of 16-bit
// kernels), for two extra passes over memory; only average pooling and scatter-add take this
// path. Workspace blocks go back to the allocator when the launcher returns, while the kernels
// may still be queued: safe, because it hands them out again only to work on this same stream.

template <typename T>
std::shared_ptr<void> WidenedCopy(const LaunchContext& context, const T* src, int64_t n) {
  std::shared_ptr<void> copy = context.workspace->Allocate(n * sizeof(float));
  Map1ContiguousKernel<<<GridFor(context, n), kThreads, 0, context.stream>>>(
      static_cast<float*>(copy.get()), src, n, ConvertFn<float, T>{});
  TANDEM_CUDA_CHECK_LAUNCH(context.device);
  return copy;
}

template <typename T>
void NarrowInto(const LaunchContext& context, T* dst, const void* src, int64_t n) {
  Map1ContiguousKernel<<<GridFor(context, n), kThreads, 0, context.stream>>>(
      dst, static_cast<const float*>(src), n, ConvertFn<T, float>{});
  TANDEM_CUDA_CHECK_LAUNCH(context.device);
}

// Calls run(in, out) with T's pointers, or for a 16-bit T with float copies (in_n and out_n
// elements) as above. `run` launches one kernel for the pointers' element type.
template <typename T, typename Run>
void RunInFloat(const LaunchContext& context, const void* in, int64_t in_n, void* out,
                int64_t out_n, Run run) {
  if constexpr (kIsReducedFloat<T>) {
    const std::shared_ptr<void> wide_in = WidenedCopy(context, static_cast<const T*>(in), in_n);
    const std::shared_ptr<void> wide_out = context.workspace->Allocate(out_n * sizeof(float));
    run(static_cast<const float*>(wide_in.get()), static_cast<float*>(wide_out.get()));
    NarrowInto(context, static_cast<T*>(out), wide_out.get(), out_n);
  } else {
    run(static_cast<const T*>(in), static_cast<T*>(out));
  }
}

// The element type U of a pointer `U*` or `const U*`.
template <typename Pointer>
using Element = std::remove_const_t<std::remove_pointer_t<Pointer>>;

}  // namespace

// ---- Launchers ----------------------------------------------------------------------------
// The floating-point launchers dispatch on the dtype before anything else, so that an
// unsupported dtype throws (naming the kernel) even for an empty tensor, as on the CPU.

void LaunchCopy(const LaunchContext& context, const KernelTensor& dst, const KernelTensor& src) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  const KernelTensor* operands[2] = {&dst, &src};
  const StridedLayout<2> layout = MakeStridedLayout(operands);
  if (dst.dtype == src.dtype) {
    if (dst.data == src.data) {
      bool same_strides = true;
      for (int d = 0; d < layout.ndim; ++d) {
        same_strides &= layout.strides[0][d] == layout.strides[1][d];
      }
      if (same_strides) return;  // a view copied onto itself
    }
    if (layout.IsContiguous()) {
      TANDEM_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, n * ElementSize(dst.dtype),
                                        cudaMemcpyDeviceToDevice, context.stream),
                        context.device);
      return;
    }
  }
  DispatchDType(dst.dtype, "CUDA Copy", [&](auto to) {
    DispatchDType(src.dtype, "CUDA Copy", [&](auto from) {
      using To = typename decltype(to)::type;
      using From = typename decltype(from)::type;
      RunMap1<To, From>(context, dst, src, ConvertFn<To, From>{});
    });
  });
}

void LaunchFill(const LaunchContext& context, const KernelTensor& dst, double value) {
  DispatchDType(dst.dtype, "CUDA Fill", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (dst.numel() == 0) return;
    RunFill(context, dst, static_cast<T>(value));
  });
}

void LaunchUnary(const LaunchContext& context, UnaryOp op, const KernelTensor& dst,
                 const KernelTensor& src, double scalar) {
  DispatchDType(src.dtype, "CUDA Unary", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (dst.numel() == 0) return;
    RunMap1<T, T>(context, dst, src, UnaryFn<T>{op, static_cast<UnaryScalar<T>>(scalar)});
  });
}

void LaunchBinary(const LaunchContext& context, BinaryOp op, const KernelTensor& dst,
                  const KernelTensor& a, const KernelTensor& b) {
  DispatchDType(a.dtype, "CUDA Binary", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (dst.numel() == 0) return;
    if (dst.dtype == kBool && a.dtype != kBool) {
      RunMap2<bool, T>(context, dst, a, b, BinaryFn<T, bool>{op});  // a comparison
    } else {
      RunMap2<T, T>(context, dst, a, b, BinaryFn<T, T>{op});
    }
  });
}

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
      SoftmaxRowsKernel<T>
          <<<static_cast<int>(grid), threads, 0, context.stream>>>(log, out, in, outer, dim);
    } else {
      SoftmaxColumnsKernel<T><<<GridFor(context, outer * inner), kThreads, 0, context.stream>>>(
          log, out, in, outer, dim, inner);
    }
    TANDEM_CUDA_CHECK_LAUNCH(context.device);
  });
}

void LaunchScaleMatrices(const LaunchContext& context, DType dtype, double beta, void* c, int64_t m,
                         int64_t n, int64_t ldc, int64_t stride_c, int64_t batch) {
  DispatchAllFloatingTypes(dtype, "CUDA Gemm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const OpMath<T> typed_beta = static_cast<OpMath<T>>(beta);
    if (m * n * batch == 0 || typed_beta == OpMath<T>(1)) return;
    ScaleMatricesKernel<T><<<GridFor(context, batch * m * n), kThreads, 0, context.stream>>>(
        typed_beta, static_cast<T*>(c), m, n, ldc, stride_c, batch);
    TANDEM_CUDA_CHECK_LAUNCH(context.device);
  });
}

void LaunchIm2Col(const LaunchContext& context, DType dtype, const Conv2dGeometry& g,
                  const void* image, void* columns) {
  DispatchAllFloatingTypes(dtype, "CUDA Im2Col", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t total = g.batch * g.channels * g.out_h() * g.out_w();
    if (total == 0) return;
    Im2ColKernel<T><<<GridFor(context, total), kThreads, 0, context.stream>>>(
        g, g.out_h(), g.out_w(), static_cast<const T*>(image), static_cast<T*>(columns));
    TANDEM_CUDA_CHECK_LAUNCH(context.device);
  });
}

void LaunchCol2Im(const LaunchContext& context, DType dtype, const Conv2dGeometry& g,
                  const void* columns, void* image) {
  DispatchAllFloatingTypes(dtype, "CUDA Col2Im", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t total = g.batch * g.channels * g.height * g.width;
    if (total == 0) return;
    Col2ImKernel<T><<<GridFor(context, total), kThreads, 0, context.stream>>>(
        g, g.out_h(), g.out_w(), static_cast<const T*>(columns), static_cast<T*>(image));
    TANDEM_CUDA_CHECK_LAUNCH(context.device);
  });
}

void LaunchMaxPool2d(const LaunchContext& context, DType dtype, const Conv2dGeometry& g,
                     const void* input, void* output, int64_t* argmax) {
  DispatchAllFloatingTypes(dtype, "CUDA MaxPool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t total = g.batch * g.channels * g.out_h() * g.out_w();
    if (total == 0) return;
    MaxPool2dKernel<T><<<GridFor(context, total), kThreads, 0, context.stream>>>(
        g, g.out_h(), g.out_w(), static_cast<const T*>(input), static_cast<T*>(output), argmax);
    TANDEM_CUDA_CHECK_LAUNCH(context.device);
  });
}

void LaunchMaxPool2dBackward(const LaunchContext& context, DType dtype, const Conv2dGeometry& g,
                             const void* grad_output, const int64_t* argmax, void* grad_input) {
  DispatchAllFloatingTypes(dtype, "CUDA MaxPool2dBackward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t total = g.batch * g.channels * g.height * g.width;
    if (total == 0) return;
    MaxPool2dBackwardKernel<T><<<GridFor(context, total), kThreads, 0, context.stream>>>(
        g, g.out_h(), g.out_w(), static_cast<const T*>(grad_output), argmax,
        static_cast<T*>(grad_input));
    TANDEM_CUDA_CHECK_LAUNCH(context.device);
  });
}

void LaunchAvgPool2d(const LaunchContext& context, DType dtype, const Conv2dGeometry& g,
                     bool count_include_pad, const void* input, void* output) {
  DispatchAllFloatingTypes(dtype, "CUDA AvgPool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t total = g.batch * g.channels * g.out_h() * g.out_w();
    if (total == 0) return;
    const int64_t image = g.batch * g.channels * g.height * g.width;
    RunInFloat<T>(context, input, image, output, total, [&](auto in, auto out) {
      AvgPool2dKernel<Element<decltype(out)>>
          <<<GridFor(context, total), kThreads, 0, context.stream>>>(g, count_include_pad,
                                                                     g.out_h(), g.out_w(), in, out);
      TANDEM_CUDA_CHECK_LAUNCH(context.device);
    });
  });
}

void LaunchAvgPool2dBackward(const LaunchContext& context, DType dtype, const Conv2dGeometry& g,
                             bool count_include_pad, const void* grad_output, void* grad_input) {
  DispatchAllFloatingTypes(dtype, "CUDA AvgPool2dBackward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t total = g.batch * g.channels * g.height * g.width;
    if (total == 0) return;
    const int64_t outputs = g.batch * g.channels * g.out_h() * g.out_w();
    RunInFloat<T>(context, grad_output, outputs, grad_input, total, [&](auto in, auto out) {
      AvgPool2dBackwardKernel<Element<decltype(out)>>
          <<<GridFor(context, total), kThreads, 0, context.stream>>>(g, count_include_pad,
                                                                     g.out_h(), g.out_w(), in, out);
      TANDEM_CUDA_CHECK_LAUNCH(context.device);
    });
  });
}

void LaunchAdaptiveAvgPool2d(const LaunchContext& context, DType dtype, int64_t planes,
                             int64_t height, int64_t width, int64_t out_h, int64_t out_w,
                             const void* input, void* output) {
  DispatchAllFloatingTypes(dtype, "CUDA AdaptiveAvgPool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t total = planes * out_h * out_w;
    if (total == 0) return;
    RunInFloat<T>(context, input, planes * height * width, output, total, [&](auto in, auto out) {
      AdaptiveAvgPool2dKernel<Element<decltype(out)>>
          <<<GridFor(context, total), kThreads, 0, context.stream>>>(planes, height, width, out_h,
                                                                     out_w, in, out);
      TANDEM_CUDA_CHECK_LAUNCH(context.device);
    });
  });
}

void LaunchAdaptiveAvgPool2dBackward(const LaunchContext& context, DType dtype, int64_t planes,
                                     int64_t height, int64_t width, int64_t out_h, int64_t out_w,
                                     const void* grad_output, void* grad_input) {
  DispatchAllFloatingTypes(dtype, "CUDA AdaptiveAvgPool2dBackward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t total = planes * height * width;
    if (total == 0) return;
    RunInFloat<T>(context, grad_output, planes * out_h * out_w, grad_input, total,
                  [&](auto in, auto out) {
                    AdaptiveAvgPool2dBackwardKernel<Element<decltype(out)>>
                        <<<GridFor(context, total), kThreads, 0, context.stream>>>(
                            planes, height, width, out_h, out_w, in, out);
                    TANDEM_CUDA_CHECK_LAUNCH(context.device);
                  });
  });
}

void LaunchGatherColumns(const LaunchContext& context, DType dtype, void* dst, const void* src,
                         const int64_t* idx, int64_t rows, int64_t cols) {
  DispatchAllFloatingTypes(dtype, "CUDA GatherColumns", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (rows <= 0) return;
    GatherColumnsKernel<T><<<GridFor(context, rows), kThreads, 0, context.stream>>>(
        static_cast<T*>(dst), static_cast<const T*>(src), idx, rows, cols);
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
                  int64_t inner) {
  DispatchAllFloatingTypes(dtype, "CUDA Gather", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t n = outer * idx_dim * inner;
    if (n <= 0) return;
    GatherKernel<T><<<GridFor(context, n), kThreads, 0, context.stream>>>(
        static_cast<T*>(dst), static_cast<const T*>(src), idx, outer, src_dim, idx_dim, inner);
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

void LaunchRandomUniform(const LaunchContext& context, DType dtype, void* dst, int64_t n,
                         uint64_t seed, uint64_t offset, double low_value, double high_value) {
  DispatchAllFloatingTypes(dtype, "CUDA RandomUniform", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (n <= 0) return;
    // In float32 whatever T is (Note [Random float64]). As in the CPU backend: low + range * u
    // can round up to `high`; the largest float below it keeps the interval half-open.
    const float low = static_cast<float>(low_value), high = static_cast<float>(high_value);
    const float range = high - low;
    const float below_high = std::nextafter(high, low);
    const int64_t blocks = static_cast<int64_t>((offset + n + 3) / 4 - offset / 4);
    RandomUniformKernel<T><<<GridFor(context, blocks), kThreads, 0, context.stream>>>(
        static_cast<T*>(dst), n, seed ^ philox::kUniformStream, offset, low, range, high,
        below_high);
    TANDEM_CUDA_CHECK_LAUNCH(context.device);
  });
}

void LaunchRandomNormal(const LaunchContext& context, DType dtype, void* dst, int64_t n,
                        uint64_t seed, uint64_t offset, double mean, double stddev) {
  DispatchAllFloatingTypes(dtype, "CUDA RandomNormal", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (n <= 0) return;
    const int64_t blocks = static_cast<int64_t>((offset + n + 1) / 2 - offset / 2);
    RandomNormalKernel<T><<<GridFor(context, blocks), kThreads, 0, context.stream>>>(
        static_cast<T*>(dst), n, seed ^ philox::kNormalStream, offset, static_cast<float>(mean),
        static_cast<float>(stddev));
    TANDEM_CUDA_CHECK_LAUNCH(context.device);
  });
}

void LaunchSpin(const LaunchContext& context, int64_t nanoseconds) {
  SpinKernel<<<1, 1, 0, context.stream>>>(static_cast<uint64_t>(nanoseconds));
  TANDEM_CUDA_CHECK_LAUNCH(context.device);
}

// ---- Fused row norms and triangles (Note [Fused row norms] in tensor/runtime/backend.h) ------
namespace {

// Block-wide sum in M (float, or double for float64) through one shared slot per warp; every
// thread gets the result. Separate from BlockSum (double), so that the 16-bit floats and
// float32 accumulate in float as the CPU's row norms do.
template <typename M>
__device__ M NormBlockSum(M value) {
  __shared__ M warp_results[kWarpSize];
  __shared__ M result;
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    value += __shfl_down_sync(kFullMask, value, offset);
  }
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  if (lane == 0) warp_results[warp] = value;
  __syncthreads();
  if (warp == 0) {
    const int warps = blockDim.x / kWarpSize;
    value = lane < warps ? warp_results[lane] : M(0);
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
      value += __shfl_down_sync(kFullMask, value, offset);
    }
    if (lane == 0) result = value;
  }
  __syncthreads();
  return result;
}

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
      mean = NormBlockSum(sum) * inv_cols;
    }
    M squares = 0;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      const M d = static_cast<M>(xr[j]) - mean;
      squares += d * d;
    }
    const M rstd = M(1) / math::Sqrt(NormBlockSum(squares) * inv_cols + eps);
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
    const M mean_g = rms ? M(0) : NormBlockSum(sum_g) * inv_cols;
    const M mean_gx = NormBlockSum(sum_gx) * inv_cols;
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

// Unsigned integers of each element size: Triangle moves bits, whatever the dtype.
template <typename Bits>
__global__ void TriangleKernel(bool lower, int64_t diagonal, int64_t total, int64_t rows,
                               int64_t cols, const Bits* src, Bits* dst) {
  for (int64_t i = GlobalThread(); i < total; i += GridThreads()) {
    const int64_t column = i % cols, row = (i / cols) % rows;
    const bool keep = lower ? column - row <= diagonal : column - row >= diagonal;
    dst[i] = keep ? src[i] : Bits(0);
  }
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

void LaunchTriangle(const LaunchContext& context, DType dtype, bool lower, int64_t diagonal,
                    int64_t batch, int64_t rows, int64_t cols, const void* src, void* dst) {
  const int64_t total = batch * rows * cols;
  if (total == 0) return;
  auto launch = [&](auto bits) {
    using Bits = decltype(bits);
    TriangleKernel<Bits><<<GridFor(context, total), kThreads, 0, context.stream>>>(
        lower, diagonal, total, rows, cols, static_cast<const Bits*>(src), static_cast<Bits*>(dst));
    TANDEM_CUDA_CHECK_LAUNCH(context.device);
  };
  switch (ElementSize(dtype)) {
    case 1:
      return launch(uint8_t{});
    case 2:
      return launch(uint16_t{});
    case 4:
      return launch(uint32_t{});
    case 8:
      return launch(uint64_t{});
    default:
      TANDEM_FAIL("CUDA Triangle: unsupported element size ", ElementSize(dtype), " of ", dtype);
  }
}

}  // namespace cuda
}  // namespace tandem
