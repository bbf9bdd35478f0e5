// im2col/col2im and pooling CUDA kernels against the CPU backend.
//
// Shared fixture and helpers: cuda_backend_testing.h. Skips (with the reason) where there is
// no usable GPU; set TANDEM_TEST_SEED to replay a run.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "tensor/base/error.h"
#include "tensor/cuda/cuda_backend_testing.h"
#include "tensor/kernels/conv_kernels.h"
#include "tensor/kernels/internal/elementwise_math.h"
#include "tensor/kernels/pooling_kernels.h"
#include "tensor/runtime/backend.h"

namespace tandem {
namespace cuda_test {

// ---- Convolution and pooling --------------------------------------------------------------------

const Conv2dGeometry kGeometries[] = {
    Conv2dGeometry::Make(2, 3, 7, 9, 3, 3, 1, 1, 1, 1),
    Conv2dGeometry::Make(1, 2, 8, 8, 2, 2, 2, 2, 0, 0),
    Conv2dGeometry::Make(2, 1, 5, 6, 3, 2, 2, 1, 1, 0),
    Conv2dGeometry::Make(1, 1, 1, 1, 1, 1, 1, 1, 0, 0),
    Conv2dGeometry::Make(3, 4, 28, 28, 5, 5, 1, 1, 2, 2),
    Conv2dGeometry::Make(2, 5, 13, 11, 3, 3, 2, 2, 1, 1),
    Conv2dGeometry::Make(0, 3, 4, 4, 3, 3, 1, 1, 1, 1),
};

std::string Describe(const Conv2dGeometry& g) {
  std::ostringstream out;
  out << "[" << g.batch << ", " << g.channels << ", " << g.height << ", " << g.width << "] kernel "
      << g.kernel_h << "x" << g.kernel_w << " stride " << g.stride_h << "x" << g.stride_w << " pad "
      << g.pad_h << "x" << g.pad_w;
  return out.str();
}

template <typename T>
void CudaBackendTest::ExpectIm2ColAndCol2ImMatch() {
  const DType dtype = DTypeOf<T>::value;
  for (const Conv2dGeometry& g : kGeometries) {
    const int64_t image_size = g.batch * g.channels * g.height * g.width;
    const int64_t column_size =
        g.batch * g.channels * g.kernel_h * g.kernel_w * g.out_h() * g.out_w();
    Buffer<T> image(Random<T>(image_size));
    Buffer<T> columns(column_size);
    RunIm2Col(Device::Cpu(0), dtype, g, image.cpu(), columns.cpu());
    RunIm2Col(Device::Cuda(0), dtype, g, image.gpu(), columns.gpu());
    ExpectBitwiseEqual(columns.Cpu(), columns.Gpu(),
                       Note(DTypePrefix<T>() + "im2col " + Describe(g)));
    // Col2Im adds in the CPU's order: bitwise equal too.
    Buffer<T> grad_columns(Random<T>(column_size));
    Buffer<T> grad_image(image_size);
    RunCol2Im(Device::Cpu(0), dtype, g, grad_columns.cpu(), grad_image.cpu());
    RunCol2Im(Device::Cuda(0), dtype, g, grad_columns.gpu(), grad_image.gpu());
    ExpectBitwiseEqual(grad_image.Cpu(), grad_image.Gpu(),
                       Note(DTypePrefix<T>() + "col2im " + Describe(g)));
  }
}

TEST_F(CudaBackendTest, Im2ColAndCol2Im) {
  ExpectIm2ColAndCol2ImMatch<float>();
  ExpectIm2ColAndCol2ImMatch<double>();
}

template <typename T>
void CudaBackendTest::ExpectMaxPoolMatches() {
  const DType dtype = DTypeOf<T>::value;
  for (const Conv2dGeometry& g : kGeometries) {
    if (2 * g.pad_h > g.kernel_h || 2 * g.pad_w > g.kernel_w) continue;
    const int64_t input_size = g.batch * g.channels * g.height * g.width;
    const int64_t output_size = g.batch * g.channels * g.out_h() * g.out_w();
    const std::string what = DTypePrefix<T>() + "max_pool2d " + Describe(g);
    // Few distinct values: many ties, which must resolve to the same (first) element.
    Buffer<T> input(RandomIntegers<T>(input_size, -3, 3));
    Buffer<T> output(output_size);
    Buffer<int64_t> argmax(output_size);
    RunMaxPool2d(Device::Cpu(0), dtype, g, input.cpu(), output.cpu(), argmax.cpu());
    RunMaxPool2d(Device::Cuda(0), dtype, g, input.gpu(), output.gpu(), argmax.gpu());
    ExpectBitwiseEqual(output.Cpu(), output.Gpu(), Note(what));
    ExpectEqual(argmax.Cpu(), argmax.Gpu(), Note(what + " argmax"));
    Buffer<T> grad_output(Random<T>(output_size));
    Buffer<T> grad_input(input_size);
    RunMaxPool2dBackward(Device::Cpu(0), dtype, g, grad_output.cpu(), argmax.cpu(),
                         grad_input.cpu());
    RunMaxPool2dBackward(Device::Cuda(0), dtype, g, grad_output.gpu(), argmax.gpu(),
                         grad_input.gpu());
    ExpectBitwiseEqual(grad_input.Cpu(), grad_input.Gpu(), Note(what + " backward"));
  }
}

TEST_F(CudaBackendTest, MaxPoolForwardAndBackward) {
  ExpectMaxPoolMatches<float>();
  ExpectMaxPoolMatches<double>();
}

// ---- float64 only ---------------------------------------------------------------------------
// The checks float64 has and float32 does not (the shared ones run both dtypes above).
// Kernels whose arithmetic is the same expression on both devices must agree bitwise.

TEST_F(CudaBackendFloat64Test, AvgPoolAndAdaptiveAvgPool) {
  for (const Conv2dGeometry& g : kGeometries) {
    if (2 * g.pad_h > g.kernel_h || 2 * g.pad_w > g.kernel_w) continue;
    const int64_t image_size = g.batch * g.channels * g.height * g.width;
    const int64_t output_size = g.batch * g.channels * g.out_h() * g.out_w();
    Buffer<double> image(Random<double>(image_size));
    Buffer<double> grad_output(Random<double>(output_size));

    for (bool count_include_pad : {false, true}) {
      const std::string how = count_include_pad ? " counting padding" : "";
      Buffer<double> averaged(output_size);
      RunAvgPool2d(Device::Cpu(0), kFloat64, g, count_include_pad, image.cpu(), averaged.cpu());
      RunAvgPool2d(Device::Cuda(0), kFloat64, g, count_include_pad, image.gpu(), averaged.gpu());
      ExpectBitwiseEqual(averaged.Cpu(), averaged.Gpu(),
                         Note("float64 avg_pool2d " + Describe(g) + how));
      Buffer<double> avg_grad(image_size);
      RunAvgPool2dBackward(Device::Cpu(0), kFloat64, g, count_include_pad, grad_output.cpu(),
                           avg_grad.cpu());
      RunAvgPool2dBackward(Device::Cuda(0), kFloat64, g, count_include_pad, grad_output.gpu(),
                           avg_grad.gpu());
      ExpectBitwiseEqual(avg_grad.Cpu(), avg_grad.Gpu(),
                         Note("float64 avg_pool2d backward " + Describe(g) + how));
    }
  }
  // Adaptive pooling, windows that overlap (7 -> 3) and that do not (8 -> 4), and upsampling.
  for (auto [in, out] : {std::pair<int64_t, int64_t>{7, 3}, {8, 4}, {3, 5}}) {
    const int64_t planes = 6;
    Buffer<double> input(Random<double>(planes * in * in));
    Buffer<double> output(planes * out * out);
    AdaptiveAvgPool2dKernel(Device::Cpu(0), kFloat64, planes, in, in, out, out, input.cpu(),
                            output.cpu());
    AdaptiveAvgPool2dKernel(Device::Cuda(0), kFloat64, planes, in, in, out, out, input.gpu(),
                            output.gpu());
    const std::string what = std::to_string(in) + " -> " + std::to_string(out);
    ExpectBitwiseEqual(output.Cpu(), output.Gpu(), Note("float64 adaptive_avg_pool2d " + what));
    Buffer<double> grad_output(Random<double>(planes * out * out));
    Buffer<double> grad_input(planes * in * in);
    AdaptiveAvgPool2dBackwardKernel(Device::Cpu(0), kFloat64, planes, in, in, out, out,
                                    grad_output.cpu(), grad_input.cpu());
    AdaptiveAvgPool2dBackwardKernel(Device::Cuda(0), kFloat64, planes, in, in, out, out,
                                    grad_output.gpu(), grad_input.gpu());
    ExpectBitwiseEqual(grad_input.Cpu(), grad_input.Gpu(),
                       Note("float64 adaptive_avg_pool2d backward " + what));
  }
}

// ---- bfloat16 and float16 ----------------------------------------------------------------

template <typename T>
void CudaBackendReducedTest::ExpectConvolutionAndPoolingMatch() {
  const DType dtype = DTypeOf<T>::value;
  const std::string prefix = DTypePrefix<T>();
  for (const Conv2dGeometry& g : kGeometries) {
    const int64_t image_size = g.batch * g.channels * g.height * g.width;
    const int64_t output_size = g.batch * g.channels * g.out_h() * g.out_w();
    const int64_t columns_size =
        g.batch * g.channels * g.kernel_h * g.kernel_w * g.out_h() * g.out_w();
    const std::string where = " " + Describe(g);
    Buffer<T> image(RandomReduced<T>(image_size));
    Buffer<float> wide_image = Wide(image);
    // im2col copies; col2im sums in float in the CPU's order: both bitwise.
    Buffer<T> columns(columns_size);
    Buffer<float> expected_columns(columns_size);
    RunIm2Col(Device::Cpu(0), kFloat32, g, wide_image.cpu(), expected_columns.cpu());
    RunIm2Col(Device::Cuda(0), dtype, g, image.gpu(), columns.gpu());
    ExpectBitwiseEqual(Rounded<T>(expected_columns.Cpu()), columns.Gpu(),
                       Note(prefix + "im2col" + where));
    Buffer<T> grad_columns(RandomReduced<T>(columns_size));
    Buffer<float> wide_grad_columns = Wide(grad_columns);
    Buffer<T> col2im(image_size);
    Buffer<float> expected_col2im(image_size);
    RunCol2Im(Device::Cpu(0), kFloat32, g, wide_grad_columns.cpu(), expected_col2im.cpu());
    RunCol2Im(Device::Cuda(0), dtype, g, grad_columns.gpu(), col2im.gpu());
    ExpectBitwiseEqual(Rounded<T>(expected_col2im.Cpu()), col2im.Gpu(),
                       Note(prefix + "col2im" + where));
    // Max pooling over small integers (ties), forward and backward.
    if (2 * g.pad_h > g.kernel_h || 2 * g.pad_w > g.kernel_w) continue;
    Buffer<T> ties(Rounded<T>(Widened(RandomIntegers<float>(image_size, -3, 3))));
    Buffer<float> wide_ties = Wide(ties);
    Buffer<T> pooled(output_size);
    Buffer<float> expected_pooled(output_size);
    Buffer<int64_t> argmax(output_size);
    Buffer<int64_t> expected_argmax(output_size);
    RunMaxPool2d(Device::Cpu(0), kFloat32, g, wide_ties.cpu(), expected_pooled.cpu(),
                 expected_argmax.cpu());
    RunMaxPool2d(Device::Cuda(0), dtype, g, ties.gpu(), pooled.gpu(), argmax.gpu());
    ExpectBitwiseEqual(Rounded<T>(expected_pooled.Cpu()), pooled.Gpu(),
                       Note(prefix + "max_pool2d" + where));
    ExpectEqual(expected_argmax.Cpu(), argmax.Gpu(), Note(prefix + "max_pool2d argmax" + where));
    Buffer<T> grad_output(RandomReduced<T>(output_size));
    Buffer<float> wide_grad_output = Wide(grad_output);
    Buffer<T> grad_input(image_size);
    Buffer<float> expected_grad_input(image_size);
    RunMaxPool2dBackward(Device::Cpu(0), kFloat32, g, wide_grad_output.cpu(), expected_argmax.cpu(),
                         expected_grad_input.cpu());
    RunMaxPool2dBackward(Device::Cuda(0), dtype, g, grad_output.gpu(), argmax.gpu(),
                         grad_input.gpu());
    ExpectBitwiseEqual(Rounded<T>(expected_grad_input.Cpu()), grad_input.Gpu(),
                       Note(prefix + "max_pool2d backward" + where));
    for (bool count_include_pad : {false, true}) {
      const std::string how = count_include_pad ? " counting padding" : "";
      Buffer<T> averaged(output_size);
      Buffer<float> expected_averaged(output_size);
      RunAvgPool2d(Device::Cpu(0), kFloat32, g, count_include_pad, wide_image.cpu(),
                   expected_averaged.cpu());
      RunAvgPool2d(Device::Cuda(0), dtype, g, count_include_pad, image.gpu(), averaged.gpu());
      ExpectBitwiseEqual(Rounded<T>(expected_averaged.Cpu()), averaged.Gpu(),
                         Note(prefix + "avg_pool2d" + where + how));
      Buffer<T> avg_grad(image_size);
      Buffer<float> expected_avg_grad(image_size);
      RunAvgPool2dBackward(Device::Cpu(0), kFloat32, g, count_include_pad, wide_grad_output.cpu(),
                           expected_avg_grad.cpu());
      RunAvgPool2dBackward(Device::Cuda(0), dtype, g, count_include_pad, grad_output.gpu(),
                           avg_grad.gpu());
      ExpectBitwiseEqual(Rounded<T>(expected_avg_grad.Cpu()), avg_grad.Gpu(),
                         Note(prefix + "avg_pool2d backward" + where + how));
    }
  }
  for (auto [in, out] : {std::pair<int64_t, int64_t>{7, 3}, {8, 4}, {3, 5}}) {
    const int64_t planes = 6;
    const std::string what = " " + std::to_string(in) + " -> " + std::to_string(out);
    Buffer<T> input(RandomReduced<T>(planes * in * in));
    Buffer<float> wide_input = Wide(input), expected(planes * out * out);
    Buffer<T> output(planes * out * out);
    AdaptiveAvgPool2dKernel(Device::Cpu(0), kFloat32, planes, in, in, out, out, wide_input.cpu(),
                            expected.cpu());
    AdaptiveAvgPool2dKernel(Device::Cuda(0), dtype, planes, in, in, out, out, input.gpu(),
                            output.gpu());
    ExpectBitwiseEqual(Rounded<T>(expected.Cpu()), output.Gpu(),
                       Note(prefix + "adaptive_avg_pool2d" + what));
    Buffer<T> grad_output(RandomReduced<T>(planes * out * out));
    Buffer<float> wide_grad = Wide(grad_output), expected_grad(planes * in * in);
    Buffer<T> grad_input(planes * in * in);
    AdaptiveAvgPool2dBackwardKernel(Device::Cpu(0), kFloat32, planes, in, in, out, out,
                                    wide_grad.cpu(), expected_grad.cpu());
    AdaptiveAvgPool2dBackwardKernel(Device::Cuda(0), dtype, planes, in, in, out, out,
                                    grad_output.gpu(), grad_input.gpu());
    ExpectBitwiseEqual(Rounded<T>(expected_grad.Cpu()), grad_input.Gpu(),
                       Note(prefix + "adaptive_avg_pool2d backward" + what));
  }
}

TEST_F(CudaBackendReducedTest, ConvolutionAndPoolingBFloat16) {
  ExpectConvolutionAndPoolingMatch<BFloat16>();
}
TEST_F(CudaBackendReducedTest, ConvolutionAndPoolingFloat16) {
  ExpectConvolutionAndPoolingMatch<Half>();
}

}  // namespace cuda_test
}  // namespace tandem
