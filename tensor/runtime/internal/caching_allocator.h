// CachingAllocator: an allocator that keeps freed blocks for reuse, so that a steady training
// loop stops calling the system allocator after its first step. Every device uses it: on a
// GPU the system allocator is cudaMalloc, which synchronises the device and costs far more
// than a kernel launch; on the CPU it is aligned_alloc, which for large blocks maps fresh
// pages from the kernel each time (a 64 MB tensor spent half its time in page faults).
//
// The design follows PyTorch's CUDA caching allocator, smaller:
//   - Sizes round up to 512-byte classes. Requests up to 1 MiB come from a "small" pool
//     carved out of 2 MiB segments; larger ones from a "large" pool (20 MiB segments for
//     requests under 10 MiB, else the size rounded up to 2 MiB).
//   - A free block is found best-fit among the blocks of the same pool and the same stream
//     and split when the remainder is worth keeping; freed neighbours merge again.
//   - Blocks are reused only by the stream they were allocated on: work on that stream is
//     ordered, so a block freed while a kernel still reads it can be handed out again at
//     once — the next user's kernels queue behind it.
//   - PyTorch's record_stream: a block that RecordStream says is also used on other streams
//     (a communication stream reading a gradient, another device's stream reading a copy's
//     source) is not reused at once when freed. The allocator records an event on each of
//     those streams at free time and keeps the block aside until every event has completed
//     (polled before each allocation; waited for before giving up on an out-of-memory).
//   - When the system says no, the allocator frees every cached segment that is wholly
//     unused and tries once more, then throws an out-of-memory tandem::Error.
//   - Graph-private pools (PyTorch's graph_pool_handle, for CUDA Graphs: tensor/cuda/
//     cuda_graph.h): while a stream is captured, its allocations come from a pool of their own.
//     A replay writes every block the capture used, freed or not, so none of them is handed to
//     anyone else while the graph lives (blocks freed during the capture are reused only by
//     later allocations of the same capture, which the replay orders the same way); the pool's
//     memory joins the shared pools when the graph is reset. While any capture is underway the
//     allocator neither polls nor waits for events nor returns memory to the system (calls that
//     a capture forbids); frees that would record events wait for the capture's end.
//
// The system memory is injected (SystemMemory), which keeps this file free of CUDA: the
// CPU backend plugs in aligned host memory (HostMemory in allocator.h), the CUDA backend
// cudaMalloc/cudaFree and CUDA events, and caching_allocator_test a fake with a capacity
// and fake streams.
//
//   CachingAllocator allocator(Device::Cuda(0), std::make_unique<MySystemMemory>());
//   std::shared_ptr<void> block = allocator.Allocate(1000);  // a 1024-byte block
//   block.reset();                                           // back to the pool
#ifndef TANDEM_TENSOR_RUNTIME_INTERNAL_CACHING_ALLOCATOR_H_
#define TANDEM_TENSOR_RUNTIME_INTERNAL_CACHING_ALLOCATOR_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "tensor/base/device.h"
#include "tensor/runtime/allocator.h"
#include "tensor/runtime/backend.h"
#include "tensor/runtime/stream.h"

namespace tandem {

// Where a CachingAllocator gets memory from (cudaMalloc for a GPU).
class SystemMemory {
 public:
  virtual ~SystemMemory() = default;
  // Returns nullptr, with the reason in `error`, when `bytes` cannot be had.
  virtual void* Allocate(size_t bytes, std::string* error) = 0;
  virtual void Free(void* ptr) = 0;
  // The id of the stream (of the allocator's device) that new allocations will be used on.
  virtual int CurrentStreamId() { return Stream::kComputeId; }
  // Whether the device's streams run asynchronously to the host, so that a freed block may
  // still be read by work queued on other streams (see RecordStream). False: RecordStream
  // is a no-op and RecordEvent is never called.
  virtual bool Asynchronous() const { return false; }
  // An event capturing the work queued so far on `stream`, a stream of any device of the
  // allocator's device type; nullptr when there is nothing to wait for.
  virtual std::unique_ptr<EventImpl> RecordEvent(Stream /*stream*/) { return nullptr; }
  // What the system is called in error messages ("cudaMalloc").
  virtual const char* Name() const = 0;
};

class CachingAllocator : public Allocator {
 public:
  static constexpr size_t kRoundBytes = 512;          // size classes
  static constexpr size_t kSmallRequest = 1 << 20;    // up to 1 MiB: small pool
  static constexpr size_t kSmallSegment = 2 << 20;    // small-pool segments
  static constexpr size_t kMediumRequest = 10 << 20;  // under 10 MiB: 20 MiB segments
  static constexpr size_t kMediumSegment = 20 << 20;
  static constexpr size_t kLargeSegmentRound = 2 << 20;  // bigger: rounded to 2 MiB

