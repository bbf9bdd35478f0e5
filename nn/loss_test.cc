#include "nn/loss.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "nn/test_util.h"
#include "tensor/gradcheck.h"

namespace tandem::nn {
namespace {

namespace F = functional;
using testing::ErrorOf;
using ::testing::HasSubstr;
using testing::MaxAbsDiff;

class LossTest : public ::testing::Test {
 protected:
  void SetUp() override {
    manual_seed(0);
    SetCpuDeviceCount(2);
  }
};

Tensor Floats(const std::vector<float>& values, const Shape& shape) {
  return from_vector(values, shape);
}
Tensor Labels(const std::vector<int64_t>& values, const Shape& shape) {
  return from_vector(values, shape, kInt64);
}

// log softmax of row `row` of a row-major [rows, classes] matrix, in double precision.
std::vector<double> LogSoftmax(const std::vector<float>& logits, int64_t row, int64_t classes) {
  double top = -INFINITY;
  for (int64_t c = 0; c < classes; ++c) top = std::max<double>(top, logits[row * classes + c]);
  double total = 0.0;
  for (int64_t c = 0; c < classes; ++c) total += std::exp(logits[row * classes + c] - top);
  std::vector<double> out(classes);
  for (int64_t c = 0; c < classes; ++c) out[c] = logits[row * classes + c] - top - std::log(total);
  return out;
}

void ExpectValues(const Tensor& actual, const std::vector<double>& expected, double tolerance) {
  const std::vector<float> got = actual.to_vector<float>();
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], expected[i], tolerance) << "element " << i;
  }
}

// ---- CrossEntropyLoss with class indices ---------------------------------------------------

// Three rows of four classes; row r's loss is -log softmax(row r)[target r].
const std::vector<float> kLogits = {0.5f,  -1.0f, 2.0f,  0.0f,    // row 0
                                    1.5f,  0.25f, -0.5f, 1.0f,    // row 1
                                    -2.0f, 3.0f,  0.5f,  0.75f};  // row 2
const std::vector<int64_t> kTargets = {2, 0, 3};

TEST_F(LossTest, CrossEntropyMatchesTheFormulaForEveryReduction) {
  Tensor logits = Floats(kLogits, {3, 4});
  Tensor targets = Labels(kTargets, {3});
  std::vector<double> per_row;
  for (int64_t r = 0; r < 3; ++r) per_row.push_back(-LogSoftmax(kLogits, r, 4)[kTargets[r]]);
  const double total = per_row[0] + per_row[1] + per_row[2];

  CrossEntropyLoss by_default;
  EXPECT_NEAR(by_default.forward(logits, targets).item(), total / 3, 1e-6);
  EXPECT_EQ(by_default.forward(logits, targets).dim(), 0);
  CrossEntropyLoss none(CrossEntropyLossOptions().reduction(Reduction::kNone));
  Tensor each = none.forward(logits, targets);
  EXPECT_EQ(each.shape(), (Shape{3}));
  ExpectValues(each, per_row, 1e-6);
  CrossEntropyLoss summed(CrossEntropyLossOptions().reduction(Reduction::kSum));
  EXPECT_NEAR(summed.forward(logits, targets).item(), total, 1e-5);
  // The function, and the plain op of tensor/ops/ops.h, agree.
  EXPECT_NEAR(F::cross_entropy(logits, targets).item(), total / 3, 1e-6);
  EXPECT_NEAR(tandem::cross_entropy(logits, targets).item(), total / 3, 1e-6);
}

TEST_F(LossTest, CrossEntropyIsStableForLargeLogits) {
  // exp(1000) overflows float32; a stable implementation subtracts the row maximum.
  Tensor logits = Floats({1000, 0, -1000, 500, 1000, 1000}, {2, 3});
  Tensor targets = Labels({0, 2}, {2});
  // Row 0: target is the maximum, loss ~ 0. Row 1: two tied maxima, loss log 2.
  for (const CrossEntropyLossOptions& options :
       {CrossEntropyLossOptions(),
        CrossEntropyLossOptions().label_smoothing(0.0).weight(Floats({1, 1, 1}, {3}))}) {
    const double loss = F::cross_entropy(logits, targets, options).item();
    EXPECT_TRUE(std::isfinite(loss));
    EXPECT_NEAR(loss, (0.0 + std::log(2.0)) / 2.0, 1e-5);
  }
}

TEST_F(LossTest, CrossEntropyClassWeightsDivideByTheTargetsWeights) {
  Tensor logits = Floats(kLogits, {3, 4});
  Tensor targets = Labels(kTargets, {3});
  const std::vector<float> w = {0.5f, 2.0f, 3.0f, 0.25f};
  Tensor weight = Floats(w, {4});
  std::vector<double> weighted;
  double weight_sum = 0.0;
  for (int64_t r = 0; r < 3; ++r) {
    weighted.push_back(-w[kTargets[r]] * LogSoftmax(kLogits, r, 4)[kTargets[r]]);
    weight_sum += w[kTargets[r]];
  }
  const double total = weighted[0] + weighted[1] + weighted[2];
  auto options = [&](Reduction r) { return CrossEntropyLossOptions().weight(weight).reduction(r); };
  EXPECT_NEAR(F::cross_entropy(logits, targets, options(Reduction::kMean)).item(),
              total / weight_sum, 1e-6);
  EXPECT_NEAR(F::cross_entropy(logits, targets, options(Reduction::kSum)).item(), total, 1e-5);
  ExpectValues(F::cross_entropy(logits, targets, options(Reduction::kNone)), weighted, 1e-6);
  EXPECT_NEAR(CrossEntropyLoss(options(Reduction::kMean)).forward(logits, targets).item(),
              total / weight_sum, 1e-6);
}

