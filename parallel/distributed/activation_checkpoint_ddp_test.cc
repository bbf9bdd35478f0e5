// Runs as an MPI job (mpi_test.sh, 2 and 3 ranks): activation checkpointing under
// DistributedDataParallel. Each parameter inside a checkpointed layer gets its gradient in the
// recomputation's nested backward pass, once per checkpoint call, so DDP's hooks see every
// parameter once and its end-of-backward wait runs after the outer pass.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "nn/checkpointed_stack_testing.h"
#include "nn/nn.h"
#include "parallel/distributed/distributed_data_parallel.h"
#include "parallel/distributed/mpi_testing.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace tandem::parallel::distributed {
namespace {

using ::tandem::nn::testing::CheckpointedStack;

class ActivationCheckpointDdpTest : public MpiTest {};

constexpr int64_t kPerRank = 3;

// The whole job's batch (the same on every rank).
Tensor Batch(int world) {
  Generator gen(77);
  return randn({kPerRank * world, 5, CheckpointedStack::kWidth}, {}, &gen);
}

// The parameters' gradients after `steps` DDP steps (the same batch each time) of a model with
// seed 3's weights, its blocks checkpointed or not; dropout draws from seed 10 + rank.
std::vector<Tensor> DdpGradients(bool checkpointed, double dropout, int steps = 1) {
  auto group = TestGroup();
  manual_seed(3);
  auto model = std::make_shared<CheckpointedStack>(checkpointed, dropout);
  DistributedDataParallel ddp(model, group);
  const Tensor x = Batch(group->size()).narrow(0, group->rank() * kPerRank, kPerRank);
  manual_seed(10 + group->rank());
  for (int i = 0; i < steps; ++i) {
    model->zero_grad();
    Tensor y = ddp.forward(x);
    (y * y).mean().backward();
  }
  std::vector<Tensor> grads;
  for (const Tensor& p : model->parameters()) grads.push_back(p.grad());
  return grads;
}

void ExpectWithin(const std::vector<Tensor>& got, const std::vector<Tensor>& want,
                  double tolerance) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(got[i].defined() && want[i].defined()) << "parameter " << i;
    EXPECT_LE(testing::MaxAbsDiff(got[i], want[i]), tolerance) << "parameter " << i;
  }
}

TEST_F(ActivationCheckpointDdpTest, EqualsPlainDdpWithDropoutToTheBit) {
  // Two steps: the second checks that the first left DDP ready for the next (every parameter
  // marked once, the buckets waited for after the outer pass).
  ExpectWithin(DdpGradients(true, 0.2, 2), DdpGradients(false, 0.2, 2), 0.0);
}

TEST_F(ActivationCheckpointDdpTest, EqualsOneProcessOnTheWholeBatchWithoutDropout) {
  const std::vector<Tensor> ddp = DdpGradients(true, 0.0);
  manual_seed(3);
  CheckpointedStack reference(false, 0.0);
  Tensor y = reference.forward(Batch(TestGroup()->size()));
  (y * y).mean().backward();
  std::vector<Tensor> want;
  for (const Tensor& p : reference.parameters()) want.push_back(p.grad());
  ExpectWithin(ddp, want, 1e-5);
}

// One layer applied twice, each application checkpointed (weights shared across depth): its
// parameters get a gradient in each of two nested passes, which DDP takes only under
// static_graph, as PyTorch's.
class SharedLayerTwice : public nn::Cloneable<SharedLayerTwice> {
 public:
  SharedLayerTwice() { reset(); }
  void reset() override {
    layer_ = register_module("layer", nn::Linear(6, 6));
    head_ = register_module("head", nn::Linear(6, 2));
  }
  Tensor forward(const Tensor& x) {
    const auto layer = layer_;
    const auto block = [layer](const Tensor& in) { return tanh(layer->forward(in)); };
    return head_->forward(nn::checkpoint(block, nn::checkpoint(block, x)));
  }

 private:
  std::shared_ptr<nn::Linear> layer_, head_;
};

Tensor MeanSquare(const Tensor& y) { return (y * y).mean(); }

Tensor SharedBatch(int world) {
  Generator gen(78);
  return randn({kPerRank * world, 6}, {}, &gen);
}

