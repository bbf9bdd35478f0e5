// Registers the CUDA pooling kernels (tensor/kernels/pooling_kernels.h): pooling_kernels.cu's
// launches on the device's current stream. Part of :cuda_backend, which is linked whole.
#include "tensor/kernels/pooling_kernels.h"

#include <cstdint>

#include "tensor/base/dtype.h"
#include "tensor/cuda/cuda_device.h"
#include "tensor/cuda/kernels.h"
#include "tensor/runtime/kernel_stub.h"

namespace tandem {
namespace cuda {
namespace {

void CudaMaxPool2d(int index, DType dtype, const Conv2dGeometry& g, const void* input, void* output,
                   int64_t* argmax) {
  LaunchOnDevice(index, &LaunchMaxPool2d, dtype, g, input, output, argmax);
}

void CudaMaxPool2dBackward(int index, DType dtype, const Conv2dGeometry& g, const void* grad_output,
                           const int64_t* argmax, void* grad_input) {
  LaunchOnDevice(index, &LaunchMaxPool2dBackward, dtype, g, grad_output, argmax, grad_input);
}

void CudaAvgPool2d(int index, DType dtype, const Conv2dGeometry& g, bool count_include_pad,
                   const void* input, void* output) {
  LaunchOnDevice(index, &LaunchAvgPool2d, dtype, g, count_include_pad, input, output);
}

void CudaAvgPool2dBackward(int index, DType dtype, const Conv2dGeometry& g, bool count_include_pad,
                           const void* grad_output, void* grad_input) {
  LaunchOnDevice(index, &LaunchAvgPool2dBackward, dtype, g, count_include_pad, grad_output,
                 grad_input);
}

void CudaAdaptiveAvgPool2d(int index, DType dtype, int64_t planes, int64_t height, int64_t width,
                           int64_t out_h, int64_t out_w, const void* input, void* output) {
  LaunchOnDevice(index, &LaunchAdaptiveAvgPool2d, dtype, planes, height, width, out_h, out_w, input,
                 output);
}

void CudaAdaptiveAvgPool2dBackward(int index, DType dtype, int64_t planes, int64_t height,
                                   int64_t width, int64_t out_h, int64_t out_w,
                                   const void* grad_output, void* grad_input) {
  LaunchOnDevice(index, &LaunchAdaptiveAvgPool2dBackward, dtype, planes, height, width, out_h,
                 out_w, grad_output, grad_input);
}

}  // namespace

TANDEM_REGISTER_KERNEL(MaxPool2dKernel, DeviceType::kCUDA, CudaMaxPool2d);
TANDEM_REGISTER_KERNEL(MaxPool2dBackwardKernel, DeviceType::kCUDA, CudaMaxPool2dBackward);
TANDEM_REGISTER_KERNEL(AvgPool2dKernel, DeviceType::kCUDA, CudaAvgPool2d);
TANDEM_REGISTER_KERNEL(AvgPool2dBackwardKernel, DeviceType::kCUDA, CudaAvgPool2dBackward);
TANDEM_REGISTER_KERNEL(AdaptiveAvgPool2dKernel, DeviceType::kCUDA, CudaAdaptiveAvgPool2d);
TANDEM_REGISTER_KERNEL(AdaptiveAvgPool2dBackwardKernel, DeviceType::kCUDA,
                       CudaAdaptiveAvgPool2dBackward);

}  // namespace cuda
}  // namespace tandem