TEST_F(LossTest, CrossEntropyIgnoresTargetsEqualToIgnoreIndex) {
  Tensor logits = Floats(kLogits, {3, 4});
  const double row0 = -LogSoftmax(kLogits, 0, 4)[2];
  const double row2 = -LogSoftmax(kLogits, 2, 4)[3];
  // PyTorch's default ignore_index is -100: such targets count for nothing, not as errors.
  Tensor with_default = Labels({2, -100, 3}, {3});
  EXPECT_NEAR(CrossEntropyLoss().forward(logits, with_default).item(), (row0 + row2) / 2, 1e-6);
  ExpectValues(
      F::cross_entropy(logits, with_default, CrossEntropyLossOptions().reduction(Reduction::kNone)),
      {row0, 0.0, row2}, 1e-6);
  EXPECT_NEAR(
      F::cross_entropy(logits, with_default, CrossEntropyLossOptions().reduction(Reduction::kSum))
          .item(),
      row0 + row2, 1e-5);
  // An ignore_index inside [0, C) (a padding class), with a weight: the mean divides by the
  // weights of the targets kept only.
  const std::vector<float> w = {0.5f, 2.0f, 3.0f, 0.25f};
  Tensor padded = Labels({2, 1, 3}, {3});
  EXPECT_NEAR(F::cross_entropy(logits, padded,
                               CrossEntropyLossOptions().ignore_index(1).weight(Floats(w, {4})))
                  .item(),
              (w[2] * row0 + w[3] * row2) / (w[2] + w[3]), 1e-6);
  // An ignore_index between the smallest and largest target that no target equals.
  Tensor unpadded = Labels({2, 0, 3}, {3});
  EXPECT_NEAR(F::cross_entropy(logits, unpadded, CrossEntropyLossOptions().ignore_index(1)).item(),
              F::cross_entropy(logits, unpadded).item(), 1e-7);
  EXPECT_NEAR(F::cross_entropy(logits, unpadded).item(),
              (row0 - LogSoftmax(kLogits, 1, 4)[0] + row2) / 3, 1e-6);
  // Every target ignored: 0 / 0, NaN, as in PyTorch; the sum is 0.
  Tensor all_ignored = Labels({-100, -100, -100}, {3});
  EXPECT_TRUE(std::isnan(F::cross_entropy(logits, all_ignored).item()));
  EXPECT_EQ(
      F::cross_entropy(logits, all_ignored, CrossEntropyLossOptions().reduction(Reduction::kSum))
          .item(),
      0.0);
}

TEST_F(LossTest, CrossEntropyIgnoredRowsMayHoldMinusInfinity) {
  const float inf = std::numeric_limits<float>::infinity();
  Tensor logits = Floats({-inf, 0, 0, 1, 2, 3}, {2, 3}).set_requires_grad(true);
  Tensor loss = F::cross_entropy(logits, Labels({-100, 2}, {2}));
  EXPECT_NEAR(loss.item(), -LogSoftmax({1, 2, 3}, 0, 3)[2], 1e-6);
  loss.backward();
  for (float g : logits.grad().to_vector<float>()) EXPECT_TRUE(std::isfinite(g));
}

TEST_F(LossTest, CrossEntropyLabelSmoothingFollowsPyTorchsFormula) {
  Tensor logits = Floats(kLogits, {3, 4});
  Tensor targets = Labels({2, -100, 3}, {3});
  const double s = 0.2;
  const std::vector<float> w = {0.5f, 2.0f, 3.0f, 0.25f};
  // loss_r = (1 - s) w[t] (-lp[t]) + s / C sum_c w_c (-lp[c]); with no weight, w = 1. Rows
  // whose target is ignored count for nothing; the mean divides by the kept targets' weights.
  for (bool weighted : {false, true}) {
    SCOPED_TRACE(weighted ? "with weight" : "without weight");
    std::vector<double> per_row(3, 0.0);
    double denominator = 0.0;
    for (int64_t r : {0, 2}) {
      const std::vector<double> lp = LogSoftmax(kLogits, r, 4);
      const int64_t t = r == 0 ? 2 : 3;
      const double wt = weighted ? w[t] : 1.0;
      double smooth = 0.0;
      for (int64_t c = 0; c < 4; ++c) smooth += (weighted ? w[c] : 1.0) * -lp[c];
      per_row[r] = (1 - s) * wt * -lp[t] + s / 4 * smooth;
      denominator += wt;
    }
    CrossEntropyLossOptions options = CrossEntropyLossOptions().label_smoothing(s);
    if (weighted) options.weight(Floats(w, {4}));
    EXPECT_NEAR(F::cross_entropy(logits, targets, options).item(),
                (per_row[0] + per_row[2]) / denominator, 1e-6);
    ExpectValues(F::cross_entropy(logits, targets, options.reduction(Reduction::kNone)), per_row,
                 1e-6);
  }
  // label_smoothing 1: the uniform distribution alone.
  Tensor uniform = F::cross_entropy(logits, Labels(kTargets, {3}),
                                    CrossEntropyLossOptions().label_smoothing(1.0));
  double expected = 0.0;
  for (int64_t r = 0; r < 3; ++r) {
    for (double lp : LogSoftmax(kLogits, r, 4)) expected -= lp / 4;
  }
  EXPECT_NEAR(uniform.item(), expected / 3, 1e-6);
}

