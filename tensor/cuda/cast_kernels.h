// The CUDA multi-tensor cast behind the ForeachCastKernel stub (tensor/kernels/cast_kernels.h):
// cast_kernels.cc registers it (making the device current, taking its LaunchContext),
// cast_kernels.cu defines it. Arguments are checked by RunForeachCast before the stub
// dispatches.
//
//   LaunchForeachCast(device.Launch(), kFloat32, kBFloat16, tensors);  // queued on the stream
//   CountForeachCastLaunches(tensors);  // 1 for GPT-2's 97 GEMM weights and biases
#ifndef TANDEM_TENSOR_CUDA_CAST_KERNELS_H_
#define TANDEM_TENSOR_CUDA_CAST_KERNELS_H_

#include <cstdint>
#include <vector>

#include "tensor/base/dtype.h"
#include "tensor/cuda/kernels.h"
#include "tensor/kernels/cast_kernels.h"

namespace tandem {
namespace cuda {

// Multi-tensor launches (multi_tensor_apply.h): the non-empty tensors packed into as few
// fixed-size lists as they need (119 tensors a list), one launch per list. Each element is
// rounded by the 16-bit type's constructor from float, the conversion of LaunchCopy.
void LaunchForeachCast(const LaunchContext& context, DType src_dtype, DType dst_dtype,
                       const std::vector<ForeachCastTensor>& tensors);

// How many launches LaunchForeachCast makes for `tensors` (the same packing, nothing launched).
int64_t CountForeachCastLaunches(const std::vector<ForeachCastTensor>& tensors);

}  // namespace cuda
}  // namespace tandem

#endif  // TANDEM_TENSOR_CUDA_CAST_KERNELS_H_
