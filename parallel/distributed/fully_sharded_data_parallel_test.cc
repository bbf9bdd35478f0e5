// Runs as an MPI job (mpi_test.sh, 2 and 3 ranks). The oracle is DistributedDataParallel on the
// same global batch (each rank its own rows): FSDP must give its losses and parameters, to the
// bit on 2 ranks (a + b is b + a) and within rounding on 3 (DDP's ring adds in a rotated order,
// the reduce-scatter in rank order). A process group that counts (and delays) the collectives
// checks what each phase communicates.
#include "parallel/distributed/fully_sharded_data_parallel.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "nn/nn.h"
#include "parallel/distributed/distributed_data_parallel.h"
#include "parallel/distributed/mpi_testing.h"
#include "tensor/runtime/allocator.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace tandem::parallel::distributed {
namespace {

using testing::ErrorOf;
using ::testing::HasSubstr;
using testing::MaxAbsDiff;

class FullyShardedDataParallelTest : public MpiTest {};

// TestGroup(), counting all-gathers and reduce-scatters, and sleeping `delay` (longer on
// higher ranks) before each, so that a rank that issues them in another order would hang or
// mix up buffers rather than pass by luck.
class CountingGroup : public ProcessGroup {
 public:
  explicit CountingGroup(std::chrono::milliseconds delay = std::chrono::milliseconds(0))
      : ProcessGroup(TestGroup()->rank(), TestGroup()->size()), delay_(delay) {}
  std::string backend() const override { return "mpi"; }
  std::shared_ptr<Work> allreduce(Tensor tensor, ReduceOp op) override {
    return TestGroup()->allreduce(tensor, op);
  }
  std::shared_ptr<Work> broadcast(Tensor tensor, int root) override {
    return TestGroup()->broadcast(tensor, root);
  }
  std::shared_ptr<Work> allgather(Tensor output, Tensor input) override {
    ++allgathers;
    Delay();
    return TestGroup()->allgather(output, input);
  }
  std::shared_ptr<Work> reduce_scatter(Tensor output, Tensor input, ReduceOp op) override {
    ++reduce_scatters;
    Delay();
    return TestGroup()->reduce_scatter(output, input, op);
  }
  std::shared_ptr<Work> barrier() override { return TestGroup()->barrier(); }

  std::atomic<int> allgathers{0};
  std::atomic<int> reduce_scatters{0};

 private:
  void Delay() const {
    if (delay_.count() > 0) std::this_thread::sleep_for(delay_ * (1 + rank()));
  }
  std::chrono::milliseconds delay_;
};

// Uneven shapes (105 + 15, 45 + 3, 33 + 11, 99 elements) in nested units: "0", "2" (holding
// 2.2) and "2.0" inside it; the root keeps the last layer.
std::shared_ptr<nn::Sequential> MakeModel() {
  manual_seed(7);
  return std::make_shared<nn::Sequential>(
      nn::Linear(7, 15), nn::Tanh(),
      nn::Sequential(nn::Linear(15, 3), nn::ReLU(), nn::Linear(3, 11)), nn::Tanh(),
      nn::Linear(11, 9, /*bias=*/false));
}

FullyShardedDataParallelOptions Units(ShardingStrategy strategy) {
  return FullyShardedDataParallelOptions().sharding_strategy(strategy).auto_wrap_policy(
      [](const std::string& name, const nn::Module&) {
        return name == "0" || name == "2" || name == "2.0";
      });
}

struct Batch {
  Tensor x, y;
};

// Rank `rank`'s rows of step `step`'s global batch.
Batch BatchOf(int step, int rank) {
  Generator gen(100 * step + rank);
  return {randn({4, 7}, {}, &gen), randn({4, 9}, {}, &gen)};
}

struct Optim {
  std::string name;
  std::function<std::unique_ptr<nn::Optimizer>(std::vector<Tensor>)> make;
};

std::vector<Optim> Optimizers() {
  return {{"SGD momentum",
           [](std::vector<Tensor> p) {
             return std::make_unique<nn::SGD>(
                 std::move(p), nn::SGDOptions(0.05).momentum(0.9).weight_decay(1e-3));
           }},
          {"AdamW", [](std::vector<Tensor> p) {
             return std::make_unique<nn::AdamW>(std::move(p),
                                                nn::AdamWOptions(1e-2).weight_decay(0.1));
           }}};
}

// Exact on 2 ranks; on 3 the sums' order differs by a rounding per step.
double Tolerance() { return TestGroup()->size() == 2 ? 0.0 : 1e-5; }

void ExpectSameModel(FullyShardedDataParallel& fsdp, const nn::Module& reference,
                     const std::string& what, double tolerance = Tolerance()) {
  const std::vector<nn::NamedTensor> got = fsdp.full_state_dict();
  const std::vector<nn::NamedTensor> want = reference.state_dict();
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].name, want[i].name) << what;
    ASSERT_EQ(got[i].value.shape(), want[i].value.shape()) << what << " " << got[i].name;
    EXPECT_LE(MaxAbsDiff(got[i].value, want[i].value), tolerance)
        << what << ": " << got[i].name << " on rank " << TestGroup()->rank();
  }
}

