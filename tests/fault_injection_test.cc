// Fault injection for the parallel stack (issue 14): a replica that throws in forward or in
// backward on 2, 3 and 8 logical CPU devices, under DataParallel and under the primitives
// (replicate, scatter, parallel_apply, gather) directly; an allocator that refuses memory
// (SetMemoryLimit) in forward and in backward; a DataLoader worker that throws mid-epoch
// while DataParallel trains, and a loader destroyed mid-epoch; anomaly mode in a replica.
//
// Each case checks that the caller gets a clear error, that no thread is left behind (the
// process's thread count is back to what it was and every device worker still answers),
// that every device's allocator is back to the bytes it had in use before the faulty step,
// and that the next step works: its gradients equal those of the module on one device.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <fstream>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "data/data.h"
#include "nn/nn.h"
#include "parallel/parallel.h"
#include "tensor/core/anomaly_mode.h"
#include "tensor/runtime/threads.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace tandem {
namespace {

using ::tandem::testing::HasCuda;
using ::tandem::testing::MaxAbsDiff;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr int kDevices = 8;  // configured once for the whole binary
constexpr int64_t kFeatures = 8;
constexpr int64_t kOutputs = 4;

// Threads of this process, from /proc/self/status.
int ThreadCount() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  ADD_FAILURE() << "no Threads: line in /proc/self/status";
  return -1;
}

// Where faults go: the index of the device whose replica throws (-1: none).
struct FaultPlan {
  std::atomic<int> forward_device{-1};
  std::atomic<int> backward_device{-1};
};

// Linear-ReLU-Linear whose replica on a chosen device throws in forward, or records a
// node that throws in backward.
class Faulty : public nn::Cloneable<Faulty> {
 public:
  explicit Faulty(std::shared_ptr<FaultPlan> plan) : plan_(std::move(plan)) { reset(); }
  void reset() override {
    fc1_ = register_module("fc1", nn::Linear(kFeatures, 16));
    fc2_ = register_module("fc2", nn::Linear(16, kOutputs));
  }
  Tensor forward(const Tensor& x) {
    const int device = x.device().index();
    if (plan_->forward_device.load() == device) {
      throw std::out_of_range("injected forward fault on " + x.device().ToString());
    }
    Tensor out = fc2_->forward(relu(fc1_->forward(x)));
    if (plan_->backward_device.load() == device && NeedsGrad({out})) {
      Tensor poisoned = out.detach().clone();
      const std::string where = x.device().ToString();
      RecordOp("InjectedFaultBackward", {out}, poisoned,
               [where](const Tensor&) -> std::vector<Tensor> {
                 throw std::domain_error("injected backward fault on " + where);
               });
      return poisoned;
    }
    return out;
  }

 private:
  std::shared_ptr<FaultPlan> plan_;
  std::shared_ptr<nn::Linear> fc1_, fc2_;
};

enum class Path { kDataParallel, kParallelApply };

std::string PathName(Path path) {
  return path == Path::kDataParallel ? "DataParallel" : "ParallelApply";
}

// One model, its fault plan, and the two ways of running it over `devices`.
class Rig {
 public:
  Rig(int devices, Path path) : devices_(CpuDevices(devices)), path_(path) {
    manual_seed(17);
    model_ = std::make_shared<Faulty>(plan_);
    dp_ = std::make_shared<parallel::DataParallel>(model_, devices_);
  }

  FaultPlan& plan() { return *plan_; }
  const std::shared_ptr<Faulty>& model() const { return model_; }
  const std::shared_ptr<parallel::DataParallel>& dp() const { return dp_; }
  const std::vector<Device>& devices() const { return devices_; }

  // The loss of one step over the devices (forward only).
  Tensor Loss(const Tensor& x, const Tensor& y) const {
    if (path_ == Path::kDataParallel) return mse_loss(dp_->forward(x), y);
    std::vector<std::vector<Tensor>> inputs = parallel::scatter_inputs({x}, devices_);
    const std::vector<Device> used(devices_.begin(), devices_.begin() + inputs.size());
    std::vector<std::shared_ptr<nn::Module>> replicas = parallel::replicate(model_, used);
    std::vector<std::vector<Tensor>> outputs = parallel::parallel_apply(replicas, inputs, used);
    std::vector<Tensor> pieces;
    for (const auto& output : outputs) pieces.push_back(output.at(0));
    return mse_loss(parallel::Gather(pieces, devices_[0]), y);
  }

