// The convolution kernels of conv2d (KernelStub, tensor/runtime/kernel_stub.h) over contiguous
// NCHW floating operands (float32, float64, bfloat16, float16): Im2Col and Col2Im, which every
// backend has (conv2d is im2col + GEMM + col2im), and a backend's own direct convolution
// (Conv2dForward, Conv2dBackwardData, Conv2dBackwardWeights), which is optional. Each backend
// registers its kernels beside its code (tensor/cpu/conv_pool_kernels.cc, tensor/cpu/
// onednn_conv_kernels.cc, tensor/cuda/conv_kernels.cc); tensor/ops/convolution.cc calls RunIm2Col
// and RunCol2Im, which check the geometry once, and looks the direct kernels up with Find.
//
//   RunIm2Col(x.device(), x.dtype(), geometry, image_ptr, columns_ptr);
//   if (auto* conv = Conv2dForwardKernel.Find(x.device().type());
//       conv == nullptr || !conv(x.device().index(), dtype, g, out_channels, x, w, b, y)) {
//     ...  // im2col + GEMM
//   }
#ifndef TANDEM_TENSOR_KERNELS_CONV_KERNELS_H_
#define TANDEM_TENSOR_KERNELS_CONV_KERNELS_H_

#include <cstdint>

#include "tensor/base/device.h"
#include "tensor/base/dtype.h"
#include "tensor/kernels/conv_geometry.h"
#include "tensor/runtime/kernel_stub.h"

namespace tandem {

// Unfolds images into columns (zero padding) laid out as g.batch_in_columns says.
TANDEM_DECLARE_KERNEL(Im2ColKernel, void(int index, DType dtype, const Conv2dGeometry& g,
                                         const void* image, void* columns));
// The adjoint of Im2Col: sums columns back into images (overwrites `image`).
TANDEM_DECLARE_KERNEL(Col2ImKernel, void(int index, DType dtype, const Conv2dGeometry& g,
                                         const void* columns, void* image));

// A convolution (groups = 1, the geometry's stride, padding and dilation) by a kernel of the
// backend's own: forward (bias nullable), the input's gradient, and the weight's (and bias's,
// when grad_bias is not null) summed over the batch. Each returns false, having written nothing,
// where the kernel does not take this dtype or geometry; a device type may register none.
TANDEM_DECLARE_KERNEL(Conv2dForwardKernel,
                      bool(int index, DType dtype, const Conv2dGeometry& g, int64_t out_channels,
                           const void* input, const void* weight, const void* bias, void* output));
TANDEM_DECLARE_KERNEL(Conv2dBackwardDataKernel,
                      bool(int index, DType dtype, const Conv2dGeometry& g, int64_t out_channels,
                           const void* grad_output, const void* weight, void* grad_input));
TANDEM_DECLARE_KERNEL(Conv2dBackwardWeightsKernel,
                      bool(int index, DType dtype, const Conv2dGeometry& g, int64_t out_channels,
                           const void* input, const void* grad_output, void* grad_weight,
                           void* grad_bias));

// Check the geometry (CheckConv2dGeometry), then call the kernel of `device`'s type.
void RunIm2Col(Device device, DType dtype, const Conv2dGeometry& g, const void* image,
               void* columns);
void RunCol2Im(Device device, DType dtype, const Conv2dGeometry& g, const void* columns,
               void* image);

}  // namespace tandem

#endif  // TANDEM_TENSOR_KERNELS_CONV_KERNELS_H_
