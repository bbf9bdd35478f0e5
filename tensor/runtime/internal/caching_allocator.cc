#include "tensor/runtime/internal/caching_allocator.h"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <tuple>
#include <utility>

#include "tensor/base/error.h"

namespace tandem {

// A range of one segment. Blocks of a segment form a doubly linked list in address order,
// so that a freed block can merge with free neighbours.
struct CachingAllocator::Block {
  char* ptr = nullptr;
  size_t size = 0;                  // bytes in this block (a multiple of kRoundBytes)
  size_t requested = 0;             // bytes asked for while allocated (for statistics)
  int stream = 0;                   // the stream it was allocated on and is reused by
  bool allocated = false;           // handed out, or freed but pending (not in a pool)
  std::vector<Stream> stream_uses;  // other streams (RecordStream)
  std::vector<std::unique_ptr<EventImpl>> pending;  // recorded at free time
  bool small = false;                               // which pool it returns to
  PrivatePool* private_pool = nullptr;              // a graph's, or null: the shared pools
  Block* prev = nullptr;                            // neighbours within the segment
  Block* next = nullptr;
};

struct CachingAllocator::PrivatePool {
  uint64_t id = 0;
  Pool small;
  Pool large;
  int64_t segments = 0;
  int capturing = 0;  // streams allocating to it now
};

// Best fit: pools are ordered by stream, then size, then address.
bool CachingAllocator::BlockOrder::operator()(const Block* a, const Block* b) const {
  return std::make_tuple(a->stream, a->size, reinterpret_cast<uintptr_t>(a->ptr)) <
         std::make_tuple(b->stream, b->size, reinterpret_cast<uintptr_t>(b->ptr));
}

size_t CachingAllocator::RoundSize(size_t bytes) {
  if (bytes < kRoundBytes) return kRoundBytes;
  return (bytes + kRoundBytes - 1) / kRoundBytes * kRoundBytes;
}

size_t CachingAllocator::SegmentSize(size_t rounded) {
  if (rounded <= kSmallRequest) return kSmallSegment;
  if (rounded < kMediumRequest) return kMediumSegment;
  return (rounded + kLargeSegmentRound - 1) / kLargeSegmentRound * kLargeSegmentRound;
}

CachingAllocator::CachingAllocator(Device device, std::unique_ptr<SystemMemory> system)
    : device_(device), system_(std::move(system)), counter_(device) {}

CachingAllocator::~CachingAllocator() {
  std::vector<uint64_t> pools;
  for (const auto& [id, pool] : private_pools_) pools.push_back(id);
  for (uint64_t id : pools) {
    private_pools_.at(id)->capturing = 0;
    ReleasePrivatePool(id);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  capturing_streams_.clear();
  for (Block* block : deferred_frees_) lost_.push_back(block);
  try {
    ProcessPendingLocked(/*wait=*/true);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "tandem: %s's allocator is destroyed with blocks still in use: %s\n",
                 device_.ToString().c_str(), error.what());
  }
  for (Block* block : lost_) ReturnToPoolLocked(block);
  ReleaseUnusedSegmentsLocked();
}

std::shared_ptr<void> CachingAllocator::Allocate(size_t bytes) {
  return AllocateOnStream(bytes, system_->CurrentStreamId());
}

std::shared_ptr<void> CachingAllocator::AllocateOnStream(size_t bytes, int stream) {
  const size_t size = RoundSize(bytes);
  Block* block = nullptr;
  bool from_system = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // Querying events is illegal while a stream captures: blocks wait for the capture's end.
    if (!pending_.empty() && capturing_streams_.empty()) ProcessPendingLocked(/*wait=*/false);
    counter_.CheckLimit(bytes);
    const bool small = size <= kSmallRequest;
    const auto capture = capturing_streams_.find(stream);
    PrivatePool* owner = capture == capturing_streams_.end() ? nullptr : capture->second;
    Pool& pool = PoolOf(small, owner);
    block = FindFreeBlock(pool, stream, size);
    if (block == nullptr) {
      block = NewSegment(small, owner, stream, size, bytes);
      from_system = true;
    }
    block = SplitIfWorthIt(pool, block, size);
    block->allocated = true;
    block->requested = bytes;
    counter_.OnAllocate(bytes, from_system);
  }
  return std::shared_ptr<void>(block->ptr, [this, block](void*) { Free(block); });
}

