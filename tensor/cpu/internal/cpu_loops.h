// The loops and constants shared by the CPU backend's kernel files (cpu_backend.cc,
// elementwise_kernels.cc, reduce_kernels.cc): how finely a loop is split over a device's pool,
// strided iteration over a KernelTensor layout, the float chunks of the 16-bit kernels, and the
// NaN-aware comparison of max and min. Internal to the CPU backend.
//
//   ParallelFor(Cpu(index), n, kElementwiseGrain, [&](int64_t begin, int64_t end) {
//     ForEachRun(layout, begin, end, [&](const int64_t* offsets, int64_t count,
//                                        const int64_t* strides) { ... });
//   });
#ifndef TANDEM_TENSOR_CPU_INTERNAL_CPU_LOOPS_H_
#define TANDEM_TENSOR_CPU_INTERNAL_CPU_LOOPS_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "tensor/base/device.h"
#include "tensor/base/error.h"
#include "tensor/base/half.h"
#include "tensor/kernels/float_conversions.h"
#include "tensor/kernels/internal/strided_layout.h"
#include "tensor/kernels/vectorized.h"
#include "tensor/runtime/backend.h"
#include "tensor/runtime/threads.h"

namespace tandem {
namespace cpu_internal {

// Elements per chunk below which splitting a loop costs more than it saves (waking a pool
// thread is a few microseconds; a cheap elementwise op does ~1 element per nanosecond).
inline constexpr int64_t kElementwiseGrain = 32768;
// Transcendental functions cost ~10x more per element, so smaller chunks pay off.
inline constexpr int64_t kTranscendentalGrain = 4096;
inline constexpr int64_t kBytesPerCopyChunk = 1 << 20;

inline Device Cpu(int index) { return Device::Cpu(index); }

// The CPU kernels' one check of their device index (every cpu:N with N >= 0 exists).
inline void CheckCpuIndex(int index) {
  TANDEM_CHECK(index >= 0, "CPU backend: device index must be >= 0 but got ", index);
}

// Copies `bytes` bytes split over cpu:`index`'s pool.
inline void CopyBytes(int index, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  char* out = static_cast<char*>(dst);
  const char* in = static_cast<const char*>(src);
  ParallelFor(
      Cpu(index), static_cast<int64_t>(bytes), kBytesPerCopyChunk,
      [&](int64_t begin, int64_t end) { std::memcpy(out + begin, in + begin, end - begin); });
}

// ---- Strided iteration --------------------------------------------------------------

// Visits the elements [begin, end) of `layout` in row-major order, one run along the last
// dimension at a time: inner(offsets, count, inner_strides) with per-operand element
// offsets of the run's first element.
template <int kArity, typename Inner>
void ForEachRun(const StridedLayout<kArity>& layout, int64_t begin, int64_t end, Inner&& inner) {
  int64_t offsets[kArity] = {};
  if (layout.ndim == 0) {  // a single element
    if (begin < end) inner(offsets, int64_t{1}, offsets);
    return;
  }
  const int last = layout.ndim - 1;
  int64_t index[kMaxDims];
  int64_t remainder = begin;
  for (int d = last; d >= 0; --d) {
    index[d] = remainder % layout.sizes[d];
    remainder /= layout.sizes[d];
    for (int a = 0; a < kArity; ++a) offsets[a] += index[d] * layout.strides[a][d];
  }
  int64_t inner_strides[kArity];
  for (int a = 0; a < kArity; ++a) inner_strides[a] = layout.strides[a][last];

  int64_t position = begin;
  while (position < end) {
    const int64_t count = std::min(layout.sizes[last] - index[last], end - position);
    inner(offsets, count, inner_strides);
    position += count;
    if (position >= end) break;
    // The run reached the end of the last dimension: carry into the outer ones.
    for (int a = 0; a < kArity; ++a) offsets[a] -= index[last] * inner_strides[a];
    index[last] = 0;
    for (int d = last - 1; d >= 0; --d) {
      ++index[d];
      for (int a = 0; a < kArity; ++a) offsets[a] += layout.strides[a][d];
      if (index[d] < layout.sizes[d]) break;
      for (int a = 0; a < kArity; ++a) offsets[a] -= index[d] * layout.strides[a][d];
      index[d] = 0;
    }
  }
}

inline void CheckSameShape(const KernelTensor& dst, const KernelTensor& src, const char* kernel,
                           const char* what) {
  bool same = dst.ndim == src.ndim;
  for (int d = 0; same && d < dst.ndim; ++d) same = dst.sizes[d] == src.sizes[d];
  if (same) return;
  std::string dst_shape = "[", src_shape = "[";
  for (int d = 0; d < dst.ndim; ++d) dst_shape += (d ? ", " : "") + std::to_string(dst.sizes[d]);
  for (int d = 0; d < src.ndim; ++d) src_shape += (d ? ", " : "") + std::to_string(src.sizes[d]);
  TANDEM_FAIL("CPU ", kernel, " expects ", what, " of the output's shape ", dst_shape, "] but got ",
              src_shape, "]; broadcast or reshape it before calling the kernel");
}

inline void CheckLayout(const KernelTensor& t, const char* kernel) {
  TANDEM_CHECK(t.ndim >= 0 && t.ndim <= kMaxDims, "CPU ", kernel, " got a tensor with ", t.ndim,
               " dimensions; at most ", kMaxDims, " are supported");
  for (int d = 0; d < t.ndim; ++d) {
    TANDEM_CHECK(t.sizes[d] >= 0, "CPU ", kernel, " got a negative size ", t.sizes[d],
                 " in dimension ", d);
  }
}

// ---- 16-bit floats ----
// Elements per chunk: the float buffers stay in L1.
inline constexpr int64_t kFloatChunk = 512;

// out[i] = float(in[i * stride]) for i < n.
template <typename T>
inline void LoadAsFloat(const T* in, int64_t stride, int64_t n, float* __restrict out) {
  if (stride == 1) {
    vec::ToFloatLoop(in, out, n);
  } else {
    for (int64_t i = 0; i < n; ++i)
      out[i] = vec::conversions_internal::ToFloatElement(in[i * stride]);
  }
}

// out[i * stride] = T(in[i]) for i < n, rounded to nearest even.
template <typename T>
inline void StoreRounded(const float* __restrict in, int64_t n, T* out, int64_t stride) {
  if (stride == 1) {
    vec::FromFloatLoop(in, out, n);
  } else {
    for (int64_t i = 0; i < n; ++i) {
      out[i * stride] = vec::conversions_internal::FromFloatElement<T>(in[i]);
    }
  }
}

// An element as its sum accumulator.
template <typename Acc, typename T>
inline Acc Widen(T x) {
  if constexpr (kIsReducedFloat<T>) {
    return static_cast<Acc>(vec::conversions_internal::ToFloatElement(x));
  } else {
    return static_cast<Acc>(x);
  }
}

// Whether `candidate` replaces `best` in a max (kMax) or min reduction. NaN wins over any
// number (PyTorch propagates NaN through max/min and its argmax picks the NaN); among equal
// values the earlier one stays.
template <bool kMax, typename T>
inline bool Replaces(T candidate, T best) {
  if constexpr (!std::is_integral_v<T>) {
    const OpMath<T> c = static_cast<OpMath<T>>(candidate), b = static_cast<OpMath<T>>(best);
    if (c != c) return b == b;  // NaN
    return kMax ? c > b : c < b;
  } else {
    return kMax ? candidate > best : candidate < best;
  }
}

}  // namespace cpu_internal
}  // namespace tandem

#endif  // TANDEM_TENSOR_CPU_INTERNAL_CPU_LOOPS_H_
