// Streams and events: the order in which a device runs the work queued on it, and markers
// in that order, as in PyTorch's torch.cuda.Stream / torch.cuda.Event (c10::Stream).
//
// A Stream is a plain value {device, id}. Id 0 is the device's compute stream, where every
// kernel goes unless a StreamGuard on the calling thread picks another; side streams (id >= 1)
// let communication (copies, broadcasts, all-reduces) run beside compute. Work on one stream
// runs in order; work on two streams is unordered unless an Event orders it. An Event marks
// the work queued on a stream so far: another stream (on any device) can wait for it, and the
// host can poll it or wait for it.
//
// CPU devices run kernels on the calling thread, so all of this is trivial there: every
// stream is in order with the host, an event is complete as soon as it is recorded, and
// waiting costs nothing. Code written against this API runs unchanged on cpu and cuda devices.
//
//   tandem::Stream comm = tandem::SideStream(tandem::Device::Cuda(1));
//   tandem::Event ready;
//   ready.Record(tandem::CurrentStream(tandem::Device::Cuda(0)));  // after x was produced
//   comm.Wait(ready);                     // comm's later work waits for it; cuda:0 goes on
//   {
//     tandem::StreamGuard guard(comm);    // kernels for cuda:1 go to `comm` in this scope
//     y = x.to(tandem::Device::Cuda(1));
//     tandem::RecordStream(x, comm);      // x's block is not reused before comm has read it
//                                         // (tensor/core/tensor.h)
//   }
//   tandem::CurrentStream(tandem::Device::Cuda(1)).Wait(comm);  // compute uses y after
#ifndef TANDEM_TENSOR_RUNTIME_STREAM_H_
#define TANDEM_TENSOR_RUNTIME_STREAM_H_

#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "tensor/base/device.h"

namespace tandem {

class Event;
class EventImpl;

// A queue of work on one device. Cheap to copy; compares by value. Does not check that the
// device or stream exists until it is used.
class Stream {
 public:
  static constexpr int kComputeId = 0;

  // cpu:0's compute stream.
  constexpr Stream() = default;
  constexpr explicit Stream(Device device, int id = kComputeId) : device_(device), id_(id) {}

  Device device() const { return device_; }
  int id() const { return id_; }
  bool is_compute() const { return id_ == kComputeId; }

  // Whether all work queued on the stream so far has finished (never blocks).
  bool Query() const;
  // Waits on the host until all work queued on the stream so far has finished. Throws
  // tandem::Error carrying any asynchronous error raised by that work.
  void Synchronize() const;
  // Work queued on this stream after the call waits until `event` has completed; the host
  // does not wait (except on a CPU device, where it must: CPU work runs on the host). An
  // event that was never recorded is complete.
  void Wait(const Event& event) const;
  // Work queued on this stream after the call waits for the work queued on `other` so far.
  void Wait(Stream other) const;

  std::string ToString() const;  // "cuda:0/compute", "cuda:1/stream 2"

  friend bool operator==(Stream a, Stream b) { return a.device_ == b.device_ && a.id_ == b.id_; }
  friend bool operator!=(Stream a, Stream b) { return !(a == b); }
  friend bool operator<(Stream a, Stream b) {
    return a.device_ < b.device_ || (a.device_ == b.device_ && a.id_ < b.id_);
  }

 private:
  Device device_ = Device::Cpu(0);
  int id_ = kComputeId;
};

std::ostream& operator<<(std::ostream& out, Stream stream);

// The device's compute stream (id 0). Throws tandem::Error if the device does not exist.
Stream DefaultStream(Device device);
// The stream that kernels for `device` queued by this thread go to: the innermost active
// StreamGuard's for that device, else the compute stream. Does not check the device.
Stream CurrentStream(Device device);
// A new side stream on `device`. Streams live as long as the process, and a device has at
// most 32 side streams: create them once and keep them. Throws for a missing device.
Stream CreateStream(Device device);
// The device's shared side stream for communication, created on first use (the same stream
// for every caller; use CreateStream for one of your own).
Stream SideStream(Device device);

// Makes `stream` the current stream of its device on this thread while in scope, then
// restores the previous one. Guards nest. Only the constructing thread is affected: work that
// a DeviceWorker runs on another thread uses that thread's current stream.
class StreamGuard {
 public:
  // Throws tandem::Error if the stream's device or the stream does not exist.
  explicit StreamGuard(Stream stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

  Stream original() const { return original_; }
  Stream current() const { return current_; }

 private:
  Stream original_;
  Stream current_;
};

// The streams that this thread's StreamGuards have made current (compute streams left out),
// to carry into work handed to another thread (a DeviceWorker task): capture them with
// CurrentStreams() when the task is made, and make them current there with a
// MultiStreamGuard for the task's duration.
std::vector<Stream> CurrentStreams();

// Makes each of `streams` (from CurrentStreams, or each checked by a StreamGuard before) the
// current stream of its device on this thread while in scope, then restores the previous ones.
//
//   std::vector<Stream> streams = CurrentStreams();
//   worker.Submit([streams] { MultiStreamGuard guard(streams); RunReplica(); });
class MultiStreamGuard {
 public:
  explicit MultiStreamGuard(const std::vector<Stream>& streams);
  ~MultiStreamGuard();
  MultiStreamGuard(const MultiStreamGuard&) = delete;
  MultiStreamGuard& operator=(const MultiStreamGuard&) = delete;

 private:
  std::vector<Stream> original_;
};

// A marker in a stream's queue: Record captures the work queued so far, and Query,
// Synchronize and Stream::Wait refer to that work. Movable, not copyable; it owns a backend
// event (a cudaEvent_t on CUDA devices, nothing on the CPU). Recording again replaces what
// the event captured, and may use a stream of another device.
class Event {
 public:
  Event();
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  // Captures the work queued on `stream` so far. Throws for a missing device or stream.
  void Record(Stream stream);
  bool recorded() const { return impl_ != nullptr; }
  // The stream of the last Record; throws if the event was never recorded.
  Stream stream() const;
  // Whether the captured work has finished (true if never recorded). Never blocks.
  bool Query() const;
  // Waits on the host until the captured work has finished (returns at once if never
  // recorded). Throws tandem::Error carrying any asynchronous error raised by that work.
  void Synchronize() const;
  // Same as stream.Wait(*this).
  void Block(Stream stream) const;

 private:
  friend class Stream;
  Stream stream_;
  std::unique_ptr<EventImpl> impl_;
};

namespace internal {
// While a CUDA Graph capture is underway (tensor/cuda/cuda_graph.h) a random draw's seed and
// offset would be frozen into the graph, every replay repeating the same numbers: Generator::
// Claim then throws tandem::Error saying `why`. Null allows draws again. Process-wide.
void SetRandomDrawsForbidden(const char* why);
const char* RandomDrawsForbidden();
// Whether a CUDA Graph capture is underway in this process (what sets the above).
inline bool GraphCaptureUnderway() { return RandomDrawsForbidden() != nullptr; }
}  // namespace internal

}  // namespace tandem

#endif  // TANDEM_TENSOR_RUNTIME_STREAM_H_
