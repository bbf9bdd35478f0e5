// ProcessGroupNccl, run as an MPI job (mpi_test.sh, 2 and 3 ranks): every rank first checks a
// group of its own (world size 1 on cuda:0), then all ranks share one group over the MPI
// bootstrap, rank r on cuda:r: collectives of every dtype against the CPU, and
// DistributedDataParallel on CUDA, plain and with bfloat16 gradient compression, against one
// process; a rank that skips a collective is named by the others' watchdog after the timeout.
// Needs a GPU per rank (NCCL refuses two ranks on one GPU): under --config=cudasim
// each process has simulated GPUs of its own; on a machine with fewer GPUs than ranks the
// shared-group tests skip.
#include "parallel/distributed/process_group_nccl.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "nn/nn.h"
#include "parallel/distributed/distributed_data_parallel.h"
#include "parallel/distributed/fully_sharded_data_parallel.h"
#include "parallel/distributed/mpi_testing.h"
#include "parallel/distributed/process_group_mpi.h"
#include "parallel/distributed/sync_batch_norm.h"
#include "tensor/cuda/cuda.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace tandem::parallel::distributed {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;

class ProcessGroupNcclTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::HasCuda()) GTEST_SKIP() << testing::NoCudaReason();
  }
};

TEST_F(ProcessGroupNcclTest, OneRankCollectivesMatchTheCpu) {
  const Device gpu = Device::Cuda(0);
  ProcessGroupNccl group(gpu);
  EXPECT_EQ(group.rank(), 0);
  EXPECT_EQ(group.size(), 1);
  EXPECT_EQ(group.backend(), "nccl");
  for (int64_t n : {0, 1, 1000, 1 << 20}) {
    Tensor cpu = randn({n});
    Tensor sum = cpu.to(gpu);
    Tensor average = cpu.to(gpu);
    group.allreduce(sum)->wait();
    group.allreduce(average, ReduceOp::kAverage)->wait();
    EXPECT_EQ(sum.to_vector<float>(), cpu.to_vector<float>()) << n;
    EXPECT_EQ(average.to_vector<float>(), cpu.to_vector<float>()) << n;
    Tensor cast = cpu.to(gpu);
    group.broadcast(cast, 0)->wait();
    EXPECT_EQ(cast.to_vector<float>(), cpu.to_vector<float>()) << n;
    Tensor gathered = zeros({n}, TensorOptions().device(gpu));
    group.allgather(gathered, cpu.to(gpu))->wait();
    EXPECT_EQ(gathered.to_vector<float>(), cpu.to_vector<float>()) << n;
    Tensor scattered = zeros({n}, TensorOptions().device(gpu));
    group.reduce_scatter(scattered, cpu.to(gpu), ReduceOp::kAverage)->wait();
    EXPECT_EQ(scattered.to_vector<float>(), cpu.to_vector<float>()) << n;
  }
  Tensor ids = from_vector(std::vector<int64_t>{int64_t{1} << 40, -3}, {2}).to(gpu);
  group.allreduce(ids)->wait();
  EXPECT_EQ(ids.to_vector<int64_t>(), (std::vector<int64_t>{int64_t{1} << 40, -3}));
  group.barrier()->wait();
}

TEST_F(ProcessGroupNcclTest, CpuTensorsAreAClearError) {
  ProcessGroupNccl group(Device::Cuda(0));
  EXPECT_THAT(testing::ErrorOf([&] { group.allreduce(zeros({3})); }),
              HasSubstr("takes tensors on cuda:0"));
  EXPECT_THAT(testing::ErrorOf([&] { ProcessGroupNccl cpu(Device::Cpu(0)); }),
              HasSubstr("needs a CUDA device"));
}

