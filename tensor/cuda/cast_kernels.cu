// The multi-tensor cast launcher (cast_kernels.h): float32 tensors rounded to bfloat16 or
// float16, all of a call's tensors in as few launches as their lists need (multi_tensor_apply.h),
// instead of one cast launch per tensor. Each element goes through the 16-bit type's
// constructor from float (round to nearest even, NaN kept), which is what LaunchCopy's
// ConvertFn runs for a float32 -> 16-bit copy, so the bits are Tensor::to's on this device.
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "tensor/base/dtype.h"
#include "tensor/base/error.h"
#include "tensor/base/half.h"
#include "tensor/cuda/cast_kernels.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/launch_work.h"
#include "tensor/cuda/multi_tensor_apply.h"
#include "tools/cuda/device_counters.h"

namespace tandem {
namespace cuda {
namespace {

// Source and destination of each tensor.
using CastList = TensorChunkList<2, NoChunkExtra>;

template <typename To>
__global__ void ForeachCastKernel(CastList list, int64_t chunks) {
  ForEachChunk(list, chunks, [&](int s, int64_t begin, int64_t end) {
    const float* __restrict__ src = static_cast<const float*>(list.ptr[0][s]);
    To* __restrict__ dst = static_cast<To*>(list.ptr[1][s]);
    for (int64_t j = begin + threadIdx.x; j < end; j += blockDim.x) dst[j] = To(src[j]);
  });
}

// A plain launcher per instantiation: the simulator's rewrite of <<<>>> (--config=cudasim)
// needs the kernel named outside a generic lambda.
template <typename To>
void LaunchCast(const LaunchContext& context, const CastList& list, int64_t chunks) {
  ForeachCastKernel<To>
      <<<ChunkGrid(context, chunks), kChunkThreads, 0, context.stream>>>(list, chunks);
}

void FillCast(CastList& list, int s, const ForeachCastTensor& t) {
  list.ptr[0][s] = const_cast<void*>(t.src);
  list.ptr[1][s] = t.dst;
}

struct NoLaunch {
  void operator()(const CastList&, int64_t) const {}
};

}  // namespace

void LaunchForeachCast(const LaunchContext& context, DType src_dtype, DType dst_dtype,
                       const std::vector<ForeachCastTensor>& tensors) {
  CheckForeachCastDTypes("CUDA ForeachCastKernel", src_dtype, dst_dtype);
  const auto launch = dst_dtype == kBFloat16 ? &LaunchCast<BFloat16> : &LaunchCast<Half>;
  PackChunkLists<CastList>(tensors, FillCast, [&](const CastList& list, int64_t chunks) {
    launch(context, list, chunks);
    TANDEM_CUDA_CHECK_LAUNCH(context.device);
    const int64_t elements = ListElements(list);
    internal::RecordLaunchWork("ForeachCastKernel", ChunkGrid(context, chunks), elements);
    // A conversion an element: a float read and a 16-bit value written.
    DeclareKernelWork(static_cast<double>(elements),
                      static_cast<double>(elements) * (sizeof(float) + sizeof(uint16_t)));
  });
}

int64_t CountForeachCastLaunches(const std::vector<ForeachCastTensor>& tensors) {
  return PackChunkLists<CastList>(tensors, FillCast, NoLaunch());
}

}  // namespace cuda
}  // namespace tandem