TEST_F(FullyShardedDataParallelTest, EqualsDistributedDataParallel) {
  const int rank = TestGroup()->rank();
  for (ShardingStrategy strategy : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp}) {
    for (const Optim& optim : Optimizers()) {
      for (int variant = 0; variant < 4; ++variant) {
        const bool clip = variant % 2 == 1, prefetch = variant >= 2;
        SCOPED_TRACE(std::string(ShardingStrategyName(strategy)) + " " + optim.name +
                     (clip ? " clipped" : "") + (prefetch ? " forward_prefetch" : ""));
        auto sharded = MakeModel();
        auto whole = MakeModel();
        auto group =
            std::make_shared<CountingGroup>(std::chrono::milliseconds(clip || prefetch ? 1 : 0));
        FullyShardedDataParallel fsdp(sharded, group, Units(strategy).forward_prefetch(prefetch));
        DistributedDataParallel ddp(whole, TestGroup());
        const int gathers_before = group->allgathers.load();
        auto fsdp_optimizer = optim.make(fsdp.parameters());
        auto ddp_optimizer = optim.make(whole->parameters());
        for (int step = 0; step < 10; ++step) {
          const Batch b = BatchOf(step, rank);
          fsdp_optimizer->zero_grad();
          Tensor fsdp_loss = mse_loss(fsdp.forward(b.x), b.y);
          fsdp_loss.backward();
          ddp_optimizer->zero_grad();
          Tensor ddp_loss = mse_loss(ddp.forward(b.x), b.y);
          ddp_loss.backward();
          EXPECT_NEAR(fsdp_loss.item(), ddp_loss.item(), Tolerance()) << "step " << step;
          if (clip) {
            const double got = fsdp.clip_grad_norm_(0.5);
            const double want = nn::clip_grad_norm_(whole->parameters(), 0.5);
            EXPECT_NEAR(got, want, 1e-5 * want) << "step " << step;
          }
          fsdp_optimizer->step();
          ddp_optimizer->step();
        }
        // 4 units with parameters: one all-gather each in forward (started ahead or not); under
        // FULL_SHARD one more in backward for each unit freed after forward (all but the root,
        // gathered last); one reduce-scatter each.
        const int gathers_per_step = strategy == ShardingStrategy::kFullShard ? 7 : 4;
        EXPECT_EQ(group->reduce_scatters.load(), 10 * 4);
        EXPECT_EQ(group->allgathers.load() - gathers_before, 10 * gathers_per_step);
        ExpectSameModel(fsdp, *whole, "after 10 steps");
      }
    }
  }
}

// Every norm type (the largest magnitude all-gathered, the others' sums of powers all-reduced):
// the norm of the whole gradient, and the shards clipped as DDP's whole gradients are.
TEST_F(FullyShardedDataParallelTest, ClipGradNormOfEveryOrderIsTheWholeGradients) {
  const int rank = TestGroup()->rank();
  for (double norm_type : {1.0, 2.0, 3.0, static_cast<double>(INFINITY)}) {
    SCOPED_TRACE("norm_type " + std::to_string(norm_type));
    auto sharded = MakeModel();
    auto whole = MakeModel();
    FullyShardedDataParallel fsdp(sharded, TestGroup(), Units(ShardingStrategy::kFullShard));
    DistributedDataParallel ddp(whole, TestGroup());
    const Batch b = BatchOf(0, rank);
    mse_loss(fsdp.forward(b.x), b.y).backward();
    mse_loss(ddp.forward(b.x), b.y).backward();
    const double got = fsdp.clip_grad_norm_(0.05, norm_type);
    const double want = nn::clip_grad_norm_(whole->parameters(), 0.05, norm_type);
    EXPECT_NEAR(got, want, 1e-6 * want);
    EXPECT_GT(want, 0.05) << "the test must clip";
    nn::SGD(fsdp.parameters(), nn::SGDOptions(1.0)).step();
    nn::SGD(whole->parameters(), nn::SGDOptions(1.0)).step();
    // The norm is summed in another order (each shard, then the ranks), so the clip
    // coefficient, and with it each parameter, may differ by a rounding.
    ExpectSameModel(fsdp, *whole, "after a clipped step", std::max(Tolerance(), 1e-6));
  }
}

