// Registers the CUDA row-norm kernels (tensor/kernels/norm_kernels.h): norm_kernels.cu's
// launches on the device's current stream. Part of :cuda_backend, which is linked whole.
#include "tensor/kernels/norm_kernels.h"

#include <cstdint>

#include "tensor/base/dtype.h"
#include "tensor/cuda/cuda_device.h"
#include "tensor/cuda/kernels.h"
#include "tensor/runtime/kernel_stub.h"

namespace tandem {
namespace cuda {
namespace {

void CudaRowNorm(int index, DType dtype, DType io_dtype, bool rms, int64_t rows, int64_t cols,
                 double eps, const void* x, const void* residual, const void* weight,
                 const void* bias, void* y, void* sum, void* mean, void* rstd) {
  LaunchOnDevice(index, &LaunchRowNorm, dtype, io_dtype, rms, rows, cols, eps, x, residual, weight,
                 bias, y, sum, mean, rstd);
}

void CudaRowNormBackward(int index, DType dtype, DType io_dtype, bool rms, int64_t rows,
                         int64_t cols, const void* grad_y, const void* grad_sum, const void* x,
                         const void* mean, const void* rstd, const void* weight, void* grad_x,
                         void* grad_residual, void* grad_weight, void* grad_bias) {
  LaunchOnDevice(index, &LaunchRowNormBackward, dtype, io_dtype, rms, rows, cols, grad_y, grad_sum,
                 x, mean, rstd, weight, grad_x, grad_residual, grad_weight, grad_bias);
}

}  // namespace

TANDEM_REGISTER_KERNEL(RowNormKernel, DeviceType::kCUDA, CudaRowNorm);
TANDEM_REGISTER_KERNEL(RowNormBackwardKernel, DeviceType::kCUDA, CudaRowNormBackward);

}  // namespace cuda
}  // namespace tandem
