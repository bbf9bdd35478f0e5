// The CPU's direct convolution kernels (the optional Conv2d*Kernel stubs of
// tensor/kernels/conv_kernels.h): oneDNN's convolution for bfloat16, and for float32 where it
// measured faster than im2col + GEMM (OneDnnConvPreferredForFloat32). Returning false sends
// conv2d to im2col + GEMM. Registered at static initialisation: part of :cpu_backend, which is
// linked whole.
#include <cstdint>

#include "tensor/base/dtype.h"
#include "tensor/cpu/internal/cpu_loops.h"
#include "tensor/cpu/internal/onednn_conv.h"
#include "tensor/kernels/conv_kernels.h"
#include "tensor/runtime/kernel_stub.h"

namespace tandem {
namespace cpu_internal {
namespace {

bool UseOneDnnConv(DType dtype, const Conv2dGeometry& g, int64_t out_channels) {
  return dtype == DType::kBFloat16 ||
         (dtype == DType::kFloat32 && OneDnnConvPreferredForFloat32(g, out_channels));
}

bool CpuConv2dForward(int index, DType dtype, const Conv2dGeometry& g, int64_t out_channels,
                      const void* input, const void* weight, const void* bias, void* output) {
  CheckCpuIndex(index);
  return UseOneDnnConv(dtype, g, out_channels) &&
         OneDnnConv2dForward(index, dtype, g, out_channels, input, weight, bias, output);
}

bool CpuConv2dBackwardData(int index, DType dtype, const Conv2dGeometry& g, int64_t out_channels,
                           const void* grad_output, const void* weight, void* grad_input) {
  CheckCpuIndex(index);
  return UseOneDnnConv(dtype, g, out_channels) &&
         OneDnnConv2dBackwardData(index, dtype, g, out_channels, grad_output, weight, grad_input);
}

bool CpuConv2dBackwardWeights(int index, DType dtype, const Conv2dGeometry& g, int64_t out_channels,
                              const void* input, const void* grad_output, void* grad_weight,
                              void* grad_bias) {
  CheckCpuIndex(index);
  return UseOneDnnConv(dtype, g, out_channels) &&
         OneDnnConv2dBackwardWeights(index, dtype, g, out_channels, input, grad_output, grad_weight,
                                     grad_bias);
}

}  // namespace

TANDEM_REGISTER_KERNEL(Conv2dForwardKernel, DeviceType::kCPU, CpuConv2dForward);
TANDEM_REGISTER_KERNEL(Conv2dBackwardDataKernel, DeviceType::kCPU, CpuConv2dBackwardData);
TANDEM_REGISTER_KERNEL(Conv2dBackwardWeightsKernel, DeviceType::kCPU, CpuConv2dBackwardWeights);

}  // namespace cpu_internal
}  // namespace tandem
