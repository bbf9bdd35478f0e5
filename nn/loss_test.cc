#include "nn/loss.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "nn/test_util.h"
#include "tensor/gradcheck.h"

namespace tandem::nn {
namespace {

using testing::ErrorOf;
using ::testing::HasSubstr;
using testing::MaxAbsDiff;

class LossTest : public ::testing::Test {
 protected:
  void SetUp() override { manual_seed(0); }
};

// -log softmax(row)[target], averaged, in double precision on the host.
double ReferenceCrossEntropy(const std::vector<float>& logits, const std::vector<int64_t>& targets,
                             int64_t classes) {
  double total = 0.0;
  for (size_t row = 0; row < targets.size(); ++row) {
    double top = -INFINITY;
    for (int64_t c = 0; c < classes; ++c) top = std::max<double>(top, logits[row * classes + c]);
    double sum = 0.0;
    for (int64_t c = 0; c < classes; ++c) sum += std::exp(logits[row * classes + c] - top);
    total += top + std::log(sum) - logits[row * classes + targets[row]];
  }
  return total / targets.size();
}

TEST_F(LossTest, CrossEntropyIsTheMeanNegativeLogLikelihood) {
  CrossEntropyLoss criterion;
  Tensor logits = randn({6, 4});
  Tensor targets = from_vector(std::vector<int64_t>{0, 3, 1, 1, 2, 0}, {6}, kInt64);
  EXPECT_NEAR(criterion.forward(logits, targets).item(),
              ReferenceCrossEntropy(logits.to_vector<float>(), targets.to_vector<int64_t>(), 4),
              1e-5);
  EXPECT_EQ(criterion.ToString(), "CrossEntropyLoss()");
}

TEST_F(LossTest, CrossEntropyIsStableForLargeLogits) {
  CrossEntropyLoss criterion;
  // exp(1000) overflows float32; a stable implementation subtracts the row maximum.
  Tensor logits = from_vector(std::vector<float>{1000, 0, -1000, 500, 1000, 1000}, {2, 3});
  Tensor targets = from_vector(std::vector<int64_t>{0, 2}, {2}, kInt64);
  const double loss = criterion.forward(logits, targets).item();
  EXPECT_TRUE(std::isfinite(loss));
  // Row 0: target is the maximum, loss ~ 0. Row 1: two tied maxima, loss log 2.
  EXPECT_NEAR(loss, (0.0 + std::log(2.0)) / 2.0, 1e-5);
}

TEST_F(LossTest, CrossEntropyGradients) {
  Tensor targets = from_vector(std::vector<int64_t>{2, 0, 1, 2}, {4}, kInt64);
  Tensor logits = randn({4, 3});
  logits.set_requires_grad(true);
  CrossEntropyLoss criterion;
  EXPECT_GRADIENTS_MATCH(
      [&](const std::vector<Tensor>& in) { return criterion.forward(in[0], targets); }, {logits});
}

TEST_F(LossTest, CrossEntropyRejectsBadTargets) {
  CrossEntropyLoss criterion;
  EXPECT_THAT(
      ErrorOf([&] {
        criterion.forward(randn({2, 3}), from_vector(std::vector<int64_t>{0, 3}, {2}, kInt64));
      }),
      HasSubstr("targets must be class indices in [0, C) = [0, 3) but range over [0, 3]"));
  EXPECT_THAT(ErrorOf([&] {
                criterion.forward(randn({2, 3}), zeros({2}));
              }),
              HasSubstr("targets must be int64"));
  EXPECT_THAT(ErrorOf([&] {
                criterion.forward(randn({2, 3}), zeros({3}, kInt64));
              }),
              HasSubstr("targets must be [2]"));
}

TEST_F(LossTest, MseIsTheMeanSquaredError) {
  MSELoss criterion;
  Tensor a = randn({3, 4}), b = randn({3, 4});
  const std::vector<float> x = a.to_vector<float>(), y = b.to_vector<float>();
  double expected = 0.0;
  for (size_t i = 0; i < x.size(); ++i) expected += (x[i] - y[i]) * (x[i] - y[i]);
  expected /= x.size();
  EXPECT_NEAR(criterion.forward(a, b).item(), expected, 1e-5);
  a.set_requires_grad(true);
  b.set_requires_grad(true);
  EXPECT_GRADIENTS_MATCH(
      [&](const std::vector<Tensor>& in) { return criterion.forward(in[0], in[1]); }, {a, b});
  EXPECT_THAT(ErrorOf([&] {
                criterion.forward(randn({3}), randn({3, 1}));
              }),
              HasSubstr("same shape"));
}

TEST_F(LossTest, CudaMatchesCpu) {
  TANDEM_SKIP_WITHOUT_CUDA();
  const Device gpu = Device::Cuda(0);
  Tensor logits = randn({64, 10});
  std::vector<int64_t> labels(64);
  for (int64_t i = 0; i < 64; ++i) labels[i] = (i * 7) % 10;
  Tensor targets = from_vector(labels, {64}, kInt64);
  CrossEntropyLoss ce;
  Tensor cpu_logits = logits.detach().clone().set_requires_grad(true);
  Tensor gpu_logits = logits.to(gpu).set_requires_grad(true);
  Tensor cpu_loss = ce.forward(cpu_logits, targets);
  Tensor gpu_loss = ce.forward(gpu_logits, targets.to(gpu));
  EXPECT_NEAR(cpu_loss.item(), gpu_loss.item(), 1e-5);
  cpu_loss.backward();
  gpu_loss.backward();
  EXPECT_LT(MaxAbsDiff(cpu_logits.grad(), gpu_logits.grad()), 1e-6);

  MSELoss mse;
  Tensor a = randn({32, 8}), b = randn({32, 8});
  EXPECT_NEAR(mse.forward(a, b).item(), mse.forward(a.to(gpu), b.to(gpu)).item(), 1e-5);
}

}  // namespace
}  // namespace tandem::nn
