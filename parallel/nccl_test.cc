// comm's GPU paths: NCCL between distinct physical GPUs (the simulator's NCCL under
// --config=cudasim), device copies between logical devices on one GPU
// (TANDEM_CUDA_LOGICAL_DEVICES=2), both against host arithmetic, for every dtype. Skips without
// two CUDA devices.
#include <gtest/gtest.h>

#include <string>

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
  ASSERT_NE(backend, nullptr) << "the NCCL backend registers itself in CUDA builds (and "
                                 "under --config=cudasim, whose NCCL is the simulator's)";
  const bool distinct = cuda::PhysicalDevice(0) != cuda::PhysicalDevice(1);
  for (int code = 0; code < kNumDTypes; ++code) {
    // Every dtype of Tensor has an NCCL type (bool and uint8 as ncclUint8).
    EXPECT_EQ(backend->Supports(devices_, static_cast<DType>(code)), distinct) << code;
  }
  EXPECT_FALSE(backend->Supports({Device::Cuda(0)}, kFloat32));
  EXPECT_FALSE(backend->Supports({Device::Cuda(0), Device::Cpu(0)}, kFloat32));
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

// Values of every dtype that a sum of two keeps in range (bool: or; uint8: below 128).
Tensor Sample(DType dtype, int64_t n) {
  Tensor x = randn({n});
  if (dtype == kBool) return gt(x, zeros({}));
  if (IsFloatingPoint(dtype)) return mul(x, 8.0).to(dtype);
  if (dtype == kUInt8) return abs(mul(x, 30.0)).to(kInt64).to(dtype);
  return mul(x, 1000.0).to(kInt64).to(dtype);
}

class GpuCommDTypeTest : public GpuCommTest, public ::testing::WithParamInterface<DType> {};

// Broadcast and reduce-add of buckets of each dtype, through whichever path serves the two
// devices (NCCL between distinct GPUs), against the CPU: the same bits. A bucket sent with the
// wrong NCCL type reads and writes past its buffer or adds bit patterns as other numbers.
TEST_P(GpuCommDTypeTest, BroadcastAndReduceAddMatchTheCpu) {
  const DType dtype = GetParam();
  manual_seed(11);
  std::vector<Tensor> host = {Sample(dtype, 1000), Sample(dtype, 3), Sample(dtype, 257)};
  std::vector<Tensor> other = {Sample(dtype, 1000), Sample(dtype, 3), Sample(dtype, 257)};
  std::vector<Tensor> on_gpu;
  for (const Tensor& t : host) on_gpu.push_back(t.to(Device::Cuda(0)));
  // 1 KiB buckets: several per call, some holding more than one tensor.
  std::vector<std::vector<Tensor>> copies = broadcast_coalesced(on_gpu, devices_, 1024);
  for (size_t d = 0; d < devices_.size(); ++d) {
    for (size_t i = 0; i < host.size(); ++i) {
      ASSERT_EQ(copies[d][i].dtype(), dtype);
      EXPECT_EQ(MaxAbsDiff(copies[d][i].to(Device::Cpu(0)), host[i]), 0.0) << d << " " << i;
    }
  }
  std::vector<std::vector<Tensor>> inputs = {on_gpu, {}};
  for (const Tensor& t : other) inputs[1].push_back(t.to(Device::Cuda(1)));
  for (Device destination : devices_) {
    std::vector<Tensor> sums = reduce_add_coalesced(inputs, destination, 1024);
    for (size_t i = 0; i < host.size(); ++i) {
      ASSERT_EQ(sums[i].device(), destination);
      ASSERT_EQ(sums[i].dtype(), dtype);
      // CPU add of two values of a 16-bit dtype rounds once, as one NCCL reduction step does.
      EXPECT_EQ(MaxAbsDiff(sums[i].to(Device::Cpu(0)), add(host[i], other[i])), 0.0)
          << destination << " " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EveryDType, GpuCommDTypeTest,
                         ::testing::Values(kFloat32, kFloat64, kBFloat16, kFloat16, kInt64, kInt32,
                                           kUInt8, kBool),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

}  // namespace
}  // namespace tandem::parallel
