// comm's GPU paths: NCCL between distinct physical GPUs, device copies between logical
// devices on one GPU (TANDEM_CUDA_LOGICAL_DEVICES=2), both against host arithmetic. Skips
// without two CUDA devices.
#include <gtest/gtest.h>

#include "parallel/comm.h"
#include "parallel/internal/comm_backend.h"
#include "tensor/cuda/cuda.h"
#include "tensor/testing.h"

namespace tandem::parallel {
namespace {

using ::tandem::testing::HasCuda;
using ::tandem::testing::MaxAbsDiff;

class GpuCommTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HasCuda()) GTEST_SKIP() << ::tandem::testing::NoCudaReason();
    if (cuda::DeviceCount() < 2) {
      GTEST_SKIP() << "needs two CUDA devices (two GPUs, or TANDEM_CUDA_LOGICAL_DEVICES=2)";
    }
    devices_ = {Device::Cuda(0), Device::Cuda(1)};
  }
  std::vector<Device> devices_;
};

TEST_F(GpuCommTest, TheBackendServesDistinctGpusOnly) {
  internal::CommBackend* backend = internal::GetCommBackend();
#if !TANDEM_WITH_NCCL
  // A build without NCCL (--config=cudasim): comm's device copies serve every device set.
  EXPECT_EQ(backend, nullptr) << "no NCCL is linked, yet an backend registered itself";
  return;
#endif
  ASSERT_NE(backend, nullptr) << "the NCCL backend registers itself in CUDA builds";
  const bool distinct = cuda::PhysicalDevice(0) != cuda::PhysicalDevice(1);
  EXPECT_EQ(backend->Supports(devices_), distinct);
  EXPECT_FALSE(backend->Supports({Device::Cuda(0)}));
  EXPECT_FALSE(backend->Supports({Device::Cuda(0), Device::Cpu(0)}));
}

TEST_F(GpuCommTest, BroadcastAndReduceMatchTheHost) {
  manual_seed(3);
  std::vector<Tensor> host = {randn({257, 3}), randn({5}), arange(7)};
  std::vector<Tensor> on_gpu;
  for (const Tensor& t : host) on_gpu.push_back(t.to(Device::Cuda(0)));
  // A small buffer: several buckets.
  std::vector<std::vector<Tensor>> copies = broadcast_coalesced(on_gpu, devices_, 1024);
  for (size_t d = 0; d < devices_.size(); ++d) {
    for (size_t i = 0; i < host.size(); ++i) {
      EXPECT_EQ(copies[d][i].device(), devices_[d]);
      EXPECT_EQ(MaxAbsDiff(copies[d][i].to(Device::Cpu(0)), host[i]), 0.0) << d << " " << i;
    }
  }
  std::vector<Tensor> sums = reduce_add_coalesced(copies, Device::Cuda(0), 1024);
  for (size_t i = 0; i < host.size(); ++i) {
    EXPECT_EQ(sums[i].device(), Device::Cuda(0));
    EXPECT_LE(MaxAbsDiff(sums[i].to(Device::Cpu(0)), add(host[i], host[i])), 1e-6) << i;
  }
}

}  // namespace
}  // namespace tandem::parallel