TEST_F(ProcessGroupNcclTest, DistributedDataParallelOnOneGpuEqualsThePlainModule) {
  const Device gpu = Device::Cuda(0);
  auto group = std::make_shared<ProcessGroupNccl>(gpu);
  manual_seed(3);
  auto model = std::make_shared<nn::Sequential>(nn::Linear(6, 5), nn::ReLU(), nn::Linear(5, 3));
  model->to(gpu);
  manual_seed(3);
  auto reference = std::make_shared<nn::Sequential>(nn::Linear(6, 5), nn::ReLU(), nn::Linear(5, 3));
  reference->to(gpu);
  DistributedDataParallel ddp(model, group,
                              DistributedDataParallelOptions().bucket_cap_mb(0.00001));
  Tensor x = randn({8, 6}).to(gpu);
  Tensor y = from_vector(std::vector<int64_t>{0, 1, 2, 0, 1, 2, 0, 1}, {8}).to(gpu);
  cross_entropy(ddp.forward(x), y).backward();
  cross_entropy(reference->forward(x), y).backward();
  std::vector<Tensor> got = model->parameters();
  std::vector<Tensor> want = reference->parameters();
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_LT(testing::MaxAbsDiff(got[i].grad(), want[i].grad()), 1e-6) << i;
  }
}

// ---- Every rank in one group --------------------------------------------------------------

class NcclRanksTest : public MpiTest {
 protected:
  void SetUp() override {
    MpiTest::SetUp();
    if (IsSkipped()) return;
    if (!testing::HasCuda()) GTEST_SKIP() << testing::NoCudaReason();
    // The same answer on every rank (one machine), so that all skip or none creates the group.
    if (cuda::DeviceCount() < TestGroup()->size()) {
      GTEST_SKIP() << "needs a GPU per rank: " << TestGroup()->size() << " ranks, "
                   << cuda::DeviceCount() << " CUDA devices";
    }
  }
  // The job's NCCL group, created once (collectively) over the MPI bootstrap.
  static std::shared_ptr<ProcessGroupNccl> Group() {
    static const auto group = std::make_shared<ProcessGroupNccl>(
        Device::Cuda(TestGroup()->rank()), std::shared_ptr<ProcessGroup>(TestGroup()));
    return group;
  }
  static Device Gpu() { return Group()->device(); }
};

// Rank r's values of every dtype: bool and uint8 small enough that sums of three stay exact.
Tensor Sample(DType dtype, int64_t n, int rank) {
  Generator gen(100 + rank);
  Tensor x = randn({n}, {}, &gen);
  if (dtype == kBool) return gt(x, zeros({}));
  if (IsFloatingPoint(dtype)) return mul(x, 8.0).to(dtype);
  if (dtype == kUInt8) return abs(mul(x, 20.0)).to(kInt64).to(dtype);
  return mul(x, 1000.0).to(kInt64).to(dtype);
}

const std::vector<DType> kEveryDType = {kFloat32, kFloat64, kBFloat16, kFloat16,
                                        kInt64,   kInt32,   kUInt8,    kBool};

TEST_F(NcclRanksTest, AllreduceOfEveryDTypeEqualsTheCpuSumInRankOrder) {
  const int world = Group()->size();
  for (DType dtype : kEveryDType) {
    if (dtype == kBool) continue;  // refused: AllreduceOfBoolIsAClearError
    SCOPED_TRACE(DTypeName(dtype));
    for (int64_t n : {1, 1000, 300000}) {  // 300,000 float64: several staging rounds
      Tensor mine = Sample(dtype, n, Group()->rank()).to(Gpu());
      Group()->allreduce(mine)->wait();
      // The simulated NCCL adds in rank order, each step rounded to the dtype, as CPU add does.
      Tensor want = Sample(dtype, n, 0);
      for (int r = 1; r < world; ++r) want = add(want, Sample(dtype, n, r));
      EXPECT_EQ(testing::MaxAbsDiff(mine.to(Device::Cpu(0)), want), 0.0) << n;
      if (IsFloatingPoint(dtype)) {
        Tensor average = Sample(dtype, n, Group()->rank()).to(Gpu());
        Group()->allreduce(average, ReduceOp::kAverage)->wait();
        // NCCL's average multiplies each rank's value by 1/world, rounded to the dtype, first.
        const double tolerance = IsReducedFloatingPoint(dtype) ? 0.25 : 1e-5;
        EXPECT_LE(
            testing::MaxAbsDiff(average.to(Device::Cpu(0)), mul(want.to(kFloat64), 1.0 / world)),
            tolerance)
            << n;
      }
    }
  }
}

