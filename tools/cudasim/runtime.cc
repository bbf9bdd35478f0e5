// cudasim's CUDA runtime: devices, memory, streams (a worker thread each), events and kernel
// launches, on the host. See README.md for what it checks and what it cannot.
#include <cuda_runtime.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tools/cudasim/counters.h"
#include "tools/cudasim/executor.h"
#include "tools/cudasim/runtime_internal.h"

namespace cudasim {
namespace internal {
namespace {

constexpr int kMaxDevices = 16;
constexpr size_t kSharedMemoryPerBlock = 48 << 10;
// An H100's (sm_90) cudaDevAttrMaxSharedMemoryPerBlockOptin: 227 KiB of the SM's 228.
constexpr size_t kSharedMemoryPerBlockOptin = 232448;
constexpr int kMaxThreadsPerBlock = 1024;
constexpr size_t kDeviceAlignment = 256;
constexpr size_t kHugePage = size_t{2} << 20;
// Freed device memory stays mapped without access (so a late use faults) up to this much
// address space, oldest released first.
constexpr size_t kQuarantineBytes = size_t{64} << 30;

int EnvInt(const char* name, int fallback, int low, int high) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (*end != '\0' || value < low || value > high) {
    std::fprintf(stderr, "cudasim: %s='%s' is not valid: expected an integer in [%d, %d]\n", name,
                 text, low, high);
    std::exit(2);
  }
  return static_cast<int>(value);
}

size_t PageSize() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

// TANDEM_CUDASIM_SHARED_OPTIN_BYTES: each device's opt-in shared memory limit, one value for
// every device or a comma-separated list (the last value repeats for the devices after it), so
// that a test can model a smaller GPU, e.g. "232448,101376" makes cuda:1 an sm_86's.
std::vector<size_t> SharedOptinBytes(int devices) {
  const char* name = "TANDEM_CUDASIM_SHARED_OPTIN_BYTES";
  const char* text = std::getenv(name);
  std::vector<size_t> values;
  if (text != nullptr && *text != '\0') {
    for (const char* p = text;;) {
      char* end = nullptr;
      const long long value = std::strtoll(p, &end, 10);
      if (end == p || (*end != ',' && *end != '\0') ||
          value < static_cast<long long>(kSharedMemoryPerBlock) || value > (1 << 30)) {
        std::fprintf(stderr,
                     "cudasim: %s='%s' is not valid: expected integers from %zu (no opt-in beyond "
                     "the default) to 1073741824, separated by commas\n",
                     name, text, kSharedMemoryPerBlock);
        std::exit(2);
      }
      values.push_back(static_cast<size_t>(value));
      if (*end == '\0') break;
      p = end + 1;
    }
  }
  if (values.empty()) values.push_back(kSharedMemoryPerBlockOptin);
  values.resize(std::max<size_t>(devices, values.size()), values.back());
  return values;
}

struct Settings {
  int devices = EnvInt("TANDEM_CUDASIM_DEVICES", 2, 0, kMaxDevices);
  int sms = EnvInt("TANDEM_CUDASIM_SMS", 4, 1, 1024);
  size_t memory =
      size_t{static_cast<unsigned>(EnvInt("TANDEM_CUDASIM_MEMORY_MIB", 4096, 1, 1 << 20))} << 20;
  std::vector<size_t> shared_optin = SharedOptinBytes(devices);
};

const Settings& GetSettings() {
  static const Settings* settings = new Settings;
  return *settings;
}

// Note [cudasim model-only mode]: TANDEM_CUDASIM_MODEL_ONLY=1 (or SetModelOnly) skips the bodies
// of kernels and cuBLAS/cuBLASLt GEMMs, so that a step at a GPU's shapes (GPT-2 124M, batch 8 x
// 1024) can be counted and modelled in seconds instead of hours of fibers. Everything the
// counters see is decided on the host before a body would run (the launch's checks, its grid,
// its declared or computed work, a capture's nodes), so the counts are those of a full run.
// Whether a launch runs is decided when the host launches it (a graph replay: when the host
// launches the graph), not when its stream gets to it, so that toggling the mode between two
// launches acts on the launches, whatever the stream is still doing. NCCL collectives still
// run: they cost copies, not FLOPs, and their cross-rank checks meet in their rendezvous, which
// every rank must reach.
std::atomic<bool>& ModelOnlyFlag() {
  static std::atomic<bool>* flag =
      new std::atomic<bool>(EnvInt("TANDEM_CUDASIM_MODEL_ONLY", 0, 0, 1) != 0);
  return *flag;
}

void AnnounceModelOnly() {
  static std::once_flag once;
  std::call_once(once, [] {
    std::fprintf(stderr,
                 "cudasim: TANDEM_CUDASIM_MODEL_ONLY=1: kernels and GEMMs are counted, not run; "
                 "device results are meaningless\n");
  });
}

struct Allocation {
  uintptr_t begin;
  size_t size;
  int device;
  char* mapping;
  size_t mapping_bytes;
};

struct EventRecord {
  bool done = false;
  std::chrono::steady_clock::time_point time;
};

// Every event record's completion is signalled here (host waits and stream waits alike).
std::mutex& EventMutex() {
  static std::mutex* mutex = new std::mutex;
  return *mutex;
}
std::condition_variable& EventSignal() {
  static std::condition_variable* signal = new std::condition_variable;
  return *signal;
}

struct DeviceState {
  std::mutex mutex;
  std::unique_ptr<Stream> default_stream;
  std::vector<Stream*> streams;  // all live streams of the device, the default one included
  size_t allocated = 0;
  std::set<int> peers;
  std::atomic<int> sticky{cudaSuccess};
  std::string sticky_message;
};

// Leaked on purpose: streams' worker threads may still run while static objects are destroyed
// at exit.
class Runtime {
 public:
  static Runtime& Get() {
    static Runtime* runtime = new Runtime;
    return *runtime;
  }

  int count() const { return GetSettings().devices; }
  DeviceState& device(int index) { return *devices_[index]; }

  Stream* DefaultStream(int index) {
    DeviceState& d = device(index);
    std::lock_guard<std::mutex> lock(d.mutex);
    if (!d.default_stream) {
      d.default_stream = std::make_unique<Stream>(index, true);
      d.streams.push_back(d.default_stream.get());
    }
    return d.default_stream.get();
  }

  Stream* CreateStream(int index) {
    Stream* stream = new Stream(index, false);
    DeviceState& d = device(index);
    {
      std::lock_guard<std::mutex> lock(d.mutex);
      d.streams.push_back(stream);
    }
    std::lock_guard<std::mutex> lock(handles_mutex_);
    streams_.insert(stream);
    return stream;
  }

  bool DestroyStream(Stream* stream) {
    {
      std::lock_guard<std::mutex> lock(handles_mutex_);
      if (streams_.erase(stream) == 0) return false;
    }
    DeviceState& d = device(stream->device());
    {
      std::lock_guard<std::mutex> lock(d.mutex);
      d.streams.erase(std::find(d.streams.begin(), d.streams.end(), stream));
    }
    delete stream;  // drains and joins
    return true;
  }

  bool IsStream(Stream* stream) {
    std::lock_guard<std::mutex> lock(handles_mutex_);
    return streams_.count(stream) != 0;
  }

  std::vector<Stream*> Streams(int index) {
    DeviceState& d = device(index);
    std::lock_guard<std::mutex> lock(d.mutex);
    return d.streams;
  }

  // ---- Device memory ----

  cudaError_t Malloc(void** ptr, size_t size, int index) {
    DeviceState& d = device(index);
    if (size == 0) {
      *ptr = nullptr;
      return cudaSuccess;
    }
    const size_t page = PageSize();
    const size_t rounded = (size + kDeviceAlignment - 1) / kDeviceAlignment * kDeviceAlignment;
    const size_t pages = (rounded + page - 1) / page;
    {
      std::lock_guard<std::mutex> lock(d.mutex);
      if (rounded > GetSettings().memory || d.allocated > GetSettings().memory - rounded) {
        return cudaErrorMemoryAllocation;
      }
      d.allocated += rounded;
    }
    // A guard page on either side; the block ends where the guard after it starts, so an
    // access past the rounded size faults. Blocks of 2 MiB and more (the caching allocator's
    // segments) sit on transparent huge pages: page faults are what costs most here.
    const bool huge = rounded >= kHugePage;
    const size_t usable = huge ? (rounded + kHugePage - 1) / kHugePage * kHugePage : pages * page;
    const size_t mapping_bytes = usable + 2 * page + (huge ? kHugePage : 0);
    void* mapping =
        mmap(nullptr, mapping_bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mapping == MAP_FAILED) {
      std::lock_guard<std::mutex> lock(d.mutex);
      d.allocated -= rounded;
      return cudaErrorMemoryAllocation;
    }
    char* base = static_cast<char*>(mapping);
    char* usable_begin = base + page;
    if (huge) {
      const uintptr_t aligned =
          (reinterpret_cast<uintptr_t>(usable_begin) + kHugePage - 1) / kHugePage * kHugePage;
      usable_begin = reinterpret_cast<char*>(aligned);
    }
    mprotect(usable_begin, usable, PROT_READ | PROT_WRITE);
    if (huge) madvise(usable_begin, usable, MADV_HUGEPAGE);
    char* user = usable_begin + usable - rounded;
    // Fresh device memory is not zero on a GPU: a kernel that reads it before writing
    // sees NaNs here rather than a lucky 0.
    std::memset(user, 0xff, rounded);
    Allocation a{reinterpret_cast<uintptr_t>(user), rounded, index, base, mapping_bytes};
    std::lock_guard<std::mutex> lock(memory_mutex_);
    device_memory_[a.begin] = a;
    *ptr = user;
    return cudaSuccess;
  }

