#include "parallel/distributed/process_group.h"

#include <chrono>
#include <utility>

#include "tensor/runtime/threads.h"

namespace tandem::parallel::distributed {

const char* ReduceOpName(ReduceOp op) { return op == ReduceOp::kSum ? "sum" : "average"; }

Work::Work(std::string description) : description_(std::move(description)) {}

Work::Work(std::function<std::string()> describe) : describe_(std::move(describe)) {}

const std::string& Work::description() const {
  std::call_once(describe_once_, [this] {
    if (describe_) description_ = describe_();
  });
  return description_;
}

bool Work::is_completed() const { return done_.load(std::memory_order_acquire); }

void Work::wait() {
  if (!done_.load(std::memory_order_acquire)) RunIfNotStarted();
  if (!done_.load(std::memory_order_acquire)) {
    // Short collectives finish within microseconds: look for the end for a moment before
    // sleeping on the condition variable, whose wake-up costs more than that.
    SpinWait([this] { return done_.load(std::memory_order_acquire); },
             std::chrono::microseconds(50));
    // Counting in before reading done_ (both sequentially consistent, as Finish's store of
    // done_ and its read of sleepers_) means Finish sees this sleeper or this thread sees done_.
    sleepers_.fetch_add(1);
    {
      std::unique_lock<std::mutex> lock(mutex_);
      done_cv_.wait(lock, [this] { return done_.load(); });
    }
    sleepers_.fetch_sub(1);
  }
  // error_ was set before done_ (which the loads above acquire) and is not written again.
  if (error_) std::rethrow_exception(error_);
}

std::chrono::steady_clock::duration Work::run_time() const {
  if (!done_.load(std::memory_order_acquire) ||
      started_ == std::chrono::steady_clock::time_point()) {
    return std::chrono::steady_clock::duration::zero();
  }
  return finished_ - started_;
}

std::chrono::steady_clock::time_point Work::Start() {
  started_ = std::chrono::steady_clock::now();
  return started_;
}

void Work::Finish(std::exception_ptr error) {
  finished_ = std::chrono::steady_clock::now();
  error_ = std::move(error);
  done_.store(true);
  if (sleepers_.load() > 0) {
    // A sleeper between its check of done_ and its wait holds the lock: taking it first
    // means the notification cannot fall between the two.
    std::lock_guard<std::mutex> lock(mutex_);
    done_cv_.notify_all();
  }
}

}  // namespace tandem::parallel::distributed