TEST_F(NcclRanksTest, BroadcastAndAllgatherOfEveryDTypeMoveTheBits) {
  const int world = Group()->size();
  for (DType dtype : kEveryDType) {
    SCOPED_TRACE(DTypeName(dtype));
    for (int root = 0; root < world; ++root) {
      Tensor mine = Sample(dtype, 777, Group()->rank()).to(Gpu());
      Group()->broadcast(mine, root)->wait();
      EXPECT_EQ(testing::MaxAbsDiff(mine.to(Device::Cpu(0)), Sample(dtype, 777, root)), 0.0)
          << "root " << root;
    }
    Tensor gathered = empty({world * 513}, TensorOptions().dtype(dtype).device(Gpu()));
    Group()->allgather(gathered, Sample(dtype, 513, Group()->rank()).to(Gpu()))->wait();
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(testing::MaxAbsDiff(gathered.narrow(0, r * 513, 513).to(Device::Cpu(0)),
                                    Sample(dtype, 513, r)),
                0.0)
          << "rank " << r << "'s part";
    }
  }
  Group()->barrier()->wait();
}

// reduce_scatter_tensor: rank r gets chunk r of the sum in rank order, for chunks of no size,
// one element and primes (uneven against any vector width or staging round).
TEST_F(NcclRanksTest, ReduceScatterOfEveryDTypeEqualsChunkRankOfTheCpuSum) {
  const int world = Group()->size();
  const int rank = Group()->rank();
  for (DType dtype : kEveryDType) {
    if (dtype == kBool) continue;  // refused: ReduceScatterMisuseIsAClearErrorOnEveryRank
    SCOPED_TRACE(DTypeName(dtype));
    // 70,001 float64 per rank: more than one staging round of the simulated NCCL (1 MB per rank
    // and round: 65,536 float64 elements per chunk on 2 ranks, 43,690 on 3).
    std::vector<int64_t> chunks = {0, 1, 7, 1009};
    if (dtype == kFloat64) chunks.push_back(70001);
    for (int64_t chunk : chunks) {
      const int64_t n = world * chunk;
      Tensor want = Sample(dtype, n, 0);
      for (int r = 1; r < world; ++r) want = add(want, Sample(dtype, n, r));
      want = want.narrow(0, rank * chunk, chunk);
      Tensor input = Sample(dtype, n, rank).to(Gpu());
      Tensor output = full({chunk}, 5.0, TensorOptions().dtype(dtype).device(Gpu()));
      std::shared_ptr<Work> work = Group()->reduce_scatter(output, input);
      work->wait();
      EXPECT_TRUE(work->is_completed());
      EXPECT_EQ(testing::MaxAbsDiff(output.to(Device::Cpu(0)), want), 0.0) << chunk;
      EXPECT_EQ(testing::MaxAbsDiff(input.to(Device::Cpu(0)), Sample(dtype, n, rank)), 0.0)
          << "the input changed";
      if (IsFloatingPoint(dtype)) {
        Tensor average = empty({chunk}, TensorOptions().dtype(dtype).device(Gpu()));
        Group()->reduce_scatter(average, input, ReduceOp::kAverage)->wait();
        // As the all-reduce's average: each value times 1/world, rounded to the dtype, first.
        const double tolerance = IsReducedFloatingPoint(dtype) ? 0.25 : 1e-5;
        EXPECT_LE(
            testing::MaxAbsDiff(average.to(Device::Cpu(0)), mul(want.to(kFloat64), 1.0 / world)),
            tolerance)
            << chunk;
      }
    }
  }
}