  cudaError_t Free(void* ptr) {
    if (ptr == nullptr) return cudaSuccess;
    Allocation a;
    bool found = false;
    {
      std::lock_guard<std::mutex> lock(memory_mutex_);
      auto it = device_memory_.find(reinterpret_cast<uintptr_t>(ptr));
      if (it != device_memory_.end()) {
        a = it->second;
        found = true;
      }
    }
    if (!found) {
      return Fail(cudaErrorInvalidValue, "cudaFree(" + Describe(ptr) +
                                             "): not a pointer that cudaMalloc returned (or "
                                             "freed already)");
    }
    // cudaFree waits for the device's work, as on a GPU.
    for (Stream* s : Streams(a.device)) s->Synchronize();
    std::lock_guard<std::mutex> lock(memory_mutex_);
    device_memory_.erase(a.begin);
    mprotect(a.mapping, a.mapping_bytes, PROT_NONE);
    madvise(a.mapping, a.mapping_bytes, MADV_DONTNEED);
    quarantine_.push_back(a);
    quarantine_bytes_ += a.mapping_bytes;
    while (quarantine_bytes_ > kQuarantineBytes) {
      munmap(quarantine_.front().mapping, quarantine_.front().mapping_bytes);
      quarantine_bytes_ -= quarantine_.front().mapping_bytes;
      quarantine_.erase(quarantine_.begin());
    }
    {
      DeviceState& d = device(a.device);
      std::lock_guard<std::mutex> device_lock(d.mutex);
      d.allocated -= a.size;
    }
    return cudaSuccess;
  }

  // The allocation holding [ptr, ptr + bytes), if one does.
  bool FindDevice(const void* ptr, size_t bytes, Allocation* found) {
    const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
    std::lock_guard<std::mutex> lock(memory_mutex_);
    auto it = device_memory_.upper_bound(p);
    if (it == device_memory_.begin()) return false;
    --it;
    const Allocation& a = it->second;
    if (p < a.begin || p - a.begin >= std::max<size_t>(a.size, 1) ||
        bytes > a.size - (p - a.begin)) {
      return false;
    }
    if (found != nullptr) *found = a;
    return true;
  }

  bool IsDevicePointer(const void* ptr) {
    const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
    std::lock_guard<std::mutex> lock(memory_mutex_);
    auto it = device_memory_.upper_bound(p);
    if (it == device_memory_.begin()) return false;
    --it;
    return p >= it->second.begin && p < it->second.begin + it->second.size;
  }

  std::string Describe(const void* ptr) {
    char text[64];
    std::snprintf(text, sizeof(text), "%p", ptr);
    std::string result = text;
    const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
    std::lock_guard<std::mutex> lock(memory_mutex_);
    for (auto it = quarantine_.rbegin(); it != quarantine_.rend(); ++it) {
      const uintptr_t low = reinterpret_cast<uintptr_t>(it->mapping);
      if (p >= low && p < low + it->mapping_bytes) {
        return result + ", in device memory already freed (a block of " + std::to_string(it->size) +
               " bytes on cuda:" + std::to_string(it->device) + ")";
      }
    }
    auto it = device_memory_.upper_bound(p);
    if (it != device_memory_.begin()) {
      --it;
      const Allocation& a = it->second;
      if (p >= a.begin && p < a.begin + a.size) {
        return result + ", " + std::to_string(p - a.begin) + " bytes into a block of " +
               std::to_string(a.size) + " bytes on cuda:" + std::to_string(a.device);
      }
      if (p >= a.begin + a.size && p < a.begin + a.size + PageSize()) {
        return result + ", " + std::to_string(p - a.begin - a.size) +
               " bytes past the end of a block of " + std::to_string(a.size) +
               " bytes on cuda:" + std::to_string(a.device);
      }
    }
    return result;
  }

  // ---- Pinned host memory ----

  void AddPinned(void* ptr, size_t size) {
    std::lock_guard<std::mutex> lock(memory_mutex_);
    pinned_[reinterpret_cast<uintptr_t>(ptr)] = size;
  }
  bool RemovePinned(void* ptr) {
    std::lock_guard<std::mutex> lock(memory_mutex_);
    return pinned_.erase(reinterpret_cast<uintptr_t>(ptr)) != 0;
  }
  bool IsPinned(const void* ptr, size_t bytes) {
    const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
    std::lock_guard<std::mutex> lock(memory_mutex_);
    auto it = pinned_.upper_bound(p);
    if (it == pinned_.begin()) return false;
    --it;
    return p >= it->first && p - it->first + bytes <= it->second;
  }

 private:
  Runtime() {
    for (int i = 0; i < kMaxDevices; ++i) devices_.push_back(std::make_unique<DeviceState>());
    if (ModelOnlyFlag().load()) AnnounceModelOnly();  // once, at the first CUDA call
  }

  std::vector<std::unique_ptr<DeviceState>> devices_;
  std::mutex handles_mutex_;
  std::set<Stream*> streams_;
  std::mutex memory_mutex_;
  std::map<uintptr_t, Allocation> device_memory_;
  std::vector<Allocation> quarantine_;
  size_t quarantine_bytes_ = 0;
  std::map<uintptr_t, size_t> pinned_;
};

thread_local cudaError_t tls_last_error = cudaSuccess;
thread_local const char* tls_running_kernel = nullptr;

#if !defined(__SANITIZE_ADDRESS__)
// A fault in device memory (a guard page, a freed block) is a kernel's or a copy's illegal
// address: say which block it hit before the process dies of it. (Under AddressSanitizer its
// own report says the same.)
struct sigaction previous_segv_action;

void OnSegv(int signal, siginfo_t* info, void* context) {
  std::string what = Runtime::Get().Describe(info->si_addr);
  const char* kernel = tls_running_kernel;
  std::fprintf(stderr,
               "cudasim: illegal address %s%s%s: an out-of-bounds or use-after-free access to "
               "device memory (cudaErrorIllegalAddress on a GPU)\n",
               what.c_str(), kernel != nullptr ? " in kernel " : "",
               kernel != nullptr ? kernel : "");
  sigaction(SIGSEGV, &previous_segv_action, nullptr);
  (void)signal;
  (void)context;
}

void InstallSegvHandler() {
  struct sigaction action;
  std::memset(&action, 0, sizeof(action));
  action.sa_sigaction = &OnSegv;
  action.sa_flags = SA_SIGINFO;
  sigemptyset(&action.sa_mask);
  sigaction(SIGSEGV, &action, &previous_segv_action);
}
#else
void InstallSegvHandler() {}
#endif
thread_local int tls_device = 0;

struct Event {
  unsigned flags = 0;
  std::shared_ptr<EventRecord> latest;  // guarded by EventMutex()
};

std::mutex& EventsMutex() {
  static std::mutex* mutex = new std::mutex;
  return *mutex;
}
std::set<Event*>& Events() {
  static std::set<Event*>* events = new std::set<Event*>;
  return *events;
}

Event* ResolveEvent(cudaEvent_t handle) {
  Event* event = reinterpret_cast<Event*>(handle);
  std::lock_guard<std::mutex> lock(EventsMutex());
  return Events().count(event) != 0 ? event : nullptr;
}

bool ValidDevice(int device) { return device >= 0 && device < Runtime::Get().count(); }

// ---- Graphs: stream capture and replay ------------------------------------------------------
// Note [cudasim graphs]. A capture collects what its streams are given (Stream::Enqueue) as
// nodes of a graph instead of running it: each node depends on the stream's previous nodes
// (`tails`), an event recorded in a capturing stream remembers the stream's tails, and a
// cudaStreamWaitEvent on such an event adds them to the waiting stream's, which joins the
// capture if it was not in it (CUDA's fork and join). Nodes are only ever appended, so index
// order is a topological order; cudaGraphInstantiate picks another one, ready nodes in an order
// shuffled by the seed, so that a replay that only works in issue order (a missing dependency
// between two streams) fails here as it could on a GPU. A replay runs every node's recorded task
// again (kernels with the arguments of their capture) as one task of the launching stream.

struct GraphNode {
  std::function<void()> run;  // null for a node that only orders others
  std::vector<size_t> deps;
  bool kernel = false;  // a kernel launch (counted per replay), not a copy or a memset
  std::string name;
  long long blocks = 0;
  long long threads_per_block = 0;
};

}  // namespace
}  // namespace internal
}  // namespace cudasim

struct CUgraph_st {
  int device = 0;
  std::vector<cudasim::internal::GraphNode> nodes;
};

struct CUgraphExec_st {
  int device = 0;
  std::shared_ptr<const CUgraph_st> graph;  // a copy: the graph may be destroyed first
  std::vector<size_t> order;
  long long kernels = 0;
};

