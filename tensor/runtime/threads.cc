#include "tensor/runtime/threads.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <map>
#include <thread>
#include <utility>

#include "tensor/base/autocast_mode.h"
#include "tensor/base/error.h"
#include "tensor/base/grad_mode.h"
#include "tensor/runtime/devices.h"
#include "tensor/runtime/profiler.h"
#include "tensor/runtime/stream.h"

namespace tandem {
namespace {

// The worker whose thread this is (set for the lifetime of DeviceWorker::Loop).
thread_local DeviceWorker* t_current_worker = nullptr;
// True while this thread runs a chunk of a ThreadPool::Run: nested calls run inline, so a
// kernel that calls another parallel kernel never waits for threads that are busy with it.
thread_local bool t_in_parallel_region = false;

class ParallelRegionScope {
 public:
  ParallelRegionScope() : previous_(t_in_parallel_region) { t_in_parallel_region = true; }
  ~ParallelRegionScope() { t_in_parallel_region = previous_; }
  ParallelRegionScope(const ParallelRegionScope&) = delete;
  ParallelRegionScope& operator=(const ParallelRegionScope&) = delete;

 private:
  bool previous_;
};

// ---- Process-wide registries ----------------------------------------------------------
//
// Workers and pools live in heap-allocated registries that are never destroyed by static
// destructors: a worker may still be running a task while the process exits, and that task
// must not find its own worker (or a pool it uses) destroyed under it. Instead an atexit
// handler, registered when the first worker or pool is created, stops and joins them all.
// Because atexit handlers and static destructors run in reverse order of registration,
// everything constructed before the first worker (backend registry, allocators, ...) is
// still alive while the workers finish their queues.

// Devices with an index below this are looked up without a lock once they exist.
constexpr int kFastSlots = 64;

struct Registry {
  // Lock-free lookups for the hot paths (every Post of the autograd engine, every
  // ParallelFor): set under `mutex` once a worker or pool exists, cleared at shutdown/reset.
  std::atomic<DeviceWorker*> fast_workers[kNumDeviceTypes][kFastSlots] = {};
  std::shared_ptr<ThreadPool> fast_pools[kFastSlots];  // read with std::atomic_load

