#include "nn/layers.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <future>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "nn/sequential.h"
#include "nn/test_util.h"
#include "tensor/base/philox.h"
#include "tensor/core/autograd.h"
#include "tensor/gradcheck.h"
#include "tensor/runtime/devices.h"
#include "tensor/runtime/threads.h"

namespace tandem::nn {
namespace {

using testing::ErrorOf;
using ::testing::HasSubstr;
using testing::MaxAbsDiff;

class LayersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetCpuDeviceCount(3);
    manual_seed(0);
  }
};

// Checks the gradients of layer.forward with respect to its input and to every parameter
// (routed in with replace_parameter, which is also how DataParallel feeds replicas), in
// float64: the layer is converted for the check and back to float32 after (exactly: every
// float32 is a float64).
void ExpectLayerGradients(Module& layer, const std::function<Tensor(const Tensor&)>& forward,
                          const Tensor& input) {
  layer.to(kFloat64);
  const std::vector<NamedTensor> params = layer.named_parameters();
  std::vector<Tensor> inputs = {input.detach().to(kFloat64).clone()};
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
  layer.to(kFloat32);
}

// Values at least `gap` from zero, so that relu's kink is not inside a finite difference.
Tensor AwayFromZero(const Shape& shape, double gap = 0.1) {
  Tensor x = randn(shape);
  return x + (gt(x, zeros_like(x)).to(x.dtype()) * 2.0 - 1.0) * gap;
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
  EXPECT_THAT(ErrorOf([] { Dropout(1.01); }), HasSubstr("must be in [0, 1] but is 1.01"));
  // p = 1 is accepted, as in PyTorch: all zeros in training, the identity in evaluation.
  Dropout all(1.0);
  EXPECT_EQ(all.ToString(), "Dropout(p=1.0, inplace=False)");
  EXPECT_EQ(all.forward(x).to_vector<float>(), std::vector<float>(x.numel(), 0.0f));
  all.eval();
  EXPECT_EQ(all.forward(x).to_vector<float>(), x.to_vector<float>());
}

TEST_F(LayersTest, DropoutIsSeeded) {
  Dropout a(0.5, 7), b(0.5, 7);
  EXPECT_EQ(a.seed(), 7u);
  Tensor x = randn({8, 8});
  const std::vector<float> first = a.forward(x).to_vector<float>();
  EXPECT_EQ(b.forward(x).to_vector<float>(), first);  // same seed, same mask
  EXPECT_NE(a.forward(x).to_vector<float>(), first);  // the stream moves on
  a.manual_seed(7);
  EXPECT_EQ(a.forward(x).to_vector<float>(), first);  // and restarts
  a.generator()->manual_seed(7);                      // (cpu:0's stream alone, the same here)
  EXPECT_EQ(a.forward(x).to_vector<float>(), first);
  // A clone shares the generators: it continues the streams instead of repeating masks.
  std::shared_ptr<Module> clone = a.clone(Device::Cpu(1));
  EXPECT_EQ(std::dynamic_pointer_cast<Dropout>(clone)->generator(Device::Cpu(1)),
            a.generator(Device::Cpu(1)));
}

// The mask that a generator at `state` draws for n elements, as dropout computes it.
std::vector<float> ExpectedDropout(GeneratorState state, int n, double p) {
  std::vector<float> y(n);
  for (int i = 0; i < n; ++i) {
    y[i] = philox::Uniform(state.seed, state.offset + i) >= p ? static_cast<float>(1.0 / (1.0 - p))
                                                              : 0.0f;
  }
  return y;
}

TEST_F(LayersTest, DropoutDrawsFromOneGeneratorPerDevice) {
  // With a seed: the layer's own generators, device d's stream starting at DeviceOffsetBase(d).
  Dropout seeded(0.5, 21);
  EXPECT_NE(seeded.generator(Device::Cpu(0)), seeded.generator(Device::Cpu(1)));
  EXPECT_NE(seeded.generator(Device::Cpu(1)), &default_generator(Device::Cpu(1)));
  for (int index : {1, 2, 0}) {
    SCOPED_TRACE(index);
    const Device device = Device::Cpu(index);
    EXPECT_EQ(seeded.forward(ones({40}, device)).to_vector<float>(),
              ExpectedDropout({21, DeviceOffsetBase(index)}, 40, 0.5));
  }
  // Without a seed: the default generator of the input's device.
  Dropout plain(0.25);
  EXPECT_EQ(plain.generator(), nullptr);
  EXPECT_EQ(plain.seed(), std::nullopt);
  manual_seed(4);
  EXPECT_EQ(plain.forward(ones({40}, Device::Cpu(2))).to_vector<float>(),
            ExpectedDropout({4, DeviceOffsetBase(2)}, 40, 0.25));
  EXPECT_EQ(default_generator(Device::Cpu(2)).state().offset, DeviceOffsetBase(2) + 40);
  EXPECT_EQ(default_generator(Device::Cpu(1)).state().offset, DeviceOffsetBase(1));
  // manual_seed gives a plain layer generators of its own.
  plain.manual_seed(5);
  EXPECT_EQ(plain.seed(), 5u);
  EXPECT_EQ(plain.forward(ones({40}, Device::Cpu(1))).to_vector<float>(),
            ExpectedDropout({5, DeviceOffsetBase(1)}, 40, 0.25));
  EXPECT_EQ(Dropout(0.0).ToString(), "Dropout(p=0.0, inplace=False)");
}

// A model with both kinds of dropout, replicated over cpu:0..2 as DataParallel does, each
// replica's forward on its device's worker, all at once.
class ParallelDropoutModel {
 public:
  ParallelDropoutModel() {
    seeded_ = std::make_shared<Dropout>(0.3, /*seed=*/9);
    model_ = std::make_shared<Sequential>(Linear(8, 32), ReLU(), Dropout(0.5), Linear(32, 32),
                                          seeded_, Linear(32, 4));
    replicas_ = {model_, model_->clone(Device::Cpu(1)), model_->clone(Device::Cpu(2))};
  }

