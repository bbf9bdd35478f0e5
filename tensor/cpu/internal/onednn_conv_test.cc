// oneDNN convolution (forward, data and weight gradients) against a direct double-precision
// convolution of the same (rounded) inputs, in bfloat16 and float32, over the trainer CNN's
// shapes, strides, padding, dilation and uneven batch blocks; bitwise the same results
// whatever the number of threads; what it declines.
#include "tensor/cpu/internal/onednn_conv.h"

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/base/half.h"
#include "tensor/runtime/backend.h"
#include "tensor/runtime/devices.h"

namespace tandem {
namespace {

struct Case {
  int64_t batch, channels, size, out_channels, kernel, stride, pad, dilation;
};

std::string Describe(const Case& c) {
  return "N=" + std::to_string(c.batch) + " C=" + std::to_string(c.channels) +
         " HW=" + std::to_string(c.size) + " O=" + std::to_string(c.out_channels) +
         " k=" + std::to_string(c.kernel) + " s=" + std::to_string(c.stride) +
         " p=" + std::to_string(c.pad) + " d=" + std::to_string(c.dilation);
}

Conv2dGeometry Geometry(const Case& c) {
  Conv2dGeometry g = Conv2dGeometry::Make(c.batch, c.channels, c.size, c.size, c.kernel, c.kernel,
                                          c.stride, c.stride, c.pad, c.pad);
  g.dilation_h = g.dilation_w = c.dilation;
  return g;
}

// Values in T and the doubles they hold exactly.
template <typename T>
struct Values {
  std::vector<T> data;
  std::vector<double> exact;
};

template <typename T>
Values<T> Random(int64_t n, std::mt19937* rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Values<T> v;
  for (int64_t i = 0; i < n; ++i) {
    v.data.push_back(T(normal(*rng)));
    v.exact.push_back(static_cast<double>(static_cast<float>(v.data.back())));
  }
  return v;
}

// The three passes computed directly in double: y, dx (from dy) and dw, db (from x, dy).
struct Reference {
  std::vector<double> y, dx, dw, db;
};

Reference Direct(const Conv2dGeometry& g, int64_t o, const std::vector<double>& x,
                 const std::vector<double>& w, const std::vector<double>& bias,
                 const std::vector<double>& dy) {
  const int64_t oh = g.out_h(), ow = g.out_w();
  Reference r;
  r.y.assign(g.batch * o * oh * ow, 0.0);
  r.dx.assign(g.batch * g.channels * g.height * g.width, 0.0);
  r.dw.assign(o * g.channels * g.kernel_h * g.kernel_w, 0.0);
  r.db.assign(o, 0.0);
  for (int64_t n = 0; n < g.batch; ++n) {
    for (int64_t f = 0; f < o; ++f) {
      for (int64_t i = 0; i < oh; ++i) {
        for (int64_t j = 0; j < ow; ++j) {
          const int64_t yi = ((n * o + f) * oh + i) * ow + j;
          double acc = bias[f];
          r.db[f] += dy[yi];
          for (int64_t c = 0; c < g.channels; ++c) {
            for (int64_t ky = 0; ky < g.kernel_h; ++ky) {
              for (int64_t kx = 0; kx < g.kernel_w; ++kx) {
                const int64_t y = i * g.stride_h - g.pad_h + ky * g.dilation_h;
                const int64_t xx = j * g.stride_w - g.pad_w + kx * g.dilation_w;
                if (y < 0 || y >= g.height || xx < 0 || xx >= g.width) continue;
                const int64_t xi = ((n * g.channels + c) * g.height + y) * g.width + xx;
                const int64_t wi = ((f * g.channels + c) * g.kernel_h + ky) * g.kernel_w + kx;
                acc += w[wi] * x[xi];
                r.dx[xi] += w[wi] * dy[yi];
                r.dw[wi] += x[xi] * dy[yi];
              }
            }
          }
          r.y[yi] = acc;
        }
      }
    }
  }
  return r;
}

// Within the dtype's tolerance of the exact result: relative to the size of the terms that
// were summed (a sum of many terms of both signs can be near zero).
template <typename T>
void ExpectClose(const std::vector<T>& got, const std::vector<double>& want, double scale,
                 double rtol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int failures = 0;
  for (size_t i = 0; i < got.size() && failures < 5; ++i) {
    const double value = static_cast<double>(static_cast<float>(got[i]));
    if (!(std::abs(value - want[i]) <= rtol * (std::abs(want[i]) + scale))) {
      ADD_FAILURE() << what << " [" << i << "]: " << value << " vs " << want[i];
      ++failures;
    }
  }
}

template <typename T>
void CheckCase(const Case& c, DType dtype, double rtol) {
  SCOPED_TRACE(Describe(c));
  const Conv2dGeometry g = Geometry(c);
  const int64_t o = c.out_channels, oh = g.out_h(), ow = g.out_w();
  std::mt19937 rng(static_cast<uint32_t>(c.batch * 131 + c.channels * 7 + c.size));
  const Values<T> x = Random<T>(c.batch * c.channels * c.size * c.size, &rng);
  const Values<T> w = Random<T>(o * c.channels * c.kernel * c.kernel, &rng);
  const Values<T> bias = Random<T>(o, &rng);
  const Values<T> dy = Random<T>(c.batch * o * oh * ow, &rng);
  const Reference want = Direct(g, o, x.exact, w.exact, bias.exact, dy.exact);
  // The size of a sum's terms: about sqrt(terms) for standard normal products.
  const double taps = static_cast<double>(c.channels * c.kernel * c.kernel);
  const double out_taps = static_cast<double>(o * c.kernel * c.kernel);
  const double images = static_cast<double>(c.batch * oh * ow);

  std::vector<T> y(want.y.size(), T(std::nanf(""))), dx(want.dx.size(), T(std::nanf("")));
  std::vector<T> dw(want.dw.size(), T(std::nanf(""))), db(o, T(std::nanf("")));
  ASSERT_TRUE(OneDnnConv2dForward(0, dtype, g, o, x.data.data(), w.data.data(), bias.data.data(),
                                  y.data()));
  ExpectClose(y, want.y, std::sqrt(taps), rtol, "forward");
  ASSERT_TRUE(OneDnnConv2dBackwardData(0, dtype, g, o, dy.data.data(), w.data.data(), dx.data()));
  ExpectClose(dx, want.dx, std::sqrt(out_taps), rtol, "grad input");
  ASSERT_TRUE(OneDnnConv2dBackwardWeights(0, dtype, g, o, x.data.data(), dy.data.data(), dw.data(),
                                          db.data()));
  ExpectClose(dw, want.dw, std::sqrt(images), rtol, "grad weight");
  ExpectClose(db, want.db, std::sqrt(images), rtol, "grad bias");
  // Without a bias.
  std::vector<T> y2(want.y.size());
  ASSERT_TRUE(
      OneDnnConv2dForward(0, dtype, g, o, x.data.data(), w.data.data(), nullptr, y2.data()));
  std::vector<double> unbiased = want.y;
  for (size_t i = 0; i < unbiased.size(); ++i) unbiased[i] -= bias.exact[(i / (oh * ow)) % o];
  ExpectClose(y2, unbiased, std::sqrt(taps), rtol, "forward without bias");
}

const Case kCases[] = {
    {16, 1, 28, 32, 3, 1, 1, 1},   // the trainer CNN's first layer (fewer images)
    {16, 32, 14, 64, 3, 1, 1, 1},  // its second
    {19, 3, 9, 5, 3, 2, 1, 1},     // uneven blocks (19 images), stride 2
    {3, 4, 11, 6, 3, 1, 2, 2},     // dilation, wide padding
    {2, 8, 7, 16, 1, 1, 0, 1},     // 1x1
    {1, 2, 6, 3, 5, 1, 0, 1},      // kernel nearly the image
};

bool HasBFloat16() {
  return !OneDnnConv2dImplementation(OneDnnConvPass::kForward, kBFloat16, Geometry(kCases[1]),
                                     kCases[1].out_channels, true)
              .empty();
}

TEST(OneDnnConvTest, BFloat16MatchesDirectConvolutionOfTheSameInputs) {
  if (!HasBFloat16()) GTEST_SKIP() << "oneDNN has no bfloat16 convolution on this CPU";
  // PyTorch's bfloat16 tolerance; the inputs are exact, only the output's rounding counts.
  for (const Case& c : kCases) CheckCase<BFloat16>(c, kBFloat16, 1.6e-2);
}

TEST(OneDnnConvTest, Float32MatchesDirectConvolution) {
  for (const Case& c : kCases) CheckCase<float>(c, kFloat32, 1e-5);
}

TEST(OneDnnConvTest, Float64AndFloat16AreDeclinedWithoutWriting) {
  const Case c = kCases[4];
  const Conv2dGeometry g = Geometry(c);
  std::vector<double> x(c.batch * c.channels * c.size * c.size, 1.0);
  std::vector<double> w(c.out_channels * c.channels, 1.0);
  std::vector<double> y(c.batch * c.out_channels * c.size * c.size, -7.0);
  EXPECT_FALSE(
      OneDnnConv2dForward(0, kFloat64, g, c.out_channels, x.data(), w.data(), nullptr, y.data()));
  EXPECT_FALSE(
      OneDnnConv2dForward(0, kFloat16, g, c.out_channels, x.data(), w.data(), nullptr, y.data()));
  for (double v : y) ASSERT_EQ(v, -7.0);
  Conv2dGeometry pooled = g;
  pooled.ceil_mode = true;  // a pooling geometry, not a convolution's
  EXPECT_FALSE(OneDnnConv2dForward(0, kFloat32, pooled, c.out_channels, x.data(), w.data(), nullptr,
                                   y.data()));
}

// Blocks of images depend on the shape only, and the weight gradient adds the blocks'
// partial sums in block order: the same bits for 1 to 4 threads.
TEST(OneDnnConvTest, ResultsAreBitwiseTheSameForAnyThreadCount) {
  if (!HasBFloat16()) GTEST_SKIP() << "oneDNN has no bfloat16 convolution on this CPU";
  const Case c = {37, 8, 10, 16, 3, 1, 1, 1};
  const Conv2dGeometry g = Geometry(c);
  std::mt19937 rng(5);
  const auto x = Random<BFloat16>(c.batch * c.channels * c.size * c.size, &rng);
  const auto w = Random<BFloat16>(c.out_channels * c.channels * 9, &rng);
  const auto dy = Random<BFloat16>(c.batch * c.out_channels * c.size * c.size, &rng);
  std::vector<uint16_t> first;
  for (int threads : {1, 2, 3, 4}) {
    SetCpuThreadsPerDevice(threads);
    std::vector<BFloat16> y(dy.data.size()), dx(x.data.size()), dw(w.data.size()),
        db(c.out_channels);
    ASSERT_TRUE(OneDnnConv2dForward(0, kBFloat16, g, c.out_channels, x.data.data(), w.data.data(),
                                    nullptr, y.data()));
    ASSERT_TRUE(OneDnnConv2dBackwardData(0, kBFloat16, g, c.out_channels, dy.data.data(),
                                         w.data.data(), dx.data()));
    ASSERT_TRUE(OneDnnConv2dBackwardWeights(0, kBFloat16, g, c.out_channels, x.data.data(),
                                            dy.data.data(), dw.data(), db.data()));
    std::vector<uint16_t> bits;
    for (const auto* v : {&y, &dx, &dw, &db}) {
      for (BFloat16 b : *v) {
        uint16_t u;
        std::memcpy(&u, &b, sizeof(u));
        bits.push_back(u);
      }
    }
    if (first.empty()) {
      first = bits;
    } else {
      EXPECT_EQ(bits, first) << threads << " threads differ from 1";
    }
  }
  SetCpuThreadsPerDevice(0);
}

}  // namespace
}  // namespace tandem