namespace cudasim {
namespace internal {
namespace {

struct Capture {
  unsigned long long id = 0;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::thread::id thread;
  Stream* origin = nullptr;
  std::unique_ptr<CUgraph_st> graph;
  std::map<Stream*, std::vector<size_t>> tails;  // every stream in the capture
  bool ended = false;
  std::string invalidated;  // why, when it was
};

// An event recorded in a capturing stream: the stream's tails at that point.
struct CapturedEvent {
  std::shared_ptr<Capture> capture;
  std::vector<size_t> deps;
};

struct GraphState {
  std::mutex mutex;
  std::map<Stream*, std::shared_ptr<Capture>> by_stream;
  std::vector<std::shared_ptr<Capture>> live;   // begun and not ended
  std::map<const void*, CapturedEvent> events;  // by event handle
  std::set<CUgraph_st*> graphs;
  std::set<CUgraphExec_st*> execs;
  unsigned long long next_id = 1;
};

GraphState& Graphs() {
  static GraphState* state = new GraphState;
  return *state;
}

// The calling thread's mode for potentially unsafe calls (cudaThreadExchangeStreamCaptureMode).
thread_local cudaStreamCaptureMode tls_capture_mode = cudaStreamCaptureModeGlobal;

// Under Graphs().mutex.
void InvalidateLocked(Capture& capture, const std::string& why) {
  if (capture.invalidated.empty()) capture.invalidated = why;
}

void AppendUnique(std::vector<size_t>* to, const std::vector<size_t>& from) {
  for (size_t node : from) {
    if (std::find(to->begin(), to->end(), node) == to->end()) to->push_back(node);
  }
}

// What Stream::Enqueue does while the stream is capturing. False when the stream is no longer in
// a capture (it ended meanwhile): the caller queues the task as usual.
bool CaptureNode(Stream* stream, std::function<void()>* task, std::function<void()>* retired,
                 const GraphNode* launch, cudaError_t* error) {
  GraphState& g = Graphs();
  std::lock_guard<std::mutex> lock(g.mutex);
  auto it = g.by_stream.find(stream);
  if (it == g.by_stream.end()) return false;
  Capture& capture = *it->second;
  if (!capture.invalidated.empty()) {
    *error = cudaErrorStreamCaptureInvalidated;
    return true;
  }
  GraphNode node;
  if (launch != nullptr) node = *launch;
  if (*retired) {
    node.run = [run = std::move(*task), done = std::move(*retired)] {
      if (run) run();
      done();
    };
  } else {
    node.run = std::move(*task);
  }
  std::vector<size_t>& tails = capture.tails[stream];
  node.deps = tails;
  capture.graph->nodes.push_back(std::move(node));
  tails.assign(1, capture.graph->nodes.size() - 1);
  *error = cudaSuccess;
  return true;
}

// For a potentially unsafe call (one that synchronizes with the device or allocates): fails
// with cudaErrorStreamCaptureUnsupported, invalidating the captures that forbid it, as CUDA
// does: this thread's own captures unless begun relaxed, and, when this thread's mode is
// global, other threads' global captures (cudaStreamCaptureMode).
cudaError_t CheckUnsafeCall(const char* call) {
  if (tls_capture_mode == cudaStreamCaptureModeRelaxed) return cudaSuccess;
  GraphState& g = Graphs();
  std::string which;
  {
    std::lock_guard<std::mutex> lock(g.mutex);
    for (const std::shared_ptr<Capture>& c : g.live) {
      const bool mine = c->thread == std::this_thread::get_id();
      const bool forbids = mine ? c->mode != cudaStreamCaptureModeRelaxed
                                : c->mode == cudaStreamCaptureModeGlobal &&
                                      tls_capture_mode == cudaStreamCaptureModeGlobal;
      if (!forbids) continue;
      InvalidateLocked(*c, std::string(call) + " during the capture");
      which += (which.empty() ? "" : ", ") + std::to_string(c->id);
    }
  }
  if (which.empty()) return cudaSuccess;
  return Fail(cudaErrorStreamCaptureUnsupported,
              std::string(call) + " while a stream is capturing (capture " + which +
                  ", now invalidated): it would synchronize with or allocate on the device, which "
                  "a graph cannot record. Allocate and synchronize before cudaStreamBeginCapture, "
                  "or capture in cudaStreamCaptureModeRelaxed if the call is safe");
}

// Fails `call` on a stream that is capturing (a synchronize, a query, a pageable copy) and
// invalidates its capture.
cudaError_t RefuseInCapture(Stream* stream, const std::string& call, const std::string& why) {
  GraphState& g = Graphs();
  unsigned long long id = 0;
  {
    std::lock_guard<std::mutex> lock(g.mutex);
    auto it = g.by_stream.find(stream);
    if (it == g.by_stream.end()) return cudaSuccess;
    InvalidateLocked(*it->second, call + " on a capturing stream");
    id = it->second->id;
  }
  return Fail(
      cudaErrorStreamCaptureUnsupported,
      call + " on a stream in capture " + std::to_string(id) + " (now invalidated): " + why);
}

// The capture an event was last recorded in, if that capture has not ended.
std::shared_ptr<Capture> EventCapture(const void* event) {
  GraphState& g = Graphs();
  std::lock_guard<std::mutex> lock(g.mutex);
  auto it = g.events.find(event);
  if (it == g.events.end() || it->second.capture->ended) return nullptr;
  return it->second.capture;
}

// cudaEventQuery/cudaEventSynchronize on an event recorded in a capture that has not ended.
cudaError_t RefuseCapturedEvent(const void* event, const char* call) {
  std::shared_ptr<Capture> capture = EventCapture(event);
  if (capture == nullptr) return cudaSuccess;
  {
    std::lock_guard<std::mutex> lock(Graphs().mutex);
    InvalidateLocked(*capture, std::string(call) + " on an event of the capture");
  }
  return Fail(cudaErrorCapturedEvent,
              std::string(call) + ": the event was last recorded in capture " +
                  std::to_string(capture->id) +
                  " (now invalidated), where it stands for a point in a graph, not in time; wait "
                  "for it with cudaStreamWaitEvent, or query it after cudaGraphLaunch");
}

// cudaEventRecord into a capturing stream: the event marks the stream's present tails (no node).
// False when `stream` is not capturing (the event is then recorded as usual, and no longer
// stands for a point in a capture).
bool RecordEventInCapture(Event* event, Stream* stream, cudaError_t* result) {
  GraphState& g = Graphs();
  std::lock_guard<std::mutex> lock(g.mutex);
  auto it = g.by_stream.find(stream);
  if (it == g.by_stream.end()) {
    g.events.erase(event);
    return false;
  }
  Capture& capture = *it->second;
  if (!capture.invalidated.empty()) {
    *result = Fail(cudaErrorStreamCaptureInvalidated);
    return true;
  }
  g.events[event] = CapturedEvent{it->second, capture.tails[stream]};
  *result = cudaSuccess;
  return true;
}

void ForgetCapturedEvent(Event* event) {
  GraphState& g = Graphs();
  std::lock_guard<std::mutex> lock(g.mutex);
  g.events.erase(event);
}

// cudaStreamWaitEvent where a capture is involved: on an event of a capture, the stream depends
// on the event's point in the graph (joining the capture if it was not in it); a capturing
// stream may not wait for work outside its capture. False when no capture is involved.
bool WaitEventInCapture(Stream* stream, Event* event, cudaError_t* result) {
  GraphState& g = Graphs();
  std::string why;
  cudaError_t error = cudaSuccess;
  {
    std::lock_guard<std::mutex> lock(g.mutex);
    auto captured = g.events.find(event);
    if (captured != g.events.end() && captured->second.capture->ended) {
      g.events.erase(captured);
      captured = g.events.end();
    }
    auto joined = g.by_stream.find(stream);
    std::shared_ptr<Capture> mine = joined == g.by_stream.end() ? nullptr : joined->second;
    if (captured == g.events.end()) {
      if (mine == nullptr) return false;
      bool recorded = false;
      {
        std::lock_guard<std::mutex> event_lock(EventMutex());
        recorded = event->latest != nullptr;
      }
      if (!recorded) {  // an event never recorded stands for no work, as outside a capture
        *result = cudaSuccess;
        return true;
      }
      InvalidateLocked(*mine, "a wait for an event recorded outside the capture");
      error = cudaErrorStreamCaptureIsolation;
      why = "cudaStreamWaitEvent: a stream in capture " + std::to_string(mine->id) +
            " (now invalidated) waits for an event recorded outside it; only events recorded in "
            "a stream of the same capture can order captured work (record before "
            "cudaStreamBeginCapture and wait before it too)";
    } else {
      const std::shared_ptr<Capture>& theirs = captured->second.capture;
      if (mine != nullptr && mine != theirs) {
        InvalidateLocked(*mine, "a wait that would merge two captures");
        InvalidateLocked(*theirs, "a wait that would merge two captures");
        error = cudaErrorStreamCaptureMerge;
        why = "cudaStreamWaitEvent: a stream in capture " + std::to_string(mine->id) +
              " waits for an event of capture " + std::to_string(theirs->id) +
              " (both now invalidated)";
      } else if (!theirs->invalidated.empty()) {
        error = cudaErrorStreamCaptureInvalidated;
      } else {
        if (mine == nullptr) {
          g.by_stream[stream] = theirs;
          theirs->tails[stream] = captured->second.deps;
          stream->set_capturing(true);
        } else {
          AppendUnique(&theirs->tails[stream], captured->second.deps);
        }
      }
    }
  }
  *result = error == cudaSuccess ? cudaSuccess : Fail(error, why);
  return true;
}

// A topological order of `graph`'s nodes, ready nodes taken in an order shuffled by `seed`.
std::vector<size_t> ShuffledTopologicalOrder(const CUgraph_st& graph, uint64_t seed) {
  const size_t n = graph.nodes.size();
  std::vector<std::vector<size_t>> users(n);
  std::vector<size_t> waiting(n, 0);
  for (size_t i = 0; i < n; ++i) {
    for (size_t d : graph.nodes[i].deps) users[d].push_back(i);
    waiting[i] = graph.nodes[i].deps.size();
  }
  std::vector<size_t> ready, order;
  for (size_t i = 0; i < n; ++i) {
    if (waiting[i] == 0) ready.push_back(i);
  }
  uint64_t state = seed | 1;
  while (!ready.empty()) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    const size_t pick = static_cast<size_t>(state % ready.size());
    const size_t node = ready[pick];
    ready.erase(ready.begin() + static_cast<std::ptrdiff_t>(pick));
    order.push_back(node);
    for (size_t user : users[node]) {
      if (--waiting[user] == 0) ready.push_back(user);
    }
  }
  return order;
}

}  // namespace

// ---- Stream ---------------------------------------------------------------------------------

Stream::Stream(int device, bool is_default) : device_(device) {
  (void)is_default;
  static std::once_flag segv_once;
  std::call_once(segv_once, InstallSegvHandler);
  worker_ = std::thread([this] { Run(); });
}

Stream::~Stream() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  work_.notify_all();
  worker_.join();
}

