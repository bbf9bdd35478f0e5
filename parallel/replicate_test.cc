// replicate/Replicator and the differentiable Broadcast: replicas carry the original's
// values on their devices, their gradients reduce-add into the original, buckets follow
// reverse registration order, each call replicates the module as it is then, tied tensors
// stay tied, and buffers that require grad are broadcast differentiably.
#include "parallel/replicate.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "nn/nn.h"
#include "tensor/testing.h"

namespace tandem::parallel {
namespace {

using ::tandem::testing::ErrorOf;
using ::tandem::testing::MaxAbsDiff;
using ::testing::HasSubstr;

class ReplicateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetCpuDeviceCount(4);
    manual_seed(4);
    model_ = std::make_shared<nn::Sequential>(nn::Linear(5, 7), nn::ReLU(), nn::Linear(7, 3));
  }
  std::shared_ptr<nn::Sequential> model_;
};

TEST_F(ReplicateTest, ReplicasHoldTheOriginalsValuesOnTheirDevices) {
  std::vector<std::shared_ptr<nn::Module>> replicas = replicate(model_, CpuDevices(3));
  ASSERT_EQ(replicas.size(), 3u);
  const std::vector<Tensor> original = model_->parameters();
  for (int d = 0; d < 3; ++d) {
    EXPECT_NE(replicas[d].get(), model_.get());
    const std::vector<Tensor> params = replicas[d]->parameters();
    ASSERT_EQ(params.size(), original.size());
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_EQ(params[i].device(), Device::Cpu(d));
      EXPECT_EQ(MaxAbsDiff(params[i], original[i]), 0.0);
      EXPECT_FALSE(params[i].is_leaf());  // a broadcast output, with a path back
      EXPECT_EQ(params[i].grad_fn()->name(), "BroadcastBackward");
    }
  }
  EXPECT_EQ(replicas[1]->ToString(), model_->ToString());
}

TEST_F(ReplicateTest, GradientsOfEveryReplicaReduceIntoTheOriginal) {
  std::vector<std::shared_ptr<nn::Module>> replicas = replicate(model_, CpuDevices(3));
  Tensor total;
  for (int d = 0; d < 3; ++d) {
    Tensor x = ones({2, 5}, Device::Cpu(d)) * static_cast<double>(d + 1);
    Tensor part = replicas[d]->forward_tensors({x})[0].sum().to(Device::Cpu(0));
    total = total.defined() ? add(total, part) : part;
  }
  total.backward();
  // The same sum computed by the original alone.
  auto reference = std::static_pointer_cast<nn::Sequential>(model_->clone());
  Tensor expected;
  for (int d = 0; d < 3; ++d) {
    Tensor part = reference->forward(ones({2, 5}) * static_cast<double>(d + 1)).sum();
    expected = expected.defined() ? add(expected, part) : part;
  }
  expected.backward();
  const std::vector<Tensor> got = model_->parameters();
  const std::vector<Tensor> want = reference->parameters();
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(got[i].grad().defined()) << i;
    EXPECT_LE(MaxAbsDiff(got[i].grad(), want[i].grad()), 1e-5) << i;
  }
}

TEST_F(ReplicateTest, DetachOrNoGradBuildsNoGraph) {
  for (auto replicas : {replicate(model_, CpuDevices(2), /*detach=*/true), [&] {
                          NoGradGuard no_grad;
                          return replicate(model_, CpuDevices(2));
                        }()}) {
    for (const auto& replica : replicas) {
      for (const Tensor& p : replica->parameters()) EXPECT_EQ(p.grad_fn(), nullptr);
    }
  }
}

