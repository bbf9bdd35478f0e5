// ProcessGroupNccl with one process (world size 1) on cuda:0; skips without a GPU. More ranks
// need one GPU each (NCCL refuses two ranks on one GPU), which this test does not assume.
#include "parallel/distributed/process_group_nccl.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "nn/nn.h"
#include "parallel/distributed/distributed_data_parallel.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace tandem::parallel::distributed {
namespace {

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

}  // namespace
}  // namespace tandem::parallel::distributed
