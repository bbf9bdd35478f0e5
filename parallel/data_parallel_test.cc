// DataParallel must match the module on one device: outputs and gradients, for 1, 2, 3 and
// 8 logical CPU devices and batches that divide evenly, that do not, and that are smaller
// than the device count; and keep PyTorch's semantics (errors, modes, printing).
#include "parallel/data_parallel.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <mutex>
#include <stdexcept>
#include <string>

#include "nn/nn.h"
#include "tensor/runtime/threads.h"
#include "tensor/testing.h"

namespace tandem::parallel {
namespace {

using ::tandem::testing::ErrorOf;
using ::tandem::testing::HasCuda;
using ::tandem::testing::MaxAbsDiff;
using ::testing::HasSubstr;
using ::testing::StartsWith;

std::shared_ptr<nn::Sequential> Mlp(uint64_t seed = 3) {
  manual_seed(seed);
  return std::make_shared<nn::Sequential>(nn::Linear(10, 16), nn::ReLU(), nn::Linear(16, 4));
}

// Gradients of every parameter, in order.
std::vector<Tensor> Grads(const nn::Module& module) {
  std::vector<Tensor> grads;
  for (const Tensor& p : module.parameters()) grads.push_back(p.grad());
  return grads;
}

void ExpectClose(const Tensor& a, const Tensor& b, double tolerance = 1e-5) {
  ASSERT_TRUE(a.defined());
  ASSERT_TRUE(b.defined());
  ASSERT_EQ(a.shape(), b.shape());
  EXPECT_LE(MaxAbsDiff(a, b), tolerance);
}

class DataParallelTest : public ::testing::Test {
 protected:
  void SetUp() override { SetCpuDeviceCount(8); }
};

struct Case {
  int devices;
  int64_t batch;
};

class DataParallelEquivalence : public DataParallelTest,
                                public ::testing::WithParamInterface<Case> {};

TEST_P(DataParallelEquivalence, MatchesTheModuleOnOneDevice) {
  const Case c = GetParam();
  auto reference = Mlp();
  auto model = Mlp();
  DataParallel dp(model, CpuDevices(c.devices));
  Tensor x = randn({c.batch, 10});
  Tensor weights = randn({c.batch, 4});

  Tensor expected = reference->forward(x);
  Tensor out = dp.forward(x);
  ExpectClose(out, expected);
  EXPECT_EQ(out.device(), Device::Cpu(0));

  (expected * weights).sum().backward();
  (out * weights).sum().backward();
  const std::vector<Tensor> want = Grads(*reference);
  const std::vector<Tensor> got = Grads(*model);
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ExpectClose(got[i], want[i]);
    EXPECT_EQ(got[i].device(), Device::Cpu(0));
  }
}

INSTANTIATE_TEST_SUITE_P(DevicesAndBatches, DataParallelEquivalence,
                         ::testing::Values(Case{1, 12}, Case{2, 12}, Case{2, 7}, Case{3, 12},
                                           Case{3, 10}, Case{3, 1}, Case{3, 2}, Case{8, 64},
                                           Case{8, 10}, Case{8, 3}),
                         [](const auto& info) {
                           return std::to_string(info.param.devices) + "devices_batch" +
                                  std::to_string(info.param.batch);
                         });

// A gradient penalty (WGAN-GP's on the input, and one on the parameters' gradient) computed
// with create_graph through DataParallel: the double backward crosses Scatter, the replicas,
// Gather and the parameters' Broadcast, and must equal the module's on one device.
std::vector<Tensor> GradientPenaltyGrads(nn::Module& module,
                                         const std::function<Tensor(const Tensor&)>& forward,
                                         const Tensor& input) {
  Tensor x = input.detach().clone();
  x.set_requires_grad(true);
  const Tensor loss = square(forward(x)).mean();
  std::vector<Tensor> wrt = module.parameters();
  wrt.push_back(x);
  const std::vector<Tensor> first = autograd::grad({loss}, wrt, {}, /*create_graph=*/true);
  Tensor penalty = square(sqrt(square(first.back()).sum({1})) - 1.0).mean();
  for (size_t i = 0; i + 1 < first.size(); ++i) penalty = add(penalty, square(first[i]).sum());
  EXPECT_FALSE(module.parameters()[0].grad().defined());  // autograd::grad left .grad alone
  add(loss, mul(penalty, 0.5)).backward();
  std::vector<Tensor> grads = Grads(module);
  grads.push_back(x.grad());
  return grads;
}

TEST_F(DataParallelTest, GradientPenaltyWithCreateGraphMatchesOneDevice) {
  manual_seed(5);
  const Tensor x = randn({6, 10});
  auto reference =
      std::make_shared<nn::Sequential>(nn::Linear(10, 16), nn::Tanh(), nn::Linear(16, 4));
  manual_seed(5);
  (void)randn({6, 10});
  auto model = std::make_shared<nn::Sequential>(nn::Linear(10, 16), nn::Tanh(), nn::Linear(16, 4));
  DataParallel dp(model, CpuDevices(2));
  const std::vector<Tensor> want = GradientPenaltyGrads(
      *reference, [&](const Tensor& in) { return reference->forward(in); }, x);
  const std::vector<Tensor> got = GradientPenaltyGrads(
      *model, [&](const Tensor& in) { return dp.forward(in); }, x);
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE(i);
    ExpectClose(got[i], want[i]);
    EXPECT_EQ(got[i].device(), Device::Cpu(0));
  }
}

TEST_F(DataParallelTest, ChunksFollowTorchChunk) {
  DataParallel dp(Mlp(), CpuDevices(8));
  dp.forward(randn({10, 10}));
  EXPECT_EQ(dp.last_chunk_sizes(), (std::vector<int64_t>{2, 2, 2, 2, 2}));
  dp.forward(randn({30, 10}));
  EXPECT_EQ(dp.last_chunk_sizes(), (std::vector<int64_t>{4, 4, 4, 4, 4, 4, 4, 2}));
}