  // A whole step: forward and backward, gradients left in the model.
  void Step(const Tensor& x, const Tensor& y) const {
    model_->zero_grad();
    Loss(x, y).backward();
  }

  // The gradients of the module run on one device, without any parallelism.
  std::vector<Tensor> ReferenceGrads(const Tensor& x, const Tensor& y) const {
    model_->zero_grad();
    mse_loss(model_->forward(x), y).backward();
    std::vector<Tensor> grads;
    for (const Tensor& p : model_->parameters()) grads.push_back(p.grad().clone());
    model_->zero_grad();
    return grads;
  }

 private:
  std::shared_ptr<FaultPlan> plan_ = std::make_shared<FaultPlan>();
  std::vector<Device> devices_;
  Path path_;
  std::shared_ptr<Faulty> model_;
  std::shared_ptr<parallel::DataParallel> dp_;
};

// What must hold after a fault: thread count, responsive workers, memory.
struct Baseline {
  int threads = 0;
  std::vector<int64_t> in_use;  // per device of CpuDevices(kDevices)
};

// Asks every device worker for an answer; fails if one does not give it within 30 s (it is
// stuck in the faulty step).
void ExpectEveryWorkerAnswers() {
  for (Device d : CpuDevices(kDevices)) {
    std::future<int> answer = DeviceWorker::For(d).Submit([] { return 7; });
    ASSERT_EQ(answer.wait_for(std::chrono::seconds(30)), std::future_status::ready)
        << d << "'s worker does not answer";
    EXPECT_EQ(answer.get(), 7);
  }
}

// Taken after a good step (so caches are warm and every worker has started).
Baseline TakeBaseline() {
  ExpectEveryWorkerAnswers();
  Baseline b;
  b.threads = ThreadCount();
  for (Device d : CpuDevices(kDevices)) b.in_use.push_back(GetMemoryStats(d).in_use_bytes);
  return b;
}

// Right after the faulty step (its tensors dropped): no thread more or less, every worker
// answers, and no device holds more than before (it may hold less: DataParallel's cached
// replicas let go of the broadcast parameters they held when a step fails).
void ExpectNothingLeftBehind(const Baseline& before) {
  ExpectEveryWorkerAnswers();
  EXPECT_EQ(ThreadCount(), before.threads) << "threads were started and not joined, or lost";
  for (int i = 0; i < kDevices; ++i) {
    EXPECT_LE(GetMemoryStats(Device::Cpu(i)).in_use_bytes, before.in_use[i])
        << "cpu:" << i << " holds memory the failed step allocated";
  }
}

// After the next good step (gradients dropped): every device is back to its bytes in use.
void ExpectMemoryBackToBaseline(const Baseline& before) {
  // A worker drops what its last task held (a backward pass's graph) just after the task has
  // handed back its result: a round trip through every worker makes sure that has happened.
  ExpectEveryWorkerAnswers();
  for (int i = 0; i < kDevices; ++i) {
    EXPECT_EQ(GetMemoryStats(Device::Cpu(i)).in_use_bytes, before.in_use[i]) << "cpu:" << i;
  }
  EXPECT_EQ(ThreadCount(), before.threads);
}

void ExpectGradsMatch(const nn::Module& model, const std::vector<Tensor>& reference) {
  const std::vector<Tensor> params = model.parameters();
  ASSERT_EQ(params.size(), reference.size());
  for (size_t i = 0; i < params.size(); ++i) {
    ASSERT_TRUE(params[i].grad().defined()) << "parameter " << i << " got no gradient";
    EXPECT_LE(MaxAbsDiff(params[i].grad(), reference[i]), 1e-5) << "parameter " << i;
  }
}

// The next step works and is right: its gradients equal the module's on one device. Leaves
// no gradient (nor anything else) behind.
void ExpectNextStepWorks(const Rig& rig, const Tensor& x, const Tensor& y) {
  {
    const std::vector<Tensor> reference = rig.ReferenceGrads(x, y);
    rig.Step(x, y);
    ExpectGradsMatch(*rig.model(), reference);
  }
  rig.model()->zero_grad();
}

struct Batch {
  Tensor x, y;
};

Batch MakeBatch(int64_t rows, uint64_t seed) {
  manual_seed(seed);
  return {randn({rows, kFeatures}), randn({rows, kOutputs})};
}

class FaultInjectionTest : public ::testing::Test {
 protected:
  void SetUp() override { SetCpuDeviceCount(kDevices); }
  void TearDown() override {
    for (Device d : CpuDevices(kDevices)) SetMemoryLimit(d, 0);
  }
};