  // Each replica's output for its chunk of `input` (or for the whole `input` when `same`).
  std::vector<std::vector<float>> Run(const Tensor& input, bool same = false) {
    const std::vector<Tensor> chunks = input.chunk(3);
    std::vector<std::future<std::vector<float>>> futures;
    for (int i = 0; i < 3; ++i) {
      const Device device = Device::Cpu(i);
      Tensor x = (same ? input : chunks[i]).to(device);
      std::shared_ptr<Module> replica = replicas_[i];
      futures.push_back(DeviceWorker::For(device).Submit(
          [replica, x] { return replica->forward_tensors({x})[0].to_vector<float>(); }));
    }
    std::vector<std::vector<float>> outputs;
    for (auto& future : futures) outputs.push_back(future.get());
    return outputs;
  }

  Dropout& seeded() { return *seeded_; }

 private:
  std::shared_ptr<Dropout> seeded_;
  std::shared_ptr<Sequential> model_;
  std::vector<std::shared_ptr<Module>> replicas_;
};

TEST_F(LayersTest, DropoutUnderParallelReplicasIsReproducible) {
  ParallelDropoutModel model;
  Tensor input = randn({12, 8});
  auto run = [&] {
    manual_seed(1);
    model.seeded().manual_seed(9);
    // Several steps per run, so that each device's streams move on between them.
    std::vector<std::vector<float>> outputs = model.Run(input);
    for (const std::vector<float>& more : model.Run(input)) outputs.push_back(more);
    return outputs;
  };
  const std::vector<std::vector<float>> first = run();
  EXPECT_NE(first[0], first[3]);  // the second step drew new masks
  for (int i = 0; i < 20; ++i) {
    SCOPED_TRACE(i);
    ASSERT_EQ(run(), first);
  }
  // Replicas on different devices draw different masks for the same input.
  manual_seed(1);
  const std::vector<std::vector<float>> same = model.Run(input.narrow(0, 0, 4), /*same=*/true);
  EXPECT_NE(same[0], same[1]);
  EXPECT_NE(same[1], same[2]);
  EXPECT_NE(same[0], same[2]);
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

// ---- BatchNorm1d, BatchNorm2d ------------------------------------------------------------

// Sets a tensor's values in place (for parameters and buffers).
void Assign(const Tensor& target, const std::vector<float>& values) {
  NoGradGuard no_grad;
  Tensor(target).copy_(from_vector(values, target.shape(), target.device()));
}

// The hand formula for an [N, C, L] input (L = 1 for [N, C]), in double precision:
// y = (x - mean_c) / sqrt(var_c + eps) * w_c + b_c with the given per-channel statistics,
// or the batch's (biased variance) when `mean` is empty.
std::vector<float> BatchNormFormula(const std::vector<float>& x, int64_t n, int64_t c, int64_t l,
                                    std::vector<double> mean, std::vector<double> var,
                                    const std::vector<float>& w, const std::vector<float>& b,
                                    double eps = 1e-5) {
  if (mean.empty()) {
    mean.assign(c, 0.0);
    var.assign(c, 0.0);
    for (int64_t k = 0; k < c; ++k) {
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < l; ++j) mean[k] += x[(i * c + k) * l + j];
      }
      mean[k] /= n * l;
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < l; ++j) var[k] += std::pow(x[(i * c + k) * l + j] - mean[k], 2);
      }
      var[k] /= n * l;
    }
  }
  std::vector<float> y(x.size());
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t k = 0; k < c; ++k) {
      for (int64_t j = 0; j < l; ++j) {
        const int64_t at = (i * c + k) * l + j;
        y[at] = static_cast<float>((x[at] - mean[k]) / std::sqrt(var[k] + eps) * w[k] + b[k]);
      }
    }
  }
  return y;
}

void ExpectNear(const std::vector<float>& actual, const std::vector<float>& expected,
                double tolerance = 1e-5) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    EXPECT_NEAR(actual[i], expected[i], tolerance) << "at " << i;
  }
}

TEST_F(LayersTest, BatchNormStartsAsPyTorchDoes) {
  BatchNorm1d bn(4);
  EXPECT_EQ(bn.ToString(),
            "BatchNorm1d(4, eps=1e-05, momentum=0.1, affine=True, track_running_stats=True)");
  EXPECT_EQ(bn.weight().to_vector<float>(), std::vector<float>(4, 1.0f));
  EXPECT_EQ(bn.bias().to_vector<float>(), std::vector<float>(4, 0.0f));
  EXPECT_EQ(bn.running_mean().to_vector<float>(), std::vector<float>(4, 0.0f));
  EXPECT_EQ(bn.running_var().to_vector<float>(), std::vector<float>(4, 1.0f));
  EXPECT_EQ(bn.num_batches_tracked().dtype(), kInt64);
  EXPECT_EQ(bn.num_batches_tracked().dim(), 0);
  EXPECT_EQ(bn.num_batches_tracked().item<int64_t>(), 0);
  std::vector<std::string> names;
  for (const NamedTensor& t : bn.named_parameters()) names.push_back(t.name);
  for (const NamedTensor& t : bn.named_buffers()) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"weight", "bias", "running_mean", "running_var",
                                             "num_batches_tracked"}));

  BatchNorm2d bare(8, /*eps=*/1e-3, /*momentum=*/std::nullopt, /*affine=*/false,
                   /*track_running_stats=*/false);
  EXPECT_EQ(bare.ToString(),
            "BatchNorm2d(8, eps=0.001, momentum=None, affine=False, track_running_stats=False)");
  EXPECT_TRUE(bare.parameters().empty());
  EXPECT_TRUE(bare.buffers().empty());
  EXPECT_FALSE(bare.weight().defined());
  EXPECT_FALSE(bare.running_mean().defined());
  EXPECT_EQ(BatchNorm2d(BatchNormOptions(3).eps(0.5).momentum(1.0)).ToString(),
            "BatchNorm2d(3, eps=0.5, momentum=1.0, affine=True, track_running_stats=True)");
  EXPECT_EQ(Sequential(Linear(2, 3), BatchNorm1d(3)).ToString(),
            "Sequential(\n"
            "  (0): Linear(in_features=2, out_features=3, bias=True)\n"
            "  (1): BatchNorm1d(3, eps=1e-05, momentum=0.1, affine=True, "
            "track_running_stats=True)\n"
            ")");
}

