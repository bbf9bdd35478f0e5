// The CUDA devices of this process (internal to tensor/cuda/): which logical devices exist,
// which physical GPU each one runs on, and each one's streams, events, cuBLAS handle and
// caching allocator, created at first use.
//
// Every logical device owns non-blocking streams: id 0, the compute stream, created at
// first use, and side streams that CreateStream adds (tensor/runtime/stream.h). Kernels, cuBLAS
// calls and copies go to the calling thread's current stream of the device (the compute
// stream unless a StreamGuard picked another), so work on one stream runs in order and work
// on different streams and devices overlaps. Host threads share the streams (CUDA streams
// are thread-safe); the cuBLAS handle, which is not, is used under its device's mutex.
//
//   CudaDevice& device = CudaDevices::Get().device(0);
//   DeviceGuard guard(device.physical());
//   LaunchUnary(device.Launch(), UnaryOp::kRelu, dst, src, 0.0);  // on the current stream
#ifndef TANDEM_TENSOR_CUDA_CUDA_DEVICE_H_
#define TANDEM_TENSOR_CUDA_CUDA_DEVICE_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "tensor/cuda/kernels.h"
#include "tensor/cuda/pinned_host_allocator.h"
#include "tensor/runtime/backend.h"
#include "tensor/runtime/internal/caching_allocator.h"

namespace tandem {
namespace cuda {

// The environment variable that maps N logical devices onto GPU 0 (a testing aid).
inline constexpr const char* kLogicalDevicesVariable = "TANDEM_CUDA_LOGICAL_DEVICES";

// Makes a physical GPU current on the calling thread while in scope, then restores the
// previous one (so code around Tandem that has its own current device is not disturbed).
class DeviceGuard {
 public:
  explicit DeviceGuard(int physical);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

class CudaDevice {
 public:
  // Side streams a device may have (tensor/runtime/stream.h's CreateStream documents the limit).
  static constexpr int kMaxSideStreams = 32;

  CudaDevice(int index, int physical);
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  int index() const { return index_; }
  int physical() const { return physical_; }

  // Stream `id` of the device (0: the compute stream, created on first use); throws
  // tandem::Error for an id that CreateStream has not given.
  cudaStream_t stream(int id = tandem::Stream::kComputeId);
  // The calling thread's current stream of this device (tandem::CurrentStream).
  cudaStream_t current_stream() { return stream(current_stream_id()); }
  int current_stream_id() const { return CurrentStream(Device::Cuda(index_)).id(); }
  // A new side stream; returns its id.
  int CreateStream();
  // Streams created so far, the compute stream included.
  int num_streams();

  // An event of this device (created with timing disabled), from a pool; give it back with
  // ReleaseEvent, which makes no CUDA call and so may run while the process exits.
  cudaEvent_t AcquireEvent();
  void ReleaseEvent(cudaEvent_t event);

  // The device's cuBLAS handle; hold blas_mutex() while using it, and bind it to the stream
  // of the work with BindBlas first.
  cublasHandle_t blas();
  std::mutex& blas_mutex() { return blas_mutex_; }
  // Sets the handle's stream to `stream` if it is bound to another, with that stream's own
  // cuBLAS workspace (Note [cuBLAS workspace per stream]). Needs blas_mutex().
  void BindBlas(cudaStream_t stream);
  // The workspace BindBlas gives cuBLAS on `stream` (allocated on first use). Needs
  // blas_mutex().
  void* BlasWorkspace(cudaStream_t stream);
  size_t blas_workspace_bytes() const { return blas_workspace_bytes_; }
  // The cuBLAS math mode last set on blas() (kept here to set it only when it changes).
  cublasMath_t& blas_math_mode() { return blas_math_mode_; }

  CachingAllocator& allocator() { return *allocator_; }
  // What kernel launchers need: the current stream (or stream `stream_id`), SM count, the
  // allocator for workspaces, the stream's semaphores.
  LaunchContext Launch() { return Launch(current_stream_id()); }
  LaunchContext Launch(int stream_id);

  // A set of kStreamSemaphores zeroed counters (Note [Stream semaphores]): one the device had
  // free, else a new one, zeroed on `stream` (work queued there later finds it zero; work on
  // other streams must wait for the stream first). `stream` must not be capturing.
  unsigned* AcquireSemaphores(cudaStream_t stream);
  // Gives back a set that no queued work uses any longer (left zero, as every user leaves it).
  void ReleaseSemaphores(unsigned* semaphores);
  // Makes `semaphores` the ones launches on stream `stream_id` get; returns the ones they got.
  unsigned* ExchangeSemaphores(int stream_id, unsigned* semaphores);

  // The device's DeviceAssert (Note [Device-side index checks], kernels.h), allocated and
  // cleared on first use.
  DeviceAssert* device_assert();
  // After the host has waited for `stream`: throws the error a kernel recorded in
  // device_assert(), if any, and clears it. Free when no kernel has asked for the record.
  void RaiseDeviceAssert(cudaStream_t stream);

