// Conv2d (stride, padding, dilation, groups) against the convolution sum evaluated on the
// host; gradients, PyTorch's initialisation and printing, errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "nn/layers.h"
#include "nn/layers_test_util.h"

namespace tandem::nn {
namespace {

using testing::ErrorOf;
using testing::ExpectLayerGradients;
using ::testing::HasSubstr;
using testing::LayersTest;

// ---- Conv2d ----------------------------------------------------------------------------

// Direct evaluation of the convolution sum, on the host.
// With groups, output channel f sees the input channels of its group only; weight is
// [O, C / groups, kh, kw].
std::vector<float> ReferenceConv(const Tensor& input, const Tensor& weight, const Tensor& bias,
                                 int64_t stride, int64_t pad, int64_t dilation = 1,
                                 int64_t groups = 1) {
  const std::vector<float> x = input.to_vector<float>(), w = weight.to_vector<float>();
  const std::vector<float> b =
      bias.defined() ? bias.to_vector<float>() : std::vector<float>(weight.size(0), 0.0f);
  const int64_t n = input.size(0), c = input.size(1), h = input.size(2), wd = input.size(3);
  const int64_t o = weight.size(0), cg = weight.size(1), kh = weight.size(2), kw = weight.size(3);
  const int64_t oh = (h + 2 * pad - dilation * (kh - 1) - 1) / stride + 1;
  const int64_t ow = (wd + 2 * pad - dilation * (kw - 1) - 1) / stride + 1;
  std::vector<float> out;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t f = 0; f < o; ++f)
      for (int64_t y = 0; y < oh; ++y)
        for (int64_t z = 0; z < ow; ++z) {
          double acc = b[f];
          const int64_t first = f / (o / groups) * cg;  // the group's first input channel
          for (int64_t j = 0; j < cg; ++j)
            for (int64_t u = 0; u < kh; ++u)
              for (int64_t v = 0; v < kw; ++v) {
                const int64_t row = y * stride - pad + u * dilation;
                const int64_t col = z * stride - pad + v * dilation;
                if (row < 0 || row >= h || col < 0 || col >= wd) continue;
                acc += x[((i * c + first + j) * h + row) * wd + col] *
                       w[((f * cg + j) * kh + u) * kw + v];
              }
          out.push_back(static_cast<float>(acc));
        }
  return out;
}

TEST_F(LayersTest, Conv2dMatchesTheDefinition) {
  Conv2d conv(2, 3, 3, /*stride=*/2, /*padding=*/1);
  Tensor x = randn({2, 2, 7, 6});
  Tensor y = conv.forward(x);
  ASSERT_EQ(y.shape(), (Shape{2, 3, 4, 3}));
  const std::vector<float> expected = ReferenceConv(x, conv.weight(), conv.bias(), 2, 1);
  const std::vector<float> actual = y.to_vector<float>();
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_NEAR(actual[i], expected[i], 1e-4) << i;
  // Unbatched input.
  EXPECT_TRUE(allclose(conv.forward(x.select(0, 1)), y.select(0, 1), 1e-5, 1e-6));
  // Initialisation bound 1/sqrt(in_channels * kh * kw).
  const double bound = 1.0 / std::sqrt(2.0 * 9.0);
  for (float v : conv.weight().to_vector<float>()) EXPECT_LE(std::abs(v), bound);
  EXPECT_EQ(conv.weight().shape(), (Shape{3, 2, 3, 3}));
}

TEST_F(LayersTest, Conv2dGradients) {
  Conv2d conv(2, 3, 3, /*stride=*/2, /*padding=*/1);
  ExpectLayerGradients(
      conv, [&](const Tensor& x) { return conv.forward(x); }, randn({2, 2, 5, 5}));
  Conv2d plain(Conv2dOptions(1, 2, {2, 3}).bias(false));
  ExpectLayerGradients(
      plain, [&](const Tensor& x) { return plain.forward(x); }, randn({1, 1, 4, 5}));
}

TEST_F(LayersTest, Conv2dPrintsAndNamesItselfOnBadInput) {
  Conv2d conv(1, 32, 3);
  EXPECT_EQ(conv.ToString(), "Conv2d(1, 32, kernel_size=(3, 3), stride=(1, 1))");
  EXPECT_EQ(Conv2d(Conv2dOptions(3, 8, {3, 5}).stride(2).padding({1, 2}).bias(false)).ToString(),
            "Conv2d(3, 8, kernel_size=(3, 5), stride=(2, 2), padding=(1, 2), bias=False)");
  EXPECT_THAT(ErrorOf([&] {
                conv.forward(zeros({64, 3, 28, 28}));
              }),
              HasSubstr("Conv2d(1, 32, kernel_size=(3, 3), stride=(1, 1)): expected input with 1 "
                        "channels (dimension 1 of [N, C, H, W]) but got [64, 3, 28, 28]"));
  EXPECT_THAT(ErrorOf([&] {
                conv.forward(zeros({1, 1, 2, 5}));
              }),
              HasSubstr("Conv2d(1, 32, kernel_size=(3, 3), stride=(1, 1)): input [1, 1, 2, 5] is "
                        "too small: its 2x5 images (2x5 with padding) are smaller than the 3x3 "
                        "kernel"));
  EXPECT_THAT(ErrorOf([&] {
                conv.forward(zeros({28, 28}));
              }),
              HasSubstr("expected a 4-D input [N, C, H, W] (or 3-D [C, H, W]) but got [28, 28]"));
  EXPECT_THAT(ErrorOf([] { Conv2d(1, 2, 3, /*stride=*/0); }), HasSubstr("stride must be positive"));
}

// ---- Conv2d with dilation and groups -----------------------------------------------------

TEST_F(LayersTest, Conv2dWithDilationAndGroupsMatchesTheDefinition) {
  struct Case {
    int64_t in, out, kernel, stride, pad, dilation, groups;
  };
  for (const Case& c :
       {Case{2, 3, 3, 1, 2, 2, 1}, Case{4, 6, 3, 1, 1, 1, 2}, Case{4, 6, 3, 2, 2, 2, 2},
        Case{3, 3, 3, 1, 1, 1, 3}, Case{6, 4, 2, 1, 0, 3, 2},
        // At least 32 column rows per group: the batched-GEMM layout.
        Case{8, 6, 3, 1, 1, 1, 1}, Case{8, 4, 3, 2, 2, 2, 2}, Case{16, 16, 3, 1, 1, 1, 4}}) {
    SCOPED_TRACE(::testing::Message() << "in " << c.in << " out " << c.out << " dilation "
                                      << c.dilation << " groups " << c.groups);
    Conv2d conv(c.in, c.out, c.kernel, c.stride, c.pad, c.dilation, c.groups);
    EXPECT_EQ(conv.weight().shape(), (Shape{c.out, c.in / c.groups, c.kernel, c.kernel}));
    Tensor x = randn({2, c.in, 9, 8});
    Tensor y = conv.forward(x);
    const int64_t span = c.dilation * (c.kernel - 1) + 1;
    ASSERT_EQ(y.shape(), (Shape{2, c.out, (9 + 2 * c.pad - span) / c.stride + 1,
                                (8 + 2 * c.pad - span) / c.stride + 1}));
    const std::vector<float> expected =
        ReferenceConv(x, conv.weight(), conv.bias(), c.stride, c.pad, c.dilation, c.groups);
    const std::vector<float> actual = y.to_vector<float>();
    ASSERT_EQ(actual.size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) EXPECT_NEAR(actual[i], expected[i], 1e-4) << i;
  }
  // A group sees only its own channels: changing group 1's input leaves group 0's output.
  Conv2d grouped(Conv2dOptions(4, 4, 3).padding(1).groups(2).bias(false));
  Tensor x = randn({1, 4, 5, 5});
  Tensor changed = cat({x.narrow(1, 0, 2), randn({1, 2, 5, 5})}, 1);
  EXPECT_TRUE(allclose(grouped.forward(x).narrow(1, 0, 2), grouped.forward(changed).narrow(1, 0, 2),
                       0.0, 0.0));
  EXPECT_FALSE(allclose(grouped.forward(x).narrow(1, 2, 2),
                        grouped.forward(changed).narrow(1, 2, 2), 1e-3, 1e-3));
}

TEST_F(LayersTest, Conv2dWithDilationAndGroupsGradients) {
  Conv2d dilated(Conv2dOptions(2, 3, 3).padding(2).dilation(2));
  ExpectLayerGradients(
      dilated, [&](const Tensor& x) { return dilated.forward(x); }, randn({2, 2, 5, 6}));
  Conv2d grouped(Conv2dOptions(4, 6, {2, 3}).stride({2, 1}).padding(1).dilation({1, 2}).groups(2));
  ExpectLayerGradients(
      grouped, [&](const Tensor& x) { return grouped.forward(x); }, randn({2, 4, 5, 6}));
  Conv2d depthwise(Conv2dOptions(3, 3, 3).groups(3).bias(false));
  ExpectLayerGradients(
      depthwise, [&](const Tensor& x) { return depthwise.forward(x); }, randn({1, 3, 4, 4}));
  // 36 column rows per group: the batched-GEMM layout, with and without groups.
  Conv2d wide(Conv2dOptions(4, 3, 3).stride(2).padding(1).dilation({2, 1}));
  ExpectLayerGradients(
      wide, [&](const Tensor& x) { return wide.forward(x); }, randn({2, 4, 5, 4}));
  Conv2d wide_grouped(Conv2dOptions(8, 4, 3).padding(1).groups(2));
  ExpectLayerGradients(
      wide_grouped, [&](const Tensor& x) { return wide_grouped.forward(x); }, randn({2, 8, 3, 4}));
  Conv2d wide_plain(Conv2dOptions(4, 2, 3).bias(false));
  ExpectLayerGradients(
      wide_plain, [&](const Tensor& x) { return wide_plain.forward(x); }, randn({3, 4, 4, 3}));
}

TEST_F(LayersTest, Conv2dInitialisesAndPrintsLikePyTorch) {
  // kaiming_uniform_(a = sqrt(5)) and the bias: both uniform in ±1/sqrt(fan_in), with
  // fan_in = in_channels / groups * kh * kw.
  Conv2d conv(Conv2dOptions(64, 128, 3).groups(4));
  const double bound = 1.0 / std::sqrt(64.0 / 4 * 9);
  for (const Tensor& p : {conv.weight(), conv.bias()}) {
    const std::vector<float> values = p.to_vector<float>();
    const auto [low, high] = std::minmax_element(values.begin(), values.end());
    EXPECT_GE(*low, -bound);
    EXPECT_LE(*high, bound);
    EXPECT_LT(*low, -0.9 * bound);
    EXPECT_GT(*high, 0.9 * bound);
  }
  EXPECT_EQ(conv.ToString(), "Conv2d(64, 128, kernel_size=(3, 3), stride=(1, 1), groups=4)");
  EXPECT_EQ(Conv2d(4, 6, 3, 1, 2, 2, 2, false).ToString(),
            "Conv2d(4, 6, kernel_size=(3, 3), stride=(1, 1), padding=(2, 2), dilation=(2, 2), "
            "groups=2, bias=False)");
  EXPECT_EQ(Conv2d(Conv2dOptions(1, 2, 3).dilation({1, 3})).ToString(),
            "Conv2d(1, 2, kernel_size=(3, 3), stride=(1, 1), dilation=(1, 3))");
  EXPECT_THAT(ErrorOf([] { Conv2d(Conv2dOptions(6, 4, 3).groups(4)); }),
              HasSubstr("Conv2d: in_channels (6) must be divisible by groups (4)"));
  EXPECT_THAT(ErrorOf([] { Conv2d(Conv2dOptions(4, 6, 3).groups(4)); }),
              HasSubstr("Conv2d: out_channels (6) must be divisible by groups (4)"));
  EXPECT_THAT(ErrorOf([] { Conv2d(Conv2dOptions(4, 4, 3).dilation(0)); }),
              HasSubstr("Conv2d: dilation must be positive but is (0, 0)"));
  Conv2d dilated(Conv2dOptions(1, 1, 3).dilation(3));
  EXPECT_THAT(ErrorOf([&] {
                dilated.forward(zeros({1, 1, 6, 9}));
              }),
              HasSubstr("are smaller than the 7x7 kernel (with dilation)"));
  // The functional form names both sizes.
  EXPECT_THAT(ErrorOf([] {
                conv2d(zeros({1, 4, 5, 5}), zeros({2, 3, 3, 3}), Tensor(), {1}, {0}, {1}, 2);
              }),
              HasSubstr("conv2d: input has 4 channels but weight expects 6"));
  EXPECT_THAT(ErrorOf([] {
                conv2d(zeros({1, 4, 5, 5}), zeros({3, 2, 3, 3}), Tensor(), {1}, {0}, {1}, 2);
              }),
              HasSubstr("out_channels (weight.size(0) = 3) must be divisible by groups (2)"));
}

}  // namespace
}  // namespace tandem::nn