TEST_F(LossTest, CrossEntropyTakesClassProbabilities) {
  Tensor logits = Floats(kLogits, {3, 4});
  const std::vector<float> p = {0.1f,  0.2f,  0.3f,  0.4f,  //
                                1.0f,  0.0f,  0.0f,  0.0f,  //
                                0.25f, 0.25f, 0.25f, 0.25f};
  Tensor probs = Floats(p, {3, 4});
  const std::vector<float> w = {0.5f, 2.0f, 3.0f, 0.25f};
  const double s = 0.1;
  for (int variant = 0; variant < 3; ++variant) {  // plain, weighted, smoothed
    std::vector<double> per_row;
    for (int64_t r = 0; r < 3; ++r) {
      const std::vector<double> lp = LogSoftmax(kLogits, r, 4);
      double loss = 0.0;
      for (int64_t c = 0; c < 4; ++c) {
        double target = p[r * 4 + c];
        if (variant == 2) target = target * (1 - s) + s / 4;
        loss -= (variant == 1 ? w[c] : 1.0) * target * lp[c];
      }
      per_row.push_back(loss);
    }
    CrossEntropyLossOptions options;
    if (variant == 1) options.weight(Floats(w, {4}));
    if (variant == 2) options.label_smoothing(s);
    // The mean divides by the number of rows, with or without a weight (PyTorch).
    EXPECT_NEAR(F::cross_entropy(logits, probs, options).item(),
                (per_row[0] + per_row[1] + per_row[2]) / 3, 1e-6)
        << "variant " << variant;
    ExpectValues(F::cross_entropy(logits, probs, options.reduction(Reduction::kNone)), per_row,
                 1e-6);
  }
  // One-hot probabilities give the class-index loss.
  Tensor one_hot = Floats({0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 1}, {3, 4});
  EXPECT_NEAR(F::cross_entropy(logits, one_hot).item(),
              F::cross_entropy(logits, Labels(kTargets, {3})).item(), 1e-6);
}

TEST_F(LossTest, CrossEntropyOverExtraDimensionsAndSingleSamples) {
  // [N=2, C=3, d=2]: the loss of (n, d) is -log softmax(input[n, :, d])[target[n, d]].
  const std::vector<float> x = {0.1f,  0.9f, 0.2f, -0.4f, 1.5f,  0.3f,     // n = 0
                                -1.0f, 0.0f, 2.0f, 0.5f,  0.25f, -0.75f};  // n = 1
  Tensor input = Floats(x, {2, 3, 2});
  const std::vector<int64_t> t = {2, 0, 1, -100};
  Tensor target = Labels(t, {2, 2});
  std::vector<double> expected;
  for (int64_t n = 0; n < 2; ++n) {
    for (int64_t d = 0; d < 2; ++d) {
      std::vector<float> column;
      for (int64_t c = 0; c < 3; ++c) column.push_back(x[(n * 3 + c) * 2 + d]);
      const int64_t label = t[n * 2 + d];
      expected.push_back(label < 0 ? 0.0 : -LogSoftmax(column, 0, 3)[label]);
    }
  }
  Tensor each =
      F::cross_entropy(input, target, CrossEntropyLossOptions().reduction(Reduction::kNone));
  EXPECT_EQ(each.shape(), (Shape{2, 2}));
  ExpectValues(each, expected, 1e-6);
  EXPECT_NEAR(F::cross_entropy(input, target).item(), (expected[0] + expected[1] + expected[2]) / 3,
              1e-6);
  // Class probabilities of input's shape, over the same dimension 1.
  Tensor one_hot = zeros({2, 3, 2});
  {
    NoGradGuard no_grad;
    one_hot.select(0, 0).select(1, 0).select(0, 2).fill_(1.0);
    one_hot.select(0, 0).select(1, 1).select(0, 0).fill_(1.0);
    one_hot.select(0, 1).select(1, 0).select(0, 1).fill_(1.0);
  }
  ExpectValues(
      F::cross_entropy(input, one_hot, CrossEntropyLossOptions().reduction(Reduction::kNone)),
      expected, 1e-6);
  // A single sample: input [C], target a zero-dimensional index.
  Tensor single = F::cross_entropy(Floats({0.5f, -1.0f, 2.0f, 0.0f}, {4}), Labels({2}, {}));
  EXPECT_EQ(single.dim(), 0);
  EXPECT_NEAR(single.item(), -LogSoftmax(kLogits, 0, 4)[2], 1e-6);
}

TEST_F(LossTest, CrossEntropyGradients) {
  Tensor targets = Labels({2, 0, -100, 1, 2}, {5});
  Tensor weight = Floats({0.5f, 2.0f, 1.5f}, {3});
  Tensor logits = randn({5, 3}).set_requires_grad(true);
  const std::vector<CrossEntropyLossOptions> cases = {
      CrossEntropyLossOptions(),
      CrossEntropyLossOptions().weight(weight),
      CrossEntropyLossOptions().label_smoothing(0.3).weight(weight),
      CrossEntropyLossOptions().label_smoothing(0.1).reduction(Reduction::kNone),
      CrossEntropyLossOptions().weight(weight).reduction(Reduction::kSum),
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    CrossEntropyLoss criterion(cases[i]);
    EXPECT_GRADIENTS_MATCH(
        [&](const std::vector<Tensor>& in) { return criterion.forward(in[0], targets); }, {logits});
  }
  // Class probabilities: gradients for the logits and the target.
  Tensor probs = softmax(randn({4, 3}), 1).detach().set_requires_grad(true);
  Tensor logits4 = randn({4, 3}).set_requires_grad(true);
  EXPECT_GRADIENTS_MATCH(
      [&](const std::vector<Tensor>& in) {
        return F::cross_entropy(in[0], in[1],
                                CrossEntropyLossOptions().weight(weight).label_smoothing(0.2));
      },
      {logits4, probs});
  // Extra dimensions.
  Tensor image = randn({2, 3, 2, 2}).set_requires_grad(true);
  Tensor labels = Labels({0, 1, 2, 1, 2, -100, 0, 0}, {2, 2, 2});
  EXPECT_GRADIENTS_MATCH(
      [&](const std::vector<Tensor>& in) {
        return F::cross_entropy(in[0], labels, CrossEntropyLossOptions().weight(weight));
      },
      {image});
}