// ZeRO's step in miniature, issued at once on the side stream and waited for in reverse order:
// reduce_scatter then allgather of the shards equal the all-reduce (integers: exact sums).
TEST_F(NcclRanksTest, ReduceScatterThenAllgatherEqualsAllreduce) {
  const int world = Group()->size();
  for (int64_t chunk : {int64_t{1}, int64_t{4099}}) {
    Tensor gradients = Sample(kInt32, world * chunk, Group()->rank()).to(kFloat32).to(Gpu());
    Tensor reference = gradients.clone();
    Tensor shard = empty({chunk}, TensorOptions().device(Gpu()));
    Tensor gathered = empty({world * chunk}, TensorOptions().device(Gpu()));
    std::vector<std::shared_ptr<Work>> works;
    works.push_back(Group()->reduce_scatter(shard, gradients));
    works.push_back(Group()->allgather(gathered, shard));
    works.push_back(Group()->allreduce(reference));
    for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait();
    EXPECT_EQ(gathered.to_vector<float>(), reference.to_vector<float>()) << chunk;
  }
}

// SyncBatchNorm over NCCL, under DistributedDataParallel: rank r normalises r + 2 samples on its
// GPU, and its output, input gradient and running statistics equal a plain BatchNorm over every
// rank's samples on the CPU, and DDP's averaged weight and bias gradients are the plain layer's
// over the world size (PyTorch's assertion, as sync_batch_norm_test replays it over MPI).
TEST_F(NcclRanksTest, SyncBatchNormOnTheGpusEqualsBatchNormOverTheWholeBatch) {
  const int rank = Group()->rank(), world = Group()->size();
  int64_t offset = 0, total = 0;
  for (int q = 0; q < world; ++q) {
    if (q < rank) offset += q + 2;
    total += q + 2;
  }
  const int64_t rows = rank + 2;
  nn::BatchNorm2d plain(3);
  auto synced = std::make_shared<nn::BatchNorm2d>(3);
  plain.to(kFloat64);
  synced->to(kFloat64);
  synced->to(Gpu());
  {
    Generator gen(39);  // a weight and bias of their own, alike on every rank
    NoGradGuard no_grad;
    const Tensor w = rand({3}, TensorOptions().dtype(kFloat64), &gen) + 0.5;
    const Tensor b = randn({3}, TensorOptions().dtype(kFloat64), &gen);
    plain.weight().copy_(w);
    plain.bias().copy_(b);
    synced->weight().copy_(w.to(Gpu()));
    synced->bias().copy_(b.to(Gpu()));
  }
  EXPECT_EQ(ConvertSyncBatchNorm(*synced, Group()), 1);
  DistributedDataParallel ddp(synced, Group());
  for (int step = 0; step < 2; ++step) {
    plain.zero_grad();
    synced->zero_grad();
    Generator gen(40 + step);
    const Tensor all = randn({total, 3, 4, 4}, TensorOptions().dtype(kFloat64), &gen) * 2.0 + 1.0;
    const Tensor upstream = randn({total, 3, 4, 4}, TensorOptions().dtype(kFloat64), &gen);
    Tensor x_all = all.clone();
    x_all.set_requires_grad(true);
    const Tensor y_all = plain.forward(x_all);
    (y_all * upstream).sum().backward();
    Tensor x = all.narrow(0, offset, rows).to(Gpu());
    x.set_requires_grad(true);
    const Tensor y = ddp.forward(x);
    (y * upstream.narrow(0, offset, rows).to(Gpu())).sum().backward();
    EXPECT_LT(testing::MaxAbsDiff(y.to(Device::Cpu(0)), y_all.narrow(0, offset, rows)), 1e-10)
        << step;
    EXPECT_LT(
        testing::MaxAbsDiff(x.grad().to(Device::Cpu(0)), x_all.grad().narrow(0, offset, rows)),
        1e-10)
        << step;
    EXPECT_LT(testing::MaxAbsDiff(synced->running_mean().to(Device::Cpu(0)), plain.running_mean()),
              1e-10);
    EXPECT_LT(testing::MaxAbsDiff(synced->running_var().to(Device::Cpu(0)), plain.running_var()),
              1e-10);
    // (DDP's buckets are float32: the averaged float64 gradients are rounded to float32.)
    for (const auto& [got, want] :
         {std::pair{synced->weight(), plain.weight()}, std::pair{synced->bias(), plain.bias()}}) {
      EXPECT_LT(testing::MaxAbsDiff(got.grad().to(Device::Cpu(0)) * static_cast<double>(world),
                                    want.grad()),
                1e-5)
          << step;
    }
  }
}

