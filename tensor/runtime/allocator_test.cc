#include "tensor/runtime/allocator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>

#include "tensor/runtime/devices.h"
#include "tensor/tensor.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

TEST(AllocatorTest, HostMemoryIsAligned) {
  for (int64_t n : {1, 3, 17, 1000}) {
    Tensor t = empty({n});
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw_data()) % kHostAlignment, 0u) << n;
  }
  Tensor empty_tensor = empty({0});
  EXPECT_NE(empty_tensor.raw_data(), nullptr);
}

TEST(AllocatorTest, TracksBytesInUseAndPeakPerDevice) {
  SetCpuDeviceCount(2);
  const Device device = Device::Cpu(1);
  const int64_t before = GetMemoryStats(device).in_use_bytes;
  ResetPeakMemory(device);
  {
    Tensor a = zeros({256}, device);  // 1 KiB
    Tensor b = zeros({512}, device);  // 2 KiB
    EXPECT_EQ(GetMemoryStats(device).in_use_bytes, before + 3072);
    EXPECT_GE(GetMemoryStats(device).peak_bytes, before + 3072);
  }
  EXPECT_EQ(GetMemoryStats(device).in_use_bytes, before);
  EXPECT_GE(GetMemoryStats(device).peak_bytes, before + 3072);
  ResetPeakMemory(device);
  EXPECT_EQ(GetMemoryStats(device).peak_bytes, before);
  // cpu:0's accounting is separate.
  const int64_t cpu0 = GetMemoryStats(Device::Cpu(0)).in_use_bytes;
  Tensor c = zeros({1024}, device);
  EXPECT_EQ(GetMemoryStats(Device::Cpu(0)).in_use_bytes, cpu0);
}

TEST(AllocatorTest, SteadyLoopsReuseCachedHostMemory) {
  const Device device = Device::Cpu(0);
  auto step = [&] {
    Tensor big = empty({16 << 20}, device);  // 64 MiB: served by the system once
    Tensor small = ones({1000}, device);
    return (big.numel() + small.numel()) > 0;
  };
  step();
  const int64_t system_before = GetMemoryStats(device).num_system_allocations;
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(step());
  const MemoryStats stats = GetMemoryStats(device);
  EXPECT_EQ(stats.num_system_allocations, system_before);
  EXPECT_GE(stats.reserved_bytes, int64_t{64} << 20);
  EmptyCache(device);
  EXPECT_LT(GetMemoryStats(device).reserved_bytes, stats.reserved_bytes);
}

TEST(AllocatorTest, LimitGivesAClearOutOfMemoryError) {
  const Device device = Device::Cpu(0);
  const int64_t in_use = GetMemoryStats(device).in_use_bytes;
  SetMemoryLimit(device, in_use + 4096);
  Tensor fits = zeros({1000}, device);
  try {
    Tensor too_big = zeros({1000}, device);
    FAIL() << "expected an out-of-memory error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("out of memory on cpu:0"));
    EXPECT_THAT(e.what(), HasSubstr("tried to allocate 3.91 KiB"));
    EXPECT_THAT(e.what(), HasSubstr("Reduce the batch size"));
  }
  SetMemoryLimit(device, 0);
  Tensor now_fits = zeros({1000}, device);
  EXPECT_THROW(SetMemoryLimit(device, -1), Error);
}

}  // namespace
}  // namespace tandem
