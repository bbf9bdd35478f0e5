// Synchronized BatchNorm across DataParallel's replicas. The oracle is PyTorch's assertion for
// SyncBatchNorm: over unequal chunks (batches of 5 and 7 over 2 and 3 devices), the output,
// the gradients of the input and the parameters, and the running statistics equal those of a
// plain BatchNorm over the whole batch on one device. In float64, to 1e-12. And the failures
// that would otherwise hang a meeting of replicas end with an error instead.
#include "parallel/sync_batch_norm.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "nn/nn.h"
#include "parallel/data_parallel.h"
#include "tensor/core/autograd.h"
#include "tensor/testing.h"

namespace tandem::parallel {
namespace {

using ::tandem::testing::ErrorOf;
using ::tandem::testing::MaxAbsDiff;
using ::testing::HasSubstr;

constexpr double kTolerance = 1e-12;
const TensorOptions kF64 = TensorOptions().dtype(kFloat64);

std::vector<Device> CpuDevices(int n) {
  std::vector<Device> devices;
  for (int i = 0; i < n; ++i) devices.push_back(Device::Cpu(i));
  return devices;
}

// A BatchNorm, its parameters made non-trivial, in float64.
template <typename Norm>
std::shared_ptr<Norm> MakeNorm(int64_t channels, uint64_t seed) {
  auto norm = std::make_shared<Norm>(channels);
  norm->to(kFloat64);
  Generator gen(seed);
  NoGradGuard no_grad;
  norm->weight().copy_(rand({channels}, kF64, &gen) + 0.5);
  norm->bias().copy_(randn({channels}, kF64, &gen));
  return norm;
}

struct Result {
  Tensor output, input_grad, weight_grad, bias_grad, running_mean, running_var, batches;
};

// One training forward and backward of `module` (directly, or through DataParallel over
// `devices`), with a fixed random output gradient.
template <typename Norm>
Result TrainOnce(const std::shared_ptr<Norm>& norm, const Tensor& x, int devices) {
  Tensor input = x.detach().clone();
  input.set_requires_grad(true);
  Tensor out;
  if (devices == 0) {
    out = norm->forward(input);
  } else {
    DataParallel dp(norm, CpuDevices(devices));
    out = dp.forward(input);
  }
  Generator gen(99);
  const Tensor weight = randn(out.shape(), kF64, &gen);
  (out * weight).sum().backward();
  return {
      out.detach(),         input.grad(),        norm->weight().grad(),      norm->bias().grad(),
      norm->running_mean(), norm->running_var(), norm->num_batches_tracked()};
}

void ExpectSame(const Result& got, const Result& want) {
  EXPECT_LE(MaxAbsDiff(got.output, want.output), kTolerance);
  EXPECT_LE(MaxAbsDiff(got.input_grad, want.input_grad), kTolerance);
  EXPECT_LE(MaxAbsDiff(got.weight_grad, want.weight_grad), kTolerance);
  EXPECT_LE(MaxAbsDiff(got.bias_grad, want.bias_grad), kTolerance);
  EXPECT_LE(MaxAbsDiff(got.running_mean, want.running_mean), kTolerance);
  EXPECT_LE(MaxAbsDiff(got.running_var, want.running_var), kTolerance);
  EXPECT_EQ(got.batches.item(), want.batches.item());
}

class SyncBatchNormTest : public ::testing::Test {
 protected:
  void SetUp() override { SetCpuDeviceCount(3); }
};

struct Case {
  int devices;
  int64_t batch;
};

class SyncBatchNormEquivalence : public SyncBatchNormTest,
                                 public ::testing::WithParamInterface<Case> {};

TEST_P(SyncBatchNormEquivalence, BatchNorm2dEqualsTheWholeBatchOnOneDevice) {
  const Case c = GetParam();
  Generator gen(5);
  const Tensor x = randn({c.batch, 4, 3, 2}, kF64, &gen) * 3.0 + 1.0;
  const Result want = TrainOnce(MakeNorm<nn::BatchNorm2d>(4, 1), x, 0);
  auto synced = MakeNorm<nn::BatchNorm2d>(4, 1);
  EXPECT_EQ(ConvertSyncBatchNorm(*synced), 1);
  ExpectSame(TrainOnce(synced, x, c.devices), want);
}

TEST_P(SyncBatchNormEquivalence, BatchNorm1dEqualsTheWholeBatchOnOneDevice) {
  const Case c = GetParam();
  Generator gen(6);
  for (const Shape& rest : {Shape{3}, Shape{3, 4}}) {
    Shape shape = {c.batch};
    shape.insert(shape.end(), rest.begin(), rest.end());
    const Tensor x = randn(shape, kF64, &gen);
    const Result want = TrainOnce(MakeNorm<nn::BatchNorm1d>(3, 2), x, 0);
    auto synced = MakeNorm<nn::BatchNorm1d>(3, 2);
    ConvertSyncBatchNorm(*synced);
    ExpectSame(TrainOnce(synced, x, c.devices), want);
  }
}

INSTANTIATE_TEST_SUITE_P(UnequalChunks, SyncBatchNormEquivalence,
                         ::testing::Values(Case{2, 5}, Case{3, 7}, Case{3, 4}));

// Without the conversion each replica normalises its own chunk: the test above can fail.
TEST_F(SyncBatchNormTest, PlainBatchNormUnderDataParallelDiffersFromTheWholeBatch) {
  Generator gen(5);
  const Tensor x = randn({6, 4, 3, 2}, kF64, &gen) * 3.0 + 1.0;
  const Result want = TrainOnce(MakeNorm<nn::BatchNorm2d>(4, 1), x, 0);
  const Result got = TrainOnce(MakeNorm<nn::BatchNorm2d>(4, 1), x, 2);
  EXPECT_GT(MaxAbsDiff(got.output, want.output), 1e-3);
}

// A network whose BatchNorms are submodules that reset() creates afresh (as every model's
// are): the replicas' layers are synchronized too, and a layer called twice meets twice.
class Net : public nn::Cloneable<Net> {
 public:
  Net() { reset(); }
  void reset() override {
    fc1_ = register_module("fc1", nn::Linear(5, 6));
    bn_ = register_module("bn", nn::BatchNorm1d(6));
    fc2_ = register_module("fc2", nn::Linear(6, 2));
  }
  Tensor forward(const Tensor& x) {
    const Tensor h = bn_->forward(tanh(fc1_->forward(x)));
    return fc2_->forward(bn_->forward(h * 2.0 - 1.0));
  }