// Refused on every rank before anything is issued, saying what to do; the group goes on.
TEST_F(NcclRanksTest, ReduceScatterMisuseIsAClearErrorOnEveryRank) {
  const int world = Group()->size();
  const std::string rank = tandem::internal::Concat(
      "ProcessGroupNccl rank ", Group()->rank(), " of ", world, " on ", Gpu(), ": reduce_scatter");
  const TensorOptions on_gpu = TensorOptions().device(Gpu());
  auto on = [](DType dtype) { return TensorOptions().dtype(dtype).device(Gpu()); };
  auto error = [&](Tensor output, Tensor input, ReduceOp op = ReduceOp::kSum) {
    return testing::ErrorOf([&] { Group()->reduce_scatter(output, input, op); });
  };
  EXPECT_THAT(error(zeros({2}, on_gpu), zeros({2 * world + 1}, on_gpu)),
              HasSubstr(rank + ": the input must hold world size x output = " +
                        std::to_string(world) + " x 2 = " + std::to_string(2 * world) +
                        " elements but holds " + std::to_string(2 * world + 1) +
                        ", not a multiple of the world size; pad the input"));
  EXPECT_THAT(error(zeros({3}, on_gpu), zeros({2 * world}, on_gpu)),
              HasSubstr("; make the output input.numel() / world size = 2 elements"));
  EXPECT_THAT(error(zeros({2}, on_gpu), zeros({2 * world}, on(kFloat64))),
              HasSubstr(rank + ": the output must have the input's dtype, but the input is "
                               "float64 and the output float32"));
  EXPECT_THAT(error(zeros({2}, on(kBool)), zeros({2 * world}, on(kBool))),
              HasSubstr(rank + " of bool tensors is not defined"));
  EXPECT_THAT(error(zeros({2}, on(kInt32)), zeros({2 * world}, on(kInt32)), ReduceOp::kAverage),
              HasSubstr(rank + ": average is defined for floating-point tensors but these are "
                               "int32"));
  EXPECT_THAT(error(zeros({2}), zeros({2 * world}, on_gpu)),
              HasSubstr(rank + " takes tensors on " + Gpu().ToString() +
                        " (this group's device) but the output tensor is on cpu"));
  EXPECT_THAT(error(zeros({2, 3}, on_gpu).t(), zeros({6 * world}, on_gpu)),
              HasSubstr(rank + ": the output tensor must be contiguous"));
  Tensor both = zeros({3 * world}, on_gpu);
  EXPECT_THAT(error(both.narrow(0, 0, 3), both),
              HasSubstr(rank + ": the output must not share storage with the input"));
  Tensor out = zeros({2}, on_gpu);
  Group()->reduce_scatter(out, ones({2 * world}, on_gpu))->wait();
  EXPECT_EQ(out.to_vector<float>(), std::vector<float>(2, static_cast<float>(world)));
}

TEST_F(NcclRanksTest, AllreduceOfBoolIsAClearError) {
  Tensor flags = ones({3}, TensorOptions().dtype(kBool).device(Gpu()));
  EXPECT_THAT(testing::ErrorOf([&] { Group()->allreduce(flags); }),
              HasSubstr("allreduce of bool tensors is not defined"));
}

constexpr int64_t kPerRank = 8;

std::shared_ptr<nn::Sequential> MakeModel(uint64_t seed) {
  manual_seed(seed);
  return std::make_shared<nn::Sequential>(nn::Linear(6, 5), nn::ReLU(), nn::Linear(5, 3));
}

struct Batch {
  Tensor x, y;
};
Batch MakeBatch(int world, uint64_t step) {
  Generator gen(1000 + step);
  const int64_t n = kPerRank * world;
  Tensor x = randn({n, 6}, {}, &gen);
  std::vector<int64_t> labels(n);
  for (int64_t i = 0; i < n; ++i) labels[i] = (i * 7 + static_cast<int64_t>(step)) % 3;
  return Batch{x, from_vector(labels, {n})};
}