TEST_F(LayersTest, BatchNormNormalisesWithTheBatchStatisticsInTraining) {
  // [N, C] = [4, 3].
  BatchNorm1d bn(3);
  const std::vector<float> w = {0.5f, -2.0f, 1.5f}, b = {0.1f, 0.2f, -0.3f};
  Assign(bn.weight(), w);
  Assign(bn.bias(), b);
  const std::vector<float> x = {1, -2, 0.5, 3, 4, 0.25, -1, 0, 2, 5, 6, -0.75};
  ExpectNear(bn.forward(from_vector(x, {4, 3})).to_vector<float>(),
             BatchNormFormula(x, 4, 3, 1, {}, {}, w, b));
  // [N, C, L] = [2, 3, 5]: statistics over N and L.
  Tensor x3 = randn({2, 3, 5});
  ExpectNear(bn.forward(x3).to_vector<float>(),
             BatchNormFormula(x3.to_vector<float>(), 2, 3, 5, {}, {}, w, b));
  // [N, C, H, W] = [3, 2, 4, 5]: statistics over N, H and W (H * W as one "L").
  BatchNorm2d bn2(2);
  Tensor x4 = randn({3, 2, 4, 5});
  ExpectNear(bn2.forward(x4).to_vector<float>(),
             BatchNormFormula(x4.to_vector<float>(), 3, 2, 20, {}, {}, {1, 1}, {0, 0}));
  // Without running statistics, evaluation mode uses the batch's too.
  BatchNorm1d untracked(3, 1e-5, 0.1, /*affine=*/false, /*track_running_stats=*/false);
  untracked.eval();
  ExpectNear(untracked.forward(from_vector(x, {4, 3})).to_vector<float>(),
             BatchNormFormula(x, 4, 3, 1, {}, {}, {1, 1, 1}, {0, 0, 0}));
}

TEST_F(LayersTest, BatchNormRunningStatisticsAfterTwoSteps) {
  // Worked by hand (the formula PyTorch documents and implements).
  // Step 1, x = [[1, 2], [3, 6]]: batch means [2, 4], biased variances [1, 4], unbiased
  //   [2, 8]; running_mean = 0.1 * [2, 4] = [0.2, 0.4];
  //   running_var = 0.9 * [1, 1] + 0.1 * [2, 8] = [1.1, 1.7].
  // Step 2, x = [[0, 0], [2, -2]]: means [1, -1], unbiased variances [2, 2];
  //   running_mean = 0.9 * [0.2, 0.4] + 0.1 * [1, -1] = [0.28, 0.26];
  //   running_var = 0.9 * [1.1, 1.7] + 0.1 * [2, 2] = [1.19, 1.73].
  BatchNorm1d bn(2);
  Tensor y1 = bn.forward(from_vector(std::vector<float>{1, 2, 3, 6}, {2, 2}));
  // Each value is one standard deviation from its channel's mean: ±1 / sqrt(1 + eps / var).
  ExpectNear(y1.to_vector<float>(), {-0.999995f, -0.99999875f, 0.999995f, 0.99999875f}, 1e-6);
  ExpectNear(bn.running_mean().to_vector<float>(), {0.2f, 0.4f});
  ExpectNear(bn.running_var().to_vector<float>(), {1.1f, 1.7f});
  EXPECT_EQ(bn.num_batches_tracked().item<int64_t>(), 1);
  bn.forward(from_vector(std::vector<float>{0, 0, 2, -2}, {2, 2}));
  ExpectNear(bn.running_mean().to_vector<float>(), {0.28f, 0.26f});
  ExpectNear(bn.running_var().to_vector<float>(), {1.19f, 1.73f});
  EXPECT_EQ(bn.num_batches_tracked().item<int64_t>(), 2);

  // momentum = nullopt: the cumulative average of the batches' statistics.
  //   running_mean = ([2, 4] + [1, -1]) / 2 = [1.5, 1.5];
  //   running_var = ([2, 8] + [2, 2]) / 2 = [2, 5].
  BatchNorm1d cumulative(2, 1e-5, std::nullopt);
  cumulative.forward(from_vector(std::vector<float>{1, 2, 3, 6}, {2, 2}));
  ExpectNear(cumulative.running_var().to_vector<float>(), {2.0f, 8.0f});
  cumulative.forward(from_vector(std::vector<float>{0, 0, 2, -2}, {2, 2}));
  ExpectNear(cumulative.running_mean().to_vector<float>(), {1.5f, 1.5f});
  ExpectNear(cumulative.running_var().to_vector<float>(), {2.0f, 5.0f});

  // BatchNorm2d: statistics over N, H and W, the variance unbiased with n = N * H * W.
  BatchNorm2d bn2(3, 1e-5, /*momentum=*/0.25);
  Tensor a = randn({2, 3, 2, 2}), b = randn({2, 3, 2, 2});
  bn2.forward(a);
  bn2.forward(b);
  std::vector<double> mean(3, 0.0), var(3, 1.0);
  for (const Tensor& batch : {a, b}) {
    const std::vector<float> v = batch.to_vector<float>();
    for (int k = 0; k < 3; ++k) {
      double m = 0, s = 0;
      for (int i = 0; i < 2; ++i) {
        for (int j = 0; j < 4; ++j) m += v[(i * 3 + k) * 4 + j];
      }
      m /= 8;
      for (int i = 0; i < 2; ++i) {
        for (int j = 0; j < 4; ++j) s += std::pow(v[(i * 3 + k) * 4 + j] - m, 2);
      }
      mean[k] = 0.75 * mean[k] + 0.25 * m;
      var[k] = 0.75 * var[k] + 0.25 * s / 7;
    }
  }
  ExpectNear(bn2.running_mean().to_vector<float>(), std::vector<float>(mean.begin(), mean.end()));
  ExpectNear(bn2.running_var().to_vector<float>(), std::vector<float>(var.begin(), var.end()));
}

