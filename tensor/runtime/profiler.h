// Profiler: a timeline of what each thread ran (autograd nodes, DataParallel's scatter,
// replicas and gather, split work, optimizer steps, collectives), written as a Chrome trace
// that chrome://tracing or https://ui.perfetto.dev opens, as torch.profiler's
// export_chrome_trace does. Use it to see where a step's time goes and which thread waits
// for which: a DataParallel step shows one row per device's thread.
//
//   tandem::profiler::Start();
//   for (int i = 0; i < 20; ++i) TrainStep();
//   tandem::profiler::WriteChromeTrace(tandem::profiler::Stop(), "/tmp/steps.json");
//
//   // Your own regions (the name is only built while the profiler runs):
//   TANDEM_PROFILE_SCOPE("data", "load batch " + std::to_string(i));
//
// Off by default; while off a scope costs one relaxed atomic load. While on, each thread
// records into its own buffer (under that buffer's lock, which only Stop also takes), up to
// kMaxEvents in all; later events are counted as dropped. Threads are named in the trace: device
// workers by their device
// ("cpu:1 worker"), the thread that called Start "main", others by SetThreadName.
#ifndef TANDEM_TENSOR_RUNTIME_PROFILER_H_
#define TANDEM_TENSOR_RUNTIME_PROFILER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace tandem::profiler {

// One timed region: `name` in `category`, on thread `thread` (a small number, see
// Trace::thread_names), from `start_us` (microseconds since Start) for `duration_us`.
struct Event {
  std::string category;
  std::string name;
  int thread = 0;
  double start_us = 0;
  double duration_us = 0;
};

struct Trace {
  std::vector<Event> events;              // sorted by start
  std::vector<std::string> thread_names;  // thread_names[event.thread]
  int64_t dropped = 0;                    // events past kMaxEvents, not recorded
};

inline constexpr int64_t kMaxEvents = int64_t{1} << 20;

// Starts recording (clearing what an earlier session left). Throws if one is running.
void Start();
// Stops recording and returns the events of every thread. Regions still open are not in it.
// Throws if the profiler is not running.
Trace Stop();
// Whether the profiler is recording.
bool IsEnabled();

// Writes `trace` as Chrome trace JSON (complete events plus thread names) to `path`,
// replacing it atomically (tensor/base/atomic_file.h); throws tandem::Error naming the path and
// the system's reason if it cannot be written, leaving the previous file as it was.
void WriteChromeTrace(const Trace& trace, const std::string& path);
// The same JSON as a string.
std::string ChromeTraceJson(const Trace& trace);

// Names the calling thread in traces (recorded from the next Start on, and in the running
// session at once).
void SetThreadName(std::string name);

namespace internal {
extern std::atomic<bool> g_enabled;
void Record(const char* category, std::string name, std::chrono::steady_clock::time_point start,
            std::chrono::steady_clock::time_point end);
}  // namespace internal

// Times the region from its construction to its destruction, if the profiler was running
// when it began.
class Scope {
 public:
  Scope(const char* category, std::string name) {
    if (internal::g_enabled.load(std::memory_order_relaxed)) Begin(category, std::move(name));
  }
  ~Scope() {
    if (category_ != nullptr) End();
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  void Begin(const char* category, std::string name);
  void End();

  const char* category_ = nullptr;
  std::string name_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace tandem::profiler

#define TANDEM_PROFILE_CONCAT_INNER(a, b) a##b
#define TANDEM_PROFILE_CONCAT(a, b) TANDEM_PROFILE_CONCAT_INNER(a, b)
// A profiler::Scope for the rest of the enclosing block whose name expression is evaluated
// only while the profiler runs.
#define TANDEM_PROFILE_SCOPE(category, name_expression)                             \
  ::tandem::profiler::Scope TANDEM_PROFILE_CONCAT(tandem_profile_scope_, __LINE__)( \
      (category), ::tandem::profiler::IsEnabled() ? std::string(name_expression) : std::string())

#endif  // TANDEM_TENSOR_RUNTIME_PROFILER_H_