TEST_F(LossTest, CrossEntropyRejectsMistakesClearly) {
  CrossEntropyLoss criterion;
  EXPECT_THAT(ErrorOf([&] {
                criterion.forward(randn({2, 3}), Labels({0, 3}, {2}));
              }),
              HasSubstr("cross_entropy: target element 1 (row-major) is 3, which is neither a "
                        "class index in [0, C) = [0, 3) nor ignore_index (-100)"));
  EXPECT_THAT(ErrorOf([&] {
                criterion.forward(randn({2, 3}), Labels({-1, 0}, {2}));
              }),
              HasSubstr("target element 0 (row-major) is -1"));
  EXPECT_THAT(ErrorOf([&] {
                criterion.forward(randn({2, 3}), zeros({2}));
              }),
              HasSubstr("cross_entropy: target must be int64 class indices but is float32"));
  EXPECT_THAT(
      ErrorOf([&] {
        criterion.forward(randn({2, 3}), zeros({2, 3}, kInt64));
      }),
      HasSubstr("so it is read as class probabilities and must be floating-point, but is int64"));
  EXPECT_THAT(ErrorOf([&] {
                criterion.forward(randn({2, 3}), zeros({3}, kInt64));
              }),
              HasSubstr("input is [2, 3] so class-index targets must be [2]"));
  EXPECT_THAT(ErrorOf([&] { criterion.forward(scalar_tensor(1.0), zeros({}, kInt64)); }),
              HasSubstr("input must have a class dimension"));
  EXPECT_THAT(ErrorOf([&] {
                F::cross_entropy(randn({2, 3}), Labels({0, 1}, {2}),
                                 CrossEntropyLossOptions().weight(ones({4})));
              }),
              HasSubstr("weight must hold one entry per class, [C] = [3], but is [4]"));
  EXPECT_THAT(ErrorOf([&] { CrossEntropyLoss(CrossEntropyLossOptions().label_smoothing(1.5)); }),
              HasSubstr("label_smoothing must be in [0, 1] but is 1.5"));
  EXPECT_THAT(ErrorOf([&] {
                F::cross_entropy(randn({2, 3}), softmax(randn({2, 3}), 1),
                                 CrossEntropyLossOptions().ignore_index(0));
              }),
              HasSubstr("ignore_index (0) applies to class-index targets only"));
  EXPECT_THAT(ErrorOf([&] {
                criterion.forward(randn({2, 3}), Labels({0, 1}, {2}).to(Device::Cpu(1)));
              }),
              HasSubstr("input is on cpu:0 and target on cpu:1"));
  EXPECT_THAT(ErrorOf([&] {
                criterion.forward(zeros({2, 3}, kInt64), Labels({0, 1}, {2}));
              }),
              HasSubstr("cross_entropy: input must be a floating-point tensor (float32 or float64) "
                        "but is int64"));
}

// ---- NLLLoss -------------------------------------------------------------------------------

TEST_F(LossTest, NllLossPicksWeightedNegativeLogProbabilities) {
  const std::vector<float> lp = {-0.1f, -2.5f, -3.0f,  //
                                 -1.2f, -0.7f, -1.6f,  //
                                 -2.2f, -0.4f, -1.3f,  //
                                 -0.9f, -0.9f, -1.5f};
  Tensor log_probs = Floats(lp, {4, 3});
  Tensor targets = Labels({0, 2, -100, 1}, {4});
  NLLLoss plain;
  EXPECT_NEAR(plain.forward(log_probs, targets).item(), (0.1 + 1.6 + 0.9) / 3, 1e-6);
  EXPECT_EQ(plain.ToString(), "NLLLoss()");
  const std::vector<float> w = {2.0f, 0.5f, 4.0f};
  NLLLoss weighted(NLLLossOptions().weight(Floats(w, {3})));
  EXPECT_NEAR(weighted.forward(log_probs, targets).item(),
              (2.0 * 0.1 + 4.0 * 1.6 + 0.5 * 0.9) / (2.0 + 4.0 + 0.5), 1e-6);
  ExpectValues(F::nll_loss(log_probs, targets,
                           NLLLossOptions().weight(Floats(w, {3})).reduction(Reduction::kNone)),
               {0.2, 6.4, 0.0, 0.45}, 1e-6);
  EXPECT_NEAR(F::nll_loss(log_probs, Labels({0, 2, 1, 1}, {4}),
                          NLLLossOptions().ignore_index(1).reduction(Reduction::kSum))
                  .item(),
              0.1 + 1.6, 1e-6);
  // NLL of log_softmax is cross-entropy.
  Tensor logits = Floats(kLogits, {3, 4});
  EXPECT_NEAR(F::nll_loss(log_softmax(logits, 1), Labels(kTargets, {3})).item(),
              F::cross_entropy(logits, Labels(kTargets, {3})).item(), 1e-6);
}

