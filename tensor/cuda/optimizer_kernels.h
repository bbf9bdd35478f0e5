// The CUDA fused optimizer launchers behind the KernelStubs of
// tensor/kernels/optimizer_kernels.h: optimizer_kernels.cc registers them (making the device
// current, taking its LaunchContext), optimizer_kernels.cu defines them. Arguments are checked by
// RunFusedSgd/RunFusedAdam/RunFusedRmsprop before the stub dispatches.
//
//   LaunchFusedAdam(device.Launch(), kFloat32, options, tensors);  // queued on the stream
//   CountFusedAdamLaunches(kFloat32, options, tensors);  // 3 for GPT-2's 148 parameters
#ifndef TANDEM_TENSOR_CUDA_OPTIMIZER_KERNELS_H_
#define TANDEM_TENSOR_CUDA_OPTIMIZER_KERNELS_H_

#include <cstdint>
#include <vector>

#include "tensor/base/dtype.h"
#include "tensor/cuda/kernels.h"
#include "tensor/kernels/optimizer_kernels.h"

namespace tandem {
namespace cuda {

// Multi-tensor launches (multi_tensor_apply.h): the non-empty tensors packed into as few
// fixed-size lists as they need, one launch per list. Defined in optimizer_kernels.cu, which nvcc
// compiles without FMA contraction so that the GPU rounds each step of the update as the CPU
// does.
void LaunchFusedSgd(const LaunchContext& context, DType dtype, const FusedSgdOptions& options,
                    const std::vector<FusedSgdTensor>& tensors);
void LaunchFusedAdam(const LaunchContext& context, DType dtype, const FusedAdamOptions& options,
                     const std::vector<FusedAdamTensor>& tensors);
void LaunchFusedRmsprop(const LaunchContext& context, DType dtype,
                        const FusedRmspropOptions& options,
                        const std::vector<FusedRmspropTensor>& tensors);

// How many launches LaunchFusedSgd/Adam/Rmsprop make for `tensors` (the same packing, nothing
// launched), for tests and for counting a step's launches.
int64_t CountFusedSgdLaunches(const std::vector<FusedSgdTensor>& tensors);
int64_t CountFusedAdamLaunches(DType dtype, const FusedAdamOptions& options,
                               const std::vector<FusedAdamTensor>& tensors);
int64_t CountFusedRmspropLaunches(const std::vector<FusedRmspropTensor>& tensors);

}  // namespace cuda
}  // namespace tandem

#endif  // TANDEM_TENSOR_CUDA_OPTIMIZER_KERNELS_H_
