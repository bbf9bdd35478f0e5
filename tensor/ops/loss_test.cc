// Tests of softmax and log_softmax (tensor/ops/softmax.cc) and the losses (tensor/ops/loss.cc).
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

// ---- Neural-network functions --------------------------------------------------------------

std::vector<float> HostSoftmax(const std::vector<float>& x, const Shape& shape, int64_t dim,
                               bool log) {
  const int64_t n = shape[dim];
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= shape[d];
  for (int64_t d = dim + 1; d < static_cast<int64_t>(shape.size()); ++d) inner *= shape[d];
  std::vector<float> out(x.size());
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      const auto at = [&](int64_t j) { return (o * n + j) * inner + i; };
      double m = -INFINITY;
      for (int64_t j = 0; j < n; ++j) m = std::max(m, static_cast<double>(x[at(j)]));
      double total = 0;
      for (int64_t j = 0; j < n; ++j) total += std::exp(x[at(j)] - m);
      for (int64_t j = 0; j < n; ++j) {
        const double z = x[at(j)] - m;
        out[at(j)] = static_cast<float>(log ? z - std::log(total) : std::exp(z) / total);
      }
    }
  }
  return out;
}

TEST_F(OpsTest, SoftmaxAndLogSoftmaxMatchTheHostAndStayFinite) {
  const Shape shape = {3, 4, 5};
  const Tensor x = mul(Randn(shape, 17), 3.0);
  for (int64_t dim : {0, 1, 2, -1}) {
    SCOPED_TRACE("dim " + std::to_string(dim));
    const int64_t d = dim < 0 ? dim + 3 : dim;
    ExpectValues(softmax(x, dim), shape, HostSoftmax(Values(x), shape, d, false), 1e-5);
    ExpectValues(log_softmax(x, dim), shape, HostSoftmax(Values(x), shape, d, true), 1e-5);
  }
  const Tensor huge = from_vector(std::vector<float>{1000, -1000, 0, 999}, {1, 4});
  ExpectValues(softmax(huge, 1), {1, 4}, HostSoftmax(Values(huge), {1, 4}, 1, false), 1e-6);
  ExpectValues(log_softmax(huge, 1), {1, 4}, HostSoftmax(Values(huge), {1, 4}, 1, true), 1e-6);
  ExpectValues(softmax(zeros({2, 0}), 1), {2, 0}, {});
  ExpectValues(softmax(scalar_tensor(5.0), 0), {}, {1.0f});
}

// ---- Losses --------------------------------------------------------------------------------

double HostCrossEntropy(const std::vector<float>& logits, const std::vector<int64_t>& targets,
                        int64_t classes) {
  double total = 0;
  for (size_t r = 0; r < targets.size(); ++r) {
    const float* row = logits.data() + r * classes;
    const double m = *std::max_element(row, row + classes);
    double s = 0;
    for (int64_t c = 0; c < classes; ++c) s += std::exp(row[c] - m);
    total += -(row[targets[r]] - m - std::log(s));
  }
  return total / targets.size();
}

TEST_F(OpsTest, CrossEntropyMatchesAHandComputedValue) {
  // Row 0: logits (0, ln 3) -> p = (1/4, 3/4), target 1: -ln(3/4).
  // Row 1: logits (2, 2)    -> p = (1/2, 1/2), target 0: ln 2.
  const Tensor logits = from_vector(std::vector<float>{0.0f, std::log(3.0f), 2.0f, 2.0f}, {2, 2});
  const Tensor targets = Labels(std::vector<int64_t>{1, 0}, {2});
  const double expected = (-std::log(0.75) + std::log(2.0)) / 2;  // 0.490414...
  EXPECT_NEAR(cross_entropy(logits, targets).item(), expected, 1e-6);
  EXPECT_NEAR(nll_loss(log_softmax(logits, 1), targets).item(), expected, 1e-6);
  EXPECT_EQ(cross_entropy(logits, targets).dim(), 0);
}