TEST_F(LayersTest, BatchNormUsesTheRunningStatisticsInEvaluation) {
  BatchNorm1d bn(2);
  bn.forward(from_vector(std::vector<float>{1, 2, 3, 6}, {2, 2}));
  bn.forward(from_vector(std::vector<float>{0, 0, 2, -2}, {2, 2}));
  const std::vector<float> w = {2.0f, 0.5f}, b = {-1.0f, 1.0f};
  Assign(bn.weight(), w);
  Assign(bn.bias(), b);
  bn.eval();
  // One sample per channel is fine in evaluation.
  const std::vector<float> x = {0.5f, -3.0f};
  ExpectNear(bn.forward(from_vector(x, {1, 2})).to_vector<float>(),
             BatchNormFormula(x, 1, 2, 1, {0.28, 0.26}, {1.19, 1.73}, w, b));
  // The running statistics stay as they were.
  ExpectNear(bn.running_mean().to_vector<float>(), {0.28f, 0.26f});
  EXPECT_EQ(bn.num_batches_tracked().item<int64_t>(), 2);
  // [N, C, L] in evaluation.
  Tensor x3 = randn({3, 2, 4});
  ExpectNear(bn.forward(x3).to_vector<float>(),
             BatchNormFormula(x3.to_vector<float>(), 3, 2, 4, {0.28, 0.26}, {1.19, 1.73}, w, b));
  // Back to training: the batch's statistics again, and the buffers move.
  bn.train();
  bn.forward(x3);
  EXPECT_EQ(bn.num_batches_tracked().item<int64_t>(), 3);
  // reset_running_stats / reset_parameters.
  bn.reset_parameters();
  EXPECT_EQ(bn.running_var().to_vector<float>(), std::vector<float>(2, 1.0f));
  EXPECT_EQ(bn.weight().to_vector<float>(), std::vector<float>(2, 1.0f));
  EXPECT_EQ(bn.num_batches_tracked().item<int64_t>(), 0);
}

TEST_F(LayersTest, BatchNormUpdatesItsBuffersInPlace) {
  BatchNorm2d bn(2);
  // A handle taken before the step sees the update (copy_, not a new tensor).
  const Tensor running_mean = bn.running_mean();
  // A re-bound buffer (as DataParallel does for a replica) is the one that is updated.
  Tensor rebound = full({2}, 5.0);
  bn.replace_buffer("running_var", rebound);
  const Tensor original_var = bn.running_var();
  EXPECT_TRUE(original_var.shares_storage_with(rebound));
  Tensor x = randn({4, 2, 3, 3}, TensorOptions().requires_grad(true));
  Tensor y = bn.forward(x);
  EXPECT_TRUE(bn.running_mean().shares_storage_with(running_mean));
  EXPECT_NE(running_mean.to_vector<float>(), std::vector<float>(2, 0.0f));
  EXPECT_TRUE(bn.running_var().shares_storage_with(rebound));
  EXPECT_LT(rebound.to_vector<float>()[0], 5.0f);
  // Buffers stay outside the graph; the output is in it.
  EXPECT_FALSE(bn.running_mean().requires_grad());
  EXPECT_FALSE(bn.running_var().requires_grad());
  EXPECT_TRUE(y.requires_grad());
}

TEST_F(LayersTest, BatchNormGradients) {
  BatchNorm1d bn(3);
  Assign(bn.weight(), {0.5f, -1.5f, 2.0f});
  Assign(bn.bias(), {0.1f, 0.2f, 0.3f});
  ExpectLayerGradients(
      bn, [&](const Tensor& x) { return bn.forward(x); }, randn({5, 3}));
  ExpectLayerGradients(
      bn, [&](const Tensor& x) { return bn.forward(x); }, randn({2, 3, 4}));
  BatchNorm2d bn2(2, 1e-5, 0.1, /*affine=*/false);
  ExpectLayerGradients(
      bn2, [&](const Tensor& x) { return bn2.forward(x); }, randn({2, 2, 3, 3}));
  bn.eval();
  ExpectLayerGradients(
      bn, [&](const Tensor& x) { return bn.forward(x); }, randn({4, 3}));
}

