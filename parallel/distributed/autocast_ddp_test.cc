// Runs as an MPI job (mpi_test.sh, 2 and 3 ranks): autocast and GradScaler under
// DistributedDataParallel. bfloat16 autocast with bfloat16 gradient compression leaves every
// rank with the same parameters, near one process training on every rank's samples; float16
// autocast with a GradScaler skips, on every rank, a step whose inf came from one rank alone.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "nn/nn.h"
#include "parallel/distributed/distributed_data_parallel.h"
#include "parallel/distributed/mpi_testing.h"
#include "parallel/distributed/process_group_mpi.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace tandem::parallel::distributed {
namespace {

using ::tandem::testing::MaxAbsDiff;

class AutocastDdpTest : public MpiTest {};

constexpr DeviceType kCPU = DeviceType::kCPU;
constexpr int64_t kPerRank = 8;
constexpr int64_t kIn = 6;

std::shared_ptr<nn::Sequential> MakeModel(uint64_t seed) {
  manual_seed(seed);
  return std::make_shared<nn::Sequential>(nn::Linear(kIn, 16), nn::ReLU(), nn::Linear(16, 3));
}

// The whole job's samples of one step (the same on every rank).
struct Data {
  Tensor x, y;
  Data Rows(int64_t start, int64_t count) const {
    return Data{x.narrow(0, start, count).contiguous(), y.narrow(0, start, count).contiguous()};
  }
};
Data MakeData(int world, uint64_t step) {
  Generator gen(500 + step);
  const int64_t n = kPerRank * world;
  std::vector<int64_t> labels(n);
  for (int64_t i = 0; i < n; ++i) labels[i] = (i * 5 + static_cast<int64_t>(step)) % 3;
  return Data{randn({n, kIn}, {}, &gen), from_vector(labels, {n})};
}

// Every parameter, flattened into one float32 vector.
Tensor Flat(const nn::Module& module) {
  std::vector<Tensor> parts;
  for (const Tensor& p : module.parameters()) parts.push_back(p.detach().reshape({-1}));
  return cat(parts, 0);
}

// Every rank's Flat(module), gathered on every rank: [world, n].
Tensor EveryRanks(ProcessGroup& group, const nn::Module& module) {
  const Tensor mine = Flat(module).contiguous();
  Tensor all = zeros({group.size() * mine.numel()});
  group.allgather(all, mine)->wait();
  return all.reshape({group.size(), mine.numel()});
}

void ExpectSameOnEveryRank(ProcessGroup& group, const nn::Module& module, const std::string& what) {
  const Tensor all = EveryRanks(group, module);
  for (int r = 1; r < group.size(); ++r) {
    EXPECT_EQ(MaxAbsDiff(all.select(0, r), all.select(0, 0)), 0.0)
        << what << ": rank " << r << "'s parameters differ from rank 0's";
  }
}

TEST_F(AutocastDdpTest, Bf16AutocastWithBf16CompressionKeepsEveryRankAlikeNearOneProcess) {
  auto group = TestGroup();
  const int world = group->size();
  auto model = MakeModel(5);
  auto reference = MakeModel(5);  // one process on every rank's samples, float32 throughout
  DistributedDataParallel ddp(model, group,
                              DistributedDataParallelOptions().gradient_compression(kBFloat16));
  nn::SGD optimizer(model->parameters(), nn::SGDOptions(0.1).momentum(0.9));
  nn::SGD reference_optimizer(reference->parameters(), nn::SGDOptions(0.1).momentum(0.9));
  const Tensor start = Flat(*reference).clone();
  for (uint64_t step = 0; step < 4; ++step) {
    const Data all = MakeData(world, step);
    const Data mine = all.Rows(group->rank() * kPerRank, kPerRank);
    Tensor loss;
    {
      AutocastGuard autocast(kCPU, kBFloat16);
      const Tensor logits = ddp.forward(mine.x);
      EXPECT_EQ(logits.dtype(), kBFloat16);
      loss = cross_entropy(logits, mine.y);
    }
    optimizer.zero_grad();
    loss.backward();
    for (const Tensor& p : model->parameters()) EXPECT_EQ(p.grad().dtype(), kFloat32);
    optimizer.step();
    reference_optimizer.zero_grad();
    cross_entropy(reference->forward(all.x), all.y).backward();
    reference_optimizer.step();
    ExpectSameOnEveryRank(*group, *model, "step " + std::to_string(step));
  }
  // Four steps of bfloat16 forwards and all-reduces against float32: the parameters moved as
  // the float32 run's did, within a few bfloat16 roundings (rtol 1.6e-2) of the distance moved.
  const Tensor moved = Flat(*reference) - start;
  const double distance = MaxAbsDiff(moved, zeros_like(moved));
  EXPECT_GT(distance, 0.0);
  EXPECT_LE(MaxAbsDiff(Flat(*model), Flat(*reference)), 4 * 1.6e-2 * distance);
}

TEST_F(AutocastDdpTest, Fp16GradScalerSkipsOnEveryRankAStepWhoseInfCameFromOneRank) {
  auto group = TestGroup();
  const int world = group->size();
  auto model = MakeModel(8);
  DistributedDataParallel ddp(model, group,
                              DistributedDataParallelOptions().gradient_compression(kFloat16));
  nn::SGD optimizer(model->parameters(), nn::SGDOptions(0.05));
  nn::GradScaler scaler(nn::GradScalerOptions().init_scale(64).growth_interval(2));
  for (uint64_t step = 0; step < 4; ++step) {
    SCOPED_TRACE(step);
    const Data all = MakeData(world, 10 + step);
    Data mine = all.Rows(group->rank() * kPerRank, kPerRank);
    const bool poisoned = step == 2;
    // The last rank alone sees a sample beyond float16's range.
    if (poisoned && group->rank() == world - 1) mine.x.narrow(0, 3, 1).fill_(1e30);
    const Tensor before = Flat(*model).clone();
    Tensor loss;
    {
      AutocastGuard autocast(kCPU, kFloat16);
      loss = cross_entropy(ddp.forward(mine.x), mine.y);
    }
    optimizer.zero_grad();
    scaler.scale(loss).backward();
    const bool stepped = scaler.step(optimizer);
    scaler.update();
    EXPECT_EQ(stepped, !poisoned);
    // 64, grown to 128 after two clean steps, halved by the poisoned one, then one clean step.
    const double expected_scale[] = {64, 128, 64, 64};
    EXPECT_EQ(scaler.get_scale(), expected_scale[step]);
    const double moved = MaxAbsDiff(Flat(*model), before);
    if (poisoned) {
      EXPECT_EQ(moved, 0.0) << "rank " << group->rank() << " stepped on an inf gradient";
    } else {
      EXPECT_GT(moved, 0.0);
    }
    ExpectSameOnEveryRank(*group, *model, "step " + std::to_string(step));
  }
}

}  // namespace
}  // namespace tandem::parallel::distributed