TEST_F(OpsTest, CrossEntropyAndNllLossMatchTheHostOnRandomInputs) {
  const Tensor logits = mul(Randn({6, 5}, 41), 2.0);
  const std::vector<int64_t> labels = {0, 4, 2, 2, 1, 3};
  const Tensor targets = Labels(labels, {6});
  const double expected = HostCrossEntropy(Values(logits), labels, 5);
  EXPECT_NEAR(cross_entropy(logits, targets).item(), expected, 1e-5);
  // nll_loss just picks -log_probs[r, target[r]] and averages.
  const std::vector<float> lp = Values(logits);
  double picked = 0;
  for (size_t r = 0; r < labels.size(); ++r) picked -= lp[r * 5 + labels[r]];
  EXPECT_NEAR(nll_loss(logits, targets).item(), picked / 6, 1e-5);
  // Non-contiguous logits.
  const Tensor lt_logits = logits.t().contiguous().t();
  EXPECT_NEAR(cross_entropy(lt_logits, targets).item(), expected, 1e-5);
}

// cross_entropy runs fused kernels (Note [Fused cross-entropy], softmax_kernels.h) that keep
// the composed op's values: the loss is nll_loss(log_softmax(x))'s to the bit in every floating
// dtype, and the gradient (softmax - onehot) / rows is the composed one's within rounding.
TEST_F(OpsTest, FusedCrossEntropyIsNllLossOfLogSoftmax) {
  const std::vector<int64_t> labels = {0, 12, 5, 5, 3, 9, 1};
  const Tensor targets = Labels(labels, {7});
  for (DType dtype : {kFloat32, kFloat64, kBFloat16, kFloat16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const Tensor logits = mul(Randn({7, 13}, 5), 3.0).to(dtype);
    Tensor fused_x = Param(logits), composed_x = Param(logits);
    Tensor fused = cross_entropy(fused_x, targets);
    Tensor composed = nll_loss(log_softmax(composed_x, 1), targets);
    EXPECT_EQ(fused.dtype(), dtype);
    EXPECT_EQ(fused.to(kFloat64).item(), composed.to(kFloat64).item());
    fused.backward();
    composed.backward();
    const double tolerance = dtype == kFloat64 ? 1e-15 : dtype == kFloat32 ? 1e-7 : 1e-2;
    const std::vector<double> a = fused_x.grad().to(kFloat64).to_vector<double>();
    const std::vector<double> b = composed_x.grad().to(kFloat64).to_vector<double>();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], tolerance) << "element " << i;
  }
}

TEST_F(OpsTest, CrossEntropyStaysFiniteForHugeLogits) {
  const Tensor logits = from_vector(std::vector<float>{1000, -1000, 0, -1000, 1000, 0}, {2, 3});
  const Tensor targets = Labels(std::vector<int64_t>{0, 0}, {2});
  Tensor x = Param(logits);
  Tensor loss = cross_entropy(x, targets);
  ASSERT_TRUE(std::isfinite(loss.item()));
  // Row 0 is right with certainty (loss 0); row 1 is wrong by 2000 (loss 2000).
  EXPECT_NEAR(loss.item(), 1000.0, 1e-3);
  loss.backward();
  for (float g : Values(x.grad())) EXPECT_TRUE(std::isfinite(g));
  ExpectValues(x.grad(), {2, 3}, {0, 0, 0, -0.5f, 0.5f, 0}, 1e-6);
}