cudaError_t Stream::Enqueue(std::function<void()> task, std::function<void()> retired) {
  cudaError_t error = cudaSuccess;
  if (capturing() && CaptureNode(this, &task, &retired, nullptr, &error)) return error;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    tasks_.push_back({std::move(task), std::move(retired)});
    ++pending_;
  }
  work_.notify_one();
  return cudaSuccess;
}

cudaError_t Stream::EnqueueLaunch(const std::string& name, long long blocks,
                                  long long threads_per_block, std::function<void()> task) {
  // Note [cudasim model-only mode]: counted and captured as ever, with nothing to run.
  if (ModelOnly()) task = nullptr;
  if (capturing()) {
    GraphNode launch;
    launch.kernel = true;
    launch.name = name;
    launch.blocks = blocks;
    launch.threads_per_block = threads_per_block;
    std::function<void()> no_retired;
    cudaError_t error = cudaSuccess;
    if (CaptureNode(this, &task, &no_retired, &launch, &error)) return error;
  }
  CountLaunch(name, blocks, threads_per_block);
  return Enqueue(std::move(task));
}

void Stream::Synchronize() {
  std::unique_lock<std::mutex> lock(mutex_);
  idle_.wait(lock, [this] { return pending_ == 0; });
}

bool Stream::Idle() {
  std::lock_guard<std::mutex> lock(mutex_);
  return pending_ == 0;
}

void Stream::Run() {
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_.wait(lock, [this] { return stop_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stopping, and drained
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    try {
      if (task.run) task.run();
    } catch (const std::exception& error) {
      SetStickyError(device_, cudaErrorLaunchFailure, error.what());
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      --pending_;
      if (task.retired) task.retired();
    }
    idle_.notify_all();
  }
}

Stream* ResolveStream(cudaStream_t handle) {
  Runtime& runtime = Runtime::Get();
  if (handle == nullptr) {
    if (!ValidDevice(tls_device)) return nullptr;
    return runtime.DefaultStream(tls_device);
  }
  Stream* stream = reinterpret_cast<Stream*>(handle);
  return runtime.IsStream(stream) ? stream : nullptr;
}

cudaError_t Fail(cudaError_t error, const std::string& detail) {
  tls_last_error = error;
  if (!detail.empty()) {
    std::fprintf(stderr, "cudasim: %s: %s\n", cudaGetErrorName(error), detail.c_str());
  }
  return error;
}

cudaError_t StickyError(int device) {
  return static_cast<cudaError_t>(Runtime::Get().device(device).sticky.load());
}

void SetStickyError(int device, cudaError_t error, const std::string& message) {
  DeviceState& d = Runtime::Get().device(device);
  int expected = cudaSuccess;
  if (d.sticky.compare_exchange_strong(expected, error)) {
    std::fprintf(stderr, "cudasim: cuda:%d failed (%s), every later call on it fails: %s\n", device,
                 cudaGetErrorName(error), message.c_str());
  }
}

int CurrentDevice() { return tls_device; }

uint64_t Seed() {
  static const uint64_t seed = [] {
    const char* text = std::getenv("TANDEM_CUDASIM_SEED");
    if (text == nullptr || *text == '\0') return uint64_t{0x5eed};
    char* end = nullptr;
    const unsigned long long value = std::strtoull(text, &end, 0);
    if (*end != '\0') {
      std::fprintf(stderr, "cudasim: TANDEM_CUDASIM_SEED='%s' is not an integer\n", text);
      std::exit(2);
    }
    return static_cast<uint64_t>(value);
  }();
  return seed;
}

}  // namespace internal

// ---- Kernel launches ----------------------------------------------------------------------

namespace internal {
namespace {

// What cudaFuncSetAttribute(func, cudaFuncAttributeMaxDynamicSharedMemorySize, n) allowed, per
// device (a kernel's attributes belong to the device's context, as on a GPU) and kernel address.
struct FunctionAttributes {
  std::mutex mutex;
  std::map<std::pair<int, const void*>, size_t> max_dynamic_shared;
};

FunctionAttributes& Functions() {
  static FunctionAttributes* functions = new FunctionAttributes;
  return *functions;
}

// Why a launch of `function` on `device` may not have `bytes` of dynamic shared memory, or ""
// when it may: as on a GPU, up to the kernel's cudaFuncAttributeMaxDynamicSharedMemorySize,
// 48 KiB unless it was set.
std::string SharedMemoryError(int device, const void* function, size_t bytes) {
  size_t allowed = kSharedMemoryPerBlock;
  if (function != nullptr) {
    FunctionAttributes& functions = Functions();
    std::lock_guard<std::mutex> lock(functions.mutex);
    const auto it = functions.max_dynamic_shared.find({device, function});
    if (it != functions.max_dynamic_shared.end()) allowed = it->second;
  }
  if (bytes <= allowed) return "";
  std::string why = " asks for " + std::to_string(bytes) +
                    " bytes of dynamic shared memory, but the kernel may use " +
                    std::to_string(allowed) + " on cuda:" + std::to_string(device) + ": ";
  if (bytes > GetSettings().shared_optin[device]) {
    return why + "that is more than the device's opt-in limit of " +
           std::to_string(GetSettings().shared_optin[device]) +
           " (cudaDevAttrMaxSharedMemoryPerBlockOptin), which no kernel may pass; launch with less";
  }
  if (function == nullptr) {
    return why +
           "cudasim cannot tell which kernel a launch of a template with deduced arguments is, "
           "so its cudaFuncSetAttribute cannot apply; write the template arguments out";
  }
  return why + "call cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, " +
         std::to_string(bytes) + ") on this device before the launch, as a GPU requires";
}

}  // namespace
}  // namespace internal

void EnqueueKernel(const LaunchConfig& config, const char* name, const void* function,
                   std::function<void()> thread_body) {
  using namespace internal;  // NOLINT
  Stream* stream = ResolveStream(config.stream);
  if (stream == nullptr) {
    Fail(ValidDevice(tls_device) ? cudaErrorInvalidResourceHandle : cudaErrorNoDevice,
         std::string("launch of ") + name + ": the stream is not a live stream");
    return;
  }
  if (StickyError(stream->device()) != cudaSuccess) {
    tls_last_error = StickyError(stream->device());
    return;
  }
  const dim3 g = config.grid, b = config.block;
  const uint64_t threads = uint64_t{b.x} * b.y * b.z;
  if (g.x == 0 || g.y == 0 || g.z == 0 || g.y > 65535 || g.z > 65535 || b.x == 0 || b.y == 0 ||
      b.z == 0 || b.x > 1024 || b.y > 1024 || b.z > 64 || threads > kMaxThreadsPerBlock) {
    Fail(cudaErrorInvalidConfiguration,
         std::string("launch of ") + name + " with grid (" + std::to_string(g.x) + "," +
             std::to_string(g.y) + "," + std::to_string(g.z) + ") and block (" +
             std::to_string(b.x) + "," + std::to_string(b.y) + "," + std::to_string(b.z) +
             "): expected 1 to 1024 threads per block (x, y <= 1024, z <= 64) and a grid of at "
             "least one block");
    return;
  }
  const std::string shared_error = SharedMemoryError(stream->device(), function, config.shared);
  if (!shared_error.empty()) {
    Fail(cudaErrorInvalidValue, std::string("launch of ") + name + shared_error);
    return;
  }
  const uint64_t seed = Seed() ^ (stream->NextLaunch() * 0xd1342543de82ef95ull);
  const int device = stream->device();
  std::string label = name;
  auto task = [config, seed, device, label, body = std::move(thread_body)] {
    if (StickyError(device) != cudaSuccess) return;
    try {
      tls_running_kernel = label.c_str();
      RunGrid(config.grid, config.block, config.shared, seed, body);
      tls_running_kernel = nullptr;
    } catch (const KernelError& error) {
      char hex[32];
      std::snprintf(hex, sizeof(hex), "0x%llx", static_cast<unsigned long long>(Seed()));
      tls_running_kernel = nullptr;
      SetStickyError(device, cudaErrorLaunchFailure,
                     label + ": " + error.what() + " (TANDEM_CUDASIM_SEED=" + hex + ")");
    }
  };
  const cudaError_t error = stream->EnqueueLaunch(name, static_cast<long long>(g.x) * g.y * g.z,
                                                  static_cast<long long>(threads), std::move(task));
  if (error != cudaSuccess) {
    Fail(error, std::string("launch of ") + name + " into an invalidated stream capture");
  }
}

void SetModelOnly(bool on) {
  internal::ModelOnlyFlag().store(on);
  if (on) internal::AnnounceModelOnly();
}

bool ModelOnly() { return internal::ModelOnlyFlag().load(std::memory_order_relaxed); }

}  // namespace cudasim

// ---- The runtime API ------------------------------------------------------------------------

