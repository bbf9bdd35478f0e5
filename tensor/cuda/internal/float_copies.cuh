// Dtype conversion on the GPU and the 16-bit kernels through float copies (Note [16-bit via
// float] below; WidenedCopy and NarrowInto are in float_copies.cu), shared by the CUDA kernel
// files of tensor/cuda (private to them). Include it from a .cu file only, e.g.
//   RunInFloat<T>(context, in, in_n, out, out_n, [&](auto in, auto out) {
//     MyKernel<Element<decltype(in)>><<<...>>>(in, out);
//   });
#ifndef TANDEM_TENSOR_CUDA_INTERNAL_FLOAT_COPIES_CUH_
#define TANDEM_TENSOR_CUDA_INTERNAL_FLOAT_COPIES_CUH_

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <type_traits>

#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/internal/launch_utils.cuh"
#include "tensor/cuda/kernels.h"
#include "tensor/kernels/internal/elementwise_math.h"

namespace tandem {
namespace cuda {
// Defined in float_copies.cu for BFloat16 and Half, the types RunInFloat copies: a kernel launch
// must be in a .cu file, the only files the simulator (--config=cudasim) rewrites.
template <typename T>
std::shared_ptr<void> WidenedCopy(const LaunchContext& context, const T* src, int64_t n);
template <typename T>
void NarrowInto(const LaunchContext& context, T* dst, const void* src, int64_t n);

// Unnamed: each .cu file that includes this gets its own copy of these kernels and helpers,
// as when all kernels were in one file, so no kernel symbol is shared between files.
namespace {

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

template <typename Out, typename In, typename Fn>
__global__ void Map1ContiguousKernel(Out* dst, const In* src, int64_t n, Fn fn) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) dst[i] = fn(src[i]);
}

// The contiguous kernels for operands aligned to their Pack: kN elements a thread at a time
// (each through the same fn as the scalar kernel, so the results are its bits), the last
// n % kN elements a scalar tail.
template <int kN, typename Out, typename In, typename Fn>
__global__ void Map1PackedKernel(Out* dst, const In* src, int64_t n, Fn fn) {
  const int64_t packs = n / kN;
  const Pack<In, kN>* src_packs = reinterpret_cast<const Pack<In, kN>*>(src);
  Pack<Out, kN>* dst_packs = reinterpret_cast<Pack<Out, kN>*>(dst);
  for (int64_t i = GlobalThread(); i < packs; i += GridThreads()) {
    const Pack<In, kN> x = src_packs[i];
    Pack<Out, kN> y;
#pragma unroll
    for (int k = 0; k < kN; ++k) y.v[k] = fn(x.v[k]);
    dst_packs[i] = y;
  }
  for (int64_t i = kN * packs + GlobalThread(); i < n; i += GridThreads()) dst[i] = fn(src[i]);
}

// ---- 16-bit kernels through float copies ------------------------------------------------
// Note [16-bit via float]: kernels whose shared math (pooling_math.h) reads and sums in its
// element type run for bfloat16/float16 on float copies in workspace memory: the input
// widened (exact), the float32 kernel, the output rounded once per element. The result is by
// construction the float32 kernel's on the widened input, rounded (the contract of 16-bit
// kernels), for two extra passes over memory; only average pooling and scatter-add take this
// path. Workspace blocks go back to the allocator when the launcher returns, while the kernels
// may still be queued: safe, because it hands them out again only to work on this same stream.

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
}  // namespace cuda
}  // namespace tandem

#endif  // TANDEM_TENSOR_CUDA_INTERNAL_FLOAT_COPIES_CUH_
