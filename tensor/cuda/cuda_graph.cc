#include "tensor/cuda/cuda_graph.h"

#include <cuda_runtime.h>

#include <exception>
#include <map>
#include <mutex>
#include <string>

#include "tensor/base/error.h"
#include "tensor/cuda/cuda.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/cuda_device.h"
#include "tensor/runtime/stream.h"

namespace tandem {
namespace cuda {

namespace {

// The first refused call of each device's capture underway (internal::NoteCaptureViolation).
struct Violations {
  std::mutex mutex;
  std::map<int, std::string> first;
};

Violations& GetViolations() {
  static Violations* violations = new Violations;
  return *violations;
}

// Takes the device's recorded violation ("" if none).
std::string TakeViolation(int device) {
  Violations& v = GetViolations();
  std::lock_guard<std::mutex> lock(v.mutex);
  auto it = v.first.find(device);
  if (it == v.first.end()) return "";
  std::string what = it->second;
  v.first.erase(it);
  return what;
}

}  // namespace

void internal::NoteCaptureViolation(int device, const std::string& what) {
  Violations& v = GetViolations();
  std::lock_guard<std::mutex> lock(v.mutex);
  v.first.emplace(device, what);
}

struct CUDAGraph::Impl {
  Device device = Device::Cuda(0);
  int stream_id = -1;
  cudaStream_t stream = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  uint64_t pool = 0;
  unsigned long long capture_id = 0;  // cudaStreamGetCaptureInfo's, for pinned host blocks
  bool capturing = false;
  // The graph's own counters for its kernels (Note [Stream semaphores], cuda_device.h): the
  // replays may run on another stream than the capture's, alongside that one's later work.
  unsigned* semaphores = nullptr;
  unsigned* stream_semaphores = nullptr;  // the stream's, given back when the capture ends

  CudaDevice& cuda_device() const { return CudaDevices::Get().device(device.index()); }

  void RestoreStreamSemaphores() {
    if (stream_semaphores == nullptr) return;
    cuda_device().ExchangeSemaphores(stream_id, stream_semaphores);
    stream_semaphores = nullptr;
  }