using cudasim::internal::Fail;
using cudasim::internal::ResolveStream;
using cudasim::internal::Runtime;
using cudasim::internal::Stream;

namespace {

struct ErrorInfo {
  cudaError_t error;
  const char* name;
  const char* text;
};

constexpr ErrorInfo kErrors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration",
     "invalid configuration argument"},
    {cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer", "invalid device pointer"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection",
     "invalid copy direction for memcpy"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorInvalidDeviceFunction, "cudaErrorInvalidDeviceFunction", "invalid device function"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress",
     "an illegal memory access was encountered"},
    {cudaErrorLaunchOutOfResources, "cudaErrorLaunchOutOfResources",
     "too many resources requested for launch"},
    {cudaErrorPeerAccessAlreadyEnabled, "cudaErrorPeerAccessAlreadyEnabled",
     "peer access is already enabled"},
    {cudaErrorPeerAccessNotEnabled, "cudaErrorPeerAccessNotEnabled",
     "peer access has not been enabled"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorIllegalState, "cudaErrorIllegalState",
     "the operation cannot be performed in the present state"},
    {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported",
     "operation not permitted when stream is capturing"},
    {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated",
     "operation failed due to a previous error during capture"},
    {cudaErrorStreamCaptureMerge, "cudaErrorStreamCaptureMerge",
     "operation would result in a merge of separate capture sequences"},
    {cudaErrorStreamCaptureUnmatched, "cudaErrorStreamCaptureUnmatched",
     "capture was not ended in the same stream as it began"},
    {cudaErrorStreamCaptureUnjoined, "cudaErrorStreamCaptureUnjoined",
     "capturing stream has unjoined work"},
    {cudaErrorStreamCaptureIsolation, "cudaErrorStreamCaptureIsolation",
     "dependency created on uncaptured work in another stream"},
    {cudaErrorStreamCaptureImplicit, "cudaErrorStreamCaptureImplicit",
     "operation would make the legacy stream depend on a capturing blocking stream"},
    {cudaErrorCapturedEvent, "cudaErrorCapturedEvent",
     "operation not permitted on an event last recorded in a capturing stream"},
    {cudaErrorStreamCaptureWrongThread, "cudaErrorStreamCaptureWrongThread",
     "attempt to terminate a thread-local capture sequence from another thread"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

const ErrorInfo* Find(cudaError_t error) {
  for (const ErrorInfo& info : kErrors) {
    if (info.error == error) return &info;
  }
  return nullptr;
}

using cudasim::internal::tls_device;
using cudasim::internal::tls_last_error;

bool ValidDevice(int device) { return device >= 0 && device < Runtime::Get().count(); }

// Every call but the error queries starts here: the current device must exist, and after a
// failed kernel on it every call reports that failure.
#define CUDASIM_ENTER()                                                     \
  do {                                                                      \
    if (Runtime::Get().count() == 0) {                                      \
      return Fail(cudaErrorNoDevice);                                       \
    }                                                                       \
    const cudaError_t sticky_ = cudasim::internal::StickyError(tls_device); \
    if (sticky_ != cudaSuccess) return Fail(sticky_);                       \
  } while (false)

std::string CopyName(cudaMemcpyKind kind) {
  switch (kind) {
    case cudaMemcpyHostToHost:
      return "cudaMemcpyHostToHost";
    case cudaMemcpyHostToDevice:
      return "cudaMemcpyHostToDevice";
    case cudaMemcpyDeviceToHost:
      return "cudaMemcpyDeviceToHost";
    case cudaMemcpyDeviceToDevice:
      return "cudaMemcpyDeviceToDevice";
    default:
      return "cudaMemcpyDefault";
  }
}

// Checks that each side of a copy is what `kind` says: device memory wholly inside one
// cudaMalloc block, host memory not device memory.
cudaError_t CheckCopy(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                      const char* call) {
  Runtime& runtime = Runtime::Get();
  if (kind == cudaMemcpyDefault) return cudaSuccess;
  const bool dst_device = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool src_device = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  struct Side {
    const void* ptr;
    bool device;
    const char* what;
  } sides[2] = {{dst, dst_device, "destination"}, {src, src_device, "source"}};
  for (const Side& side : sides) {
    if (side.device && !runtime.FindDevice(side.ptr, count, nullptr)) {
      return Fail(cudaErrorInvalidValue,
                  std::string(call) + " of " + std::to_string(count) + " bytes (" + CopyName(kind) +
                      "): the " + side.what + " " + runtime.Describe(side.ptr) + " is not " +
                      std::to_string(count) + " bytes of device memory from one cudaMalloc");
    }
    if (!side.device && runtime.IsDevicePointer(side.ptr)) {
      return Fail(cudaErrorInvalidValue, std::string(call) + " (" + CopyName(kind) + "): the " +
                                             side.what + " " + runtime.Describe(side.ptr) +
                                             " is device memory, not host memory");
    }
  }
  return cudaSuccess;
}

// Queues a copy on `stream` with CUDA's host-side semantics for pageable memory: from
// pageable host memory the source is read before the call returns; into pageable host
// memory the call returns when the copy is done.
cudaError_t QueueCopy(void* dst, const void* src, size_t count, cudaMemcpyKind kind, Stream* stream,
                      bool synchronous) {
  Runtime& runtime = Runtime::Get();
  if (count == 0) return cudaSuccess;
  const bool src_host = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyHostToHost ||
                        (kind == cudaMemcpyDefault && !runtime.IsDevicePointer(src));
  const bool dst_host = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyHostToHost ||
                        (kind == cudaMemcpyDefault && !runtime.IsDevicePointer(dst));
  if (stream->capturing()) {
    const bool src_pageable = src_host && !runtime.IsPinned(src, count);
    if (src_pageable || (dst_host && !runtime.IsPinned(dst, count))) {
      return cudasim::internal::RefuseInCapture(
          stream,
          "a copy of " + std::to_string(count) + " bytes " + (src_pageable ? "from" : "into") +
              " pageable host memory",
          "a graph can only copy device memory or pinned host memory (cudaHostAlloc); stage "
          "the data in pinned or device memory before the replay");
    }
    if (synchronous) {
      return cudasim::internal::RefuseInCapture(stream, "a synchronous copy",
                                                "use cudaMemcpyAsync");
    }
    const cudaError_t error = stream->Enqueue([dst, src, count] { std::memmove(dst, src, count); });
    return error == cudaSuccess ? error : Fail(error);
  }
  if (src_host && !runtime.IsPinned(src, count)) {
    auto staged = std::make_shared<std::vector<unsigned char>>(
        static_cast<const unsigned char*>(src), static_cast<const unsigned char*>(src) + count);
    stream->Enqueue([dst, staged, count] { std::memcpy(dst, staged->data(), count); });
  } else {
    stream->Enqueue([dst, src, count] { std::memmove(dst, src, count); });
  }
  if (src_host != dst_host) cudasim::internal::CountCopy(static_cast<long long>(count), src_host);
  if (synchronous || (dst_host && !runtime.IsPinned(dst, count))) {
    cudasim::internal::CountHostSync();
    stream->Synchronize();
  }
  return cudasim::internal::StickyError(stream->device()) != cudaSuccess
             ? Fail(cudasim::internal::StickyError(stream->device()))
             : cudaSuccess;
}

}  // namespace

