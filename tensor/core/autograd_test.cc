#include "tensor/core/autograd.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>

#include "tensor/runtime/allocator.h"
#include "tensor/runtime/devices.h"
#include "tensor/runtime/threads.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace tandem {
namespace {

using ::tandem::testing::ErrorOf;
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

// The identity from one input onto `devices`, one output per device, as one node (the shape
// of DataParallel's broadcast). Backward sums the gradients that reached each slot, moved to
// the input's device; `seen` records, per slot, the first value of its gradient (or -1 when
// the slot got none), so a test can check that gradients arrive in the right slots.
class FanOut final : public Node {
 public:
  FanOut(Device source, std::vector<Device> devices, std::vector<float>* seen)
      : Node(source, std::move(devices)), seen_(seen) {}
  std::vector<Tensor> Apply(std::vector<Tensor> grads) override {
    Tensor total;
    seen_->assign(grads.size(), -1.0f);
    for (size_t i = 0; i < grads.size(); ++i) {
      if (!grads[i].defined()) continue;
      EXPECT_EQ(grads[i].device(), output_device(static_cast<int>(i)));
      (*seen_)[i] = grads[i].to_vector<float>()[0];
      Tensor here = grads[i].to(device());
      total = total.defined() ? add(total, here) : here;
    }
    return {total};
  }
  std::string name() const override { return "FanOut"; }

