// Autocast reaches DataParallel's replicas: each replica's forward, on its device's worker,
// runs under the caller's AutocastGuard (PyTorch's thread-local autocast does not reach its
// replica threads), and the result matches the single-device autocast forward.
#include <gtest/gtest.h>

#include <algorithm>
#include <mutex>
#include <tuple>
#include <vector>

#include "nn/nn.h"
#include "parallel/data_parallel.h"
#include "tensor/runtime/threads.h"
#include "tensor/testing.h"

namespace tandem::parallel {
namespace {

using ::tandem::testing::MaxAbsDiff;

constexpr DeviceType kCPU = DeviceType::kCPU;

// max |a - b| within bf16's rtol (1.6e-2, PyTorch's) of the largest |b|, times `scale`.
void ExpectBf16Close(const Tensor& a, const Tensor& b, double scale = 1.0) {
  ASSERT_TRUE(a.defined());
  ASSERT_TRUE(b.defined());
  ASSERT_EQ(a.shape(), b.shape());
  const double largest = MaxAbsDiff(b, zeros_like(b));
  EXPECT_LE(MaxAbsDiff(a, b), scale * (1e-5 + 1.6e-2 * largest)) << "largest |b| = " << largest;
}

struct Call {
  Device device;
  bool autocast;
  DType float32_list;  // the dtype exp gave for a bfloat16 input
  bool operator<(const Call& other) const { return device < other.device; }
};

// Records, for each call, the device whose work it ran as, whether autocast was on there, and
// the dtype of an op on the float32 list (exp) for a bfloat16 input. Needs no 16-bit GEMM.
class Probe : public nn::Cloneable<Probe> {
 public:
  Probe(std::shared_ptr<std::vector<Call>> calls, std::shared_ptr<std::mutex> mutex)
      : calls_(std::move(calls)), mutex_(std::move(mutex)) {
    reset();
  }
  void reset() override { scale_ = register_parameter("scale", ones({6})); }
  Tensor forward(const Tensor& x) {
    const DType dtype = exp(x.to(kBFloat16)).dtype();
    DeviceWorker* worker = DeviceWorker::Current();
    std::lock_guard<std::mutex> lock(*mutex_);
    calls_->push_back(
        Call{worker ? worker->device() : Device::Cpu(99), AutocastMode::IsEnabled(kCPU), dtype});
    return mul(x, *scale_);
  }

