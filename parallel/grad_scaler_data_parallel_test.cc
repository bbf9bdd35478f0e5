// float16 autocast with a GradScaler through DataParallel: a training step over cpu:0 and
// cpu:1 (each replica's forward under the caller's autocast, its scaled float16 backward, the
// reduce-add into the float32 parameters) matches the same step on one device, and a step
// whose gradients hold an inf from one replica alone is skipped for the whole model.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "nn/nn.h"
#include "parallel/data_parallel.h"
#include "tensor/testing.h"

namespace tandem::parallel {
namespace {

using ::tandem::testing::MaxAbsDiff;

constexpr DeviceType kCPU = DeviceType::kCPU;
constexpr int64_t kBatch = 12;  // two chunks of 6: rows 6..11 go to cpu:1

class GradScalerDataParallelTest : public ::testing::Test {
 protected:
  void SetUp() override { SetCpuDeviceCount(2); }
};

std::shared_ptr<nn::Sequential> Mlp() {
  manual_seed(3);
  return std::make_shared<nn::Sequential>(nn::Linear(10, 16), nn::ReLU(), nn::Linear(16, 4));
}

Tensor Labels() {
  std::vector<int64_t> labels(kBatch);
  for (int64_t i = 0; i < kBatch; ++i) labels[i] = (i * 5) % 4;
  return from_vector(labels, {kBatch});
}

std::vector<Tensor> Snapshot(const nn::Module& module) {
  std::vector<Tensor> values;
  for (const Tensor& p : module.parameters()) values.push_back(p.detach().clone());
  return values;
}

// One training step as the trainer takes it: forward and loss under float16 autocast, then the
// scaled backward, the scaler's step (skipped on inf/NaN) and update. Returns the loss.
double Step(nn::Module& forward, nn::Optimizer& optimizer, nn::GradScaler& scaler, const Tensor& x,
            const Tensor& y) {
  Tensor loss;
  {
    AutocastGuard autocast(kCPU, kFloat16);
    const Tensor logits = forward.forward_tensors({x})[0];
    EXPECT_EQ(logits.dtype(), kFloat16);
    loss = cross_entropy(logits, y);
  }
  EXPECT_EQ(loss.dtype(), kFloat32);
  optimizer.zero_grad();
  scaler.scale(loss).backward();
  scaler.step(optimizer);
  scaler.update();
  return loss.item();
}

// max |a - b| within float16's rtol (1e-3, PyTorch's) of the largest |b|, times `slack`.
void ExpectFp16Close(const Tensor& a, const Tensor& b, double slack, const char* what) {
  const double largest = MaxAbsDiff(b, zeros_like(b));
  EXPECT_LE(MaxAbsDiff(a, b), slack * 1e-3 * largest + 1e-7)
      << what << ": largest |b| = " << largest;
}

TEST_F(GradScalerDataParallelTest, Fp16StepsMatchOneDeviceAndAnInfFromOneReplicaSkipsTheStep) {
  auto model = Mlp();
  auto reference = Mlp();
  DataParallel dp(model, CpuDevices(2));
  nn::SGD optimizer(model->parameters(), nn::SGDOptions(0.1).momentum(0.9));
  nn::SGD reference_optimizer(reference->parameters(), nn::SGDOptions(0.1).momentum(0.9));
  // Growth after two clean steps, so that three steps change the scale.
  const auto options = nn::GradScalerOptions().init_scale(128).growth_interval(2);
  nn::GradScaler scaler(options), reference_scaler(options);
  const Tensor y = Labels();

  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE(step);
    manual_seed(10 + step);
    const Tensor x = randn({kBatch, 10});
    const std::vector<Tensor> before = Snapshot(*model);
    const std::vector<Tensor> reference_before = Snapshot(*reference);
    const double loss = Step(dp, optimizer, scaler, x, y);
    const double reference_loss = Step(*reference, reference_optimizer, reference_scaler, x, y);
    EXPECT_NEAR(loss, reference_loss, 1e-3 * std::abs(reference_loss));
    EXPECT_EQ(scaler.get_scale(), reference_scaler.get_scale());
    EXPECT_EQ(scaler.get_growth_tracker(), reference_scaler.get_growth_tracker());
    const std::vector<Tensor> after = Snapshot(*model);
    const std::vector<Tensor> reference_after = Snapshot(*reference);
    for (size_t i = 0; i < after.size(); ++i) {
      SCOPED_TRACE(i);
      EXPECT_EQ(model->parameters()[i].dtype(), kFloat32);
      // The updates, not the parameters: a wrong gradient must not hide behind the weights.
      const Tensor update = after[i] - before[i];
      const Tensor reference_update = reference_after[i] - reference_before[i];
      EXPECT_GT(MaxAbsDiff(update, zeros_like(update)), 0.0) << "no step was taken";
      // Two float16 GEMMs over 6 rows summed in float32 against one over 12: a few roundings.
      ExpectFp16Close(update, reference_update, 4.0, "parameter update");
    }
  }
  EXPECT_EQ(scaler.get_scale(), 256.0);  // grown once, after the second clean step

  // An input row beyond float16's range in cpu:1's chunk: only that replica's gradients hold
  // inf/NaN, and after the reduce-add so do the model's; the step is skipped, the scale halved.
  manual_seed(20);
  Tensor x = randn({kBatch, 10});
  x.narrow(0, 9, 1).fill_(1e30);
  const std::vector<Tensor> before = Snapshot(*model);
  const std::vector<Tensor> momentum_before = {optimizer.momentum_buffer(0).clone()};
  const Tensor clean = randn({kBatch, 10});
  Tensor out_before;
  {
    NoGradGuard no_grad;
    out_before = dp.forward(clean);
  }
  Step(dp, optimizer, scaler, x, y);
  Step(*reference, reference_optimizer, reference_scaler, x, y);
  EXPECT_EQ(scaler.get_scale(), 128.0);
  EXPECT_EQ(reference_scaler.get_scale(), 128.0);
  EXPECT_EQ(scaler.get_growth_tracker(), 0);
  bool saw_non_finite = false;
  for (const Tensor& p : model->parameters()) {
    saw_non_finite = saw_non_finite || !std::isfinite(sum(p.grad()).item());
  }
  EXPECT_TRUE(saw_non_finite) << "the injected inf did not reach the gradients";
  const std::vector<Tensor> after = Snapshot(*model);
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(MaxAbsDiff(after[i], before[i]), 0.0) << "parameter " << i << " changed";
  }
  EXPECT_EQ(MaxAbsDiff(optimizer.momentum_buffer(0), momentum_before[0]), 0.0);
  // Both replicas, made afresh from the model at the next forward, compute as before the
  // skipped step: rows of cpu:0's chunk and of cpu:1's alike.
  {
    NoGradGuard no_grad;
    const Tensor out_after = dp.forward(clean);
    EXPECT_EQ(MaxAbsDiff(out_after.narrow(0, 0, 6), out_before.narrow(0, 0, 6)), 0.0);
    EXPECT_EQ(MaxAbsDiff(out_after.narrow(0, 6, 6), out_before.narrow(0, 6, 6)), 0.0);
  }
  // The next clean step trains again, on both, alike.
  manual_seed(21);
  const Tensor next = randn({kBatch, 10});
  const double loss = Step(dp, optimizer, scaler, next, y);
  const double reference_loss = Step(*reference, reference_optimizer, reference_scaler, next, y);
  EXPECT_NEAR(loss, reference_loss, 1e-3 * std::abs(reference_loss));
  EXPECT_GT(MaxAbsDiff(model->parameters()[0], before[0]), 0.0);
}

}  // namespace
}  // namespace tandem::parallel