// A module that records which device each call ran on, and the chunk sizes it saw.
class Recorder : public nn::Cloneable<Recorder> {
 public:
  explicit Recorder(std::shared_ptr<std::vector<std::pair<Device, int64_t>>> calls,
                    std::shared_ptr<std::mutex> mutex)
      : calls_(std::move(calls)), mutex_(std::move(mutex)) {
    reset();
  }
  void reset() override { fc_ = register_module("fc", nn::Linear(3, 2)); }
  Tensor forward(const Tensor& x) {
    DeviceWorker* worker = DeviceWorker::Current();
    {
      std::lock_guard<std::mutex> lock(*mutex_);
      calls_->emplace_back(worker ? worker->device() : Device::Cpu(99), x.size(0));
    }
    EXPECT_EQ(x.device(), fc_->parameters()[0].device());
    return fc_->forward(x);
  }

 private:
  std::shared_ptr<std::vector<std::pair<Device, int64_t>>> calls_;
  std::shared_ptr<std::mutex> mutex_;
  std::shared_ptr<nn::Linear> fc_;
};

TEST_F(DataParallelTest, EachReplicaRunsOnItsDevicesWorker) {
  auto calls = std::make_shared<std::vector<std::pair<Device, int64_t>>>();
  auto mutex = std::make_shared<std::mutex>();
  DataParallel dp(std::make_shared<Recorder>(calls, mutex), CpuDevices(3));
  dp.forward(randn({10, 3}));
  std::sort(calls->begin(), calls->end());
  EXPECT_EQ(*calls, (std::vector<std::pair<Device, int64_t>>{
                        {Device::Cpu(0), 4}, {Device::Cpu(1), 4}, {Device::Cpu(2), 2}}));
  // A batch that gives one chunk runs the module itself, on the calling thread.
  calls->clear();
  dp.forward(randn({1, 3}));
  EXPECT_EQ(*calls, (std::vector<std::pair<Device, int64_t>>{{Device::Cpu(99), 1}}));
}

TEST_F(DataParallelTest, SplitsAlongDimOne) {
  // Linear over the last dimension of [4, B, 10]: split the B axis.
  auto reference = Mlp();
  auto model = Mlp();
  DataParallel dp(model, CpuDevices(3), std::nullopt, /*dim=*/1);
  Tensor x = randn({4, 7, 10});
  Tensor out = dp.forward(x);
  EXPECT_EQ(dp.last_chunk_sizes(), (std::vector<int64_t>{3, 3, 1}));
  ExpectClose(out, reference->forward(x));
  out.sum().backward();
  reference->forward(x).sum().backward();
  for (size_t i = 0; i < Grads(*model).size(); ++i) {
    ExpectClose(Grads(*model)[i], Grads(*reference)[i]);
  }
}

class TwoInputs : public nn::Cloneable<TwoInputs> {
 public:
  TwoInputs() { reset(); }
  void reset() override { fc_ = register_module("fc", nn::Linear(10, 5)); }
  Tensor forward(const Tensor& x, const Tensor& y) { return fc_->forward(x) + y; }

 private:
  std::shared_ptr<nn::Linear> fc_;
};

TEST_F(DataParallelTest, TwoInputsAreScatteredAlike) {
  manual_seed(1);
  auto model = std::make_shared<TwoInputs>();
  DataParallel dp(model, CpuDevices(3));
  Tensor x = randn({8, 10}, TensorOptions().requires_grad(true));
  Tensor y = randn({8, 5}, TensorOptions().requires_grad(true));
  Tensor out = dp.forward(x, y);
  ASSERT_EQ(out.shape(), (Shape{8, 5}));
  ExpectClose(out, model->forward(x, y));
  out.sum().backward();
  // Inputs that require grad get their gradients back, on their own device.
  ExpectClose(y.grad(), ones({8, 5}));
  ExpectClose(x.grad(), model->parameters()[0].sum({0}, true).expand({8, 10}).contiguous());
}

TEST_F(DataParallelTest, InputsOnAnotherDeviceAndOutputOnAnother) {
  auto reference = Mlp();
  auto model = Mlp();
  DataParallel dp(model, CpuDevices(2), Device::Cpu(5));
  EXPECT_EQ(dp.output_device(), Device::Cpu(5));
  Tensor x = randn({9, 10}).to(Device::Cpu(3));
  Tensor out = dp.forward(x);
  EXPECT_EQ(out.device(), Device::Cpu(5));
  ExpectClose(out.to(Device::Cpu(0)), reference->forward(x.to(Device::Cpu(0))));
  out.sum().backward();
  reference->forward(x.to(Device::Cpu(0))).sum().backward();
  for (size_t i = 0; i < Grads(*model).size(); ++i) {
    ExpectClose(Grads(*model)[i], Grads(*reference)[i]);
  }
}

TEST_F(DataParallelTest, ForwardLossEqualsTheLossOfTheGatheredOutput) {
  for (int devices : {1, 2, 3, 8}) {
    auto reference = Mlp();
    auto model = Mlp();
    DataParallel dp(model, CpuDevices(devices));
    nn::CrossEntropyLoss criterion;
    Tensor x = randn({11, 10});
    Tensor y = from_vector(std::vector<int64_t>{0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2}, {11});
    Tensor expected = criterion.forward(reference->forward(x), y);
    Tensor loss = dp.forward_loss(criterion, x, y);
    EXPECT_EQ(loss.dim(), 0);
    EXPECT_NEAR(loss.item(), expected.item(), 1e-5) << devices << " devices";
    expected.backward();
    loss.backward();
    for (size_t i = 0; i < Grads(*model).size(); ++i) {
      ExpectClose(Grads(*model)[i], Grads(*reference)[i]);
    }
  }
}

