// Activation checkpointing inside DataParallel's replicas: each replica's checkpoint replays the
// dropout of its own device's generator in backward, and the gradients equal those of the plain
// replicas to the bit (and one device's without dropout).
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <vector>

#include "nn/checkpointed_stack_testing.h"
#include "nn/nn.h"
#include "parallel/data_parallel.h"
#include "tensor/testing.h"

namespace tandem::parallel {
namespace {

using ::tandem::nn::testing::CheckpointedStack;
using ::tandem::testing::MaxAbsDiff;

class ActivationCheckpointDataParallelTest : public ::testing::Test {
 protected:
  void SetUp() override { SetCpuDeviceCount(2); }
};

struct Result {
  Tensor loss;
  std::vector<Tensor> grads;
};

// One step of a model with the weights of seed 3 on x, through DataParallel over `devices` (or
// the model itself when there is one device).
Result Step(bool checkpointed, double dropout, const std::vector<Device>& devices,
            std::atomic<int>* hook_calls = nullptr) {
  manual_seed(3);
  auto model = std::make_shared<CheckpointedStack>(checkpointed, dropout);
  if (hook_calls != nullptr) {
    AddGradAccumulatedHook(model->parameters()[0], [hook_calls](const Tensor&) { ++*hook_calls; });
  }
  manual_seed(4);
  const Tensor x = randn({6, 5, CheckpointedStack::kWidth});
  Tensor y;
  if (devices.size() == 1) {
    y = model->forward(x);
  } else {
    DataParallel dp(model, devices);
    y = dp.forward(x);
  }
  Tensor loss = (y * y).mean();
  loss.backward();
  Result result{loss, {}};
  for (const Tensor& p : model->parameters()) result.grads.push_back(p.grad());
  return result;
}

void ExpectWithin(const Result& a, const Result& b, double tolerance) {
  EXPECT_LE(MaxAbsDiff(a.loss, b.loss), tolerance);
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i) {
    ASSERT_TRUE(a.grads[i].defined() && b.grads[i].defined()) << "parameter " << i;
    EXPECT_LE(MaxAbsDiff(a.grads[i], b.grads[i]), tolerance) << "parameter " << i;
  }
}

TEST_F(ActivationCheckpointDataParallelTest, EqualsPlainReplicasWithDropoutToTheBit) {
  const std::vector<Device> devices = CpuDevices(2);
  const Result plain = Step(false, 0.2, devices);
  const Result checkpointed = Step(true, 0.2, devices);
  ExpectWithin(plain, checkpointed, 0.0);
}

TEST_F(ActivationCheckpointDataParallelTest, EqualsOneDeviceWithoutDropout) {
  const Result one = Step(false, 0.0, {Device::Cpu(0)});
  ExpectWithin(one, Step(true, 0.0, CpuDevices(2)), 1e-5);
}

TEST_F(ActivationCheckpointDataParallelTest, HooksFireOncePerCheckpointCall) {
  // The first layer's first parameter is used in one checkpoint per replica: its original's
  // gradient-ready hook fires once per replica's recomputation (the plain step: once).
  std::atomic<int> plain_calls{0}, checkpointed_calls{0};
  Step(false, 0.2, CpuDevices(2), &plain_calls);
  Step(true, 0.2, CpuDevices(2), &checkpointed_calls);
  EXPECT_EQ(plain_calls.load(), 1);
  EXPECT_EQ(checkpointed_calls.load(), 2);
}

}  // namespace
}  // namespace tandem::parallel
