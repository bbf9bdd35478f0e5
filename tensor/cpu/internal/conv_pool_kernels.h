// The CPU backend's convolution helpers (Im2Col, Col2Im: conv2d is im2col + GEMM where oneDNN
// does not take it) and pooling kernels (max, average, adaptive average, and their backward),
// over NCHW images split over cpu:`index`'s pool by planes or rows. CpuBackend's overrides call
// these after checking the index. Internal to the CPU backend.
//
//   cpu_internal::MaxPool2d(/*index=*/0, kFloat32, geometry, input, output, argmax);
#ifndef TANDEM_TENSOR_CPU_INTERNAL_CONV_POOL_KERNELS_H_
#define TANDEM_TENSOR_CPU_INTERNAL_CONV_POOL_KERNELS_H_

#include <cstdint>

#include "tensor/base/dtype.h"
#include "tensor/runtime/backend.h"

namespace tandem {
namespace cpu_internal {

// Backend::Im2Col, Col2Im and the pooling kernels (their contracts are in
// tensor/runtime/backend.h).
void Im2Col(int index, DType dtype, const Conv2dGeometry& g, const void* image, void* columns);
void Col2Im(int index, DType dtype, const Conv2dGeometry& g, const void* columns, void* image);
void MaxPool2d(int index, DType dtype, const Conv2dGeometry& g, const void* input, void* output,
               int64_t* argmax);
void MaxPool2dBackward(int index, DType dtype, const Conv2dGeometry& g, const void* grad_output,
                       const int64_t* argmax, void* grad_input);
void AvgPool2d(int index, DType dtype, const Conv2dGeometry& g, bool count_include_pad,
               const void* input, void* output);
void AvgPool2dBackward(int index, DType dtype, const Conv2dGeometry& g, bool count_include_pad,
                       const void* grad_output, void* grad_input);
void AdaptiveAvgPool2d(int index, DType dtype, int64_t planes, int64_t height, int64_t width,
                       int64_t out_h, int64_t out_w, const void* input, void* output);
void AdaptiveAvgPool2dBackward(int index, DType dtype, int64_t planes, int64_t height,
                               int64_t width, int64_t out_h, int64_t out_w, const void* grad_output,
                               void* grad_input);

}  // namespace cpu_internal
}  // namespace tandem

#endif  // TANDEM_TENSOR_CPU_INTERNAL_CONV_POOL_KERNELS_H_
