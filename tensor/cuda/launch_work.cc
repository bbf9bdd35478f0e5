#include "tensor/cuda/launch_work.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>

namespace tandem {
namespace cuda {
namespace {

struct Recording {
  std::atomic<bool> on{false};
  std::mutex mutex;
  std::map<std::string, LaunchWork> by_kernel;
};

Recording& Get() {
  static Recording* recording = new Recording;  // never destroyed: launches may run at exit
  return *recording;
}

}  // namespace

void StartRecordingLaunchWork() {
  Recording& r = Get();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.by_kernel.clear();
  r.on.store(true, std::memory_order_relaxed);
}

std::vector<LaunchWork> StopRecordingLaunchWork() {
  Recording& r = Get();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.on.store(false, std::memory_order_relaxed);
  std::vector<LaunchWork> out;
  for (const auto& [name, work] : r.by_kernel) out.push_back(work);
  r.by_kernel.clear();
  return out;
}

namespace internal {

void RecordLaunchWork(const char* kernel, long long blocks, long long elements) {
  Recording& r = Get();
  if (!r.on.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(r.mutex);
  LaunchWork& w = r.by_kernel[kernel];
  w.kernel = kernel;
  ++w.launches;
  w.max_elements = std::max(w.max_elements, elements);
  if (elements > kLargeLaunchElements) {
    w.min_blocks_when_large =
        w.large_launches == 0 ? blocks : std::min(w.min_blocks_when_large, blocks);
    ++w.large_launches;
  }
}

}  // namespace internal
}  // namespace cuda
}  // namespace tandem
