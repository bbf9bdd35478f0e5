// Registers the CUDA convolution helpers (Im2ColKernel, Col2ImKernel of
// tensor/kernels/conv_kernels.h): conv_kernels.cu's launches on the device's current stream. The
// CUDA backend has no direct convolution of its own, so conv2d takes im2col + cuBLAS there. Part
// of :cuda_backend, which is linked whole.
#include "tensor/kernels/conv_kernels.h"

#include "tensor/base/dtype.h"
#include "tensor/cuda/cuda_device.h"
#include "tensor/cuda/kernels.h"
#include "tensor/runtime/kernel_stub.h"

namespace tandem {
namespace cuda {
namespace {

void CudaIm2Col(int index, DType dtype, const Conv2dGeometry& g, const void* image, void* columns) {
  LaunchOnDevice(index, &LaunchIm2Col, dtype, g, image, columns);
}

void CudaCol2Im(int index, DType dtype, const Conv2dGeometry& g, const void* columns, void* image) {
  LaunchOnDevice(index, &LaunchCol2Im, dtype, g, columns, image);
}

}  // namespace

TANDEM_REGISTER_KERNEL(Im2ColKernel, DeviceType::kCUDA, CudaIm2Col);
TANDEM_REGISTER_KERNEL(Col2ImKernel, DeviceType::kCUDA, CudaCol2Im);

}  // namespace cuda
}  // namespace tandem
