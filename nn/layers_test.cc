#include "nn/layers.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>

#include "nn/test_util.h"
#include "tensor/autograd.h"
#include "tensor/gradcheck.h"

namespace tandem::nn {
namespace {

using testing::ErrorOf;
using ::testing::HasSubstr;
using testing::MaxAbsDiff;

class LayersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetCpuDeviceCount(2);
    manual_seed(0);
  }
};

// Checks the gradients of layer.forward with respect to its input and to every parameter
// (routed in with replace_parameter, which is also how DataParallel feeds replicas).
void ExpectLayerGradients(Module& layer, const std::function<Tensor(const Tensor&)>& forward,
                          const Tensor& input) {
  const std::vector<NamedTensor> params = layer.named_parameters();
  std::vector<Tensor> inputs = {input.detach().clone()};
  for (const NamedTensor& p : params) inputs.push_back(p.value.detach().clone());
  for (Tensor& t : inputs) t.set_requires_grad(true);
  EXPECT_GRADIENTS_MATCH(
      [&](const std::vector<Tensor>& in) {
        for (size_t i = 0; i < params.size(); ++i)
          layer.replace_parameter(params[i].name, in[i + 1]);
        return forward(in[0]);
      },
      inputs);
  for (const NamedTensor& p : params) layer.replace_parameter(p.name, p.value);
}

// Values at least `gap` from zero, so that relu's kink is not inside a finite difference.
Tensor AwayFromZero(const Shape& shape, double gap = 0.1) {
  Tensor x = randn(shape);
  return x + (gt(x, zeros_like(x)) * 2.0 - 1.0) * gap;
}

// ---- Linear ----------------------------------------------------------------------------

TEST_F(LayersTest, LinearInitialisesLikePyTorch) {
  Linear layer(784, 256);
  const double bound = 1.0 / std::sqrt(784.0);
  for (const Tensor& p : {layer.weight(), layer.bias()}) {
    const std::vector<float> values = p.to_vector<float>();
    double low = 1.0, high = -1.0, sum = 0.0;
    for (float v : values) {
      low = std::min<double>(low, v);
      high = std::max<double>(high, v);
      sum += v;
    }
    // Uniform on [-bound, bound]: inside it, reaching near both ends, centred.
    EXPECT_GE(low, -bound);
    EXPECT_LE(high, bound);
    EXPECT_LT(low, -0.9 * bound);
    EXPECT_GT(high, 0.9 * bound);
    EXPECT_NEAR(sum / values.size(), 0.0, 4.0 * bound / std::sqrt(3.0 * values.size()));
  }
  EXPECT_EQ(layer.weight().shape(), (Shape{256, 784}));
  EXPECT_EQ(layer.bias().shape(), (Shape{256}));
  EXPECT_FALSE(Linear(3, 2, /*bias=*/false).bias().defined());
}

TEST_F(LayersTest, LinearComputesXWTransposePlusB) {
  Linear layer(3, 2);
  Tensor x = randn({4, 3});
  Tensor expected = matmul(x, layer.weight().t()) + layer.bias();
  EXPECT_TRUE(allclose(layer.forward(x), expected, 1e-5, 1e-6));
  // Leading dimensions are kept.
  EXPECT_EQ(layer.forward(randn({2, 5, 3})).shape(), (Shape{2, 5, 2}));
  Linear no_bias(3, 2, false);
  EXPECT_TRUE(allclose(no_bias.forward(x), matmul(x, no_bias.weight().t()), 1e-5, 1e-6));
}

TEST_F(LayersTest, LinearGradients) {
  Linear layer(4, 3);
  ExpectLayerGradients(
      layer, [&](const Tensor& x) { return layer.forward(x); }, randn({5, 4}));
  Linear no_bias(4, 3, false);
  ExpectLayerGradients(
      no_bias, [&](const Tensor& x) { return no_bias.forward(x); }, randn({2, 2, 4}));
}

TEST_F(LayersTest, LinearNamesItselfOnBadInput) {
  Linear layer(784, 256);
  EXPECT_THAT(ErrorOf([&] {
                layer.forward(zeros({32, 100}));
              }),
              HasSubstr("Linear(in_features=784, out_features=256): expected input with last "
                        "dimension 784 but got [32, 100]"));
  EXPECT_THAT(ErrorOf([&] { layer.forward(Tensor()); }), HasSubstr("undefined"));
  EXPECT_THAT(ErrorOf([] { Linear(0, 3); }), HasSubstr("must be positive"));
}

