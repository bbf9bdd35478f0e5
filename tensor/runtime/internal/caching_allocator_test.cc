// Tests of CachingAllocator's pooling logic against a fake system memory (host memory with
// a capacity and a call log) and fake streams (counters of queued and finished work, whose
// events complete when the test says so), so they run on every machine, GPU or not. The same
// class with cudaMalloc and CUDA events behind it is tested on a GPU by cuda_memory_test and
// cuda_stream_test.
#include "tensor/runtime/internal/caching_allocator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tensor/base/error.h"
#include "tensor/runtime/backend.h"
#include "tensor/runtime/stream.h"

namespace tandem {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

// Host memory standing in for cudaMalloc: refuses to go over `capacity` bytes in all.
class FakeMemory final : public SystemMemory {
 public:
  struct Log {
    int allocations = 0;
    int frees = 0;
    int refusals = 0;
    size_t in_use = 0;
    size_t capacity = 0;
    int stream = 1;  // the current stream's id
    std::set<void*> live;
    // Fake streams: work items queued on each, and how many of them have finished.
    bool asynchronous = true;
    bool fail_events = false;
    std::map<Stream, int> queued;
    std::map<Stream, int> finished;
    int events_recorded = 0;
    int events_waited = 0;
  };

  // Complete once the work queued on its stream when it was recorded has finished.
  class FakeEvent final : public EventImpl {
   public:
    FakeEvent(Log* log, Stream stream) : log_(log), stream_(stream), target_(log->queued[stream]) {}
    bool Query() override { return log_->finished[stream_] >= target_; }
    void Synchronize() override {
      ++log_->events_waited;
      int& finished = log_->finished[stream_];
      finished = std::max(finished, target_);
    }

   private:
    Log* log_;
    Stream stream_;
    int target_;
  };

  explicit FakeMemory(Log* log) : log_(log) {}

  void* Allocate(size_t bytes, std::string* error) override {
    if (log_->capacity != 0 && log_->in_use + bytes > log_->capacity) {
      ++log_->refusals;
      *error = "fake: out of memory";
      return nullptr;
    }
    void* ptr = std::aligned_alloc(512, bytes);
    ++log_->allocations;
    log_->in_use += bytes;
    log_->live.insert(ptr);
    sizes_[ptr] = bytes;
    return ptr;
  }
  void Free(void* ptr) override {
    EXPECT_EQ(log_->live.erase(ptr), 1u) << "freed a pointer the fake never handed out";
    ++log_->frees;
    log_->in_use -= sizes_[ptr];
    std::free(ptr);
  }
  int CurrentStreamId() override { return log_->stream; }
  bool Asynchronous() const override { return log_->asynchronous; }
  std::unique_ptr<EventImpl> RecordEvent(Stream stream) override {
    if (log_->fail_events) throw Error("fake: the device is gone");
    ++log_->events_recorded;
    return std::make_unique<FakeEvent>(log_, stream);
  }
  const char* Name() const override { return "fakeMalloc"; }

 private:
  Log* log_;
  std::map<void*, size_t> sizes_;
};

class CachingAllocatorTest : public ::testing::Test {
 protected:
  CachingAllocatorTest()
      : allocator_(std::make_unique<CachingAllocator>(Device::Cuda(3),
                                                      std::make_unique<FakeMemory>(&log_))) {}

