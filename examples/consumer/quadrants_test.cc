#include "quadrants.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "nn/nn.h"
#include "parallel/data_parallel.h"
#include "tensor/tensor.h"

namespace consumer {
namespace {

using tandem::Device;
using tandem::Tensor;

class QuadrantsTest : public ::testing::Test {
 protected:
  void SetUp() override { tandem::SetCpuDeviceCount(2); }
};

double MaxAbsDifference(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.to_vector<float>(), y = b.to_vector<float>();
  EXPECT_EQ(x.size(), y.size());
  double max = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
    max = std::max(max, static_cast<double>(std::abs(x[i] - y[i])));
  }
  return max;
}

TEST_F(QuadrantsTest, DataParallelOnTwoCpuDevicesLearns) {
  const TrainResult result = TrainQuadrants({Device::Cpu(0), Device::Cpu(1)}, 20, 7);
  EXPECT_LT(result.last_epoch_loss, result.first_loss / 4);
  EXPECT_GT(result.test_accuracy, 0.95);
  EXPECT_EQ(result.last_chunk_sizes, (std::vector<int64_t>{64, 64}));
}

// One step under DataParallel gives the loss and gradients of the module alone.
TEST_F(QuadrantsTest, DataParallelMatchesOneDevice) {
  tandem::manual_seed(3);
  auto model = MakeMlp();
  const Points batch = MakeQuadrants(37, 3);  // does not split evenly: 19 + 18
  tandem::nn::CrossEntropyLoss criterion;

  Tensor loss = criterion.forward(model->forward(batch.xy), batch.labels);
  loss.backward();
  std::vector<Tensor> expected_grads;
  for (const Tensor& p : model->parameters()) expected_grads.push_back(p.grad().clone());
  model->zero_grad();

  tandem::parallel::DataParallel dp(model, {Device::Cpu(0), Device::Cpu(1)});
  Tensor dp_loss = dp.forward_loss(criterion, batch.xy, batch.labels);
  dp_loss.backward();
  EXPECT_EQ(dp.last_chunk_sizes(), (std::vector<int64_t>{19, 18}));
  EXPECT_NEAR(dp_loss.item(), loss.item(), 1e-5);
  const std::vector<Tensor> params = model->parameters();
  ASSERT_EQ(params.size(), expected_grads.size());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_LT(MaxAbsDifference(params[i].grad(), expected_grads[i]), 1e-5) << "parameter " << i;
  }
}

}  // namespace
}  // namespace consumer
