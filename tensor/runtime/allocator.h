// Allocator: device memory with per-device statistics (bytes in use, peak, reserved) and
// an injectable limit, so that tests can provoke the out-of-memory path and DataParallel's
// imbalance on its output device can be measured.
//
//   tandem::MemoryStats stats = tandem::GetMemoryStats(tandem::Device::Cpu(0));
//   std::cout << stats.peak_bytes;
#ifndef TANDEM_TENSOR_RUNTIME_ALLOCATOR_H_
#define TANDEM_TENSOR_RUNTIME_ALLOCATOR_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>

#include "tensor/base/device.h"
#include "tensor/runtime/stream.h"

namespace tandem {

struct MemoryStats {
  int64_t in_use_bytes = 0;            // held by live tensors
  int64_t peak_bytes = 0;              // highest in_use_bytes since start or ResetPeak
  int64_t reserved_bytes = 0;          // taken from the system (>= in_use for caching allocators)
  int64_t limit_bytes = 0;             // 0: no limit
  int64_t num_allocations = 0;         // calls to Allocate that succeeded
  int64_t num_system_allocations = 0;  // of those, how many went to the system (malloc/cudaMalloc)
};

// Memory of one device. Allocate returns a shared pointer whose deleter hands the block back.
class Allocator {
 public:
  virtual ~Allocator() = default;
  // Throws tandem::Error naming the device, the size asked for and what is in use when the
  // memory cannot be had (or the limit would be passed). Zero bytes gives a valid pointer.
  virtual std::shared_ptr<void> Allocate(size_t bytes) = 0;
  virtual MemoryStats Stats() const = 0;
  virtual void ResetPeak() = 0;
  // Caps in_use + requested; 0 removes the cap. For tests and for sharing a device.
  virtual void SetLimit(int64_t bytes) = 0;
  // Returns cached, unused blocks to the system (no-op where nothing is cached).
  virtual void EmptyCache() {}
  // Tells the allocator that the block holding `ptr` (a pointer into memory this allocator
  // handed out) is also used by work queued on `stream`, so that once freed it is not reused
  // before that work has finished (PyTorch's record_stream; see tensor/runtime/stream.h). No-op
  // where device work is synchronous.
  virtual void RecordStream(const void* /*ptr*/, Stream /*stream*/) {}
};

// Bookkeeping shared by allocators: thread-safe counters and the limit check.
class AllocationCounter {
 public:
  explicit AllocationCounter(Device device) : device_(device) {}
  // Throws the out-of-memory error if `bytes` more would pass the limit.
  void CheckLimit(size_t bytes) const;
  void OnAllocate(size_t bytes, bool from_system);
  void OnFree(size_t bytes);
  void OnReserve(int64_t delta) { reserved_ += delta; }
  MemoryStats Stats() const;
  void ResetPeak();
  void SetLimit(int64_t bytes) { limit_ = bytes; }
  int64_t limit() const { return limit_; }
  [[noreturn]] void ThrowOutOfMemory(size_t bytes, const char* why) const;

 private:
  Device device_;
  std::atomic<int64_t> in_use_{0};
  std::atomic<int64_t> peak_{0};
  std::atomic<int64_t> reserved_{0};
  std::atomic<int64_t> limit_{0};
  std::atomic<int64_t> allocations_{0};
  std::atomic<int64_t> system_allocations_{0};
};

inline constexpr size_t kHostAlignment = 64;

// The allocator of a device (from its backend).
Allocator& GetAllocator(Device device);
MemoryStats GetMemoryStats(Device device);
void ResetPeakMemory(Device device);
void SetMemoryLimit(Device device, int64_t bytes);
void EmptyCache(Device device);

}  // namespace tandem

#endif  // TANDEM_TENSOR_RUNTIME_ALLOCATOR_H_