TEST_F(ReplicateTest, BroadcastBucketsFollowReverseOrder) {
  const std::vector<Tensor> params = model_->parameters();  // 7x5, 7, 3x7, 3
  // 100 bytes per bucket: 3 (12 B) + 3x7 (84 B) fit together; 7 (28 B) alone; 7x5 alone.
  std::vector<std::vector<Tensor>> copies = Broadcast(params, CpuDevices(2), 100);
  EXPECT_EQ(copies[0][3].grad_fn(), copies[0][2].grad_fn());
  EXPECT_NE(copies[0][2].grad_fn(), copies[0][1].grad_fn());
  EXPECT_NE(copies[0][1].grad_fn(), copies[0][0].grad_fn());
  EXPECT_EQ(copies[1][3].grad_fn(), copies[0][3].grad_fn());  // one node, all devices
  EXPECT_EQ(copies[0][3].grad_fn()->num_outputs(), 4);        // 2 tensors x 2 devices
}

TEST_F(ReplicateTest, AnUnusedCopyStillGetsTheOthersGradient) {
  const std::vector<Tensor> params = model_->parameters();
  std::vector<std::vector<Tensor>> copies = Broadcast(params, CpuDevices(2));
  // Only device 1's copy of the last bias is used.
  copies[1][3].sum().backward();
  EXPECT_LE(MaxAbsDiff(params[3].grad(), ones({3})), 0.0);
  EXPECT_FALSE(params[0].grad().defined());
}

TEST_F(ReplicateTest, EveryCallReplicatesTheModuleAsItIsThen) {
  Replicator replicator(model_, CpuDevices(2));
  std::vector<std::shared_ptr<nn::Module>> first = replicator.Replicate();
  {
    NoGradGuard no_grad;
    model_->parameters()[0].fill_(0.5);  // an optimizer step, say
  }
  model_->push_back(nn::Tanh());  // no new parameter: the names, shapes and dtypes still match
  std::vector<std::shared_ptr<nn::Module>> second = replicator.Replicate();
  EXPECT_NE(first[1].get(), second[1].get());
  EXPECT_EQ(MaxAbsDiff(second[1]->parameters()[0], full({7, 5}, 0.5)), 0.0);
  ASSERT_EQ(second[1]->children().size(), 4u);
  const Tensor x = randn({2, 5});
  EXPECT_LE(MaxAbsDiff(second[1]->forward_tensors({x.to(Device::Cpu(1))})[0], model_->forward(x)),
            1e-6);
  EXPECT_TRUE(second[1]->is_replica());
  EXPECT_TRUE(second[1]->children()[0]->is_replica());
  EXPECT_FALSE(model_->is_replica());
}

// Two layers sharing one weight (registered under two names).
class Tied : public nn::Cloneable<Tied> {
 public:
  Tied() { reset(); }
  void reset() override {
    first_ = register_module("first", nn::Linear(4, 4, /*bias=*/false));
    second_ = register_module("second", nn::Linear(4, 4, /*bias=*/false));
    second_->replace_parameter("weight", first_->weight());
  }
  Tensor forward(const Tensor& x) { return second_->forward(first_->forward(x)); }

 private:
  std::shared_ptr<nn::Linear> first_, second_;
};

TEST_F(ReplicateTest, TiedParametersStayTiedInEveryReplica) {
  auto tied = std::make_shared<Tied>();
  ASSERT_EQ(tied->parameters().size(), 1u);
  std::vector<std::shared_ptr<nn::Module>> replicas = replicate(tied, CpuDevices(2));
  for (const auto& replica : replicas) {
    const Tensor first = replica->parameter("first.weight");
    const Tensor second = replica->parameter("second.weight");
    EXPECT_EQ(first.impl(), second.impl());
    EXPECT_NE(first.impl(), tied->parameter("first.weight").impl());
  }
  EXPECT_EQ(replicas[1]->parameter("second.weight").device(), Device::Cpu(1));
  // Both uses of the weight, in both replicas, reach the one original.
  const Tensor x = randn({2, 4});
  Tensor total =
      add(replicas[0]->forward_tensors({x})[0].sum(),
          replicas[1]->forward_tensors({x.to(Device::Cpu(1))})[0].sum().to(Device::Cpu(0)));
  total.backward();
  Tensor weight = tied->parameter("first.weight");
  const Tensor grad = weight.grad().clone();
  weight.set_grad(Tensor());
  (tied->forward(x).sum() * 2.0).backward();
  EXPECT_LE(MaxAbsDiff(grad, weight.grad()), 1e-5);
}