TEST_F(LayersTest, BatchNormNamesItselfOnBadInput) {
  BatchNorm1d bn(4);
  EXPECT_THAT(ErrorOf([&] {
                bn.forward(randn({2, 4, 3, 3}));
              }),
              HasSubstr("BatchNorm1d(4, eps=1e-05, momentum=0.1, affine=True, "
                        "track_running_stats=True): expected a 2-D input [N, C] or a 3-D input "
                        "[N, C, L] but got [2, 4, 3, 3] (4-D)"));
  EXPECT_THAT(ErrorOf([&] {
                bn.forward(randn({2, 5}));
              }),
              HasSubstr("expected input with 4 channels (dimension 1) but got [2, 5]"));
  EXPECT_THAT(ErrorOf([&] {
                bn.forward(randn({1, 4}));
              }),
              HasSubstr("Expected more than 1 value per channel when training, got input size "
                        "[1, 4]"));
  EXPECT_EQ(bn.num_batches_tracked().item<int64_t>(), 0);  // a failed forward changes nothing
  bn.forward(randn({1, 4, 2}));                            // two values per channel
  EXPECT_THAT(ErrorOf([&] {
                bn.forward(randn({2, 4}, Device::Cpu(1)));
              }),
              HasSubstr("the input is on cpu:1 but the parameters are on cpu:0"));
  EXPECT_THAT(ErrorOf([&] { bn.forward(Tensor()); }), HasSubstr("the input tensor is undefined"));
  BatchNorm2d bn2(3);
  EXPECT_THAT(ErrorOf([&] {
                bn2.forward(randn({2, 3}));
              }),
              HasSubstr("expected a 4-D input [N, C, H, W] but got [2, 3] (2-D)"));
  EXPECT_THAT(ErrorOf([] { BatchNorm1d(0); }),
              HasSubstr("num_features (the number of channels) must be positive but is 0"));
  EXPECT_THAT(ErrorOf([] { BatchNorm2d(3, 1e-5, 1.5); }), HasSubstr("momentum must be in [0, 1]"));
}

TEST_F(LayersTest, BatchNormClones) {
  BatchNorm2d bn(3, 1e-4, 0.2);
  Assign(bn.weight(), {1.0f, 2.0f, 3.0f});
  bn.forward(randn({2, 3, 4, 4}));
  std::shared_ptr<Module> copy = bn.clone(Device::Cpu(1));
  auto clone = std::dynamic_pointer_cast<BatchNorm2d>(copy);
  ASSERT_NE(clone, nullptr);
  EXPECT_EQ(clone->ToString(), bn.ToString());
  const std::vector<NamedTensor> ours = bn.named_buffers(), theirs = clone->named_buffers();
  ASSERT_EQ(theirs.size(), 3u);
  for (size_t i = 0; i < ours.size(); ++i) {
    SCOPED_TRACE(ours[i].name);
    EXPECT_EQ(theirs[i].value.device(), Device::Cpu(1));
    EXPECT_EQ(theirs[i].value.dtype(), ours[i].value.dtype());
    EXPECT_FALSE(theirs[i].value.shares_storage_with(ours[i].value));
  }
  EXPECT_EQ(clone->num_batches_tracked().item<int64_t>(), 1);
  EXPECT_EQ(clone->weight().to_vector<float>(), (std::vector<float>{1.0f, 2.0f, 3.0f}));
  EXPECT_EQ(clone->running_mean().to_vector<float>(), bn.running_mean().to_vector<float>());
  // The clone's handles are its own: it normalises (and updates) on cpu:1 alone.
  Tensor x = randn({2, 3, 4, 4});
  bn.eval();
  clone->eval();
  EXPECT_LT(MaxAbsDiff(clone->forward(x.to(Device::Cpu(1))), bn.forward(x)), 1e-6);
  clone->train();
  clone->forward(x.to(Device::Cpu(1)));
  EXPECT_EQ(clone->num_batches_tracked().item<int64_t>(), 2);
  EXPECT_EQ(bn.num_batches_tracked().item<int64_t>(), 1);
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

// ---- Activations, Identity ---------------------------------------------------------------

TEST_F(LayersTest, ActivationsMatchTheirFormulas) {
  const std::vector<float> values = {-3.0f, -1.0f, -0.25f, 0.0f, 0.5f, 1.0f, 2.5f};
  Tensor x = from_vector(values, {7});
  const std::vector<float> exact = GELU().forward(x).to_vector<float>();
  const std::vector<float> approx = GELU("tanh").forward(x).to_vector<float>();
  const std::vector<float> th = Tanh().forward(x).to_vector<float>();
  const std::vector<float> sg = Sigmoid().forward(x).to_vector<float>();
  for (size_t i = 0; i < values.size(); ++i) {
    const double v = values[i];
    EXPECT_NEAR(exact[i], 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0))), 1e-6) << v;
    const double inner = std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v);
    EXPECT_NEAR(approx[i], 0.5 * v * (1.0 + std::tanh(inner)), 1e-6) << v;
    EXPECT_NEAR(th[i], std::tanh(v), 1e-6) << v;
    EXPECT_NEAR(sg[i], 1.0 / (1.0 + std::exp(-v)), 1e-6) << v;
  }
  // PyTorch's values: gelu(1) = 0.8413447, gelu(1, approximate='tanh') = 0.8411920.
  EXPECT_NEAR(exact[5], 0.8413447460685429, 1e-6);
  EXPECT_NEAR(approx[5], 0.8411919906082768, 1e-6);
  // Identity hands back its input, autograd included.
  Tensor y = randn({3, 4});
  EXPECT_TRUE(allclose(Identity().forward(y), y, 0.0, 0.0));
  for (const std::string& kind : {"none", "tanh"}) {
    GELU gelu(kind);
    ExpectLayerGradients(
        gelu, [&](const Tensor& input) { return gelu.forward(input); }, randn({3, 5}) * 2.0);
  }
  Tanh tanh_layer;
  ExpectLayerGradients(
      tanh_layer, [&](const Tensor& input) { return tanh_layer.forward(input); }, randn({3, 5}));
  Sigmoid sigmoid_layer;
  ExpectLayerGradients(
      sigmoid_layer, [&](const Tensor& input) { return sigmoid_layer.forward(input); },
      randn({3, 5}));
  Identity identity;
  ExpectLayerGradients(
      identity, [&](const Tensor& input) { return identity.forward(input) * 2.0; }, randn({3, 5}));
}

