// Copies between CUDA devices, on two logical devices mapped onto GPU 0
// (TANDEM_CUDA_LOGICAL_DEVICES=2, set below unless the environment already chose), which
// is how multi-device code is tested on a machine with one GPU: each logical device has
// its own streams and memory pool, so the ordering between them is real. Skips (with the
// reason) where there is no usable GPU. Streams, events and RecordStream across the two
// devices are tested in cuda_stream_test.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "tensor/base/device.h"
#include "tensor/base/error.h"
#include "tensor/cuda/cuda.h"
#include "tensor/runtime/allocator.h"
#include "tensor/runtime/backend.h"
#include "tensor/runtime/devices.h"

namespace tandem {
namespace {

// Before main(), so before the CUDA backend looks at the environment.
const bool kLogicalDevicesSet = [] {
  setenv("TANDEM_CUDA_LOGICAL_DEVICES", "2", /*overwrite=*/0);
  return true;
}();

class CudaMultiDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(kLogicalDevicesSet);
    if (DeviceCount(DeviceType::kCUDA) == 0) {
      GTEST_SKIP() << "no usable CUDA device: " << cuda::UnavailableReason();
    }
    ASSERT_GE(DeviceCount(DeviceType::kCUDA), 2)
        << "TANDEM_CUDA_LOGICAL_DEVICES=" << std::getenv("TANDEM_CUDA_LOGICAL_DEVICES");
  }

  std::vector<float> Download(int device, const std::shared_ptr<void>& block, int64_t n) {
    std::vector<float> host(n);
    gpu_.CopyToHost(device, host.data(), block.get(), n * sizeof(float));
    return host;
  }

  Backend& gpu_ = GetBackend(DeviceType::kCUDA);
};

TEST_F(CudaMultiDeviceTest, LogicalDevicesShareOneGpuWithSeparateStreamsAndPools) {
  EXPECT_EQ(cuda::PhysicalDevice(0), 0);
  EXPECT_EQ(cuda::PhysicalDevice(1), 0);
  EXPECT_NE(cuda::Stream(0), cuda::Stream(1));
  EXPECT_NE(&GetAllocator(Device::Cuda(0)), &GetAllocator(Device::Cuda(1)));
  const int64_t before = GetMemoryStats(Device::Cuda(1)).in_use_bytes;
  std::shared_ptr<void> on_0 = GetAllocator(Device::Cuda(0)).Allocate(1 << 20);
  EXPECT_EQ(GetMemoryStats(Device::Cuda(1)).in_use_bytes, before);
  EXPECT_NO_THROW(CheckAvailable(Device::Cuda(1)));
}

TEST_F(CudaMultiDeviceTest, CopyWaitsForWorkQueuedOnTheSource) {
  const int64_t n = 1 << 24;  // 64 MiB: the fill is still running when the copy is queued
  std::shared_ptr<void> src = GetAllocator(Device::Cuda(0)).Allocate(n * sizeof(float));
  std::shared_ptr<void> dst = GetAllocator(Device::Cuda(1)).Allocate(n * sizeof(float));
  gpu_.Fill(1, KernelTensor::Vector(dst.get(), n), -1.0);
  for (int round = 1; round <= 3; ++round) {
    gpu_.Fill(0, KernelTensor::Vector(src.get(), n), round);
    gpu_.CopyBetweenDevices(1, dst.get(), 0, src.get(), n * sizeof(float));
    const std::vector<float> result = Download(1, dst, n);
    for (int64_t i = 0; i < n; i += 65537) ASSERT_EQ(result[i], round) << i;
    ASSERT_EQ(result[n - 1], round);
  }
}

TEST_F(CudaMultiDeviceTest, SourceBlockIsNotOverwrittenBeforeTheCopyHasReadIt) {
  const int64_t n = 1 << 24;
  EmptyCache(Device::Cuda(0));  // so that the block freed below is the only one to reuse
  std::shared_ptr<void> dst = GetAllocator(Device::Cuda(1)).Allocate(n * sizeof(float));
  void* first_src = nullptr;
  {
    std::shared_ptr<void> src = GetAllocator(Device::Cuda(0)).Allocate(n * sizeof(float));
    first_src = src.get();
    gpu_.Fill(0, KernelTensor::Vector(src.get(), n), 7.0);
    gpu_.CopyBetweenDevices(1, dst.get(), 0, src.get(), n * sizeof(float));
  }  // freed at once; cuda:0's stream does not wait for the copy
  // cuda:0's allocator hands the block out again only once the copy (on cuda:1's stream)
  // has read it: the copy recorded cuda:1's stream on it. cuda_stream_test checks with a
  // spinning stream that it is really held back; here the copy may well be done already.
  std::shared_ptr<void> reused = GetAllocator(Device::Cuda(0)).Allocate(n * sizeof(float));
  gpu_.Fill(0, KernelTensor::Vector(reused.get(), n), -3.0);
  const std::vector<float> result = Download(1, dst, n);
  for (int64_t i = 0; i < n; i += 65537) ASSERT_EQ(result[i], 7.0f) << i;
  EXPECT_EQ(Download(0, reused, 1)[0], -3.0f);
  if (reused.get() != first_src) {
    gpu_.Synchronize(1);
    std::shared_ptr<void> later = GetAllocator(Device::Cuda(0)).Allocate(n * sizeof(float));
    EXPECT_EQ(later.get(), first_src) << "the block was never released after the copy";
  }
}

TEST_F(CudaMultiDeviceTest, RoundTripThroughBothDevicesAndTheHost) {
  for (int64_t n : {0, 1, 5, 300007}) {
    std::vector<float> host(n);
    std::iota(host.begin(), host.end(), 1.0f);
    std::shared_ptr<void> a = GetAllocator(Device::Cuda(0)).Allocate(n * sizeof(float));
    std::shared_ptr<void> b = GetAllocator(Device::Cuda(1)).Allocate(n * sizeof(float));
    gpu_.CopyFromHost(0, a.get(), host.data(), n * sizeof(float));
    gpu_.CopyBetweenDevices(1, b.get(), 0, a.get(), n * sizeof(float));
    EXPECT_EQ(Download(1, b, n), host);
  }
}

}  // namespace
}  // namespace tandem
