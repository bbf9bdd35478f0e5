// Launch configuration shared by the CUDA kernel files of tensor/cuda (private to them):
// block size, GridFor (the grid of a grid-stride loop), GlobalThread/GridThreads, alignment
// checks, Pack (128-bit loads and stores), IndexInRange (device-side index checks), and
// DeviceLayout (a StridedLayout in the kernel's index
// type). Include it from a .cu file only, e.g.
//   for (int64_t i = GlobalThread(); i < n; i += GridThreads()) dst[i] = value;
//   Kernel<<<GridFor(context, n), kThreads, 0, context.stream>>>(...);
//
// Every file's floating-point launchers dispatch on the dtype before anything else, so that an
// unsupported dtype throws (naming the kernel) even for an empty tensor, as on the CPU.
#ifndef TANDEM_TENSOR_CUDA_INTERNAL_LAUNCH_UTILS_CUH_
#define TANDEM_TENSOR_CUDA_INTERNAL_LAUNCH_UTILS_CUH_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "tensor/base/half.h"
#include "tensor/cuda/kernels.h"
#include "tensor/kernels/internal/strided_layout.h"

namespace tandem {
namespace cuda {
// Unnamed: each .cu file that includes this gets its own copy of these kernels and helpers,
// as when all kernels were in one file, so no kernel symbol is shared between files.
namespace {

constexpr int kThreads = 256;  // threads per block for grid-stride kernels
constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;
// Resident threads per SM on Hopper (and Ampere): 2048, i.e. 8 blocks of 256.
constexpr int kThreadsPerSm = 2048;

// Blocks for a grid-stride loop over `items`: enough to cover them, at most two waves of
// fully occupied SMs (more blocks only add scheduling overhead).
inline int GridFor(const LaunchContext& context, int64_t items, int threads = kThreads) {
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

inline bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

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

// ---- 128-bit accesses -------------------------------------------------------------------
// A 128-bit access's worth of elements of the narrowest operand (4 for float32, 8 for bfloat16
// and float16; a float32 operand of a 16-bit op then moves as two 128-bit accesses), or 0 where
// an operand is not float32 or 16-bit (those take the scalar contiguous kernel).
template <typename T>
constexpr bool kPackable = std::is_same_v<T, float> || kIsReducedFloat<T>;
template <typename... T>
constexpr int kPackOf = (kPackable<T> && ...) ? static_cast<int>(16 / std::min({sizeof(T)...})) : 0;

// kN elements of T loaded or stored in one (or, for 32 bytes, two) vector accesses.
template <typename T, int kN>
struct alignas(sizeof(T) * kN) Pack {
  T v[kN];
};

template <int kN, typename T>
bool PackAligned(const T* p) {
  return reinterpret_cast<uintptr_t>(p) % (sizeof(T) * kN) == 0;
}

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

// Block-wide sum in M (float, or double) through one shared slot per warp; every thread gets
// the result. blockDim.x is a multiple of kWarpSize. The row norms sum in their OpMath (so the
// 16-bit floats and float32 accumulate in float as the CPU's do), softmax in double.
template <typename M>
__device__ M BlockSum(M value) {
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

}  // namespace
}  // namespace cuda
}  // namespace tandem

#endif  // TANDEM_TENSOR_CUDA_INTERNAL_LAUNCH_UTILS_CUH_
