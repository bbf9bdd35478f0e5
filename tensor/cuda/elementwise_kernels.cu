// Elementwise CUDA kernels for CudaBackend (Copy, Fill, Unary, Binary). See kernels.h for the
// contract; the other families are in the *_kernels.cu files beside this one.
//
// Shapes used throughout:
//   - Elementwise kernels are grid-stride loops over the output's elements: a grid of a
//     few blocks per SM covers any size, and each thread walks the tensor in steps of the
//     whole grid so that neighbouring threads touch neighbouring elements (coalesced).
//   - Contiguous float32, bfloat16 and float16 operands (casts between them included) aligned
//     to their Pack go through 128-bit loads and stores: 4 floats or 8 16-bit elements a
//     thread, which cuts the memory instructions of a bandwidth-bound loop 4-8 fold; the last
//     n % 4 (or 8) elements take a scalar tail, and unaligned views the scalar kernel.
//   - Anything else takes a strided path: dimensions are merged where every operand is
//     contiguous across them (as in the CPU backend), then each thread turns its linear
//     index into an offset per operand. Index arithmetic is 32-bit whenever every offset
//     fits, because 64-bit division is emulated on the GPU and would dominate the loop.
//
// The dtype conversions of Copy (ConvertFn), Map1ContiguousKernel and Map1PackedKernel are in
// internal/float_copies.cuh, which the 16-bit kernels through float copies share; Pack and
// kPackOf in internal/launch_utils.cuh.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "tensor/base/error.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/internal/float_copies.cuh"
#include "tensor/cuda/internal/launch_utils.cuh"
#include "tensor/cuda/kernels.h"
#include "tensor/kernels/internal/elementwise_math.h"
#include "tensor/kernels/internal/strided_layout.h"

namespace tandem {
namespace cuda {
namespace {

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
// kernel, a packed (128-bit) kernel for aligned contiguous float operands, and a strided kernel.

template <typename T>
__global__ void FillContiguousKernel(T* dst, int64_t n, T value) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) dst[i] = value;
}

template <int kN, typename T>
__global__ void FillPackedKernel(T* dst, int64_t n, T value) {
  const int64_t packs = n / kN;
  Pack<T, kN> v;
#pragma unroll
  for (int k = 0; k < kN; ++k) v.v[k] = value;
  Pack<T, kN>* dst_packs = reinterpret_cast<Pack<T, kN>*>(dst);
  for (int64_t i = GlobalThread(); i < packs; i += GridThreads()) dst_packs[i] = v;
  for (int64_t i = kN * packs + GlobalThread(); i < n; i += GridThreads()) dst[i] = value;
}

template <typename T, typename Index>
__global__ void FillStridedKernel(T* dst, DeviceLayout<1, Index> layout, Index n, T value) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    Index offsets[1];
    layout.Offsets(static_cast<Index>(i), offsets);
    dst[offsets[0]] = value;
  }
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

template <int kN, typename Out, typename T, typename Fn>
__global__ void Map2PackedKernel(Out* dst, const T* a, const T* b, int64_t n, Fn fn) {
  const int64_t packs = n / kN;
  const Pack<T, kN>* a_packs = reinterpret_cast<const Pack<T, kN>*>(a);
  const Pack<T, kN>* b_packs = reinterpret_cast<const Pack<T, kN>*>(b);
  Pack<Out, kN>* dst_packs = reinterpret_cast<Pack<Out, kN>*>(dst);
  for (int64_t i = GlobalThread(); i < packs; i += GridThreads()) {
    const Pack<T, kN> x = a_packs[i];
    const Pack<T, kN> y = b_packs[i];
    Pack<Out, kN> z;
#pragma unroll
    for (int k = 0; k < kN; ++k) z.v[k] = fn(x.v[k], y.v[k]);
    dst_packs[i] = z;
  }
  for (int64_t i = kN * packs + GlobalThread(); i < n; i += GridThreads()) dst[i] = fn(a[i], b[i]);
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
    constexpr int kN = kPackOf<T>;
    if constexpr (kN > 0) {
      if (PackAligned<kN>(out)) {
        FillPackedKernel<kN>
            <<<GridFor(context, (n + kN - 1) / kN), kThreads, 0, context.stream>>>(out, n, value);
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
    constexpr int kN = kPackOf<Out, In>;
    if constexpr (kN > 0) {
      if (PackAligned<kN>(out) && PackAligned<kN>(in)) {
        Map1PackedKernel<kN>
            <<<GridFor(context, (n + kN - 1) / kN), kThreads, 0, context.stream>>>(out, in, n, fn);
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
    constexpr int kN = kPackOf<Out, T>;
    if constexpr (kN > 0) {
      if (PackAligned<kN>(out) && PackAligned<kN>(x) && PackAligned<kN>(y)) {
        Map2PackedKernel<kN><<<GridFor(context, (n + kN - 1) / kN), kThreads, 0, context.stream>>>(
            out, x, y, n, fn);
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

}  // namespace

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

}  // namespace cuda
}  // namespace tandem