// forward_loss over 2 and 3 CPU devices (11 rows: uneven chunks 6+5 and 4+4+3) equals the
// criterion on the module's output on one device: value (a tensor of the same shape) and the
// module's gradients. For reduction none both are back-propagated with the same weights.
void ExpectForwardLossMatchesOneDevice(const std::string& name, nn::Module& criterion,
                                       const Tensor& x, const Tensor& y) {
  for (int devices : {2, 3}) {
    SCOPED_TRACE(name + " on " + std::to_string(devices) + " devices");
    auto reference = Mlp();
    auto model = Mlp();
    DataParallel dp(model, CpuDevices(devices));
    Tensor expected = criterion.forward_tensors({reference->forward(x), y}).at(0);
    Tensor loss = dp.forward_loss(criterion, x, y);
    ASSERT_EQ(loss.shape(), expected.shape());
    EXPECT_EQ(loss.device(), Device::Cpu(0));
    double scale = 1.0;
    for (float v : expected.to_vector<float>()) scale = std::max<double>(scale, std::abs(v));
    EXPECT_LE(MaxAbsDiff(loss, expected), 1e-5 * scale);
    Tensor seed = expected.dim() == 0 ? ones({}) : rand(expected.shape());
    mul(expected, seed).sum().backward();
    mul(loss, seed).sum().backward();
    for (size_t i = 0; i < Grads(*model).size(); ++i) {
      ExpectClose(Grads(*model)[i], Grads(*reference)[i], 1e-5 * scale);
    }
  }
}

TEST_F(DataParallelTest, ForwardLossIsExactForEveryStockLossAndReduction) {
  manual_seed(7);
  const Tensor x = randn({11, 10});
  const Tensor labels =
      from_vector(std::vector<int64_t>{0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2}, {11}, kInt64);
  // Chunk 4+4+3: the last three ignored (a replica whose denominator is 0); 6+5: the first
  // replica's rows partly ignored.
  const Tensor ignored =
      from_vector(std::vector<int64_t>{3, -100, 2, 1, 0, 3, 1, 2, -100, -100, -100}, {11}, kInt64);
  const Tensor weight = from_vector(std::vector<float>{0.5f, 2.0f, 1.0f, 3.0f}, {4});
  const Tensor soft = rand({11, 4});
  using nn::Reduction;

  nn::CrossEntropyLoss weighted(nn::CrossEntropyLossOptions().weight(weight));
  ExpectForwardLossMatchesOneDevice("CrossEntropyLoss weight", weighted, x, labels);
  ExpectForwardLossMatchesOneDevice("CrossEntropyLoss weight ignored", weighted, x, ignored);
  nn::CrossEntropyLoss plain;
  ExpectForwardLossMatchesOneDevice("CrossEntropyLoss ignored", plain, x, ignored);
  nn::CrossEntropyLoss smoothed(nn::CrossEntropyLossOptions().weight(weight).label_smoothing(0.1));
  ExpectForwardLossMatchesOneDevice("CrossEntropyLoss smoothing", smoothed, x, ignored);
  nn::CrossEntropyLoss summed(nn::CrossEntropyLossOptions().reduction(Reduction::kSum));
  ExpectForwardLossMatchesOneDevice("CrossEntropyLoss sum", summed, x, ignored);
  nn::CrossEntropyLoss none(
      nn::CrossEntropyLossOptions().weight(weight).reduction(Reduction::kNone));
  ExpectForwardLossMatchesOneDevice("CrossEntropyLoss none", none, x, ignored);
  ExpectForwardLossMatchesOneDevice("CrossEntropyLoss probabilities", smoothed, x,
                                    softmax(soft, 1));
  nn::NLLLoss nll(nn::NLLLossOptions().weight(weight));
  // On the MLP's raw output, which NLLLoss reads as log-probabilities.
  ExpectForwardLossMatchesOneDevice("NLLLoss weight", nll, x, ignored);
  nn::BCEWithLogitsLoss bce(nn::BCEWithLogitsLossOptions().pos_weight(add(rand({4}), 0.5)));
  ExpectForwardLossMatchesOneDevice("BCEWithLogitsLoss pos_weight", bce, x, soft);
  nn::MSELoss mse(nn::MSELossOptions().reduction(Reduction::kSum));
  ExpectForwardLossMatchesOneDevice("MSELoss sum", mse, x, randn({11, 4}));
  nn::SmoothL1Loss smooth;
  ExpectForwardLossMatchesOneDevice("SmoothL1Loss", smooth, x, randn({11, 4}));
}

TEST_F(DataParallelTest, ForwardLossWithEveryTargetIgnoredIsNanAsInPyTorch) {
  const Tensor x = randn({5, 10});
  const Tensor y = full({5}, -100.0, TensorOptions(kInt64));
  nn::CrossEntropyLoss criterion;
  nn::CrossEntropyLoss weighted(
      nn::CrossEntropyLossOptions().weight(from_vector(std::vector<float>{1, 2, 3, 4}, {4})));
  for (nn::Module* c : std::vector<nn::Module*>{&criterion, &weighted}) {
    EXPECT_TRUE(std::isnan(c->forward_tensors({Mlp()->forward(x), y}).at(0).item()));
    DataParallel dp(Mlp(), CpuDevices(2));
    EXPECT_TRUE(std::isnan(dp.forward_loss(*c, x, y).item()));
  }
}

TEST_F(DataParallelTest, ForwardLossMovesTheCriterionsWeightToEachReplica) {
  // The weight on cpu:5, a device no replica uses: each replica gets a copy on its device.
  const Tensor weight = from_vector(std::vector<float>{0.5f, 2.0f, 1.0f, 3.0f}, {4});
  nn::CrossEntropyLoss criterion(nn::CrossEntropyLossOptions().weight(weight));
  nn::CrossEntropyLoss elsewhere(nn::CrossEntropyLossOptions().weight(weight));
  elsewhere.to(Device::Cpu(5));
  const Tensor x = randn({7, 10});
  const Tensor y = from_vector(std::vector<int64_t>{0, 1, 2, 3, 3, 2, 1}, {7}, kInt64);
  const double expected = criterion.forward(Mlp()->forward(x), y).item();
  for (int devices : {1, 2, 3}) {
    DataParallel dp(Mlp(), CpuDevices(devices));
    EXPECT_NEAR(dp.forward_loss(elsewhere, x, y).item(), expected, 1e-5) << devices;
    EXPECT_EQ(elsewhere.weight().device(), Device::Cpu(5));  // the criterion is left alone
  }
}

