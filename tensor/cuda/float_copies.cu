// WidenedCopy and NarrowInto of internal/float_copies.cuh (Note [16-bit via float] there): the
// 16-bit <-> float copies of the kernels that run 16-bit dtypes on float copies.
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/internal/float_copies.cuh"
#include "tensor/cuda/internal/launch_utils.cuh"
#include "tensor/cuda/kernels.h"

namespace tandem {
namespace cuda {

namespace {

// out[i] = fn(in[i]) for contiguous operands: 8 elements a thread through 128-bit accesses
// (Map1PackedKernel, as Copy's casts) where both are aligned to their Pack, else one at a time.
template <typename Out, typename In, typename Fn>
void MapContiguous(const LaunchContext& context, Out* out, const In* in, int64_t n, Fn fn) {
  constexpr int kN = kPackOf<Out, In>;
  if (PackAligned<kN>(out) && PackAligned<kN>(in)) {
    Map1PackedKernel<kN>
        <<<GridFor(context, (n + kN - 1) / kN), kThreads, 0, context.stream>>>(out, in, n, fn);
  } else {
    Map1ContiguousKernel<<<GridFor(context, n), kThreads, 0, context.stream>>>(out, in, n, fn);
  }
  TANDEM_CUDA_CHECK_LAUNCH(context.device);
}

}  // namespace

template <typename T>
std::shared_ptr<void> WidenedCopy(const LaunchContext& context, const T* src, int64_t n) {
  std::shared_ptr<void> copy = context.workspace->Allocate(n * sizeof(float));
  MapContiguous(context, static_cast<float*>(copy.get()), src, n, ConvertFn<float, T>{});
  return copy;
}

template <typename T>
void NarrowInto(const LaunchContext& context, T* dst, const void* src, int64_t n) {
  MapContiguous(context, dst, static_cast<const float*>(src), n, ConvertFn<T, float>{});
}

template std::shared_ptr<void> WidenedCopy(const LaunchContext&, const BFloat16*, int64_t);
template std::shared_ptr<void> WidenedCopy(const LaunchContext&, const Half*, int64_t);
template void NarrowInto(const LaunchContext&, BFloat16*, const void*, int64_t);
template void NarrowInto(const LaunchContext&, Half*, const void*, int64_t);

}  // namespace cuda
}  // namespace tandem
