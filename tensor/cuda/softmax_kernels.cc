// Registers the CUDA softmax and fused cross-entropy kernels (tensor/kernels/softmax_kernels.h):
// softmax_kernels.cu's launches on the device's current stream. Part of :cuda_backend, which is
// linked whole.
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

void CudaCrossEntropyForward(int index, DType dtype, void* row_loss, void* lse, const void* logits,
                             const int64_t* targets, int64_t rows, int64_t cols, const char* op) {
  DeviceAssert* check = CudaDevices::Get().device(index).device_assert();
  LaunchOnDevice(index, &LaunchCrossEntropyForward, dtype, row_loss, lse, logits, targets, rows,
                 cols, check, op);
}

void CudaCrossEntropyBackward(int index, DType dtype, void* grad_logits, const void* logits,
                              const void* lse, const int64_t* targets, const void* grad,
                              double scale, int64_t rows, int64_t cols) {
  LaunchOnDevice(index, &LaunchCrossEntropyBackward, dtype, grad_logits, logits, lse, targets, grad,
                 scale, rows, cols);
}

}  // namespace

TANDEM_REGISTER_KERNEL(SoftmaxKernel, DeviceType::kCUDA, CudaSoftmax);
TANDEM_REGISTER_KERNEL(CrossEntropyForwardKernel, DeviceType::kCUDA, CudaCrossEntropyForward);
TANDEM_REGISTER_KERNEL(CrossEntropyBackwardKernel, DeviceType::kCUDA, CudaCrossEntropyBackward);

}  // namespace cuda
}  // namespace tandem