CachingAllocator::Block* CachingAllocator::FindFreeBlock(Pool& pool, int stream, size_t size) {
  Block key;
  key.stream = stream;
  key.size = size;
  auto it = pool.lower_bound(&key);
  if (it == pool.end() || (*it)->stream != stream) return nullptr;
  Block* block = *it;
  pool.erase(it);
  cached_bytes_ -= static_cast<int64_t>(block->size);
  return block;
}

CachingAllocator::Pool& CachingAllocator::PoolOf(bool small, PrivatePool* owner) {
  if (owner != nullptr) return small ? owner->small : owner->large;
  return small ? small_pool_ : large_pool_;
}

CachingAllocator::Block* CachingAllocator::NewSegment(bool small, PrivatePool* owner, int stream,
                                                      size_t size, size_t requested) {
  const size_t segment = SegmentSize(size);
  std::string error;
  void* ptr = system_->Allocate(segment, &error);
  size_t released = 0;
  if (ptr == nullptr && !capturing_streams_.empty()) {
    counter_.ThrowOutOfMemory(
        requested,
        internal::Concat(system_->Name(), " of a ", segment, "-byte segment failed (", error,
                         ") during a CUDA Graph capture, when the allocator may neither wait for "
                         "nor return cached memory; capture with more memory free (empty the "
                         "cache before capture_begin) or a smaller batch")
            .c_str());
  }
  if (ptr == nullptr) {
    // Cached segments may be what stands in the way: wait for the blocks set aside for other
    // streams, give every unused segment back and try once more.
    ProcessPendingLocked(/*wait=*/true);
    released = ReleaseUnusedSegmentsLocked();
    error.clear();
    ptr = system_->Allocate(segment, &error);
  }
  if (ptr == nullptr) {
    counter_.ThrowOutOfMemory(
        requested,
        internal::Concat(system_->Name(), " of a ", segment, "-byte segment failed (", error,
                         ") even after returning ", released, " cached bytes to the system")
            .c_str());
  }
  counter_.OnReserve(static_cast<int64_t>(segment));
  ++num_segments_;
  Block* block = new Block;
  block->ptr = static_cast<char*>(ptr);
  block->size = segment;
  block->stream = stream;
  block->small = small;
  block->private_pool = owner;
  if (owner != nullptr) ++owner->segments;
  segments_[reinterpret_cast<uintptr_t>(block->ptr)] = block;
  return block;
}

// Splits `block` (not in any pool) into `size` bytes to hand out and a free remainder,
// when the remainder is big enough to serve a later request of its pool: any 512 bytes in
// the small pool, more than 1 MiB in the large pool (smaller crumbs of a large segment
// would only fragment it).
CachingAllocator::Block* CachingAllocator::SplitIfWorthIt(Pool& pool, Block* block, size_t size) {
  const size_t remaining = block->size - size;
  const bool worth_it = block->small ? remaining >= kRoundBytes : remaining > kSmallRequest;
  if (!worth_it) return block;
  Block* rest = new Block;
  rest->ptr = block->ptr + size;
  rest->size = remaining;
  rest->stream = block->stream;
  rest->small = block->small;
  rest->private_pool = block->private_pool;
  rest->prev = block;
  rest->next = block->next;
  if (block->next != nullptr) block->next->prev = rest;
  block->next = rest;
  block->size = size;
  pool.insert(rest);
  cached_bytes_ += static_cast<int64_t>(rest->size);
  return block;
}

// Runs in shared_ptr deleters, so it must not throw.
void CachingAllocator::Free(Block* block) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!block->stream_uses.empty() && !capturing_streams_.empty()) {
    // Its events would be recorded, and later queried, during the capture.
    deferred_frees_.push_back(block);
    return;
  }
  FreeLocked(block);
}