TEST_F(FullyShardedDataParallelTest, ShardsAreBalancedAndPadded) {
  const int world = TestGroup()->size();
  FullyShardedDataParallel fsdp(MakeModel(), TestGroup(), Units(ShardingStrategy::kFullShard));
  const std::vector<FsdpUnitInfo> units = fsdp.units();
  ASSERT_EQ(units.size(), 4u);
  EXPECT_EQ(units[0].name, "");
  EXPECT_EQ(units[0].parameter_names, (std::vector<std::string>{"4.weight"}));
  EXPECT_EQ(units[1].name, "0");
  EXPECT_EQ(units[2].name, "2");
  EXPECT_EQ(units[2].parameter_names, (std::vector<std::string>{"2.2.weight", "2.2.bias"}));
  EXPECT_EQ(units[3].name, "2.0");
  const std::vector<int64_t> numels = {99, 120, 44, 48};
  int64_t sharded = 0;
  for (size_t u = 0; u < units.size(); ++u) {
    EXPECT_EQ(units[u].numel, numels[u]) << units[u].name;
    EXPECT_EQ(units[u].shard_numel, (numels[u] + world - 1) / world) << units[u].name;
    EXPECT_FALSE(units[u].gathered) << units[u].name;
    sharded += units[u].shard_numel;
  }
  // The optimizer sees only the shards.
  int64_t stepped = 0;
  for (const Tensor& p : fsdp.parameters()) stepped += p.numel();
  EXPECT_EQ(stepped, sharded);
}

// What is in memory after each phase: FULL_SHARD keeps the root (gathered last here: its
// backward comes first), SHARD_GRAD_OP every unit until its backward.
TEST_F(FullyShardedDataParallelTest, UnitsAreFreedAfterForwardAndBackward) {
  const int rank = TestGroup()->rank();
  for (ShardingStrategy strategy : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp}) {
    SCOPED_TRACE(ShardingStrategyName(strategy));
    FullyShardedDataParallel fsdp(MakeModel(), TestGroup(), Units(strategy));
    const Batch b = BatchOf(0, rank);
    Tensor loss = mse_loss(fsdp.forward(b.x), b.y);
    std::vector<bool> gathered;
    for (const FsdpUnitInfo& u : fsdp.units()) gathered.push_back(u.gathered);
    if (strategy == ShardingStrategy::kFullShard) {
      EXPECT_EQ(gathered, (std::vector<bool>{true, false, false, false}));  // root, 0, 2, 2.0
    } else {
      EXPECT_EQ(gathered, (std::vector<bool>{true, true, true, true}));
    }
    loss.backward();
    for (const FsdpUnitInfo& u : fsdp.units()) EXPECT_FALSE(u.gathered) << u.name;
    for (const Tensor& p : fsdp.parameters()) EXPECT_TRUE(p.grad().defined());
    // Without grad nothing stays gathered after forward.
    {
      NoGradGuard no_grad;
      (void)fsdp.forward(b.x);
    }
    for (const FsdpUnitInfo& u : fsdp.units()) EXPECT_FALSE(u.gathered) << u.name;
  }
}

TEST_F(FullyShardedDataParallelTest, NoSyncAccumulatesWithOneReduceScatterPerUnit) {
  const int rank = TestGroup()->rank();
  for (ShardingStrategy strategy : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp}) {
    SCOPED_TRACE(ShardingStrategyName(strategy));
    auto sharded = MakeModel();
    auto whole = MakeModel();
    auto group = std::make_shared<CountingGroup>();
    FullyShardedDataParallel fsdp(sharded, group, Units(strategy));
    DistributedDataParallel ddp(whole, TestGroup());
    nn::SGD fsdp_optimizer(fsdp.parameters(), nn::SGDOptions(0.1).momentum(0.9));
    nn::SGD ddp_optimizer(whole->parameters(), nn::SGDOptions(0.1).momentum(0.9));
    for (int step = 0; step < 3; ++step) {
      const int before = group->reduce_scatters.load();
      for (int micro = 0; micro < 3; ++micro) {
        const Batch b = BatchOf(10 * step + micro, rank);
        if (micro < 2) {
          auto fsdp_guard = fsdp.no_sync();
          auto ddp_guard = ddp.no_sync();
          mse_loss(fsdp.forward(b.x), b.y).backward();
          mse_loss(ddp.forward(b.x), b.y).backward();
        } else {
          mse_loss(fsdp.forward(b.x), b.y).backward();
          mse_loss(ddp.forward(b.x), b.y).backward();
        }
      }
      EXPECT_EQ(group->reduce_scatters.load() - before, 4) << "step " << step;
      fsdp_optimizer.step();
      ddp_optimizer.step();
      fsdp_optimizer.zero_grad();
      ddp_optimizer.zero_grad();
    }
    ExpectSameModel(fsdp, *whole, "after 3 accumulated steps");
  }
}

