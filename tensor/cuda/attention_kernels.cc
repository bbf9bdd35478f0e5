// Registers the CUDA fused attention kernels (tensor/kernels/attention_kernels.h):
// attention_kernels.cu's launches on the device's current stream. Part of :cuda_backend, which
// is linked whole.
#include "tensor/kernels/attention_kernels.h"

#include "tensor/base/dtype.h"
#include "tensor/cuda/cuda_device.h"
#include "tensor/cuda/kernels.h"
#include "tensor/runtime/kernel_stub.h"

namespace tandem {
namespace cuda {
namespace {

void CudaAttentionForward(int index, DType dtype, const AttentionGeometry& g, const void* q,
                          const void* k, const void* v, const void* mask, void* out,
                          void* logsumexp) {
  LaunchOnDevice(index, &LaunchAttentionForward, dtype, g, q, k, v, mask, out, logsumexp);
}

void CudaAttentionBackward(int index, DType dtype, const AttentionGeometry& g, const void* q,
                           const void* k, const void* v, const void* mask, const void* out,
                           const void* dout, const void* logsumexp, void* dq, void* dk, void* dv) {
  LaunchOnDevice(index, &LaunchAttentionBackward, dtype, g, q, k, v, mask, out, dout, logsumexp, dq,
                 dk, dv);
}

}  // namespace

TANDEM_REGISTER_KERNEL(AttentionForwardKernel, DeviceType::kCUDA, CudaAttentionForward);
TANDEM_REGISTER_KERNEL(AttentionBackwardKernel, DeviceType::kCUDA, CudaAttentionBackward);

}  // namespace cuda
}  // namespace tandem