  FakeMemory::Log log_;
  std::unique_ptr<CachingAllocator> allocator_;
};

TEST(CachingAllocatorSizes, RoundsToSizeClassesOf512Bytes) {
  EXPECT_EQ(CachingAllocator::RoundSize(0), 512u);
  EXPECT_EQ(CachingAllocator::RoundSize(1), 512u);
  EXPECT_EQ(CachingAllocator::RoundSize(512), 512u);
  EXPECT_EQ(CachingAllocator::RoundSize(513), 1024u);
  EXPECT_EQ(CachingAllocator::RoundSize(4000), 4096u);
  EXPECT_EQ(CachingAllocator::RoundSize(kMiB + 1), kMiB + 512);
}

TEST(CachingAllocatorSizes, PicksSegmentSizesByPool) {
  EXPECT_EQ(CachingAllocator::SegmentSize(512), 2 * kMiB);
  EXPECT_EQ(CachingAllocator::SegmentSize(kMiB), 2 * kMiB);
  EXPECT_EQ(CachingAllocator::SegmentSize(kMiB + 512), 20 * kMiB);
  EXPECT_EQ(CachingAllocator::SegmentSize(10 * kMiB - 512), 20 * kMiB);
  EXPECT_EQ(CachingAllocator::SegmentSize(10 * kMiB), 10 * kMiB);
  EXPECT_EQ(CachingAllocator::SegmentSize(10 * kMiB + 512), 12 * kMiB);
}

TEST_F(CachingAllocatorTest, ZeroBytesGivesAValidDistinctPointer) {
  std::shared_ptr<void> a = allocator_->Allocate(0);
  std::shared_ptr<void> b = allocator_->Allocate(0);
  ASSERT_NE(a.get(), nullptr);
  ASSERT_NE(b.get(), nullptr);
  EXPECT_NE(a.get(), b.get());
  EXPECT_EQ(allocator_->Stats().in_use_bytes, 0);
}

TEST_F(CachingAllocatorTest, SmallRequestsShareOneSegment) {
  std::shared_ptr<void> a = allocator_->Allocate(1000);
  std::shared_ptr<void> b = allocator_->Allocate(3000);
  EXPECT_EQ(log_.allocations, 1);
  // Carved from the same 2 MiB segment, one after the other at 512-byte granularity.
  EXPECT_EQ(static_cast<char*>(b.get()) - static_cast<char*>(a.get()), 1024);
  const MemoryStats stats = allocator_->Stats();
  EXPECT_EQ(stats.in_use_bytes, 4000);  // the bytes asked for
  EXPECT_EQ(stats.reserved_bytes, static_cast<int64_t>(2 * kMiB));
  EXPECT_EQ(stats.num_allocations, 2);
  EXPECT_EQ(stats.num_system_allocations, 1);
}

TEST_F(CachingAllocatorTest, SteadyLoopNeverCallsTheSystemAfterItsFirstStep) {
  // One "training step": a mix of small and large blocks, freed in another order.
  auto step = [&] {
    std::vector<std::shared_ptr<void>> blocks;
    for (size_t bytes : {size_t{784 * 256 * 4}, size_t{256 * 4}, size_t{10 * 4},
                         size_t{64 * 784 * 4}, 15 * kMiB, size_t{3}}) {
      blocks.push_back(allocator_->Allocate(bytes));
    }
    blocks.erase(blocks.begin() + 2);
    blocks.push_back(allocator_->Allocate(256 * 4));
    blocks.clear();
  };
  step();
  const int64_t system_after_first = allocator_->Stats().num_system_allocations;
  const int64_t reserved_after_first = allocator_->Stats().reserved_bytes;
  for (int i = 0; i < 1000; ++i) step();
  EXPECT_EQ(allocator_->Stats().num_system_allocations, system_after_first);
  EXPECT_EQ(allocator_->Stats().reserved_bytes, reserved_after_first);
  EXPECT_EQ(allocator_->Stats().in_use_bytes, 0);
  EXPECT_EQ(allocator_->Stats().num_allocations, 1001 * 7);
  EXPECT_EQ(log_.frees, 0);
}

TEST_F(CachingAllocatorTest, FreedNeighboursMergeBackIntoWholeSegments) {
  std::vector<std::shared_ptr<void>> blocks;
  for (int i = 0; i < 8; ++i) blocks.push_back(allocator_->Allocate(100 * 1024));
  EXPECT_EQ(allocator_->NumSegments(), 1);
  // Free every other block, then the rest: the segment must end up as one free block.
  for (int i = 0; i < 8; i += 2) blocks[i].reset();
  for (int i = 1; i < 8; i += 2) blocks[i].reset();
  EXPECT_EQ(allocator_->CachedBytes(), static_cast<int64_t>(2 * kMiB));
  // A request for the whole segment fits without a new system allocation.
  std::shared_ptr<void> whole = allocator_->Allocate(kMiB);
  std::shared_ptr<void> rest = allocator_->Allocate(kMiB);
  EXPECT_EQ(log_.allocations, 1);
}

TEST_F(CachingAllocatorTest, LargeSegmentsSplitAndReuseBestFit) {
  std::shared_ptr<void> a = allocator_->Allocate(3 * kMiB);  // takes a 20 MiB segment
  std::shared_ptr<void> b = allocator_->Allocate(5 * kMiB);  // from its remainder
  EXPECT_EQ(log_.allocations, 1);
  EXPECT_EQ(static_cast<char*>(b.get()) - static_cast<char*>(a.get()),
            static_cast<ptrdiff_t>(3 * kMiB));
  void* first = a.get();
  a.reset();
  // The freed 3 MiB block is the best fit for 2.5 MiB (the 12 MiB remainder is not).
  std::shared_ptr<void> c = allocator_->Allocate(5 * kMiB / 2);
  EXPECT_EQ(c.get(), first);
  EXPECT_EQ(log_.allocations, 1);
}

TEST_F(CachingAllocatorTest, BlocksAreReusedOnlyByTheirOwnStream) {
  log_.stream = 1;
  void* on_stream_1 = allocator_->Allocate(4096).get();  // freed at once
  log_.stream = 2;
  std::shared_ptr<void> on_stream_2 = allocator_->Allocate(4096);
  EXPECT_NE(on_stream_2.get(), on_stream_1);
  EXPECT_EQ(log_.allocations, 2);
  log_.stream = 1;
  std::shared_ptr<void> again = allocator_->Allocate(4096);
  EXPECT_EQ(again.get(), on_stream_1);
  EXPECT_EQ(log_.allocations, 2);
}

TEST_F(CachingAllocatorTest, PeakAndResetPeak) {
  {
    std::shared_ptr<void> a = allocator_->Allocate(5000);
    std::shared_ptr<void> b = allocator_->Allocate(7000);
  }
  std::shared_ptr<void> c = allocator_->Allocate(1000);
  EXPECT_EQ(allocator_->Stats().peak_bytes, 12000);
  allocator_->ResetPeak();
  EXPECT_EQ(allocator_->Stats().peak_bytes, 1000);
}

TEST_F(CachingAllocatorTest, EmptyCacheReturnsOnlyWhollyUnusedSegments) {
  std::shared_ptr<void> kept = allocator_->Allocate(1000);  // small segment, stays in use
  allocator_->Allocate(12 * kMiB);                          // its own segment, freed
  EXPECT_EQ(allocator_->NumSegments(), 2);
  allocator_->EmptyCache();
  EXPECT_EQ(allocator_->NumSegments(), 1);
  EXPECT_EQ(log_.frees, 1);
  EXPECT_EQ(allocator_->Stats().reserved_bytes, static_cast<int64_t>(2 * kMiB));
  kept.reset();
  allocator_->EmptyCache();
  EXPECT_EQ(allocator_->NumSegments(), 0);
  EXPECT_EQ(allocator_->Stats().reserved_bytes, 0);
  EXPECT_TRUE(log_.live.empty());
}

TEST_F(CachingAllocatorTest, LimitThrowsOutOfMemoryNamingTheDeviceAndSize) {
  allocator_->SetLimit(10000);
  std::shared_ptr<void> a = allocator_->Allocate(6000);
  try {
    allocator_->Allocate(6000);
    FAIL() << "expected an out-of-memory error";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("out of memory"), std::string::npos) << message;
    EXPECT_NE(message.find("cuda:3"), std::string::npos) << message;
    EXPECT_NE(message.find("5.86 KiB"), std::string::npos) << message;  // 6000 bytes
  }
  // The failed request changed nothing; within the limit, allocations still work.
  EXPECT_EQ(allocator_->Stats().in_use_bytes, 6000);
  EXPECT_NE(allocator_->Allocate(4000).get(), nullptr);
  allocator_->SetLimit(0);
  EXPECT_NE(allocator_->Allocate(6000).get(), nullptr);
}