void CachingAllocator::FreeLocked(Block* block) {
  if (!block->stream_uses.empty()) {
    try {
      for (Stream stream : block->stream_uses) {
        std::unique_ptr<EventImpl> event = system_->RecordEvent(stream);
        if (event != nullptr) block->pending.push_back(std::move(event));
      }
    } catch (const std::exception&) {
      // The device is broken (its error surfaces at the next synchronisation) or the process
      // is exiting: nobody can prove that the other streams are done with the block, so it
      // is never reused (only the allocator's destructor returns it).
      block->pending.clear();
      block->stream_uses.clear();
      lost_.push_back(block);
      return;
    }
    block->stream_uses.clear();
    if (!block->pending.empty()) {
      pending_.push_back(block);
      return;
    }
  }
  ReturnToPoolLocked(block);
}

void CachingAllocator::ReturnToPoolLocked(Block* block) {
  counter_.OnFree(block->requested);
  block->allocated = false;
  block->requested = 0;
  Pool& pool = PoolOf(block->small, block->private_pool);
  // Merge with free neighbours so that a segment whose blocks are all free becomes one
  // block again (reusable for any size, and returnable to the system).
  for (Block* neighbour : {block->prev, block->next}) {
    if (neighbour == nullptr || neighbour->allocated) continue;
    pool.erase(neighbour);
    cached_bytes_ -= static_cast<int64_t>(neighbour->size);
    if (neighbour == block->prev) {
      block->ptr = neighbour->ptr;
      block->prev = neighbour->prev;
      if (block->prev != nullptr) {
        block->prev->next = block;
      } else {
        segments_[reinterpret_cast<uintptr_t>(block->ptr)] = block;  // the new first block
      }
    } else {
      block->next = neighbour->next;
      if (block->next != nullptr) block->next->prev = block;
    }
    block->size += neighbour->size;
    delete neighbour;
  }
  pool.insert(block);
  cached_bytes_ += static_cast<int64_t>(block->size);
}

void CachingAllocator::ProcessPendingLocked(bool wait) {
  std::vector<Block*> still_pending;
  for (size_t i = 0; i < pending_.size(); ++i) {
    Block* block = pending_[i];
    try {
      auto& events = block->pending;
      for (auto it = events.begin(); it != events.end();) {
        if (wait) (*it)->Synchronize();
        it = wait || (*it)->Query() ? events.erase(it) : it + 1;
      }
    } catch (...) {
      // Keep the bookkeeping whole (this block and the unvisited ones stay pending), then
      // report the device's error to the caller.
      still_pending.insert(still_pending.end(), pending_.begin() + i, pending_.end());
      pending_.swap(still_pending);
      throw;
    }
    if (block->pending.empty()) {
      ReturnToPoolLocked(block);
    } else {
      still_pending.push_back(block);
    }
  }
  pending_.swap(still_pending);
}

CachingAllocator::Block* CachingAllocator::FindLiveBlockLocked(const void* ptr) const {
  const uintptr_t address = reinterpret_cast<uintptr_t>(ptr);
  auto it = segments_.upper_bound(address);
  if (it == segments_.begin()) return nullptr;
  for (Block* block = std::prev(it)->second; block != nullptr; block = block->next) {
    const uintptr_t begin = reinterpret_cast<uintptr_t>(block->ptr);
    if (address < begin) return nullptr;
    if (address < begin + block->size) {
      return block->allocated && block->pending.empty() ? block : nullptr;
    }
  }
  return nullptr;
}

bool CachingAllocator::TryRecordStream(const void* ptr, Stream stream) {
  if (!system_->Asynchronous() || stream.device().type() != device_.type()) return true;
  std::lock_guard<std::mutex> lock(mutex_);
  Block* block = FindLiveBlockLocked(ptr);
  if (block == nullptr) return false;
  if (stream.device() == device_ && stream.id() == block->stream) return true;
  auto& uses = block->stream_uses;
  if (std::find(uses.begin(), uses.end(), stream) == uses.end()) uses.push_back(stream);
  return true;
}