 private:
  std::shared_ptr<std::vector<Call>> calls_;
  std::shared_ptr<std::mutex> mutex_;
  nn::Parameter scale_;
};

class AutocastDataParallelTest : public ::testing::Test {
 protected:
  void SetUp() override { SetCpuDeviceCount(2); }
};

TEST_F(AutocastDataParallelTest, EveryReplicaRunsUnderTheCallersAutocast) {
  auto calls = std::make_shared<std::vector<Call>>();
  auto mutex = std::make_shared<std::mutex>();
  DataParallel dp(std::make_shared<Probe>(calls, mutex), CpuDevices(2));
  manual_seed(1);
  const Tensor x = randn({8, 6});
  {
    AutocastGuard autocast(kCPU);
    dp.forward(x);
  }
  std::sort(calls->begin(), calls->end());
  ASSERT_EQ(calls->size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ((*calls)[i].device, Device::Cpu(static_cast<int>(i)));
    EXPECT_TRUE((*calls)[i].autocast);
    EXPECT_EQ((*calls)[i].float32_list, kFloat32);
  }
  // After the guard, the workers are back to no autocast.
  calls->clear();
  dp.forward(x);
  ASSERT_EQ(calls->size(), 2u);
  for (const Call& call : *calls) {
    EXPECT_FALSE(call.autocast);
    EXPECT_EQ(call.float32_list, kBFloat16);
  }
}

std::shared_ptr<nn::Sequential> Mlp() {
  manual_seed(3);
  return std::make_shared<nn::Sequential>(nn::Linear(10, 16), nn::ReLU(), nn::Linear(16, 4));
}

std::vector<Tensor> Grads(const nn::Module& module) {
  std::vector<Tensor> grads;
  for (const Tensor& p : module.parameters()) grads.push_back(p.grad());
  return grads;
}

TEST_F(AutocastDataParallelTest, MatchesTheSingleDeviceAutocastForwardAndBackward) {
  auto model = Mlp();
  auto reference = Mlp();
  DataParallel dp(model, CpuDevices(2));
  manual_seed(4);
  const Tensor x = randn({12, 10});
  const Tensor labels = from_vector(std::vector<int64_t>{0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3}, {12});
  Tensor out, expected, loss, expected_loss;
  {
    AutocastGuard autocast(kCPU);
    out = dp.forward(x);
    expected = reference->forward(x);
    loss = cross_entropy(out, labels);
    expected_loss = cross_entropy(expected, labels);
  }
  EXPECT_EQ(out.dtype(), kBFloat16);
  EXPECT_EQ(expected.dtype(), kBFloat16);
  EXPECT_EQ(loss.dtype(), kFloat32);
  ExpectBf16Close(out, expected);
  loss.backward();
  expected_loss.backward();
  const std::vector<Tensor> grads = Grads(*model), expected_grads = Grads(*reference);
  ASSERT_EQ(grads.size(), expected_grads.size());
  for (size_t i = 0; i < grads.size(); ++i) {
    SCOPED_TRACE(i);
    ASSERT_TRUE(grads[i].defined());
    EXPECT_EQ(grads[i].dtype(), kFloat32);  // float32 gradients on the float32 parameters
    ExpectBf16Close(grads[i], expected_grads[i], 2.0);
  }
}

TEST_F(AutocastDataParallelTest, ForwardLossInsideTheReplicasRunsTheLossInFloat32) {
  auto model = Mlp();
  auto reference = Mlp();
  DataParallel dp(model, CpuDevices(2));
  nn::CrossEntropyLoss criterion;
  manual_seed(5);
  const Tensor x = randn({9, 10});
  const Tensor labels = from_vector(std::vector<int64_t>{3, 1, 2, 0, 0, 1, 2, 3, 1}, {9});
  Tensor loss, expected;
  {
    AutocastGuard autocast(kCPU);
    loss = dp.forward_loss(criterion, x, labels);
    expected = criterion.forward(reference->forward(x), labels);
  }
  EXPECT_EQ(loss.dtype(), kFloat32);
  ExpectBf16Close(loss, expected);
  loss.backward();
  expected.backward();
  const std::vector<Tensor> grads = Grads(*model), expected_grads = Grads(*reference);
  for (size_t i = 0; i < grads.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(grads[i].dtype(), kFloat32);
    ExpectBf16Close(grads[i], expected_grads[i], 2.0);
  }
}

class ConvNet : public nn::Cloneable<ConvNet> {
 public:
  ConvNet() { reset(); }
  void reset() override {
    conv_ = register_module("conv", nn::Conv2d(2, 3, 3));
    bn_ = register_module("bn", nn::BatchNorm2d(3));
    fc_ = register_module("fc", nn::Linear(3 * 4 * 4, 5));
  }
  Tensor forward(const Tensor& x) {
    const Tensor features = conv_->forward(x);
    const Tensor normalized = bn_->forward(features);
    EXPECT_EQ(features.dtype(), kBFloat16);
    EXPECT_EQ(normalized.dtype(), kFloat32);
    return fc_->forward(normalized.flatten(1));
  }
  std::shared_ptr<nn::BatchNorm2d> bn() const { return bn_; }

 private:
  std::shared_ptr<nn::Conv2d> conv_;
  std::shared_ptr<nn::BatchNorm2d> bn_;
  std::shared_ptr<nn::Linear> fc_;
};

TEST_F(AutocastDataParallelTest, ConvBatchNormLinearKeepsThePolicyInEveryReplica) {
  manual_seed(6);
  auto model = std::make_shared<ConvNet>();
  auto reference = std::static_pointer_cast<ConvNet>(model->clone());
  DataParallel dp(model, CpuDevices(2));
  const Tensor x = randn({8, 2, 6, 6});
  Tensor out, first;
  {
    AutocastGuard autocast(kCPU);
    out = dp.forward(x);
    first = reference->forward(x.chunk(2, 0)[0]);  // replica 0's chunk, on one device
  }
  EXPECT_EQ(out.dtype(), kBFloat16);
  ExpectBf16Close(out.narrow(0, 0, 4), first);
  // Replica 0's float32 statistics reach the original, as without autocast.
  EXPECT_EQ(model->bn()->running_mean().dtype(), kFloat32);
  ExpectBf16Close(model->bn()->running_mean(), reference->bn()->running_mean());
}

}  // namespace
}  // namespace tandem::parallel