struct Case {
  int devices;
  Path path;
  bool in_backward;
};

class ReplicaFault : public FaultInjectionTest, public ::testing::WithParamInterface<Case> {};

TEST_P(ReplicaFault, ReachesTheCallerAndTheNextStepWorks) {
  const Case c = GetParam();
  Rig rig(c.devices, c.path);
  // Uneven chunks that use every device (8 devices: 7 x 3 + 2).
  const Batch batch = MakeBatch(3 * c.devices - 1, 3);
  const int faulty = c.devices - 1;  // the last replica
  const std::string where = "cpu:" + std::to_string(faulty);

  // Warm up: every worker and pool started, the replicas cached.
  rig.Step(batch.x, batch.y);
  rig.model()->zero_grad();
  const Baseline baseline = TakeBaseline();

  if (c.in_backward) {
    rig.plan().backward_device = faulty;
  } else {
    rig.plan().forward_device = faulty;
  }
  try {
    rig.Step(batch.x, batch.y);
    FAIL() << "the faulty step did not throw";
  } catch (const Error& e) {
    const std::string what = e.what();
    if (c.in_backward) {
      EXPECT_THAT(what, StartsWith("backward failed in InjectedFaultBackward on " + where +
                                   ": injected backward fault on " + where));
      EXPECT_THROW(std::rethrow_if_nested(e), std::domain_error);
    } else {
      EXPECT_THAT(what, StartsWith("Caught std::out_of_range in replica " + std::to_string(faulty) +
                                   " on device " + where + ": injected forward fault on " + where));
      EXPECT_THROW(std::rethrow_if_nested(e), std::out_of_range);
    }
  }
  rig.plan().forward_device = -1;
  rig.plan().backward_device = -1;
  rig.model()->zero_grad();
  ExpectNothingLeftBehind(baseline);

  // The next step works and is right.
  {
    const Batch next = MakeBatch(3 * c.devices - 1, 4);
    ExpectNextStepWorks(rig, next.x, next.y);
  }
  ExpectMemoryBackToBaseline(baseline);
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (int devices : {2, 3, 8}) {
    for (Path path : {Path::kDataParallel, Path::kParallelApply}) {
      for (bool in_backward : {false, true}) cases.push_back({devices, path, in_backward});
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(DevicesPathsAndPasses, ReplicaFault, ::testing::ValuesIn(AllCases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return PathName(info.param.path) + std::to_string(info.param.devices) +
                                  "Devices" + (info.param.in_backward ? "Backward" : "Forward");
                         });

// The out-of-memory message names the device, the size asked for and the bytes in use.
void ExpectOutOfMemoryMessage(const std::string& what, const std::string& device) {
  EXPECT_THAT(what, HasSubstr("out of memory on " + device + ": tried to allocate "));
  EXPECT_THAT(what, HasSubstr(" in use and "));
  EXPECT_THAT(what, HasSubstr("the memory limit set with SetMemoryLimit would be exceeded"));
}

TEST_F(FaultInjectionTest, AnAllocatorThatRefusesMemoryInAReplicasForward) {
  for (Path path : {Path::kDataParallel, Path::kParallelApply}) {
    SCOPED_TRACE(PathName(path));
    Rig rig(3, path);
    const Batch batch = MakeBatch(96, 5);
    rig.Step(batch.x, batch.y);
    rig.model()->zero_grad();
    const Baseline baseline = TakeBaseline();

    // cpu:2 may hold only 256 more bytes than now: its replica's first activation fails.
    const Device cpu2 = Device::Cpu(2);
    ResetPeakMemory(cpu2);
    SetMemoryLimit(cpu2, GetMemoryStats(cpu2).in_use_bytes + 256);
    try {
      rig.Step(batch.x, batch.y);
      FAIL() << "no out-of-memory error";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("cpu:2"));
      ExpectOutOfMemoryMessage(e.what(), "cpu:2");
    }
    EXPECT_LE(GetMemoryStats(cpu2).peak_bytes, GetMemoryStats(cpu2).limit_bytes);
    rig.model()->zero_grad();
    ExpectNothingLeftBehind(baseline);

    // Limit lifted: the next step works and is right.
    SetMemoryLimit(cpu2, 0);
    ExpectNextStepWorks(rig, batch.x, batch.y);
    ExpectMemoryBackToBaseline(baseline);
  }
}

// A limit set between forward and backward: the forward's graph fits, its backward does
// not, on each device in turn (the output device, which starts backward, and a replica's).
TEST_F(FaultInjectionTest, AnAllocatorThatRefusesMemoryInBackward) {
  Rig rig(3, Path::kDataParallel);
  const Batch batch = MakeBatch(300, 6);
  rig.Step(batch.x, batch.y);
  rig.model()->zero_grad();
  const Baseline baseline = TakeBaseline();

  for (int device : {0, 2}) {
    SCOPED_TRACE(::testing::Message() << "limit on cpu:" << device);
    const Device limited = Device::Cpu(device);
    Tensor loss = rig.Loss(batch.x, batch.y);
    ExpectEveryWorkerAnswers();  // what the replicas' tasks held is released
    SetMemoryLimit(limited, GetMemoryStats(limited).in_use_bytes + 256);
    try {
      loss.backward();
      FAIL() << "no out-of-memory error in backward";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), StartsWith("backward failed in "));
      ExpectOutOfMemoryMessage(e.what(), limited.ToString());
    }
    loss = Tensor();
    rig.model()->zero_grad();
    SetMemoryLimit(limited, 0);
    ExpectNothingLeftBehind(baseline);
    ExpectNextStepWorks(rig, batch.x, batch.y);
    ExpectMemoryBackToBaseline(baseline);
  }
}

