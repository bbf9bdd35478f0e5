// Tests of parallel/parallel_apply.h: replicas run on their devices' workers with the
// caller's grad mode, outputs come back in order, and an exception in a replica reaches the
// caller as a tandem::Error naming the replica, after every replica has stopped.
#include "parallel/parallel_apply.h"

#include <atomic>
#include <chrono>
#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/base/grad_mode.h"
#include "tensor/runtime/threads.h"
#include "tensor/testing.h"

namespace tandem::parallel {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// What a probe saw while it ran.
struct Sighting {
  bool on_a_worker = false;
  Device worker_device;
  std::thread::id thread;
  bool grad_enabled = false;
  bool finished = false;
};

// A module that multiplies its input by `scale` (a parameter) and records where it ran. If
// `throw_what` is set it throws std::out_of_range instead; if `wait_for` is set it first
// waits until that flag is up (another replica has thrown), so that it is still running
// when the error happens.
class Probe : public nn::Module {
 public:
  explicit Probe(float scale, Device device = Device::Cpu(0)) : nn::Module("Probe") {
    scale_ = register_parameter("scale", full({1}, scale, TensorOptions().device(device)));
  }

  std::vector<Tensor> forward_tensors(const std::vector<Tensor>& inputs) override {
    DeviceWorker* worker = DeviceWorker::Current();
    seen.on_a_worker = worker != nullptr;
    if (worker != nullptr) seen.worker_device = worker->device();
    seen.thread = std::this_thread::get_id();
    seen.grad_enabled = GradMode::IsEnabled();
    if (wait_for != nullptr) {
      while (!wait_for->load()) std::this_thread::yield();
      // Still busy for a while after the other replica threw.
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (!throw_what.empty()) {
      if (thrown != nullptr) thrown->store(true);
      throw std::out_of_range(throw_what);
    }
    seen.finished = true;
    if (inputs.empty()) return {*scale_ * 1.0};
    return {inputs[0] * *scale_};
  }

  Sighting seen;
  std::string throw_what;
  std::atomic<bool>* wait_for = nullptr;
  std::atomic<bool>* thrown = nullptr;

 private:
  nn::Parameter scale_;
};

class ParallelApplyTest : public ::testing::Test {
 protected:
  void SetUp() override { SetCpuDeviceCount(8); }

  // One probe per device, probe i scaling by i + 1 with its parameter on devices[i].
  static std::vector<std::shared_ptr<Probe>> Probes(const std::vector<Device>& devices) {
    std::vector<std::shared_ptr<Probe>> probes;
    for (size_t i = 0; i < devices.size(); ++i) {
      probes.push_back(std::make_shared<Probe>(static_cast<float>(i + 1), devices[i]));
    }
    return probes;
  }
  static std::vector<std::shared_ptr<nn::Module>> AsModules(
      const std::vector<std::shared_ptr<Probe>>& probes) {
    return {probes.begin(), probes.end()};
  }
  // Input i: a [2] vector of (10 * i, 10 * i + 1) on devices[i].
  static std::vector<std::vector<Tensor>> Inputs(const std::vector<Device>& devices) {
    std::vector<std::vector<Tensor>> inputs;
    for (size_t i = 0; i < devices.size(); ++i) {
      const float base = 10.0f * static_cast<float>(i);
      inputs.push_back({from_vector(std::vector<float>{base, base + 1}, {2},
                                    TensorOptions().device(devices[i]))});
    }
    return inputs;
  }
};

TEST_F(ParallelApplyTest, OutputsComeBackInOrder) {
  const std::vector<Device> devices = CpuDevices(4);
  auto probes = Probes(devices);
  std::vector<std::vector<Tensor>> outputs =
      parallel_apply(AsModules(probes), Inputs(devices), devices);
  ASSERT_EQ(outputs.size(), 4u);
  for (size_t i = 0; i < outputs.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "replica " << i);
    ASSERT_EQ(outputs[i].size(), 1u);
    EXPECT_EQ(outputs[i][0].device(), devices[i]);
    const float base = 10.0f * i, scale = i + 1.0f;
    EXPECT_THAT(outputs[i][0].to_vector<float>(), ElementsAre(base * scale, (base + 1) * scale));
  }
}

// Replica 0 (the first CPU replica) runs on the calling thread, acting as its device's
// worker; every other replica on its own device's worker thread.
TEST_F(ParallelApplyTest, EachReplicaRunsOnItsDevicesWorker) {
  const std::vector<Device> devices = {Device::Cpu(3), Device::Cpu(1), Device::Cpu(0),
                                       Device::Cpu(7)};
  auto probes = Probes(devices);
  parallel_apply(AsModules(probes), Inputs(devices), devices);
  for (size_t i = 0; i < probes.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "replica " << i);
    ASSERT_TRUE(probes[i]->seen.on_a_worker) << "ran outside every device worker";
    EXPECT_EQ(probes[i]->seen.worker_device, devices[i]);
    if (i == 0) {
      EXPECT_EQ(probes[i]->seen.thread, std::this_thread::get_id());
    } else {
      EXPECT_NE(probes[i]->seen.thread, std::this_thread::get_id());
      EXPECT_NE(probes[i]->seen.thread, probes[0]->seen.thread);
    }
  }
  EXPECT_EQ(DeviceWorker::Current(), nullptr);  // the caller is itself again
}