TEST_F(CachingAllocatorTest, SystemRefusalFreesCachedSegmentsAndRetriesOnce) {
  log_.capacity = 21 * kMiB;
  allocator_->Allocate(1000);  // a 2 MiB small segment, now cached
  ASSERT_EQ(log_.in_use, 2 * kMiB);
  // A 20 MiB segment does not fit next to the cached one: the allocator must give the
  // cached segment back and try again.
  std::shared_ptr<void> large = allocator_->Allocate(3 * kMiB);
  EXPECT_NE(large.get(), nullptr);
  EXPECT_EQ(log_.refusals, 1);
  EXPECT_EQ(log_.frees, 1);
  EXPECT_EQ(allocator_->Stats().reserved_bytes, static_cast<int64_t>(20 * kMiB));
}

TEST_F(CachingAllocatorTest, SystemRefusalWithNothingCachedThrows) {
  log_.capacity = 21 * kMiB;
  std::shared_ptr<void> large = allocator_->Allocate(3 * kMiB);  // 20 MiB segment
  try {
    // 18 MiB is more than the segment's free 17 MiB, and its own segment cannot be had.
    allocator_->Allocate(18 * kMiB);
    FAIL() << "expected an out-of-memory error";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("fakeMalloc"), std::string::npos) << message;
    EXPECT_NE(message.find("fake: out of memory"), std::string::npos) << message;
    EXPECT_NE(message.find("cuda:3"), std::string::npos) << message;
    EXPECT_NE(message.find("18.00 MiB"), std::string::npos) << message;
  }
  EXPECT_EQ(log_.refusals, 2);  // the first try and the one retry
  EXPECT_EQ(allocator_->Stats().in_use_bytes, static_cast<int64_t>(3 * kMiB));
}