// A criterion that is not a ChunkableLoss: the chunks' values weighted by chunk size.
class MeanAbs : public nn::Cloneable<MeanAbs> {
 public:
  MeanAbs() : nn::Cloneable<MeanAbs>("MeanAbs") {}
  void reset() override {}
  Tensor forward(const Tensor& input, const Tensor& target) {
    return mean(abs(sub(input, target)));
  }
};

TEST_F(DataParallelTest, ForwardLossWeightsOtherCriteriaByChunkSize) {
  MeanAbs criterion;
  ExpectForwardLossMatchesOneDevice("MeanAbs", criterion, randn({11, 10}), randn({11, 4}));
}

// 20 SGD steps with DataParallel over 3 devices track 20 steps on one device.
void TrainAndCompare(bool use_forward_loss) {
  auto reference = Mlp(11);
  auto model = Mlp(11);
  DataParallel dp(model, CpuDevices(3));
  nn::SGD ref_opt(reference->parameters(), nn::SGDOptions(0.1).momentum(0.9));
  nn::SGD opt(model->parameters(), nn::SGDOptions(0.1).momentum(0.9));
  nn::CrossEntropyLoss criterion;
  Generator data(5);
  for (int step = 0; step < 20; ++step) {
    Tensor x = randn({17, 10}, {}, &data);
    Tensor y = randperm(17, &data).to(kFloat32).mul_(0.2).to(kInt64);  // labels 0..3
    ref_opt.zero_grad();
    criterion.forward(reference->forward(x), y).backward();
    ref_opt.step();
    opt.zero_grad();
    Tensor loss =
        use_forward_loss ? dp.forward_loss(criterion, x, y) : criterion.forward(dp.forward(x), y);
    loss.backward();
    opt.step();
  }
  const std::vector<Tensor> want = reference->parameters();
  const std::vector<Tensor> got = model->parameters();
  for (size_t i = 0; i < want.size(); ++i) {
    double scale = 1.0;
    for (float v : want[i].to_vector<float>()) scale = std::max<double>(scale, std::abs(v));
    EXPECT_LE(MaxAbsDiff(got[i], want[i]), 1e-4 * scale) << "parameter " << i;
  }
}

TEST_F(DataParallelTest, TwentyTrainingStepsTrackOneDevice) { TrainAndCompare(false); }
TEST_F(DataParallelTest, TwentyTrainingStepsWithForwardLossTrackOneDevice) {
  TrainAndCompare(true);
}

TEST_F(DataParallelTest, OneBucketAndManyBucketsAgree) {
  auto a = Mlp();
  auto b = Mlp();
  DataParallel one(a, CpuDevices(3));
  DataParallel many(b, CpuDevices(3));
  one.set_bucket_bytes(size_t{1} << 30);
  many.set_bucket_bytes(64);  // every parameter its own bucket
  Tensor x = randn({12, 10});
  one.forward(x).sum().backward();
  many.forward(x).sum().backward();
  for (size_t i = 0; i < Grads(*a).size(); ++i) ExpectClose(Grads(*b)[i], Grads(*a)[i]);
}

TEST_F(DataParallelTest, PrintsAsPyTorch) {
  DataParallel dp(std::make_shared<nn::Linear>(10, 5), CpuDevices(2));
  EXPECT_EQ(dp.ToString(),
            "DataParallel(\n  (module): Linear(in_features=10, out_features=5, bias=True)\n)");
}

TEST_F(DataParallelTest, ModuleOnTheWrongDeviceIsAnError) {
  auto model = Mlp();
  model->to(Device::Cpu(1));
  DataParallel dp(model, CpuDevices(2));
  EXPECT_THAT(ErrorOf([&] {
                dp.forward(randn({4, 10}));
              }),
              HasSubstr("module must have its parameters and buffers on device cpu:0 "
                        "(device_ids[0]) but found one of them on device: cpu:1"));
}

TEST_F(DataParallelTest, DuplicateAndUnavailableDevicesAreErrors) {
  EXPECT_THAT(ErrorOf([&] {
                DataParallel(Mlp(), {Device::Cpu(0), Device::Cpu(1), Device::Cpu(0)});
              }),
              HasSubstr("cpu:0 appears more than once"));
  EXPECT_THAT(ErrorOf([&] {
                DataParallel(Mlp(), {Device::Cpu(0), Device::Cpu(40)});
              }),
              HasSubstr("cpu:40"));
  if (!HasCuda()) {
    EXPECT_THAT(ErrorOf([&] { DataParallel(Mlp(), {Device::Cuda(0)}); }), HasSubstr("cuda:0"));
  }
}

TEST_F(DataParallelTest, DefaultDevicesAreEveryCpuDeviceWithoutAGpu) {
  if (HasCuda()) GTEST_SKIP() << "a GPU is present: the default is every CUDA device";
  SetCpuDeviceCount(3);
  DataParallel dp(Mlp());
  EXPECT_EQ(dp.device_ids(), CpuDevices(3));
  EXPECT_EQ(dp.output_device(), Device::Cpu(0));
}