TEST_F(ActivationCheckpointDdpTest, TheSameLayerCheckpointedTwiceNeedsStaticGraph) {
  auto group = TestGroup();
  const Tensor x = SharedBatch(group->size()).narrow(0, group->rank() * kPerRank, kPerRank);
  {
    manual_seed(4);
    auto model = std::make_shared<SharedLayerTwice>();
    DistributedDataParallel ddp(model, group);
    EXPECT_THAT(testing::ErrorOf([&] { MeanSquare(ddp.forward(x)).backward(); }),
                ::testing::HasSubstr("Expected to mark a variable ready only once"));
  }
  manual_seed(4);
  auto model = std::make_shared<SharedLayerTwice>();
  DistributedDataParallel ddp(model, group, DistributedDataParallelOptions().static_graph(true));
  manual_seed(4);
  SharedLayerTwice reference;
  nn::SGD optimizer(model->parameters(), nn::SGDOptions(0.1));
  nn::SGD reference_optimizer(reference.parameters(), nn::SGDOptions(0.1));
  for (int step = 0; step < 3; ++step) {  // the first records the graph, the others use it
    optimizer.zero_grad();
    MeanSquare(ddp.forward(x)).backward();
    reference_optimizer.zero_grad();
    MeanSquare(reference.forward(SharedBatch(group->size()))).backward();
    std::vector<Tensor> got, want;
    for (const Tensor& p : model->parameters()) got.push_back(p.grad());
    for (const Tensor& p : reference.parameters()) want.push_back(p.grad());
    ExpectWithin(got, want, 1e-6);
    optimizer.step();
    reference_optimizer.step();
  }
}

// A layer used only inside a checkpoint (and, nested, one inside a checkpoint inside it) and
// one that only rank 0 uses. Under find_unused_parameters DDP walks the outputs' graph to find
// the unused parameters, and a checkpoint's inside is not in that graph: PyTorch's reentrant
// checkpoint takes those parameters for unused (marked ready at once, then their gradients
// arrive: an error or a hang). Here the checkpoint's forward records the leaves its function
// reaches (nn::RecordCheckpointedParameters), so the walk sees them used.
class CheckpointedAndUnused : public nn::Cloneable<CheckpointedAndUnused> {
 public:
  CheckpointedAndUnused(bool checkpointed, bool nested, bool use_extra)
      : checkpointed_(checkpointed), nested_(nested), use_extra_(use_extra) {
    reset();
  }
  void reset() override {
    inner_ = register_module("inner", nn::Linear(6, 6));
    layer_ = register_module("layer", nn::Linear(6, 6));
    extra_ = register_module("extra", nn::Linear(6, 6));
    head_ = register_module("head", nn::Linear(6, 2));
  }
  Tensor forward(const Tensor& x) {
    const auto inner = inner_, layer = layer_;
    const bool nested = nested_;
    const auto block = [inner, layer, nested](const Tensor& in) {
      const auto inner_block = [inner](const Tensor& t) { return tanh(inner->forward(t)); };
      const Tensor h = nested ? nn::checkpoint(inner_block, in) : inner_block(in);
      return tanh(layer->forward(h));
    };
    Tensor h = checkpointed_ ? nn::checkpoint(block, x) : block(x);
    if (use_extra_) h = extra_->forward(h);
    return head_->forward(h);
  }

 private:
  bool checkpointed_, nested_, use_extra_;
  std::shared_ptr<nn::Linear> inner_, layer_, extra_, head_;
};

TEST_F(ActivationCheckpointDdpTest, FindUnusedParametersSeesTheParametersInsideACheckpoint) {
  auto group = TestGroup();
  const int rank = group->rank();
  const Tensor x = SharedBatch(group->size()).narrow(0, rank * kPerRank, kPerRank);
  // Every parameter's gradient after each of 3 SGD steps under find_unused_parameters.
  auto train = [&](bool checkpointed, bool nested) {
    manual_seed(5);
    auto model = std::make_shared<CheckpointedAndUnused>(checkpointed, nested, rank == 0);
    DistributedDataParallel ddp(model, group,
                                DistributedDataParallelOptions().find_unused_parameters(true));
    nn::SGD optimizer(model->parameters(), nn::SGDOptions(0.1));
    std::vector<std::vector<float>> grads;
    for (int step = 0; step < 3; ++step) {
      optimizer.zero_grad();
      MeanSquare(ddp.forward(x)).backward();
      for (const Tensor& p : model->parameters()) {
        EXPECT_TRUE(p.grad().defined()) << "step " << step;  // extra: rank 0's, averaged
        grads.push_back(p.grad().defined() ? p.grad().to_vector<float>() : std::vector<float>());
      }
      optimizer.step();
    }
    return grads;
  };
  const std::vector<std::vector<float>> plain = train(false, false);
  EXPECT_EQ(train(true, false), plain);
  EXPECT_EQ(train(true, true), plain);
}

}  // namespace
}  // namespace tandem::parallel::distributed
