// Runs as an MPI job (mpi_test.sh, 2 and 3 ranks). ShardedGradScaler over FullyShardedDataParallel:
// it unscales the shards (in float32 a power-of-two scale and its inverse are exact, so scaled
// training equals unscaled training to the bit), and an inf in one rank's shard makes every rank
// skip the step and back off, where a plain GradScaler lets the ranks part ways.
#include "parallel/distributed/sharded_grad_scaler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "nn/nn.h"
#include "parallel/distributed/fully_sharded_data_parallel.h"
#include "parallel/distributed/mpi_testing.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace tandem::parallel::distributed {
namespace {

using ::testing::HasSubstr;
using testing::MaxAbsDiff;

class ShardedGradScalerTest : public MpiTest {};

std::shared_ptr<FullyShardedDataParallel> MakeFsdp() {
  manual_seed(3);
  auto model = std::make_shared<nn::Sequential>(nn::Linear(5, 7), nn::Tanh(), nn::Linear(7, 3));
  return std::make_shared<FullyShardedDataParallel>(
      model, TestGroup(),
      FullyShardedDataParallelOptions().auto_wrap_policy(
          [](const std::string& name, const nn::Module&) { return name == "0"; }));
}

// One step's loss on this rank's rows.
Tensor LossOf(FullyShardedDataParallel& fsdp, int step) {
  Generator gen(10 * step + TestGroup()->rank());
  const Tensor x = randn({4, 5}, {}, &gen);
  const Tensor y = randn({4, 3}, {}, &gen);
  return mse_loss(fsdp.forward(x), y);
}

std::vector<Tensor> Values(const std::vector<Tensor>& tensors) {
  std::vector<Tensor> values;
  for (const Tensor& t : tensors) values.push_back(t.detach().clone());
  return values;
}

TEST_F(ShardedGradScalerTest, UnscalesTheShardsExactly) {
  auto scaled = MakeFsdp();
  auto plain = MakeFsdp();
  nn::SGD scaled_optimizer(scaled->parameters(), nn::SGDOptions(0.1).momentum(0.9));
  nn::SGD plain_optimizer(plain->parameters(), nn::SGDOptions(0.1).momentum(0.9));
  ShardedGradScaler scaler(TestGroup(), nn::GradScalerOptions().growth_interval(2));
  for (int step = 0; step < 5; ++step) {
    scaled_optimizer.zero_grad();
    plain_optimizer.zero_grad();
    scaler.scale(LossOf(*scaled, step)).backward();
    EXPECT_TRUE(scaler.step(scaled_optimizer));
    scaler.update();
    LossOf(*plain, step).backward();
    plain_optimizer.step();
  }
  EXPECT_EQ(scaler.get_scale(), 65536.0 * 4);  // grown twice: every step was clean
  const std::vector<Tensor> got = scaled->parameters(), want = plain->parameters();
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(MaxAbsDiff(got[i], want[i]), 0.0) << i;
}

// An inf in the last rank's shard only: does rank 0 step?
bool RankZeroStepsWithAnInfOnTheLastRank(nn::GradScaler& scaler, FullyShardedDataParallel& fsdp,
                                         nn::Optimizer& optimizer) {
  optimizer.zero_grad();
  scaler.scale(LossOf(fsdp, 0)).backward();
  if (TestGroup()->rank() == TestGroup()->size() - 1) {
    fsdp.parameters()[0].grad().narrow(0, 0, 1).fill_(INFINITY);
  }
  const std::vector<Tensor> before = Values(fsdp.parameters());
  const bool stepped = scaler.step(optimizer);
  scaler.update();
  const std::vector<Tensor> after = fsdp.parameters();
  bool unchanged = true;
  for (size_t i = 0; i < before.size(); ++i)
    unchanged = unchanged && MaxAbsDiff(before[i], after[i]) == 0;
  EXPECT_EQ(stepped, !unchanged);
  return stepped;
}

TEST_F(ShardedGradScalerTest, AnInfInOneShardSkipsTheStepOnEveryRank) {
  const int rank = TestGroup()->rank();
  const bool last = rank == TestGroup()->size() - 1;
  {
    auto fsdp = MakeFsdp();
    nn::SGD optimizer(fsdp->parameters(), nn::SGDOptions(0.1));
    ShardedGradScaler scaler(TestGroup());
    EXPECT_FALSE(RankZeroStepsWithAnInfOnTheLastRank(scaler, *fsdp, optimizer)) << rank;
    EXPECT_EQ(scaler.get_scale(), 32768.0) << "every rank backs off";
  }
  {
    // What the sharded scaler prevents: a plain one lets the ranks without the inf step.
    auto fsdp = MakeFsdp();
    nn::SGD optimizer(fsdp->parameters(), nn::SGDOptions(0.1));
    nn::GradScaler scaler;
    EXPECT_EQ(RankZeroStepsWithAnInfOnTheLastRank(scaler, *fsdp, optimizer), !last) << rank;
  }
}

TEST_F(ShardedGradScalerTest, NeedsAGroup) {
  EXPECT_THAT(testing::ErrorOf([] { ShardedGradScaler scaler(nullptr); }),
              HasSubstr("expected a process group but got none"));
}

}  // namespace
}  // namespace tandem::parallel::distributed
