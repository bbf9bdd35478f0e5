// WorkQueue: runs a process group's collectives one at a time, in the order they were issued
// (the order every rank runs them in), each with a deadline of `timeout` from its start: on the
// queue's own thread, or on the thread that waits for one that has not started yet when nothing
// else runs (the usual issue-then-wait then costs no thread hand-off). After a collective
// fails the queue is failed: later collectives fail at once, naming the first error.
// Internal: the engine under ProcessGroupMpi, whose transport polls inside the body; a group
// whose collectives are only enqueued on a device (ProcessGroupNccl) needs a watchdog instead.
//
//   internal::WorkQueue queue("ProcessGroupMpi rank 0 thread", "ProcessGroupMpi rank 0 of 2: ",
//                             std::chrono::seconds(60));
//   std::shared_ptr<Work> work = queue.Enqueue(
//       [] { return std::string("barrier"); },
//       [](const Work& work, std::chrono::steady_clock::time_point deadline) { ... });
//   work->wait();  // runs it here unless the queue's thread has started it
#ifndef TANDEM_PARALLEL_DISTRIBUTED_INTERNAL_WORK_QUEUE_H_
#define TANDEM_PARALLEL_DISTRIBUTED_INTERNAL_WORK_QUEUE_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "parallel/distributed/process_group.h"
#include "tensor/base/error.h"

namespace tandem::parallel::distributed::internal {

class WorkQueue;

// A Work that carries its collective, and whose wait() runs it on the waiting thread when it
// can (WorkQueue::RunOnCaller).
class QueuedWork : public Work {
 public:
  QueuedWork(WorkQueue* queue, std::function<std::string()> describe)
      : Work(std::move(describe)), queue_(queue) {}
  // Runs the collective; called once, by the thread that took it off the queue.
  virtual void Run(std::chrono::steady_clock::time_point deadline) = 0;
  // Lets go of the collective's tensors, before Finish: when wait() returns, the caller's
  // tensors are its own again (AccumulateGrad, for one, steals a gradient only then).
  virtual void Release() = 0;

 private:
  void RunIfNotStarted() override;
  WorkQueue* const queue_;  // the queue waits for its collectives before it goes
};

class WorkQueue {
 public:
  // Starts the queue's thread, named `thread_name`; `prefix` starts its errors.
  WorkQueue(std::string thread_name, std::string prefix, std::chrono::milliseconds timeout);
  // Stops the thread after the collectives already issued (at once after a failure); the
  // destructor does too. Issue nothing afterwards.
  void Stop();
  ~WorkQueue() { Stop(); }
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  // Queues a collective: `body(work, deadline)` runs it, throwing on failure. Throws at once
  // if an earlier collective failed.
  template <typename Body>
  std::shared_ptr<Work> Enqueue(std::function<std::string()> describe, Body body);

  // For the running collective's polling: whether it may spin rather than sleep between polls.
  // A caller's thread may (its core is free while it waits); the queue's own thread shares a
  // core with compute threads, and spins only while a caller waits for its collective.
  bool MaySpin() const;
  // The number of collectives started, the running one included (the diagnosis's numbering).
  int64_t started_count() const { return started_count_; }
  // The first error, empty while healthy.
  std::string failure() const;

 private:
  friend class QueuedWork;

  // The collective lives in the Work itself (one allocation per collective, no std::function
  // holding the tensors): a small all-reduce costs a few microseconds, and allocations,
  // locks and clock readings each cost a noticeable share of that.
  template <typename Body>
  class QueuedWorkWith final : public QueuedWork {
   public:
    QueuedWorkWith(WorkQueue* queue, std::function<std::string()> describe, Body body)
        : QueuedWork(queue, std::move(describe)), body_(std::move(body)) {}
    void Run(std::chrono::steady_clock::time_point deadline) override { (*body_)(*this, deadline); }
    void Release() override { body_.reset(); }

   private:
    std::optional<Body> body_;
  };

  struct Op {
    std::shared_ptr<QueuedWork> work;
    uint64_t sequence = 0;  // issued_count_ when it was issued
  };

  void Push(const std::shared_ptr<QueuedWork>& work);
  void Loop();
  void RunFront(std::unique_lock<std::mutex>& lock);
  void RunOnCaller(const Work* target);
  void Execute(QueuedWork& work, const std::string& earlier_failure);

  const std::string thread_name_;
  const std::string prefix_;
  const std::chrono::milliseconds timeout_;

  mutable std::mutex mutex_;  // guards what follows, to thread_
  std::condition_variable cv_;
  std::deque<Op> queue_;  // issued, not started
  // A collective is running, on the queue's thread or on a waiting caller's: the next one
  // starts after it (issue order is the order every rank runs them in).
  bool running_ = false;
  bool stop_ = false;
  // The last collective was run by the thread that waited for it: see Loop().
  bool callers_run_their_collectives_ = false;
  uint64_t issued_count_ = 0;  // collectives issued so far
  std::string failure_;        // the first error; the queue is unusable once set
  std::thread thread_;
  // A caller is blocked in wait() on the collective that the queue's thread runs now.
  std::atomic<bool> caller_waits_{false};
  int64_t started_count_ = 0;  // written by the running collective's thread only
};

template <typename Body>
std::shared_ptr<Work> WorkQueue::Enqueue(std::function<std::string()> describe, Body body) {
  std::shared_ptr<QueuedWork> work =
      std::make_shared<QueuedWorkWith<Body>>(this, std::move(describe), std::move(body));
  Push(work);
  return work;
}

}  // namespace tandem::parallel::distributed::internal

#endif  // TANDEM_PARALLEL_DISTRIBUTED_INTERNAL_WORK_QUEUE_H_