TEST_F(CachingAllocatorTest, ConcurrentAllocationsKeepConsistentStatistics) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        std::shared_ptr<void> a = allocator_->Allocate(512 * (1 + (i + t) % 7));
        std::shared_ptr<void> b = allocator_->Allocate((i % 3) * kMiB + 100);
        static_cast<char*>(a.get())[0] = 1;  // the memory is really there
        static_cast<char*>(b.get())[0] = 1;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  const MemoryStats stats = allocator_->Stats();
  EXPECT_EQ(stats.in_use_bytes, 0);
  EXPECT_EQ(stats.num_allocations, 4 * 2000 * 2);
  EXPECT_LE(stats.num_system_allocations, 16);
  allocator_->EmptyCache();
  EXPECT_EQ(allocator_->NumSegments(), 0);
  EXPECT_TRUE(log_.live.empty());
}

// ---- RecordStream (PyTorch's record_stream) ---------------------------------------------

// The allocator's device is cuda:3 and the current stream is its stream 1 (log_.stream).
constexpr Device kDevice = Device::Cuda(3);

TEST_F(CachingAllocatorTest, BlockRecordedOnAnotherStreamWaitsForThatStreamsWork) {
  const Stream comm(kDevice, 2);
  std::shared_ptr<void> block = allocator_->Allocate(4096);
  void* const first = block.get();
  allocator_->RecordStream(first, comm);
  log_.queued[comm] = 1;  // e.g. a copy on `comm` that reads the block
  block.reset();
  EXPECT_EQ(log_.events_recorded, 1);
  EXPECT_EQ(allocator_->NumPendingBlocks(), 1);
  EXPECT_EQ(allocator_->Stats().in_use_bytes, 4096);  // not reusable yet: still counted
  {
    std::shared_ptr<void> meanwhile = allocator_->Allocate(4096);
    EXPECT_NE(meanwhile.get(), first);  // the copy may still be reading `first`
  }
  log_.finished[comm] = 1;
  std::shared_ptr<void> again = allocator_->Allocate(4096);
  EXPECT_EQ(again.get(), first);
  EXPECT_EQ(allocator_->NumPendingBlocks(), 0);
  EXPECT_EQ(allocator_->Stats().in_use_bytes, 4096);
  EXPECT_EQ(log_.allocations, 1);
}

TEST_F(CachingAllocatorTest, OnlyWorkQueuedBeforeTheFreeDelaysReuse) {
  const Stream comm(kDevice, 2);
  void* first = nullptr;
  {
    std::shared_ptr<void> block = allocator_->Allocate(4096);
    first = block.get();
    allocator_->RecordStream(first, comm);
    log_.queued[comm] = 1;
  }
  log_.queued[comm] = 5;  // later work on `comm` does not use the freed block
  log_.finished[comm] = 1;
  EXPECT_EQ(allocator_->Allocate(4096).get(), first);
}

