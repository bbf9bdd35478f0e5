#include "tensor/runtime/run_across_devices.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>

#include "tensor/runtime/profiler.h"
#include "tensor/runtime/threads.h"

namespace tandem {
namespace {

struct Job {
  explicit Job(int pieces, std::function<void(int)> fn) : pieces(pieces), fn(std::move(fn)) {}
  const int pieces;
  const std::function<void(int)> fn;  // a copy: a late worker may run after the caller left
  std::atomic<int> next{0};
  std::mutex mutex;
  std::condition_variable done;
  std::atomic<int> finished{0};  // written under mutex (for `done`), read without it too
  std::exception_ptr error;

  void Work() {
    while (true) {
      const int i = next.fetch_add(1);
      if (i >= pieces) return;
      std::exception_ptr failure;
      try {
        TANDEM_PROFILE_SCOPE("split", "RunAcrossDevices piece " + std::to_string(i));
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
  int helpers = 0;
  bool caller_stands_in = false;  // the caller works for one device: no post to its worker
  for (Device device : devices) {
    if (helpers + 1 >= pieces) break;
    if (!caller_stands_in && RunsInline(device)) {
      caller_stands_in = true;
      continue;
    }
    DeviceWorker::For(device).Post([job] { job->Work(); });
    ++helpers;
  }
  job->Work();
  // The helpers' pieces are as long as the caller's: look for their end before sleeping.
  SpinWait([&] { return job->finished.load(std::memory_order_acquire) == job->pieces; },
           kHandOffSpin);
  std::unique_lock<std::mutex> lock(job->mutex);
  job->done.wait(lock, [&] { return job->finished == job->pieces; });
  if (job->error) std::rethrow_exception(job->error);
}

}  // namespace tandem
