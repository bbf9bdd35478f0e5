// Issue 35's launch counts, under the CUDA simulator: a GPT-2 layer (768 channels, 12 heads, a
// 3072-wide MLP; float32 forward and backward) launches at most kLayerLaunches kernels, and
// AdamW's step at most 4 (the targets: 20 a layer). What the layer takes now, 19: 12 GEMMs
// (the GELU's gradient in one of them, cuBLASLt's DGELU_BGRAD: Note [Fused MLP]), 3 attention
// kernels, 2 norms forward, 2 backward (each one launch for the three gradients, its last blocks
// adding the column sums). A layer's launches are the difference between the same step with two
// layers and with one, so the embedding, the head and the loss cancel. The per-layer kernels are
// printed by name, so a failure says which launches to look at. Counts, not timings: the same on
// every machine. Skips unless the simulator counts (a real GPU needs CUPTI).
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include "examples/gpt.h"
#include "nn/nn.h"
#include "tensor/cuda/cuda.h"
#include "tensor/tensor.h"
#include "tools/cuda/device_counters.h"

namespace tandem::examples {
namespace {

constexpr long long kLayerLaunches = 19;
constexpr long long kAutocastLayerLaunches = 19;

struct StepLaunches {
  long long forward_backward = 0;            // forward, loss and backward
  long long optimizer = 0;                   // AdamW's step and zero_grad
  std::map<std::string, long long> kernels;  // forward and backward's, by name
};

// The second of two training steps (the first allocates AdamW's state) of a GPT with GPT-2's
// layer shapes and `layers` layers, counted; forward and loss under bfloat16 autocast when asked.
StepLaunches CountStep(int layers, bool autocast = false) {
  manual_seed(5);
  const GptConfig config =
      GptConfig::Gpt2().n_layer(layers).vocab_size(512).block_size(16).dropout(0.0);
  auto model = std::make_shared<Gpt>(config);
  model->to(Device::Cuda(0));
  nn::AdamW optimizer(model->parameters(), nn::AdamWOptions(6e-4));
  StepLaunches counted;
  for (int step = 0; step < 2; ++step) {
    const TokenBatch batch = SyntheticTokenBatch(config, 1, 16, step, Device::Cuda(0));
    ResetDeviceCounters();
    Tensor loss;
    {
      AutocastGuard guard(DeviceType::kCUDA, kBFloat16, /*enabled=*/autocast);
      loss = model->loss(model->forward(batch.x), batch.y);
    }
    loss.backward();
    const DeviceCounters pass = ReadDeviceCounters();
    ResetDeviceCounters();
    optimizer.step();
    optimizer.zero_grad();
    const DeviceCounters update = ReadDeviceCounters();
    counted.forward_backward = pass.launches;
    counted.optimizer = update.launches;
    counted.kernels.clear();
    for (const KernelLaunches& k : pass.kernels) counted.kernels[k.name] = k.launches;
  }
  return counted;
}

// A layer's launches (two layers' step minus one layer's), printed by kernel.
long long LayerLaunches(const StepLaunches& one, const StepLaunches& two) {
  const long long per_layer = two.forward_backward - one.forward_backward;
  std::printf("forward and backward: %lld launches with 1 layer, %lld with 2; a layer: %lld\n",
              one.forward_backward, two.forward_backward, per_layer);
  for (const auto& [name, launches] : two.kernels) {
    const auto it = one.kernels.find(name);
    const long long layer = launches - (it == one.kernels.end() ? 0 : it->second);
    if (layer != 0) std::printf("  %3lld  %s\n", layer, name.c_str());
  }
  return per_layer;
}

bool Counted() {
  if (!cuda::IsAvailable()) return false;
  return ReadDeviceCounters().counted;
}

TEST(Gpt2LaunchesTest, ALayerLaunchesNoMoreThanCountedAndAdamWAtMost4) {
  if (!Counted()) GTEST_SKIP() << "launches are counted under the CUDA simulator only";
  const StepLaunches one = CountStep(1), two = CountStep(2);
  const long long per_layer = LayerLaunches(one, two);
  std::printf("AdamW step: %lld launches (%lld with 1 layer)\n", two.optimizer, one.optimizer);
  EXPECT_GT(per_layer, 0);
  EXPECT_LE(per_layer, kLayerLaunches)
      << "launches per GPT-2 layer (forward and backward); the kernels "
         "above are the layer's";
  EXPECT_LE(two.optimizer, 4) << "launches of AdamW's step over every parameter";
}

// Under bfloat16 autocast a layer launches what it launches in float32, and no cast: the norms
// read the 16-bit branch and write their output in bfloat16 for the GEMMs (Note [Autocast residual
// norm]; 8 casts a layer before), and Gpt::forward casts every layer's weights and biases in one
// multi-tensor launch a step (autocast::CastWeights), which cancels in the difference between
// two layers and one (8 cast launches a layer before). The bound is what it takes now, so that a
// cast more fails.
TEST(Gpt2LaunchesTest, UnderAutocastALayerLaunchesItsKernelsAndNoCast) {
  if (!Counted()) GTEST_SKIP() << "launches are counted under the CUDA simulator only";
  const long long per_layer = LayerLaunches(CountStep(1, true), CountStep(2, true));
  EXPECT_GT(per_layer, 0);
  EXPECT_LE(per_layer, kAutocastLayerLaunches) << "launches per GPT-2 layer under bf16 autocast";
}

}  // namespace
}  // namespace tandem::examples