TEST_F(CachingAllocatorTest, EveryRecordedStreamMustFinishIncludingOtherDevices) {
  const Stream comm(kDevice, 2);
  const Stream other_device(Device::Cuda(4), 0);  // a copy to cuda:4 reads the block
  std::shared_ptr<void> block = allocator_->Allocate(4096);
  void* const first = block.get();
  allocator_->RecordStream(first, comm);
  allocator_->RecordStream(first, other_device);
  allocator_->RecordStream(first, comm);  // twice: still one event
  log_.queued[comm] = 1;
  log_.queued[other_device] = 1;
  block.reset();
  EXPECT_EQ(log_.events_recorded, 2);
  log_.finished[comm] = 1;
  EXPECT_NE(allocator_->Allocate(4096).get(), first);
  log_.finished[other_device] = 1;
  EXPECT_EQ(allocator_->Allocate(4096).get(), first);
}

TEST_F(CachingAllocatorTest, RecordingTheOwnStreamOrAnotherDeviceTypeIsANoOp) {
  void* first = nullptr;
  {
    std::shared_ptr<void> block = allocator_->Allocate(4096);
    first = block.get();
    allocator_->RecordStream(first, Stream(kDevice, 1));  // the allocating stream
    allocator_->RecordStream(first, Stream(Device::Cpu(0), 0));
  }
  EXPECT_EQ(log_.events_recorded, 0);
  EXPECT_EQ(allocator_->NumPendingBlocks(), 0);
  EXPECT_EQ(allocator_->Allocate(4096).get(), first);
}

TEST_F(CachingAllocatorTest, RecordStreamFindsBlocksByInteriorPointers) {
  const Stream comm(kDevice, 2);
  std::shared_ptr<void> a = allocator_->Allocate(8192);
  std::shared_ptr<void> b = allocator_->Allocate(8192);
  void* const first = b.get();
  allocator_->RecordStream(static_cast<char*>(first) + 8191, comm);  // b's last byte
  log_.queued[comm] = 1;
  b.reset();
  EXPECT_EQ(allocator_->NumPendingBlocks(), 1);
  a.reset();  // a's neighbour b is pending, not free: no merge across it
  EXPECT_NE(allocator_->Allocate(8192 * 2).get(), first);
}

TEST_F(CachingAllocatorTest, RecordStreamOfForeignOrFreedMemoryIsAClearError) {
  const Stream comm(kDevice, 2);
  int on_the_stack = 0;
  EXPECT_FALSE(allocator_->TryRecordStream(&on_the_stack, comm));
  void* freed = nullptr;
  {
    std::shared_ptr<void> block = allocator_->Allocate(4096);
    freed = block.get();
    std::shared_ptr<void> keeps_the_segment = allocator_->Allocate(4096);
    block.reset();
    EXPECT_FALSE(allocator_->TryRecordStream(freed, comm));
    try {
      allocator_->RecordStream(freed, comm);
      ADD_FAILURE() << "no error";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("is not inside a live block of cuda:3"),
                std::string::npos)
          << error.what();
    }
  }
}

TEST_F(CachingAllocatorTest, SynchronousSystemsIgnoreRecordStream) {
  log_.asynchronous = false;  // a CPU device: nothing runs behind the host's back
  const Stream comm(kDevice, 2);
  int on_the_stack = 0;
  EXPECT_NO_THROW(allocator_->RecordStream(&on_the_stack, comm));
  void* first = nullptr;
  {
    std::shared_ptr<void> block = allocator_->Allocate(4096);
    first = block.get();
    allocator_->RecordStream(first, comm);
    log_.queued[comm] = 1;
  }
  EXPECT_EQ(log_.events_recorded, 0);
  EXPECT_EQ(allocator_->Allocate(4096).get(), first);
}