  std::mutex mutex;
  bool shut_down = false;
  std::map<Device, std::unique_ptr<DeviceWorker>> workers;
  // By CPU device index. Shared: ParallelFor holds a reference while it runs, so dropping a
  // pool from here (ResetCpuThreadPools) never destroys one in use.
  std::map<int, std::shared_ptr<ThreadPool>> cpu_pools;
  // CpuThreadsPerDevice() as of the last reset, 0 until asked for: computing it reads the
  // number of cores from /sys (~10 us), too slow for every ParallelFor.
  int threads_per_device = 0;
};

Registry& GetRegistry() {
  static Registry* registry = new Registry;  // Intentionally leaked: see above.
  return *registry;
}

void ShutDownAtExit() {
  // exit() called from inside a task: that worker cannot join itself, and the task that
  // called exit never returns to its loop, so that worker (and the pools, which it or a
  // chunk on this thread may be using) stay in the registry, alive. The process ends right
  // after the exit handlers anyway.
  DeviceWorker* self = DeviceWorker::Current();
  const bool keep_pools = self != nullptr || t_in_parallel_region;
  Registry& registry = GetRegistry();
  std::map<Device, std::unique_ptr<DeviceWorker>> workers;
  std::map<int, std::shared_ptr<ThreadPool>> pools;
  {
    std::lock_guard<std::mutex> lock(registry.mutex);
    registry.shut_down = true;
    for (auto& per_type : registry.fast_workers) {
      for (auto& slot : per_type) slot.store(nullptr, std::memory_order_release);
    }
    if (!keep_pools) {
      for (auto& pool : registry.fast_pools)
        std::atomic_store(&pool, std::shared_ptr<ThreadPool>());
    }
    for (auto it = registry.workers.begin(); it != registry.workers.end();) {
      if (it->second.get() == self) {
        ++it;
      } else {
        workers.insert(registry.workers.extract(it++));
      }
    }
    if (!keep_pools) pools.swap(registry.cpu_pools);
  }
  // Destroying a worker finishes its queue and joins it. One at a time: a draining task may
  // still wait for work it queued on a worker that has not been stopped yet.
  workers.clear();
  pools.clear();  // joins the idle helper threads
}

void EnsureShutDownRegistered() {
  static std::once_flag once;
  std::call_once(once, [] { std::atexit(&ShutDownAtExit); });
}

}  // namespace

// ---- Spinning ---------------------------------------------------------------------------

namespace {

inline void PauseCore() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

bool SpinWait(const std::function<bool()>& ready, std::chrono::microseconds budget) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  // sched_yield is a system call (a microsecond or more in a virtual machine): pause only at
  // first, then yield so that a thread waiting for this core gets it.
  const Clock::time_point yield_after = start + std::chrono::microseconds(20);
  const Clock::time_point end = start + budget;
  while (true) {
    for (int i = 0; i < 32; ++i) {
      if (ready()) return true;
      PauseCore();
    }
    const Clock::time_point now = Clock::now();
    if (now >= end) return ready();
    if (now >= yield_after) std::this_thread::yield();
  }
}

// ---- DeviceWorker -----------------------------------------------------------------------

DeviceWorker& DeviceWorker::For(Device device) {
  TANDEM_CHECK(device.index() >= 0, "DeviceWorker::For expects a device index >= 0 but got ",
               device, "; use a device such as cpu:0 or cuda:0");
  Registry& registry = GetRegistry();
  const int type = static_cast<int>(device.type());
  if (device.index() < kFastSlots) {
    DeviceWorker* worker =
        registry.fast_workers[type][device.index()].load(std::memory_order_acquire);
    if (worker != nullptr) return *worker;
  }
  EnsureShutDownRegistered();
  std::lock_guard<std::mutex> lock(registry.mutex);
  TANDEM_CHECK(!registry.shut_down, "DeviceWorker::For(", device,
               ") was called while the process is exiting; device workers have been joined. "
               "Run device work before main returns");
  std::unique_ptr<DeviceWorker>& worker = registry.workers[device];
  if (worker == nullptr) worker = std::make_unique<DeviceWorker>(device);
  if (device.index() < kFastSlots) {
    registry.fast_workers[type][device.index()].store(worker.get(), std::memory_order_release);
  }
  return *worker;
}

DeviceWorker* DeviceWorker::Current() { return t_current_worker; }

bool RunsInline(Device device) {
  DeviceWorker* self = DeviceWorker::Current();
  return self == nullptr ? device.is_cpu() : self == &DeviceWorker::For(device);
}

WorkerScope::WorkerScope(DeviceWorker* worker) : previous_(t_current_worker) {
  t_current_worker = worker;
}

WorkerScope::~WorkerScope() { t_current_worker = previous_; }

DeviceWorker::DeviceWorker(Device device) : device_(device) {
  thread_ = std::thread([this] { Loop(); });
}

DeviceWorker::~DeviceWorker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  ready_.notify_all();
  if (!thread_.joinable()) return;
  if (thread_.get_id() == std::this_thread::get_id()) {
    // Destroyed from one of its own tasks: joining would deadlock.
    thread_.detach();
  } else {
    thread_.join();
  }
}

void DeviceWorker::Post(std::function<void()> task) {
  // The task runs with the grad mode and current streams its poster had, as if the poster
  // ran it (PyTorch's engine carries both into its tasks), and with its autocast state too,
  // which PyTorch does not carry into DataParallel's replica threads: here a replica's forward
  // under the caller's AutocastGuard autocasts, sharing the guard's weight cache.
  task = [grad_mode = GradMode::IsEnabled(), streams = CurrentStreams(),
          autocast = AutocastMode::GetState(), task = std::move(task)]() mutable {
    AutoGradMode mode(grad_mode);
    MultiStreamGuard guard(streams);  // usually none: copies an empty vector
    AutocastStateGuard autocast_guard(std::move(autocast));
    task();
  };
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // While stopping, the loop still drains its queue, so tasks that the worker's own tasks
    // post are run; from other threads the loop may already have exited.
    TANDEM_CHECK(!stopping_ || t_current_worker == this, "cannot post a task to the worker of ",
                 device_,
                 ": it is shutting down (the process is exiting or the worker is being "
                 "destroyed); finish device work before that");
    tasks_.push_back(std::move(task));
    queued_.store(tasks_.size(), std::memory_order_release);
  }
  ready_.notify_one();
}

