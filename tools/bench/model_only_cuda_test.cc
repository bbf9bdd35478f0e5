// The CUDA simulator's model-only mode (TANDEM_CUDASIM_MODEL_ONLY, tools/cudasim/counters.h), on
// what train_step models: a GPT training step (GEMMs through cuBLAS and cuBLASLt, norms,
// attention, cross-entropy, AdamW) under bfloat16 autocast counts the same launches, blocks,
// declared FLOPs and bytes, and host syncs with the mode on as off, and with it on the step
// runs nothing: AdamW leaves the weights as they were.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "examples/gpt.h"
#include "nn/nn.h"
#include "tensor/tensor.h"
#include "tools/cuda/device_counters.h"
#include "tools/cudasim/counters.h"

namespace tandem {
namespace {

struct CountedStep {
  DeviceCounters counters;
  bool weights_changed = false;
};

// The second of two steps (the first allocates AdamW's state and the autocast casts' buffers)
// of a one-layer GPT with GPT-2's layer shapes, counted from forward to the loss read back.
CountedStep Step(bool model_only) {
  cudasim::SetModelOnly(model_only);
  manual_seed(5);
  const examples::GptConfig config =
      examples::GptConfig::Gpt2().n_layer(1).vocab_size(512).block_size(16).dropout(0.0);
  auto model = std::make_shared<examples::Gpt>(config);
  model->to(Device::Cuda(0));
  nn::AdamW optimizer(model->parameters(), nn::AdamWOptions(6e-4).weight_decay(0.1));
  CountedStep counted;
  for (int step = 0; step < 2; ++step) {
    const examples::TokenBatch batch =
        examples::SyntheticTokenBatch(config, 2, 16, step, Device::Cuda(0));
    const std::vector<float> before =
        model->parameters().front().to(Device::Cpu(0)).to_vector<float>();
    ResetDeviceCounters();
    Tensor loss;
    {
      AutocastGuard guard(DeviceType::kCUDA, kBFloat16);
      loss = model->loss(model->forward(batch.x), batch.y);
    }
    loss.backward();
    optimizer.step();
    optimizer.zero_grad();
    loss.item();  // a number only without the mode; the read-back is counted either way
    counted.counters = ReadDeviceCounters();
    counted.weights_changed =
        model->parameters().front().to(Device::Cpu(0)).to_vector<float>() != before;
  }
  cudasim::SetModelOnly(false);
  return counted;
}

TEST(ModelOnlyCudaTest, AGptStepCountsTheSameAndRunsNothing) {
  const CountedStep full = Step(false), model = Step(true);
  const DeviceCounters &f = full.counters, &m = model.counters;
  ASSERT_TRUE(f.counted) << f.not_counted;
  EXPECT_GT(f.launches, 20);
  EXPECT_EQ(m.launches, f.launches);
  EXPECT_EQ(m.graph_launches, f.graph_launches);
  EXPECT_EQ(m.graph_kernels, f.graph_kernels);
  EXPECT_EQ(m.host_syncs, f.host_syncs);
  EXPECT_EQ(m.bytes_host_to_device, f.bytes_host_to_device);
  EXPECT_EQ(m.bytes_device_to_host, f.bytes_device_to_host);
  ASSERT_EQ(m.kernels.size(), f.kernels.size());
  bool gemm = false, norm = false;
  for (size_t i = 0; i < f.kernels.size(); ++i) {
    const KernelLaunches &fk = f.kernels[i], &mk = m.kernels[i];
    SCOPED_TRACE(fk.name);
    gemm = gemm || fk.name.find("cublas") != std::string::npos;
    norm = norm || fk.name.find("norm_kernels") != std::string::npos;
    EXPECT_EQ(mk.name, fk.name);
    EXPECT_EQ(mk.launches, fk.launches);
    EXPECT_EQ(mk.min_blocks, fk.min_blocks);
    EXPECT_EQ(mk.max_blocks, fk.max_blocks);
    EXPECT_EQ(mk.threads_per_block, fk.threads_per_block);
    EXPECT_EQ(mk.work_counted, fk.work_counted);
    EXPECT_EQ(mk.flops, fk.flops);
    EXPECT_EQ(mk.bytes, fk.bytes);
    EXPECT_EQ(mk.math, fk.math);
  }
  EXPECT_TRUE(gemm) << "the step ran no cuBLAS GEMM: this test no longer covers them";
  EXPECT_TRUE(norm) << "the step ran no norm kernel: this test no longer covers them";
  // AdamW's kernel ran without the mode only.
  EXPECT_TRUE(full.weights_changed);
  EXPECT_FALSE(model.weights_changed);
}

}  // namespace
}  // namespace tandem