TEST_F(LayersTest, ActivationsPrintLikePyTorch) {
  EXPECT_EQ(GELU().ToString(), "GELU(approximate='none')");
  EXPECT_EQ(GELU("tanh").ToString(), "GELU(approximate='tanh')");
  EXPECT_EQ(Tanh().ToString(), "Tanh()");
  EXPECT_EQ(Sigmoid().ToString(), "Sigmoid()");
  EXPECT_EQ(Identity().ToString(), "Identity()");
  EXPECT_THAT(ErrorOf([] { GELU("fast"); }),
              HasSubstr("GELU: approximate must be 'none' (the exact erf form) or 'tanh' but is "
                        "'fast'"));
  EXPECT_THAT(ErrorOf([] { Tanh().forward(Tensor()); }), HasSubstr("Tanh(): the input tensor is "
                                                                   "undefined"));
}

// ---- LayerNorm -----------------------------------------------------------------------------

TEST_F(LayersTest, LayerNormNormalizesTheLastDimensions) {
  LayerNorm norm({3, 4}, 1e-5);
  {
    NoGradGuard no_grad;
    Tensor(norm.weight()).copy_(randn({3, 4}));
    Tensor(norm.bias()).copy_(randn({3, 4}));
  }
  Tensor x = randn({2, 5, 3, 4}) * 3.0 + 1.0;
  const std::vector<float> in = x.to_vector<float>(), out = norm.forward(x).to_vector<float>();
  const std::vector<float> w = norm.weight().to_vector<float>();
  const std::vector<float> b = norm.bias().to_vector<float>();
  for (int64_t row = 0; row < 10; ++row) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < 12; ++i) mean += in[row * 12 + i] / 12.0;
    for (int64_t i = 0; i < 12; ++i) var += std::pow(in[row * 12 + i] - mean, 2) / 12.0;
    for (int64_t i = 0; i < 12; ++i) {
      const double expected = (in[row * 12 + i] - mean) / std::sqrt(var + 1e-5) * w[i] + b[i];
      EXPECT_NEAR(out[row * 12 + i], expected, 1e-4) << row << " " << i;
    }
  }
  // Same in eval mode (no running statistics); without affine, no parameters.
  norm.eval();
  EXPECT_TRUE(allclose(norm.forward(x), from_vector(out, x.shape()), 1e-6, 1e-6));
  LayerNorm plain({4}, 1e-5, /*elementwise_affine=*/false);
  EXPECT_TRUE(plain.parameters().empty());
  const Tensor normalized = plain.forward(x);
  EXPECT_LT(MaxAbsDiff(normalized.mean({3}), zeros({2, 5, 3})), 1e-5);
  // Defaults: ones and zeros.
  LayerNorm fresh({6});
  EXPECT_EQ(fresh.weight().to_vector<float>(), std::vector<float>(6, 1.0f));
  EXPECT_EQ(fresh.bias().to_vector<float>(), std::vector<float>(6, 0.0f));
  ExpectLayerGradients(
      norm, [&](const Tensor& input) { return norm.forward(input); }, randn({2, 3, 4}));
  ExpectLayerGradients(
      plain, [&](const Tensor& input) { return plain.forward(input); }, randn({3, 4}));
}

TEST_F(LayersTest, LayerNormPrintsAndNamesItselfOnBadInput) {
  EXPECT_EQ(LayerNorm({64}).ToString(), "LayerNorm((64,), eps=1e-05, elementwise_affine=True)");
  EXPECT_EQ(LayerNorm({3, 4}, 0.001, false).ToString(),
            "LayerNorm((3, 4), eps=0.001, elementwise_affine=False)");
  EXPECT_THAT(ErrorOf([] {
                LayerNorm({3, 4}).forward(zeros({2, 4, 3}));
              }),
              HasSubstr("LayerNorm((3, 4), eps=1e-05, elementwise_affine=True): expected an input "
                        "whose last 2 dimension(s) are [3, 4] but got [2, 4, 3]"));
  EXPECT_THAT(ErrorOf([] { LayerNorm({3, 4}).forward(zeros({4})); }), HasSubstr("but got [4]"));
  EXPECT_THAT(ErrorOf([] { LayerNorm({}); }), HasSubstr("normalized_shape must name at least"));
  EXPECT_THAT(ErrorOf([] { LayerNorm({0}); }), HasSubstr("must have positive sizes"));
}

// ---- RMSNorm -------------------------------------------------------------------------------

TEST_F(LayersTest, RMSNormScalesByTheRootMeanSquare) {
  RMSNorm norm(RMSNormOptions({3, 4}).eps(1e-6));
  EXPECT_EQ(norm.weight().to_vector<float>(), std::vector<float>(12, 1.0f));  // PyTorch: ones
  EXPECT_EQ(norm.named_parameters().size(), 1u);                              // no bias
  {
    NoGradGuard no_grad;
    Tensor(norm.weight()).copy_(randn({3, 4}));
  }
  Tensor x = randn({2, 5, 3, 4}) * 3.0 + 1.0;
  const std::vector<float> in = x.to_vector<float>(), out = norm.forward(x).to_vector<float>();
  const std::vector<float> w = norm.weight().to_vector<float>();
  for (int64_t row = 0; row < 10; ++row) {
    double mean_square = 0;
    for (int64_t i = 0; i < 12; ++i) mean_square += std::pow(in[row * 12 + i], 2) / 12.0;
    for (int64_t i = 0; i < 12; ++i) {
      const double expected = in[row * 12 + i] / std::sqrt(mean_square + 1e-6) * w[i];
      EXPECT_NEAR(out[row * 12 + i], expected, 1e-4) << row << " " << i;
    }
  }
  norm.reset_parameters();
  EXPECT_EQ(norm.weight().to_vector<float>(), std::vector<float>(12, 1.0f));
  RMSNorm plain({4}, std::nullopt, /*elementwise_affine=*/false);
  EXPECT_TRUE(plain.parameters().empty());
  EXPECT_FALSE(plain.weight().defined());
  ExpectLayerGradients(
      norm, [&](const Tensor& input) { return norm.forward(input); }, randn({2, 3, 4}));
  ExpectLayerGradients(
      plain, [&](const Tensor& input) { return plain.forward(input); }, randn({3, 4}));
}

