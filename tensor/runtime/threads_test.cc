#include "tensor/runtime/threads.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/base/device.h"
#include "tensor/base/error.h"
#include "tensor/base/grad_mode.h"
#include "tensor/runtime/devices.h"
#include "tensor/runtime/stream.h"

namespace tandem {
namespace {

using std::chrono::milliseconds;

// ---- DeviceWorker ---------------------------------------------------------------------

TEST(DeviceWorkerTest, SubmitReturnsTheTaskResultThroughTheFuture) {
  std::future<int> result = DeviceWorker::For(Device::Cpu(0)).Submit([] { return 6 * 7; });
  EXPECT_EQ(result.get(), 42);
  std::future<void> done = DeviceWorker::For(Device::Cpu(0)).Submit([] {});
  done.get();
}

TEST(DeviceWorkerTest, ExceptionsReachTheFuture) {
  DeviceWorker& worker = DeviceWorker::For(Device::Cpu(0));
  std::future<int> failed =
      worker.Submit([]() -> int { TANDEM_FAIL("expected failure from a task"); });
  std::exception_ptr error;
  try {
    failed.get();
  } catch (...) {
    error = std::current_exception();
  }
  ASSERT_TRUE(error) << "the future did not rethrow";
  // The worker survives a failing task. (Waiting for it also makes sure the worker has
  // dropped its reference to the exception before we read it: ThreadSanitizer cannot see
  // libstdc++'s exception reference count.)
  EXPECT_EQ(worker.Submit([] { return 1; }).get(), 1);
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected failure from a task"), std::string::npos);
  }
}

TEST(DeviceWorkerTest, ForGivesOneWorkerPerDeviceIncludingCuda) {
  DeviceWorker& cpu0 = DeviceWorker::For(Device::Cpu(0));
  EXPECT_EQ(&cpu0, &DeviceWorker::For(Device::Cpu(0)));
  DeviceWorker& cpu1 = DeviceWorker::For(Device::Cpu(1));
  EXPECT_NE(&cpu0, &cpu1);
  EXPECT_EQ(cpu1.device(), Device::Cpu(1));
  // CUDA devices get a worker thread too (it only queues host-side work).
  DeviceWorker& cuda0 = DeviceWorker::For(Device::Cuda(0));
  EXPECT_EQ(cuda0.device(), Device::Cuda(0));
  EXPECT_NE(&cuda0, &cpu0);
  EXPECT_EQ(cuda0.Submit([] { return 3; }).get(), 3);
  EXPECT_THROW(DeviceWorker::For(Device::Cpu(-1)), Error);
}

TEST(DeviceWorkerTest, CurrentIsTheWorkerRunningTheTask) {
  EXPECT_EQ(DeviceWorker::Current(), nullptr);
  DeviceWorker& worker = DeviceWorker::For(Device::Cpu(1));
  EXPECT_EQ(worker.Submit([] { return DeviceWorker::Current(); }).get(), &worker);
  EXPECT_EQ(DeviceWorker::Current(), nullptr);
}

TEST(DeviceWorkerTest, RunsTasksInOrderOnOneThread) {
  DeviceWorker& worker = DeviceWorker::For(Device::Cpu(0));
  std::vector<int> order;
  std::set<std::thread::id> threads;
  std::vector<std::future<void>> futures;
  for (int i = 0; i < 1000; ++i) {
    // No lock needed: tasks run one at a time, and get() below orders them before our reads.
    futures.push_back(worker.Submit([&, i] {
      order.push_back(i);
      threads.insert(std::this_thread::get_id());
    }));
  }
  for (auto& future : futures) future.get();
  ASSERT_EQ(order.size(), 1000u);
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(order[i], i);
  EXPECT_EQ(threads.size(), 1u);
  EXPECT_EQ(threads.count(std::this_thread::get_id()), 0u);
}

TEST(DeviceWorkerTest, WorkersOfDifferentDevicesRunConcurrently) {
  // Each task waits until the other has started: this finishes only if both run at once.
  std::atomic<int> started{0};
  auto task = [&] {
    ++started;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (started.load() < 2 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::yield();
    }
    return started.load();
  };
  std::future<int> a = DeviceWorker::For(Device::Cpu(0)).Submit(task);
  std::future<int> b = DeviceWorker::For(Device::Cpu(1)).Submit(task);
  EXPECT_EQ(a.get(), 2);
  EXPECT_EQ(b.get(), 2);
}

TEST(DeviceWorkerTest, DestructorFinishesQueuedTasksThenJoins) {
  std::atomic<int> finished{0};
  std::thread::id worker_thread;
  {
    DeviceWorker worker(Device::Cpu(7));
    worker.Post([&] { worker_thread = std::this_thread::get_id(); });
    for (int i = 0; i < 5; ++i) {
      worker.Post([&] {
        std::this_thread::sleep_for(milliseconds(5));
        ++finished;
      });
    }
  }
  EXPECT_EQ(finished.load(), 5);
  EXPECT_NE(worker_thread, std::thread::id());
}

TEST(DeviceWorkerTest, TasksPostedByTasksDuringShutdownStillRun) {
  std::atomic<int> finished{0};
  {
    DeviceWorker worker(Device::Cpu(7));
    worker.Post([&] {
      std::this_thread::sleep_for(milliseconds(20));  // the destructor starts meanwhile
      DeviceWorker::Current()->Post([&] { ++finished; });
    });
  }
  EXPECT_EQ(finished.load(), 1);
}

// Process exit joins the workers: queued tasks finish first, and nothing hangs or crashes,
// even when exit is called from inside a task or while pools exist. Each case runs in a
// child process (a death test), re-executed so that it starts with no threads.
TEST(DeviceWorkerExitTest, ExitFinishesQueuedTasks) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        ParallelFor(Device::Cpu(0), 1 << 20, 1024, [](int64_t, int64_t) {});
        DeviceWorker& worker = DeviceWorker::For(Device::Cpu(0));
        for (int i = 0; i < 3; ++i) {
          worker.Post([] { std::this_thread::sleep_for(milliseconds(20)); });
        }
        worker.Post([] { fprintf(stderr, "last task ran\n"); });
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "last task ran");
}