extern "C" {

const char* cudaGetErrorName(cudaError_t error) {
  const ErrorInfo* info = Find(error);
  return info != nullptr ? info->name : "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t error) {
  const ErrorInfo* info = Find(error);
  return info != nullptr ? info->text : "unrecognized error code";
}

cudaError_t cudaGetLastError(void) {
  cudaError_t error = tls_last_error;
  tls_last_error = cudaSuccess;
  if (ValidDevice(tls_device)) {
    const cudaError_t sticky = cudasim::internal::StickyError(tls_device);
    if (sticky != cudaSuccess) error = sticky;
  }
  return error;
}

cudaError_t cudaPeekAtLastError(void) {
  if (ValidDevice(tls_device)) {
    const cudaError_t sticky = cudasim::internal::StickyError(tls_device);
    if (sticky != cudaSuccess) return sticky;
  }
  return tls_last_error;
}

cudaError_t cudaGetDeviceCount(int* count) {
  *count = Runtime::Get().count();
  if (*count == 0) return Fail(cudaErrorNoDevice);
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (Runtime::Get().count() == 0) return Fail(cudaErrorNoDevice);
  *device = tls_device;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (!ValidDevice(device)) {
    return Fail(cudaErrorInvalidDevice, "cudaSetDevice(" + std::to_string(device) +
                                            "): " + std::to_string(Runtime::Get().count()) +
                                            " simulated devices (TANDEM_CUDASIM_DEVICES)");
  }
  tls_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (!ValidDevice(device)) return Fail(cudaErrorInvalidDevice);
  std::memset(prop, 0, sizeof(*prop));
  std::snprintf(prop->name, sizeof(prop->name), "cudasim device %d", device);
  const auto& settings = cudasim::internal::GetSettings();
  prop->totalGlobalMem = settings.memory;
  prop->sharedMemPerBlock = cudasim::internal::kSharedMemoryPerBlock;
  prop->regsPerBlock = 65536;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = cudasim::internal::kMaxThreadsPerBlock;
  prop->maxThreadsDim[0] = 1024;
  prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 0x7fffffff;
  prop->maxGridSize[1] = 65535;
  prop->maxGridSize[2] = 65535;
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = settings.sms;
  prop->maxThreadsPerMultiProcessor = 2048;
  prop->sharedMemPerBlockOptin = settings.shared_optin[device];
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  cudaDeviceProp prop;
  const cudaError_t error = cudaGetDeviceProperties(&prop, device);
  if (error != cudaSuccess) return error;
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock:
      *value = prop.maxThreadsPerBlock;
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlock:
      *value = static_cast<int>(prop.sharedMemPerBlock);
      return cudaSuccess;
    case cudaDevAttrWarpSize:
      *value = prop.warpSize;
      return cudaSuccess;
    case cudaDevAttrMultiProcessorCount:
      *value = prop.multiProcessorCount;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor:
      *value = prop.major;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor:
      *value = prop.minor;
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = static_cast<int>(prop.sharedMemPerBlockOptin);
      return cudaSuccess;
  }
  return Fail(cudaErrorInvalidValue,
              "cudaDeviceGetAttribute: attribute " + std::to_string(attr) + " is not simulated");
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  CUDASIM_ENTER();
  if (func == nullptr) {
    return Fail(cudaErrorInvalidDeviceFunction, "cudaFuncSetAttribute: the kernel is null");
  }
  switch (attr) {
    case cudaFuncAttributeMaxDynamicSharedMemorySize: {
      const size_t limit = cudasim::internal::GetSettings().shared_optin[tls_device];
      if (value < 0 || static_cast<size_t>(value) > limit) {
        return Fail(cudaErrorInvalidValue,
                    "cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize, " +
                        std::to_string(value) + ") on cuda:" + std::to_string(tls_device) +
                        ": expected 0 to the device's opt-in limit of " + std::to_string(limit) +
                        " bytes (cudaDevAttrMaxSharedMemoryPerBlockOptin)");
      }
      auto& functions = cudasim::internal::Functions();
      std::lock_guard<std::mutex> lock(functions.mutex);
      functions.max_dynamic_shared[{tls_device, func}] = static_cast<size_t>(value);
      return cudaSuccess;
    }
    case cudaFuncAttributePreferredSharedMemoryCarveout:
      // A hint for how the SM splits L1 and shared memory: nothing to simulate.
      if (value < -1 || value > 100) {
        return Fail(cudaErrorInvalidValue,
                    "cudaFuncSetAttribute(cudaFuncAttributePreferredSharedMemoryCarveout, " +
                        std::to_string(value) + "): expected -1 (default) or a percentage 0-100");
      }
      return cudaSuccess;
  }
  return Fail(cudaErrorInvalidValue,
              "cudaFuncSetAttribute: attribute " + std::to_string(attr) + " is not simulated");
}

cudaError_t cudaDeviceSynchronize(void) {
  CUDASIM_ENTER();
  if (cudaError_t e = cudasim::internal::CheckUnsafeCall("cudaDeviceSynchronize")) return e;
  cudasim::internal::CountHostSync();
  for (Stream* s : Runtime::Get().Streams(tls_device)) s->Synchronize();
  CUDASIM_ENTER();
  return cudaSuccess;
}

cudaError_t cudaDeviceReset(void) { return cudaDeviceSynchronize(); }

cudaError_t cudaDeviceCanAccessPeer(int* can_access, int device, int peer_device) {
  if (!ValidDevice(device) || !ValidDevice(peer_device)) return Fail(cudaErrorInvalidDevice);
  *can_access = device != peer_device ? 1 : 0;
  return cudaSuccess;
}

cudaError_t cudaDeviceEnablePeerAccess(int peer_device, unsigned int flags) {
  CUDASIM_ENTER();
  if (!ValidDevice(peer_device) || peer_device == tls_device) return Fail(cudaErrorInvalidDevice);
  if (flags != 0) return Fail(cudaErrorInvalidValue);
  auto& d = Runtime::Get().device(tls_device);
  std::lock_guard<std::mutex> lock(d.mutex);
  if (!d.peers.insert(peer_device).second) return Fail(cudaErrorPeerAccessAlreadyEnabled);
  return cudaSuccess;
}

cudaError_t cudaDeviceDisablePeerAccess(int peer_device) {
  CUDASIM_ENTER();
  auto& d = Runtime::Get().device(tls_device);
  std::lock_guard<std::mutex> lock(d.mutex);
  if (d.peers.erase(peer_device) == 0) return Fail(cudaErrorPeerAccessNotEnabled);
  return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int* version) {
  *version = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int* version) {
  *version = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** ptr, size_t size) {
  CUDASIM_ENTER();
  if (cudaError_t e = cudasim::internal::CheckUnsafeCall("cudaMalloc")) return e;
  const cudaError_t error = Runtime::Get().Malloc(ptr, size, tls_device);
  return error == cudaSuccess ? error : Fail(error);
}

cudaError_t cudaFree(void* ptr) {
  CUDASIM_ENTER();
  if (cudaError_t e = cudasim::internal::CheckUnsafeCall("cudaFree")) return e;
  cudasim::internal::CountHostSync();  // cudaFree waits for the device, as on a GPU
  return Runtime::Get().Free(ptr);
}

cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned int flags) {
  CUDASIM_ENTER();
  if (cudaError_t e = cudasim::internal::CheckUnsafeCall("cudaHostAlloc")) return e;
  if ((flags & ~0x7u) != 0) return Fail(cudaErrorInvalidValue);
  void* memory = nullptr;
  if (posix_memalign(&memory, 4096, std::max<size_t>(size, 1)) != 0) {
    return Fail(cudaErrorMemoryAllocation);
  }
  Runtime::Get().AddPinned(memory, size);
  *ptr = memory;
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** ptr, size_t size) { return cudaHostAlloc(ptr, size, 0); }

cudaError_t cudaFreeHost(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  if (cudaError_t e = cudasim::internal::CheckUnsafeCall("cudaFreeHost")) return e;
  if (!Runtime::Get().RemovePinned(ptr)) {
    return Fail(cudaErrorInvalidValue, "cudaFreeHost(" + Runtime::Get().Describe(ptr) +
                                           "): not a pointer that cudaHostAlloc returned");
  }
  cudasim::internal::CountHostSync();
  // As on a GPU, freeing pinned memory waits for the work that may still read it.
  for (int d = 0; d < Runtime::Get().count(); ++d) {
    for (Stream* s : Runtime::Get().Streams(d)) s->Synchronize();
  }
  std::free(ptr);
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  CUDASIM_ENTER();
  auto& d = Runtime::Get().device(tls_device);
  std::lock_guard<std::mutex> lock(d.mutex);
  *total = cudasim::internal::GetSettings().memory;
  *free = *total - d.allocated;
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  CUDASIM_ENTER();
  Stream* s = ResolveStream(stream);
  if (s == nullptr) return Fail(cudaErrorInvalidResourceHandle, "cudaMemcpyAsync: not a stream");
  const cudaError_t error = CheckCopy(dst, src, count, kind, "cudaMemcpyAsync");
  if (error != cudaSuccess) return error;
  return QueueCopy(dst, src, count, kind, s, false);
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  CUDASIM_ENTER();
  if (cudaError_t e = cudasim::internal::CheckUnsafeCall("cudaMemcpy")) return e;
  const cudaError_t error = CheckCopy(dst, src, count, kind, "cudaMemcpy");
  if (error != cudaSuccess) return error;
  return QueueCopy(dst, src, count, kind, ResolveStream(nullptr), true);
}

cudaError_t cudaMemcpyPeerAsync(void* dst, int dst_device, const void* src, int src_device,
                                size_t count, cudaStream_t stream) {
  CUDASIM_ENTER();
  if (!ValidDevice(dst_device) || !ValidDevice(src_device)) return Fail(cudaErrorInvalidDevice);
  Stream* s = ResolveStream(stream);
  if (s == nullptr) return Fail(cudaErrorInvalidResourceHandle);
  cudasim::internal::Allocation a;
  Runtime& runtime = Runtime::Get();
  if (!runtime.FindDevice(dst, count, &a) || a.device != dst_device) {
    return Fail(cudaErrorInvalidValue,
                "cudaMemcpyPeerAsync: the destination " + runtime.Describe(dst) + " is not " +
                    std::to_string(count) + " bytes of cuda:" + std::to_string(dst_device) +
                    " memory");
  }
  if (!runtime.FindDevice(src, count, &a) || a.device != src_device) {
    return Fail(cudaErrorInvalidValue, "cudaMemcpyPeerAsync: the source " + runtime.Describe(src) +
                                           " is not " + std::to_string(count) + " bytes of cuda:" +
                                           std::to_string(src_device) + " memory");
  }
  return QueueCopy(dst, src, count, cudaMemcpyDeviceToDevice, s, false);
}

cudaError_t cudaMemcpyPeer(void* dst, int dst_device, const void* src, int src_device,
                           size_t count) {
  if (cudaError_t e = cudasim::internal::CheckUnsafeCall("cudaMemcpyPeer")) return e;
  const cudaError_t error = cudaMemcpyPeerAsync(dst, dst_device, src, src_device, count, nullptr);
  if (error != cudaSuccess) return error;
  cudasim::internal::CountHostSync();
  ResolveStream(nullptr)->Synchronize();
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count, cudaStream_t stream) {
  CUDASIM_ENTER();
  Stream* s = ResolveStream(stream);
  if (s == nullptr) return Fail(cudaErrorInvalidResourceHandle, "cudaMemsetAsync: not a stream");
  if (count == 0) return cudaSuccess;
  if (!Runtime::Get().FindDevice(ptr, count, nullptr)) {
    return Fail(cudaErrorInvalidValue, "cudaMemsetAsync of " + std::to_string(count) +
                                           " bytes at " + Runtime::Get().Describe(ptr) +
                                           ": not that many bytes of device memory from one "
                                           "cudaMalloc");
  }
  const cudaError_t error = s->Enqueue([ptr, value, count] { std::memset(ptr, value, count); });
  return error == cudaSuccess ? error : Fail(error);
}

