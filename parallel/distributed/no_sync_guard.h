// NoSyncGuard: what DistributedDataParallel::no_sync() and FullyShardedDataParallel::no_sync()
// return. While it lives the wrapper's backward passes keep their gradients on this rank
// (summed) instead of reducing them, and the first backward after it reduces the sum: gradient
// accumulation over micro-batches with one reduction per optimizer step.
//
//   { auto guard = ddp.no_sync(); loss1.backward(); }   // local only
//   loss2.backward();                                    // reduces the accumulated sum
#ifndef TANDEM_PARALLEL_DISTRIBUTED_NO_SYNC_GUARD_H_
#define TANDEM_PARALLEL_DISTRIBUTED_NO_SYNC_GUARD_H_

#include <utility>

namespace tandem::parallel::distributed {

class NoSyncGuard {
 public:
  // Clears the wrapper's flag "backward reduces"; the destructor puts back what it was.
  explicit NoSyncGuard(bool* require_sync) : flag_(require_sync), previous_(*require_sync) {
    *flag_ = false;
  }
  ~NoSyncGuard() {
    if (flag_ != nullptr) *flag_ = previous_;
  }
  NoSyncGuard(NoSyncGuard&& other) noexcept
      : flag_(std::exchange(other.flag_, nullptr)), previous_(other.previous_) {}
  NoSyncGuard(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(NoSyncGuard&&) = delete;

 private:
  bool* flag_;
  bool previous_;
};

}  // namespace tandem::parallel::distributed

#endif  // TANDEM_PARALLEL_DISTRIBUTED_NO_SYNC_GUARD_H_
