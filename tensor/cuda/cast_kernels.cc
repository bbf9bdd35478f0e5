// Registers the CUDA multi-tensor cast (tensor/kernels/cast_kernels.h): makes the logical
// device's GPU current and queues cast_kernels.cu's launches on the device's current stream.
// Part of :cuda_backend, which is linked whole (alwayslink).
#include "tensor/cuda/cast_kernels.h"

#include <vector>

#include "tensor/base/dtype.h"
#include "tensor/cuda/cuda_device.h"
#include "tensor/runtime/kernel_stub.h"

namespace tandem {
namespace cuda {
namespace {

void CudaForeachCast(int index, DType src_dtype, DType dst_dtype,
                     const std::vector<ForeachCastTensor>& tensors) {
  LaunchOnDevice(index, &LaunchForeachCast, src_dtype, dst_dtype, tensors);
}

}  // namespace

TANDEM_REGISTER_KERNEL(ForeachCastKernel, DeviceType::kCUDA, CudaForeachCast);

}  // namespace cuda
}  // namespace tandem