TEST_F(LossTest, NllLossGradientsAndErrors) {
  Tensor log_probs = log_softmax(randn({4, 3}), 1).detach().set_requires_grad(true);
  Tensor targets = Labels({0, 2, -100, 1}, {4});
  NLLLoss criterion(NLLLossOptions().weight(Floats({2.0f, 0.5f, 4.0f}, {3})));
  EXPECT_GRADIENTS_MATCH(
      [&](const std::vector<Tensor>& in) { return criterion.forward(in[0], targets); },
      {log_probs});
  EXPECT_THAT(ErrorOf([&] {
                criterion.forward(log_probs, Labels({0, 2, 5, 1}, {4}));
              }),
              HasSubstr("nll_loss: target element 2 (row-major) is 5, which is neither a class "
                        "index in [0, C) = [0, 3) nor ignore_index (-100)"));
  EXPECT_THAT(ErrorOf([&] {
                F::nll_loss(log_probs, zeros({4, 3}));
              }),
              HasSubstr("nll_loss: target must be int64 class indices but is float32"));
  EXPECT_THAT(ErrorOf([&] {
                NLLLoss(NLLLossOptions().weight(ones({3, 1})));
              }),
              HasSubstr("NLLLoss: weight must be 1-D [C]"));
}

// ---- BCEWithLogitsLoss ---------------------------------------------------------------------

double Sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

TEST_F(LossTest, BceWithLogitsMatchesTheFormula) {
  const std::vector<float> x = {0.3f, -1.2f, 2.5f, 0.0f, -0.4f, 1.1f};
  const std::vector<float> t = {1.0f, 0.0f, 1.0f, 0.5f, 1.0f, 0.0f};
  const std::vector<float> w = {2.0f, 0.5f, 1.0f};    // per column ([3] broadcasts)
  const std::vector<float> pw = {3.0f, 1.0f, 0.25f};  // per class
  Tensor input = Floats(x, {2, 3}), target = Floats(t, {2, 3});
  // -w [pw t log s(x) + (1 - t) log(1 - s(x))].
  auto expected = [&](bool weighted, bool positive_weighted) {
    std::vector<double> out;
    for (size_t i = 0; i < x.size(); ++i) {
      const double s = Sigmoid(x[i]), p = positive_weighted ? pw[i % 3] : 1.0;
      out.push_back(-(weighted ? w[i % 3] : 1.0) *
                    (p * t[i] * std::log(s) + (1 - t[i]) * std::log(1 - s)));
    }
    return out;
  };
  const auto none = BCEWithLogitsLossOptions().reduction(Reduction::kNone);
  ExpectValues(F::binary_cross_entropy_with_logits(input, target, none), expected(false, false),
               1e-6);
  ExpectValues(F::binary_cross_entropy_with_logits(
                   input, target, BCEWithLogitsLossOptions(none).weight(Floats(w, {3}))),
               expected(true, false), 1e-6);
  ExpectValues(
      F::binary_cross_entropy_with_logits(
          input, target,
          BCEWithLogitsLossOptions(none).weight(Floats(w, {3})).pos_weight(Floats(pw, {3}))),
      expected(true, true), 1e-6);
  double total = 0.0;
  for (double v : expected(false, true)) total += v;
  BCEWithLogitsLoss mean_loss(BCEWithLogitsLossOptions().pos_weight(Floats(pw, {3})));
  EXPECT_NEAR(mean_loss.forward(input, target).item(), total / 6, 1e-6);
  BCEWithLogitsLoss sum_loss(BCEWithLogitsLossOptions().reduction(Reduction::kSum));
  double plain_total = 0.0;
  for (double v : expected(false, false)) plain_total += v;
  EXPECT_NEAR(sum_loss.forward(input, target).item(), plain_total, 1e-5);
}

TEST_F(LossTest, BceWithLogitsIsStableAndItsGradientIsSigmoidMinusTarget) {
  // Naively log(sigmoid(-100)) is log(0) = -inf in float32.
  Tensor input = Floats({100, -100, 100, -100, 0, 0, 20, -20}, {8}).set_requires_grad(true);
  Tensor target = Floats({0, 1, 1, 0, 1, 0, 0.5f, 0.5f}, {8});
  Tensor loss = F::binary_cross_entropy_with_logits(
      input, target, BCEWithLogitsLossOptions().reduction(Reduction::kNone));
  ExpectValues(loss,
               {100, 100, 0, 0, std::log(2.0), std::log(2.0), 10 + std::log1p(std::exp(-20.0)),
                10 + std::log1p(std::exp(-20.0))},
               1e-5);
  sum(loss).backward();
  // d/dx = sigmoid(x) - t, also exactly at x = 0 (where max(x, 0) or |x| have a kink).
  std::vector<double> expected;
  for (float v : std::vector<float>{100, -100, 100, -100, 0, 0, 20, -20}) {
    expected.push_back(Sigmoid(v));
  }
  const std::vector<float> t = target.to_vector<float>();
  for (size_t i = 0; i < expected.size(); ++i) expected[i] -= t[i];
  ExpectValues(input.grad(), expected, 1e-6);
}