TEST_F(ParallelApplyTest, WithoutDevicesEachReplicaRunsWhereItsInputIs) {
  const std::vector<Device> devices = {Device::Cpu(2), Device::Cpu(5)};
  auto probes = Probes(devices);
  std::vector<std::vector<Tensor>> outputs = parallel_apply(AsModules(probes), Inputs(devices));
  EXPECT_EQ(probes[0]->seen.worker_device, Device::Cpu(2));
  EXPECT_EQ(probes[1]->seen.worker_device, Device::Cpu(5));
  EXPECT_EQ(outputs[1][0].device(), Device::Cpu(5));
  // No input: the device of the first parameter.
  auto no_input = Probes(devices);
  outputs = parallel_apply(AsModules(no_input), {{}, {}});
  EXPECT_EQ(no_input[1]->seen.worker_device, Device::Cpu(5));
  EXPECT_THAT(outputs[1][0].to_vector<float>(), ElementsAre(2));
}

TEST_F(ParallelApplyTest, ReplicasRunWithTheCallersGradMode) {
  const std::vector<Device> devices = CpuDevices(3);
  {
    auto probes = Probes(devices);
    std::vector<std::vector<Tensor>> outputs =
        parallel_apply(AsModules(probes), Inputs(devices), devices);
    for (size_t i = 0; i < outputs.size(); ++i) {
      EXPECT_TRUE(probes[i]->seen.grad_enabled) << "replica " << i;
      EXPECT_TRUE(outputs[i][0].requires_grad()) << "replica " << i;
    }
  }
  {
    auto probes = Probes(devices);
    std::vector<std::vector<Tensor>> outputs;
    {
      NoGradGuard no_grad;
      outputs = parallel_apply(AsModules(probes), Inputs(devices), devices);
    }
    for (size_t i = 0; i < outputs.size(); ++i) {
      EXPECT_FALSE(probes[i]->seen.grad_enabled) << "replica " << i;
      EXPECT_FALSE(outputs[i][0].requires_grad()) << "replica " << i;
      EXPECT_EQ(outputs[i][0].grad_fn(), nullptr) << "replica " << i;
    }
  }
}

TEST_F(ParallelApplyTest, GradientsFlowBackToEachReplicasParameters) {
  const std::vector<Device> devices = CpuDevices(2);
  auto probes = Probes(devices);
  std::vector<std::vector<Tensor>> outputs =
      parallel_apply(AsModules(probes), Inputs(devices), devices);
  (outputs[0][0].sum() + outputs[1][0].sum().to(Device::Cpu(0))).backward();
  // d/dscale of sum(x * scale) = sum(x): 0 + 1 and 10 + 11.
  EXPECT_EQ(probes[0]->parameter("scale").grad().item(), 1.0);
  EXPECT_EQ(probes[1]->parameter("scale").grad().item(), 21.0);
  EXPECT_EQ(probes[1]->parameter("scale").grad().device(), Device::Cpu(1));
}

