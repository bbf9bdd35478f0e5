// MaxPool2d, AvgPool2d and AdaptiveAvgPool2d: window maxima and means (ceil_mode,
// padding, count_include_pad), ties and NaN, gradients, printing and errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "nn/layers.h"
#include "nn/layers_test_util.h"

namespace tandem::nn {
namespace {

using testing::DistinctValues;
using testing::ErrorOf;
using testing::ExpectLayerGradients;
using ::testing::HasSubstr;
using testing::LayersTest;

// ---- MaxPool2d -------------------------------------------------------------------------

TEST_F(LayersTest, MaxPool2dTakesWindowMaxima) {
  MaxPool2d pool(2);
  Tensor x = from_vector(std::vector<float>{1, 2, 3, 4,    //
                                            5, 6, 7, 8,    //
                                            9, 0, -1, -2,  //
                                            3, 2, 9, 1},
                         {1, 1, 4, 4});
  EXPECT_EQ(pool.forward(x).to_vector<float>(), (std::vector<float>{6, 8, 9, 9}));
  // Stride 1, padding 1 (padding never wins).
  MaxPool2d overlapping(2, /*stride=*/1, /*padding=*/1);
  Tensor negative = -ones({1, 1, 2, 2});
  EXPECT_EQ(overlapping.forward(negative).shape(), (Shape{1, 1, 3, 3}));
  EXPECT_EQ(overlapping.forward(negative).to_vector<float>(), std::vector<float>(9, -1.0f));
  EXPECT_EQ(pool.forward(x.select(0, 0)).shape(), (Shape{1, 2, 2}));
}

TEST_F(LayersTest, MaxPool2dGradients) {
  MaxPool2d pool(2);
  ExpectLayerGradients(
      pool, [&](const Tensor& x) { return pool.forward(x); }, DistinctValues({2, 2, 4, 6}));
  MaxPool2d strided({3, 2}, Size2(2, 1), Size2(1, 0));
  ExpectLayerGradients(
      strided, [&](const Tensor& x) { return strided.forward(x); }, DistinctValues({1, 2, 5, 4}));
}

TEST_F(LayersTest, MaxPool2dPrintsAndNamesItselfOnBadInput) {
  MaxPool2d pool(2);
  EXPECT_EQ(pool.ToString(),
            "MaxPool2d(kernel_size=2, stride=2, padding=0, dilation=1, "
            "ceil_mode=False)");
  EXPECT_EQ(MaxPool2d({3, 2}, Size2(1), Size2(1, 0)).ToString(),
            "MaxPool2d(kernel_size=(3, 2), stride=1, padding=(1, 0), dilation=1, ceil_mode=False)");
  EXPECT_THAT(ErrorOf([&] {
                pool.forward(zeros({4, 3, 1, 8}));
              }),
              HasSubstr("MaxPool2d(kernel_size=2, stride=2, padding=0, dilation=1, "
                        "ceil_mode=False): input [4, 3, 1, 8] is too small: its 1x8 images (1x8 "
                        "with padding) are smaller than the 2x2 window"));
  EXPECT_THAT(ErrorOf([] { MaxPool2d(2, std::nullopt, 2); }),
              HasSubstr("padding must be between 0 and half the kernel size"));
}

// ---- MaxPool2d with ceil_mode ------------------------------------------------------------

TEST_F(LayersTest, MaxPool2dCeilModeKeepsThePartialLastWindow) {
  // 5x5 in 2x2 windows, stride 2: floor gives 2x2, ceil 3x3 (the last row and column alone).
  Tensor x = arange(25).to(kFloat32).reshape({1, 1, 5, 5});
  EXPECT_EQ(MaxPool2d(2).forward(x).shape(), (Shape{1, 1, 2, 2}));
  MaxPool2d ceil(2, std::nullopt, 0, /*ceil_mode=*/true);
  EXPECT_EQ(ceil.forward(x).to_vector<float>(),
            (std::vector<float>{6, 8, 9, 16, 18, 19, 21, 23, 24}));
  // With padding 1 a fourth window would start in the right padding: PyTorch drops it.
  MaxPool2d padded(2, 2, 1, /*ceil_mode=*/true);
  EXPECT_EQ(padded.forward(x).shape(), (Shape{1, 1, 3, 3}));
  // 6 wide, kernel 3, stride 2: floor 2, ceil 3 (the last window starts at 4, inside).
  EXPECT_EQ(MaxPool2d(3, 2, 0, true).forward(zeros({1, 1, 6, 6})).shape(), (Shape{1, 1, 3, 3}));
  EXPECT_EQ(MaxPool2d(3, 2).forward(zeros({1, 1, 6, 6})).shape(), (Shape{1, 1, 2, 2}));
  ExpectLayerGradients(
      ceil, [&](const Tensor& input) { return ceil.forward(input); }, DistinctValues({2, 2, 5, 7}));
  EXPECT_EQ(ceil.ToString(),
            "MaxPool2d(kernel_size=2, stride=2, padding=0, dilation=1, ceil_mode=True)");
}

TEST_F(LayersTest, MaxPool2dPicksTheFirstOfTiedMaximaAndTheFirstNaN) {
  // 3x3 windows, stride 2, padding 1 on 5x5 ones: windows start at -1, 1, 3 along each axis,
  // so each output's gradient goes to its window's first pixel inside: rows/columns 0, 1, 3.
  Tensor x = ones({1, 1, 5, 5});
  x.set_requires_grad(true);
  sum(MaxPool2d(3, 2, 1).forward(x)).backward();
  std::vector<float> expected(25, 0.0f);
  for (int r : {0, 1, 3})
    for (int c : {0, 1, 3}) expected[r * 5 + c] = 1.0f;
  EXPECT_EQ(x.grad().to_vector<float>(), expected);
  // NaN wins over numbers; of two NaNs the first in the window (row by row) is chosen.
  std::vector<float> values(16, 0.0f);
  values[1] = values[4] = std::numeric_limits<float>::quiet_NaN();  // (0, 1) and (1, 0)
  values[10] = 5.0f;
  Tensor y = from_vector(values, {1, 1, 4, 4});
  y.set_requires_grad(true);
  Tensor pooled = MaxPool2d(2).forward(y);
  EXPECT_TRUE(std::isnan(pooled.to_vector<float>()[0]));
  sum(pooled).backward();
  const std::vector<float> grad = y.grad().to_vector<float>();
  EXPECT_EQ(grad[1], 1.0f);
  EXPECT_EQ(grad[4], 0.0f);
  EXPECT_EQ(grad[10], 1.0f);
}

// ---- AvgPool2d, AdaptiveAvgPool2d ----------------------------------------------------------

TEST_F(LayersTest, AvgPool2dAveragesWindows) {
  // 1..16 in a 4x4 image.
  Tensor x = (arange(16).to(kFloat32) + 1.0).reshape({1, 1, 4, 4});
  EXPECT_EQ(AvgPool2d(2).forward(x).to_vector<float>(), (std::vector<float>{3.5, 5.5, 11.5, 13.5}));
  // 3x3 windows, stride 2, padding 1: the corners see 4, the edges 6, the centre 9 pixels.
  const std::vector<float> include = AvgPool2d(3, 2, 1).forward(x).to_vector<float>();
  const std::vector<float> sums = {14, 30, 57, 99};
  const std::vector<float> inside = {4, 6, 6, 9};
  const std::vector<float> exclude =
      AvgPool2d(3, 2, 1, false, /*count_include_pad=*/false).forward(x).to_vector<float>();
  for (int i = 0; i < 4; ++i) {
    EXPECT_FLOAT_EQ(include[i], sums[i] / 9.0f) << i;
    EXPECT_FLOAT_EQ(exclude[i], sums[i] / inside[i]) << i;
  }
  // ceil_mode: 5x5 by 2, a partial last window whose divisor is its part inside the input.
  Tensor ramp = arange(25).to(kFloat32).reshape({1, 1, 5, 5});
  EXPECT_EQ(AvgPool2d(2, std::nullopt, 0, /*ceil_mode=*/true).forward(ramp).to_vector<float>(),
            (std::vector<float>{3, 5, 6.5, 13, 15, 16.5, 20.5, 22.5, 24}));
  // Padding 1 and ceil_mode on 5x5: 3x3 outputs (a fourth window would start in the padding).
  // Output (0, 1) covers rows [-1, 1) and columns [1, 3): pixels 1 and 2, and two of padding.
  const std::vector<float> padded =
      AvgPool2d(2, 2, 1, /*ceil_mode=*/true).forward(ramp).to_vector<float>();
  ASSERT_EQ(padded.size(), 9u);
  EXPECT_FLOAT_EQ(padded[1], (1 + 2) / 4.0f);
  EXPECT_FLOAT_EQ(padded[8], (18 + 19 + 23 + 24) / 4.0f);
  EXPECT_FLOAT_EQ(AvgPool2d(2, 2, 1, true, false).forward(ramp).to_vector<float>()[1],
                  (1 + 2) / 2.0f);
  // Unbatched input, and gradients (overlapping windows, both divisors, ceil_mode).
  EXPECT_EQ(AvgPool2d(2).forward(x.select(0, 0)).shape(), (Shape{1, 2, 2}));
  for (bool count_include_pad : {true, false}) {
    AvgPool2d pool({3, 2}, Size2(2, 1), Size2(1, 1), /*ceil_mode=*/true, count_include_pad);
    ExpectLayerGradients(
        pool, [&](const Tensor& input) { return pool.forward(input); }, randn({2, 2, 6, 5}));
  }
}

TEST_F(LayersTest, AvgPool2dPrintsAndNamesItselfOnBadInput) {
  EXPECT_EQ(AvgPool2d(2).ToString(), "AvgPool2d(kernel_size=2, stride=2, padding=0)");
  EXPECT_EQ(AvgPool2d({3, 2}, Size2(1), Size2(1, 0)).ToString(),
            "AvgPool2d(kernel_size=(3, 2), stride=1, padding=(1, 0))");
  EXPECT_THAT(
      ErrorOf([] {
        AvgPool2d(2).forward(zeros({1, 1, 1, 4}));
      }),
      HasSubstr("AvgPool2d(kernel_size=2, stride=2, padding=0): input [1, 1, 1, 4] is too "
                "small: its 1x4 images (1x4 with padding) are smaller than the 2x2 window"));
  EXPECT_THAT(ErrorOf([] { AvgPool2d(2, std::nullopt, 2); }),
              HasSubstr("padding must be between 0 and half the kernel size"));
  EXPECT_THAT(ErrorOf([] {
                AvgPool2d(2).forward(zeros({4, 4}));
              }),
              HasSubstr("expected a 4-D input [N, C, H, W] (or 3-D [C, H, W]) but got [4, 4]"));
}

// adaptive_avg_pool2d by its definition, on the host.
std::vector<float> ReferenceAdaptiveAvgPool(const Tensor& input, int64_t oh, int64_t ow) {
  const std::vector<float> x = input.to_vector<float>();
  const int64_t planes = input.size(0) * input.size(1), h = input.size(2), w = input.size(3);
  std::vector<float> out;
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t i = 0; i < oh; ++i)
      for (int64_t j = 0; j < ow; ++j) {
        const int64_t y0 = static_cast<int64_t>(std::floor(double(i) * h / oh));
        const int64_t y1 = static_cast<int64_t>(std::ceil(double(i + 1) * h / oh));
        const int64_t x0 = static_cast<int64_t>(std::floor(double(j) * w / ow));
        const int64_t x1 = static_cast<int64_t>(std::ceil(double(j + 1) * w / ow));
        double sum = 0;
        for (int64_t y = y0; y < y1; ++y)
          for (int64_t z = x0; z < x1; ++z) sum += x[(p * h + y) * w + z];
        out.push_back(static_cast<float>(sum / ((y1 - y0) * (x1 - x0))));
      }
  return out;
}

TEST_F(LayersTest, AdaptiveAvgPool2dAveragesItsGridCells) {
  Tensor x = randn({2, 3, 5, 7});
  for (const auto& [oh, ow] :
       std::vector<std::pair<int64_t, int64_t>>{{2, 3}, {1, 1}, {5, 7}, {3, 4}, {7, 9}, {4, 2}}) {
    SCOPED_TRACE(::testing::Message() << oh << "x" << ow);
    Tensor y = AdaptiveAvgPool2d({oh, ow}).forward(x);
    ASSERT_EQ(y.shape(), (Shape{2, 3, oh, ow}));
    const std::vector<float> expected = ReferenceAdaptiveAvgPool(x, oh, ow);
    const std::vector<float> actual = y.to_vector<float>();
    for (size_t i = 0; i < expected.size(); ++i) EXPECT_NEAR(actual[i], expected[i], 1e-5) << i;
  }
  // Output 1: global average pooling; output = input size: the identity.
  EXPECT_TRUE(allclose(AdaptiveAvgPool2d(1).forward(x), x.mean({2, 3}, true), 1e-5, 1e-6));
  EXPECT_TRUE(allclose(AdaptiveAvgPool2d({5, 7}).forward(x), x, 0.0, 0.0));
  EXPECT_EQ(AdaptiveAvgPool2d(2).forward(x.select(0, 0)).shape(), (Shape{3, 2, 2}));
  for (Size2 size : {Size2(2, 3), Size2(1), Size2(4, 6)}) {
    AdaptiveAvgPool2d pool(size);
    ExpectLayerGradients(
        pool, [&](const Tensor& input) { return pool.forward(input); }, randn({2, 2, 5, 7}));
  }
  EXPECT_EQ(AdaptiveAvgPool2d(1).ToString(), "AdaptiveAvgPool2d(output_size=1)");
  EXPECT_EQ(AdaptiveAvgPool2d({2, 3}).ToString(), "AdaptiveAvgPool2d(output_size=(2, 3))");
  EXPECT_THAT(ErrorOf([] { AdaptiveAvgPool2d(0); }),
              HasSubstr("AdaptiveAvgPool2d: output_size must be positive but is (0, 0)"));
  EXPECT_THAT(ErrorOf([] {
                AdaptiveAvgPool2d(2).forward(zeros({1, 1, 0, 3}));
              }),
              HasSubstr("has empty images"));
}

}  // namespace
}  // namespace tandem::nn