TEST_F(DataParallelTest, ChooseCpuLayoutGivesEachCoreADeviceWithAChunk) {
  CpuLayout two = ChooseCpuLayout(/*batch=*/256, /*parameters=*/0, 1, /*cores=*/2);
  EXPECT_EQ(two.devices, CpuDevices(2));
  EXPECT_EQ(two.threads_per_device, 1);
  // Fewer samples than cores: no device without a chunk; the cores are shared out.
  CpuLayout one = ChooseCpuLayout(/*batch=*/1, 0, 1, /*cores=*/2);
  EXPECT_EQ(one.devices, CpuDevices(1));
  EXPECT_EQ(one.threads_per_device, 2);
  CpuLayout three = ChooseCpuLayout(/*batch=*/3, 0, 1, /*cores=*/8);
  EXPECT_EQ(three.devices, CpuDevices(3));
  EXPECT_EQ(three.threads_per_device, 2);
}

TEST_F(DataParallelTest, ChooseCpuLayoutKeepsALargeModelOnASmallBatchOnOneDevice) {
  // The trainer's MLP (235,146 parameters) at batch 256 and the small GPT (~0.84M) at 16 x 64
  // tokens: a device per core. GPT-2 (124,439,808) at 4 x 64 tokens: one device, 2 threads;
  // at 4096 sequences, devices again.
  EXPECT_EQ(ChooseCpuLayout(256, 235146, 1, 2).devices, CpuDevices(2));
  EXPECT_EQ(ChooseCpuLayout(16, 840000, 64, 2).devices, CpuDevices(2));
  const CpuLayout gpt2 = ChooseCpuLayout(4, 124439808, 64, 2);
  EXPECT_EQ(gpt2.devices, CpuDevices(1));
  EXPECT_EQ(gpt2.threads_per_device, 2);
  EXPECT_EQ(ChooseCpuLayout(4096, 124439808, 64, 2).devices, CpuDevices(2));
  // The boundary: exactly kMaxParametersPerReplicaRow per row still gets devices.
  EXPECT_EQ(ChooseCpuLayout(4, 2 * 10 * kMaxParametersPerReplicaRow, 10, 2).devices, CpuDevices(2));
  EXPECT_EQ(ChooseCpuLayout(4, 2 * 10 * kMaxParametersPerReplicaRow + 1, 10, 2).devices,
            CpuDevices(1));
}

TEST_F(DataParallelTest, ChooseCpuLayoutRejectsImpossibleInputs) {
  EXPECT_THAT(ErrorOf([] { ChooseCpuLayout(0); }), HasSubstr("at least 1 sample but has 0"));
  EXPECT_THAT(ErrorOf([] { ChooseCpuLayout(4, -1); }), HasSubstr("at least 0 (0: unknown)"));
  EXPECT_THAT(ErrorOf([] { ChooseCpuLayout(4, 0, 0); }), HasSubstr("at least 1 row but has 0"));
  EXPECT_THAT(ErrorOf([] { ChooseCpuLayout(4, 0, 1, 0); }), HasSubstr("at least 1 core but got 0"));
}

class Thrower : public nn::Cloneable<Thrower> {
 public:
  explicit Thrower(std::shared_ptr<std::atomic<bool>> armed) : armed_(std::move(armed)) { reset(); }
  void reset() override { fc_ = register_module("fc", nn::Linear(3, 2)); }
  Tensor forward(const Tensor& x) {
    if (armed_->load() && x.device() == Device::Cpu(1)) throw std::out_of_range("bad row 7");
    return fc_->forward(x);
  }

 private:
  std::shared_ptr<std::atomic<bool>> armed_;
  std::shared_ptr<nn::Linear> fc_;
};

TEST_F(DataParallelTest, AReplicaThatThrowsInForwardReachesTheCaller) {
  auto armed = std::make_shared<std::atomic<bool>>(true);
  DataParallel dp(std::make_shared<Thrower>(armed), CpuDevices(3));
  try {
    dp.forward(randn({6, 3}));
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), StartsWith("Caught std::out_of_range in replica 1 on device cpu:1: "));
    EXPECT_THAT(e.what(), HasSubstr("bad row 7"));
    EXPECT_THROW(std::rethrow_if_nested(e), std::out_of_range);
  }
  *armed = false;
  EXPECT_EQ(dp.forward(randn({6, 3})).shape(), (Shape{6, 2}));
}

TEST_F(DataParallelTest, AReplicaThatThrowsInBackwardReachesTheCaller) {
  auto model = Mlp();
  DataParallel dp(model, CpuDevices(3));
  Tensor out = dp.forward(randn({6, 10}));
  // A gradient hook on replica 1's chunk of the output that throws.
  std::vector<Tensor> parts = out.chunk(3, 0);
  Tensor poisoned = parts[1].detach().clone();
  RecordOp("PoisonBackward", {parts[1]}, poisoned,
           [](const Tensor&) -> std::vector<Tensor> { throw std::runtime_error("nan found"); });
  Tensor total = add(add(parts[0].sum(), poisoned.sum()), parts[2].sum());
  EXPECT_THAT(ErrorOf([&] { total.backward(); }), HasSubstr("nan found"));
  // Nothing hangs, and the next step works.
  model->zero_grad();
  dp.forward(randn({6, 10})).sum().backward();
  EXPECT_TRUE(model->parameters()[0].grad().defined());
}

class ZeroGradInForward : public nn::Cloneable<ZeroGradInForward> {
 public:
  ZeroGradInForward() { reset(); }
  void reset() override { fc_ = register_module("fc", nn::Linear(3, 2)); }
  Tensor forward(const Tensor& x) {
    zero_grad();
    EXPECT_EQ(is_training(), fc_->is_training());
    seen_training_ = is_training();
    return fc_->forward(x);
  }
  bool seen_training_ = true;

 private:
  std::shared_ptr<nn::Linear> fc_;
};

int Occurrences(const std::string& text, const std::string& part) {
  int count = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) {
    ++count;
  }
  return count;
}