// A frozen unit in the middle (fine-tuning): it has no backward node to gather it again, so it
// stays gathered through backward, and the unit before it is gathered by the one after it.
TEST_F(FullyShardedDataParallelTest, AFrozenUnitStaysGatheredForBackward) {
  const int rank = TestGroup()->rank();
  auto make = [] {
    auto model = MakeModel();
    for (Tensor p : model->parameters()) {
      if (p.shape() == Shape{11, 3} || p.shape() == Shape{11}) p.set_requires_grad(false);  // 2.2
    }
    return model;
  };
  auto sharded = make();
  auto whole = make();
  FullyShardedDataParallel fsdp(sharded, TestGroup(),
                                FullyShardedDataParallelOptions().auto_wrap_policy(
                                    [](const std::string& name, const nn::Module&) {
                                      return name == "0" || name == "2.0" || name == "2.2";
                                    }));
  DistributedDataParallel ddp(whole, TestGroup());
  std::vector<Tensor> trainable;
  for (const Tensor& p : fsdp.parameters()) {
    if (p.requires_grad()) trainable.push_back(p);
  }
  std::vector<Tensor> whole_trainable;
  for (const Tensor& p : whole->parameters()) {
    if (p.requires_grad()) whole_trainable.push_back(p);
  }
  nn::SGD fsdp_optimizer(trainable, nn::SGDOptions(0.1).momentum(0.9));
  nn::SGD ddp_optimizer(whole_trainable, nn::SGDOptions(0.1).momentum(0.9));
  for (int step = 0; step < 4; ++step) {
    const Batch b = BatchOf(step, rank);
    fsdp_optimizer.zero_grad();
    ddp_optimizer.zero_grad();
    mse_loss(fsdp.forward(b.x), b.y).backward();
    mse_loss(ddp.forward(b.x), b.y).backward();
    fsdp_optimizer.step();
    ddp_optimizer.step();
    for (const FsdpUnitInfo& u : fsdp.units()) EXPECT_FALSE(u.gathered) << u.name;
  }
  ExpectSameModel(fsdp, *whole, "after 4 steps with a frozen unit");
}

// A backward that throws part-way (here a node before the model, after every unit's
// reduce-scatter has started) leaves the wrapper ready: the next step equals a fresh wrapper's.
TEST_F(FullyShardedDataParallelTest, ABackwardThatFailsLeavesTheNextStepWhole) {
  const int rank = TestGroup()->rank();
  FullyShardedDataParallel fsdp(MakeModel(), TestGroup(), Units(ShardingStrategy::kFullShard));
  FullyShardedDataParallel fresh(MakeModel(), TestGroup(), Units(ShardingStrategy::kFullShard));
  nn::SGD optimizer(fsdp.parameters(), nn::SGDOptions(0.1));
  nn::SGD fresh_optimizer(fresh.parameters(), nn::SGDOptions(0.1));
  const Batch b = BatchOf(0, rank);
  Tensor x = b.x.clone();
  x.set_requires_grad(true);
  Tensor boom;
  {
    NoGradGuard no_grad;
    boom = x * 1.0;
  }
  RecordOp("Boom", {x}, boom,
           [](const Tensor&) -> std::vector<Tensor> { TANDEM_FAIL("boom in backward"); });
  const Tensor loss = mse_loss(fsdp.forward(boom), b.y);
  EXPECT_THAT(ErrorOf([&] { loss.backward(); }), HasSubstr("boom in backward"));
  optimizer.zero_grad();
  const Batch next = BatchOf(1, rank);
  mse_loss(fsdp.forward(next.x), next.y).backward();
  mse_loss(fresh.forward(next.x), next.y).backward();
  for (const Tensor& p : fsdp.parameters()) ASSERT_TRUE(p.grad().defined());
  optimizer.step();
  fresh_optimizer.step();
  const std::vector<nn::NamedTensor> got = fsdp.full_state_dict();
  const std::vector<nn::NamedTensor> want = fresh.full_state_dict();
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(MaxAbsDiff(got[i].value, want[i].value), 0.0) << got[i].name;
  }
}

// GPT-style tied weights: the same tensor registered in two units goes to the root.
class TiedModel : public nn::Cloneable<TiedModel> {
 public:
  TiedModel() { reset(); }
  void reset() override {
    first_ = register_module("first", nn::Linear(6, 6));
    middle_ = register_module("middle", nn::Linear(6, 6));
    last_ = register_module("last", nn::Linear(6, 6, /*bias=*/false));
    last_->replace_parameter("weight", first_->weight());
  }
  Tensor forward(const Tensor& x) {
    return last_->forward(tanh(middle_->forward(tanh(first_->forward(x)))));
  }

