// Tests of the CPU backend's convolution helpers (Im2Col, Col2Im) and pooling kernels against
// their definitions, NaN and ties included, on every vector unit and in the 16-bit floats.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/base/device.h"
#include "tensor/base/error.h"
#include "tensor/base/half.h"
#include "tensor/base/philox.h"
#include "tensor/cpu/cpu_backend_testing.h"
#include "tensor/kernels/conv_kernels.h"
#include "tensor/kernels/float_conversions.h"
#include "tensor/kernels/internal/elementwise_math.h"
#include "tensor/kernels/pooling_kernels.h"
#include "tensor/kernels/vectorized.h"
#include "tensor/runtime/backend.h"
#include "tensor/runtime/devices.h"

namespace tandem {
namespace {

using namespace ::tandem::cpu_backend_testing;  // NOLINT(build/namespaces)

TYPED_TEST_SUITE(ReducedFloatTest, ReducedFloatTypes);

// ---- Convolution helpers and pooling -----------------------------------------------------

// Strides, padding and dilation, rows long enough for the vector loops and short ones, and
// each in both column layouts.
std::vector<Conv2dGeometry> ConvGeometries() {
  std::vector<Conv2dGeometry> geometries = {Conv2dGeometry::Make(2, 3, 7, 9, 3, 3, 1, 1, 1, 1),
                                            Conv2dGeometry::Make(1, 2, 8, 5, 2, 3, 2, 1, 0, 1),
                                            Conv2dGeometry::Make(3, 1, 6, 6, 5, 4, 3, 2, 2, 2),
                                            Conv2dGeometry::Make(1, 1, 1, 1, 1, 1, 1, 1, 0, 0),
                                            Conv2dGeometry::Make(4, 16, 28, 28, 5, 5, 1, 1, 2, 2),
                                            Conv2dGeometry::Make(3, 2, 14, 37, 3, 3, 2, 2, 1, 1)};
  for (Conv2dGeometry g : {Conv2dGeometry::Make(2, 3, 11, 30, 3, 3, 1, 1, 2, 2),
                           Conv2dGeometry::Make(2, 2, 12, 19, 3, 2, 2, 1, 1, 3)}) {
    g.dilation_h = 2;
    g.dilation_w = 3;
    geometries.push_back(g);
  }
  const size_t count = geometries.size();
  for (size_t i = 0; i < count; ++i) {
    geometries.push_back(geometries[i]);
    geometries.back().batch_in_columns = true;
  }
  return geometries;
}

std::vector<float> ReferenceIm2Col(const Conv2dGeometry& g, const std::vector<float>& image) {
  const int64_t oh = g.out_h(), ow = g.out_w();
  std::vector<float> columns(g.batch * g.channels * g.kernel_h * g.kernel_w * oh * ow, kNaN);
  for (int64_t b = 0; b < g.batch; ++b) {
    for (int64_t c = 0; c < g.channels; ++c) {
      for (int64_t ky = 0; ky < g.kernel_h; ++ky) {
        for (int64_t kx = 0; kx < g.kernel_w; ++kx) {
          const int64_t row = g.columns_start(b, c, oh * ow) +
                              (ky * g.kernel_w + kx) * g.columns_tap_stride(oh * ow);
          for (int64_t y = 0; y < oh; ++y) {
            for (int64_t x = 0; x < ow; ++x) {
              const int64_t iy = y * g.stride_h - g.pad_h + ky * g.dilation_h;
              const int64_t ix = x * g.stride_w - g.pad_w + kx * g.dilation_w;
              const bool inside = iy >= 0 && iy < g.height && ix >= 0 && ix < g.width;
              columns[row + y * ow + x] =
                  inside ? image[((b * g.channels + c) * g.height + iy) * g.width + ix] : 0.0f;
            }
          }
        }
      }
    }
  }
  return columns;
}

TEST(CpuBackendTest, Im2ColMatchesTheDefinition) {
  WithEachThreadCount([] {
    for (const bool baseline : {false, true}) {
      const vec::BaselineVectorsForTesting vectors(baseline);
      for (const Conv2dGeometry& g : ConvGeometries()) {
        std::vector<float> image =
            RandomFloats(g.batch * g.channels * g.height * g.width, -1, 1, 18);
        const std::vector<float> expected = ReferenceIm2Col(g, image);
        std::vector<float> columns(expected.size(), kNaN);
        RunIm2Col(Device::Cpu(0), kFloat32, g, image.data(), columns.data());
        ASSERT_EQ(columns, expected);
      }
    }
  });
}

TEST(CpuBackendTest, Col2ImIsTheAdjointOfIm2Col) {
  WithEachThreadCount([] {
    for (const bool baseline : {false, true}) {
      const vec::BaselineVectorsForTesting vectors(baseline);
      for (const Conv2dGeometry& g : ConvGeometries()) {
        const int64_t image_size = g.batch * g.channels * g.height * g.width;
        const int64_t column_size =
            g.batch * g.channels * g.kernel_h * g.kernel_w * g.out_h() * g.out_w();
        std::vector<float> x = RandomFloats(image_size, -1, 1, 19);
        std::vector<float> y = RandomFloats(column_size, -1, 1, 20);
        std::vector<float> im2col_x(column_size), col2im_y(image_size, kNaN);
        RunIm2Col(Device::Cpu(0), kFloat32, g, x.data(), im2col_x.data());
        RunCol2Im(Device::Cpu(0), kFloat32, g, y.data(), col2im_y.data());
        // <col2im(y), x> == <y, im2col(x)>
        double lhs = 0, rhs = 0;
        for (int64_t i = 0; i < image_size; ++i) lhs += double{col2im_y[i]} * x[i];
        for (int64_t i = 0; i < column_size; ++i) rhs += double{y[i]} * im2col_x[i];
        EXPECT_NEAR(lhs, rhs, 1e-4 * (1 + std::abs(rhs)));
        // And elementwise: col2im sums every column entry into the pixel it came from.
        std::vector<float> expected(image_size, 0.0f);
        const std::vector<float> index_image = [&] {
          std::vector<float> v(image_size);
          std::iota(v.begin(), v.end(), 0.0f);
          return v;
        }();
        const std::vector<float> source = ReferenceIm2Col(g, index_image);
        const std::vector<float> ones(image_size, 1.0f);
        const std::vector<float> inside = ReferenceIm2Col(g, ones);  // 0 where padding
        for (int64_t i = 0; i < column_size; ++i) {
          if (inside[i] != 0.0f) expected[static_cast<int64_t>(source[i])] += y[i];
        }
        for (int64_t i = 0; i < image_size; ++i) ASSERT_NEAR(col2im_y[i], expected[i], 1e-5);
      }
    }
  });
}

TEST(CpuBackendTest, Im2ColRejectsBadGeometry) {
  float buffer[16] = {};
  EXPECT_THROW(RunIm2Col(Device::Cpu(0), kFloat32,
                         Conv2dGeometry::Make(1, 1, 2, 2, 3, 3, 1, 1, 0, 0), buffer, buffer),
               Error);
  EXPECT_THROW(RunIm2Col(Device::Cpu(0), kFloat32,
                         Conv2dGeometry::Make(1, 1, 4, 4, 2, 2, 0, 1, 0, 0), buffer, buffer),
               Error);
}

TEST(CpuBackendTest, MaxPoolWithPaddingMatchesTheDefinition) {
  WithEachThreadCount([] {
    for (const Conv2dGeometry& g : {Conv2dGeometry::Make(2, 3, 7, 9, 3, 3, 2, 2, 1, 1),
                                    Conv2dGeometry::Make(1, 2, 8, 5, 2, 2, 2, 2, 0, 0),
                                    Conv2dGeometry::Make(3, 4, 6, 6, 4, 3, 1, 2, 2, 1),
                                    Conv2dGeometry::Make(8, 32, 28, 28, 2, 2, 2, 2, 1, 0)}) {
      const int64_t plane = g.height * g.width, out_plane = g.out_h() * g.out_w();
      const int64_t planes = g.batch * g.channels;
      // Negative values so that padding (-inf, never chosen) cannot be confused with zeros,
      // and a coarse grid so that windows hold ties.
      std::vector<float> input = RandomFloats(planes * plane, -8, -1, 21);
      for (float& v : input) v = std::round(v);
      std::vector<float> output(planes * out_plane, kNaN);
      std::vector<int64_t> argmax(planes * out_plane, -1);
      RunMaxPool2d(Device::Cpu(0), kFloat32, g, input.data(), output.data(), argmax.data());
      for (int64_t p = 0; p < planes; ++p) {
        for (int64_t oy = 0; oy < g.out_h(); ++oy) {
          for (int64_t ox = 0; ox < g.out_w(); ++ox) {
            float best = -kInf;
            int64_t best_at = -1;
            for (int64_t ky = 0; ky < g.kernel_h; ++ky) {
              for (int64_t kx = 0; kx < g.kernel_w; ++kx) {
                const int64_t y = oy * g.stride_h - g.pad_h + ky;
                const int64_t x = ox * g.stride_w - g.pad_w + kx;
                if (y < 0 || y >= g.height || x < 0 || x >= g.width) continue;
                const float v = input[p * plane + y * g.width + x];
                // First in row-major window order on ties.
                if (best_at < 0 || v > best) {  // row-major window order: first tie stays
                  best = v;
                  best_at = y * g.width + x;
                }
              }
            }
            const int64_t o = p * out_plane + oy * g.out_w() + ox;
            ASSERT_EQ(output[o], best);
            ASSERT_EQ(argmax[o], best_at);
          }
        }
      }
      // Backward: each output's gradient lands on its argmax; overlapping windows add up.
      std::vector<float> grad_output = RandomFloats(planes * out_plane, -1, 1, 22);
      std::vector<float> grad_input(planes * plane, kNaN), expected(planes * plane, 0.0f);
      for (int64_t p = 0; p < planes; ++p) {
        for (int64_t o = 0; o < out_plane; ++o) {
          expected[p * plane + argmax[p * out_plane + o]] += grad_output[p * out_plane + o];
        }
      }
      RunMaxPool2dBackward(Device::Cpu(0), kFloat32, g, grad_output.data(), argmax.data(),
                           grad_input.data());
      for (int64_t i = 0; i < planes * plane; ++i) ASSERT_FLOAT_EQ(grad_input[i], expected[i]);
    }
  });
}

TEST(CpuBackendTest, MaxPoolPropagatesNaN) {
  const Conv2dGeometry g = Conv2dGeometry::Make(1, 1, 2, 2, 2, 2, 2, 2, 0, 0);
  std::vector<float> input = {1, kNaN, 3, kNaN};
  float output = 0;
  int64_t argmax = -1;
  RunMaxPool2d(Device::Cpu(0), kFloat32, g, input.data(), &output, &argmax);
  EXPECT_TRUE(std::isnan(output));
  EXPECT_EQ(argmax, 1);  // the first NaN
  EXPECT_THROW(
      RunMaxPool2d(Device::Cpu(0), kFloat32, Conv2dGeometry::Make(1, 1, 4, 4, 2, 2, 1, 1, 2, 2),
                   input.data(), &output, &argmax),
      Error);  // padding beyond half the kernel
}

uint32_t Bits(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  return bits;
}

// Max pooling's bits and argmax against the scan of each window in row-major order (NaN
// wins, the first NaN among several; ties, -0 against +0 included, keep the earlier), on
// rows long enough for the vector loops and their tails, with the baseline build and, where
// the CPU has it, the AVX2 one.
TEST(CpuBackendTest, MaxPoolMatchesTheScanBitForBitOnEveryVectorUnit) {
  float other_nan;  // a second NaN payload, to tell which NaN was taken
  const uint32_t other_nan_bits = Bits(kNaN) | 0x1234u;
  std::memcpy(&other_nan, &other_nan_bits, sizeof(other_nan));
  std::vector<Conv2dGeometry> geometries = {
      Conv2dGeometry::Make(2, 3, 28, 28, 2, 2, 2, 2, 0, 0),
      Conv2dGeometry::Make(1, 2, 9, 61, 2, 2, 2, 2, 1, 1),
      Conv2dGeometry::Make(2, 2, 7, 45, 3, 3, 1, 1, 1, 1),
      Conv2dGeometry::Make(1, 3, 11, 50, 3, 2, 3, 3, 1, 0),
      Conv2dGeometry::Make(1, 1, 5, 70, 1, 5, 1, 5, 0, 2),
      Conv2dGeometry::Make(1, 2, 10, 33, 4, 4, 2, 2, 2, 2),
      Conv2dGeometry::Make(1, 2, 11, 42, 3, 2, 1, 2, 1, 1),
  };
  for (Conv2dGeometry g : {Conv2dGeometry::Make(2, 2, 13, 39, 3, 3, 2, 2, 1, 1),
                           Conv2dGeometry::Make(1, 2, 12, 37, 2, 2, 2, 2, 0, 0),
                           Conv2dGeometry::Make(1, 1, 10, 44, 3, 3, 3, 3, 0, 1)}) {
    g.ceil_mode = true;
    geometries.push_back(g);
  }
  for (const bool baseline : {false, true}) {
    const vec::BaselineVectorsForTesting vectors(baseline);
    SCOPED_TRACE(baseline ? "baseline build" : "best vector unit");
    for (const Conv2dGeometry& g : geometries) {
      SCOPED_TRACE(::testing::Message()
                   << g.height << "x" << g.width << " kernel " << g.kernel_h << "x" << g.kernel_w
                   << " stride " << g.stride_h << "x" << g.stride_w << " pad " << g.pad_h << "x"
                   << g.pad_w << (g.ceil_mode ? " ceil" : ""));
      const int64_t plane = g.height * g.width, out_h = g.out_h(), out_w = g.out_w();
      const int64_t out_plane = out_h * out_w, planes = g.batch * g.channels;
      // A coarse grid for ties, zeros of both signs and a few NaNs of two payloads.
      std::vector<float> input = RandomFloats(planes * plane, -3, 3, 31);
      const std::vector<int64_t> kind = RandomInts(planes * plane, 0, 49, 32);
      for (int64_t i = 0; i < planes * plane; ++i) {
        input[i] = std::round(input[i]);
        if (input[i] == 0.0f && kind[i] % 2 == 0) input[i] = -0.0f;
        if (kind[i] == 0) input[i] = kNaN;
        if (kind[i] == 1) input[i] = other_nan;
      }
      std::vector<float> output(planes * out_plane, 7.0f);
      std::vector<int64_t> argmax(planes * out_plane, -1);
      RunMaxPool2d(Device::Cpu(0), kFloat32, g, input.data(), output.data(), argmax.data());
      for (int64_t p = 0; p < planes; ++p) {
        for (int64_t oy = 0; oy < out_h; ++oy) {
          for (int64_t ox = 0; ox < out_w; ++ox) {
            int64_t best_at = -1;
            for (int64_t y = oy * g.stride_h - g.pad_h; y < oy * g.stride_h - g.pad_h + g.kernel_h;
                 ++y) {
              for (int64_t x = ox * g.stride_w - g.pad_w;
                   x < ox * g.stride_w - g.pad_w + g.kernel_w; ++x) {
                if (y < 0 || y >= g.height || x < 0 || x >= g.width) continue;
                const float v = input[p * plane + y * g.width + x];
                const float best = best_at < 0 ? 0.0f : input[p * plane + best_at];
                if (best_at < 0 || v > best || (std::isnan(v) && !std::isnan(best))) {
                  best_at = y * g.width + x;
                }
              }
            }
            const int64_t o = p * out_plane + oy * out_w + ox;
            ASSERT_EQ(argmax[o], best_at) << "output " << oy << ", " << ox << " of plane " << p;
            ASSERT_EQ(Bits(output[o]), Bits(input[p * plane + best_at]))
                << "output " << oy << ", " << ox << " of plane " << p;
          }
        }
      }
    }
  }
}

TYPED_TEST(ReducedFloatTest, ConvolutionAndPoolingKernelsMatchFloat32) {
  using T = TypeParam;
  const DType dtype = DTypeOf<T>::value;
  Conv2dGeometry g = Conv2dGeometry::Make(2, 3, 9, 11, 3, 3, 2, 1, 1, 1);
  const int64_t image_size = g.batch * g.channels * g.height * g.width;
  const int64_t columns_size =
      g.batch * g.channels * g.kernel_h * g.kernel_w * g.out_h() * g.out_w();
  std::vector<T> image = Rounded<T>(RandomFloats(image_size, -2, 2, 81));
  image[4] = T(kNaN);
  const std::vector<float> image32 = Widened(image);
  // Im2Col moves values: exact.
  std::vector<float> columns32(columns_size);
  std::vector<T> columns(columns_size);
  RunIm2Col(Device::Cpu(0), kFloat32, g, image32.data(), columns32.data());
  RunIm2Col(Device::Cpu(0), dtype, g, image.data(), columns.data());
  for (int64_t i = 0; i < columns_size; ++i) ASSERT_TRUE(IsRounded(columns32[i], columns[i]));
  // Col2Im sums each pixel's taps in float, in the float32 kernel's order: rounded once.
  std::vector<T> grad_columns = Rounded<T>(RandomFloats(columns_size, -2, 2, 82));
  const std::vector<float> grad_columns32 = Widened(grad_columns);
  std::vector<float> summed32(image_size);
  std::vector<T> summed(image_size);
  RunCol2Im(Device::Cpu(0), kFloat32, g, grad_columns32.data(), summed32.data());
  RunCol2Im(Device::Cpu(0), dtype, g, grad_columns.data(), summed.data());
  for (int64_t i = 0; i < image_size; ++i) ASSERT_TRUE(IsRounded(summed32[i], summed[i]));

  // Max pooling (overlapping windows) and its backward, average pooling and adaptive average
  // pooling and their backwards: computed in float, rounded once.
  Conv2dGeometry pool = Conv2dGeometry::Make(2, 3, 9, 11, 3, 3, 2, 2, 1, 1);
  const int64_t out_size = pool.batch * pool.channels * pool.out_h() * pool.out_w();
  std::vector<float> pooled32(out_size);
  std::vector<T> pooled(out_size);
  std::vector<int64_t> at32(out_size), at(out_size);
  RunMaxPool2d(Device::Cpu(0), kFloat32, pool, image32.data(), pooled32.data(), at32.data());
  RunMaxPool2d(Device::Cpu(0), dtype, pool, image.data(), pooled.data(), at.data());
  ASSERT_EQ(at, at32);
  for (int64_t i = 0; i < out_size; ++i) ASSERT_TRUE(IsRounded(pooled32[i], pooled[i]));
  std::vector<T> grad_out = Rounded<T>(RandomFloats(out_size, -2, 2, 83));
  const std::vector<float> grad_out32 = Widened(grad_out);
  std::vector<float> grad_in32(image_size);
  std::vector<T> grad_in(image_size);
  RunMaxPool2dBackward(Device::Cpu(0), kFloat32, pool, grad_out32.data(), at.data(),
                       grad_in32.data());
  RunMaxPool2dBackward(Device::Cpu(0), dtype, pool, grad_out.data(), at.data(), grad_in.data());
  for (int64_t i = 0; i < image_size; ++i) ASSERT_TRUE(IsRounded(grad_in32[i], grad_in[i]));
  for (bool include_pad : {false, true}) {
    RunAvgPool2d(Device::Cpu(0), kFloat32, pool, include_pad, image32.data(), pooled32.data());
    RunAvgPool2d(Device::Cpu(0), dtype, pool, include_pad, image.data(), pooled.data());
    for (int64_t i = 0; i < out_size; ++i) ASSERT_TRUE(IsRounded(pooled32[i], pooled[i]));
    RunAvgPool2dBackward(Device::Cpu(0), kFloat32, pool, include_pad, grad_out32.data(),
                         grad_in32.data());
    RunAvgPool2dBackward(Device::Cpu(0), dtype, pool, include_pad, grad_out.data(), grad_in.data());
    for (int64_t i = 0; i < image_size; ++i) ASSERT_TRUE(IsRounded(grad_in32[i], grad_in[i]));
  }
  const int64_t planes = g.batch * g.channels, out_h = 4, out_w = 3;
  std::vector<float> adaptive32(planes * out_h * out_w);
  std::vector<T> adaptive(planes * out_h * out_w);
  AdaptiveAvgPool2dKernel(Device::Cpu(0), kFloat32, planes, g.height, g.width, out_h, out_w,
                          image32.data(), adaptive32.data());
  AdaptiveAvgPool2dKernel(Device::Cpu(0), dtype, planes, g.height, g.width, out_h, out_w,
                          image.data(), adaptive.data());
  for (size_t i = 0; i < adaptive.size(); ++i) ASSERT_TRUE(IsRounded(adaptive32[i], adaptive[i]));
  const std::vector<float> adaptive_grad32 = Widened(adaptive);
  AdaptiveAvgPool2dBackwardKernel(Device::Cpu(0), kFloat32, planes, g.height, g.width, out_h, out_w,
                                  adaptive_grad32.data(), grad_in32.data());
  AdaptiveAvgPool2dBackwardKernel(Device::Cpu(0), dtype, planes, g.height, g.width, out_h, out_w,
                                  adaptive.data(), grad_in.data());
  for (int64_t i = 0; i < image_size; ++i) ASSERT_TRUE(IsRounded(grad_in32[i], grad_in[i]));
}

TEST(BFloat16SelectionTest, TwoByTwoMaxPoolMatchesFloat32) {
  // Even widths (the whole-plane pair pass) and an odd one (the window loop), with NaNs,
  // ties and zeros of both signs among random values.
  for (int64_t width : {28, 14, 6, 7}) {
    SCOPED_TRACE("width " + std::to_string(width));
    const Conv2dGeometry g = Conv2dGeometry::Make(3, 5, 6, width, 2, 2, 2, 2, 0, 0);
    const int64_t size = g.batch * g.channels * g.height * g.width;
    std::vector<BFloat16> image = Rounded<BFloat16>(RandomFloats(size, -2, 2, 91));
    for (int64_t i = 0; i < size; i += 17) image[i] = BFloat16(kNaN);
    for (int64_t i = 3; i < size; i += 13) image[i] = image[i - 1];
    for (int64_t i = 5; i < size; i += 29) image[i] = BFloat16(i % 2 == 0 ? 0.0f : -0.0f);
    const std::vector<float> image32 = Widened(image);
    const int64_t out_size = g.batch * g.channels * g.out_h() * g.out_w();
    std::vector<float> pooled32(out_size);
    std::vector<BFloat16> pooled(out_size);
    std::vector<int64_t> at32(out_size), at(out_size);
    RunMaxPool2d(Device::Cpu(0), kFloat32, g, image32.data(), pooled32.data(), at32.data());
    RunMaxPool2d(Device::Cpu(0), kBFloat16, g, image.data(), pooled.data(), at.data());
    ASSERT_EQ(at, at32);
    for (int64_t i = 0; i < out_size; ++i) ASSERT_TRUE(IsRounded(pooled32[i], pooled[i])) << i;
  }
}

}  // namespace
}  // namespace tandem