// The only test of this binary whose replicas call zero_grad(), so the warning (once per
// process) is this test's to see.
TEST_F(DataParallelTest, ZeroGradInsideAReplicaLeavesTheOriginalAloneAndWarnsOnce) {
  auto model = std::make_shared<ZeroGradInForward>();
  DataParallel dp(model, CpuDevices(2));
  ::testing::internal::CaptureStderr();
  dp.forward(randn({4, 3})).sum().backward();
  const Tensor grad = model->parameters()[0].grad().clone();
  dp.forward(randn({4, 3}));  // replicas call zero_grad()
  const std::string printed = ::testing::internal::GetCapturedStderr();
  ExpectClose(model->parameters()[0].grad(), grad);
  EXPECT_EQ(Occurrences(printed,
                        "Calling .zero_grad() from a module created with nn.DataParallel() has "
                        "no effect.\n"),
            1)
      << printed;
  model->zero_grad();  // the original's still clears
  EXPECT_FALSE(model->parameters()[0].grad().defined());
}

// A module whose forward reads plain C++ members (copied by clone(), invisible to
// parameters() and buffers()).
class Scaled : public nn::Cloneable<Scaled> {
 public:
  Scaled() { reset(); }
  void reset() override { fc_ = register_module("fc", nn::Linear(10, 4)); }
  Tensor forward(const Tensor& x) {
    if (refuse_) throw std::invalid_argument("refused on purpose");
    return fc_->forward(x) * scale_;
  }
  double scale_ = 1.0;
  bool refuse_ = false;

 private:
  std::shared_ptr<nn::Linear> fc_;
};

// dp's output and the gradients it gives match the module's own on `x` (a stale replica is
// off by far more than the float32 rounding of a sum in another order).
void ExpectDataParallelMatchesTheModule(DataParallel& dp, nn::Module& model, const Tensor& x) {
  SCOPED_TRACE(model.ToString());
  model.zero_grad();
  const Tensor expected = model.forward_tensors({x}).at(0);
  (expected * expected).sum().backward();
  std::vector<Tensor> expected_grads;
  for (const Tensor& g : Grads(model)) expected_grads.push_back(g.clone());
  model.zero_grad();
  const Tensor out = dp.forward(x);
  ExpectClose(out, expected, 1e-4);
  (out * out).sum().backward();
  const std::vector<Tensor> grads = Grads(model);
  ASSERT_EQ(grads.size(), expected_grads.size());
  for (size_t i = 0; i < grads.size(); ++i) ExpectClose(grads[i], expected_grads[i], 1e-4);
}

TEST_F(DataParallelTest, ReplicasFollowEveryChangeToTheModuleBetweenForwards) {
  const Tensor x = randn({6, 10});
  auto model = Mlp();
  DataParallel dp(model, CpuDevices(3));
  ExpectDataParallelMatchesTheModule(dp, *model, x);
  model->push_back(nn::ReLU());  // a new module, no new parameter
  ExpectDataParallelMatchesTheModule(dp, *model, x);
  model->push_back(nn::Linear(4, 3));  // new parameters
  ExpectDataParallelMatchesTheModule(dp, *model, x);
  {
    Tensor weight = randn({16, 10});
    weight.set_requires_grad(true);
    model->replace_parameter("0.weight", weight);  // another tensor, same name and shape
  }
  ExpectDataParallelMatchesTheModule(dp, *model, x);
  auto other = Mlp(/*seed=*/9);
  other->push_back(nn::ReLU());
  other->push_back(nn::Linear(4, 3));
  model->load_state_dict(other->state_dict());
  ExpectDataParallelMatchesTheModule(dp, *model, x);

  auto scaled = std::make_shared<Scaled>();
  DataParallel scaled_dp(scaled, CpuDevices(3));
  ExpectDataParallelMatchesTheModule(scaled_dp, *scaled, x);
  scaled->scale_ = 3.0;  // a plain member
  ExpectDataParallelMatchesTheModule(scaled_dp, *scaled, x);
  scaled->refuse_ = true;
  EXPECT_THAT(ErrorOf([&] { scaled_dp.forward(x); }), HasSubstr("refused on purpose"));
  scaled->refuse_ = false;  // fixed: the next forward works
  ExpectDataParallelMatchesTheModule(scaled_dp, *scaled, x);
  // forward_loss replicates the same way.
  scaled->scale_ = -2.0;
  nn::MSELoss criterion;
  const Tensor target = randn({6, 4});
  ExpectClose(scaled_dp.forward_loss(criterion, x, target),
              criterion.forward(scaled->forward(x), target));
}

TEST_F(DataParallelTest, TrainAndEvalReachTheReplicas) {
  manual_seed(2);
  auto model = std::make_shared<nn::Sequential>(nn::Linear(6, 6), nn::Dropout(0.5));
  DataParallel dp(model, CpuDevices(2));
  Tensor x = ones({4, 6});
  dp.eval();
  EXPECT_FALSE(model->is_training());
  ExpectClose(dp.forward(x), model->forward(x));  // no dropout in eval mode
  dp.train();
  Tensor a = dp.forward(x);
  EXPECT_GT(MaxAbsDiff(a, model->forward(x)), 0.0);  // dropout active in the replicas
}

class NoInput : public nn::Cloneable<NoInput> {
 public:
  NoInput() { reset(); }
  void reset() override { bias_ = register_parameter("bias", ones({3})); }
  Tensor forward() { return *bias_ * 2.0; }

 private:
  nn::Parameter bias_;
};

TEST_F(DataParallelTest, AForwardWithoutInputsRunsOneReplica) {
  auto model = std::make_shared<NoInput>();
  DataParallel dp(model, CpuDevices(3));
  std::vector<Tensor> out = dp.forward_tensors({});
  ASSERT_EQ(out.size(), 1u);
  ExpectClose(out[0], full({3}, 2.0));
}