// DDP over NCCL on every rank's GPU: the gradients of one process on every rank's samples, with
// float32 buckets exactly (to float32 summation error), with bfloat16 compression within
// bfloat16's precision, and every rank's gradients alike to the bit.
TEST_F(NcclRanksTest, DistributedDataParallelOnCudaEqualsOneProcess) {
  const int world = Group()->size();
  const int rank = Group()->rank();
  for (bool compressed : {false, true}) {
    for (double cap_mb : {25.0, 0.00001}) {
      SCOPED_TRACE(tandem::internal::Concat(compressed ? "bfloat16" : "float32",
                                            " buckets, bucket_cap_mb ", cap_mb));
      auto model = MakeModel(5 + rank);  // DDP copies rank 0's parameters
      model->to(Gpu());
      auto options = DistributedDataParallelOptions().bucket_cap_mb(cap_mb);
      if (compressed) options.gradient_compression(kBFloat16);
      DistributedDataParallel ddp(model, Group(), options);
      auto reference = MakeModel(5);
      const Batch all = MakeBatch(world, 3);
      Tensor x = all.x.narrow(0, rank * kPerRank, kPerRank).contiguous().to(Gpu());
      Tensor y = all.y.narrow(0, rank * kPerRank, kPerRank).contiguous().to(Gpu());
      cross_entropy(ddp.forward(x), y).backward();
      cross_entropy(reference->forward(all.x), all.y).backward();
      std::vector<Tensor> got = model->parameters();
      std::vector<Tensor> want = reference->parameters();
      for (size_t i = 0; i < got.size(); ++i) {
        const Tensor grad = got[i].grad();
        ASSERT_TRUE(grad.defined()) << i;
        EXPECT_EQ(grad.dtype(), kFloat32);
        double largest = amax(abs(want[i].grad()).reshape({-1}), 0).item();
        // bfloat16: each rank's gradient rounded (2^-8 relative), scaled and summed in
        // bfloat16 steps: a few of its ulps of the largest gradient.
        const double tolerance = compressed ? 4 * std::ldexp(1.0, -8) * largest + 1e-6 : 1e-5;
        EXPECT_LE(testing::MaxAbsDiff(grad, want[i].grad()), tolerance) << i;
        if (compressed) EXPECT_GT(testing::MaxAbsDiff(grad, want[i].grad()), 0.0) << i;
        Tensor everyone = empty({world * grad.numel()}, TensorOptions().device(Gpu()));
        Group()->allgather(everyone, grad.reshape({-1}).contiguous())->wait();
        for (int r = 1; r < world; ++r) {
          EXPECT_EQ(everyone.narrow(0, r * grad.numel(), grad.numel()).to_vector<float>(),
                    everyone.narrow(0, 0, grad.numel()).to_vector<float>())
              << "rank " << r << " parameter " << i;
        }
      }
    }
  }
}

// FullyShardedDataParallel over NCCL (FULL_SHARD, a unit per layer; all-gathers before forward
// and backward, reduce-scatters in backward, all on the GPUs) trains as DistributedDataParallel
// over MPI on the CPU does, on the same global batches.
TEST_F(NcclRanksTest, FullyShardedDataParallelOnCudaEqualsDdpOnTheCpu) {
  const int world = Group()->size();
  const int rank = Group()->rank();
  auto sharded = MakeModel(5);
  sharded->to(Gpu());
  FullyShardedDataParallel fsdp(
      sharded, Group(),
      FullyShardedDataParallelOptions().auto_wrap_policy(
          [](const std::string&, const nn::Module& m) { return !m.parameters(false).empty(); }));
  auto whole = MakeModel(5);
  DistributedDataParallel ddp(whole, TestGroup());
  nn::SGD fsdp_optimizer(fsdp.parameters(), nn::SGDOptions(0.1).momentum(0.9));
  nn::SGD ddp_optimizer(whole->parameters(), nn::SGDOptions(0.1).momentum(0.9));
  for (int step = 0; step < 3; ++step) {
    const Batch all = MakeBatch(world, 10 + step);
    const Tensor x = all.x.narrow(0, rank * kPerRank, kPerRank).contiguous();
    const Tensor y = all.y.narrow(0, rank * kPerRank, kPerRank).contiguous();
    fsdp_optimizer.zero_grad();
    cross_entropy(fsdp.forward(x.to(Gpu())), y.to(Gpu())).backward();
    fsdp_optimizer.step();
    ddp_optimizer.zero_grad();
    cross_entropy(ddp.forward(x), y).backward();
    ddp_optimizer.step();
  }
  const std::vector<nn::NamedTensor> got = fsdp.full_state_dict();
  const std::vector<nn::NamedTensor> want = whole->state_dict();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].value.device(), Gpu());
    EXPECT_LE(testing::MaxAbsDiff(got[i].value.to(Device::Cpu(0)), want[i].value), 1e-5)
        << got[i].name;
  }
}

