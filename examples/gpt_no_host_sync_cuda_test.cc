// A GPT training step on cuda:0 makes the host wait for the GPU nowhere between the start of
// forward and the end of the optimizer step (cuda::SetSyncDebugError turns any wait into an
// error), with the gradients clipped on the device, and its losses equal the CPU's. Skips
// without a CUDA device.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "examples/gpt.h"
#include "nn/nn.h"
#include "tensor/cuda/cuda.h"
#include "tensor/tensor.h"

namespace tandem::examples {
namespace {

// Losses of `steps` AdamW steps with clipping on `device`; on a CUDA device, each step from
// forward to zero_grad runs with host waits forbidden.
std::vector<double> Train(Device device, int steps) {
  manual_seed(7);
  auto model = std::make_shared<Gpt>(GptConfig::Small().n_layer(2).dropout(0.0));
  model->to(device);
  nn::AdamW optimizer(model->parameters(), nn::AdamWOptions(1e-2));
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    const TokenBatch batch = SyntheticTokenBatch(model->config(), 2, 16, step, device);
    Tensor loss;
    {
      cuda::SetSyncDebugError(device.is_cuda());
      struct Restore {
        ~Restore() { cuda::SetSyncDebugError(false); }
      } restore;
      loss = model->loss(model->forward(batch.x), batch.y);
      loss.backward();
      std::vector<Tensor> grads;
      for (const Tensor& p : model->parameters()) grads.push_back(p.grad());
      nn::clip_grads_with_norm_(model->parameters(), 0.5, nn::get_total_norm(grads));
      optimizer.step();
      optimizer.zero_grad();
    }
    losses.push_back(loss.item());  // after the step: the one read, when the caller asks
  }
  return losses;
}

TEST(GptNoHostSyncTest, TrainingStepOnCudaWaitsForNothingAndMatchesTheCpu) {
  if (!cuda::IsAvailable()) GTEST_SKIP() << cuda::UnavailableReason();
  const std::vector<double> gpu = Train(Device::Cuda(0), 3);
  const std::vector<double> cpu = Train(Device::Cpu(), 3);
  ASSERT_EQ(gpu.size(), cpu.size());
  for (size_t i = 0; i < cpu.size(); ++i) EXPECT_NEAR(gpu[i], cpu[i], 1e-4) << "step " << i;
}

}  // namespace
}  // namespace tandem::examples