TEST_F(LayersTest, RMSNormPrintsAndNamesItselfOnBadInput) {
  EXPECT_EQ(RMSNorm({64}).ToString(), "RMSNorm((64,), eps=None, elementwise_affine=True)");
  EXPECT_EQ(RMSNorm({3, 4}, 1e-6, false).ToString(),
            "RMSNorm((3, 4), eps=1e-06, elementwise_affine=False)");
  EXPECT_THAT(ErrorOf([] {
                RMSNorm({3, 4}).forward(zeros({2, 4, 3}));
              }),
              HasSubstr("RMSNorm((3, 4), eps=None, elementwise_affine=True): expected an input "
                        "whose last 2 dimension(s) are [3, 4] but got [2, 4, 3]"));
  EXPECT_THAT(ErrorOf([] { RMSNorm({}); }), HasSubstr("normalized_shape must name at least"));
  EXPECT_THAT(ErrorOf([] { RMSNorm({0}); }), HasSubstr("must have positive sizes"));
  EXPECT_THAT(ErrorOf([] { RMSNorm({4}, -1.0); }), HasSubstr("eps must be a finite value >= 0"));
}

// ---- Embedding -----------------------------------------------------------------------------

TEST_F(LayersTest, EmbeddingLooksUpRows) {
  Embedding embed(10, 3);
  EXPECT_EQ(embed.weight().shape(), (Shape{10, 3}));
  Tensor ids = from_vector(std::vector<int64_t>{4, 0, 9, 4, 2, 7}, {2, 3});
  Tensor y = embed.forward(ids);
  ASSERT_EQ(y.shape(), (Shape{2, 3, 3}));
  const std::vector<float> w = embed.weight().to_vector<float>(), out = y.to_vector<float>();
  const std::vector<int64_t> flat = ids.to_vector<int64_t>();
  for (size_t i = 0; i < flat.size(); ++i)
    for (int64_t d = 0; d < 3; ++d) EXPECT_EQ(out[i * 3 + d], w[flat[i] * 3 + d]);
  // A 0-D index gives one row.
  EXPECT_EQ(embed.forward(full({}, 3, TensorOptions(kInt64))).shape(), (Shape{3}));
  // Gradient: each row gets the sum of the gradients of its occurrences.
  Tensor upstream = randn({2, 3, 3});
  y.backward(upstream);
  const std::vector<float> g = embed.weight().grad().to_vector<float>();
  const std::vector<float> u = upstream.to_vector<float>();
  for (int64_t d = 0; d < 3; ++d) {
    EXPECT_NEAR(g[4 * 3 + d], u[0 * 3 + d] + u[3 * 3 + d], 1e-6);
    EXPECT_NEAR(g[9 * 3 + d], u[2 * 3 + d], 1e-6);
    EXPECT_EQ(g[1 * 3 + d], 0.0f);
  }
  // Against finite differences.
  Tensor weight = embed.weight().detach().clone();
  weight.set_requires_grad(true);
  EXPECT_GRADIENTS_MATCH(
      [&](const std::vector<Tensor>& in) {
        embed.replace_parameter("weight", in[0]);
        return embed.forward(ids);
      },
      {weight});
}

TEST_F(LayersTest, EmbeddingInitialisesNormalAndHonoursPaddingIdx) {
  // weight ~ N(0, 1), as PyTorch.
  const std::vector<float> values = Embedding(1000, 50).weight().to_vector<float>();
  double sum = 0, squares = 0;
  for (float v : values) {
    sum += v;
    squares += double(v) * v;
  }
  const double n = values.size();
  EXPECT_NEAR(sum / n, 0.0, 0.02);
  EXPECT_NEAR(squares / n, 1.0, 0.03);
  // padding_idx: zeros at first, and no gradient.
  Embedding embed(6, 4, /*padding_idx=*/-2);  // row 4
  ASSERT_EQ(embed.padding_idx(), std::optional<int64_t>(4));
  EXPECT_EQ(embed.weight().narrow(0, 4, 1).to_vector<float>(), std::vector<float>(4, 0.0f));
  Tensor ids = from_vector(std::vector<int64_t>{4, 1, 4}, {3});
  Tensor y = embed.forward(ids);
  EXPECT_EQ(y.narrow(0, 0, 1).to_vector<float>(), std::vector<float>(4, 0.0f));
  y.backward(ones({3, 4}));
  const std::vector<float> g = embed.weight().grad().to_vector<float>();
  for (int64_t d = 0; d < 4; ++d) {
    EXPECT_EQ(g[4 * 4 + d], 0.0f);
    EXPECT_EQ(g[1 * 4 + d], 1.0f);
  }
  // Cloning keeps the configuration and values.
  std::shared_ptr<Module> copy = embed.clone(Device::Cpu(1));
  EXPECT_EQ(copy->ToString(), "Embedding(6, 4, padding_idx=4)");
  EXPECT_TRUE(allclose(copy->parameter("weight").to(Device::Cpu(0)), embed.weight(), 0.0, 0.0));
}