 private:
  void InitStream();

  const int index_;
  const int physical_;
  std::once_flag stream_once_;
  // streams_[0, num_streams_) exist; written under streams_mutex_, read without a lock.
  std::atomic<cudaStream_t> streams_[1 + kMaxSideStreams] = {};
  // Note [Stream semaphores]: kernels whose blocks count each other's arrivals, so that the
  // last to arrive finishes the reduction in the same launch (LaunchRowNormBackward), need
  // counters that are zero when they start. A memset before each would be one more launch per
  // use, and one more node in every captured graph; a set allocated lazily at its first use
  // could be allocated during a capture, which forbids cudaMalloc. So each stream owns a set,
  // allocated and zeroed when the stream is created, and every kernel that uses it leaves it
  // zero. One set per stream suffices because the kernels of a stream run one after another,
  // never two at once, and a graph replays its nodes in the order of their stream at capture.
  // A graph is replayed on whichever stream is current, possibly alongside later work of the
  // stream it was captured on, so CUDAGraph gives its capture a set of its own
  // (ExchangeSemaphores); replays of one graph must not overlap, as they already must not for
  // its memory pool. (A side stream joined into a capture by an event keeps its own set in the
  // graph: replays must not overlap that stream's eager work.) semaphores_[id] is stream id's:
  // set when the stream is created, swapped only while a graph captures it.
  std::atomic<unsigned*> semaphores_[1 + kMaxSideStreams] = {};
  std::mutex semaphores_mutex_;
  std::vector<unsigned*> free_semaphores_;  // never freed: live as the device
  std::atomic<int> num_streams_{0};
  std::mutex streams_mutex_;
  int num_sms_ = 1;
  std::mutex events_mutex_;
  std::vector<cudaEvent_t> free_events_;
  std::once_flag blas_once_;
  cublasHandle_t blas_ = nullptr;
  cudaStream_t blas_stream_ = nullptr;
  size_t blas_workspace_bytes_ = 0;                // set with the handle
  std::map<cudaStream_t, void*> blas_workspaces_;  // never freed: live as the device
  cublasMath_t blas_math_mode_ = CUBLAS_DEFAULT_MATH;
  std::mutex blas_mutex_;
  std::unique_ptr<CachingAllocator> allocator_;
  std::once_flag assert_once_;
  std::atomic<DeviceAssert*> device_assert_{nullptr};  // never freed: lives as the device
};

// A backend event of a CUDA device (behind tandem::Event): recorded on a stream of the
// device when made, returned to the device's pool when destroyed.
class CudaEvent final : public EventImpl {
 public:
  CudaEvent(CudaDevice& device, cudaStream_t stream);
  ~CudaEvent() override;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  bool Query() override;
  void Synchronize() override;

  cudaEvent_t get() const { return event_; }
  CudaDevice& device() const { return device_; }

 private:
  CudaDevice& device_;
  cudaEvent_t event_ = nullptr;
};

class CudaDevices {
 public:
  // The process's devices, found on first call. Never destroyed: tensors may be freed
  // during static destruction, and the CUDA runtime may already be unloading by then.
  static CudaDevices& Get();

  int count() const { return static_cast<int>(devices_.size()); }
  // Why count() is 0; empty otherwise.
  const std::string& unavailable_reason() const { return unavailable_reason_; }
  // Logical device `index`; throws tandem::Error naming the valid range otherwise.
  CudaDevice& device(int index);
  PinnedHostAllocator& pinned() { return pinned_; }

  // Lets physical GPU `to` read `from`'s memory directly (NVLink/PCIe peer access), once
  // per pair; copies still work without it, staged through the host by the driver.
  void EnablePeerAccess(int to, int from);

 private:
  CudaDevices();

  std::vector<std::unique_ptr<CudaDevice>> devices_;
  std::string unavailable_reason_;
  PinnedHostAllocator pinned_;
  std::mutex peer_mutex_;
  std::vector<std::pair<int, int>> peer_pairs_done_;
};

// Queues `launch` (a launcher of kernels.h) on logical device `index`: its GPU made current,
// its LaunchContext (the calling thread's current stream). What each KernelStub registration
// of tensor/cuda/*_kernels.cc does.
//
//   void CudaTriangle(int index, DType dtype, ...) { LaunchOnDevice(index, &LaunchTriangle, ...); }
template <typename... Params, typename... Args>
void LaunchOnDevice(int index, void (*launch)(const LaunchContext&, Params...), Args&&... args) {
  CudaDevice& device = CudaDevices::Get().device(index);
  DeviceGuard guard(device.physical());
  launch(device.Launch(), std::forward<Args>(args)...);
}

}  // namespace cuda
}  // namespace tandem

#endif  // TANDEM_TENSOR_CUDA_CUDA_DEVICE_H_
