// Registers the CUDA gather and scatter-add kernels (tensor/kernels/index_kernels.h):
// index_kernels.cu's launches on the device's current stream. Part of :cuda_backend, which is
// linked whole.
#include "tensor/kernels/index_kernels.h"

#include <cstdint>

#include "tensor/base/dtype.h"
#include "tensor/cuda/cuda_device.h"
#include "tensor/cuda/kernels.h"
#include "tensor/runtime/kernel_stub.h"

namespace tandem {
namespace cuda {
namespace {

void CudaGatherColumns(int index, DType dtype, void* dst, const void* src, const int64_t* idx,
                       int64_t rows, int64_t cols, const char* op) {
  DeviceAssert* check = CudaDevices::Get().device(index).device_assert();
  LaunchOnDevice(index, &LaunchGatherColumns, dtype, dst, src, idx, rows, cols, check, op);
}

void CudaScatterAddColumns(int index, DType dtype, void* dst, const void* src, const int64_t* idx,
                           int64_t rows, int64_t cols) {
  LaunchOnDevice(index, &LaunchScatterAddColumns, dtype, dst, src, idx, rows, cols);
}

void CudaGather(int index, DType dtype, void* dst, const void* src, const int64_t* idx,
                int64_t outer, int64_t src_dim, int64_t idx_dim, int64_t inner, const char* op) {
  DeviceAssert* check = CudaDevices::Get().device(index).device_assert();
  LaunchOnDevice(index, &LaunchGather, dtype, dst, src, idx, outer, src_dim, idx_dim, inner, check,
                 op);
}

void CudaScatterAdd(int index, DType dtype, void* dst, const void* src, const int64_t* idx,
                    int64_t outer, int64_t dst_dim, int64_t idx_dim, int64_t inner) {
  LaunchOnDevice(index, &LaunchScatterAdd, dtype, dst, src, idx, outer, dst_dim, idx_dim, inner);
}

}  // namespace

TANDEM_REGISTER_KERNEL(GatherColumnsKernel, DeviceType::kCUDA, CudaGatherColumns);
TANDEM_REGISTER_KERNEL(ScatterAddColumnsKernel, DeviceType::kCUDA, CudaScatterAddColumns);
TANDEM_REGISTER_KERNEL(GatherKernel, DeviceType::kCUDA, CudaGather);
TANDEM_REGISTER_KERNEL(ScatterAddKernel, DeviceType::kCUDA, CudaScatterAdd);

}  // namespace cuda
}  // namespace tandem
