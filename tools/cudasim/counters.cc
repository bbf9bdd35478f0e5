#include "tools/cudasim/counters.h"

#include <algorithm>
#include <map>
#include <mutex>

namespace cudasim {
namespace {

struct State {
  std::mutex mutex;
  Counters totals;  // `kernels` unused: see `by_name`
  std::map<std::string, KernelCount> by_name;
};

State& Get() {
  static State* state = new State;  // never destroyed: stream threads may count at exit
  return *state;
}

// The kernel this host thread launched last and has not declared the work of ("": none).
thread_local std::string undeclared_launch;

void AddWork(State& s, const std::string& name, double flops, double bytes, const char* math) {
  KernelCount& k = s.by_name[name];
  k.flops += flops;
  k.bytes += bytes;
  if (!k.work_counted) {
    k.math = math;
  } else if (k.math != math) {
    k.math = "mixed";
  }
  k.work_counted = true;
}

}  // namespace

void ResetCounters() {
  State& s = Get();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.totals = Counters();
  s.by_name.clear();
}

Counters SnapshotCounters() {
  State& s = Get();
  std::lock_guard<std::mutex> lock(s.mutex);
  Counters c = s.totals;
  for (const auto& [name, count] : s.by_name) c.kernels.push_back(count);
  std::stable_sort(
      c.kernels.begin(), c.kernels.end(),
      [](const KernelCount& a, const KernelCount& b) { return a.launches > b.launches; });
  return c;
}

void DeclareLaunchWork(double flops, double bytes, const char* math) {
  if (undeclared_launch.empty()) return;
  State& s = Get();
  std::lock_guard<std::mutex> lock(s.mutex);
  // A reset between the launch and its declaration leaves nothing to attribute it to.
  if (s.by_name.count(undeclared_launch) != 0) {
    AddWork(s, undeclared_launch, flops, bytes, math);
  }
  undeclared_launch.clear();
}

namespace internal {

void CountLaunch(const std::string& name, long long blocks, long long threads_per_block) {
  State& s = Get();
  std::lock_guard<std::mutex> lock(s.mutex);
  ++s.totals.launches;
  KernelCount& k = s.by_name[name];
  if (k.launches == 0) {
    k.name = name;
    k.min_blocks = blocks;
  }
  ++k.launches;
  undeclared_launch = name;
  k.min_blocks = std::min(k.min_blocks, blocks);
  if (blocks >= k.max_blocks) {
    k.max_blocks = blocks;
    k.threads_per_block = threads_per_block;
  }
}

void CountWork(const std::string& name, double flops, double bytes, const char* math) {
  State& s = Get();
  std::lock_guard<std::mutex> lock(s.mutex);
  AddWork(s, name, flops, bytes, math);
  undeclared_launch.clear();
}

void CountGraphLaunch(long long kernels) {
  State& s = Get();
  std::lock_guard<std::mutex> lock(s.mutex);
  ++s.totals.graph_launches;
  s.totals.graph_kernels += kernels;
}

void CountHostSync() {
  State& s = Get();
  std::lock_guard<std::mutex> lock(s.mutex);
  ++s.totals.host_syncs;
}

void CountCopy(long long bytes, bool host_to_device) {
  State& s = Get();
  std::lock_guard<std::mutex> lock(s.mutex);
  (host_to_device ? s.totals.bytes_host_to_device : s.totals.bytes_device_to_host) += bytes;
}

}  // namespace internal
}  // namespace cudasim