class WithGradBuffer : public nn::Cloneable<WithGradBuffer> {
 public:
  WithGradBuffer() { reset(); }
  void reset() override {
    Tensor t = ones({3});
    t.set_requires_grad(true);
    t_ = register_buffer("t", t);
  }
  Tensor forward(const Tensor& x) { return x * *t_; }

 private:
  nn::Buffer t_;
};

TEST_F(ReplicateTest, BuffersThatRequireGradAreBroadcastDifferentiably) {
  auto module = std::make_shared<WithGradBuffer>();
  std::vector<std::shared_ptr<nn::Module>> replicas = replicate(module, CpuDevices(3));
  const Tensor x = from_vector(std::vector<float>{1, 2, 3}, {3});
  Tensor total;
  for (size_t d = 0; d < replicas.size(); ++d) {
    const Tensor copy = replicas[d]->buffer("t");
    EXPECT_TRUE(copy.requires_grad());
    EXPECT_EQ(copy.device(), Device::Cpu(static_cast<int>(d)));
    Tensor part = replicas[d]->forward_tensors({x.to(copy.device())})[0].sum().to(Device::Cpu(0));
    total = total.defined() ? add(total, part) : part;
  }
  total.backward();
  ASSERT_TRUE(module->buffer("t").grad().defined());
  EXPECT_EQ(MaxAbsDiff(module->buffer("t").grad(), from_vector(std::vector<float>{3, 6, 9}, {3})),
            0.0);
  // detach: no gradient path, replica 0 holds the original itself.
  replicas = replicate(module, CpuDevices(2), /*detach=*/true);
  EXPECT_EQ(replicas[0]->buffer("t").impl(), module->buffer("t").impl());
  EXPECT_FALSE(replicas[1]->buffer("t").requires_grad());
}

class Counter : public nn::Cloneable<Counter> {
 public:
  Counter() { reset(); }
  void reset() override {
    fc_ = register_module("fc", nn::Linear(2, 2));
    count_ = register_buffer("count", zeros({1}));
  }
  Tensor forward(const Tensor& x) { return fc_->forward(x); }

 private:
  std::shared_ptr<nn::Linear> fc_;
  nn::Buffer count_;
};

TEST_F(ReplicateTest, BuffersAreCopiedAndReplicaZeroSharesTheOriginals) {
  auto module = std::make_shared<Counter>();
  Replicator replicator(module, CpuDevices(2));
  std::vector<std::shared_ptr<nn::Module>> replicas = replicator.Replicate();
  Tensor original = module->buffer("count");
  EXPECT_TRUE(replicas[0]->buffer("count").shares_storage_with(original));
  EXPECT_FALSE(replicas[1]->buffer("count").shares_storage_with(original));
  EXPECT_EQ(replicas[1]->buffer("count").device(), Device::Cpu(1));
  replicas[0]->buffer("count").fill_(3.0);
  replicas[1]->buffer("count").fill_(7.0);
  EXPECT_EQ(original.item(), 3.0);
  EXPECT_FALSE(replicas[1]->buffer("count").requires_grad());
}

TEST_F(ReplicateTest, Errors) {
  EXPECT_THAT(ErrorOf([&] { replicate(model_, {}); }), HasSubstr("at least one device"));
  EXPECT_THAT(ErrorOf([&] {
                replicate(model_, {Device::Cpu(1), Device::Cpu(1)});
              }),
              HasSubstr("cpu:1 appears more than once"));
  EXPECT_THAT(ErrorOf([&] {
                replicate(model_, {Device::Cpu(1), Device::Cpu(0)});
              }),
              HasSubstr("on cpu:1 (devices[0]) but 0.weight is on cpu:0"));
  Replicator replicator(model_, CpuDevices(2));
  EXPECT_THAT(ErrorOf([&] { replicator.Replicate(3); }), HasSubstr("asked for 3 replicas"));
}

}  // namespace
}  // namespace tandem::parallel