void CachingAllocator::RecordStream(const void* ptr, Stream stream) {
  TANDEM_CHECK(TryRecordStream(ptr, stream), "RecordStream: ", ptr,
               " is not inside a live block of ", device_,
               "'s allocator; pass memory that this device's allocator handed out and that is "
               "still in use (a tensor on ",
               device_, ")");
}

size_t CachingAllocator::ReleaseUnusedSegmentsLocked() {
  size_t released = 0;
  for (Pool* pool : {&small_pool_, &large_pool_}) {
    for (auto it = pool->begin(); it != pool->end();) {
      Block* block = *it;
      if (block->prev != nullptr || block->next != nullptr) {
        ++it;  // part of a segment that is still partly in use
        continue;
      }
      it = pool->erase(it);
      segments_.erase(reinterpret_cast<uintptr_t>(block->ptr));
      system_->Free(block->ptr);
      counter_.OnReserve(-static_cast<int64_t>(block->size));
      cached_bytes_ -= static_cast<int64_t>(block->size);
      --num_segments_;
      released += block->size;
      delete block;
    }
  }
  return released;
}

void CachingAllocator::EmptyCache() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!capturing_streams_.empty()) return;  // see the file comment: nothing to do mid-capture
  ProcessPendingLocked(/*wait=*/false);
  ReleaseUnusedSegmentsLocked();
}

int64_t CachingAllocator::CachedBytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cached_bytes_;
}

int64_t CachingAllocator::NumSegments() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return num_segments_;
}

int64_t CachingAllocator::NumPendingBlocks() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(pending_.size());
}

uint64_t CachingAllocator::CreatePrivatePool() {
  std::lock_guard<std::mutex> lock(mutex_);
  auto pool = std::make_unique<PrivatePool>();
  pool->id = next_private_pool_++;
  const uint64_t id = pool->id;
  private_pools_[id] = std::move(pool);
  return id;
}

void CachingAllocator::BeginAllocateToPool(uint64_t pool, int stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = private_pools_.find(pool);
  TANDEM_CHECK(it != private_pools_.end(), device_, "'s allocator: private pool ", pool,
               " does not exist (or was released); create one with CreatePrivatePool");
  TANDEM_CHECK(capturing_streams_.count(stream) == 0, device_, "'s allocator: stream ", stream,
               " already allocates to a private pool (one capture per stream at a time)");
  capturing_streams_[stream] = it->second.get();
  ++it->second->capturing;
}

void CachingAllocator::EndAllocateToPool(uint64_t pool) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = capturing_streams_.begin(); it != capturing_streams_.end();) {
    if (it->second->id == pool) {
      --it->second->capturing;
      it = capturing_streams_.erase(it);
    } else {
      ++it;
    }
  }
  if (!capturing_streams_.empty()) return;
  std::vector<Block*> deferred;
  deferred.swap(deferred_frees_);
  for (Block* block : deferred) FreeLocked(block);
}

void CachingAllocator::ReleasePrivatePool(uint64_t pool) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = private_pools_.find(pool);
  if (it == private_pools_.end()) return;
  PrivatePool* owner = it->second.get();
  TANDEM_CHECK(owner->capturing == 0, device_, "'s allocator: private pool ", pool,
               " is released while a capture allocates to it; end the capture first");
  // Every block of the pool's segments becomes a shared one; the free ones move to the shared
  // sets, ordered there as any other (their stream is the capture's).
  for (const auto& [address, first] : segments_) {
    if (first->private_pool != owner) continue;
    for (Block* block = first; block != nullptr; block = block->next) block->private_pool = nullptr;
  }
  for (Pool* from : {&owner->small, &owner->large}) {
    Pool& to = from == &owner->small ? small_pool_ : large_pool_;
    to.insert(from->begin(), from->end());
    from->clear();
  }
  private_pools_.erase(it);
}

int64_t CachingAllocator::PrivatePoolSegments(uint64_t pool) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = private_pools_.find(pool);
  return it == private_pools_.end() ? 0 : it->second->segments;
}

bool CachingAllocator::CaptureUnderway() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !capturing_streams_.empty();
}

}  // namespace tandem
