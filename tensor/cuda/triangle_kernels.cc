// Registers the CUDA triangle kernel (tensor/kernels/triangle_kernels.h): triangle_kernels.cu's
// launch on the device's current stream. Part of :cuda_backend, which is linked whole.
#include "tensor/kernels/triangle_kernels.h"

#include <cstdint>

#include "tensor/base/dtype.h"
#include "tensor/cuda/cuda_device.h"
#include "tensor/cuda/kernels.h"
#include "tensor/runtime/kernel_stub.h"

namespace tandem {
namespace cuda {
namespace {

void CudaTriangle(int index, DType dtype, bool lower, int64_t diagonal, int64_t batch, int64_t rows,
                  int64_t cols, const void* src, void* dst) {
  LaunchOnDevice(index, &LaunchTriangle, dtype, lower, diagonal, batch, rows, cols, src, dst);
}

}  // namespace

TANDEM_REGISTER_KERNEL(TriangleKernel, DeviceType::kCUDA, CudaTriangle);

}  // namespace cuda
}  // namespace tandem