// ---- ReLU, Flatten ---------------------------------------------------------------------

TEST_F(LayersTest, ReLU) {
  ReLU layer;
  Tensor x = from_vector(std::vector<float>{-2, -0.5, 0, 0.5, 3}, {5});
  EXPECT_EQ(layer.forward(x).to_vector<float>(), (std::vector<float>{0, 0, 0, 0.5, 3}));
  ExpectLayerGradients(
      layer, [&](const Tensor& t) { return layer.forward(t); }, AwayFromZero({3, 4}));
}

TEST_F(LayersTest, Flatten) {
  Flatten flatten;
  EXPECT_EQ(flatten.forward(zeros({2, 3, 4, 5})).shape(), (Shape{2, 60}));
  EXPECT_EQ(Flatten(0, 1).forward(zeros({2, 3, 4})).shape(), (Shape{6, 4}));
  EXPECT_EQ(Flatten(-2).forward(zeros({2, 3, 4})).shape(), (Shape{2, 12}));
  EXPECT_EQ(flatten.ToString(), "Flatten(start_dim=1, end_dim=-1)");
  EXPECT_THAT(ErrorOf([&] { flatten.forward(zeros({5})); }),
              HasSubstr("Flatten(start_dim=1, end_dim=-1): cannot flatten dimensions 1..-1 of an "
                        "input of shape [5]"));
  ExpectLayerGradients(
      flatten, [&](const Tensor& t) { return flatten.forward(t); }, randn({2, 3, 2}));
}

// ---- Conv2d ----------------------------------------------------------------------------