  // Ends a capture that is underway, keeping nothing of it; returns the capture's error.
  cudaError_t AbandonCapture() {
    cudaError_t status = cudaSuccess;
    if (capturing) {
      DeviceGuard guard(cuda_device().physical());
      cudaGraph_t partial = nullptr;
      status = cudaStreamEndCapture(stream, &partial);
      if (partial != nullptr) cudaGraphDestroy(partial);
      cudaGetLastError();  // the capture's error is reported by the caller, not the next launch
      tandem::internal::SetRandomDrawsForbidden(nullptr);
      cuda_device().allocator().EndAllocateToPool(pool);
      RestoreStreamSemaphores();
      capturing = false;
    }
    return status;
  }
};

CUDAGraph::CUDAGraph() : impl_(std::make_unique<Impl>()) {}

CUDAGraph::~CUDAGraph() {
  try {
    reset();
  } catch (const std::exception&) {
    // The device failed: its error surfaces at the next synchronization; nothing to undo here.
  }
}

void CUDAGraph::capture_begin(Device device, CaptureErrorMode mode) {
  TANDEM_CHECK(device.is_cuda(), "CUDAGraph::capture_begin(", device,
               "): a CUDA Graph records the work of a CUDA device; ", device,
               " runs its kernels on the host, with nothing to capture (run the step eagerly)");
  TANDEM_CHECK(!impl_->capturing && impl_->exec == nullptr, "CUDAGraph::capture_begin(", device,
               "): the graph is ", impl_->capturing ? "capturing" : "captured",
               " already; call reset() before capturing again");
  CudaDevice& cuda_device = CudaDevices::Get().device(device.index());
  const int stream_id = cuda_device.current_stream_id();
  TANDEM_CHECK(stream_id != tandem::Stream::kComputeId, "CUDAGraph::capture_begin(", device,
               "): the current stream is the compute stream; capture on a side stream "
               "(tandem::StreamGuard guard(tandem::SideStream(device))), after warm-up "
               "iterations on it, as torch.cuda.graph does, so that the compute stream's other "
               "work stays out of the graph");
  DeviceGuard guard(cuda_device.physical());
  TakeViolation(device.index());
  impl_->device = device;
  impl_->stream_id = stream_id;
  impl_->stream = cuda_device.stream(stream_id);
  // Zeroed on the stream, which the synchronization below waits for.
  impl_->semaphores = cuda_device.AcquireSemaphores(impl_->stream);
  // Work queued before the capture must not be running when the graph's pool is carved out.
  Synchronize(device.index());
  impl_->pool = cuda_device.allocator().CreatePrivatePool();
  cuda_device.allocator().BeginAllocateToPool(impl_->pool, stream_id);
  impl_->stream_semaphores = cuda_device.ExchangeSemaphores(stream_id, impl_->semaphores);
  const cudaStreamCaptureMode cuda_mode =
      mode == CaptureErrorMode::kGlobal        ? cudaStreamCaptureModeGlobal
      : mode == CaptureErrorMode::kThreadLocal ? cudaStreamCaptureModeThreadLocal
                                               : cudaStreamCaptureModeRelaxed;
  const cudaError_t status = cudaStreamBeginCapture(impl_->stream, cuda_mode);
  if (status != cudaSuccess) {
    impl_->RestoreStreamSemaphores();
    cuda_device.ReleaseSemaphores(impl_->semaphores);
    impl_->semaphores = nullptr;
    cuda_device.allocator().EndAllocateToPool(impl_->pool);
    cuda_device.allocator().ReleasePrivatePool(impl_->pool);
    impl_->pool = 0;
    TANDEM_CUDA_CHECK(status, device.index());
  }
  impl_->capturing = true;
  cudaStreamCaptureStatus capture_status = cudaStreamCaptureStatusNone;
  TANDEM_CUDA_CHECK(cudaStreamGetCaptureInfo(impl_->stream, &capture_status, &impl_->capture_id),
                    device.index());
  tandem::internal::SetRandomDrawsForbidden(
      "during a CUDA Graph capture: its seed and offset would be frozen into the graph and every "
      "replay would draw the same numbers; Tandem's generator does not read them from device "
      "memory yet, so capture without dropout (p = 0) or draw outside the graph");
}

void CUDAGraph::capture_end() {
  TANDEM_CHECK(impl_->capturing,
               "CUDAGraph::capture_end: no capture is underway; call "
               "capture_begin first");
  CudaDevice& cuda_device = impl_->cuda_device();
  DeviceGuard guard(cuda_device.physical());
  const cudaError_t status = cudaStreamEndCapture(impl_->stream, &impl_->graph);
  cudaGetLastError();
  tandem::internal::SetRandomDrawsForbidden(nullptr);
  cuda_device.allocator().EndAllocateToPool(impl_->pool);
  impl_->RestoreStreamSemaphores();
  impl_->capturing = false;
  const std::string violation = TakeViolation(impl_->device.index());
  if (status != cudaSuccess || !violation.empty()) {
    const Device device = impl_->device;
    reset();
    TANDEM_CHECK(violation.empty(), "CUDAGraph::capture_end on ", device,
                 ": the capture failed: ", violation,
                 " was refused during it; run the step without it, then capture again");
    TANDEM_CHECK(false, "CUDAGraph::capture_end on ", device, ": the capture failed with ",
                 cudaGetErrorName(status), " (", cudaGetErrorString(status),
                 "): something it forbids ran during it (a wait of the host for the device, an "
                 "allocation from the system outside the graph's pool, a copy from pageable "
                 "host memory, a stream it did not join back); the first such call threw or "
                 "returned the error");
  }
  TANDEM_CUDA_CHECK(cudaGraphInstantiate(&impl_->exec, impl_->graph, 0), impl_->device.index());
}

void CUDAGraph::replay() {
  TANDEM_CHECK(impl_->exec != nullptr, "CUDAGraph::replay: nothing captured",
               impl_->capturing ? " yet (the capture is still underway: capture_end first)"
                                : "; capture_begin, run the step, capture_end first");
  CudaDevice& cuda_device = impl_->cuda_device();
  DeviceGuard guard(cuda_device.physical());
  TANDEM_CUDA_CHECK(cudaGraphLaunch(impl_->exec, cuda_device.current_stream()),
                    impl_->device.index());
}

void CUDAGraph::reset() {
  if (impl_->pool == 0 && impl_->exec == nullptr && impl_->graph == nullptr &&
      impl_->capture_id == 0 && impl_->semaphores == nullptr) {
    return;
  }
  impl_->AbandonCapture();
  CudaDevice& cuda_device = impl_->cuda_device();
  {
    DeviceGuard guard(cuda_device.physical());
    // A replay still queued writes the pool's memory: it must be done before others reuse it.
    if (impl_->exec != nullptr) Synchronize(impl_->device.index());
    if (impl_->exec != nullptr) TANDEM_CUDA_CHECK(cudaGraphExecDestroy(impl_->exec), kHostSide);
    if (impl_->graph != nullptr) TANDEM_CUDA_CHECK(cudaGraphDestroy(impl_->graph), kHostSide);
  }
  impl_->exec = nullptr;
  impl_->graph = nullptr;
  if (impl_->pool != 0) cuda_device.allocator().ReleasePrivatePool(impl_->pool);
  if (impl_->capture_id != 0) CudaDevices::Get().pinned().ReleaseCapture(impl_->capture_id);
  // No replay is queued any more (synchronized above), and each left the counters zero.
  if (impl_->semaphores != nullptr) cuda_device.ReleaseSemaphores(impl_->semaphores);
  impl_->pool = 0;
  impl_->capture_id = 0;
  impl_->semaphores = nullptr;
}

bool CUDAGraph::capturing() const { return impl_->capturing; }
bool CUDAGraph::captured() const { return impl_->exec != nullptr; }
Device CUDAGraph::device() const { return impl_->device; }
uint64_t CUDAGraph::pool() const { return impl_->pool; }

int64_t CUDAGraph::num_nodes() const {
  if (impl_->graph == nullptr) return 0;
  size_t nodes = 0;
  TANDEM_CUDA_CHECK(cudaGraphGetNodes(impl_->graph, nullptr, &nodes), kHostSide);
  return static_cast<int64_t>(nodes);
}

CUDAGraphCapture::CUDAGraphCapture(CUDAGraph& graph, Device device, CaptureErrorMode mode)
    : graph_(graph), uncaught_(std::uncaught_exceptions()) {
  graph_.capture_begin(device, mode);
}

CUDAGraphCapture::~CUDAGraphCapture() noexcept(false) {
  if (std::uncaught_exceptions() > uncaught_) {
    graph_.reset();  // abandons the capture
    return;
  }
  graph_.capture_end();
}

}  // namespace cuda
}  // namespace tandem