TEST_F(CachingAllocatorTest, PendingBlocksMergeWithTheirNeighboursOnceDone) {
  const Stream comm(kDevice, 2);
  std::vector<std::shared_ptr<void>> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(allocator_->Allocate(256 * 1024));
  void* const head = blocks[0].get();
  allocator_->RecordStream(blocks[1].get(), comm);
  log_.queued[comm] = 1;
  blocks.clear();  // 0, 2, 3 back to the pool at once (0 alone: 1 is pending between)
  EXPECT_EQ(allocator_->NumPendingBlocks(), 1);
  EXPECT_EQ(allocator_->CachedBytes(), static_cast<int64_t>(2 * kMiB - 256 * 1024));
  log_.finished[comm] = 1;
  allocator_->EmptyCache();  // collects the pending block; the whole segment is free again
  EXPECT_EQ(allocator_->NumPendingBlocks(), 0);
  EXPECT_EQ(log_.frees, 1);
  EXPECT_EQ(allocator_->NumSegments(), 0);
  // A segment whose first block was merged away still finds its blocks.
  std::shared_ptr<void> x = allocator_->Allocate(4096);
  std::shared_ptr<void> y = allocator_->Allocate(4096);
  x.reset();
  y.reset();  // y merges into x's place: y's Block now starts the segment
  std::shared_ptr<void> z = allocator_->Allocate(4096);
  EXPECT_TRUE(allocator_->TryRecordStream(static_cast<char*>(z.get()) + 100, comm));
  EXPECT_NE(head, nullptr);
}

TEST_F(CachingAllocatorTest, EmptyCacheKeepsSegmentsWithPendingBlocks) {
  const Stream comm(kDevice, 2);
  {
    std::shared_ptr<void> block = allocator_->Allocate(15 * kMiB);
    allocator_->RecordStream(block.get(), comm);
    log_.queued[comm] = 1;
  }
  allocator_->EmptyCache();
  EXPECT_EQ(log_.frees, 0);
  EXPECT_EQ(allocator_->NumSegments(), 1);
  log_.finished[comm] = 1;
  allocator_->EmptyCache();
  EXPECT_EQ(log_.frees, 1);
  EXPECT_EQ(allocator_->Stats().in_use_bytes, 0);
}

TEST_F(CachingAllocatorTest, OutOfMemoryWaitsForPendingBlocksBeforeGivingUp) {
  log_.capacity = 20 * kMiB;
  const Stream comm(kDevice, 2);
  {
    std::shared_ptr<void> block = allocator_->Allocate(15 * kMiB);
    allocator_->RecordStream(block.get(), comm);
    log_.queued[comm] = 1;
  }
  // The only segment is pending: the system refuses a second one, so the allocator waits for
  // `comm` (a host-side synchronisation) and retries.
  std::shared_ptr<void> again = allocator_->Allocate(15 * kMiB);
  EXPECT_NE(again.get(), nullptr);
  EXPECT_EQ(log_.events_waited, 1);
  EXPECT_EQ(log_.refusals, 1);
  EXPECT_EQ(allocator_->NumPendingBlocks(), 0);
  EXPECT_EQ(allocator_->Stats().in_use_bytes, static_cast<int64_t>(15 * kMiB));
}

TEST_F(CachingAllocatorTest, AFailingEventKeepsTheBlockOutOfUseInsteadOfCrashing) {
  const Stream comm(kDevice, 2);
  void* first = nullptr;
  {
    std::shared_ptr<void> block = allocator_->Allocate(4096);
    first = block.get();
    allocator_->RecordStream(first, comm);
    log_.fail_events = true;
  }  // the deleter must not throw
  log_.fail_events = false;
  EXPECT_NE(allocator_->Allocate(4096).get(), first);
  allocator_.reset();  // returns the lost block's segment too
  EXPECT_TRUE(log_.live.empty());
}

TEST(CachingAllocatorDestruction, WaitsForPendingBlocksAndReturnsTheirSegments) {
  FakeMemory::Log log;
  {
    CachingAllocator allocator(kDevice, std::make_unique<FakeMemory>(&log));
    const Stream comm(kDevice, 2);
    std::shared_ptr<void> block = allocator.Allocate(4096);
    allocator.RecordStream(block.get(), comm);
    log.queued[comm] = 1;
    block.reset();
    EXPECT_EQ(allocator.NumPendingBlocks(), 1);
  }
  EXPECT_EQ(log.events_waited, 1);
  EXPECT_EQ(log.frees, 1);
  EXPECT_TRUE(log.live.empty());
}

