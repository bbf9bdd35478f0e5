// Capturable Adam and AdamW (AdamOptions::capturable, Note [Capturable Adam]) on cuda:0: the
// step count and learning rate on the device give the same bits as the host-side step, eagerly
// and replayed in a CUDA Graph, with an LR schedule changing the rate between replays; misuse
// fails clearly. Skips without a CUDA device (runs under cudasim).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "nn/adam.h"
#include "nn/layers.h"
#include "nn/lr_scheduler.h"
#include "nn/sequential.h"
#include "nn/test_util.h"
#include "tensor/cuda/cuda_graph.h"

namespace tandem::nn {
namespace {

using testing::ErrorOf;
using ::testing::HasSubstr;
using testing::MaxAbsDiff;

const Device kGpu = Device::Cuda(0);

std::shared_ptr<Module> Mlp() {
  manual_seed(3);
  return std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{
      std::make_shared<Linear>(5, 12), std::make_shared<ReLU>(), std::make_shared<Linear>(12, 2)});
}

Tensor Batch(int step, const Shape& shape) {
  manual_seed(500 + step);
  return randn(shape);
}

Tensor Step(Module& model, Optimizer& optimizer, const Tensor& x, const Tensor& y) {
  optimizer.zero_grad();
  const Tensor loss = mse_loss(model.forward_tensors({x})[0], y);
  loss.backward();
  optimizer.step();
  return loss.detach();
}

void ExpectSameParameters(Module& a, Module& b) {
  const std::vector<Tensor> pa = a.parameters(), pb = b.parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(MaxAbsDiff(pa[i].detach().to(Device::Cpu()), pb[i].detach().to(Device::Cpu())), 0.0)
        << "parameter " << i;
  }
}

TEST(CapturableAdamTest, EagerCapturableStepsEqualHostSteps) {
  TANDEM_SKIP_WITHOUT_CUDA();
  for (const bool amsgrad : {false, true}) {
    SCOPED_TRACE(amsgrad);
    std::shared_ptr<Module> host = Mlp()->clone(kGpu), device = Mlp()->clone(kGpu);
    AdamW host_opt(host->parameters(), AdamWOptions(0.01).amsgrad(amsgrad));
    AdamW device_opt(device->parameters(), AdamWOptions(0.01).amsgrad(amsgrad).capturable(true));
    StepLR host_lr(host_opt, 2, 0.5), device_lr(device_opt, 2, 0.5);
    for (int step = 0; step < 5; ++step) {
      const Tensor x = Batch(step, {4, 5}).to(kGpu), y = Batch(100 + step, {4, 2}).to(kGpu);
      Step(*host, host_opt, x, y);
      Step(*device, device_opt, x, y);
      host_lr.step();
      device_lr.step();
    }
    ExpectSameParameters(*host, *device);
    EXPECT_EQ(device_opt.state_dict().at("state.0.step").item(), 5.0);
  }
}

TEST(CapturableAdamTest, ReplayedStepsWithAScheduleEqualEagerSteps) {
  TANDEM_SKIP_WITHOUT_CUDA();
  std::shared_ptr<Module> eager = Mlp()->clone(kGpu), graphed = Mlp()->clone(kGpu);
  AdamW eager_opt(eager->parameters(), AdamWOptions(0.02));
  AdamW graphed_opt(graphed->parameters(), AdamWOptions(0.02).capturable(true));
  CosineAnnealingLR eager_lr(eager_opt, 6), graphed_lr(graphed_opt, 6);
  const Shape x_shape{4, 5}, y_shape{4, 2};
  Tensor static_x = zeros(x_shape, TensorOptions().device(kGpu));
  Tensor static_y = zeros(y_shape, TensorOptions().device(kGpu));
  const tandem::Stream side = SideStream(kGpu);
  side.Wait(CurrentStream(kGpu));
  cuda::CUDAGraph graph;
  Tensor static_loss;
  constexpr int kWarmup = 2, kSteps = 7;
  {
    StreamGuard guard(side);
    for (int step = 0; step < kWarmup; ++step) {
      static_x.copy_(Batch(step, x_shape));
      static_y.copy_(Batch(100 + step, y_shape));
      Step(*graphed, graphed_opt, static_x, static_y);
      graphed_lr.step();
    }
    cuda::CUDAGraphCapture capture(graph, kGpu);
    static_loss = Step(*graphed, graphed_opt, static_x, static_y);
  }
  CurrentStream(kGpu).Wait(side);
  for (int step = 0; step < kSteps; ++step) {
    SCOPED_TRACE(step);
    const Tensor x = Batch(step, x_shape), y = Batch(100 + step, y_shape);
    const Tensor want = Step(*eager, eager_opt, x.to(kGpu), y.to(kGpu));
    eager_lr.step();
    if (step < kWarmup) continue;
    static_x.copy_(x);
    static_y.copy_(y);
    graph.replay();
    graphed_lr.step();  // writes the next rate into the device state
    EXPECT_EQ(MaxAbsDiff(static_loss.to(Device::Cpu()), want.to(Device::Cpu())), 0.0);
    ExpectSameParameters(*eager, *graphed);
  }
  EXPECT_EQ(graphed_opt.state_dict().at("state.0.step").item(), kSteps);
}

TEST(CapturableAdamTest, MisuseFailsClearly) {
  std::shared_ptr<Module> cpu = Mlp();
  Adam on_cpu(cpu->parameters(), AdamOptions(0.1).capturable(true));
  EXPECT_THAT(ErrorOf([&] {
                Step(*cpu, on_cpu, randn({2, 5}), randn({2, 2}));
              }),
              HasSubstr("on one CUDA device"));
  TANDEM_SKIP_WITHOUT_CUDA();
  std::shared_ptr<Module> gpu = Mlp()->clone(kGpu);
  Adam fresh(gpu->parameters(), AdamOptions(0.1).capturable(true));
  const Tensor x = randn({2, 5}).to(kGpu), y = randn({2, 2}).to(kGpu);
  StreamGuard guard(SideStream(kGpu));
  cuda::CUDAGraph graph;
  EXPECT_THAT(ErrorOf([&] {
                cuda::CUDAGraphCapture capture(graph, kGpu);
                Step(*gpu, fresh, x, y);
              }),
              HasSubstr("run a warm-up step before capturing"));
}

}  // namespace
}  // namespace tandem::nn
