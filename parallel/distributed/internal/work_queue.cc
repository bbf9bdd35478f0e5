#include "parallel/distributed/internal/work_queue.h"

#include <sys/prctl.h>

#include <algorithm>

#include "tensor/runtime/profiler.h"

namespace tandem::parallel::distributed::internal {
namespace {

using Clock = std::chrono::steady_clock;

// True on a queue's own thread (see MaySpin).
thread_local bool t_on_queue_thread = false;

// See Loop().
constexpr std::chrono::microseconds kDeferredStart{500};
constexpr std::chrono::milliseconds kIdleBeforeSleep{100};

}  // namespace

void QueuedWork::RunIfNotStarted() { queue_->RunOnCaller(this); }

WorkQueue::WorkQueue(std::string thread_name, std::string prefix, std::chrono::milliseconds timeout)
    : thread_name_(std::move(thread_name)), prefix_(std::move(prefix)), timeout_(timeout) {
  thread_ = std::thread([this] { Loop(); });
}

void WorkQueue::Stop() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

bool WorkQueue::MaySpin() const {
  return !t_on_queue_thread || caller_waits_.load(std::memory_order_relaxed);
}

std::string WorkQueue::failure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_;
}

void WorkQueue::Push(const std::shared_ptr<QueuedWork>& work) {
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TANDEM_CHECK(failure_.empty(), prefix_, "cannot run ", work->description(),
                 ": the group failed earlier: ", failure_);
    queue_.push_back(Op{work, ++issued_count_});
    wake = !callers_run_their_collectives_;
  }
  if (wake) cv_.notify_one();
}

// Runs one collective that this thread has taken off the queue (with `earlier_failure`, the
// queue's failure when it did).
void WorkQueue::Execute(QueuedWork& work, const std::string& earlier_failure) {
  ++started_count_;
  if (!earlier_failure.empty()) {
    work.Release();
    work.Finish(std::make_exception_ptr(
        Error(prefix_ + work.description() +
              " was not run: the group failed earlier: " + earlier_failure)));
    return;
  }
  try {
    TANDEM_PROFILE_SCOPE("distributed", work.description());
    work.Run(work.Start() + timeout_);
    work.Release();
    work.Finish();
  } catch (const std::exception& e) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (failure_.empty()) failure_ = e.what();
    }
    work.Release();
    work.Finish(std::current_exception());
  }
}

// The queue's thread: runs the collectives in issue order whenever no waiting caller runs them
// itself.
//
// Waking it costs more than a small all-reduce: a futex call, and on a machine whose cores all
// run ranks, two context switches on a core that a rank (this one or a peer) needs (3-4 us
// against 1-5 us for 4 KB on 2 ranks). So while the issuing threads run their collectives
// themselves (the last one was run by its waiter), Enqueue does not wake it; instead it looks
// every kDeferredStart and starts a collective that nobody has started kDeferredStart after it
// first saw it, so that every collective still starts without a wait (DDP's first buckets start
// 0.5-1 ms late at most). Enqueue reads no clock for this: at 4 KB one reading is 1% of the
// all-reduce. Starting one itself ends that mode; after kIdleBeforeSleep without collectives
// it sleeps until woken. (Waking for collectives of 1 MiB and more at once was measured too: it
// cost the all-reduce up to half its bandwidth there, the thread racing the waiting caller.)
void WorkQueue::Loop() {
  t_on_queue_thread = true;
  // Its collectives' polls sleep 50 us; Linux's default timer slack (50 us) would double that.
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  profiler::SetThreadName(thread_name_);
  uint64_t front_sequence = 0;   // the first queued collective when this thread first saw it,
  Clock::time_point front_seen;  // and when
  uint64_t idle_count = 0;       // issued_count_ since
  Clock::time_point idle_since;
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    if (running_ || queue_.empty()) {
      if (stop_ && !running_ && queue_.empty()) return;
      if (callers_run_their_collectives_) {
        cv_.wait_for(lock, kDeferredStart);
        const Clock::time_point now = Clock::now();
        if (issued_count_ != idle_count) {
          idle_count = issued_count_;
          idle_since = now;
        } else if (queue_.empty() && now - idle_since > kIdleBeforeSleep) {
          callers_run_their_collectives_ = false;
        }
      } else {
        cv_.wait(lock);
      }
      continue;
    }
    if (callers_run_their_collectives_ && !stop_) {
      const Clock::time_point now = Clock::now();
      if (queue_.front().sequence != front_sequence) {
        front_sequence = queue_.front().sequence;
        front_seen = now;
      }
      if (now < front_seen + kDeferredStart) {
        cv_.wait_until(lock, front_seen + kDeferredStart);
        continue;
      }
    }
    callers_run_their_collectives_ = false;  // its issuer has not come for it
    RunFront(lock);
    caller_waits_.store(false, std::memory_order_relaxed);
  }
}

// Takes the first queued collective and runs it on this thread, unlocking `lock` meanwhile.
void WorkQueue::RunFront(std::unique_lock<std::mutex>& lock) {
  std::shared_ptr<QueuedWork> work = std::move(queue_.front().work);
  queue_.pop_front();
  running_ = true;
  const std::string earlier_failure = failure_;
  lock.unlock();
  Execute(*work, earlier_failure);
  work.reset();
  lock.lock();
  running_ = false;
}

// Called by wait() on `target`: when no collective is running, runs the queued ones up to and
// including `target` on the calling thread, in issue order. For the usual issue-then-wait this
// saves waking the queue's thread and being woken by it; the result is the same, since one
// collective at a time runs either way, in the same order.
void WorkQueue::RunOnCaller(const Work* target) {
  std::unique_lock<std::mutex> lock(mutex_);
  // Another thread runs a collective (ours or one before it): if the queue's, it may spin.
  if (running_) caller_waits_.store(true, std::memory_order_relaxed);
  while (!running_ && std::any_of(queue_.begin(), queue_.end(),
                                  [target](const Op& op) { return op.work.get() == target; })) {
    if (!callers_run_their_collectives_) {
      callers_run_their_collectives_ = true;
      cv_.notify_one();  // from an untimed sleep to looking every kDeferredStart
    }
    RunFront(lock);
  }
  // The queue's thread waits while a collective runs: let it take the later ones.
  if (!queue_.empty()) cv_.notify_one();
}

}  // namespace tandem::parallel::distributed::internal