 private:
  std::shared_ptr<nn::Linear> first_, middle_, last_;
};

TEST_F(FullyShardedDataParallelTest, TiedParametersTrainAsOne) {
  const int rank = TestGroup()->rank();
  manual_seed(3);
  auto sharded = std::make_shared<TiedModel>();
  manual_seed(3);
  auto whole = std::make_shared<TiedModel>();
  FullyShardedDataParallel fsdp(
      sharded, TestGroup(),
      FullyShardedDataParallelOptions().auto_wrap_policy(
          [](const std::string& name, const nn::Module&) { return name != "middle"; }));
  const std::vector<FsdpUnitInfo> units = fsdp.units();
  ASSERT_EQ(units.size(), 3u);
  EXPECT_EQ(units[0].parameter_names,
            (std::vector<std::string>{"first.weight", "middle.weight", "middle.bias"}));
  EXPECT_EQ(units[1].parameter_names, (std::vector<std::string>{"first.bias"}));
  EXPECT_TRUE(units[2].parameter_names.empty());  // "last" holds only the tied weight
  DistributedDataParallel ddp(whole, TestGroup());
  nn::SGD fsdp_optimizer(fsdp.parameters(), nn::SGDOptions(0.1).momentum(0.9));
  nn::SGD ddp_optimizer(whole->parameters(), nn::SGDOptions(0.1).momentum(0.9));
  for (int step = 0; step < 5; ++step) {
    Generator gen(300 + 10 * step + rank);
    const Tensor x = randn({3, 6}, {}, &gen);
    fsdp_optimizer.zero_grad();
    ddp_optimizer.zero_grad();
    const Tensor fsdp_loss = square(fsdp.forward(x)).mean();
    const Tensor ddp_loss = square(ddp.forward(x)).mean();
    EXPECT_NEAR(fsdp_loss.item(), ddp_loss.item(), Tolerance()) << "step " << step;
    fsdp_loss.backward();
    ddp_loss.backward();
    fsdp_optimizer.step();
    ddp_optimizer.step();
  }
  ExpectSameModel(fsdp, *whole, "after 5 steps");
}

// A checkpoint's round trip: the sharded optimizer's state as the plain one's (gathered), loaded
// back into a fresh wrapper and optimizer, which then step as the plain ones do; and the whole
// parameters summoned for rank 0 alone (evaluation, saving), then sharded again by a forward.
TEST_F(FullyShardedDataParallelTest, OptimizerStateAndSummonedParametersRoundTrip) {
  const int rank = TestGroup()->rank();
  auto whole = MakeModel();
  DistributedDataParallel ddp(whole, TestGroup());
  nn::AdamW ddp_optimizer(whole->parameters(), nn::AdamWOptions(1e-2).weight_decay(0.1));
  auto sharded = MakeModel();
  auto fsdp = std::make_unique<FullyShardedDataParallel>(sharded, TestGroup(),
                                                         Units(ShardingStrategy::kFullShard));
  auto fsdp_optimizer =
      std::make_unique<nn::AdamW>(fsdp->parameters(), nn::AdamWOptions(1e-2).weight_decay(0.1));
  auto train = [&](int step) {
    const Batch b = BatchOf(step, rank);
    fsdp_optimizer->zero_grad();
    ddp_optimizer.zero_grad();
    mse_loss(fsdp->forward(b.x), b.y).backward();
    mse_loss(ddp.forward(b.x), b.y).backward();
    fsdp_optimizer->step();
    ddp_optimizer.step();
  };
  for (int step = 0; step < 3; ++step) train(step);

  const nn::OptimizerState want = ddp_optimizer.state_dict();
  const nn::OptimizerState got = fsdp->full_optimizer_state(fsdp_optimizer->state_dict());
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, value] : want) {
    ASSERT_EQ(got.count(name), 1u) << name;
    ASSERT_EQ(got.at(name).shape(), value.shape()) << name;
    EXPECT_LE(MaxAbsDiff(got.at(name).to(kFloat64), value.to(kFloat64)), Tolerance()) << name;
  }

  // Resume: a fresh model, wrapper and optimizer from the full states.
  const std::vector<nn::NamedTensor> model_state = fsdp->full_state_dict();
  fsdp_optimizer.reset();
  fsdp.reset();
  manual_seed(123);
  sharded = MakeModel();
  sharded->load_state_dict(model_state);
  fsdp = std::make_unique<FullyShardedDataParallel>(sharded, TestGroup(),
                                                    Units(ShardingStrategy::kFullShard));
  fsdp_optimizer =
      std::make_unique<nn::AdamW>(fsdp->parameters(), nn::AdamWOptions(1e-2).weight_decay(0.1));
  fsdp_optimizer->load_state_dict(fsdp->shard_optimizer_state(got));
  for (int step = 3; step < 5; ++step) train(step);
  ExpectSameModel(*fsdp, *whole, "resumed");

  // Summoned: the wrapped module alone, on rank 0 only, is the whole model.
  fsdp->summon_full_params();
  for (const FsdpUnitInfo& u : fsdp->units()) EXPECT_TRUE(u.gathered) << u.name;
  if (rank == 0) {
    const Batch b = BatchOf(7, 0);
    EXPECT_LE(MaxAbsDiff(sharded->forward(b.x), whole->forward(b.x)), Tolerance());
    const std::vector<nn::NamedTensor> state = sharded->state_dict();
    EXPECT_EQ(state.size(), whole->state_dict().size());
  }
  train(5);  // shards again
  for (const FsdpUnitInfo& u : fsdp->units()) EXPECT_FALSE(u.gathered) << u.name;
  ExpectSameModel(*fsdp, *whole, "after the summoned parameters");
}