// Direct evaluation of the convolution sum, on the host.
std::vector<float> ReferenceConv(const Tensor& input, const Tensor& weight, const Tensor& bias,
                                 int64_t stride, int64_t pad) {
  const std::vector<float> x = input.to_vector<float>(), w = weight.to_vector<float>();
  const std::vector<float> b = bias.to_vector<float>();
  const int64_t n = input.size(0), c = input.size(1), h = input.size(2), wd = input.size(3);
  const int64_t o = weight.size(0), kh = weight.size(2), kw = weight.size(3);
  const int64_t oh = (h + 2 * pad - kh) / stride + 1, ow = (wd + 2 * pad - kw) / stride + 1;
  std::vector<float> out;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t f = 0; f < o; ++f)
      for (int64_t y = 0; y < oh; ++y)
        for (int64_t z = 0; z < ow; ++z) {
          double acc = b[f];
          for (int64_t ch = 0; ch < c; ++ch)
            for (int64_t u = 0; u < kh; ++u)
              for (int64_t v = 0; v < kw; ++v) {
                const int64_t row = y * stride - pad + u, col = z * stride - pad + v;
                if (row < 0 || row >= h || col < 0 || col >= wd) continue;
                acc += x[((i * c + ch) * h + row) * wd + col] * w[((f * c + ch) * kh + u) * kw + v];
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

// ---- MaxPool2d -------------------------------------------------------------------------

// Distinct values (a shuffled ramp), so that no window has a tie.
Tensor DistinctValues(const Shape& shape) {
  return randperm(NumElements(shape)).to(kFloat32).reshape(shape) * 0.05;
}

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

// ---- Dropout ---------------------------------------------------------------------------

TEST_F(LayersTest, DropoutZeroesAndRescalesOnlyInTraining) {
  const double p = 0.3;
  Dropout dropout(p, /*seed=*/42);
  Tensor x = ones({100, 100});
  const std::vector<float> y = dropout.forward(x).to_vector<float>();
  int64_t zeros_seen = 0;
  for (float v : y) {
    if (v == 0.0f) {
      ++zeros_seen;
    } else {
      EXPECT_FLOAT_EQ(v, static_cast<float>(1.0 / (1.0 - p)));
    }
  }
  // 10,000 Bernoulli(0.3) draws: within 5 standard deviations of 3,000.
  EXPECT_NEAR(zeros_seen, 3000, 5 * std::sqrt(10000 * p * (1 - p)));

  dropout.eval();
  EXPECT_EQ(dropout.forward(x).to_vector<float>(), x.to_vector<float>());
  EXPECT_EQ(dropout.ToString(), "Dropout(p=0.3, inplace=False)");
  EXPECT_THAT(ErrorOf([] { Dropout(1.0); }), HasSubstr("must be in [0, 1) but is 1"));
}

TEST_F(LayersTest, DropoutIsSeeded) {
  Dropout a(0.5, 7), b(0.5, 7);
  Tensor x = randn({8, 8});
  const std::vector<float> first = a.forward(x).to_vector<float>();
  EXPECT_EQ(b.forward(x).to_vector<float>(), first);  // same seed, same mask
  EXPECT_NE(a.forward(x).to_vector<float>(), first);  // the stream moves on
  a.generator()->manual_seed(7);
  EXPECT_EQ(a.forward(x).to_vector<float>(), first);  // and restarts
  // A clone shares the generator: it continues the stream instead of repeating masks.
  std::shared_ptr<Module> clone = a.clone();
  EXPECT_EQ(std::dynamic_pointer_cast<Dropout>(clone)->generator(), a.generator());
}

TEST_F(LayersTest, DropoutGradients) {
  Dropout dropout(0.4, 3);
  ExpectLayerGradients(
      dropout,
      [&](const Tensor& x) {
        dropout.generator()->manual_seed(3);  // the same mask at every evaluation
        return dropout.forward(x);
      },
      randn({4, 5}));
}

// ---- CUDA against the CPU --------------------------------------------------------------

// Runs `layer` on cpu:0 and a clone on cuda:0 with the same input and output gradient, and
// compares outputs, input gradients and parameter gradients.
void ExpectCudaMatchesCpu(Module& layer, const Tensor& input) {
  std::shared_ptr<Module> gpu = layer.clone(Device::Cuda(0));
  Tensor x_cpu = input.detach().clone();
  x_cpu.set_requires_grad(true);
  Tensor x_gpu = input.to(Device::Cuda(0));
  x_gpu.set_requires_grad(true);
  Tensor y_cpu = layer.forward_tensors({x_cpu})[0];
  Tensor y_gpu = gpu->forward_tensors({x_gpu})[0];
  EXPECT_EQ(y_gpu.device(), Device::Cuda(0));
  EXPECT_LT(MaxAbsDiff(y_cpu, y_gpu), 1e-4);
  Tensor upstream = randn(y_cpu.shape());
  y_cpu.backward(upstream);
  y_gpu.backward(upstream.to(Device::Cuda(0)));
  EXPECT_LT(MaxAbsDiff(x_cpu.grad(), x_gpu.grad()), 1e-4);
  const std::vector<NamedTensor> cpu_params = layer.named_parameters();
  const std::vector<NamedTensor> gpu_params = gpu->named_parameters();
  for (size_t i = 0; i < cpu_params.size(); ++i) {
    SCOPED_TRACE(cpu_params[i].name);
    EXPECT_LT(MaxAbsDiff(cpu_params[i].value.grad(), gpu_params[i].value.grad()), 1e-3);
  }
}

TEST_F(LayersTest, CudaMatchesCpu) {
  TANDEM_SKIP_WITHOUT_CUDA();
  Linear linear(64, 32);
  ExpectCudaMatchesCpu(linear, randn({16, 64}));
  ReLU relu;
  ExpectCudaMatchesCpu(relu, randn({16, 64}));
  Flatten flatten;
  ExpectCudaMatchesCpu(flatten, randn({4, 3, 5, 5}));
  Conv2d conv(3, 8, 3, /*stride=*/2, /*padding=*/1);
  ExpectCudaMatchesCpu(conv, randn({4, 3, 12, 12}));
  MaxPool2d pool(2);
  ExpectCudaMatchesCpu(pool, DistinctValues({4, 3, 8, 8}));
  // Dropout draws the same counter-based numbers on every device.
  Dropout dropout(0.5, 11);
  std::shared_ptr<Module> gpu = dropout.clone(Device::Cuda(0));
  Tensor x = randn({32, 32});
  dropout.generator()->manual_seed(11);
  Tensor on_cpu = dropout.forward(x);
  dropout.generator()->manual_seed(11);
  Tensor on_gpu = gpu->forward_tensors({x.to(Device::Cuda(0))})[0];
  EXPECT_LT(MaxAbsDiff(on_cpu, on_gpu), 1e-6);
}

}  // namespace
}  // namespace tandem::nn