TEST(DeviceWorkerExitTest, ExitFromInsideATaskDoesNotHang) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        DeviceWorker::For(Device::Cpu(1)).Post([] { fprintf(stderr, "other worker ok\n"); });
        DeviceWorker::For(Device::Cpu(0))
            .Submit([] {
              ParallelFor(Device::Cpu(0), 1 << 20, 1024, [](int64_t, int64_t) {});
              std::exit(3);
            })
            .wait();
      },
      ::testing::ExitedWithCode(3), "other worker ok");
}

// ---- ThreadPool -----------------------------------------------------------------------

// Runs pool.Run(n, grain) and checks that every index is covered exactly once, by at most
// num_threads contiguous chunks of at least `grain` (unless n itself is smaller).
void ExpectExactCover(ThreadPool& pool, int64_t n, int64_t grain) {
  std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
  std::mutex mutex;
  std::vector<std::pair<int64_t, int64_t>> chunks;
  pool.Run(n, grain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) ++hits[i];
    std::lock_guard<std::mutex> lock(mutex);
    chunks.emplace_back(begin, end);
  });
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "index " << i << " of " << n;
  if (n == 0) {
    EXPECT_TRUE(chunks.empty());
    return;
  }
  EXPECT_LE(static_cast<int>(chunks.size()), pool.num_threads());
  std::sort(chunks.begin(), chunks.end());
  EXPECT_EQ(chunks.front().first, 0);
  EXPECT_EQ(chunks.back().second, n);
  for (size_t c = 0; c < chunks.size(); ++c) {
    if (c > 0) {
      EXPECT_EQ(chunks[c].first, chunks[c - 1].second);
    }
    if (n >= grain) {
      EXPECT_GE(chunks[c].second - chunks[c].first, grain);
    }
  }
}

TEST(ThreadPoolTest, CoversEveryIndexExactlyOnce) {
  for (int threads : {1, 2, 3, 4, 7}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.num_threads(), threads);
    for (int64_t n : {0, 1, 2, 5, 13, 64, 1000, 4097}) {
      for (int64_t grain : {1, 3, 16, 5000}) {
        SCOPED_TRACE("threads=" + std::to_string(threads) + " n=" + std::to_string(n) +
                     " grain=" + std::to_string(grain));
        ExpectExactCover(pool, n, grain);
      }
    }
  }
}