// Mixed precision: parameters gathered (and the forward run) in bfloat16, gradients reduced in
// float32 into float32 shards, 10 steps of SGD with momentum. The oracle: on every rank a
// bfloat16 copy of float32 master parameters, its gradients averaged in float32 and stepped on
// the masters.
TEST_F(FullyShardedDataParallelTest, MixedPrecisionStepsTheFloat32ShardsWithBFloat16Gradients) {
  const int rank = TestGroup()->rank();
  auto sharded = MakeModel();
  auto master = MakeModel();
  auto low = MakeModel();
  low->to(kBFloat16);
  FullyShardedDataParallel fsdp(
      sharded, TestGroup(),
      Units(ShardingStrategy::kFullShard).param_dtype(kBFloat16).reduce_dtype(kFloat32));
  nn::SGD optimizer(fsdp.parameters(), nn::SGDOptions(0.1).momentum(0.9));
  nn::SGD master_optimizer(master->parameters(), nn::SGDOptions(0.1).momentum(0.9));
  for (const Tensor& p : fsdp.parameters()) EXPECT_EQ(p.dtype(), kFloat32);
  const std::vector<Tensor> low_params = low->parameters();
  const std::vector<Tensor> master_params = master->parameters();
  for (int step = 0; step < 10; ++step) {
    const Batch b = BatchOf(step, rank);
    optimizer.zero_grad();
    const Tensor out = fsdp.forward(b.x);
    EXPECT_EQ(out.dtype(), kBFloat16);
    mse_loss(out, b.y.to(kBFloat16)).backward();
    optimizer.step();

    {
      NoGradGuard no_grad;
      for (size_t i = 0; i < low_params.size(); ++i) {
        Tensor p = low_params[i];
        p.copy_(master_params[i].to(kBFloat16));
      }
    }
    low->zero_grad();
    mse_loss(low->forward(b.x.to(kBFloat16)), b.y.to(kBFloat16)).backward();
    for (size_t i = 0; i < low_params.size(); ++i) {
      Tensor grad = low_params[i].grad().to(kFloat32).contiguous();
      TestGroup()->allreduce(grad, ReduceOp::kAverage)->wait();
      Tensor p = master_params[i];
      p.set_grad(grad);
    }
    master_optimizer.step();
    ExpectSameModel(fsdp, *master, "after bfloat16 step " + std::to_string(step));
    if (HasFailure()) return;
  }
}

// Everything a wrapper and its training allocated is freed with them (the autograd nodes that
// share the wrapper's state with the module's views form no cycle).
TEST_F(FullyShardedDataParallelTest, FreesEverythingWhenDestroyed) {
  const Device cpu = Device::Cpu(0);
  const int64_t before = GetMemoryStats(cpu).in_use_bytes;
  for (bool prefetch : {false, true}) {
    auto model = MakeModel();
    FullyShardedDataParallel fsdp(model, TestGroup(),
                                  Units(ShardingStrategy::kFullShard).forward_prefetch(prefetch));
    nn::AdamW optimizer(fsdp.parameters(), nn::AdamWOptions(1e-2));
    for (int step = 0; step < 2; ++step) {
      const Batch b = BatchOf(step, TestGroup()->rank());
      optimizer.zero_grad();
      mse_loss(fsdp.forward(b.x), b.y).backward();
      optimizer.step();
    }
  }
  EXPECT_EQ(GetMemoryStats(cpu).in_use_bytes, before);
}