TEST_F(LossTest, BceWithLogitsGradientsAndErrors) {
  Tensor input = randn({3, 4}).set_requires_grad(true);
  Tensor target = rand({3, 4}).set_requires_grad(true);
  BCEWithLogitsLoss criterion(BCEWithLogitsLossOptions()
                                  .weight(Floats({1.0f, 2.0f, 0.5f}, {3, 1}))
                                  .pos_weight(Floats({0.5f, 1.0f, 2.0f, 3.0f}, {4})));
  EXPECT_GRADIENTS_MATCH(
      [&](const std::vector<Tensor>& in) { return criterion.forward(in[0], in[1]); },
      {input, target});
  EXPECT_EQ(criterion.ToString(), "BCEWithLogitsLoss()");
  EXPECT_THAT(ErrorOf([&] {
                criterion.forward(randn({3, 4}), rand({3}));
              }),
              HasSubstr("binary_cross_entropy_with_logits: input is [3, 4] and target is [3]; "
                        "they must have the same shape"));
  EXPECT_THAT(
      ErrorOf([&] {
        criterion.forward(randn({3, 4}), zeros({3, 4}, kInt64));
      }),
      HasSubstr("target must be a floating-point tensor (float32 or float64) but is int64"));
  EXPECT_THAT(ErrorOf([&] {
                F::binary_cross_entropy_with_logits(
                    randn({3, 4}), rand({3, 4}), BCEWithLogitsLossOptions().pos_weight(ones({3})));
              }),
              HasSubstr("pos_weight is [3] which does not broadcast to input's shape [3, 4]"));
}

// ---- MSELoss, L1Loss, SmoothL1Loss ---------------------------------------------------------

TEST_F(LossTest, RegressionLossesMatchTheirFormulas) {
  const std::vector<float> x = {0.5f, -1.0f, 2.0f, 3.0f, -0.2f, 0.0f};
  const std::vector<float> y = {1.0f, 1.0f, 1.9f, 0.0f, -0.3f, 0.0f};
  Tensor input = Floats(x, {2, 3}), target = Floats(y, {2, 3});
  std::vector<double> squared, absolute, smooth, smooth_half;
  for (size_t i = 0; i < x.size(); ++i) {
    const double d = static_cast<double>(x[i]) - y[i], a = std::fabs(d);
    squared.push_back(d * d);
    absolute.push_back(a);
    smooth.push_back(a < 1.0 ? 0.5 * d * d : a - 0.5);
    smooth_half.push_back(a < 0.5 ? 0.5 * d * d / 0.5 : a - 0.25);
  }
  auto total = [](const std::vector<double>& v) {
    double s = 0.0;
    for (double e : v) s += e;
    return s;
  };
  EXPECT_NEAR(MSELoss().forward(input, target).item(), total(squared) / 6, 1e-6);
  EXPECT_NEAR(MSELoss(MSELossOptions().reduction(Reduction::kSum)).forward(input, target).item(),
              total(squared), 1e-5);
  ExpectValues(F::mse_loss(input, target, MSELossOptions().reduction(Reduction::kNone)), squared,
               1e-6);
  EXPECT_NEAR(L1Loss().forward(input, target).item(), total(absolute) / 6, 1e-6);
  ExpectValues(F::l1_loss(input, target, L1LossOptions().reduction(Reduction::kNone)), absolute,
               1e-6);
  EXPECT_NEAR(F::l1_loss(input, target, L1LossOptions().reduction(Reduction::kSum)).item(),
              total(absolute), 1e-5);
  EXPECT_NEAR(SmoothL1Loss().forward(input, target).item(), total(smooth) / 6, 1e-6);
  ExpectValues(
      F::smooth_l1_loss(input, target, SmoothL1LossOptions().beta(0.5).reduction(Reduction::kNone)),
      smooth_half, 1e-6);
  // beta = 0 is the L1 loss.
  EXPECT_NEAR(F::smooth_l1_loss(input, target, SmoothL1LossOptions().beta(0.0)).item(),
              total(absolute) / 6, 1e-6);
  EXPECT_NEAR(tandem::mse_loss(input, target).item(), total(squared) / 6, 1e-6);
}

TEST_F(LossTest, RegressionLossGradients) {
  // Differences kept away from the kinks (|d| = 0 and |d| = beta).
  Tensor input = Floats({0.5f, -1.0f, 2.0f, 3.0f, -0.2f, 0.7f}, {2, 3}).set_requires_grad(true);
  Tensor target = Floats({1.2f, 1.0f, 1.8f, 0.0f, -0.6f, 0.0f}, {2, 3}).set_requires_grad(true);
  MSELoss mse(MSELossOptions().reduction(Reduction::kSum));
  L1Loss l1;
  SmoothL1Loss smooth(SmoothL1LossOptions().beta(0.5).reduction(Reduction::kNone));
  SmoothL1Loss smooth_l1_zero(SmoothL1LossOptions().beta(0.0));
  for (Module* criterion : std::vector<Module*>{&mse, &l1, &smooth, &smooth_l1_zero}) {
    SCOPED_TRACE(criterion->name());
    EXPECT_GRADIENTS_MATCH(
        [&](const std::vector<Tensor>& in) {
          return criterion->forward_tensors({in[0], in[1]}).at(0);
        },
        {input, target});
  }
}

TEST_F(LossTest, RegressionLossesRejectMistakes) {
  EXPECT_THAT(ErrorOf([&] {
                MSELoss().forward(randn({3}), randn({3, 1}));
              }),
              HasSubstr("mse_loss: input is [3] and target is [3, 1]; they must have the same "
                        "shape"));
  EXPECT_THAT(
      ErrorOf([&] { L1Loss().forward(randn({3}), zeros({3}, kInt64)); }),
      HasSubstr(
          "l1_loss: target must be a floating-point tensor (float32 or float64) but is int64"));
  EXPECT_THAT(ErrorOf([&] { SmoothL1Loss(SmoothL1LossOptions().beta(-1.0)); }),
              HasSubstr("SmoothL1Loss: beta must be >= 0 (0 gives the L1 loss) but is -1"));
  EXPECT_THAT(
      ErrorOf([&] { F::smooth_l1_loss(randn({3}), randn({3}), SmoothL1LossOptions().beta(-0.5)); }),
      HasSubstr("smooth_l1_loss: beta must be >= 0"));
}