TEST(ThreadPoolTest, SplitsIntoAsManyChunksAsThreadsAndRunsThemConcurrently) {
  ThreadPool pool(4);
  std::atomic<int> started{0};
  std::mutex mutex;
  std::set<std::thread::id> threads;
  pool.Run(400, 100, [&](int64_t, int64_t) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      threads.insert(std::this_thread::get_id());
    }
    // Each chunk waits for all four to start: only four threads at once can get past this.
    ++started;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (started.load() < 4 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::yield();
    }
  });
  EXPECT_EQ(started.load(), 4);
  EXPECT_EQ(threads.size(), 4u);
  EXPECT_EQ(threads.count(std::this_thread::get_id()), 1u) << "the caller takes a chunk";
}

TEST(ThreadPoolTest, RethrowsTheExceptionOfAChunkAndStaysUsable) {
  ThreadPool pool(3);
  EXPECT_THROW(pool.Run(300, 10,
                        [](int64_t begin, int64_t end) {
                          if (begin <= 150 && 150 < end) throw std::runtime_error("chunk failed");
                        }),
               std::runtime_error);
  EXPECT_THROW(pool.Run(1, 10, [](int64_t, int64_t) { TANDEM_FAIL("inline failure"); }), Error);
  ExpectExactCover(pool, 999, 7);
}

TEST(ThreadPoolTest, NestedRunsInlineInsteadOfDeadlocking) {
  ThreadPool pool(3);
  const int64_t outer = 30, inner = 50;
  std::vector<std::atomic<int>> hits(outer * inner);
  pool.Run(outer, 1, [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o) {
      const std::thread::id me = std::this_thread::get_id();
      pool.Run(inner, 1, [&](int64_t b, int64_t e) {
        EXPECT_EQ(std::this_thread::get_id(), me) << "a nested Run must stay on its thread";
        for (int64_t i = b; i < e; ++i) ++hits[o * inner + i];
      });
    }
  });
  for (auto& hit : hits) EXPECT_EQ(hit.load(), 1);
}

TEST(ThreadPoolTest, ConcurrentCallersShareThePool) {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&] {
      for (int round = 0; round < 50; ++round) {
        pool.Run(1000, 10, [&](int64_t begin, int64_t end) { total += end - begin; });
      }
    });
  }
  for (auto& caller : callers) caller.join();
  EXPECT_EQ(total.load(), 4 * 50 * 1000);
}

TEST(ThreadPoolTest, RejectsZeroThreads) { EXPECT_THROW(ThreadPool(0), Error); }

// ---- CpuThreadPool and ParallelFor ------------------------------------------------------

TEST(CpuThreadPoolTest, HasTheDeviceShareOfTheCores) {
  EXPECT_EQ(CpuThreadPool(0).num_threads(), CpuThreadsPerDevice());
  EXPECT_EQ(&CpuThreadPool(0), &CpuThreadPool(0));
  EXPECT_NE(&CpuThreadPool(0), &CpuThreadPool(1));
  EXPECT_THROW(CpuThreadPool(-1), Error);
}

TEST(CpuThreadPoolTest, FollowsTheDeviceCount) {
  const int original = CpuDeviceCount();
  SetCpuDeviceCount(1);
  EXPECT_EQ(CpuThreadPool(0).num_threads(), HardwareCores());
  SetCpuDeviceCount(std::max(2, HardwareCores()));
  EXPECT_EQ(CpuThreadPool(0).num_threads(), 1);
  EXPECT_EQ(CpuThreadPool(1).num_threads(), 1);
  SetCpuDeviceCount(original);
  EXPECT_EQ(CpuThreadPool(0).num_threads(), CpuThreadsPerDevice());
}