TEST_F(FullyShardedDataParallelTest, ReadingAFreedParameterIsAClearError) {
  auto model = MakeModel();
  FullyShardedDataParallel fsdp(model, TestGroup(), Units(ShardingStrategy::kFullShard));
  EXPECT_THAT(ErrorOf([&] { (void)model->parameters()[0].to_vector<float>(); }),
              HasSubstr("memory was released (ReleaseStorage): it is a parameter of a fully "
                        "sharded unit"));
}

TEST_F(FullyShardedDataParallelTest, RanksWithDifferentModelsAllThrow) {
  const int rank = TestGroup()->rank();
  manual_seed(1);
  auto model = std::make_shared<nn::Sequential>(nn::Linear(4, rank == 1 ? 6 : 5),
                                                nn::Linear(rank == 1 ? 6 : 5, 2));
  EXPECT_THAT(ErrorOf([&] { FullyShardedDataParallel fsdp(model, TestGroup()); }),
              HasSubstr("disagree on parameter 0.weight ([5, 4] float32 on rank"));
}

TEST_F(FullyShardedDataParallelTest, FullStateDictRoundTrips) {
  const int rank = TestGroup()->rank();
  auto sharded = MakeModel();
  FullyShardedDataParallel fsdp(sharded, TestGroup(), Units(ShardingStrategy::kFullShard));
  manual_seed(99);
  auto other = std::make_shared<nn::Sequential>(
      nn::Linear(7, 15), nn::Tanh(),
      nn::Sequential(nn::Linear(15, 3), nn::ReLU(), nn::Linear(3, 11)), nn::Tanh(),
      nn::Linear(11, 9, /*bias=*/false));
  fsdp.load_full_state_dict(other->state_dict());
  const std::vector<nn::NamedTensor> got = fsdp.full_state_dict();
  const std::vector<nn::NamedTensor> want = other->state_dict();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].name, want[i].name);
    EXPECT_EQ(MaxAbsDiff(got[i].value, want[i].value), 0.0) << got[i].name;
  }
  const Batch b = BatchOf(0, rank);
  EXPECT_EQ(mse_loss(fsdp.forward(b.x), b.y).item(), mse_loss(other->forward(b.x), b.y).item());
  EXPECT_THAT(ErrorOf([&] { fsdp.load_full_state_dict({}); }),
              HasSubstr("load_full_state_dict: the state has no '4.weight'"));
}

// PyTorch's FullStateDictConfig(offload_to_cpu=True, rank0_only=True), how a model larger than
// one device is saved: rank 0 gets the state of every rank's plain full_state_dict(); every
// other rank gets nothing and, by the allocator's statistics, never holds more than the largest
// unit on top of what it held (the plain one holds them all: the measure can fail).
TEST_F(FullyShardedDataParallelTest, Rank0OnlyFullStateDictHoldsOneUnitAtATimeElsewhere) {
  const int rank = TestGroup()->rank();
  const Device cpu = Device::Cpu(0);
  manual_seed(3);
  auto model = std::make_shared<nn::Sequential>(nn::Linear(64, 64), nn::Linear(64, 64),
                                                nn::Linear(64, 64), nn::Linear(64, 64));
  FullyShardedDataParallel fsdp(
      model, TestGroup(),
      FullyShardedDataParallelOptions().auto_wrap_policy(
          [](const std::string& name, const nn::Module&) { return name.size() == 1; }));
  int64_t largest_unit_bytes = 0;
  for (const FsdpUnitInfo& u : fsdp.units()) {
    largest_unit_bytes =
        std::max<int64_t>(largest_unit_bytes, u.shard_numel * TestGroup()->size() * sizeof(float));
  }
  ASSERT_GT(largest_unit_bytes, 0);
  auto peak_above = [&](const std::function<void()>& f) {
    // Every collective queued before (the constructor's) finished and its buffers released, so
    // that no free lands inside the measure and hides what f holds; the baseline read at the reset.
    TestGroup()->barrier()->wait();
    ResetPeakMemory(cpu);
    const int64_t before = GetMemoryStats(cpu).in_use_bytes;
    f();
    return GetMemoryStats(cpu).peak_bytes - before;
  };
  std::vector<nn::NamedTensor> whole;
  const int64_t plain_peak = peak_above([&] { whole = fsdp.full_state_dict(); });
  std::vector<nn::NamedTensor> got;
  const int64_t rank0_only_peak = peak_above([&] {
    got = fsdp.full_state_dict(FullStateDictOptions().rank0_only(true).offload_to_cpu(true));
  });
  EXPECT_GE(plain_peak, 4 * largest_unit_bytes);
  const std::string dir = ::testing::TempDir() + "/rank0_only";
  const std::string path = dir + "/model.ckpt";
  if (rank != 0) {
    EXPECT_TRUE(got.empty());
    EXPECT_LE(rank0_only_peak, largest_unit_bytes) << "rank " << rank;
  } else {
    ASSERT_EQ(got.size(), whole.size());
    std::vector<nn::CheckpointEntry> entries;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].name, whole[i].name);
      EXPECT_EQ(got[i].value.device(), cpu);
      EXPECT_EQ(MaxAbsDiff(got[i].value, whole[i].value), 0.0) << got[i].name;
      entries.push_back({got[i].name, false, got[i].value});
    }
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    nn::WriteCheckpoint(entries, path);  // what train --save writes
  }
  TestGroup()->barrier()->wait();
  // The file resumes: a model of other weights loads it on every rank, is sharded again, and
  // steps as the saved one does.
  manual_seed(4);
  auto resumed_model = std::make_shared<nn::Sequential>(nn::Linear(64, 64), nn::Linear(64, 64),
                                                        nn::Linear(64, 64), nn::Linear(64, 64));
  nn::LoadCheckpoint(*resumed_model, path);
  FullyShardedDataParallel resumed(resumed_model, TestGroup(), fsdp.options());
  Generator gen(5 + rank);
  const Tensor x = randn({3, 64}, {}, &gen);
  for (FullyShardedDataParallel* f : {&fsdp, &resumed}) {
    nn::SGD optimizer(f->parameters(), nn::SGDOptions(0.1));
    sum(square(f->forward(x))).backward();
    optimizer.step();
  }
  const std::vector<nn::NamedTensor> a = fsdp.full_state_dict(), b = resumed.full_state_dict();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(MaxAbsDiff(a[i].value, b[i].value), 0.0) << a[i].name << " after a step";
  }
}