 private:
  std::vector<float>* seen_;
};

std::vector<Tensor> Fan(const Tensor& x, const std::vector<Device>& devices,
                        std::vector<float>* seen) {
  std::vector<Tensor> outs;
  for (Device d : devices) outs.push_back(x.detach().to(d));
  RecordMultiOutputOp(std::make_shared<FanOut>(x.device(), devices, seen), {x}, outs);
  return outs;
}

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

TEST_F(AutogradTest, AFreshGradientBecomesGradWithoutACopy) {
  Tensor w = Param({1, 2, 3});
  const void* produced = nullptr;
  Tensor y = w.detach();
  RecordOp("FreshGradient", {w}, y, [&produced](const Tensor& grad) {
    Tensor fresh = mul(grad, 2.0);
    produced = fresh.raw_data();
    return std::vector<Tensor>{fresh};
  });
  y.backward(ones({3}));
  EXPECT_THAT(w.grad().to_vector<float>(), ElementsAre(2, 2, 2));
  EXPECT_EQ(w.grad().raw_data(), produced);  // the node's output itself, as PyTorch steals it
}

TEST_F(AutogradTest, AGradientHeldElsewhereIsCopiedIntoGrad) {
  // The node keeps a handle on (a view of) its output: .grad must not alias it, or writing
  // one would change the other.
  for (bool view : {false, true}) {
    Tensor w = Param({1, 2, 3});
    Tensor kept;
    Tensor y = w.detach();
    RecordOp("KeptGradient", {w}, y, [&kept, view](const Tensor& grad) {
      Tensor fresh = mul(grad, 2.0);
      kept = view ? fresh.view({3, 1}) : fresh;
      return std::vector<Tensor>{fresh};
    });
    y.backward(ones({3}));
    kept.fill_(7.0);
    EXPECT_THAT(w.grad().to_vector<float>(), ElementsAre(2, 2, 2)) << "view: " << view;
    w.grad().add_(ones({3}));
    EXPECT_THAT(kept.reshape({3}).to_vector<float>(), ElementsAre(7, 7, 7)) << "view: " << view;
  }
  // A gradient given to backward() for a leaf is the caller's tensor: copied too.
  Tensor w = Param({1, 2});
  Tensor g = from_vector(std::vector<float>{5, 6}, {2});
  w.backward(g);
  g.fill_(0.0);
  EXPECT_THAT(w.grad().to_vector<float>(), ElementsAre(5, 6));
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

// A leaf's accumulator runs as soon as its gradient is ready, before the nodes that became
// ready with it, even when it is older than all of them (kept alive by an earlier graph):
// DistributedDataParallel's buckets launch from its hooks while backward goes on.
TEST_F(AutogradTest, AccumulatorsRunAsSoonAsTheirGradientIsReady) {
  Tensor w1 = Param({1, 2});
  Tensor w2 = Param({3, 4});
  const Tensor earlier_graph = mul(w2, 2.0);  // creates w2's accumulator now, first of all
  std::vector<std::string> events;
  AddGradAccumulatedHook(w2, [&](const Tensor&) { events.push_back("w2's hook"); });
  Tensor first = w1.detach().clone();
  RecordOp("FirstLayer", {w1}, first, [&](const Tensor& g) {
    events.push_back("first layer's backward");
    return std::vector<Tensor>{g};
  });
  mul(first, w2).sum().backward();
  EXPECT_THAT(events, ElementsAre("w2's hook", "first layer's backward"));
  EXPECT_THAT(w2.grad().to_vector<float>(), ElementsAre(1, 2));
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

TEST_F(AutogradTest, MultiOutputNodeGetsEachGradientInItsSlot) {
  SetCpuDeviceCount(3);
  Tensor w = Param({1, 1});
  std::vector<float> seen;
  std::vector<Tensor> outs = Fan(w, {Device::Cpu(0), Device::Cpu(1), Device::Cpu(2)}, &seen);
  ASSERT_EQ(outs.size(), 3u);
  EXPECT_EQ(outs[1].grad_fn(), outs[2].grad_fn());
  // Slot 0 gets 10, slot 1 nothing, slot 2 gets 30 + 300 (summed by the engine).
  Tensor total = add(mul(outs[0], 10.0).to(Device::Cpu(0)),
                     add(mul(outs[2], 30.0), mul(outs[2], 300.0)).to(Device::Cpu(0)));
  total.sum().backward();
  EXPECT_THAT(seen, ElementsAre(10.0f, -1.0f, 330.0f));
  EXPECT_THAT(w.grad().to_vector<float>(), ElementsAre(340, 340));
}

// Eight devices' gradients meet in one set of leaves, through one multi-output node and
// through eight separate copies, and agree with the same computation on one device.
TEST_F(AutogradTest, EightDevicesMeetingInOneLeafMatchOneDevice) {
  SetCpuDeviceCount(8);
  const std::vector<float> init = {0.5f, -1.0f, 2.0f, 0.25f};
  std::vector<Device> devices;
  for (int i = 0; i < 8; ++i) devices.push_back(Device::Cpu(i));
  auto loss_on = [&](const Tensor& w, const std::vector<Tensor>& copies) {
    Tensor total;
    for (size_t i = 0; i < copies.size(); ++i) {
      Tensor part = mul(copies[i], copies[i]).sum() * static_cast<double>(i + 1);
      part = part.to(Device::Cpu(0));
      total = total.defined() ? add(total, part) : part;
    }
    return total;
  };
  Tensor single = Param(init);
  std::vector<Tensor> same_device(8, single);
  loss_on(single, same_device).backward();

  Tensor fanned = Param(init);
  std::vector<float> seen;
  loss_on(fanned, Fan(fanned, devices, &seen)).backward();

  Tensor copied = Param(init);
  std::vector<Tensor> copies;
  for (Device d : devices) copies.push_back(copied.to(d));
  loss_on(copied, copies).backward();

  const std::vector<float> expected = single.grad().to_vector<float>();
  EXPECT_THAT(fanned.grad().to_vector<float>(),
              ::testing::Pointwise(::testing::FloatEq(), expected));
  EXPECT_THAT(copied.grad().to_vector<float>(),
              ::testing::Pointwise(::testing::FloatEq(), expected));
}

TEST_F(AutogradTest, CallbacksRunOnceAfterEveryNode) {
  Tensor w = Param({1, 2});
  std::atomic<int> nodes_run{0};
  int callbacks_run = 0;
  int nodes_seen_by_callback = -1;
  Tensor a = Probe(w.to(Device::Cpu(1)), [&] {
    ++nodes_run;
    QueueCallback([&] {
      ++callbacks_run;
      nodes_seen_by_callback = nodes_run.load();
      EXPECT_TRUE(w.grad().defined());  // AccumulateGrad ran before
    });
  });
  Tensor b = Probe(w.to(Device::Cpu(0)), [&] { ++nodes_run; });
  cat({a.to(Device::Cpu(0)), b}).backward(ones({4}));
  EXPECT_EQ(callbacks_run, 1);
  EXPECT_EQ(nodes_seen_by_callback, 2);
  EXPECT_THAT(w.grad().to_vector<float>(), ElementsAre(2, 2));
  EXPECT_FALSE(InBackwardPass());
  EXPECT_THROW(QueueCallback([] {}), Error);
}

TEST_F(AutogradTest, CallbacksMayQueueCallbacksAndAreSkippedOnFailure) {
  Tensor w = Param({1});
  std::vector<int> order;
  Tensor ok = Probe(w, [&] {
    QueueCallback([&] {
      order.push_back(1);
      QueueCallback([&] { order.push_back(2); });
    });
  });
  ok.backward(ones({1}));
  EXPECT_THAT(order, ElementsAre(1, 2));

  order.clear();
  Tensor bad = Probe(Probe(w, [] { throw Error("late"); }),
                     [&] { QueueCallback([&] { order.push_back(3); }); });
  EXPECT_THROW(bad.backward(ones({1})), Error);
  EXPECT_TRUE(order.empty());
}

TEST_F(AutogradTest, TheOriginalExceptionTypeIsNestedInTheError) {
  Tensor w = Param({1, 2});
  Tensor out = Probe(w.to(Device::Cpu(1)), [] { throw std::out_of_range("index 7 of 3"); });
  try {
    out.backward(ones({2}, Device::Cpu(1)));
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("backward failed in ProbeBackward on cpu:1: index 7 of 3"));
    try {
      std::rethrow_if_nested(e);
      FAIL() << "no nested exception";
    } catch (const std::out_of_range& original) {
      EXPECT_STREQ(original.what(), "index 7 of 3");
    }
  }
}

TEST_F(AutogradTest, WorkerTasksRunWithTheCallersGradMode) {
  Tensor w = Param({1});
  auto records = [&] { return w.view({1}).requires_grad(); };
  EXPECT_TRUE(DeviceWorker::For(Device::Cpu(1)).Submit(records).get());
  {
    NoGradGuard no_grad;
    EXPECT_FALSE(DeviceWorker::For(Device::Cpu(1)).Submit(records).get());
  }
  EXPECT_TRUE(DeviceWorker::For(Device::Cpu(1)).Submit(records).get());
}

// ---- autograd::grad and create_graph (double backward) ---------------------------------------

std::vector<float> Values(const Tensor& t) { return t.detach().to(kFloat32).to_vector<float>(); }

void ExpectNear(const Tensor& t, const std::vector<float>& expected) {
  const std::vector<float> got = Values(t);
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expected[i], 1e-5) << "element " << i;
}

TEST_F(AutogradTest, GradReturnsGradientsAndLeavesDotGradAndHooksAlone) {
  Tensor x = Param({1, 2, 3});
  int hook_calls = 0;
  AddGradAccumulatedHook(x, [&](const Tensor&) { ++hook_calls; });
  const Tensor y = (x * x * x).sum();
  const std::vector<Tensor> g = autograd::grad({y}, {x}, {}, false, /*retain_graph=*/true);
  ExpectNear(g[0], {3, 12, 27});
  EXPECT_FALSE(g[0].requires_grad());
  EXPECT_FALSE(x.grad().defined());
  EXPECT_EQ(hook_calls, 0);
  y.backward();  // the graph was retained: a later pass over it works, and accumulates
  ExpectNear(x.grad(), {3, 12, 27});
  EXPECT_EQ(hook_calls, 1);
}

TEST_F(AutogradTest, GradOfNonLeavesRunsOnlyWhatTheyNeed) {
  Tensor x = Param({1, 2});
  bool upstream_ran = false;
  const Tensor h = Probe(x * 2.0, [&] { upstream_ran = true; });
  const Tensor y = (h * h).sum();
  const std::vector<Tensor> g = autograd::grad({y}, {h}, {}, false, /*retain_graph=*/true);
  ExpectNear(g[0], {4, 8});    // 2h
  EXPECT_FALSE(upstream_ran);  // nothing past h runs
  // Inputs at several depths, and an input that is a root itself.
  const std::vector<Tensor> both = autograd::grad({y}, {x, h, y});
  ExpectNear(both[0], {8, 16});
  ExpectNear(both[1], {4, 8});
  ExpectNear(both[2], {1});
  EXPECT_TRUE(upstream_ran);
}

TEST_F(AutogradTest, GradRefusesBadArgumentsClearly) {
  Tensor x = Param({1, 2}), unused = Param({5});
  const Tensor y = x * 3.0;
  EXPECT_THAT(ErrorOf([&] {
                autograd::grad({y.sum()}, {x, unused}, {}, false, /*retain_graph=*/true);
              }),
              HasSubstr("grad: input 1 (shape [1]) was not used to compute the outputs, so it "
                        "has no gradient; pass allow_unused = true"));
  const std::vector<Tensor> g =
      autograd::grad({y.sum()}, {x, unused}, {}, false, true, /*allow_unused=*/true);
  ExpectNear(g[0], {3, 3});
  EXPECT_FALSE(g[1].defined());
  EXPECT_THAT(ErrorOf([&] { autograd::grad({y}, {x}); }),
              HasSubstr("grad: output 0 has shape [2]; grad_outputs must give its gradient"));
  EXPECT_THAT(ErrorOf([&] { autograd::grad({y}, {x}, {ones({3})}); }),
              HasSubstr("grad: grad_outputs[0] has shape [3] but output 0 has shape [2]"));
  EXPECT_THAT(ErrorOf([&] { autograd::grad({y}, {x}, {ones({2}).to(kInt64)}); }),
              HasSubstr("grad: grad_outputs[0] is int64 and output 0 is float32"));
  EXPECT_THAT(ErrorOf([&] {
                autograd::grad({y}, {x}, {ones({2}), ones({2})});
              }),
              HasSubstr("grad: 1 outputs but 2 grad_outputs"));
  EXPECT_THAT(ErrorOf([&] { autograd::grad({y.sum()}, {ones({2})}); }),
              HasSubstr("grad: input 0 (shape [2]) does not require grad"));
  EXPECT_THAT(ErrorOf([&] { autograd::grad({ones({1})}, {x}); }),
              HasSubstr("grad: output 0 does not require grad"));
  // A given grad_output is used as it is.
  ExpectNear(autograd::grad({y}, {x}, {from_vector(std::vector<float>{1, -2}, {2})})[0], {3, -6});
}

TEST_F(AutogradTest, HessianVectorProductOfAQuadratic) {
  // f(x) = 0.5 x^T A x + b^T x with symmetric A: the gradient is A x + b, the Hessian A.
  const Tensor a = from_vector(std::vector<float>{2, 1, 0, 1, 3, -1, 0, -1, 4}, {3, 3});
  const Tensor b = from_vector(std::vector<float>{1, -1, 2}, {3});
  Tensor x = Param({0.5f, -1.0f, 2.0f});
  const Tensor f = add(mul(matmul(x, matmul(a, x)), 0.5), matmul(b, x));
  const Tensor g = autograd::grad({f}, {x}, {}, /*create_graph=*/true)[0];
  EXPECT_TRUE(g.requires_grad());
  ExpectNear(g, {1, -5.5, 11});  // A x + b, A x = (0, -4.5, 9)
  const Tensor v = from_vector(std::vector<float>{1, 2, -1}, {3});
  const Tensor hv = autograd::grad({(g * v).sum()}, {x})[0];
  ExpectNear(hv, {4, 8, -6});  // A v
  EXPECT_FALSE(x.grad().defined());
}

TEST_F(AutogradTest, BackwardWithCreateGraphKeepsTheGradientsGraph) {
  Tensor x = Param({1, 2});
  // Two paths into x: the engine's sum of gradients is recorded too.
  const Tensor y = (x * x * x).sum() + (x * x).sum();
  y.backward(Tensor(), /*create_graph=*/true);
  const Tensor first = x.grad();
  ASSERT_TRUE(first.requires_grad());
  ExpectNear(first, {5, 16});  // 3x^2 + 2x
  const Tensor second = autograd::grad({first.sum()}, {x}, {}, false, /*retain_graph=*/true)[0];
  ExpectNear(second, {8, 14});  // 6x + 2
  // A second create_graph pass adds out of place, keeping both graphs.
  y.backward(Tensor(), /*create_graph=*/true);
  ExpectNear(x.grad(), {10, 32});
  ExpectNear(autograd::grad({x.grad().sum()}, {x})[0], {16, 28});
  ExpectNear(first, {5, 16});
  x.set_grad(Tensor());  // .grad holding x's own graph is a reference cycle (as in PyTorch)
}

TEST_F(AutogradTest, AGradientPenaltyAcrossDevices) {
  // x on device 0, its square computed on device 1: the create_graph pass copies gradients
  // across devices with recorded copies, so the penalty's gradient crosses back.
  Tensor x = Param({1, -2, 3});
  const Tensor y = (x.to(Device::Cpu(1)) * x.to(Device::Cpu(1))).sum().to(Device::Cpu(0));
  const Tensor g = autograd::grad({y}, {x}, {}, /*create_graph=*/true)[0];
  ExpectNear(g, {2, -4, 6});
  (y + (g * g).sum()).backward();  // d/dx (x^2 + 4 x^2) = 10 x
  ExpectNear(x.grad(), {10, -20, 30});
}

TEST_F(AutogradTest, NodesWithoutDoubleBackwardRefuseOnlyWhenReached) {
  Tensor x = Param({1, 2});
  const Tensor y = Probe(x * x, [] {}).sum();  // ProbeBackward: no double backward support
  const Tensor g = autograd::grad({y}, {x}, {}, /*create_graph=*/true)[0];
  ExpectNear(g, {2, 4});
  EXPECT_THAT(ErrorOf([&] { g.sum().backward(); }),
              HasSubstr("second derivative of ProbeBackward is not supported"));
  // Without create_graph, nothing changes for such a node.
  ExpectNear(autograd::grad({y}, {x})[0], {2, 4});
}

TEST_F(AutogradTest, ASecondPassThroughTheGraphNeedsRetainGraph) {
  Tensor x = Param({1, 2});
  const Tensor y = (x * x).sum();
  y.backward(Tensor(), /*create_graph=*/false, /*retain_graph=*/true);
  y.backward();  // the graph was retained for it
  ExpectNear(x.grad(), {4, 8});
  EXPECT_THAT(ErrorOf([&] { y.backward(); }),
              HasSubstr("Trying to backward through the graph a second time: SumBackward"));
  EXPECT_THAT(ErrorOf([&] { y.backward(); }), HasSubstr("retain_graph=true"));
  const Tensor z = (x * x).sum();
  ExpectNear(autograd::grad({z}, {x})[0], {2, 4});
  EXPECT_THAT(ErrorOf([&] { autograd::grad({z}, {x}); }), HasSubstr("a second time"));
  // create_graph retains by default, as in PyTorch.
  const Tensor w = (x * x * x).sum();
  const Tensor g = autograd::grad({w}, {x}, {}, /*create_graph=*/true)[0];
  ExpectNear(autograd::grad({w}, {x})[0], {3, 12});
  ExpectNear(g, {3, 12});
}

TEST_F(AutogradTest, SavedTensorsAreFreedAsBackwardGoesUnlessRetained) {
  // A chain of exp (each saves its output, 1 MB) whose loss stays alive after backward: what
  // the chain saved is freed by the pass itself, not when the graph goes.
  const Device cpu = Device::Cpu(0);
  const auto in_use_after_backward = [&](bool retain_graph) {
    Tensor x = randn({256, 1024});
    x.set_requires_grad(true);
    Tensor h = x;
    for (int i = 0; i < 8; ++i) h = exp(mul(h, 0.1));
    const Tensor loss = h.sum();
    loss.backward(Tensor(), /*create_graph=*/false, retain_graph);
    x.set_grad(Tensor());
    h = Tensor();
    return GetMemoryStats(cpu).in_use_bytes;
  };
  const int64_t before = GetMemoryStats(cpu).in_use_bytes;
  const int64_t retained = in_use_after_backward(true) - before;
  const int64_t released = in_use_after_backward(false) - before;
  // Both hold x (1 MB: the graph's accumulator keeps the leaf). Retained: the 8 outputs of exp
  // too; released: none of them.
  EXPECT_GE(retained, 9 * (1 << 20)) << retained;
  EXPECT_LT(released, 2 * (1 << 20)) << released;
}

}  // namespace
}  // namespace tandem
