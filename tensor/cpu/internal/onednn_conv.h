// oneDNN 2-D convolution for the CPU backend: forward, gradient of the input and gradient of
// the weight of an NCHW convolution (groups = 1) in bfloat16 (float accumulation) or float32,
// without im2col's K-times-larger column matrix. In bfloat16, im2col and col2im cost more than
// the AVX512-BF16 GEMM saves; oneDNN's direct kernels read the image in place. CpuBackend's
// Conv2d* methods call these and fall back to im2col + GEMM when they return false.
//
//   if (!OneDnnConv2dForward(index, kBFloat16, g, out_channels, x, w, bias, y)) {
//     ...  // im2col + Gemm
//   }
//
// Threads: as the GEMM (Note [oneDNN threads] in onednn_matmul.cc), each oneDNN call runs on
// one thread of the device's pool, on a block of images whose size depends only on the shape;
// the weight gradient sums the blocks' float partial sums in block order, so results are
// bitwise the same whatever the number of threads.
#ifndef TANDEM_TENSOR_CPU_INTERNAL_ONEDNN_CONV_H_
#define TANDEM_TENSOR_CPU_INTERNAL_ONEDNN_CONV_H_

#include <cstdint>
#include <string>

#include "tensor/base/dtype.h"
#include "tensor/kernels/conv_geometry.h"

namespace tandem {

// Which part of a convolution's training step a oneDNN primitive computes.
enum class OneDnnConvPass { kForward, kBackwardData, kBackwardWeights };

// y [N, O, oh, ow] = conv(x [N, C, H, W], w [O, C, kh, kw]) (+ bias [O], nullable), every
// operand contiguous in `dtype`, the geometry's stride, padding and dilation; g.ceil_mode must
// be false. Returns false, having written nothing, where oneDNN has no kernel for it that is
// not its reference code (dtype, CPU, geometry): the caller's im2col path then computes.
bool OneDnnConv2dForward(int index, DType dtype, const Conv2dGeometry& g, int64_t out_channels,
                         const void* input, const void* weight, const void* bias, void* output);

// grad_input [N, C, H, W] from grad_output [N, O, oh, ow] and w (overwrites grad_input).
bool OneDnnConv2dBackwardData(int index, DType dtype, const Conv2dGeometry& g, int64_t out_channels,
                              const void* grad_output, const void* weight, void* grad_input);

// grad_weight [O, C, kh, kw] (and grad_bias [O] when not null) from x and grad_output, summed
// over the batch in float and rounded once (overwrites both).
bool OneDnnConv2dBackwardWeights(int index, DType dtype, const Conv2dGeometry& g,
                                 int64_t out_channels, const void* input, const void* grad_output,
                                 void* grad_weight, void* grad_bias);

// The oneDNN implementation a pass would use ("jit:avx512_core_bf16", ...), or "" where these
// functions return false. For tests and benchmarks.
std::string OneDnnConv2dImplementation(OneDnnConvPass pass, DType dtype, const Conv2dGeometry& g,
                                       int64_t out_channels, bool has_bias);

// Which float32 convolutions CpuBackend sends to oneDNN rather than im2col + GEMM (bfloat16
// always goes to oneDNN where it has a kernel). kMeasured is the default (see
// onednn_conv.cc); kNever and kAlways let a benchmark time both paths.
enum class OneDnnConvFloat32Policy { kMeasured, kNever, kAlways };
void SetOneDnnConvFloat32Policy(OneDnnConvFloat32Policy policy);
bool OneDnnConvPreferredForFloat32(const Conv2dGeometry& g, int64_t out_channels);

}  // namespace tandem

#endif  // TANDEM_TENSOR_CPU_INTERNAL_ONEDNN_CONV_H_
