#include "tensor/runtime/allocator.h"

#include <cstdlib>
#include <string>

#include "tensor/base/error.h"
#include "tensor/runtime/backend.h"
#include "tensor/runtime/devices.h"

namespace tandem {
namespace {

std::string FormatBytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  char text[64];
  std::snprintf(text, sizeof(text), unit == 0 ? "%.0f %s" : "%.2f %s", value, units[unit]);
  return text;
}

}  // namespace

void AllocationCounter::CheckLimit(size_t bytes) const {
  const int64_t limit = limit_.load();
  if (limit > 0 && in_use_.load() + static_cast<int64_t>(bytes) > limit) {
    ThrowOutOfMemory(bytes, "the memory limit set with SetMemoryLimit would be exceeded");
  }
}

void AllocationCounter::ThrowOutOfMemory(size_t bytes, const char* why) const {
  const int64_t limit = limit_.load();
  TANDEM_FAIL("out of memory on ", device_, ": tried to allocate ",
              FormatBytes(static_cast<int64_t>(bytes)), " with ", FormatBytes(in_use_.load()),
              " in use and ", FormatBytes(reserved_.load()), " reserved",
              limit > 0 ? " (limit " + FormatBytes(limit) + ")" : std::string(), "; ", why,
              ". Reduce the batch size, free tensors, or spread the work over more devices");
}

void AllocationCounter::OnAllocate(size_t bytes, bool from_system) {
  const int64_t now = in_use_.fetch_add(static_cast<int64_t>(bytes)) + static_cast<int64_t>(bytes);
  int64_t peak = peak_.load();
  while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
  }
  ++allocations_;
  if (from_system) ++system_allocations_;
}

void AllocationCounter::OnFree(size_t bytes) { in_use_ -= static_cast<int64_t>(bytes); }

MemoryStats AllocationCounter::Stats() const {
  MemoryStats stats;
  stats.in_use_bytes = in_use_.load();
  stats.peak_bytes = peak_.load();
  stats.reserved_bytes = reserved_.load();
  stats.limit_bytes = limit_.load();
  stats.num_allocations = allocations_.load();
  stats.num_system_allocations = system_allocations_.load();
  return stats;
}

void AllocationCounter::ResetPeak() { peak_ = in_use_.load(); }

Allocator& GetAllocator(Device device) {
  CheckAvailable(device);
  return GetBackend(device.type()).GetAllocator(device.index());
}

MemoryStats GetMemoryStats(Device device) { return GetAllocator(device).Stats(); }
void ResetPeakMemory(Device device) { GetAllocator(device).ResetPeak(); }
void SetMemoryLimit(Device device, int64_t bytes) {
  TANDEM_CHECK(bytes >= 0, "SetMemoryLimit: the limit must be >= 0 bytes (0 removes it) but is ",
               bytes);
  GetAllocator(device).SetLimit(bytes);
}
void EmptyCache(Device device) { GetAllocator(device).EmptyCache(); }

}  // namespace tandem
