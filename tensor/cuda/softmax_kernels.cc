// Registers the CUDA softmax kernel (tensor/kernels/softmax_kernels.h): softmax_kernels.cu's
// launch on the device's current stream. Part of :cuda_backend, which is linked whole.
#include "tensor/kernels/softmax_kernels.h"

#include <cstdint>

#include "tensor/base/dtype.h"
#include "tensor/cuda/cuda_device.h"
#include "tensor/cuda/kernels.h"
#include "tensor/runtime/kernel_stub.h"

namespace tandem {
namespace cuda {
namespace {

void CudaSoftmax(int index, DType dtype, bool log, void* dst, const void* src, int64_t outer,
                 int64_t dim, int64_t inner) {
  LaunchOnDevice(index, &LaunchSoftmax, dtype, log, dst, src, outer, dim, inner);
}

}  // namespace

TANDEM_REGISTER_KERNEL(SoftmaxKernel, DeviceType::kCUDA, CudaSoftmax);

}  // namespace cuda
}  // namespace tandem