TEST_F(FaultInjectionTest, AnAllocatorThatRefusesMemoryOnAGpu) {
  if (!HasCuda()) GTEST_SKIP() << ::tandem::testing::NoCudaReason();
  const Device gpu = Device::Cuda(0);
  auto plan = std::make_shared<FaultPlan>();
  manual_seed(21);
  auto model = std::make_shared<Faulty>(plan);
  model->to(gpu);
  const Tensor x = randn({512, kFeatures}).to(gpu), y = randn({512, kOutputs}).to(gpu);
  auto step = [&] {
    model->zero_grad();
    mse_loss(model->forward(x), y).backward();
  };
  step();
  model->zero_grad();
  const int64_t in_use = GetMemoryStats(gpu).in_use_bytes;
  SetMemoryLimit(gpu, in_use + 4096);
  try {
    step();
    FAIL() << "no out-of-memory error on " << gpu;
  } catch (const Error& e) {
    ExpectOutOfMemoryMessage(e.what(), gpu.ToString());
  }
  model->zero_grad();
  SetMemoryLimit(gpu, 0);
  EXPECT_EQ(GetMemoryStats(gpu).in_use_bytes, in_use);
  step();
  EXPECT_TRUE(model->parameters()[0].grad().defined());
}

// Rows of a TensorDataset; get(fail_at) throws once; every get may be slowed down.
class FlakyDataset : public data::Dataset {
 public:
  FlakyDataset(int64_t rows, int64_t fail_at, std::chrono::microseconds delay = {})
      : inner_({randn({rows, kFeatures}), randn({rows, kOutputs})}),
        fail_at_(fail_at),
        delay_(delay) {}
  int64_t size() const override { return inner_.size(); }
  data::Example get(int64_t index) const override {
    gets_.fetch_add(1);
    if (delay_.count() > 0) std::this_thread::sleep_for(delay_);
    if (index == fail_at_ && !failed_.exchange(true)) {
      throw std::runtime_error("injected loader fault: the file behind row " +
                               std::to_string(index) + " vanished");
    }
    return inner_.get(index);
  }
  int64_t gets() const { return gets_.load(); }

 private:
  data::TensorDataset inner_;
  int64_t fail_at_;
  std::chrono::microseconds delay_;
  mutable std::atomic<bool> failed_{false};
  mutable std::atomic<int64_t> gets_{0};
};