TEST_F(ParallelApplyTest, AnExceptionInAReplicaNamesItAfterEveryReplicaHasStopped) {
  const std::vector<Device> devices = CpuDevices(4);
  auto probes = Probes(devices);
  std::atomic<bool> thrown{false};
  probes[1]->throw_what = "index 7 is past the end";
  probes[1]->thrown = &thrown;
  for (size_t i : {0, 2, 3}) probes[i]->wait_for = &thrown;

  std::exception_ptr caught;
  try {
    parallel_apply(AsModules(probes), Inputs(devices), devices);
  } catch (...) {
    caught = std::current_exception();
  }
  ASSERT_TRUE(caught) << "parallel_apply did not throw";
  // Every other replica ran to its end before the error reached us.
  for (size_t i : {0, 2, 3}) EXPECT_TRUE(probes[i]->seen.finished) << "replica " << i;
  try {
    std::rethrow_exception(caught);
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), StartsWith("Caught std::out_of_range in replica 1 on device cpu:1: "
                                     "index 7 is past the end"));
    // The original is nested inside, with its type.
    bool reached_original = false;
    try {
      std::rethrow_if_nested(e);
    } catch (const std::out_of_range& original) {
      reached_original = true;
      EXPECT_STREQ(original.what(), "index 7 is past the end");
    } catch (...) {
      ADD_FAILURE() << "the nested exception is not the std::out_of_range thrown";
    }
    EXPECT_TRUE(reached_original) << "no nested exception";
  } catch (...) {
    ADD_FAILURE() << "parallel_apply threw something other than tandem::Error";
  }

  // Nothing is left broken: the next call works, on the same workers.
  auto fresh = Probes(devices);
  std::vector<std::vector<Tensor>> outputs =
      parallel_apply(AsModules(fresh), Inputs(devices), devices);
  ASSERT_EQ(outputs.size(), 4u);
  EXPECT_THAT(outputs[3][0].to_vector<float>(), ElementsAre(120, 124));
}

TEST_F(ParallelApplyTest, SeveralFailingReplicasReportTheFirst) {
  const std::vector<Device> devices = CpuDevices(3);
  auto probes = Probes(devices);
  probes[1]->throw_what = "one";
  probes[2]->throw_what = "two";
  EXPECT_THAT(
      testing::ErrorOf([&] { parallel_apply(AsModules(probes), Inputs(devices), devices); }),
      StartsWith("Caught std::out_of_range in replica 1 on device cpu:1: one"));
}

// A replica that stopped only because another failed (PeerReplicaFailed) is not the cause.
TEST_F(ParallelApplyTest, TheCauseIsReportedBeforeAReplicaThatStoppedForIt) {
  const std::vector<Device> devices = CpuDevices(3);
  const auto run = [&](bool peer_failures) {
    return testing::ErrorOf([&] {
      ParallelRun(devices, [&](size_t i) -> std::vector<Tensor> {
        if (i == 2) TANDEM_FAIL("the cause");
        if (peer_failures) throw PeerReplicaFailed("replica 2 failed");
        return {};
      });
    });
  };
  EXPECT_THAT(run(true),
              StartsWith("Caught tandem::Error in replica 2 on device cpu:2: the cause"));
  EXPECT_THAT(run(false),
              StartsWith("Caught tandem::Error in replica 2 on device cpu:2: the cause"));
  EXPECT_THAT(testing::ErrorOf([&] {
                ParallelRun(devices, [](size_t i) -> std::vector<Tensor> {
                  throw PeerReplicaFailed("only peers");
                });
              }),
              StartsWith("Caught tandem::parallel::PeerReplicaFailed in replica 0"));
}