void DeviceWorker::Loop() {
  t_current_worker = this;
  profiler::SetThreadName(device_.ToString() + " worker");
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    if (tasks_.empty() && !stopping_) {
      // The next task usually follows within microseconds (the next phase of a step, the
      // next node of a backward pass): look for it before sleeping.
      lock.unlock();
      SpinWait([this] { return queued_.load(std::memory_order_acquire) > 0; }, kHandOffSpin);
      lock.lock();
    }
    ready_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
    if (tasks_.empty()) break;  // stopping, and the queue is drained
    std::function<void()> task = std::move(tasks_.front());
    tasks_.pop_front();
    queued_.store(tasks_.size(), std::memory_order_release);
    lock.unlock();
    task();
    task = nullptr;  // release captured state outside the lock, before waiting again
    lock.lock();
  }
  t_current_worker = nullptr;
}

// ---- ThreadPool -------------------------------------------------------------------------

// One call of Run: the chunks, which thread takes which (an atomic ticket), and completion.
struct ThreadPool::Job {
  const std::function<void(int64_t, int64_t)>* fn = nullptr;
  int64_t n = 0;
  int num_chunks = 0;
  std::atomic<int> next_chunk{0};
  std::atomic<bool> failed{false};

  std::mutex mutex;  // guards error; taken before done is notified
  std::condition_variable done;
  std::atomic<int> remaining{0};  // chunks not yet finished
  std::exception_ptr error;

  int64_t ChunkBegin(int chunk) const { return n * chunk / num_chunks; }

  // Takes chunks until none is left. Returns when this thread has nothing more to do.
  void Work() {
    ParallelRegionScope region;
    while (true) {
      const int chunk = next_chunk.fetch_add(1, std::memory_order_relaxed);
      if (chunk >= num_chunks) return;
      if (!failed.load(std::memory_order_relaxed)) {
        try {
          (*fn)(ChunkBegin(chunk), ChunkBegin(chunk + 1));
        } catch (...) {
          std::lock_guard<std::mutex> lock(mutex);
          if (!error) error = std::current_exception();
          failed.store(true, std::memory_order_relaxed);
        }
      }
      if (remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        { std::lock_guard<std::mutex> lock(mutex); }  // a waiter is asleep or sees 0
        done.notify_all();
      }
    }
  }
};

ThreadPool::ThreadPool(int num_threads) : num_threads_(num_threads) {
  TANDEM_CHECK(num_threads >= 1,
               "ThreadPool needs at least 1 thread (the caller) but was asked "
               "for ",
               num_threads);
  threads_.reserve(num_threads - 1);
  for (int i = 0; i + 1 < num_threads; ++i) threads_.emplace_back([this] { Loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (std::thread& thread : threads_) thread.join();
}

void ThreadPool::Run(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t num_chunks = std::min<int64_t>(num_threads_, n / grain);
  if (num_chunks <= 1 || t_in_parallel_region) {
    // Not split: a parallel loop nested inside `fn` may still use the pool.
    fn(0, n);
    return;
  }

  std::lock_guard<std::mutex> run_lock(run_mutex_);
  auto job = std::make_shared<Job>();
  job->fn = &fn;
  job->n = n;
  job->num_chunks = static_cast<int>(num_chunks);
  job->remaining = job->num_chunks;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = job;
    ++generation_;
    published_.store(generation_, std::memory_order_release);
  }
  // Wake only as many helpers as there are chunks beyond the caller's own.
  if (num_chunks - 1 >= static_cast<int64_t>(threads_.size())) {
    wake_.notify_all();
  } else {
    for (int64_t i = 0; i + 1 < num_chunks; ++i) wake_.notify_one();
  }
  job->Work();
  // The helpers' chunks are as long as the caller's: look for their end before sleeping.
  SpinWait([&] { return job->remaining.load(std::memory_order_acquire) == 0; }, kHandOffSpin);
  {
    std::unique_lock<std::mutex> lock(job->mutex);
    job->done.wait(lock, [&] { return job->remaining.load(std::memory_order_acquire) == 0; });
  }
  {
    // Helpers that wake late find no chunk left; dropping the pool's reference here keeps
    // the caller's `fn` from being reachable after Run returns.
    std::lock_guard<std::mutex> lock(mutex_);
    job_.reset();
  }
  // Take the exception out of the job, so that the caller holds the only reference and a
  // helper dropping the job later never destroys an exception the caller is reading.
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(job->mutex);
    error = std::move(job->error);
  }
  if (error) std::rethrow_exception(error);
}

