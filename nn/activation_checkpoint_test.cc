#include "nn/activation_checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <vector>

#include "nn/nn.h"
#include "nn/test_util.h"
#include "tensor/runtime/allocator.h"
#include "tensor/tensor.h"

namespace tandem::nn {
namespace {

using testing::ErrorOf;
using ::testing::HasSubstr;
using testing::MaxAbsDiff;

// Linear, GELU, dropout (from the default generator, or its own with `seed`), Linear.
struct Block {
  explicit Block(std::optional<uint64_t> seed = std::nullopt)
      : fc1(std::make_shared<Linear>(8, 16)),
        drop(seed ? std::make_shared<Dropout>(0.3, *seed) : std::make_shared<Dropout>(0.3)),
        fc2(std::make_shared<Linear>(16, 8)) {}
  Tensor operator()(const Tensor& x) const {
    return fc2->forward(drop->forward(gelu(fc1->forward(x)))) + x;
  }
  std::vector<Tensor> parameters() const {
    std::vector<Tensor> p = fc1->parameters();
    for (const Tensor& t : fc2->parameters()) p.push_back(t);
    return p;
  }
  std::shared_ptr<Linear> fc1;
  std::shared_ptr<Dropout> drop;
  std::shared_ptr<Linear> fc2;
};

struct Grads {
  Tensor loss, input;
  std::vector<Tensor> params;
};

// Two blocks on x (one checkpointed each, or plain), a loss, backward, from seed 7.
Grads RunBlocks(const Block& a, const Block& b, bool checkpointed,
                const CheckpointOptions& options = {}) {
  manual_seed(7);
  for (const Tensor& p : a.parameters()) Tensor(p).set_grad(Tensor());
  for (const Tensor& p : b.parameters()) Tensor(p).set_grad(Tensor());
  Tensor x = randn({4, 8}).set_requires_grad(true);
  auto call = [&](const Block& block, const Tensor& h) {
    if (!checkpointed) return block(h);
    return checkpoint([&block](const Tensor& in) { return block(in); }, h, options);
  };
  // A chain: every gradient is summed in the same order with and without checkpoints (where
  // two paths meet outside a block, the checkpointed sum associates differently: not bit-equal).
  Tensor y = call(b, call(a, x));
  Tensor loss = (y * y).sum();
  loss.backward();
  Grads g{loss, x.grad(), {}};
  for (const Tensor& p : a.parameters()) g.params.push_back(p.grad());
  for (const Tensor& p : b.parameters()) g.params.push_back(p.grad());
  return g;
}

void ExpectBitEqual(const Grads& plain, const Grads& ckpt) {
  EXPECT_EQ(MaxAbsDiff(plain.loss, ckpt.loss), 0.0);
  EXPECT_EQ(MaxAbsDiff(plain.input, ckpt.input), 0.0);
  ASSERT_EQ(plain.params.size(), ckpt.params.size());
  for (size_t i = 0; i < plain.params.size(); ++i) {
    ASSERT_TRUE(ckpt.params[i].defined()) << "parameter " << i;
    EXPECT_EQ(MaxAbsDiff(plain.params[i], ckpt.params[i]), 0.0) << "parameter " << i;
  }
}

TEST(ActivationCheckpointTest, EqualsPlainWithDropoutFromDefaultGenerator) {
  manual_seed(1);
  Block a, b;
  ExpectBitEqual(RunBlocks(a, b, false), RunBlocks(a, b, true));
}

TEST(ActivationCheckpointTest, EqualsPlainWithDropoutOfItsOwnGenerators) {
  manual_seed(1);
  Block a(11), b(12);
  const Grads plain = RunBlocks(a, b, false);
  a.drop->manual_seed(11);
  b.drop->manual_seed(12);
  ExpectBitEqual(plain, RunBlocks(a, b, true));
}

TEST(ActivationCheckpointTest, RecomputationLeavesTheGeneratorsWhereTheForwardLeftThem) {
  manual_seed(1);
  Block a, b;
  RunBlocks(a, b, false);
  const Tensor after_plain = rand({5});
  RunBlocks(a, b, true);
  EXPECT_EQ(MaxAbsDiff(after_plain, rand({5})), 0.0);
}

TEST(ActivationCheckpointTest, WithoutPreservedRngStateTheMasksDiffer) {
  manual_seed(1);
  Block a, b;
  const Grads plain = RunBlocks(a, b, false);
  const Grads fresh = RunBlocks(a, b, true, CheckpointOptions().preserve_rng_state(false));
  EXPECT_EQ(MaxAbsDiff(plain.loss, fresh.loss), 0.0);  // the forward is the same
  EXPECT_GT(MaxAbsDiff(plain.params[0], fresh.params[0]), 0.0);
}

TEST(ActivationCheckpointTest, SeveralOutputsAnInputWithoutGradAndAClosureArgument) {
  manual_seed(3);
  Tensor w = randn({3, 3}).set_requires_grad(true);
  Tensor x = randn({2, 3}).set_requires_grad(true);
  Tensor mask = randn({2, 3});  // requires no grad
  const double scale = 0.5;     // a non-tensor argument, captured
  auto fn = [&](const std::vector<Tensor>& in) {
    Tensor h = tanh(in[0].matmul(w));
    return std::vector<Tensor>{h * in[1] * scale, h.exp(), h.argmax(1)};
  };
  auto loss_of = [](const std::vector<Tensor>& out) { return (out[0] * out[1]).sum(); };
  loss_of(fn({x, mask})).backward();
  const Tensor gx = x.grad(), gw = w.grad();
  x.set_grad(Tensor());
  w.set_grad(Tensor());
  std::vector<Tensor> out = checkpoint(fn, {x, mask});
  ASSERT_EQ(out.size(), 3u);
  EXPECT_TRUE(out[0].requires_grad());
  EXPECT_FALSE(out[2].requires_grad());  // indices: no gradient
  EXPECT_EQ(out[2].dtype(), kInt64);
  loss_of(out).backward();
  EXPECT_EQ(MaxAbsDiff(gx, x.grad()), 0.0);
  EXPECT_EQ(MaxAbsDiff(gw, w.grad()), 0.0);
  EXPECT_FALSE(mask.grad().defined());
}

TEST(ActivationCheckpointTest, OnlyTheInputsAreKeptNotTheActivations) {
  // A block whose activations dwarf its input: after the checkpointed forward, the graph holds
  // the input and the outputs; the plain forward holds the 64x wider hidden activations too.
  Linear up(16, 1024), down(1024, 16);
  Tensor x = randn({64, 16}).set_requires_grad(true);
  auto block = [&](const Tensor& in) { return down.forward(up.forward(in).relu()); };
  const int64_t before = GetMemoryStats(Device::Cpu(0)).in_use_bytes;
  Tensor plain = block(x);
  const int64_t plain_kept = GetMemoryStats(Device::Cpu(0)).in_use_bytes - before;
  plain = Tensor();
  Tensor ckpt = checkpoint(block, x);
  const int64_t ckpt_kept = GetMemoryStats(Device::Cpu(0)).in_use_bytes - before;
  EXPECT_GE(plain_kept, 64 * 1024 * 4);        // at least the hidden activation
  EXPECT_LE(ckpt_kept, 2 * 64 * 16 * 4 + 64);  // the output (and no activation)
}

TEST(ActivationCheckpointTest, ParameterHooksFireOncePerCheckpointCall) {
  manual_seed(5);
  Block a;
  std::atomic<int> fired{0};
  AddGradAccumulatedHook(a.fc1->weight(), [&](const Tensor&) { ++fired; });
  Tensor x = randn({4, 8}).set_requires_grad(true);
  checkpoint([&](const Tensor& in) { return a(in); }, x).sum().backward();
  EXPECT_EQ(fired.load(), 1);
}

TEST(ActivationCheckpointTest, QueuedCallbacksWaitForTheOuterPass) {
  // What DistributedDataParallel relies on: a callback queued from a hook that fires inside the
  // recomputation's backward runs after the whole outer pass, when every gradient is in place.
  manual_seed(5);
  Block a;
  Linear head(8, 1);
  bool head_ready_at_callback = false;
  AddGradAccumulatedHook(a.fc1->weight(), [&](const Tensor&) {
    QueueCallback([&] { head_ready_at_callback = head.weight().grad().defined(); });
  });
  Tensor x = randn({4, 8}).set_requires_grad(true);
  // The head is recorded first, so backward reaches it last: after the nested pass has ended.
  Tensor side = head.forward(x.detach()).sum();
  Tensor h = checkpoint([&](const Tensor& in) { return a(in); }, x);
  (h.sum() + side).backward();
  EXPECT_TRUE(head_ready_at_callback);
}

TEST(ActivationCheckpointTest, BackwardTwiceRecomputesAndAccumulates) {
  // With retain_graph, a second backward through a checkpoint recomputes again and
  // accumulates, as a plain graph does.
  manual_seed(2);
  Block a;
  Tensor x = randn({4, 8}).set_requires_grad(true);
  manual_seed(8);
  Tensor plain = a(x).sum();
  plain.backward(Tensor(), /*create_graph=*/false, /*retain_graph=*/true);
  plain.backward();
  const Tensor twice = a.fc1->weight().grad().clone();
  a.fc1->weight().set_grad(Tensor());
  manual_seed(8);
  Tensor ckpt = checkpoint([&](const Tensor& in) { return a(in); }, x).sum();
  ckpt.backward(Tensor(), /*create_graph=*/false, /*retain_graph=*/true);
  ckpt.backward();
  EXPECT_EQ(MaxAbsDiff(twice, a.fc1->weight().grad()), 0.0);
}

TEST(ActivationCheckpointTest, NestedCheckpoints) {
  manual_seed(4);
  Block a, b;
  Tensor x = randn({4, 8}).set_requires_grad(true);
  auto both = [&](const Tensor& in) { return b(a(in)); };
  manual_seed(9);
  both(x).sum().backward();
  const Tensor gx = x.grad(), gw = a.fc1->weight().grad();
  x.set_grad(Tensor());
  a.fc1->weight().set_grad(Tensor());
  manual_seed(9);
  checkpoint(
      [&](const Tensor& in) {
        return b(checkpoint([&](const Tensor& inner) { return a(inner); }, in));
      },
      x)
      .sum()
      .backward();
  EXPECT_LT(MaxAbsDiff(gx, x.grad()), 1e-6);
  EXPECT_LT(MaxAbsDiff(gw, a.fc1->weight().grad()), 1e-6);
}

TEST(ActivationCheckpointTest, UnderNoGradJustRunsTheFunction) {
  Block a;
  Tensor x = randn({4, 8}).set_requires_grad(true);
  int calls = 0;
  NoGradGuard no_grad;
  Tensor y = checkpoint(
      [&](const Tensor& in) {
        ++calls;
        return a(in);
      },
      x);
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(y.requires_grad());
  EXPECT_EQ(y.grad_fn(), nullptr);
}

TEST(ActivationCheckpointTest, NothingToDifferentiateIsAClearError) {
  Tensor x = randn({3});  // no input requires grad, no parameter inside
  Tensor y = checkpoint([](const Tensor& in) { return in * 2.0; }, x);
  EXPECT_THAT(ErrorOf([&] { y.sum().backward(); }),
              HasSubstr("none of the function's outputs requires grad"));
  EXPECT_THAT(ErrorOf([&] { checkpoint(CheckpointFunction(), {x}); }),
              HasSubstr("expected a function"));
}

TEST(ActivationCheckpointTest, AFunctionThatChangesItsOutputsIsAClearError) {
  Tensor x = randn({3}).set_requires_grad(true);
  int calls = 0;
  std::vector<Tensor> out = checkpoint(
      [&](const std::vector<Tensor>& in) {
        return ++calls == 1 ? std::vector<Tensor>{in[0] * 2.0}
                            : std::vector<Tensor>{in[0] * 2.0, in[0]};
      },
      {x});
  EXPECT_THAT(ErrorOf([&] { out[0].sum().backward(); }),
              HasSubstr("returned 2 tensors but the forward returned 1"));
}

TEST(ActivationCheckpointTest, ReturningTheInputLeavesTheInputAlone) {
  Tensor x = randn({3}).set_requires_grad(true);
  Tensor y = checkpoint([](const Tensor& in) { return in; }, x);
  EXPECT_TRUE(x.is_leaf());
  EXPECT_NE(y.grad_fn(), nullptr);
  (y * 3.0).sum().backward();
  EXPECT_EQ(MaxAbsDiff(x.grad(), full({3}, 3.0)), 0.0);
}

}  // namespace
}  // namespace tandem::nn