TEST_F(ParallelApplyTest, ASingleReplicaIsWrappedTheSameWay) {
  const std::vector<Device> devices = {Device::Cpu(2)};
  auto probes = Probes(devices);
  probes[0]->throw_what = "alone";
  EXPECT_THAT(
      testing::ErrorOf([&] { parallel_apply(AsModules(probes), Inputs(devices), devices); }),
      StartsWith("Caught std::out_of_range in replica 0 on device cpu:2: alone"));
}

TEST_F(ParallelApplyTest, ATandemErrorAndANonStandardExceptionAreNamedToo) {
  const std::vector<Device> devices = CpuDevices(2);
  EXPECT_THAT(
      testing::ErrorOf([&] {
        ParallelRun(devices, [](size_t i) -> std::vector<Tensor> {
          TANDEM_CHECK(i == 0, "replica ", i, " is unhappy");
          return {};
        });
      }),
      StartsWith("Caught tandem::Error in replica 1 on device cpu:1: replica 1 is unhappy"));
  EXPECT_THAT(testing::ErrorOf([&] {
                ParallelRun(devices, [](size_t i) -> std::vector<Tensor> {
                  if (i == 0) throw 42;
                  return {};
                });
              }),
              StartsWith("Caught unknown exception in replica 0 on device cpu:0"));
}

TEST_F(ParallelApplyTest, ParallelRunReturnsResultsInOrder) {
  const std::vector<Device> devices = CpuDevices(8);
  std::vector<std::vector<Tensor>> results = ParallelRun(devices, [&](size_t i) {
    DeviceWorker* worker = DeviceWorker::Current();
    EXPECT_TRUE(worker != nullptr && worker->device() == devices[i]) << "replica " << i;
    return std::vector<Tensor>{full({1}, static_cast<double>(i)), full({2}, 2.0 * i)};
  });
  ASSERT_EQ(results.size(), 8u);
  for (size_t i = 0; i < results.size(); ++i) {
    ASSERT_EQ(results[i].size(), 2u);
    EXPECT_EQ(results[i][0].item(), static_cast<double>(i));
    EXPECT_THAT(results[i][1].to_vector<float>(), ElementsAre(2.0f * i, 2.0f * i));
  }
}

TEST_F(ParallelApplyTest, CalledFromADeviceWorkerRunsThatWorkersPartInline) {
  // Submitted to cpu:0's worker, which is then busy running this task: its replica must run
  // right there instead of queueing behind the task (which would never finish).
  const std::vector<Device> devices = CpuDevices(3);
  std::future<std::vector<Device>> ran = DeviceWorker::For(Device::Cpu(0)).Submit([&devices] {
    std::vector<Device> where(devices.size(), Device::Cuda(9));  // "not on a worker"
    ParallelRun(devices, [&where](size_t i) {
      DeviceWorker* worker = DeviceWorker::Current();
      if (worker != nullptr) where[i] = worker->device();
      return std::vector<Tensor>{};
    });
    return where;
  });
  EXPECT_THAT(ran.get(), ElementsAre(Device::Cpu(0), Device::Cpu(1), Device::Cpu(2)));
}

TEST_F(ParallelApplyTest, Errors) {
  const std::vector<Device> devices = CpuDevices(2);
  auto modules = AsModules(Probes(devices));
  EXPECT_THAT(testing::ErrorOf([&] { parallel_apply(modules, {{}}, devices); }),
              HasSubstr("expected one input list per module but got 2 modules and 1 input lists"));
  EXPECT_THAT(testing::ErrorOf([&] { parallel_apply(modules, Inputs(devices), CpuDevices(3)); }),
              HasSubstr("expected one device per module but got 2 modules and 3 devices"));
  EXPECT_THAT(testing::ErrorOf([&] { parallel_apply({}, {}); }),
              HasSubstr("expected at least one module but got none"));
  modules[1] = nullptr;
  EXPECT_THAT(testing::ErrorOf([&] { parallel_apply(modules, Inputs(devices), devices); }),
              HasSubstr("module 1 is null"));
}

}  // namespace
}  // namespace tandem::parallel