TEST_F(CachingAllocatorTest, ConcurrentRecordStreamAndFreesStayConsistent) {
  // Events complete at once (nothing queued): blocks pass through the pending list quickly.
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      const Stream comm(kDevice, 10 + t);
      for (int i = 0; i < 500; ++i) {
        std::shared_ptr<void> block = allocator_->Allocate(512 * (1 + (i + t) % 7));
        allocator_->RecordStream(block.get(), comm);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  allocator_->EmptyCache();
  EXPECT_EQ(allocator_->NumPendingBlocks(), 0);
  EXPECT_EQ(allocator_->Stats().in_use_bytes, 0);
  EXPECT_EQ(allocator_->NumSegments(), 0);
}

// Graph-private pools: what a capture allocates is nobody else's while the graph lives, even
// once freed; the capture reuses its own freed blocks; a reset hands the memory back.
TEST_F(CachingAllocatorTest, PrivatePoolBlocksAreTheCapturesAlone) {
  log_.stream = 1;
  std::shared_ptr<void> before = allocator_->Allocate(4096);  // a shared segment, half used
  const uint64_t pool = allocator_->CreatePrivatePool();
  EXPECT_NE(pool, 0u);
  allocator_->BeginAllocateToPool(pool, /*stream=*/1);
  EXPECT_TRUE(allocator_->CaptureUnderway());
  std::shared_ptr<void> a = allocator_->Allocate(4096);
  void* const a_ptr = a.get();
  EXPECT_EQ(allocator_->PrivatePoolSegments(pool), 1);  // not carved from the shared segment
  EXPECT_EQ(log_.allocations, 2);
  a.reset();  // freed during the capture: later allocations of the capture may reuse it
  std::shared_ptr<void> b = allocator_->Allocate(4096);
  EXPECT_EQ(b.get(), a_ptr);
  allocator_->EndAllocateToPool(pool);
  EXPECT_FALSE(allocator_->CaptureUnderway());
  b.reset();
  // After the capture, the graph's blocks (freed or not) are reused by no one else.
  std::shared_ptr<void> outside = allocator_->Allocate(4096);
  EXPECT_NE(outside.get(), a_ptr);
  allocator_->EmptyCache();
  EXPECT_EQ(allocator_->PrivatePoolSegments(pool), 1);  // not returned to the system either
  // The reset: its memory joins the shared pools.
  allocator_->ReleasePrivatePool(pool);
  EXPECT_EQ(allocator_->PrivatePoolSegments(pool), 0);
  outside.reset();
  before.reset();
  allocator_->EmptyCache();
  EXPECT_EQ(log_.frees, 2);
  EXPECT_EQ(allocator_->NumSegments(), 0);
}

TEST_F(CachingAllocatorTest, DuringACaptureNoEventIsPolledAndNoMemoryReturned) {
  const Stream comm(kDevice, 2);
  log_.stream = 1;
  log_.capacity = 4 * kMiB;
  std::shared_ptr<void> shared = allocator_->Allocate(4096);
  allocator_->RecordStream(shared.get(), comm);
  const uint64_t pool = allocator_->CreatePrivatePool();
  allocator_->BeginAllocateToPool(pool, 1);
  shared.reset();  // would record an event on `comm`: deferred to the capture's end
  EXPECT_EQ(log_.events_recorded, 0);
  std::shared_ptr<void> in_graph = allocator_->Allocate(4096);  // 2 MiB more: at capacity
  // Out of memory mid-capture: no waiting on events, no frees; a clear error instead.
  try {
    allocator_->Allocate(3 * kMiB);
    ADD_FAILURE() << "expected an out-of-memory error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("during a CUDA Graph capture"), std::string::npos)
        << error.what();
  }
  EXPECT_EQ(log_.events_waited, 0);
  EXPECT_EQ(log_.frees, 0);
  EXPECT_THROW(allocator_->BeginAllocateToPool(pool, 1), Error);  // one capture per stream
  EXPECT_THROW(allocator_->ReleasePrivatePool(pool), Error);      // still capturing
  allocator_->EndAllocateToPool(pool);
  EXPECT_EQ(log_.events_recorded, 1);  // the deferred free, now
  in_graph.reset();
  allocator_->ReleasePrivatePool(pool);
  EXPECT_THROW(allocator_->BeginAllocateToPool(pool, 1), Error);  // released
}

}  // namespace
}  // namespace tandem
