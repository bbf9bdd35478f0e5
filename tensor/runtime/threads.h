// Workers and thread pools behind devices.
//
// DeviceWorker: one thread per device with a FIFO of tasks. The autograd engine runs each
// device's part of a backward pass there, and parallel_apply runs each replica's forward
// there, so work on different devices overlaps.
//
// ThreadPool / ParallelFor: the intra-op threads of one logical CPU device (its fixed share
// of the cores). Kernels split large loops with ParallelFor; small loops run inline.
//
//   std::future<int> f = tandem::DeviceWorker::For(tandem::Device::Cpu(1)).Submit([] { return 7;
//   }); tandem::ParallelFor(tandem::Device::Cpu(0), n, 4096, [&](int64_t begin, int64_t end) { ...
//   });
#ifndef TANDEM_TENSOR_RUNTIME_THREADS_H_
#define TANDEM_TENSOR_RUNTIME_THREADS_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#include "tensor/base/device.h"

namespace tandem {

class DeviceWorker {
 public:
  // The worker of a device, started on first use and joined at process exit.
  static DeviceWorker& For(Device device);
  // The worker whose thread is calling, or nullptr on other threads.
  static DeviceWorker* Current();

  explicit DeviceWorker(Device device);
  ~DeviceWorker();  // finishes queued tasks, then joins
  DeviceWorker(const DeviceWorker&) = delete;
  DeviceWorker& operator=(const DeviceWorker&) = delete;

  Device device() const { return device_; }

  // Queues `task`; exceptions it throws reach the future. Like Post, it runs with the
  // caller's grad mode (tensor/base/grad_mode.h) and autocast state.
  template <typename F>
  auto Submit(F&& task) -> std::future<std::invoke_result_t<F>> {
    using R = std::invoke_result_t<F>;
    auto packaged = std::make_shared<std::packaged_task<R()>>(std::forward<F>(task));
    std::future<R> result = packaged->get_future();
    Post([packaged] { (*packaged)(); });
    return result;
  }
  // Queues a task that must not throw (it is the caller's job to catch). The task runs with
  // the grad mode, the autocast state (tensor/base/autocast_mode.h) and the current streams
  // (tensor/runtime/stream.h) the calling thread has now.
  void Post(std::function<void()> task);

 private:
  void Loop();

  Device device_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> tasks_;
  // tasks_.size(), readable without the lock: a worker that has just finished a task polls it
  // for a moment before sleeping (see Loop).
  std::atomic<size_t> queued_{0};
  bool stopping_ = false;
  std::thread thread_;
};

// Whether the calling thread runs `device`'s work itself instead of posting it to that
// device's worker: it is that worker (or acts as it, below), or it is no device's worker (the
// program's thread) and `device` is a CPU device, whose kernels run on whichever thread calls
// them; running it here saves two thread hand-offs. A caller that splits work over several
// devices runs the part of at most one of them here (the first for which this is true).
bool RunsInline(Device device);

// Makes the calling thread count as `worker` (DeviceWorker::Current()) while it lives: for a
// thread that runs a CPU device's work inline in that device's stead (parallel_apply and the
// autograd engine do, to save hand-offs), so that the work sees the device it runs for.
class WorkerScope {
 public:
  explicit WorkerScope(DeviceWorker* worker);
  ~WorkerScope();
  WorkerScope(const WorkerScope&) = delete;
  WorkerScope& operator=(const WorkerScope&) = delete;

 private:
  DeviceWorker* previous_;
};

// A fixed set of threads that run the chunks of ParallelFor; the calling thread takes a
// chunk too, so a pool of n threads has n - 1 helpers.
class ThreadPool {
 public:
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }
  // Calls fn(begin, end) over [0, n) in at most num_threads() contiguous chunks of at least
  // `grain` elements; returns when all are done and rethrows the first exception.
  void Run(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  struct Job;
  void Loop();

  int num_threads_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::shared_ptr<Job> job_;
  uint64_t generation_ = 0;
  std::atomic<uint64_t> published_{0};  // generation_, readable without the lock by spinners
  bool stopping_ = false;
  std::mutex run_mutex_;  // one Run at a time per pool
  std::vector<std::thread> threads_;
};

// Polls `ready` for up to `budget` (pausing the core between polls, yielding it after the
// first few microseconds) and returns its last value. For a thread about to sleep on a
// condition variable when the event it waits for is likely imminent: waking a sleeping
// thread costs tens of microseconds (more in a virtual machine), a step of DataParallel hands
// work between threads several times, and a thread that yields costs the others little.
bool SpinWait(const std::function<bool()>& ready, std::chrono::microseconds budget);

// How long a thread that hands work to another (or has just finished its own) polls for the
// next event before sleeping: an idle device worker for its next task, parallel_apply's and
// the engine's caller for the other devices. Long enough to cover the gap between the hand-offs
// of one DataParallel step, short enough that an idle worker soon gives its core back; chosen
// with train_step's MLP step on cpu:0,cpu:1 (bazel run -c opt //tools/bench:train_step), where
// a shorter or a longer spin was slower.
inline constexpr std::chrono::microseconds kHandOffSpin{400};

// Drops the CPU pools so that they are recreated with the current share of cores. Called by
// SetCpuDeviceCount; no work may be running on them.
void ResetCpuThreadPools();

// The intra-op pool of a logical CPU device (CpuThreadsPerDevice() threads).
ThreadPool& CpuThreadPool(int cpu_index);

// Splits [0, n) over the pool of `device` (a CPU device) when n >= 2 * grain, inline
// otherwise. Nested calls from inside a chunk run inline.
void ParallelFor(Device device, int64_t n, int64_t grain,
                 const std::function<void(int64_t, int64_t)>& fn);

}  // namespace tandem

#endif  // TANDEM_TENSOR_RUNTIME_THREADS_H_