TEST_F(DataParallelTest, TheOutputIsOnTheOutputDeviceInEveryCase) {
  nn::MSELoss criterion;
  for (int devices : {1, 2, 3}) {
    for (int64_t batch : {1, 2, 6}) {
      SCOPED_TRACE(::testing::Message() << devices << " devices, batch " << batch);
      auto model = Mlp();
      DataParallel dp(model, CpuDevices(devices), Device::Cpu(5));
      const Tensor x = randn({batch, 10});
      const Tensor out = dp.forward(x);
      EXPECT_EQ(out.device(), Device::Cpu(5));
      ExpectDataParallelMatchesTheModule(dp, *model, x);
      const Tensor target = randn({batch, 4});
      const Tensor loss = dp.forward_loss(criterion, x, target);
      EXPECT_EQ(loss.device(), Device::Cpu(5));
      ExpectClose(loss, criterion.forward(model->forward(x), target));
    }
  }
  DataParallel no_input(std::make_shared<NoInput>(), {Device::Cpu(0)}, Device::Cpu(4));
  EXPECT_EQ(no_input.forward_tensors({}).at(0).device(), Device::Cpu(4));
}

TEST_F(DataParallelTest, BadInputsGetClearErrors) {
  DataParallel dp(Mlp(), CpuDevices(2));
  EXPECT_THAT(ErrorOf([&] { dp.forward(scalar_tensor(1.0)); }), HasSubstr("0-dimensional"));
  EXPECT_THAT(ErrorOf([&] { dp.forward(randn({4, 7})); }), HasSubstr("last dimension 10"));
  nn::CrossEntropyLoss criterion;
  EXPECT_THAT(
      ErrorOf([&] {
        dp.forward_loss(criterion, randn({4, 10}), from_vector(std::vector<int64_t>{1, 2}, {2}));
      }),
      HasSubstr("entries along dimension 0"));
}

TEST_F(DataParallelTest, WeakDevicesAreNamed) {
  using internal::WeakDevices;
  EXPECT_TRUE(WeakDevices({{100, 8}, {100, 8}}).empty());
  EXPECT_EQ(WeakDevices({{100, 8}, {70, 8}, {100, 5}, {80, 6}}), (std::vector<size_t>{1, 2}));
  EXPECT_TRUE(WeakDevices({{0, 0}, {100, 8}}).empty());  // unknown capacity is not weak
}

TEST_F(DataParallelTest, InferenceUnderNoGradBuildsNoGraph) {
  auto model = Mlp();
  DataParallel dp(model, CpuDevices(3));
  NoGradGuard no_grad;
  Tensor out = dp.forward(randn({9, 10}));
  EXPECT_FALSE(out.requires_grad());
  EXPECT_EQ(out.grad_fn(), nullptr);
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
    return fc_->forward(bn_->forward(conv_->forward(x)).flatten(1));
  }
  std::shared_ptr<nn::BatchNorm2d> bn() const { return bn_; }

 private:
  std::shared_ptr<nn::Conv2d> conv_;
  std::shared_ptr<nn::BatchNorm2d> bn_;
  std::shared_ptr<nn::Linear> fc_;
};

TEST_F(DataParallelTest, ConvBatchNormLinearInEvalModeMatchesOneDevice) {
  manual_seed(9);
  auto model = std::make_shared<ConvNet>();
  {
    NoGradGuard no_grad;
    model->bn()->running_mean().copy_(from_vector(std::vector<float>{0.1f, -0.2f, 0.3f}, {3}));
    model->bn()->running_var().copy_(from_vector(std::vector<float>{0.5f, 1.5f, 2.0f}, {3}));
  }
  auto reference = std::static_pointer_cast<ConvNet>(model->clone());
  model->eval();
  reference->eval();
  DataParallel dp(model, CpuDevices(3));
  Tensor x = randn({7, 2, 6, 6});
  Tensor out = dp.forward(x);
  Tensor expected = reference->forward(x);
  ExpectClose(out, expected);
  out.sum().backward();
  expected.sum().backward();
  for (size_t i = 0; i < Grads(*model).size(); ++i) {
    ExpectClose(Grads(*model)[i], Grads(*reference)[i], 1e-4);
  }
}

// In training mode each replica normalises its own chunk (as in PyTorch), and replica 0's
// running statistics reach the original module; the other replicas' are dropped.
TEST_F(DataParallelTest, BatchNormTrainsPerChunkAndReplicaZerosStatisticsReachTheOriginal) {
  manual_seed(10);
  auto model = std::make_shared<ConvNet>();
  auto reference = std::static_pointer_cast<ConvNet>(model->clone());
  DataParallel dp(model, CpuDevices(2));
  Tensor x = randn({8, 2, 6, 6});
  Tensor out = dp.forward(x);
  std::vector<Tensor> halves = x.chunk(2, 0);
  Tensor first = reference->forward(halves[0]);  // updates the reference's statistics once
  ExpectClose(out.narrow(0, 0, 4), first);
  ExpectClose(model->bn()->running_mean(), reference->bn()->running_mean());
  ExpectClose(model->bn()->running_var(), reference->bn()->running_var());
  EXPECT_EQ(model->bn()->num_batches_tracked().item(), 1.0);
}

TEST_F(DataParallelTest, DropoutUnderDataParallelIsReproducible) {
  manual_seed(21);
  auto model =
      std::make_shared<nn::Sequential>(nn::Linear(8, 32), nn::Dropout(0.5), nn::Linear(32, 4));
  DataParallel dp(model, CpuDevices(3));
  Tensor x = randn({12, 8});
  manual_seed(5);
  const Tensor first = dp.forward(x).detach();
  for (int run = 0; run < 20; ++run) {
    manual_seed(5);
    ASSERT_EQ(MaxAbsDiff(dp.forward(x), first), 0.0) << "run " << run;
  }
  // Replicas draw different masks: the three chunks of equal rows are not all equal.
  Tensor same_rows = ones({12, 8});
  manual_seed(5);
  std::vector<Tensor> parts = dp.forward(same_rows).chunk(3, 0);
  EXPECT_GT(MaxAbsDiff(parts[0], parts[1]), 0.0);
}

