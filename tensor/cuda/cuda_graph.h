// tandem::cuda::CUDAGraph (torch.cuda.CUDAGraph): records the CUDA work that a piece of code
// queues on one device, once, and replays it with one launch, so that a training step whose
// kernels are each too short to hide their launch costs one launch instead of hundreds. Use it
// for a step whose shapes do not change and that never waits on the host (no item(), no
// host-side checks: cuda::SetSyncDebugError finds those first).
//
// As in PyTorch:
//   - Capture runs the code once on a side stream after a few warm-up iterations there (which
//     allocate the optimizer's state, cuBLAS's workspace and the allocator's segments).
//     Nothing captured runs during the capture; replay() runs it, on the current stream.
//   - A replay reads and writes the same memory as the capture: inputs are copied into the
//     tensors the capture read ("static inputs"), and outputs read from the tensors it wrote.
//   - What the capture allocates comes from a pool of its own that nobody else uses while the
//     graph lives (the caching allocator's private pools), returned at reset().
//   - Whatever makes the host wait for the device during the capture (item(), a copy to host
//     memory, synchronize) throws tandem::Error, and the capture fails. So does a random draw
//     (dropout, rand): its seed and offset would be frozen into the graph, every replay drawing
//     the same numbers (Tandem's generator does not yet read them from device memory).
//   - Values that change per step belong in device memory that the step reads (the capturable
//     optimizers keep their step count and learning rate there: nn/adam.h).
//
//   tandem::Stream side = tandem::SideStream(tandem::Device::Cuda(0));
//   side.Wait(tandem::CurrentStream(tandem::Device::Cuda(0)));
//   tandem::cuda::CUDAGraph graph;
//   {
//     tandem::StreamGuard guard(side);
//     for (int i = 0; i < 3; ++i) Step(static_x, static_y);   // warm-up, on the side stream
//     tandem::cuda::CUDAGraphCapture capture(graph, tandem::Device::Cuda(0));
//     static_loss = Step(static_x, static_y);                 // captured, not run
//   }
//   tandem::CurrentStream(tandem::Device::Cuda(0)).Wait(side);
//   for (...) { static_x.copy_(x); static_y.copy_(y); graph.replay(); }
//
// It exposes no CUDA type, so it compiles without the CUDA toolkit's headers.
#ifndef TANDEM_TENSOR_CUDA_CUDA_GRAPH_H_
#define TANDEM_TENSOR_CUDA_CUDA_GRAPH_H_

#include <cstdint>
#include <memory>
#include <string>

#include "tensor/base/device.h"

namespace tandem {
namespace cuda {

// cudaStreamCaptureMode: which threads' calls that a capture forbids (allocating from the
// system, synchronizing) fail while it is underway: any thread's (kGlobal, PyTorch's
// default), the capturing thread's (kThreadLocal), or none (kRelaxed).
enum class CaptureErrorMode { kGlobal, kThreadLocal, kRelaxed };

class CUDAGraph {
 public:
  CUDAGraph();
  ~CUDAGraph();  // reset()
  CUDAGraph(const CUDAGraph&) = delete;
  CUDAGraph& operator=(const CUDAGraph&) = delete;

  // Begins capturing the work queued on `device`'s current stream, which must be a side stream
  // (tandem::StreamGuard). Throws tandem::Error for a CPU device, the compute stream, or a
  // graph already captured (reset() first).
  void capture_begin(Device device, CaptureErrorMode mode = CaptureErrorMode::kGlobal);
  // Ends the capture and makes the graph replayable. Throws tandem::Error, leaving the graph
  // reset, when the capture failed (something it forbids was called during it).
  void capture_end();
  // Queues the captured work on the device's current stream; returns without waiting.
  void replay();
  // Waits for the device, then frees the graph and returns its memory pool to the allocator.
  // The tensors that the capture made and that are still alive stay valid.
  void reset();

  bool capturing() const;
  bool captured() const;  // capture_end succeeded and no reset() since
  Device device() const;
  // Kernels, copies and memsets in the graph (0 before capture_end).
  int64_t num_nodes() const;
  // The allocator's private pool that the capture allocated from (0 before capture_begin).
  uint64_t pool() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Captures into `graph` while in scope (torch.cuda.graph): capture_begin in the constructor,
// capture_end in the destructor. When the scope is left by an exception the capture is
// abandoned (the graph reset) and the exception goes on.
class CUDAGraphCapture {
 public:
  CUDAGraphCapture(CUDAGraph& graph, Device device,
                   CaptureErrorMode mode = CaptureErrorMode::kGlobal);
  // Throws what capture_end throws, unless an exception is already propagating.
  ~CUDAGraphCapture() noexcept(false);
  CUDAGraphCapture(const CUDAGraphCapture&) = delete;
  CUDAGraphCapture& operator=(const CUDAGraphCapture&) = delete;

 private:
  CUDAGraph& graph_;
  int uncaught_;
};

namespace internal {
// For the backend: `what` (a wait of the host, ...) was refused on `device` during a capture,
// which capture_end then fails, naming it (the refusal threw before reaching CUDA, which would
// otherwise never learn of it).
void NoteCaptureViolation(int device, const std::string& what);
}  // namespace internal

}  // namespace cuda
}  // namespace tandem

#endif  // TANDEM_TENSOR_CUDA_CUDA_GRAPH_H_
