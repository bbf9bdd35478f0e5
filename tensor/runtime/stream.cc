#include "tensor/runtime/stream.h"

#include <atomic>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "tensor/base/error.h"
#include "tensor/runtime/allocator.h"
#include "tensor/runtime/backend.h"
#include "tensor/runtime/devices.h"

namespace tandem {
namespace {

// This thread's current streams, one entry per device whose current stream is not its
// compute stream. Usually empty, so that looking one up costs next to nothing.
thread_local std::vector<Stream> current_streams;

void SetCurrentStream(Stream stream) {
  for (auto it = current_streams.begin(); it != current_streams.end(); ++it) {
    if (it->device() != stream.device()) continue;
    if (stream.is_compute()) {
      current_streams.erase(it);
    } else {
      *it = stream;
    }
    return;
  }
  if (!stream.is_compute()) current_streams.push_back(stream);
}

Backend& BackendOf(Stream stream) {
  CheckAvailable(stream.device());
  return GetBackend(stream.device().type());
}

}  // namespace

// ---- Stream ------------------------------------------------------------------------------

bool Stream::Query() const { return BackendOf(*this).QueryStream(device_.index(), id_); }

void Stream::Synchronize() const { BackendOf(*this).SynchronizeStream(device_.index(), id_); }

void Stream::Wait(const Event& event) const {
  Backend& backend = BackendOf(*this);
  if (!event.recorded()) return;
  if (event.stream_.device().type() == device_.type()) {
    backend.StreamWaitEvent(device_.index(), id_, *event.impl_);
  } else {
    // Devices of two types have no common queue: the host orders them, by waiting. (A CPU
    // event is complete already; waiting for a GPU event is what a CPU stream must do,
    // since CPU work runs on the host.)
    event.impl_->Synchronize();
  }
}

void Stream::Wait(Stream other) const {
  if (other == *this) return;
  Event event;
  event.Record(other);
  Wait(event);
}

std::string Stream::ToString() const {
  return device_.ToString() + (is_compute() ? "/compute" : "/stream " + std::to_string(id_));
}

std::ostream& operator<<(std::ostream& out, Stream stream) { return out << stream.ToString(); }

Stream DefaultStream(Device device) {
  CheckAvailable(device);
  return Stream(device);
}

Stream CurrentStream(Device device) {
  for (const Stream& stream : current_streams) {
    if (stream.device() == device) return stream;
  }
  return Stream(device);
}

Stream CreateStream(Device device) {
  CheckAvailable(device);
  return Stream(device, GetBackend(device.type()).CreateStream(device.index()));
}

Stream SideStream(Device device) {
  CheckAvailable(device);
  static std::mutex mutex;
  static auto* side_streams = new std::map<Device, Stream>;  // leaked: used at exit too
  std::lock_guard<std::mutex> lock(mutex);
  auto it = side_streams->find(device);
  if (it == side_streams->end()) it = side_streams->emplace(device, CreateStream(device)).first;
  return it->second;
}

// ---- StreamGuard -------------------------------------------------------------------------

StreamGuard::StreamGuard(Stream stream)
    : original_(CurrentStream(stream.device())), current_(stream) {
  BackendOf(stream).QueryStream(stream.device().index(), stream.id());  // checks the stream
  SetCurrentStream(stream);
}

StreamGuard::~StreamGuard() { SetCurrentStream(original_); }

std::vector<Stream> CurrentStreams() { return current_streams; }

MultiStreamGuard::MultiStreamGuard(const std::vector<Stream>& streams)
    : original_(current_streams) {
  for (Stream stream : streams) SetCurrentStream(stream);
}

MultiStreamGuard::~MultiStreamGuard() { current_streams = original_; }

// ---- Event -------------------------------------------------------------------------------

Event::Event() = default;
Event::~Event() = default;
Event::Event(Event&& other) noexcept = default;
Event& Event::operator=(Event&& other) noexcept = default;

void Event::Record(Stream stream) {
  impl_ = BackendOf(stream).RecordEvent(stream.device().index(), stream.id());
  stream_ = stream;
}

Stream Event::stream() const {
  TANDEM_CHECK(recorded(),
               "Event::stream(): the event was never recorded; call Record(stream) "
               "first");
  return stream_;
}

bool Event::Query() const { return impl_ == nullptr || impl_->Query(); }

void Event::Synchronize() const {
  if (impl_ != nullptr) impl_->Synchronize();
}

void Event::Block(Stream stream) const { stream.Wait(*this); }

namespace internal {
namespace {
std::atomic<const char*> random_draws_forbidden{nullptr};
}  // namespace

void SetRandomDrawsForbidden(const char* why) { random_draws_forbidden.store(why); }
const char* RandomDrawsForbidden() { return random_draws_forbidden.load(); }
}  // namespace internal

}  // namespace tandem