 private:
  std::shared_ptr<nn::Linear> fc1_, fc2_;
  std::shared_ptr<nn::BatchNorm1d> bn_;
};

TEST_F(SyncBatchNormTest, ReplicasOfSubmodulesSynchronizeThroughForwardLoss) {
  manual_seed(3);
  auto reference = std::make_shared<Net>();
  reference->to(kFloat64);
  auto synced = std::static_pointer_cast<Net>(reference->clone());
  EXPECT_EQ(ConvertSyncBatchNorm(*synced), 1);
  Generator gen(8);
  const Tensor x = randn({7, 5}, kF64, &gen);
  const Tensor y = randn({7, 2}, kF64, &gen);
  nn::MSELoss criterion;
  criterion.forward(reference->forward(x), y).backward();
  DataParallel dp(synced, CpuDevices(3));
  dp.forward_loss(criterion, x, y).backward();
  const std::vector<nn::NamedTensor> want = reference->named_parameters();
  const std::vector<nn::NamedTensor> got = synced->named_parameters();
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_LE(MaxAbsDiff(got[i].value.grad(), want[i].value.grad()), kTolerance) << want[i].name;
  }
  for (const auto& [a, b] : {std::pair(reference->named_buffers(), synced->named_buffers())}) {
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_LE(MaxAbsDiff(b[i].value.to(kFloat64), a[i].value.to(kFloat64)), kTolerance)
          << a[i].name;
    }
  }
}

// Across GPUs (two physical ones, or two logical devices on one; the CUDA simulator's in CI):
// the partial sums travel between devices, in float32.
TEST_F(SyncBatchNormTest, CudaReplicasEqualTheWholeBatchOnOneGpu) {
  if (!::tandem::testing::HasCuda()) GTEST_SKIP() << ::tandem::testing::NoCudaReason();
  if (DeviceCount(DeviceType::kCUDA) < 2) {
    GTEST_SKIP() << "needs two CUDA devices (set TANDEM_CUDA_LOGICAL_DEVICES=2)";
  }
  Generator gen(5);
  const Tensor x = randn({5, 4, 3, 2}, {}, &gen) * 3.0 + 1.0;
  Tensor outputs[2], input_grads[2], weight_grads[2], running_vars[2];
  for (int synced : {0, 1}) {
    auto norm = MakeNorm<nn::BatchNorm2d>(4, 1);
    norm->to(kFloat32);
    norm->to(Device::Cuda(0));
    Tensor input = x.to(Device::Cuda(0));
    input.set_requires_grad(true);
    Tensor out;
    if (synced == 1) {
      ConvertSyncBatchNorm(*norm);
      DataParallel dp(norm, {Device::Cuda(0), Device::Cuda(1)});
      out = dp.forward(input);
    } else {
      out = norm->forward(input);
    }
    (out * out).sum().backward();
    outputs[synced] = out.detach().to(Device::Cpu(0));
    input_grads[synced] = input.grad().to(Device::Cpu(0));
    weight_grads[synced] = norm->weight().grad().to(Device::Cpu(0));
    running_vars[synced] = norm->running_var().to(Device::Cpu(0));
  }
  EXPECT_LE(MaxAbsDiff(outputs[1], outputs[0]), 1e-4);
  EXPECT_LE(MaxAbsDiff(input_grads[1], input_grads[0]), 1e-3);
  EXPECT_LE(MaxAbsDiff(weight_grads[1], weight_grads[0]), 1e-3);
  EXPECT_LE(MaxAbsDiff(running_vars[1], running_vars[0]), 1e-5);
}