// ---- Modules -------------------------------------------------------------------------------

TEST_F(LossTest, ModulesPrintAsPyTorchAndKeepWeightsAsBuffers) {
  EXPECT_EQ(CrossEntropyLoss().ToString(), "CrossEntropyLoss()");
  EXPECT_EQ(CrossEntropyLoss(CrossEntropyLossOptions().label_smoothing(0.1)).ToString(),
            "CrossEntropyLoss()");
  EXPECT_EQ(MSELoss().ToString(), "MSELoss()");
  EXPECT_EQ(L1Loss().ToString(), "L1Loss()");
  EXPECT_EQ(SmoothL1Loss().ToString(), "SmoothL1Loss()");
  EXPECT_TRUE(CrossEntropyLoss().state_dict().empty());

  Tensor weight = Floats({0.5f, 2.0f, 3.0f, 0.25f}, {4});
  CrossEntropyLoss criterion(CrossEntropyLossOptions().weight(weight));
  const std::vector<NamedTensor> state = criterion.state_dict();
  ASSERT_EQ(state.size(), 1u);
  EXPECT_EQ(state[0].name, "weight");
  EXPECT_TRUE(criterion.parameters().empty());
  BCEWithLogitsLoss bce(BCEWithLogitsLossOptions().weight(ones({3})).pos_weight(ones({3})));
  ASSERT_EQ(bce.named_buffers().size(), 2u);
  EXPECT_EQ(bce.named_buffers()[1].name, "pos_weight");

  // to() moves the weight, and the loss then runs on that device.
  Tensor logits = Floats(kLogits, {3, 4});
  Tensor targets = Labels(kTargets, {3});
  const double on_cpu0 = criterion.forward(logits, targets).item();
  criterion.to(Device::Cpu(1));
  EXPECT_EQ(criterion.weight().device(), Device::Cpu(1));
  Tensor moved = criterion.forward(logits.to(Device::Cpu(1)), targets.to(Device::Cpu(1)));
  EXPECT_EQ(moved.device(), Device::Cpu(1));
  EXPECT_NEAR(moved.item(), on_cpu0, 1e-6);
  // clone() copies the options and the weight.
  auto copy = std::dynamic_pointer_cast<CrossEntropyLoss>(criterion.clone(Device::Cpu(0)));
  ASSERT_NE(copy, nullptr);
  EXPECT_EQ(copy->weight().device(), Device::Cpu(0));
  EXPECT_FALSE(copy->weight().shares_storage_with(criterion.weight()));
  EXPECT_NEAR(copy->forward(logits, targets).item(), on_cpu0, 1e-6);
}

TEST_F(LossTest, CudaMatchesCpu) {
  TANDEM_SKIP_WITHOUT_CUDA();
  const Device gpu = Device::Cuda(0);
  // Each loss, forward and input gradient, on the GPU against the CPU.
  auto compare = [&](const std::string& name, Module& cpu_loss, const Tensor& input,
                     const Tensor& target) {
    SCOPED_TRACE(name);
    std::shared_ptr<Module> gpu_loss = cpu_loss.clone(gpu);
    Tensor cpu_in = input.detach().clone().set_requires_grad(true);
    Tensor gpu_in = input.to(gpu).set_requires_grad(true);
    Tensor cpu_out = cpu_loss.forward_tensors({cpu_in, target}).at(0);
    Tensor gpu_out = gpu_loss->forward_tensors({gpu_in, target.to(gpu)}).at(0);
    EXPECT_EQ(gpu_out.device(), gpu);
    EXPECT_LT(MaxAbsDiff(cpu_out, gpu_out), 1e-5);
    sum(cpu_out).backward();
    sum(gpu_out).backward();
    EXPECT_LT(MaxAbsDiff(cpu_in.grad(), gpu_in.grad()), 1e-5);
  };
  std::vector<int64_t> labels(64);
  for (int64_t i = 0; i < 64; ++i) labels[i] = i % 9 == 0 ? -100 : (i * 7) % 10;
  Tensor logits = randn({64, 10});
  Tensor targets = Labels(labels, {64});
  Tensor class_weight = rand({10});
  CrossEntropyLoss plain;
  compare("CrossEntropyLoss()", plain, logits, Labels(std::vector<int64_t>(64, 3), {64}));
  CrossEntropyLoss full_options(
      CrossEntropyLossOptions().weight(class_weight).label_smoothing(0.1));
  compare("CrossEntropyLoss(weight, smoothing)", full_options, logits, targets);
  compare("CrossEntropyLoss(probabilities)", full_options, logits, softmax(randn({64, 10}), 1));
  NLLLoss nll(NLLLossOptions().weight(class_weight).reduction(Reduction::kNone));
  compare("NLLLoss", nll, log_softmax(logits, 1), targets);
  BCEWithLogitsLoss bce(BCEWithLogitsLossOptions().pos_weight(rand({10})));
  compare("BCEWithLogitsLoss", bce, mul(logits, 10.0), rand({64, 10}));
  MSELoss mse;
  compare("MSELoss", mse, logits, randn({64, 10}));
  L1Loss l1;
  compare("L1Loss", l1, logits, randn({64, 10}));
  SmoothL1Loss smooth(SmoothL1LossOptions().beta(0.5));
  compare("SmoothL1Loss", smooth, logits, randn({64, 10}));
}

