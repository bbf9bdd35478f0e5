// BatchNorm1d/2d (batch and running statistics, in-place buffer updates, clones),
// LayerNorm and RMSNorm: values against hand formulas, gradients, printing and errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nn/layers.h"
#include "nn/layers_test_util.h"
#include "nn/sequential.h"

namespace tandem::nn {
namespace {

using testing::ErrorOf;
using testing::ExpectLayerGradients;
using ::testing::HasSubstr;
using testing::LayersTest;
using testing::MaxAbsDiff;

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

// The residual add fused in (add_layer_norm): the sum and forward of the sum, with the layer's
// parameters (and their gradients) in it.
TEST_F(LayersTest, LayerNormForwardWithResidualIsForwardOfTheSum) {
  LayerNorm norm({4}, 1e-3);
  {
    NoGradGuard no_grad;
    Tensor(norm.weight()).copy_(randn({4}));
    Tensor(norm.bias()).copy_(randn({4}));
  }
  const Tensor x = randn({2, 3, 4}), r = randn({2, 3, 4});
  const auto [sum, y] = norm.forward_with_residual(x, r);
  EXPECT_TRUE(allclose(sum, x + r, 0.0, 0.0));
  EXPECT_TRUE(allclose(y, norm.forward(x + r), 0.0, 0.0));
  ExpectLayerGradients(
      norm,
      [&](const Tensor& input) {
        const auto [stream, h] = norm.forward_with_residual(input, input * 2.0);
        return stream * h;
      },
      randn({3, 4}));
  EXPECT_THAT(ErrorOf([&] { norm.forward_with_residual(x, Tensor()); }), HasSubstr("LayerNorm"));
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

}  // namespace
}  // namespace tandem::nn