TEST_F(FaultInjectionTest, ALoaderWorkerThatThrowsMidEpochWhileDataParallelTrains) {
  Rig rig(3, Path::kDataParallel);
  nn::SGD optimizer(rig.model()->parameters(), nn::SGDOptions(0.05).momentum(0.9));
  {  // warm-up of the model; a loader's own threads come and go with it
    const Batch batch = MakeBatch(30, 7);
    rig.Step(batch.x, batch.y);
    rig.model()->zero_grad();
  }
  const int threads_before = ThreadCount();
  manual_seed(8);
  auto dataset = std::make_shared<FlakyDataset>(300, /*fail_at=*/157);
  int steps = 0;
  {
    data::DataLoader loader(dataset,
                            data::DataLoaderOptions().batch_size(30).shuffle(false).num_workers(2));
    try {
      for (data::Batch& batch : loader) {
        optimizer.zero_grad();
        mse_loss(rig.dp()->forward(batch.data()), batch.target()).backward();
        optimizer.step();
        ++steps;
      }
      FAIL() << "the epoch did not throw";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("get(157)"));
      EXPECT_THAT(e.what(), HasSubstr("batch 5"));
      EXPECT_THAT(e.what(), HasSubstr("injected loader fault"));
    }
    EXPECT_EQ(steps, 5) << "the batches before the failing one were trained on";
    // The loader is usable: a new epoch runs to its end and training goes on.
    int64_t rows = 0;
    for (data::Batch& batch : loader) {
      optimizer.zero_grad();
      Tensor loss = mse_loss(rig.dp()->forward(batch.data()), batch.target());
      loss.backward();
      optimizer.step();
      EXPECT_TRUE(std::isfinite(loss.item()));
      rows += batch.size();
    }
    EXPECT_EQ(rows, 300);
  }  // destroyed cleanly
  EXPECT_EQ(ThreadCount(), threads_before) << "the loader's workers were not all joined";
}

TEST_F(FaultInjectionTest, ALoaderDestroyedMidEpochWhileDataParallelTrains) {
  Rig rig(3, Path::kDataParallel);
  const Batch warm = MakeBatch(30, 9);
  rig.Step(warm.x, warm.y);
  rig.model()->zero_grad();
  manual_seed(10);
  auto dataset =
      std::make_shared<FlakyDataset>(3000, /*fail_at=*/-1, std::chrono::microseconds(200));
  const Baseline baseline = TakeBaseline();
  {
    data::DataLoader loader(dataset, data::DataLoaderOptions()
                                         .batch_size(30)
                                         .shuffle(true)
                                         .seed(3)
                                         .num_workers(3)
                                         .prefetch_factor(2));
    int steps = 0;
    for (data::Batch& batch : loader) {
      rig.model()->zero_grad();
      mse_loss(rig.dp()->forward(batch.data()), batch.target()).backward();
      if (++steps == 4) break;  // the loop ends; the loader, still prefetching, goes next
    }
  }
  const int64_t gets = dataset->gets();
  EXPECT_LT(gets, 3000) << "the loader read the whole epoch instead of stopping";
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(dataset->gets(), gets) << "a worker kept loading after the loader was destroyed";
  rig.model()->zero_grad();
  ExpectNothingLeftBehind(baseline);
  ExpectNextStepWorks(rig, warm.x, warm.y);
  ExpectMemoryBackToBaseline(baseline);
}

// The module of AnomalyInAReplica: log of its input, so a negative row yields NaN.
class LogModel : public nn::Cloneable<LogModel> {
 public:
  LogModel() { reset(); }
  void reset() override { fc_ = register_module("fc", nn::Linear(kFeatures, kOutputs)); }
  Tensor forward(const Tensor& x) { return log(fc_->forward(x) * 0.0 + x.narrow(1, 0, 4)); }

 private:
  std::shared_ptr<nn::Linear> fc_;
};

TEST_F(FaultInjectionTest, AnomalyModeNamesTheReplicaAndTheOp) {
  manual_seed(12);
  auto model = std::make_shared<LogModel>();
  parallel::DataParallel dp(model, CpuDevices(3));
  Tensor x = add(rand({6, kFeatures}), 0.5);  // positive: log is finite
  {
    DetectAnomalyGuard detect;
    dp.forward(x).sum().backward();  // finite: no error
    model->zero_grad();
    Tensor bad = x.clone();
    bad.narrow(0, 2, 1).fill_(-1.0);  // row 2: replica 1's first row (chunks of 2)
    const Baseline baseline = TakeBaseline();
    try {
      dp.forward(bad);
      FAIL() << "anomaly mode let a NaN through";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), StartsWith("Caught tandem::Error in replica 1 on device cpu:1: "
                                       "anomaly detected in the forward pass: the op recorded "
                                       "as LogBackward on cpu:1 produced output 0"));
    }
    model->zero_grad();
    ExpectNothingLeftBehind(baseline);
    dp.forward(x).sum().backward();  // the next step works
    model->zero_grad();
    ExpectMemoryBackToBaseline(baseline);
  }
  EXPECT_FALSE(AnomalyMode::IsEnabled());
}

}  // namespace
}  // namespace tandem
