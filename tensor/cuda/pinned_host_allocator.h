// PinnedHostAllocator: page-locked host memory (cudaHostAlloc) with a small cache, for
// fast and asynchronous copies between the host and CUDA devices (internal to
// tensor/cuda/; users get it through TensorOptions().pinned(true) or pin_memory()).
//
// cudaHostAlloc and cudaFreeHost are slow (they map pages for the GPU and synchronise the
// device), so freed blocks are kept, in power-of-two size classes, for the next request.
// A block that an asynchronous copy still reads must not be handed out again: the backend
// calls RecordUse after queuing such a copy, and a freed block returns to the cache only
// once every copy recorded on it has completed. That is what lets CopyFromHost return
// before the bytes have left a pinned buffer, even if the caller frees it at once.
//
//   PinnedHostAllocator& pinned = ...;
//   std::shared_ptr<void> buffer = pinned.Allocate(bytes);
//   cudaMemcpyAsync(device_ptr, buffer.get(), bytes, cudaMemcpyHostToDevice, stream);
//   pinned.RecordUse(buffer.get(), stream, physical_gpu);
//
// A copy queued while its stream is captured in a CUDA Graph (tensor/cuda/cuda_graph.h) reads
// the block at every replay, so such a block is held, whether freed or not, until the graph
// is reset (ReleaseCapture); during a capture no event is queried (CUDA forbids it).
#ifndef TANDEM_TENSOR_CUDA_PINNED_HOST_ALLOCATOR_H_
#define TANDEM_TENSOR_CUDA_PINNED_HOST_ALLOCATOR_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace tandem {
namespace cuda {

class PinnedHostAllocator {
 public:
  // Cached free bytes above this go back to the system.
  static constexpr size_t kMaxCachedBytes = size_t{1} << 30;

  PinnedHostAllocator() = default;
  PinnedHostAllocator(const PinnedHostAllocator&) = delete;
  PinnedHostAllocator& operator=(const PinnedHostAllocator&) = delete;

  // At least `bytes` of pinned memory (rounded up to a power of two, at least 512 bytes).
  // Throws tandem::Error when the system refuses even after the cache was emptied.
  std::shared_ptr<void> Allocate(size_t bytes);

  // Whether [ptr, ptr + bytes) lies inside a live block of this allocator.
  bool Contains(const void* ptr, size_t bytes) const;
  // Records that work queued on `stream` (of physical GPU `physical_device`) uses the
  // block holding `ptr`, which must be one of this allocator's (see Contains).
  void RecordUse(const void* ptr, cudaStream_t stream, int physical_device);

  // Frees every cached block whose recorded work has completed.
  void EmptyCache();
  // The graph of stream capture `capture_id` (cudaStreamGetCaptureInfo's id) is gone: the
  // blocks its copies read may be reused.
  void ReleaseCapture(unsigned long long capture_id);

  int64_t CachedBytes() const;

 private:
  struct Block {
    char* ptr = nullptr;
    size_t size = 0;
    std::vector<cudaEvent_t> pending;  // recorded uses not yet known to be complete
    unsigned long long capture = 0;    // a capture whose graph reads it, or 0
    bool freed = false;
  };

  void Free(Block* block);
  // Moves freed blocks whose uses have all completed into the cache (or back to the
  // system beyond kMaxCachedBytes). Needs mutex_.
  void CollectFreedLocked();
  // Whether every use recorded on `block` has completed; forgets the completed ones.
  bool UsesCompleteLocked(Block* block);
  void ReleaseCachedLocked();
  // cudaFreeHost on each (bookkeeping already updated); throws the first error after.
  void FreeBlocksLocked(const std::vector<Block*>& blocks);

  mutable std::mutex mutex_;
  std::map<uintptr_t, Block*> live_;      // by address, for Contains/RecordUse
  std::multimap<size_t, Block*> cached_;  // free and reusable, by size
  std::vector<Block*> freed_;             // free, maybe still read by a copy
  std::vector<Block*> captured_;          // read by a captured copy (live or freed)
  size_t cached_bytes_ = 0;
};

}  // namespace cuda
}  // namespace tandem

#endif  // TANDEM_TENSOR_CUDA_PINNED_HOST_ALLOCATOR_H_