TEST(CpuThreadPoolTest, ResetWhileLoopsRunDoesNotPullThePoolFromUnderThem) {
  // The contract asks for no running work, but a pool in use must survive a reset anyway.
  std::atomic<bool> stop{false};
  std::atomic<int64_t> covered{0};
  std::thread looper([&] {
    while (!stop.load()) {
      ParallelFor(Device::Cpu(0), 4096, 64,
                  [&](int64_t begin, int64_t end) { covered += end - begin; });
    }
  });
  while (covered.load() == 0) std::this_thread::yield();
  for (int i = 0; i < 200; ++i) {
    ResetCpuThreadPools();
    std::this_thread::yield();
  }
  stop = true;
  looper.join();
  EXPECT_EQ(covered.load() % 4096, 0);
}

TEST(ParallelForTest, CoversEveryIndexExactlyOnce) {
  for (int64_t n : {0, 1, 7, 100, 65536, 100003}) {
    for (int64_t grain : {1, 100, 32768}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      ParallelFor(Device::Cpu(0), n, grain, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) ++hits[i];
      });
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " grain=" << grain << " index " << i;
      }
    }
  }
}

TEST(ParallelForTest, SmallLoopsRunInlineOnTheCaller) {
  std::vector<std::pair<int64_t, int64_t>> calls;
  std::thread::id thread;
  ParallelFor(Device::Cpu(0), 100, 64, [&](int64_t begin, int64_t end) {
    calls.emplace_back(begin, end);
    thread = std::this_thread::get_id();
  });
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0], std::make_pair(int64_t{0}, int64_t{100}));
  EXPECT_EQ(thread, std::this_thread::get_id());
}

TEST(ParallelForTest, NestedCallsCoverEverything) {
  const int64_t outer = 64, inner = 1000;
  std::vector<std::atomic<int>> hits(outer * inner);
  ParallelFor(Device::Cpu(0), outer, 1, [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o) {
      ParallelFor(Device::Cpu(0), inner, 1, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) ++hits[o * inner + i];
      });
    }
  });
  for (auto& hit : hits) EXPECT_EQ(hit.load(), 1);
}

TEST(ParallelForTest, RunsFromDeviceWorkersOfDifferentDevices) {
  // DataParallel's pattern: each device's worker splits its own loops over its own pool.
  const int64_t n = 200000;
  std::vector<std::future<int64_t>> sums;
  for (int d = 0; d < 2; ++d) {
    sums.push_back(DeviceWorker::For(Device::Cpu(d)).Submit([d, n] {
      std::atomic<int64_t> sum{0};
      ParallelFor(Device::Cpu(d), n, 1000, [&](int64_t begin, int64_t end) {
        int64_t local = 0;
        for (int64_t i = begin; i < end; ++i) local += i;
        sum += local;
      });
      return sum.load();
    }));
  }
  for (auto& sum : sums) EXPECT_EQ(sum.get(), n * (n - 1) / 2);
}

TEST(ParallelForTest, RethrowsExceptions) {
  EXPECT_THROW(ParallelFor(Device::Cpu(0), 1 << 20, 1024,
                           [](int64_t begin, int64_t) {
                             if (begin == 0) TANDEM_FAIL("first chunk fails");
                           }),
               Error);
}

TEST(ParallelForTest, RejectsCudaDevices) {
  EXPECT_THROW(ParallelFor(Device::Cuda(0), 10, 1, [](int64_t, int64_t) {}), Error);
}

TEST(DeviceWorkerContextTest, TasksRunWithThePostersGradModeAndStreams) {
  SetCpuDeviceCount(2);
  DeviceWorker& worker = DeviceWorker::For(Device::Cpu(1));
  const Stream side = SideStream(Device::Cpu(1));
  auto context = [] {
    return std::make_pair(GradMode::IsEnabled(), CurrentStream(Device::Cpu(1)));
  };
  EXPECT_EQ(worker.Submit(context).get(), std::make_pair(true, DefaultStream(Device::Cpu(1))));
  {
    NoGradGuard no_grad;
    StreamGuard guard(side);
    EXPECT_EQ(worker.Submit(context).get(), std::make_pair(false, side));
  }
  EXPECT_EQ(worker.Submit(context).get(), std::make_pair(true, DefaultStream(Device::Cpu(1))));
}

}  // namespace
}  // namespace tandem