// A rank that skips a collective: the others' wait() throws after the timeout instead of
// hanging, naming the collective and the rank that did not answer (on 3 ranks also the rank
// that waits in it too), and their group refuses further collectives; the late rank's own
// collective then fails too instead of waiting for the aborted peers. The fragile group runs
// on another simulated GPU than Group(): an aborted NCCL collective leaves its device with a
// sticky error, as a failed kernel does. Last in the file, as the one-rank tests use cuda:0.
TEST_F(NcclRanksTest, ARankThatSkipsACollectiveIsNamedByTheOthersAfterTheTimeout) {
  const int world = TestGroup()->size();
  const int rank = TestGroup()->rank();
  const Device gpu = Device::Cuda((rank + 1) % cuda::DeviceCount());
  ProcessGroupNccl fragile(gpu, TestGroup(),
                           ProcessGroupNcclOptions()
                               .timeout(std::chrono::milliseconds(1500))
                               .timeout_name("--collective_timeout"));
  Tensor t = ones({1000}, TensorOptions().device(gpu));
  fragile.allreduce(t)->wait();
  EXPECT_EQ(t.to_vector<float>()[0], static_cast<float>(world));
  if (rank != 1) {
    const auto start = std::chrono::steady_clock::now();
    const std::string error = testing::ErrorOf([&] { fragile.allreduce(t)->wait(); });
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("rank %d's error: %s\n", rank, error.c_str());
    EXPECT_GE(seconds, 1.5);
    EXPECT_LT(seconds, 10.0);
    EXPECT_THAT(error, HasSubstr(tandem::internal::Concat(
                           "ProcessGroupNccl rank ", rank, " of ", world, " on ", gpu,
                           ": allreduce (sum) of 1000 float32 elements did not finish within "
                           "1.5 s: rank 1 did not answer (stopped, hung or dead")));
    EXPECT_THAT(error, HasSubstr("raise --collective_timeout if a rank is only slow"));
    if (world == 3) {
      EXPECT_THAT(error,
                  HasSubstr("rank " + std::to_string(2 - rank) + " waits in this collective too"));
    }
    EXPECT_THAT(testing::ErrorOf([&] { fragile.barrier(); }),
                HasSubstr("cannot run barrier: the group failed earlier and its NCCL "
                          "communicator was aborted: "));
  }
  TestGroup()->barrier()->wait();  // rank 1 waits here, outside the NCCL group's collectives
  if (rank == 1) {
    // The simulated NCCL reports the peers' abort at once (as the watchdog's "NCCL reports", or,
    // when it fails the device before this collective is issued, as "could not be issued"); a
    // GPU's NCCL may only leave the collective waiting, for this rank's own watchdog to time out.
    const std::string error = testing::ErrorOf([&] { fragile.allreduce(t)->wait(); });
    std::printf("rank 1's error: %s\n", error.c_str());
    EXPECT_THAT(
        error, HasSubstr(tandem::internal::Concat("ProcessGroupNccl rank 1 of ", world, " on ", gpu,
                                                  ": allreduce (sum) of 1000 float32 "
                                                  "elements ")));
    EXPECT_THAT(error, AnyOf(HasSubstr("ncclCommAbort"), HasSubstr("did not finish within 1.5 s")));
  }
}

}  // namespace
}  // namespace tandem::parallel::distributed
