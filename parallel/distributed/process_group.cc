#include "parallel/distributed/process_group.h"

#include <utility>

namespace tandem::distributed {

const char* ReduceOpName(ReduceOp op) { return op == ReduceOp::kSum ? "sum" : "average"; }

Work::Work(std::string description) : description_(std::move(description)) {}

bool Work::is_completed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_;
}

void Work::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  done_cv_.wait(lock, [this] { return done_; });
  if (error_) std::rethrow_exception(error_);
}

void Work::Finish(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
    error_ = std::move(error);
  }
  done_cv_.notify_all();
}

}  // namespace tandem::distributed