// forward_parts() is forward() before its reduction's last step: numerator / denominator for
// kMean, numerator for kSum and kNone.
void ExpectPartsMatchForward(const std::string& name, Module& loss, const Tensor& input,
                             const Tensor& target) {
  SCOPED_TRACE(name);
  const auto& chunkable = dynamic_cast<const ChunkableLoss&>(loss);
  const Tensor value = loss.forward_tensors({input, target}).at(0);
  const LossParts parts = chunkable.forward_parts(input, target);
  ASSERT_TRUE(parts.numerator.defined());
  if (parts.reduction == Reduction::kNone) {
    EXPECT_FALSE(parts.denominator.defined());
    ASSERT_EQ(parts.numerator.shape(), value.shape());
    EXPECT_LE(MaxAbsDiff(parts.numerator, value), 1e-5);
    return;
  }
  EXPECT_EQ(parts.numerator.dim(), 0);
  if (parts.reduction == Reduction::kSum) {
    EXPECT_FALSE(parts.denominator.defined());
    EXPECT_NEAR(parts.numerator.item(), value.item(), 1e-4 * std::max(1.0, std::abs(value.item())));
    return;
  }
  ASSERT_TRUE(parts.denominator.defined());
  EXPECT_EQ(parts.denominator.dim(), 0);
  const double ratio = parts.numerator.item() / parts.denominator.item();
  if (std::isnan(value.item())) {
    EXPECT_TRUE(std::isnan(ratio));
  } else {
    EXPECT_NEAR(ratio, value.item(), 1e-5 * std::max(1.0, std::abs(value.item())));
  }
}

TEST_F(LossTest, ForwardPartsAreForwardBeforeItsReduction) {
  const Tensor logits = randn({12, 5});
  const Tensor labels = Labels({0, 1, 2, 3, 4, -100, 1, 2, -100, 4, 0, 3}, {12});
  const Tensor all_valid = Labels({0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 3}, {12});
  const Tensor weight = Floats({0.5f, 2.0f, 1.0f, 3.0f, 0.25f}, {5});
  for (Reduction reduction : {Reduction::kMean, Reduction::kSum, Reduction::kNone}) {
    const std::string r = ReductionName(reduction);
    CrossEntropyLoss plain(CrossEntropyLossOptions().reduction(reduction));
    ExpectPartsMatchForward("CrossEntropyLoss " + r, plain, logits, all_valid);
    ExpectPartsMatchForward("CrossEntropyLoss ignored " + r, plain, logits, labels);
    CrossEntropyLoss weighted(CrossEntropyLossOptions().weight(weight).reduction(reduction));
    ExpectPartsMatchForward("CrossEntropyLoss weight " + r, weighted, logits, labels);
    CrossEntropyLoss smoothed(
        CrossEntropyLossOptions().weight(weight).label_smoothing(0.2).reduction(reduction));
    ExpectPartsMatchForward("CrossEntropyLoss smoothing " + r, smoothed, logits, labels);
    ExpectPartsMatchForward("CrossEntropyLoss probabilities " + r, smoothed, logits,
                            softmax(randn({12, 5}), 1));
    NLLLoss nll(NLLLossOptions().weight(weight).reduction(reduction));
    ExpectPartsMatchForward("NLLLoss " + r, nll, log_softmax(logits, 1), labels);
    BCEWithLogitsLoss bce(
        BCEWithLogitsLossOptions().weight(rand({5})).pos_weight(rand({5})).reduction(reduction));
    ExpectPartsMatchForward("BCEWithLogitsLoss " + r, bce, logits, rand({12, 5}));
    MSELoss mse(MSELossOptions().reduction(reduction));
    ExpectPartsMatchForward("MSELoss " + r, mse, logits, randn({12, 5}));
    L1Loss l1(L1LossOptions().reduction(reduction));
    ExpectPartsMatchForward("L1Loss " + r, l1, logits, randn({12, 5}));
    SmoothL1Loss smooth(SmoothL1LossOptions().beta(0.5).reduction(reduction));
    ExpectPartsMatchForward("SmoothL1Loss " + r, smooth, logits, randn({12, 5}));
  }
}

TEST_F(LossTest, ForwardPartsDenominatorsAreWeightTotalsAndCounts) {
  const Tensor logits = randn({4, 3});
  const Tensor labels = Labels({0, -100, 2, 2}, {4});
  // The default: the fused kernel's mean times the count.
  LossParts parts = CrossEntropyLoss().forward_parts(logits, Labels({0, 1, 2, 2}, {4}));
  EXPECT_FLOAT_EQ(parts.denominator.item(), 4.0f);
  parts = CrossEntropyLoss().forward_parts(logits, labels);
  EXPECT_FLOAT_EQ(parts.denominator.item(), 3.0f);
  const Tensor weight = Floats({0.5f, 2.0f, 4.0f}, {3});
  parts = CrossEntropyLoss(CrossEntropyLossOptions().weight(weight)).forward_parts(logits, labels);
  EXPECT_FLOAT_EQ(parts.denominator.item(), 8.5f);
  // A chunk whose targets are all ignored: 0 / 0 in parts, no error.
  parts = CrossEntropyLoss(CrossEntropyLossOptions().weight(weight))
              .forward_parts(logits, Labels({-100, -100, -100, -100}, {4}));
  EXPECT_FLOAT_EQ(parts.numerator.item(), 0.0f);
  EXPECT_FLOAT_EQ(parts.denominator.item(), 0.0f);
  parts = MSELoss().forward_parts(logits, randn({4, 3}));
  EXPECT_FLOAT_EQ(parts.denominator.item(), 12.0f);
}

}  // namespace
}  // namespace tandem::nn
