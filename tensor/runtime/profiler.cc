#include "tensor/runtime/profiler.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <mutex>
#include <thread>

#include "tensor/base/atomic_file.h"
#include "tensor/base/error.h"

namespace tandem::profiler {
namespace internal {
std::atomic<bool> g_enabled{false};
}  // namespace internal

namespace {

using Clock = std::chrono::steady_clock;

// One thread's events of one session. The lock is the thread's own except while Stop reads.
struct ThreadBuffer {
  std::mutex mutex;
  std::vector<Event> events;
};

struct Session {
  std::mutex mutex;  // guards everything below, and the writes of the atomics after it
  std::thread::id starter;
  std::vector<std::shared_ptr<ThreadBuffer>> buffers;  // index = Event::thread
  std::vector<std::string> names;
};

Session& GetSession() {
  static Session* session = new Session();  // outlives threads that record at exit
  return *session;
}

std::atomic<int64_t> g_recorded{0};
std::atomic<int64_t> g_dropped{0};
// The running session's id (bumped by every Start) and start, readable without the lock: a
// thread that has its buffer for the session records without taking the session's lock.
std::atomic<uint64_t> g_session_id{0};
std::atomic<int64_t> g_session_start_ns{0};

Clock::time_point SessionStart() {
  return Clock::time_point(Clock::duration(g_session_start_ns.load(std::memory_order_relaxed)));
}

thread_local std::string t_thread_name;
thread_local std::shared_ptr<ThreadBuffer> t_buffer;
thread_local uint64_t t_buffer_session = 0;
thread_local int t_thread_index = -1;

// The calling thread's buffer for the running session (registered on first use), or null if
// no session runs.
ThreadBuffer* BufferOfThisThread(Clock::time_point* session_start) {
  if (t_buffer != nullptr && t_buffer_session == g_session_id.load(std::memory_order_acquire)) {
    *session_start = SessionStart();
    return t_buffer.get();
  }
  Session& session = GetSession();
  std::lock_guard<std::mutex> lock(session.mutex);
  if (!internal::g_enabled.load(std::memory_order_relaxed)) return nullptr;
  *session_start = SessionStart();
  const uint64_t id = g_session_id.load(std::memory_order_relaxed);
  if (t_buffer == nullptr || t_buffer_session != id) {
    t_buffer = std::make_shared<ThreadBuffer>();
    t_buffer_session = id;
    t_thread_index = static_cast<int>(session.buffers.size());
    session.buffers.push_back(t_buffer);
    std::string name = t_thread_name;
    if (name.empty()) {
      name = std::this_thread::get_id() == session.starter
                 ? "main"
                 : "thread " + std::to_string(t_thread_index);
    }
    session.names.push_back(std::move(name));
  }
  return t_buffer.get();
}

void AppendEscaped(std::string& out, const std::string& text) {
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char code[8];
          std::snprintf(code, sizeof(code), "\\u%04x", static_cast<unsigned char>(c));
          out += code;
        } else {
          out += c;
        }
    }
  }
}

}  // namespace

namespace internal {

void Record(const char* category, std::string name, Clock::time_point start,
            Clock::time_point end) {
  Clock::time_point session_start;
  ThreadBuffer* buffer = BufferOfThisThread(&session_start);
  if (buffer == nullptr) return;
  if (g_recorded.fetch_add(1, std::memory_order_relaxed) >= kMaxEvents) {
    g_dropped.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  Event event;
  event.category = category;
  event.name = std::move(name);
  event.thread = t_thread_index;
  event.start_us = std::chrono::duration<double, std::micro>(start - session_start).count();
  event.duration_us = std::chrono::duration<double, std::micro>(end - start).count();
  std::lock_guard<std::mutex> lock(buffer->mutex);
  buffer->events.push_back(std::move(event));
}

}  // namespace internal

void Scope::Begin(const char* category, std::string name) {
  category_ = category;
  name_ = std::move(name);
  start_ = Clock::now();
}

void Scope::End() { internal::Record(category_, std::move(name_), start_, Clock::now()); }

void Start() {
  Session& session = GetSession();
  std::lock_guard<std::mutex> lock(session.mutex);
  TANDEM_CHECK(!internal::g_enabled.load(), "profiler::Start: the profiler is already running; ",
               "call profiler::Stop() first");
  g_session_start_ns.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
  g_session_id.fetch_add(1, std::memory_order_release);
  session.starter = std::this_thread::get_id();
  session.buffers.clear();
  session.names.clear();
  g_recorded = 0;
  g_dropped = 0;
  internal::g_enabled.store(true);
}

Trace Stop() {
  Session& session = GetSession();
  std::vector<std::shared_ptr<ThreadBuffer>> buffers;
  Trace trace;
  {
    std::lock_guard<std::mutex> lock(session.mutex);
    TANDEM_CHECK(internal::g_enabled.load(),
                 "profiler::Stop: the profiler is not running; call profiler::Start() first");
    internal::g_enabled.store(false);
    buffers.swap(session.buffers);
    trace.thread_names.swap(session.names);
  }
  for (const std::shared_ptr<ThreadBuffer>& buffer : buffers) {
    std::lock_guard<std::mutex> lock(buffer->mutex);
    for (Event& event : buffer->events) trace.events.push_back(std::move(event));
    buffer->events.clear();
  }
  std::stable_sort(trace.events.begin(), trace.events.end(),
                   [](const Event& a, const Event& b) { return a.start_us < b.start_us; });
  trace.dropped = g_dropped.load();
  return trace;
}

bool IsEnabled() { return internal::g_enabled.load(std::memory_order_relaxed); }

void SetThreadName(std::string name) {
  t_thread_name = std::move(name);
  Session& session = GetSession();
  std::lock_guard<std::mutex> lock(session.mutex);
  if (t_buffer != nullptr && t_buffer_session == g_session_id.load(std::memory_order_relaxed) &&
      t_thread_index >= 0 && t_thread_index < static_cast<int>(session.names.size())) {
    session.names[t_thread_index] = t_thread_name;
  }
}

std::string ChromeTraceJson(const Trace& trace) {
  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  bool first = true;
  auto separate = [&] {
    if (!first) out += ",\n";
    first = false;
  };
  for (size_t i = 0; i < trace.thread_names.size(); ++i) {
    separate();
    out += "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":" + std::to_string(i) +
           ",\"args\":{\"name\":\"";
    AppendEscaped(out, trace.thread_names[i]);
    out += "\"}},\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":0,\"tid\":" +
           std::to_string(i) + ",\"args\":{\"sort_index\":" + std::to_string(i) + "}}";
  }
  char numbers[96];
  for (const Event& event : trace.events) {
    separate();
    out += "{\"name\":\"";
    AppendEscaped(out, event.name);
    out += "\",\"cat\":\"";
    AppendEscaped(out, event.category);
    std::snprintf(numbers, sizeof(numbers), "\",\"ph\":\"X\",\"pid\":0,\"tid\":%d,\"ts\":%.3f,",
                  event.thread, event.start_us);
    out += numbers;
    std::snprintf(numbers, sizeof(numbers), "\"dur\":%.3f}", event.duration_us);
    out += numbers;
  }
  out += "\n]}\n";
  return out;
}

void WriteChromeTrace(const Trace& trace, const std::string& path) {
  WriteFileAtomically(path, ChromeTraceJson(trace), "Chrome trace");
}

}  // namespace tandem::profiler
