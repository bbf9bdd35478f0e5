// The pooling kernels of max_pool2d, avg_pool2d and adaptive_avg_pool2d and their backward
// (KernelStub, tensor/runtime/kernel_stub.h), over contiguous NCHW floating operands (float32,
// float64, bfloat16, float16; windows sum in float or wider). Each backend registers its kernels
// beside its code (tensor/cpu/conv_pool_kernels.cc, tensor/cuda/pooling_kernels.cc);
// tensor/ops/convolution.cc calls the Run* functions, which check the geometry once and dispatch
// on the device's type (the adaptive kernels take plain sizes and are called directly).
//
//   RunMaxPool2d(x.device(), x.dtype(), geometry, x_ptr, out_ptr, argmax_ptr);
//   AdaptiveAvgPool2dKernel(x.device(), x.dtype(), planes, h, w, out_h, out_w, x_ptr, out_ptr);
#ifndef TANDEM_TENSOR_KERNELS_POOLING_KERNELS_H_
#define TANDEM_TENSOR_KERNELS_POOLING_KERNELS_H_

#include <cstdint>

#include "tensor/base/device.h"
#include "tensor/base/dtype.h"
#include "tensor/kernels/conv_geometry.h"
#include "tensor/runtime/kernel_stub.h"

namespace tandem {

// Max pooling (padding counts as -inf). Writes the output and, per output element, the flat
// index (within its H*W plane) of the chosen input element.
TANDEM_DECLARE_KERNEL(MaxPool2dKernel, void(int index, DType dtype, const Conv2dGeometry& g,
                                            const void* input, void* output, int64_t* argmax));
// grad_input (zeroed here first) += grad_output at the argmax positions.
TANDEM_DECLARE_KERNEL(MaxPool2dBackwardKernel,
                      void(int index, DType dtype, const Conv2dGeometry& g, const void* grad_output,
                           const int64_t* argmax, void* grad_input));
// Average pooling, as PyTorch's avg_pool2d: each output is the sum of its window's pixels inside
// the image, divided by the window's size clipped to the padded input (count_include_pad) or to
// the image (otherwise). Dilation must be 1.
TANDEM_DECLARE_KERNEL(AvgPool2dKernel,
                      void(int index, DType dtype, const Conv2dGeometry& g, bool count_include_pad,
                           const void* input, void* output));
// The adjoint of AvgPool2d (overwrites grad_input).
TANDEM_DECLARE_KERNEL(AvgPool2dBackwardKernel,
                      void(int index, DType dtype, const Conv2dGeometry& g, bool count_include_pad,
                           const void* grad_output, void* grad_input));
// Adaptive average pooling of `planes` contiguous height x width planes into out_h x out_w:
// output (i, j) is the mean of rows [floor(i * height / out_h), ceil((i + 1) * height / out_h))
// and likewise of columns, as PyTorch's adaptive_avg_pool2d.
TANDEM_DECLARE_KERNEL(AdaptiveAvgPool2dKernel,
                      void(int index, DType dtype, int64_t planes, int64_t height, int64_t width,
                           int64_t out_h, int64_t out_w, const void* input, void* output));
// The adjoint of AdaptiveAvgPool2d (overwrites grad_input).
TANDEM_DECLARE_KERNEL(AdaptiveAvgPool2dBackwardKernel,
                      void(int index, DType dtype, int64_t planes, int64_t height, int64_t width,
                           int64_t out_h, int64_t out_w, const void* grad_output,
                           void* grad_input));

// Check the geometry (CheckConv2dGeometry; max pooling also its padding, at most half the
// kernel, and that images with outputs have a pixel), then call the kernel of `device`'s type.
void RunMaxPool2d(Device device, DType dtype, const Conv2dGeometry& g, const void* input,
                  void* output, int64_t* argmax);
void RunMaxPool2dBackward(Device device, DType dtype, const Conv2dGeometry& g,
                          const void* grad_output, const int64_t* argmax, void* grad_input);
void RunAvgPool2d(Device device, DType dtype, const Conv2dGeometry& g, bool count_include_pad,
                  const void* input, void* output);
void RunAvgPool2dBackward(Device device, DType dtype, const Conv2dGeometry& g,
                          bool count_include_pad, const void* grad_output, void* grad_input);

}  // namespace tandem

#endif  // TANDEM_TENSOR_KERNELS_POOLING_KERNELS_H_
