// Tests of convolution and pooling (tensor/ops/convolution.cc).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "tensor/gradcheck.h"
#include "tensor/ops/ops_testing.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace tandem {
namespace ops_testing {
namespace {

// ---- Convolution and pooling -----------------------------------------------------------------

std::vector<float> HostConv2d(const std::vector<float>& x, const Shape& xs,
                              const std::vector<float>& w, const Shape& ws,
                              const std::vector<float>* bias, int64_t stride, int64_t pad) {
  const int64_t n = xs[0], c = xs[1], h = xs[2], wd = xs[3];
  const int64_t o = ws[0], kh = ws[2], kw = ws[3];
  const int64_t oh = (h + 2 * pad - kh) / stride + 1, ow = (wd + 2 * pad - kw) / stride + 1;
  std::vector<float> out(n * o * oh * ow);
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t f = 0; f < o; ++f) {
      for (int64_t i = 0; i < oh; ++i) {
        for (int64_t j = 0; j < ow; ++j) {
          double s = bias ? (*bias)[f] : 0.0;
          for (int64_t ch = 0; ch < c; ++ch) {
            for (int64_t p = 0; p < kh; ++p) {
              for (int64_t q = 0; q < kw; ++q) {
                const int64_t y = i * stride - pad + p, xx = j * stride - pad + q;
                if (y < 0 || y >= h || xx < 0 || xx >= wd) continue;
                s += static_cast<double>(x[((b * c + ch) * h + y) * wd + xx]) *
                     w[((f * c + ch) * kh + p) * kw + q];
              }
            }
          }
          out[((b * o + f) * oh + i) * ow + j] = static_cast<float>(s);
        }
      }
    }
  }
  return out;
}

TEST_F(OpsTest, Conv2dMatchesTheHost) {
  struct Case {
    Shape x, w;
    int64_t stride, pad;
    bool bias;
  };
  uint64_t seed = 600;
  for (const Case& c : std::vector<Case>{{{2, 3, 7, 6}, {4, 3, 3, 3}, 1, 0, true},
                                         {{2, 3, 7, 6}, {4, 3, 3, 3}, 2, 1, false},
                                         {{1, 1, 5, 5}, {2, 1, 5, 5}, 1, 0, true},
                                         {{3, 2, 4, 5}, {1, 2, 1, 1}, 1, 0, true},
                                         {{1, 2, 6, 6}, {3, 2, 2, 3}, 3, 2, true},
                                         {{0, 2, 6, 6}, {3, 2, 3, 3}, 1, 1, true}}) {
    SCOPED_TRACE(ShapeToString(c.x) + " * " + ShapeToString(c.w) + " stride " +
                 std::to_string(c.stride) + " pad " + std::to_string(c.pad));
    const Tensor x = Randn(c.x, ++seed), w = Randn(c.w, ++seed), b = Randn({c.w[0]}, ++seed);
    const std::vector<float> bv = Values(b);
    const std::vector<float> expected =
        HostConv2d(Values(x), c.x, Values(w), c.w, c.bias ? &bv : nullptr, c.stride, c.pad);
    const Tensor y = conv2d(x, w, c.bias ? b : Tensor(), {c.stride, c.stride}, {c.pad, c.pad});
    const int64_t oh = (c.x[2] + 2 * c.pad - c.w[2]) / c.stride + 1;
    const int64_t ow = (c.x[3] + 2 * c.pad - c.w[3]) / c.stride + 1;
    ExpectValues(y, {c.x[0], c.w[0], oh, ow}, expected, 1e-5);
  }
}

TEST_F(OpsTest, Conv2dErrorsSayWhatToFix) {
  const Tensor w = zeros({32, 1, 3, 3});
  EXPECT_THAT(ErrorOf([&] {
                conv2d(zeros({2, 3, 8, 8}), w, Tensor());
              }),
              HasSubstr("conv2d: input has 3 channels but weight expects 1 (weight is "
                        "[32, 1, 3, 3]"));
  EXPECT_THAT(ErrorOf([&] {
                conv2d(zeros({2, 1, 2, 8}), w, Tensor());
              }),
              HasSubstr("conv2d: input is [2, 1, 2, 8] (2x8 with padding [0, 0]) but the kernel "
                        "is 3x3; the padded input must be at least as large as the kernel"));
  EXPECT_NO_THROW(conv2d(zeros({2, 1, 2, 8}), w, Tensor(), {1, 1}, {1, 1}));
  EXPECT_THAT(ErrorOf([&] {
                conv2d(zeros({1, 8, 8}), w, Tensor());
              }),
              HasSubstr("conv2d: input must be 4-D [N, C, H, W] but is [1, 8, 8]; add a batch "
                        "dimension with unsqueeze(0)"));
  EXPECT_THAT(ErrorOf([&] {
                conv2d(zeros({1, 1, 8, 8}), w, zeros({31}));
              }),
              HasSubstr("conv2d: bias must be [32] (out_channels) but is [31]"));
  EXPECT_THAT(ErrorOf([&] {
                conv2d(zeros({1, 1, 8, 8}), w, Tensor(), {0, 1});
              }),
              HasSubstr("conv2d: stride must be positive"));
  EXPECT_THAT(ErrorOf([&] {
                conv2d(zeros({1, 1, 8, 8}), w, Tensor(), {1, 1, 1});
              }),
              HasSubstr("conv2d: stride must have 1 or 2 values"));
  EXPECT_THAT(ErrorOf([&] {
                conv2d(zeros({1, 1, 8, 8}), w, Tensor(), {1, 1}, {-1, 0});
              }),
              HasSubstr("conv2d: padding must be non-negative"));
  EXPECT_THAT(ErrorOf([&] {
                conv2d(zeros({1, 1, 8, 8}), zeros({3, 3}), Tensor());
              }),
              HasSubstr("conv2d: weight must be 4-D"));
  EXPECT_THAT(ErrorOf([&] {
                conv2d(zeros({1, 1, 8, 8}, Device::Cpu(1)), w, Tensor());
              }),
              HasSubstr("conv2d: input is on cpu:1 and weight on cpu:0"));
}

