// The CUDA caching allocator with cudaMalloc behind it, pinned host memory, and copies
// between the host and a device. Skips (with the reason) where there is no usable GPU.
// The pooling logic itself is tested without a GPU in caching_allocator_test.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
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

constexpr Device kCuda0 = Device::Cuda(0);

class CudaMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (DeviceCount(DeviceType::kCUDA) == 0) {
      GTEST_SKIP() << "no usable CUDA device: " << cuda::UnavailableReason();
    }
    SetMemoryLimit(kCuda0, 0);
  }
  void TearDown() override {
    if (DeviceCount(DeviceType::kCUDA) > 0) SetMemoryLimit(kCuda0, 0);
  }

  Backend& gpu_ = GetBackend(DeviceType::kCUDA);
};

TEST_F(CudaMemoryTest, SteadyLoopReusesBlocksWithoutCudaMalloc) {
  Allocator& allocator = GetAllocator(kCuda0);
  // One "step": the allocations of a small MLP's forward and backward, with a kernel on
  // each block so that freed blocks are still in use by queued work when reused.
  auto step = [&] {
    std::vector<std::shared_ptr<void>> blocks;
    for (size_t floats : {784 * 256, 256 * 128, 128 * 10, 64 * 784, 64 * 256, 64 * 10, 1}) {
      blocks.push_back(allocator.Allocate(floats * sizeof(float)));
      gpu_.Fill(0, KernelTensor::Vector(blocks.back().get(), static_cast<int64_t>(floats)), 1.0);
    }
    blocks.erase(blocks.begin() + 3);
    blocks.push_back(allocator.Allocate(64 * 784 * sizeof(float)));
  };
  step();
  const MemoryStats before = allocator.Stats();
  for (int i = 0; i < 1000; ++i) step();
  gpu_.Synchronize(0);
  const MemoryStats after = allocator.Stats();
  EXPECT_EQ(after.num_system_allocations, before.num_system_allocations);
  EXPECT_EQ(after.reserved_bytes, before.reserved_bytes);
  EXPECT_EQ(after.num_allocations, before.num_allocations + 1000 * 8);
  EXPECT_EQ(after.in_use_bytes, before.in_use_bytes);
}

TEST_F(CudaMemoryTest, StatisticsTrackLiveBytesAndPeak) {
  Allocator& allocator = GetAllocator(kCuda0);
  const MemoryStats start = allocator.Stats();
  allocator.ResetPeak();
  {
    std::shared_ptr<void> a = allocator.Allocate(3 << 20);
    std::shared_ptr<void> b = allocator.Allocate(1000);
    const MemoryStats during = allocator.Stats();
    EXPECT_EQ(during.in_use_bytes, start.in_use_bytes + (3 << 20) + 1000);
    EXPECT_GE(during.reserved_bytes, during.in_use_bytes);
    EXPECT_EQ(during.peak_bytes, during.in_use_bytes);
  }
  const MemoryStats end = allocator.Stats();
  EXPECT_EQ(end.in_use_bytes, start.in_use_bytes);
  EXPECT_EQ(end.peak_bytes, start.in_use_bytes + (3 << 20) + 1000);
  EXPECT_GT(end.reserved_bytes, 0);  // kept in the cache...
  EmptyCache(kCuda0);
  EXPECT_LT(allocator.Stats().reserved_bytes, end.reserved_bytes);  // ...until emptied
}

TEST_F(CudaMemoryTest, LimitGivesAnOutOfMemoryError) {
  SetMemoryLimit(kCuda0, GetMemoryStats(kCuda0).in_use_bytes + (1 << 20));
  std::shared_ptr<void> fits = GetAllocator(kCuda0).Allocate(1 << 19);
  try {
    GetAllocator(kCuda0).Allocate(1 << 20);
    FAIL() << "expected out of memory";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("out of memory on cuda:0"), std::string::npos) << message;
    EXPECT_NE(message.find("1.00 MiB"), std::string::npos) << message;
  }
}

