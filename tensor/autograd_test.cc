#include "tensor/autograd.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "tensor/tensor.h"
#include "tensor/worker.h"

namespace tandem {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

Tensor Param(std::vector<float> values, Device device = Device::Cpu(0)) {
  const int64_t n = static_cast<int64_t>(values.size());
  return from_vector(values, {n}, TensorOptions().device(device).requires_grad(true));
}

// The identity, with a backward that calls `hook` first.
Tensor Probe(const Tensor& x, std::function<void()> hook) {
  Tensor out = x.detach().clone();
  RecordOp("ProbeBackward", {x}, out, [hook](const Tensor& g) {
    hook();
    return std::vector<Tensor>{g};
  });
  return out;
}

class AutogradTest : public ::testing::Test {
 protected:
  void SetUp() override { SetCpuDeviceCount(2); }
};

TEST_F(AutogradTest, GradientsFlowThroughViewsIntoLeaves) {
  Tensor w = Param({1, 2, 3, 4, 5, 6});
  Tensor m = w.view({2, 3});
  // Sum of the transposed middle column, times 2, via a narrow and an expand.
  Tensor picked = m.t().narrow(0, 1, 1).expand({2, 2}).contiguous();
  picked.backward(ones({2, 2}));
  EXPECT_THAT(w.grad().to_vector<float>(), ElementsAre(0, 2, 0, 0, 2, 0));
  EXPECT_TRUE(w.is_leaf());
  EXPECT_FALSE(picked.is_leaf());
  EXPECT_EQ(picked.grad_fn()->name(), "ContiguousBackward");
}

TEST_F(AutogradTest, GradientsAccumulateAcrossPassesAndUses) {
  Tensor w = Param({1, 2});
  Tensor twice = cat({w, w});  // w used twice in one graph
  twice.backward(from_vector(std::vector<float>{1, 2, 3, 4}, {4}));
  EXPECT_THAT(w.grad().to_vector<float>(), ElementsAre(4, 6));
  w.narrow(0, 0, 1).backward(ones({1}));
  EXPECT_THAT(w.grad().to_vector<float>(), ElementsAre(5, 6));
  w.set_grad(Tensor());
  EXPECT_FALSE(w.grad().defined());
}

TEST_F(AutogradTest, NoGradGuardStopsRecording) {
  Tensor w = Param({1});
  {
    NoGradGuard guard;
    EXPECT_FALSE(GradMode::IsEnabled());
    EXPECT_FALSE(w.view({1, 1}).requires_grad());
  }
  EXPECT_TRUE(GradMode::IsEnabled());
  EXPECT_TRUE(w.view({1, 1}).requires_grad());
}

TEST_F(AutogradTest, BackwardNeedsAGradientForNonScalars) {
  Tensor w = Param({1, 2});
  Tensor v = w.view({2, 1});
  try {
    v.backward();
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("a gradient must be given for a tensor of shape [2, 1]"));
  }
  EXPECT_THROW(zeros({1}).backward(), Error);
  EXPECT_THROW(v.backward(ones({3})), Error);
}

TEST_F(AutogradTest, ToDeviceIsDifferentiable) {
  Tensor w = Param({1, 2, 3});
  Tensor moved = w.to(Device::Cpu(1));
  EXPECT_EQ(moved.grad_fn()->device(), Device::Cpu(1));
  moved.backward(from_vector(std::vector<float>{1, 2, 3}, {3}, Device::Cpu(1)));
  EXPECT_EQ(w.grad().device(), Device::Cpu(0));
  EXPECT_THAT(w.grad().to_vector<float>(), ElementsAre(1, 2, 3));
}

TEST_F(AutogradTest, ExceptionsInBackwardReachTheCallerWithTheNode) {
  Tensor w = Param({1, 2});
  Tensor out = Probe(w.to(Device::Cpu(1)), [] { throw Error("replica exploded"); });
  try {
    out.backward(ones({2}, Device::Cpu(1)));
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("backward failed in ProbeBackward on cpu:1"));
    EXPECT_THAT(e.what(), HasSubstr("replica exploded"));
  }
  EXPECT_FALSE(w.grad().defined());
}

// Two branches on two logical devices: each branch's backward waits until the other has
// started. If the engine ran them one after the other, neither would see the other.
TEST_F(AutogradTest, DevicesRunTheirPartsOfBackwardInParallel) {
  Tensor w = Param({1, 2, 3, 4});
  std::atomic<int> arrived{0};
  std::atomic<bool> saw_other[2] = {{false}, {false}};
  auto rendezvous = [&](int me) {
    return [&, me] {
      ++arrived;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (arrived.load() < 2 && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
      saw_other[me] = arrived.load() == 2;
      EXPECT_EQ(DeviceWorker::Current()->device(), Device::Cpu(me));
    };
  };
  Tensor a = Probe(w.narrow(0, 0, 2).to(Device::Cpu(0)), rendezvous(0));
  Tensor b = Probe(w.narrow(0, 2, 2).to(Device::Cpu(1)), rendezvous(1));
  Tensor joined = cat({a, b.to(Device::Cpu(0))});
  joined.backward(ones({4}));
  EXPECT_TRUE(saw_other[0]);
  EXPECT_TRUE(saw_other[1]);
  EXPECT_THAT(w.grad().to_vector<float>(), ElementsAre(1, 1, 1, 1));
}

TEST_F(AutogradTest, ConcurrentAccumulationIntoOneLeafIsSafe) {
  Tensor w = Param(std::vector<float>(1000, 0.0f));
  std::vector<Tensor> branches;
  for (int i = 0; i < 16; ++i) branches.push_back(w.to(Device::Cpu(i % 2)).to(Device::Cpu(0)));
  cat(branches).backward(ones({16000}));
  const std::vector<float> grad = w.grad().to_vector<float>();
  for (float g : grad) ASSERT_EQ(g, 16.0f);
}

TEST_F(AutogradTest, BackwardFromInsideADeviceWorkerDoesNotDeadlock) {
  Tensor w = Param({1, 2});
  auto done = DeviceWorker::For(Device::Cpu(0)).Submit([&] {
    Tensor y = w.to(Device::Cpu(1)).to(Device::Cpu(0));
    y.backward(ones({2}));
    return w.grad().to_vector<float>();
  });
  ASSERT_EQ(done.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  EXPECT_THAT(done.get(), ElementsAre(1, 1));
}

TEST_F(AutogradTest, GradReadyHooksFireAfterAccumulation) {
  Tensor w = Param({1, 2});
  std::vector<float> seen;
  AddGradAccumulatedHook(w, [&](const Tensor& g) { seen = g.to_vector<float>(); });
  w.view({2}).backward(from_vector(std::vector<float>{3, 4}, {2}));
  EXPECT_THAT(seen, ElementsAre(3, 4));
  EXPECT_THROW(AddGradAccumulatedHook(w.view({2}), [](const Tensor&) {}), Error);
}

TEST_F(AutogradTest, BranchesWithoutGradientDoNotStallOthers) {
  // `b` contributes no gradient (its backward returns undefined); `a` still reaches w.
  Tensor w = Param({1, 2});
  Tensor a = w.view({2});
  Tensor b = w.view({2});
  Tensor dead = b.detach().clone();
  RecordOp("NoGradient", {b}, dead, [](const Tensor&) { return std::vector<Tensor>{Tensor()}; });
  cat({a, dead}).backward(ones({4}));
  EXPECT_THAT(w.grad().to_vector<float>(), ElementsAre(1, 1));
}

}  // namespace
}  // namespace tandem