TEST_F(SyncBatchNormTest, EvaluationUsesTheRunningStatistics) {
  Generator gen(4);
  const Tensor x = randn({5, 4, 2, 2}, kF64, &gen);
  auto plain = MakeNorm<nn::BatchNorm2d>(4, 1);
  auto synced = MakeNorm<nn::BatchNorm2d>(4, 1);
  ConvertSyncBatchNorm(*synced);
  plain->eval();
  synced->eval();
  DataParallel dp(synced, CpuDevices(2));
  EXPECT_LE(MaxAbsDiff(dp.forward(x), plain->forward(x)), kTolerance);
}

TEST_F(SyncBatchNormTest, ALayerIsSynchronizedOneWayOnly) {
  nn::BatchNorm2d norm(3);
  norm.set_cross_replica_sum([](const Tensor& t) { return t; });
  EXPECT_THAT(ErrorOf([&] { ConvertSyncBatchNorm(norm); }), HasSubstr("is already synchronized"));
}

// A module that misbehaves on one device, around a synchronized BatchNorm.
class Faulty : public nn::Cloneable<Faulty> {
 public:
  enum class Fault { kThrowBeforeNorm, kNormTwiceOnDevice0, kThrowInBackward };
  explicit Faulty(Fault fault) : fault_(fault) { reset(); }
  void reset() override { bn_ = register_module("bn", nn::BatchNorm1d(2)); }
  Tensor forward(const Tensor& x) {
    const bool device1 = x.device() == Device::Cpu(1);
    if (fault_ == Fault::kThrowBeforeNorm && device1) TANDEM_FAIL("device 1 gives up");
    Tensor y = bn_->forward(x);
    if (fault_ == Fault::kNormTwiceOnDevice0 && !device1) y = bn_->forward(y);
    if (fault_ == Fault::kThrowInBackward && device1) {
      Tensor out = y.detach().clone();
      RecordOp("FailingBackward", {y}, out, [](const Tensor&) -> std::vector<Tensor> {
        TANDEM_FAIL("backward on device 1 gives up");
      });
      return out;
    }
    return y;
  }

 private:
  Fault fault_;
  std::shared_ptr<nn::BatchNorm1d> bn_;
};

std::string ErrorOfRun(Faulty::Fault fault) {
  auto module = std::make_shared<Faulty>(fault);
  ConvertSyncBatchNorm(*module);
  DataParallel dp(module, CpuDevices(2));
  Tensor x = randn({6, 2});
  x.set_requires_grad(true);
  return ErrorOf([&] { dp.forward(x).sum().backward(); });
}

TEST_F(SyncBatchNormTest, AReplicaThatThrowsReleasesTheOthers) {
  const std::string error = ErrorOfRun(Faulty::Fault::kThrowBeforeNorm);
  EXPECT_THAT(error, HasSubstr("replica 1"));
  EXPECT_THAT(error, HasSubstr("device 1 gives up"));
}

TEST_F(SyncBatchNormTest, ReplicasThatCallTheLayersDifferentlyAreRefused) {
  EXPECT_THAT(ErrorOfRun(Faulty::Fault::kNormTwiceOnDevice0),
              HasSubstr("replica 1 finished its forward after 2 synchronized sums"));
}

TEST_F(SyncBatchNormTest, ABackwardFailureReleasesTheBackwardMeeting) {
  EXPECT_THAT(ErrorOfRun(Faulty::Fault::kThrowInBackward),
              HasSubstr("backward on device 1 gives up"));
}

TEST_F(SyncBatchNormTest, ReplicaGroupSumsInReplicaOrderOutsideAutograd) {
  auto group = std::make_shared<ReplicaGroup>(1);
  const Tensor t = full({2}, 3.0);
  EXPECT_LE(MaxAbsDiff(group->Sum(0, t), t), 0.0);
  EXPECT_THAT(ErrorOf([&] { group->Sum(1, t); }), HasSubstr("replica 1 of a group of 1"));
}

}  // namespace
}  // namespace tandem::parallel