// A module that runs `probe` in its forward and passes its input on.
class Probe : public nn::Module {
 public:
  explicit Probe(std::function<void()> probe) : nn::Module("Probe"), probe_(std::move(probe)) {}
  std::vector<Tensor> forward_tensors(const std::vector<Tensor>& inputs) override {
    probe_();
    return inputs;
  }

 private:
  std::function<void()> probe_;
};

// forward_prefetch: after the first forward (which records the order), the second unit's
// all-gather is issued before the first unit's compute is done (seen from a module between the
// two), and the delayed all-gathers give the same outputs, gradients and number of all-gathers
// as without it. Without the option the probe sees only the first unit's.
TEST_F(FullyShardedDataParallelTest, ForwardPrefetchStartsTheNextUnitsAllGatherBeforeCompute) {
  const int rank = TestGroup()->rank();
  std::vector<std::vector<float>> outputs[2];
  std::vector<std::vector<float>> gradients[2];
  int gathers[2] = {0, 0};
  for (bool prefetch : {false, true}) {
    SCOPED_TRACE(prefetch ? "forward_prefetch" : "without");
    auto group = std::make_shared<CountingGroup>(std::chrono::milliseconds(2));
    int at_start = 0, seen = -1;
    manual_seed(11);
    auto model = std::make_shared<nn::Sequential>(
        nn::Linear(7, 15), std::make_shared<Probe>([&] { seen = group->allgathers - at_start; }),
        nn::Tanh(), nn::Linear(15, 9));
    FullyShardedDataParallel fsdp(
        model, group,
        FullyShardedDataParallelOptions().forward_prefetch(prefetch).auto_wrap_policy(
            [](const std::string& name, const nn::Module&) { return name == "0" || name == "3"; }));
    nn::SGD optimizer(fsdp.parameters(), nn::SGDOptions(0.1));
    const int before = group->allgathers;
    for (int step = 0; step < 3; ++step) {
      const Batch b = BatchOf(step, rank);
      optimizer.zero_grad();
      at_start = group->allgathers;
      const Tensor out = fsdp.forward(b.x);
      EXPECT_EQ(seen, prefetch && step > 0 ? 2 : 1) << "step " << step;
      outputs[prefetch].push_back(out.to_vector<float>());
      mse_loss(out, b.y).backward();
      for (const Tensor& p : fsdp.parameters())
        gradients[prefetch].push_back(p.grad().to_vector<float>());
      optimizer.step();
    }
    {
      NoGradGuard no_grad;  // evaluation prefetches too
      at_start = group->allgathers;
      outputs[prefetch].push_back(fsdp.forward(BatchOf(9, rank).x).to_vector<float>());
      EXPECT_EQ(seen, prefetch ? 2 : 1);
    }
    gathers[prefetch] = group->allgathers - before;
  }
  EXPECT_EQ(outputs[0], outputs[1]);
  EXPECT_EQ(gradients[0], gradients[1]);
  EXPECT_EQ(gathers[0], gathers[1]);
}

}  // namespace
}  // namespace tandem::parallel::distributed