std::vector<float> HostMaxPool(const std::vector<float>& x, const Shape& xs, int64_t k,
                               int64_t stride, int64_t pad) {
  const int64_t planes = xs[0] * xs[1], h = xs[2], w = xs[3];
  const int64_t oh = (h + 2 * pad - k) / stride + 1, ow = (w + 2 * pad - k) / stride + 1;
  std::vector<float> out;
  for (int64_t p = 0; p < planes; ++p) {
    for (int64_t i = 0; i < oh; ++i) {
      for (int64_t j = 0; j < ow; ++j) {
        float best = -INFINITY;
        for (int64_t a = 0; a < k; ++a) {
          for (int64_t b = 0; b < k; ++b) {
            const int64_t y = i * stride - pad + a, xx = j * stride - pad + b;
            if (y >= 0 && y < h && xx >= 0 && xx < w)
              best = std::max(best, x[(p * h + y) * w + xx]);
          }
        }
        out.push_back(best);
      }
    }
  }
  return out;
}

TEST_F(OpsTest, MaxPool2dMatchesTheHost) {
  const Shape shape = {2, 3, 7, 6};
  const Tensor x = Randn(shape, 61);
  const std::vector<float> xv = Values(x);
  ExpectValues(max_pool2d(x, {2, 2}), {2, 3, 3, 3}, HostMaxPool(xv, shape, 2, 2, 0), 0);
  ExpectValues(max_pool2d(x, {2}), {2, 3, 3, 3}, HostMaxPool(xv, shape, 2, 2, 0), 0);
  ExpectValues(max_pool2d(x, {3, 3}, {1, 1}), {2, 3, 5, 4}, HostMaxPool(xv, shape, 3, 1, 0), 0);
  ExpectValues(max_pool2d(x, {3, 3}, {2, 2}, {1, 1}), {2, 3, 4, 3}, HostMaxPool(xv, shape, 3, 2, 1),
               0);
  EXPECT_THAT(ErrorOf([&] {
                max_pool2d(x, {2, 2}, {2, 2}, {2, 2});
              }),
              HasSubstr("max_pool2d: padding must be between 0 and half the kernel size"));
  EXPECT_THAT(ErrorOf([&] {
                max_pool2d(x, {8, 8});
              }),
              HasSubstr("max_pool2d: input is [2, 3, 7, 6] (7x6 with padding [0, 0]) but the "
                        "window is 8x8"));
  EXPECT_THAT(ErrorOf([&] {
                max_pool2d(x, {0, 2});
              }),
              HasSubstr("max_pool2d: kernel_size must be positive"));
  EXPECT_THAT(ErrorOf([&] {
                max_pool2d(zeros({3, 4}), {2, 2});
              }),
              HasSubstr("max_pool2d: input must be 4-D"));
}

TEST_F(OpsTest, GradientsOfConv2d) {
  struct Case {
    Shape x, w;
    std::vector<int64_t> stride, padding;
    bool bias;
  };
  uint64_t seed = 310;
  for (const Case& c : std::vector<Case>{{{2, 2, 5, 5}, {3, 2, 3, 3}, {1, 1}, {0, 0}, true},
                                         {{1, 2, 5, 6}, {2, 2, 3, 2}, {2, 1}, {1, 0}, false},
                                         {{2, 1, 4, 4}, {2, 1, 2, 2}, {2, 2}, {1, 1}, true},
                                         {{1, 3, 3, 3}, {2, 3, 1, 1}, {1, 1}, {0, 0}, true}}) {
    SCOPED_TRACE(ShapeToString(c.x) + " * " + ShapeToString(c.w));
    const Tensor x = Param64(Randn(c.x, ++seed)), w = Param64(Randn(c.w, ++seed));
    const Tensor b = Param64(Randn({c.w[0]}, ++seed));
    if (c.bias) {
      EXPECT_GRADIENTS_MATCH(
          [&](const Inputs& in) { return conv2d(in[0], in[1], in[2], c.stride, c.padding); },
          {x, w, b}, kLinearEps);
    } else {
      EXPECT_GRADIENTS_MATCH(
          [&](const Inputs& in) { return conv2d(in[0], in[1], Tensor(), c.stride, c.padding); },
          {x, w}, kLinearEps);
    }
  }
}

TEST_F(OpsTest, GradientsOfMaxPool2d) {
  const Tensor x = Param64(Distinct({2, 2, 5, 5}, 321));
  EXPECT_GRADIENTS_MATCH(
      [](const Inputs& in) {
        return max_pool2d(in[0], {2, 2});
      },
      {x}, kLinearEps);
  EXPECT_GRADIENTS_MATCH(
      [](const Inputs& in) {
        return max_pool2d(in[0], {3, 3}, {1, 1});
      },
      {x}, kLinearEps);
  EXPECT_GRADIENTS_MATCH(
      [](const Inputs& in) {
        return max_pool2d(in[0], {3, 2}, {2, 1}, {1, 1});
      },
      {x}, kLinearEps);
}

}  // namespace
}  // namespace ops_testing
}  // namespace tandem
