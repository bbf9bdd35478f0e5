#include "tensor/cuda/pinned_host_allocator.h"

#include <cuda_runtime.h>

#include <string>

#include "tensor/base/error.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/runtime/stream.h"

namespace tandem {
namespace cuda {
namespace {

size_t SizeClass(size_t bytes) {
  size_t size = 512;
  while (size < bytes) size *= 2;
  return size;
}

// Makes `physical` the calling thread's current GPU for the lifetime of the guard (events
// belong to the device that is current when they are created).
class PhysicalDeviceGuard {
 public:
  explicit PhysicalDeviceGuard(int physical) {
    TANDEM_CUDA_CHECK(cudaGetDevice(&previous_), kHostSide);
    if (previous_ != physical) TANDEM_CUDA_CHECK(cudaSetDevice(physical), kHostSide);
  }
  ~PhysicalDeviceGuard() { cudaSetDevice(previous_); }
  PhysicalDeviceGuard(const PhysicalDeviceGuard&) = delete;
  PhysicalDeviceGuard& operator=(const PhysicalDeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace

std::shared_ptr<void> PinnedHostAllocator::Allocate(size_t bytes) {
  const size_t size = SizeClass(bytes);
  Block* block = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const bool capturing = tandem::internal::GraphCaptureUnderway();
    if (!capturing) CollectFreedLocked();  // event queries: not during a capture
    auto it = cached_.find(size);
    if (it != cached_.end()) {
      block = it->second;
      cached_.erase(it);
      cached_bytes_ -= size;
    } else {
      void* ptr = nullptr;
      // A capture forbids cudaHostAlloc in its global mode; as the device allocator does, the
      // thread relaxes its mode for the call (the graph never frees what it reads).
      cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
      if (capturing) cudaThreadExchangeStreamCaptureMode(&mode);
      // Portable: pinned for every GPU, so any logical device can copy from it.
      cudaError_t error = cudaHostAlloc(&ptr, size, cudaHostAllocPortable);
      if (capturing) cudaThreadExchangeStreamCaptureMode(&mode);
      if (error != cudaSuccess) {
        cudaGetLastError();  // not sticky: clear it before the retry
        ReleaseCachedLocked();
        error = cudaHostAlloc(&ptr, size, cudaHostAllocPortable);
      }
      if (error != cudaSuccess) {
        cudaGetLastError();
        TANDEM_FAIL("out of pinned host memory: cudaHostAlloc of ", size,
                    " bytes (for a request of ", bytes, ") failed with ", cudaGetErrorName(error),
                    " (", cudaGetErrorString(error),
                    ") even after the pinned cache was emptied; pin less memory (smaller batches, "
                    "fewer prefetched batches) or use pageable tensors");
      }
      block = new Block;
      block->ptr = static_cast<char*>(ptr);
      block->size = size;
    }
    block->freed = false;
    live_[reinterpret_cast<uintptr_t>(block->ptr)] = block;
  }
  return std::shared_ptr<void>(block->ptr, [this, block](void*) { Free(block); });
}

bool PinnedHostAllocator::Contains(const void* ptr, size_t bytes) const {
  const uintptr_t address = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.upper_bound(address);
  if (it == live_.begin()) return false;
  --it;
  const Block* block = it->second;
  return address + bytes <= it->first + block->size;
}

void PinnedHostAllocator::RecordUse(const void* ptr, cudaStream_t stream, int physical_device) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.upper_bound(address);
  TANDEM_CHECK(it != live_.begin(), "PinnedHostAllocator::RecordUse: ", ptr,
               " is not pinned memory of this allocator");
  Block* block = std::prev(it)->second;
  PhysicalDeviceGuard guard(physical_device);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long capture = 0;
  TANDEM_CUDA_CHECK(cudaStreamGetCaptureInfo(stream, &status, &capture), kHostSide);
  if (status != cudaStreamCaptureStatusNone) {
    // A graph node: every replay reads the block, until the graph is reset.
    if (block->capture == 0) captured_.push_back(block);
    block->capture = capture;
    return;
  }
  cudaEvent_t event;
  TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), kHostSide);
  const cudaError_t error = cudaEventRecord(event, stream);
  if (error != cudaSuccess) {
    cudaEventDestroy(event);
    TANDEM_CUDA_CHECK(error, kHostSide);
  }
  block->pending.push_back(event);
}

// Runs in shared_ptr deleters, possibly during process exit: no CUDA call here.
void PinnedHostAllocator::Free(Block* block) {
  std::lock_guard<std::mutex> lock(mutex_);
  live_.erase(reinterpret_cast<uintptr_t>(block->ptr));
  block->freed = true;
  if (block->capture == 0) freed_.push_back(block);  // else ReleaseCapture hands it on
}

void PinnedHostAllocator::ReleaseCapture(unsigned long long capture_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Block*> still;
  for (Block* block : captured_) {
    if (block->capture != capture_id) {
      still.push_back(block);
      continue;
    }
    block->capture = 0;
    if (block->freed) freed_.push_back(block);
  }
  captured_.swap(still);
}

bool PinnedHostAllocator::UsesCompleteLocked(Block* block) {
  std::vector<cudaEvent_t> still_pending;
  for (cudaEvent_t event : block->pending) {
    // Anything but "not ready" means the copy is over: done, or failed with an error that
    // the device's next synchronisation reports to whoever waits for it.
    if (cudaEventQuery(event) == cudaErrorNotReady) {
      still_pending.push_back(event);
    } else {
      cudaEventDestroy(event);
    }
  }
  cudaGetLastError();  // a failed query must not resurface at the next launch check
  block->pending.swap(still_pending);
  return block->pending.empty();
}

void PinnedHostAllocator::CollectFreedLocked() {
  std::vector<Block*> waiting, release;
  for (Block* block : freed_) {
    if (!UsesCompleteLocked(block)) {
      waiting.push_back(block);
    } else if (cached_bytes_ + block->size <= kMaxCachedBytes) {
      cached_.emplace(block->size, block);
      cached_bytes_ += block->size;
    } else {
      release.push_back(block);
    }
  }
  freed_.swap(waiting);
  FreeBlocksLocked(release);
}

void PinnedHostAllocator::ReleaseCachedLocked() {
  CollectFreedLocked();
  std::vector<Block*> release;
  for (auto& [size, block] : cached_) release.push_back(block);
  cached_.clear();
  cached_bytes_ = 0;
  FreeBlocksLocked(release);
}

void PinnedHostAllocator::FreeBlocksLocked(const std::vector<Block*>& blocks) {
  cudaError_t first_error = cudaSuccess;
  for (Block* block : blocks) {
    const cudaError_t error = cudaFreeHost(block->ptr);
    if (first_error == cudaSuccess) first_error = error;
    delete block;
  }
  TANDEM_CUDA_CHECK(first_error, kHostSide);
}

void PinnedHostAllocator::EmptyCache() {
  std::lock_guard<std::mutex> lock(mutex_);
  ReleaseCachedLocked();
}

int64_t PinnedHostAllocator::CachedBytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(cached_bytes_);
}

}  // namespace cuda
}  // namespace tandem