void ThreadPool::Loop() {
  uint64_t seen_generation = 0;
  while (true) {
    std::shared_ptr<Job> job;
    {
      // A step's kernels follow each other within microseconds: look for the next job before
      // sleeping, as DeviceWorker does for its next task.
      SpinWait([&] { return published_.load(std::memory_order_acquire) != seen_generation; },
               kHandOffSpin);
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || generation_ != seen_generation; });
      if (stopping_) return;
      seen_generation = generation_;
      job = job_;
    }
    if (job != nullptr) job->Work();
  }
}

// ---- CPU pools and ParallelFor ---------------------------------------------------------

namespace {

std::shared_ptr<ThreadPool> AcquireCpuThreadPool(int cpu_index) {
  TANDEM_CHECK(cpu_index >= 0, "CpuThreadPool expects a CPU device index >= 0 but got ", cpu_index);
  Registry& registry = GetRegistry();
  if (cpu_index < kFastSlots) {
    std::shared_ptr<ThreadPool> pool = std::atomic_load(&registry.fast_pools[cpu_index]);
    if (pool != nullptr) return pool;
  }
  EnsureShutDownRegistered();
  std::lock_guard<std::mutex> lock(registry.mutex);
  TANDEM_CHECK(!registry.shut_down, "the thread pool of cpu:", cpu_index,
               " was asked for while the process is exiting; run CPU work before main returns");
  if (registry.threads_per_device == 0) registry.threads_per_device = CpuThreadsPerDevice();
  const int threads = registry.threads_per_device;
  std::shared_ptr<ThreadPool>& pool = registry.cpu_pools[cpu_index];
  if (pool == nullptr) pool = std::make_shared<ThreadPool>(threads);
  if (cpu_index < kFastSlots) std::atomic_store(&registry.fast_pools[cpu_index], pool);
  return pool;
}

}  // namespace

ThreadPool& CpuThreadPool(int cpu_index) { return *AcquireCpuThreadPool(cpu_index); }

void ResetCpuThreadPools() {
  std::map<int, std::shared_ptr<ThreadPool>> pools;
  {
    Registry& registry = GetRegistry();
    std::lock_guard<std::mutex> lock(registry.mutex);
    pools.swap(registry.cpu_pools);
    for (auto& pool : registry.fast_pools) std::atomic_store(&pool, std::shared_ptr<ThreadPool>());
    registry.threads_per_device = 0;  // the share may have changed
  }
  // Joins the helpers of each pool that no ParallelFor is using; a pool still in use goes
  // when its last Run returns.
  pools.clear();
}

void ParallelFor(Device device, int64_t n, int64_t grain,
                 const std::function<void(int64_t, int64_t)>& fn) {
  TANDEM_CHECK(device.is_cpu(),
               "ParallelFor splits work over the threads of a CPU device, but "
               "was given ",
               device, "; launch device kernels through that device's backend");
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  if (n < 2 * grain || t_in_parallel_region) {
    fn(0, n);
    return;
  }
  const std::shared_ptr<ThreadPool> pool = AcquireCpuThreadPool(device.index());
  pool->Run(n, grain, fn);
}

}  // namespace tandem
