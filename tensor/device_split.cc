#include "tensor/internal/device_split.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>

#include "tensor/worker.h"

namespace tandem::internal {
namespace {

struct Job {
  explicit Job(int pieces, std::function<void(int)> fn) : pieces(pieces), fn(std::move(fn)) {}
  const int pieces;
  const std::function<void(int)> fn;  // a copy: a late worker may run after the caller left
  std::atomic<int> next{0};
  std::mutex mutex;
  std::condition_variable done;
  int finished = 0;  // guarded by mutex
  std::exception_ptr error;

  void Work() {
    while (true) {
      const int i = next.fetch_add(1);
      if (i >= pieces) return;
      std::exception_ptr failure;
      try {
        fn(i);
      } catch (...) {
        failure = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(mutex);
      if (failure && !error) error = failure;
      if (++finished == pieces) done.notify_all();
    }
  }
};

}  // namespace

void RunAcrossDevices(const std::vector<Device>& devices, int pieces,
                      const std::function<void(int)>& piece) {
  if (pieces <= 0) return;
  if (pieces == 1) {
    piece(0);
    return;
  }
  auto job = std::make_shared<Job>(pieces, piece);
  DeviceWorker* self = DeviceWorker::Current();
  int helpers = 0;
  for (size_t d = 0; d < devices.size(); ++d) {
    if (helpers + 1 >= pieces) break;
    DeviceWorker& worker = DeviceWorker::For(devices[d]);
    if (&worker == self) continue;
    // A caller that is no worker stands in for the first CPU device (as parallel_apply's
    // caller runs the first CPU replica), so that each device's cores get one thread.
    if (self == nullptr && d == 0 && devices[d].is_cpu()) continue;
    worker.Post([job] { job->Work(); });
    ++helpers;
  }
  job->Work();
  // The helpers' pieces are as long as the caller's: look for their end before sleeping.
  SpinWait(
      [&] {
        std::lock_guard<std::mutex> lock(job->mutex);
        return job->finished == job->pieces;
      },
      kHandOffSpin);
  std::unique_lock<std::mutex> lock(job->mutex);
  job->done.wait(lock, [&] { return job->finished == job->pieces; });
  if (job->error) std::rethrow_exception(job->error);
}

}  // namespace tandem::internal
