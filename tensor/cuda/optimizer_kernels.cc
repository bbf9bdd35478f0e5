// Registers the CUDA fused optimizer kernels (tensor/kernels/optimizer_kernels.h): each makes
// its logical device's GPU current and queues optimizer_kernels.cu's launches on the device's
// current stream. Part of :cuda_backend, which is linked whole (alwayslink).
#include "tensor/cuda/optimizer_kernels.h"

#include "tensor/cuda/cuda_device.h"
#include "tensor/runtime/kernel_stub.h"

namespace tandem {
namespace cuda {
namespace {

template <typename Options, typename Tensor>
using Launcher = void (*)(const LaunchContext&, DType, const Options&, const std::vector<Tensor>&);

template <typename Options, typename Tensor>
void OnDevice(int index, DType dtype, const Options& options, const std::vector<Tensor>& tensors,
              Launcher<Options, Tensor> launch) {
  CudaDevice& device = CudaDevices::Get().device(index);
  DeviceGuard guard(device.physical());
  launch(device.Launch(), dtype, options, tensors);
}

void CudaFusedSgd(int index, DType dtype, const FusedSgdOptions& options,
                  const std::vector<FusedSgdTensor>& tensors) {
  OnDevice(index, dtype, options, tensors, &LaunchFusedSgd);
}
void CudaFusedAdam(int index, DType dtype, const FusedAdamOptions& options,
                   const std::vector<FusedAdamTensor>& tensors) {
  OnDevice(index, dtype, options, tensors, &LaunchFusedAdam);
}
void CudaFusedRmsprop(int index, DType dtype, const FusedRmspropOptions& options,
                      const std::vector<FusedRmspropTensor>& tensors) {
  OnDevice(index, dtype, options, tensors, &LaunchFusedRmsprop);
}

}  // namespace

TANDEM_REGISTER_KERNEL(FusedSgdKernel, DeviceType::kCUDA, CudaFusedSgd);
TANDEM_REGISTER_KERNEL(FusedAdamKernel, DeviceType::kCUDA, CudaFusedAdam);
TANDEM_REGISTER_KERNEL(FusedRmspropKernel, DeviceType::kCUDA, CudaFusedRmsprop);

}  // namespace cuda
}  // namespace tandem