TEST_F(CudaMemoryTest, CudaMallocFailureIsAClearErrorAndLeavesTheDeviceUsable) {
  // Far more than any GPU has: cudaMalloc fails even after the cache is emptied.
  const size_t huge = size_t{1} << 50;
  try {
    GetAllocator(kCuda0).Allocate(huge);
    FAIL() << "expected out of memory";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("out of memory on cuda:0"), std::string::npos) << message;
    EXPECT_NE(message.find("cudaMalloc"), std::string::npos) << message;
    EXPECT_NE(message.find("cudaErrorMemoryAllocation"), std::string::npos) << message;
  }
  // The failure must not linger as the thread's last CUDA error (it would be blamed on the
  // next kernel launch).
  std::shared_ptr<void> block = GetAllocator(kCuda0).Allocate(64 * sizeof(float));
  EXPECT_NO_THROW(gpu_.Fill(0, KernelTensor::Vector(block.get(), 64), 3.0));
  std::vector<float> host(64);
  gpu_.CopyToHost(0, host.data(), block.get(), 64 * sizeof(float));
  EXPECT_EQ(host, std::vector<float>(64, 3.0f));
}

TEST_F(CudaMemoryTest, PinnedCopiesMayFreeTheSourceAtOnce) {
  const int64_t n = 1 << 22;  // 16 MiB: the copy takes long enough to overlap what follows
  std::shared_ptr<void> device = GetAllocator(kCuda0).Allocate(n * sizeof(float));
  void* first_pinned = nullptr;
  {
    std::shared_ptr<void> pinned = gpu_.AllocatePinnedHost(n * sizeof(float));
    ASSERT_NE(pinned, nullptr);
    first_pinned = pinned.get();
    float* values = static_cast<float*>(pinned.get());
    std::iota(values, values + n, 0.0f);
    gpu_.CopyFromHost(0, device.get(), pinned.get(), n * sizeof(float));  // asynchronous
  }  // freed while the copy may still be reading it
  // A new pinned block of the same size must not be the one still being read, or if it is
  // (the copy has finished), overwriting it must not change what reached the device.
  std::shared_ptr<void> again = gpu_.AllocatePinnedHost(n * sizeof(float));
  std::memset(again.get(), 0xff, n * sizeof(float));
  std::vector<float> result(n);
  gpu_.CopyToHost(0, result.data(), device.get(), n * sizeof(float));
  for (int64_t i = 0; i < n; i += 4097) ASSERT_EQ(result[i], static_cast<float>(i)) << i;
  ASSERT_EQ(result[n - 1], static_cast<float>(n - 1));
  // Once the copy is done, the block comes back from the cache.
  gpu_.Synchronize(0);
  again.reset();
  std::shared_ptr<void> third = gpu_.AllocatePinnedHost(n * sizeof(float));
  std::shared_ptr<void> fourth = gpu_.AllocatePinnedHost(n * sizeof(float));
  EXPECT_TRUE(third.get() == first_pinned || fourth.get() == first_pinned);
}

TEST_F(CudaMemoryTest, PageableCopiesRoundTrip) {
  for (int64_t n : {0, 1, 3, 1000003}) {
    std::vector<float> source(n);
    std::iota(source.begin(), source.end(), -5.0f);
    std::shared_ptr<void> device = GetAllocator(kCuda0).Allocate(n * sizeof(float));
    gpu_.CopyFromHost(0, device.get(), source.data(), n * sizeof(float));
    std::fill(source.begin(), source.end(), 0.0f);  // the copy must already have read it
    std::vector<float> back(n, -1.0f);
    gpu_.CopyToHost(0, back.data(), device.get(), n * sizeof(float));
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(back[i], static_cast<float>(i) - 5.0f) << i;
  }
}

TEST_F(CudaMemoryTest, PublicHeaderReportsTheDevices) {
  EXPECT_TRUE(cuda::IsAvailable());
  EXPECT_EQ(cuda::DeviceCount(), DeviceCount(DeviceType::kCUDA));
  EXPECT_EQ(cuda::UnavailableReason(), "");
  EXPECT_NE(cuda::Stream(0), nullptr);
  EXPECT_GE(cuda::PhysicalDevice(0), 0);
  EXPECT_NO_THROW(cuda::Synchronize(0));
  EXPECT_THROW(cuda::Synchronize(cuda::DeviceCount()), Error);
}

}  // namespace
}  // namespace tandem