TEST_F(LayersTest, EmbeddingPrintsAndNamesBadIndices) {
  EXPECT_EQ(Embedding(10, 3).ToString(), "Embedding(10, 3)");
  EXPECT_EQ(Embedding(10, 3, 0).ToString(), "Embedding(10, 3, padding_idx=0)");
  Embedding embed(10, 3);
  EXPECT_THAT(ErrorOf([&] {
                embed.forward(from_vector(std::vector<int64_t>{1, 12, 3}, {3}));
              }),
              HasSubstr("Embedding(10, 3): index 12 (element 1 of the [3] input) is out of range; "
                        "indices must be in [0, 10) (num_embeddings)"));
  EXPECT_THAT(ErrorOf([&] { embed.forward(from_vector(std::vector<int64_t>{-1}, {1})); }),
              HasSubstr("index -1 (element 0"));
  EXPECT_THAT(ErrorOf([&] { embed.forward(zeros({3})); }),
              HasSubstr("Embedding(10, 3): expected int64 indices but got float32"));
  EXPECT_THAT(ErrorOf([] { Embedding(10, 3, 10); }),
              HasSubstr("padding_idx must be within num_embeddings: in [-10, 10) but is 10"));
  EXPECT_THAT(ErrorOf([] { Embedding(0, 3); }),
              HasSubstr("num_embeddings and embedding_dim must be positive"));
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
  MaxPool2d ceil_pool(3, 2, 1, /*ceil_mode=*/true);
  ExpectCudaMatchesCpu(ceil_pool, DistinctValues({4, 3, 8, 9}));
  Conv2d grouped(Conv2dOptions(4, 6, 3).stride(2).padding(2).dilation(2).groups(2));
  ExpectCudaMatchesCpu(grouped, randn({3, 4, 11, 10}));
  Conv2d depthwise(Conv2dOptions(8, 8, 3).padding(1).groups(8));
  ExpectCudaMatchesCpu(depthwise, randn({2, 8, 9, 9}));
  Conv2d wide(Conv2dOptions(16, 12, 3).padding(1).groups(2));  // the batched-GEMM layout
  ExpectCudaMatchesCpu(wide, randn({3, 16, 9, 8}));
  for (bool count_include_pad : {true, false}) {
    AvgPool2d avg(3, 2, 1, /*ceil_mode=*/true, count_include_pad);
    ExpectCudaMatchesCpu(avg, randn({4, 3, 8, 9}));
  }
  for (Size2 size : {Size2(1), Size2(3, 4), Size2(9, 11)}) {
    AdaptiveAvgPool2d adaptive(size);
    ExpectCudaMatchesCpu(adaptive, randn({2, 3, 7, 10}));
  }
  for (const char* kind : {"none", "tanh"}) {
    GELU gelu(kind);
    ExpectCudaMatchesCpu(gelu, randn({16, 33}));
  }
  Tanh tanh_layer;
  ExpectCudaMatchesCpu(tanh_layer, randn({16, 33}));
  Sigmoid sigmoid_layer;
  ExpectCudaMatchesCpu(sigmoid_layer, randn({16, 33}));
  LayerNorm norm({5, 6});
  ExpectCudaMatchesCpu(norm, randn({4, 5, 6}));
  RMSNorm rms({6});
  ExpectCudaMatchesCpu(rms, randn({4, 5, 6}));
  {  // Embedding: same rows and weight gradients (the indices are not differentiable).
    Embedding embed(20, 7, /*padding_idx=*/3);
    std::shared_ptr<Module> gpu_embed = embed.clone(Device::Cuda(0));
    Tensor ids = from_vector(std::vector<int64_t>{3, 5, 19, 5, 0, 3}, {2, 3});
    Tensor y_cpu = embed.forward(ids);
    Tensor y_gpu = gpu_embed->forward_tensors({ids.to(Device::Cuda(0))})[0];
    EXPECT_LT(MaxAbsDiff(y_cpu, y_gpu), 1e-6);
    Tensor upstream = randn(y_cpu.shape());
    y_cpu.backward(upstream);
    y_gpu.backward(upstream.to(Device::Cuda(0)));
    EXPECT_LT(MaxAbsDiff(embed.weight().grad(), gpu_embed->parameter("weight").grad()), 1e-5);
    EXPECT_THAT(ErrorOf([&] {
                  gpu_embed->forward_tensors(
                      {from_vector(std::vector<int64_t>{20}, {1}).to(Device::Cuda(0))});
                }),
                HasSubstr("index 20 (element 0 of the [1] input) is out of range"));
  }
  // Dropout draws the same counter-based numbers on every device.
  BatchNorm1d bn1(64);
  ExpectCudaMatchesCpu(bn1, randn({16, 64, 3}));
  BatchNorm2d bn2(3);
  ExpectCudaMatchesCpu(bn2, randn({4, 3, 5, 5}));
  {  // Running statistics are updated alike.
    std::shared_ptr<Module> gpu_bn = bn2.clone(Device::Cuda(0));
    Tensor images = randn({4, 3, 5, 5});
    bn2.forward(images);
    gpu_bn->forward_tensors({images.to(Device::Cuda(0))});
    for (const char* name : {"running_mean", "running_var"}) {
      EXPECT_LT(MaxAbsDiff(bn2.buffer(name), gpu_bn->buffer(name)), 1e-5) << name;
    }
    EXPECT_EQ(gpu_bn->buffer("num_batches_tracked").item<int64_t>(), 2);
  }
  // Dropout draws the same counter-based numbers on cpu:0 and cuda:0 (same device index).
  Dropout dropout(0.5, 11);
  std::shared_ptr<Module> gpu = dropout.clone(Device::Cuda(0));
  Tensor x = randn({32, 32});
  dropout.manual_seed(11);
  Tensor on_cpu = dropout.forward(x);
  dropout.manual_seed(11);
  Tensor on_gpu = gpu->forward_tensors({x.to(Device::Cuda(0))})[0];
  EXPECT_LT(MaxAbsDiff(on_cpu, on_gpu), 1e-6);
  manual_seed(3);
  Tensor default_cpu = Dropout(0.5).forward(x);
  Tensor default_gpu = Dropout(0.5).forward(x.to(Device::Cuda(0)));
  EXPECT_LT(MaxAbsDiff(default_cpu, default_gpu), 1e-6);
}

}  // namespace
}  // namespace tandem::nn