  // The size class of a request: a multiple of 512, at least 512 (so zero bytes still
  // gets a distinct, valid pointer).
  static size_t RoundSize(size_t bytes);
  // The size of the segment taken from the system to serve a request of `rounded` bytes.
  static size_t SegmentSize(size_t rounded);

  CachingAllocator(Device device, std::unique_ptr<SystemMemory> system);
  // Returns the cached segments to the system. Every block must have been freed: the
  // backend's allocators live for the whole process, so only tests destroy one.
  ~CachingAllocator() override;
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A block of at least `bytes`, for use on the system's current stream. Statistics count
  // the bytes asked for (so they compare across devices); `reserved` counts segments.
  std::shared_ptr<void> Allocate(size_t bytes) override;
  std::shared_ptr<void> AllocateOnStream(size_t bytes, int stream);
  // Marks the live block holding `ptr` as used on `stream` (see the file comment). A no-op
  // when the system is synchronous, for the block's own stream and for streams of another
  // device type; throws tandem::Error if `ptr` is not inside a live block of this allocator.
  void RecordStream(const void* ptr, Stream stream) override;
  // Same, but returns false instead of throwing when `ptr` is not inside a live block.
  bool TryRecordStream(const void* ptr, Stream stream);
  MemoryStats Stats() const override { return counter_.Stats(); }
  void ResetPeak() override { counter_.ResetPeak(); }
  void SetLimit(int64_t bytes) override { counter_.SetLimit(bytes); }
  // Returns every wholly unused segment to the system.
  void EmptyCache() override;

  // Bytes held in free cached blocks, and the number of segments taken from the system
  // and not yet returned (for tests and diagnostics).
  int64_t CachedBytes() const;
  int64_t NumSegments() const;
  // Freed blocks waiting for events recorded on other streams before they can be reused.
  int64_t NumPendingBlocks() const;

  // ---- Graph-private pools (see the file comment) ----
  // A new, empty private pool; returns its id (never 0).
  uint64_t CreatePrivatePool();
  // Until EndAllocateToPool, allocations on `stream` come from `pool`. Throws tandem::Error for
  // an unknown pool or a stream that already allocates to one.
  void BeginAllocateToPool(uint64_t pool, int stream);
  void EndAllocateToPool(uint64_t pool);
  // The graph that used `pool` is gone: the pool's free blocks join the shared pools, and its
  // blocks still in use join them when freed.
  void ReleasePrivatePool(uint64_t pool);
  // Segments taken from the system for `pool` (0 once released or for an unknown pool), and
  // whether any capture is allocating to a private pool now.
  int64_t PrivatePoolSegments(uint64_t pool) const;
  bool CaptureUnderway() const;

 private:
  struct Block;
  struct PrivatePool;
  struct BlockOrder {
    bool operator()(const Block* a, const Block* b) const;
  };
  using Pool = std::set<Block*, BlockOrder>;

  Block* FindFreeBlock(Pool& pool, int stream, size_t size);
  Block* NewSegment(bool small, PrivatePool* owner, int stream, size_t size, size_t requested);
  // The free-block set a block returns to (its private pool's, if it has one).
  Pool& PoolOf(bool small, PrivatePool* owner);
  Block* SplitIfWorthIt(Pool& pool, Block* block, size_t size);
  // The shared_ptr deleter: returns the block to its pool, or sets it aside with events.
  void Free(Block* block);
  void FreeLocked(Block* block);
  // The rest need mutex_.
  // Returns a freed block to its pool, merged with free neighbours.
  void ReturnToPoolLocked(Block* block);
  // Returns the set-aside blocks whose events have all completed (`wait`: waits for all).
  void ProcessPendingLocked(bool wait);
  // The allocated block holding `ptr`, or nullptr.
  Block* FindLiveBlockLocked(const void* ptr) const;
  // Frees every wholly unused segment; returns the bytes given back.
  size_t ReleaseUnusedSegmentsLocked();

  const Device device_;
  const std::unique_ptr<SystemMemory> system_;
  AllocationCounter counter_;
  mutable std::mutex mutex_;
  Pool small_pool_;  // free blocks only
  Pool large_pool_;
  std::vector<Block*> pending_;           // freed, waiting for their events
  std::vector<Block*> lost_;              // freed, but their events could not be recorded
  std::map<uintptr_t, Block*> segments_;  // every segment's first block, by address
  int64_t cached_bytes_ = 0;
  int64_t num_segments_ = 0;
  std::map<uint64_t, std::unique_ptr<PrivatePool>> private_pools_;
  uint64_t next_private_pool_ = 1;
  std::map<int, PrivatePool*> capturing_streams_;  // stream id -> the pool it allocates to
  std::vector<Block*> deferred_frees_;             // freed during a capture, with events to record
};

}  // namespace tandem

#endif  // TANDEM_TENSOR_RUNTIME_INTERNAL_CACHING_ALLOCATOR_H_