// The same equivalence on CUDA devices: two physical GPUs, or two logical devices on one
// (TANDEM_CUDA_LOGICAL_DEVICES=2). Skips where there is none.
TEST_F(DataParallelTest, CudaDevicesMatchOneDevice) {
  if (!HasCuda()) GTEST_SKIP() << ::tandem::testing::NoCudaReason();
  const int gpus = DeviceCount(DeviceType::kCUDA);
  if (gpus < 2) GTEST_SKIP() << "needs two CUDA devices (set TANDEM_CUDA_LOGICAL_DEVICES=2)";
  std::vector<Device> devices = {Device::Cuda(0), Device::Cuda(1)};
  auto reference = Mlp();
  auto model = Mlp();
  reference->to(Device::Cuda(0));
  model->to(Device::Cuda(0));
  DataParallel dp(model, devices, Device::Cpu(0));
  Tensor x = randn({13, 10});
  Tensor out = dp.forward(x);
  EXPECT_EQ(out.device(), Device::Cpu(0));
  Tensor expected = reference->forward(x.to(Device::Cuda(0)));
  ExpectClose(out, expected.to(Device::Cpu(0)), 1e-4);
  out.sum().backward();
  expected.sum().backward();
  for (size_t i = 0; i < Grads(*model).size(); ++i) {
    EXPECT_EQ(Grads(*model)[i].device(), Device::Cuda(0));
    ExpectClose(Grads(*model)[i].to(Device::Cpu(0)), Grads(*reference)[i].to(Device::Cpu(0)), 1e-4);
  }
  nn::CrossEntropyLoss criterion;
  Tensor y = from_vector(std::vector<int64_t>{0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0}, {13});
  EXPECT_NEAR(
      dp.forward_loss(criterion, x, y).item(),
      criterion.forward(reference->forward(x.to(Device::Cuda(0))), y.to(Device::Cuda(0))).item(),
      1e-4);
}

// Doubles its own scale in place at every forward (as weight-normalising code may write a
// parameter under no_grad).
class ScalesItself : public nn::Cloneable<ScalesItself> {
 public:
  ScalesItself() { reset(); }
  void reset() override { scale_ = register_parameter("scale", ones({1})); }
  Tensor forward(const Tensor& x) {
    {
      NoGradGuard no_grad;
      Tensor scale = *scale_;
      scale.mul_(2.0);
    }
    return x * *scale_;
  }
  const Tensor& scale() const { return *scale_; }

 private:
  nn::Parameter scale_;
};

// PyTorch's replicas on devices other than device_ids[0] hold copies of the parameters, so an
// in-place write inside them stays theirs and only replica 0's reaches the module. Between
// logical CPU devices the replicas alias the module's memory: copy-on-write keeps the same
// semantics (and no replica writes memory another reads).
TEST_F(DataParallelTest, InPlaceWritesInsideReplicasStayTheirsExceptReplicaZeros) {
  auto model = std::make_shared<ScalesItself>();
  DataParallel dp(model, CpuDevices(3));
  for (float expected : {2.0f, 4.0f, 8.0f}) {
    Tensor out = dp.forward(ones({6, 2}));
    EXPECT_EQ(out.to_vector<float>(), std::vector<float>(12, expected));
    EXPECT_EQ(model->scale().to_vector<float>(), std::vector<float>{expected});
    out.sum().backward();
    // d(sum)/d(scale): every replica's rows, each multiplied by its own (written) scale's 1.
    EXPECT_EQ(model->scale().grad().to_vector<float>(), std::vector<float>{12.0f});
    model->zero_grad();
  }
}

// A module converted to another floating dtype (model->to(kBFloat16), as PyTorch users wrap a
// model.half()) replicates in that dtype and matches one device: outputs and the gradients
// reduced onto the module, on logical CPU devices and on two GPUs where there are.
TEST_F(DataParallelTest, ModulesInEveryFloatingDTypeMatchOneDevice) {
  std::vector<std::vector<Device>> device_sets = {CpuDevices(2)};
  if (HasCuda() && DeviceCount(DeviceType::kCUDA) >= 2) {
    device_sets.push_back({Device::Cuda(0), Device::Cuda(1)});
  }
  for (const std::vector<Device>& devices : device_sets) {
    for (DType dtype : {kFloat32, kFloat64, kBFloat16, kFloat16}) {
      SCOPED_TRACE(devices[0].ToString() + " " + DTypeName(dtype));
      // Each row of a 16-bit result is rounded once; the replicas' gradients are summed in
      // the dtype, one more rounding than one device's.
      const double tolerance = dtype == kFloat64               ? 1e-12
                               : IsReducedFloatingPoint(dtype) ? 3e-2
                                                               : 1e-5;
      auto reference = Mlp();
      auto model = Mlp();
      for (auto& m : {reference, model}) {
        m->to(devices[0]);
        m->to(dtype);
      }
      DataParallel dp(model, devices);
      const Tensor x = randn({7, 10}).to(dtype).to(devices[0]);
      const Tensor weights = randn({7, 4}).to(dtype).to(devices[0]);
      Tensor out = dp.forward(x);
      Tensor expected = reference->forward(x);
      EXPECT_EQ(out.dtype(), dtype);
      ExpectClose(out.to(Device::Cpu(0)).to(kFloat64), expected.to(Device::Cpu(0)).to(kFloat64),
                  tolerance);
      (out * weights).sum().backward();
      (expected * weights).sum().backward();
      const std::vector<Tensor> want = Grads(*reference);
      const std::vector<Tensor> got = Grads(*model);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_EQ(got[i].dtype(), dtype);
        EXPECT_EQ(got[i].device(), devices[0]);
        ExpectClose(got[i].to(Device::Cpu(0)).to(kFloat64), want[i].to(Device::Cpu(0)).to(kFloat64),
                    tolerance);
      }
    }
  }
}

}  // namespace
}  // namespace tandem::parallel