cudaError_t cudaMemset(void* ptr, int value, size_t count) {
  if (cudaError_t e = cudasim::internal::CheckUnsafeCall("cudaMemset")) return e;
  const cudaError_t error = cudaMemsetAsync(ptr, value, count, nullptr);
  if (error != cudaSuccess) return error;
  cudasim::internal::CountHostSync();
  ResolveStream(nullptr)->Synchronize();
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  CUDASIM_ENTER();
  if ((flags & ~1u) != 0) return Fail(cudaErrorInvalidValue);
  *stream = reinterpret_cast<cudaStream_t>(Runtime::Get().CreateStream(tls_device));
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, 0); }

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (Stream* s = ResolveStream(stream); stream != nullptr && s != nullptr && s->capturing()) {
    return cudasim::internal::RefuseInCapture(s, "cudaStreamDestroy",
                                              "end the capture (cudaStreamEndCapture) first");
  }
  if (stream == nullptr || !Runtime::Get().DestroyStream(reinterpret_cast<Stream*>(stream))) {
    return Fail(cudaErrorInvalidResourceHandle, "cudaStreamDestroy: not a stream it created");
  }
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  CUDASIM_ENTER();
  Stream* s = ResolveStream(stream);
  if (s == nullptr) return Fail(cudaErrorInvalidResourceHandle, "cudaStreamSynchronize");
  if (s->capturing()) {
    return cudasim::internal::RefuseInCapture(
        s, "cudaStreamSynchronize",
        "nothing captured runs before cudaGraphLaunch; synchronize "
        "after the replay");
  }
  if (cudaError_t e = cudasim::internal::CheckUnsafeCall("cudaStreamSynchronize")) return e;
  cudasim::internal::CountHostSync();
  s->Synchronize();
  const cudaError_t sticky = cudasim::internal::StickyError(s->device());
  return sticky == cudaSuccess ? cudaSuccess : Fail(sticky);
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  CUDASIM_ENTER();
  Stream* s = ResolveStream(stream);
  if (s == nullptr) return Fail(cudaErrorInvalidResourceHandle, "cudaStreamQuery");
  if (s->capturing()) {
    return cudasim::internal::RefuseInCapture(s, "cudaStreamQuery",
                                              "nothing captured runs before cudaGraphLaunch");
  }
  if (cudaError_t e = cudasim::internal::CheckUnsafeCall("cudaStreamQuery")) return e;
  return s->Idle() ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  CUDASIM_ENTER();
  if ((flags & ~0x3u) != 0) return Fail(cudaErrorInvalidValue);
  auto* e = new cudasim::internal::Event;
  e->flags = flags;
  std::lock_guard<std::mutex> lock(cudasim::internal::EventsMutex());
  cudasim::internal::Events().insert(e);
  *event = reinterpret_cast<cudaEvent_t>(e);
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, 0); }

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  auto* e = reinterpret_cast<cudasim::internal::Event*>(event);
  {
    std::lock_guard<std::mutex> lock(cudasim::internal::EventsMutex());
    if (cudasim::internal::Events().erase(e) == 0) {
      return Fail(cudaErrorInvalidResourceHandle, "cudaEventDestroy: not a live event");
    }
  }
  cudasim::internal::ForgetCapturedEvent(e);
  delete e;  // queued records hold their own state
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  CUDASIM_ENTER();
  cudasim::internal::Event* e = cudasim::internal::ResolveEvent(event);
  if (e == nullptr) return Fail(cudaErrorInvalidResourceHandle, "cudaEventRecord: not an event");
  Stream* s = ResolveStream(stream);
  if (s == nullptr) return Fail(cudaErrorInvalidResourceHandle, "cudaEventRecord: not a stream");
  if (cudaError_t c = cudaSuccess; cudasim::internal::RecordEventInCapture(e, s, &c)) return c;
  auto record = std::make_shared<cudasim::internal::EventRecord>();
  {
    std::lock_guard<std::mutex> lock(cudasim::internal::EventMutex());
    e->latest = record;
  }
  // The record's completion is set as the task retires (Stream::Enqueue): a GPU's stream
  // that has reached its last event is idle.
  s->Enqueue(nullptr, [record] {
    {
      std::lock_guard<std::mutex> lock(cudasim::internal::EventMutex());
      record->time = std::chrono::steady_clock::now();
      record->done = true;
    }
    cudasim::internal::EventSignal().notify_all();
  });
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  CUDASIM_ENTER();
  cudasim::internal::Event* e = cudasim::internal::ResolveEvent(event);
  if (e == nullptr) return Fail(cudaErrorInvalidResourceHandle, "cudaEventQuery: not an event");
  if (cudaError_t c = cudasim::internal::RefuseCapturedEvent(e, "cudaEventQuery")) return c;
  if (cudaError_t c = cudasim::internal::CheckUnsafeCall("cudaEventQuery")) return c;
  std::lock_guard<std::mutex> lock(cudasim::internal::EventMutex());
  return e->latest == nullptr || e->latest->done ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  CUDASIM_ENTER();
  cudasim::internal::Event* e = cudasim::internal::ResolveEvent(event);
  if (e == nullptr) return Fail(cudaErrorInvalidResourceHandle, "cudaEventSynchronize");
  if (cudaError_t c = cudasim::internal::RefuseCapturedEvent(e, "cudaEventSynchronize")) return c;
  if (cudaError_t c = cudasim::internal::CheckUnsafeCall("cudaEventSynchronize")) return c;
  cudasim::internal::CountHostSync();
  std::unique_lock<std::mutex> lock(cudasim::internal::EventMutex());
  std::shared_ptr<cudasim::internal::EventRecord> record = e->latest;
  if (record != nullptr) {
    cudasim::internal::EventSignal().wait(lock, [&] { return record->done; });
  }
  lock.unlock();
  CUDASIM_ENTER();
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  CUDASIM_ENTER();
  if (flags != 0) return Fail(cudaErrorInvalidValue);
  Stream* s = ResolveStream(stream);
  if (s == nullptr) return Fail(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent: stream");
  cudasim::internal::Event* e = cudasim::internal::ResolveEvent(event);
  if (e == nullptr) return Fail(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent: event");
  if (cudaError_t c = cudaSuccess; cudasim::internal::WaitEventInCapture(s, e, &c)) return c;
  std::shared_ptr<cudasim::internal::EventRecord> record;
  {
    std::lock_guard<std::mutex> lock(cudasim::internal::EventMutex());
    record = e->latest;
  }
  if (record == nullptr) return cudaSuccess;  // never recorded: nothing to wait for
  s->Enqueue([record] {
    std::unique_lock<std::mutex> lock(cudasim::internal::EventMutex());
    cudasim::internal::EventSignal().wait(lock, [&] { return record->done; });
  });
  return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  CUDASIM_ENTER();
  cudasim::internal::Event* a = cudasim::internal::ResolveEvent(start);
  cudasim::internal::Event* b = cudasim::internal::ResolveEvent(end);
  if (a == nullptr || b == nullptr) return Fail(cudaErrorInvalidResourceHandle);
  if ((a->flags | b->flags) & cudaEventDisableTiming) {
    return Fail(cudaErrorInvalidResourceHandle,
                "cudaEventElapsedTime: an event was created with cudaEventDisableTiming");
  }
  std::lock_guard<std::mutex> lock(cudasim::internal::EventMutex());
  if (a->latest == nullptr || b->latest == nullptr) return Fail(cudaErrorInvalidResourceHandle);
  if (!a->latest->done || !b->latest->done) return Fail(cudaErrorNotReady);
  *ms = std::chrono::duration<float, std::milli>(b->latest->time - a->latest->time).count();
  return cudaSuccess;
}

// ---- Graphs (Note [cudasim graphs]) ----

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  CUDASIM_ENTER();
  using cudasim::internal::Capture;
  if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
      mode != cudaStreamCaptureModeRelaxed) {
    return Fail(cudaErrorInvalidValue, "cudaStreamBeginCapture: mode " + std::to_string(mode) +
                                           " is not a cudaStreamCaptureMode");
  }
  if (stream == nullptr) {
    return Fail(cudaErrorStreamCaptureUnsupported,
                "cudaStreamBeginCapture: the legacy default stream cannot capture; capture on a "
                "stream from cudaStreamCreate");
  }
  Stream* s = ResolveStream(stream);
  if (s == nullptr) return Fail(cudaErrorInvalidResourceHandle, "cudaStreamBeginCapture");
  auto& g = cudasim::internal::Graphs();
  std::lock_guard<std::mutex> lock(g.mutex);
  if (g.by_stream.count(s) != 0) {
    return Fail(cudaErrorIllegalState, "cudaStreamBeginCapture: the stream is capturing already");
  }
  auto capture = std::make_shared<Capture>();
  capture->id = g.next_id++;
  capture->mode = mode;
  capture->thread = std::this_thread::get_id();
  capture->origin = s;
  capture->graph = std::make_unique<CUgraph_st>();
  capture->graph->device = s->device();
  capture->tails[s] = {};
  g.by_stream[s] = capture;
  g.live.push_back(capture);
  s->set_capturing(true);
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  CUDASIM_ENTER();
  if (graph == nullptr) return Fail(cudaErrorInvalidValue, "cudaStreamEndCapture: graph is null");
  Stream* s = ResolveStream(stream);
  if (s == nullptr) return Fail(cudaErrorInvalidResourceHandle, "cudaStreamEndCapture");
  auto& g = cudasim::internal::Graphs();
  std::lock_guard<std::mutex> lock(g.mutex);
  auto it = g.by_stream.find(s);
  if (it == g.by_stream.end()) {
    return Fail(cudaErrorIllegalState, "cudaStreamEndCapture: the stream is not capturing");
  }
  std::shared_ptr<cudasim::internal::Capture> capture = it->second;
  if (capture->origin != s) {
    return Fail(cudaErrorStreamCaptureUnmatched,
                "cudaStreamEndCapture: the stream joined capture " + std::to_string(capture->id) +
                    " through an event; end it on the stream that began it");
  }
  if (capture->mode != cudaStreamCaptureModeRelaxed &&
      capture->thread != std::this_thread::get_id()) {
    return Fail(cudaErrorStreamCaptureWrongThread,
                "cudaStreamEndCapture: capture " + std::to_string(capture->id) +
                    " was begun on another thread in a mode other than relaxed");
  }
  // Every stream that joined must have rejoined the origin stream: its last nodes are the
  // origin's last nodes or their ancestors.
  const std::vector<cudasim::internal::GraphNode>& nodes = capture->graph->nodes;
  std::vector<bool> joined(nodes.size(), false);
  std::vector<size_t> stack = capture->tails[s];
  while (!stack.empty()) {
    const size_t node = stack.back();
    stack.pop_back();
    if (joined[node]) continue;
    joined[node] = true;
    for (size_t d : nodes[node].deps) stack.push_back(d);
  }
  int unjoined = 0;
  for (const auto& [member, tails] : capture->tails) {
    for (size_t node : tails) unjoined += joined[node] ? 0 : 1;
    if (member != s) g.by_stream.erase(member);
    member->set_capturing(false);
  }
  g.by_stream.erase(s);
  capture->ended = true;
  g.live.erase(std::find(g.live.begin(), g.live.end(), capture));
  *graph = nullptr;
  if (!capture->invalidated.empty()) {
    return Fail(cudaErrorStreamCaptureInvalidated,
                "cudaStreamEndCapture: capture " + std::to_string(capture->id) +
                    " was invalidated by " + capture->invalidated);
  }
  if (unjoined != 0) {
    return Fail(cudaErrorStreamCaptureUnjoined,
                "cudaStreamEndCapture: " + std::to_string(unjoined) +
                    " operation(s) on streams that joined capture " + std::to_string(capture->id) +
                    " are not ordered before its end; record an event after them and "
                    "cudaStreamWaitEvent on it in the stream that began the capture");
  }
  *graph = capture->graph.release();
  g.graphs.insert(*graph);
  return cudaSuccess;
}

cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream, cudaStreamCaptureStatus* status,
                                     unsigned long long* id_out, cudaGraph_t* graph_out,
                                     const cudaGraphNode_t** dependencies_out,
                                     const cudaGraphEdgeData** edgeData_out,
                                     size_t* numDependencies_out) {
  CUDASIM_ENTER();
  if (status == nullptr) return Fail(cudaErrorInvalidValue, "cudaStreamGetCaptureInfo: status");
  if (dependencies_out != nullptr || edgeData_out != nullptr) {
    return Fail(cudaErrorInvalidValue,
                "cudaStreamGetCaptureInfo: cudasim does not return the capture's dependency "
                "nodes or edges (pass null; numDependencies_out gives their number)");
  }
  Stream* s = stream == nullptr ? nullptr : ResolveStream(stream);
  if (stream != nullptr && s == nullptr) {
    return Fail(cudaErrorInvalidResourceHandle, "cudaStreamGetCaptureInfo");
  }
  auto& g = cudasim::internal::Graphs();
  std::lock_guard<std::mutex> lock(g.mutex);
  auto it = s == nullptr ? g.by_stream.end() : g.by_stream.find(s);
  if (it == g.by_stream.end()) {
    *status = cudaStreamCaptureStatusNone;
    return cudaSuccess;
  }
  const cudasim::internal::Capture& capture = *it->second;
  *status = capture.invalidated.empty() ? cudaStreamCaptureStatusActive
                                        : cudaStreamCaptureStatusInvalidated;
  if (id_out != nullptr) *id_out = capture.id;
  if (graph_out != nullptr) *graph_out = capture.graph.get();
  if (numDependencies_out != nullptr) *numDependencies_out = capture.tails.at(s).size();
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  return cudaStreamGetCaptureInfo(stream, status);
}

cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  if (mode == nullptr ||
      (*mode != cudaStreamCaptureModeGlobal && *mode != cudaStreamCaptureModeThreadLocal &&
       *mode != cudaStreamCaptureModeRelaxed)) {
    return Fail(cudaErrorInvalidValue, "cudaThreadExchangeStreamCaptureMode: not a mode");
  }
  std::swap(*mode, cudasim::internal::tls_capture_mode);
  return cudaSuccess;
}

cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t* nodes, size_t* num_nodes) {
  auto& g = cudasim::internal::Graphs();
  std::lock_guard<std::mutex> lock(g.mutex);
  if (g.graphs.count(graph) == 0 || num_nodes == nullptr) {
    return Fail(cudaErrorInvalidValue, "cudaGraphGetNodes: not a graph, or num_nodes is null");
  }
  if (nodes != nullptr) {
    return Fail(cudaErrorInvalidValue,
                "cudaGraphGetNodes: cudasim returns only the number of nodes (pass null nodes)");
  }
  *num_nodes = graph->nodes.size();
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph,
                                 unsigned long long flags) {
  CUDASIM_ENTER();
  if (exec == nullptr) return Fail(cudaErrorInvalidValue, "cudaGraphInstantiate: exec is null");
  if (flags != 0) {
    return Fail(cudaErrorInvalidValue,
                "cudaGraphInstantiate: cudasim simulates no instantiation flags (got " +
                    std::to_string(flags) + ")");
  }
  auto& g = cudasim::internal::Graphs();
  std::lock_guard<std::mutex> lock(g.mutex);
  if (g.graphs.count(graph) == 0) {
    return Fail(cudaErrorInvalidValue,
                "cudaGraphInstantiate: not a graph from cudaStreamEndCapture "
                "(or destroyed already)");
  }
  auto* e = new CUgraphExec_st;
  e->device = graph->device;
  e->graph = std::make_shared<const CUgraph_st>(*graph);
  e->order = cudasim::internal::ShuffledTopologicalOrder(
      *e->graph, cudasim::internal::Seed() ^ (g.next_id++ * 0x9e3779b97f4a7c15ull));
  for (const cudasim::internal::GraphNode& node : e->graph->nodes) e->kernels += node.kernel;
  g.execs.insert(e);
  *exec = e;
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  CUDASIM_ENTER();
  Stream* s = ResolveStream(stream);
  if (s == nullptr) return Fail(cudaErrorInvalidResourceHandle, "cudaGraphLaunch: stream");
  std::shared_ptr<const CUgraph_st> graph;
  std::vector<size_t> order;
  long long kernels = 0;
  {
    auto& g = cudasim::internal::Graphs();
    std::lock_guard<std::mutex> lock(g.mutex);
    if (g.execs.count(exec) == 0) {
      return Fail(cudaErrorInvalidResourceHandle,
                  "cudaGraphLaunch: not an executable graph from cudaGraphInstantiate (or "
                  "destroyed already)");
    }
    graph = exec->graph;
    order = exec->order;
    kernels = exec->kernels;
  }
  if (s->capturing()) {
    return cudasim::internal::RefuseInCapture(
        s, "cudaGraphLaunch", "cudasim does not simulate a graph launched into a capture");
  }
  if (s->device() != graph->device) {
    return Fail(cudaErrorInvalidValue,
                "cudaGraphLaunch: the graph was captured on cuda:" + std::to_string(graph->device) +
                    ", the stream is on cuda:" + std::to_string(s->device()));
  }
  cudasim::internal::CountGraphLaunch(kernels);
  // Note [cudasim model-only mode]: a graph captured with the mode off runs no kernels either
  // when it is launched with the mode on; its copies and memsets still run.
  const bool skip_kernels = cudasim::ModelOnly();
  s->Enqueue([graph, order, skip_kernels] {
    for (size_t node : order) {
      const cudasim::internal::GraphNode& n = graph->nodes[node];
      if (n.run && !(skip_kernels && n.kernel)) n.run();
    }
  });
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  auto& g = cudasim::internal::Graphs();
  std::lock_guard<std::mutex> lock(g.mutex);
  if (g.execs.erase(exec) == 0) {
    return Fail(cudaErrorInvalidValue, "cudaGraphExecDestroy: not a live executable graph");
  }
  delete exec;  // a launch still queued holds the nodes
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  auto& g = cudasim::internal::Graphs();
  std::lock_guard<std::mutex> lock(g.mutex);
  if (g.graphs.erase(graph) == 0) {
    return Fail(cudaErrorInvalidValue, "cudaGraphDestroy: not a live graph");
  }
  delete graph;  // executable graphs hold their own copy
  return cudaSuccess;
}

}  // extern "C"

// ---- For the simulated NCCL (nccl.cc) -------------------------------------------------------
// Kept apart from the launch and memory code above: NCCL needs only this lookup.

namespace cudasim {
namespace internal {

bool FindDeviceMemory(const void* ptr, size_t bytes, int* device) {
  Allocation found;
  if (!Runtime::Get().FindDevice(ptr, bytes, &found)) return false;
  if (device != nullptr) *device = found.device;
  return true;
}

}  // namespace internal
}  // namespace cudasim