TEST_F(OpsTest, LossErrorsSayWhatToFix) {
  const Tensor logits = zeros({3, 4});
  EXPECT_THAT(ErrorOf([&] {
                cross_entropy(logits, Labels(std::vector<int64_t>{0, 4, 1}, {3}));
              }),
              HasSubstr("cross_entropy: targets must be class indices in [0, C) = [0, 4) but "
                        "range over [0, 4]"));
  EXPECT_THAT(ErrorOf([&] {
                nll_loss(logits, Labels(std::vector<int64_t>{0, -1, 1}, {3}));
              }),
              HasSubstr("nll_loss: targets must be class indices in [0, C) = [0, 4) but range "
                        "over [-1, 1]"));
  EXPECT_THAT(ErrorOf([&] { cross_entropy(logits, zeros({3})); }),
              HasSubstr("cross_entropy: targets must be int64 class indices but are float32; "
                        "convert them with .to(kInt64)"));
  EXPECT_THAT(ErrorOf([&] { cross_entropy(logits, zeros({2}, kInt64)); }),
              HasSubstr("cross_entropy: logits is [3, 4] so targets must be [3] but are [2]"));
  EXPECT_THAT(ErrorOf([&] {
                cross_entropy(zeros({3, 4, 2}), zeros({3}, kInt64));
              }),
              HasSubstr("cross_entropy: logits must be 2-D [N, C] but is [3, 4, 2]"));
  EXPECT_THAT(ErrorOf([&] {
                cross_entropy(logits, zeros({3}, TensorOptions(kInt64).device(Device::Cpu(1))));
              }),
              HasSubstr("cross_entropy: logits is on cpu:0 and targets on cpu:1"));
  EXPECT_THAT(ErrorOf([&] {
                mse_loss(zeros({4, 1}), zeros({4}));
              }),
              HasSubstr("mse_loss: input is [4, 1] and target is [4]; they must have the same "
                        "shape"));
}

TEST_F(OpsTest, MseLossMatchesTheHost) {
  const Tensor a = Randn({3, 4}, 43), b = Randn({3, 4}, 44);
  const std::vector<float> av = Values(a), bv = Values(b);
  double expected = 0;
  for (size_t i = 0; i < av.size(); ++i) expected += (av[i] - bv[i]) * (av[i] - bv[i]);
  EXPECT_NEAR(mse_loss(a, b).item(), expected / 12, 1e-5);
  EXPECT_EQ(mse_loss(a, b).dim(), 0);
}

TEST_F(OpsTest, IntegerTargetsAndConstantsGetNoGradient) {
  Tensor logits = Param(Randn({3, 4}, 121));
  const Tensor targets = Labels(std::vector<int64_t>{0, 3, 1}, {3});
  Tensor loss = cross_entropy(logits, targets);
  loss.backward();
  EXPECT_EQ(logits.grad().shape(), (Shape{3, 4}));
  EXPECT_FALSE(targets.requires_grad());
}

TEST_F(OpsTest, GradientsOfSoftmaxAndLogSoftmax) {
  const Tensor x = Param64(Randn({3, 5}, 261));
  const Tensor x3 = Param64(Randn({2, 3, 4}, 262));
  for (int64_t dim : {0, 1, -1}) {
    SCOPED_TRACE("dim " + std::to_string(dim));
    EXPECT_GRADIENTS_MATCH([&](const Inputs& in) { return softmax(in[0], dim); }, {x});
    EXPECT_GRADIENTS_MATCH([&](const Inputs& in) { return log_softmax(in[0], dim); }, {x});
    EXPECT_GRADIENTS_MATCH([&](const Inputs& in) { return softmax(in[0], dim); }, {x3});
    EXPECT_GRADIENTS_MATCH([&](const Inputs& in) { return log_softmax(in[0], dim); }, {x3});
  }
}

TEST_F(OpsTest, GradientsOfLosses) {
  const Tensor scores = Param64(Randn({4, 5}, 301));
  const Tensor targets = Labels(std::vector<int64_t>{1, 0, 4, 1}, {4});
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return nll_loss(in[0], in[1]); }, {scores, targets},
                         kLinearEps);
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return cross_entropy(in[0], in[1]); },
                         {scores, targets});
  const Tensor a = Param64(Randn({3, 4}, 302)), b = Param64(Randn({3, 4}, 303));
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return mse_loss(in[0], in[1]); }, {a, b});
}

}  // namespace
}  // namespace ops_testing
}  // namespace tandem
