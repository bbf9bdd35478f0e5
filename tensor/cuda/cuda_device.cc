#include "tensor/cuda/cuda_device.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>

#include "tensor/base/device.h"
#include "tensor/base/error.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/runtime/devices.h"

namespace tandem {
namespace cuda {
namespace {

// The most logical devices TANDEM_CUDA_LOGICAL_DEVICES may ask for.
constexpr int kMaxLogicalDevices = 64;

// Device memory from cudaMalloc, for a CachingAllocator.
class CudaMemory final : public SystemMemory {
 public:
  explicit CudaMemory(CudaDevice* device) : device_(device) {}

  void* Allocate(size_t bytes, std::string* error) override {
    DeviceGuard guard(device_->physical());
    void* ptr = nullptr;
    // During a CUDA Graph capture (the allocator's private pool growing) cudaMalloc is one of
    // the calls a global capture forbids; as PyTorch does, the calling thread relaxes its mode
    // for it: the graph's replays use the memory and never free it.
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(device_->current_stream(), &capture) != cudaSuccess) {
      cudaGetLastError();
      capture = cudaStreamCaptureStatusNone;
    }
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    if (capture != cudaStreamCaptureStatusNone) cudaThreadExchangeStreamCaptureMode(&mode);
    const cudaError_t status = cudaMalloc(&ptr, bytes);
    if (capture != cudaStreamCaptureStatusNone) cudaThreadExchangeStreamCaptureMode(&mode);
    if (status != cudaSuccess) {
      cudaGetLastError();  // out of memory is not sticky: clear it for later launch checks
      *error = std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
      return nullptr;
    }
    return ptr;
  }

  void Free(void* ptr) override {
    DeviceGuard guard(device_->physical());
    TANDEM_CUDA_CHECK(cudaFree(ptr), device_->index());
  }

  int CurrentStreamId() override { return device_->current_stream_id(); }
  bool Asynchronous() const override { return true; }
  // Any CUDA device's stream may be recorded on a block (a copy to cuda:1 reads cuda:0's).
  std::unique_ptr<EventImpl> RecordEvent(tandem::Stream stream) override {
    if (stream.device().type() != DeviceType::kCUDA) return nullptr;
    CudaDevice& device = CudaDevices::Get().device(stream.device().index());
    return std::make_unique<CudaEvent>(device, device.stream(stream.id()));
  }
  const char* Name() const override { return "cudaMalloc"; }

 private:
  CudaDevice* device_;
};

std::string DescribeCountError(cudaError_t status) {
  const std::string detail = std::string("cudaGetDeviceCount returned ") +
                             cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")";
  switch (status) {
    case cudaErrorInsufficientDriver:
      return "no CUDA driver: " + detail +
             "; install an NVIDIA driver that supports this CUDA runtime, or use cpu devices";
    case cudaErrorNoDevice:
      return "no CUDA device: " + detail +
             "; check that a GPU is present and that CUDA_VISIBLE_DEVICES does not hide it";
    default:
      return "CUDA is unavailable: " + detail;
  }
}

// TANDEM_CUDA_LOGICAL_DEVICES as a count, 0 when unset or empty.
int LogicalDevicesFromEnvironment() {
  const char* text = std::getenv(kLogicalDevicesVariable);
  if (text == nullptr || *text == '\0') return 0;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  TANDEM_CHECK(*end == '\0' && value >= 1 && value <= kMaxLogicalDevices, kLogicalDevicesVariable,
               "='", text, "' is not a device count: expected an integer in [1, ",
               kMaxLogicalDevices, "] (or leave it unset to use every GPU as one device)");
  return static_cast<int>(value);
}

}  // namespace

DeviceGuard::DeviceGuard(int physical) {
  int current = -1;
  TANDEM_CUDA_CHECK(cudaGetDevice(&current), kHostSide);
  if (current != physical) {
    TANDEM_CUDA_CHECK(cudaSetDevice(physical), kHostSide);
    previous_ = current;
  }
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) cudaSetDevice(previous_);
}

CudaDevice::CudaDevice(int index, int physical)
    : index_(index),
      physical_(physical),
      allocator_(std::make_unique<CachingAllocator>(Device::Cuda(index),
                                                    std::make_unique<CudaMemory>(this))) {}

void CudaDevice::InitStream() {
  DeviceGuard guard(physical_);
  // Non-blocking: no implicit synchronisation with the legacy default stream, which other
  // libraries in the process may use.
  cudaStream_t compute = nullptr;
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), index_);
  TANDEM_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, physical_),
                    index_);
  semaphores_[0].store(AcquireSemaphores(compute));
  streams_[0].store(compute);
  num_streams_.store(1);
}

cudaStream_t CudaDevice::stream(int id) {
  std::call_once(stream_once_, [this] { InitStream(); });
  const int count = num_streams_.load(std::memory_order_acquire);
  TANDEM_CHECK(id >= 0 && id < count, "stream ", id, " of cuda:", index_,
               " does not exist: expected 0 (the compute stream) or an id that CreateStream "
               "returned (1 to ",
               count - 1, "); create side streams with tandem::CreateStream");
  return streams_[id].load(std::memory_order_relaxed);
}

int CudaDevice::num_streams() {
  stream();
  return num_streams_.load(std::memory_order_acquire);
}

int CudaDevice::CreateStream() {
  stream();  // the compute stream is id 0
  std::lock_guard<std::mutex> lock(streams_mutex_);
  const int id = num_streams_.load();
  TANDEM_CHECK(id <= kMaxSideStreams, "cuda:", index_, " already has ", kMaxSideStreams,
               " side streams, the most a device may have; streams live as long as the process, "
               "so create them once and reuse them (or share tandem::SideStream)");
  DeviceGuard guard(physical_);
  cudaStream_t created = nullptr;
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&created, cudaStreamNonBlocking), index_);
  semaphores_[id].store(AcquireSemaphores(created), std::memory_order_relaxed);
  streams_[id].store(created, std::memory_order_relaxed);
  num_streams_.store(id + 1, std::memory_order_release);
  return id;
}

cudaEvent_t CudaDevice::AcquireEvent() {
  {
    std::lock_guard<std::mutex> lock(events_mutex_);
    if (!free_events_.empty()) {
      cudaEvent_t event = free_events_.back();
      free_events_.pop_back();
      return event;
    }
  }
  DeviceGuard guard(physical_);
  cudaEvent_t event = nullptr;
  TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), index_);
  return event;
}

void CudaDevice::ReleaseEvent(cudaEvent_t event) {
  std::lock_guard<std::mutex> lock(events_mutex_);
  free_events_.push_back(event);
}

// Note [cuBLAS workspace per stream]: one handle serves every stream of the device, bound to
// the stream of each call. cuBLAS's default workspace pool is not its own per stream, so
// results are not repeatable across streams and a CUDA Graph capture on one stream could use
// memory another stream uses (the cuBLAS documentation's "Results reproducibility" and "CUDA
// Graphs support" sections). So each stream gets a workspace of its own, set after every
// cublasSetStream (which resets the handle to the default pool). Sizes as PyTorch's defaults:
// 32 MiB on Hopper and later (sm_90+), 8 MiB + 128 KiB before.
cublasHandle_t CudaDevice::blas() {
  std::call_once(blas_once_, [this] {
    cudaStream_t s = stream();
    DeviceGuard guard(physical_);
    int major = 0;
    TANDEM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, physical_),
                      index_);
    blas_workspace_bytes_ = major >= 9 ? (size_t{32} << 20) : (size_t{8} << 20) + (128 << 10);
    TANDEM_CUBLAS_CHECK(cublasCreate(&blas_), index_);
    TANDEM_CUBLAS_CHECK(cublasSetStream(blas_, s), index_);
    TANDEM_CUBLAS_CHECK(cublasSetWorkspace(blas_, BlasWorkspace(s), blas_workspace_bytes_), index_);
    blas_stream_ = s;
    // Full float32 products unless TF32 is allowed (see cuda.h); set per call by Gemm. 16-bit
    // GEMMs reduce split-K partial sums in float, never in their 16-bit output type.
    const cublasMath_t mode = static_cast<cublasMath_t>(
        CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);
    TANDEM_CUBLAS_CHECK(cublasSetMathMode(blas_, mode), index_);
    blas_math_mode_ = mode;
  });
  return blas_;
}

void CudaDevice::BindBlas(cudaStream_t stream) {
  if (blas_stream_ == stream) return;
  TANDEM_CUBLAS_CHECK(cublasSetStream(blas(), stream), index_);
  TANDEM_CUBLAS_CHECK(cublasSetWorkspace(blas(), BlasWorkspace(stream), blas_workspace_bytes_),
                      index_);
  blas_stream_ = stream;
}

void* CudaDevice::BlasWorkspace(cudaStream_t stream) {
  void*& workspace = blas_workspaces_[stream];
  if (workspace == nullptr) {
    DeviceGuard guard(physical_);
    TANDEM_CUDA_CHECK(cudaMalloc(&workspace, blas_workspace_bytes_), index_);
  }
  return workspace;
}

LaunchContext CudaDevice::Launch(int stream_id) {
  LaunchContext context;
  context.stream = stream(stream_id);  // checks the id
  context.device = index_;
  context.num_sms = num_sms_;
  context.workspace = allocator_.get();
  context.semaphores = semaphores_[stream_id].load(std::memory_order_acquire);
  return context;
}

unsigned* CudaDevice::AcquireSemaphores(cudaStream_t stream) {
  {
    std::lock_guard<std::mutex> lock(semaphores_mutex_);
    if (!free_semaphores_.empty()) {
      unsigned* semaphores = free_semaphores_.back();
      free_semaphores_.pop_back();
      return semaphores;
    }
  }
  DeviceGuard guard(physical_);
  // A side stream may be created while another thread captures in global mode, which would
  // refuse the allocation (and invalidate its capture): relaxed, as CudaMemory does.
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  TANDEM_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode), index_);
  void* memory = nullptr;
  const cudaError_t status = cudaMalloc(&memory, kStreamSemaphores * sizeof(unsigned));
  cudaThreadExchangeStreamCaptureMode(&mode);
  TANDEM_CUDA_CHECK(status, index_);
  // On the stream, not cudaMemset: that one runs on the legacy stream, which a non-blocking
  // stream's kernels do not wait for.
  TANDEM_CUDA_CHECK(cudaMemsetAsync(memory, 0, kStreamSemaphores * sizeof(unsigned), stream),
                    index_);
  return static_cast<unsigned*>(memory);
}

void CudaDevice::ReleaseSemaphores(unsigned* semaphores) {
  std::lock_guard<std::mutex> lock(semaphores_mutex_);
  free_semaphores_.push_back(semaphores);
}

unsigned* CudaDevice::ExchangeSemaphores(int stream_id, unsigned* semaphores) {
  stream(stream_id);  // checks the id
  return semaphores_[stream_id].exchange(semaphores, std::memory_order_acq_rel);
}

DeviceAssert* CudaDevice::device_assert() {
  std::call_once(assert_once_, [this] {
    DeviceGuard guard(physical_);
    void* memory = nullptr;
    TANDEM_CUDA_CHECK(cudaMalloc(&memory, sizeof(DeviceAssert)), index_);
    TANDEM_CUDA_CHECK(cudaMemset(memory, 0, sizeof(DeviceAssert)), index_);
    device_assert_.store(static_cast<DeviceAssert*>(memory));
  });
  return device_assert_.load();
}

void CudaDevice::RaiseDeviceAssert(cudaStream_t stream) {
  DeviceAssert* slot = device_assert_.load();
  if (slot == nullptr) return;
  DeviceGuard guard(physical_);
  DeviceAssert record{};
  // The host has just waited for `stream`, so this short copy is not a new wait for work.
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(&record, slot, sizeof(record), cudaMemcpyDeviceToHost, stream),
                    index_);
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream), index_);
  // op == 0: the recording kernel runs on a stream not yet waited for; a later sync raises it.
  if (record.flag == 0 || record.op == 0) return;
  TANDEM_CUDA_CHECK(cudaMemsetAsync(slot, 0, sizeof(DeviceAssert), stream), index_);
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream), index_);
  TANDEM_FAIL(reinterpret_cast<const char*>(record.op), ": index ", record.value,
              " is out of range; indices must be in [0, ", record.size, ") (found on ",
              Device::Cuda(index_), " by a kernel queued before this synchronization, as ",
              "PyTorch's device-side assert; the device stays usable)");
}

CudaEvent::CudaEvent(CudaDevice& device, cudaStream_t stream)
    : device_(device), event_(device.AcquireEvent()) {
  DeviceGuard guard(device_.physical());
  const cudaError_t status = cudaEventRecord(event_, stream);
  if (status != cudaSuccess) {
    device_.ReleaseEvent(event_);
    TANDEM_CUDA_CHECK(status, device_.index());
  }
}

CudaEvent::~CudaEvent() { device_.ReleaseEvent(event_); }

bool CudaEvent::Query() {
  const cudaError_t status = cudaEventQuery(event_);
  if (status == cudaErrorNotReady) {
    cudaGetLastError();  // not an error: keep it from resurfacing at the next launch check
    return false;
  }
  TANDEM_CUDA_CHECK(status, device_.index());
  return true;
}

void CudaEvent::Synchronize() { TANDEM_CUDA_CHECK(cudaEventSynchronize(event_), device_.index()); }

CudaDevices& CudaDevices::Get() {
  static CudaDevices* devices = new CudaDevices;
  return *devices;
}

CudaDevices::CudaDevices() {
  int physical_count = 0;
  const cudaError_t status = cudaGetDeviceCount(&physical_count);
  if (status != cudaSuccess) {
    cudaGetLastError();
    unavailable_reason_ = DescribeCountError(status);
    return;
  }
  if (physical_count == 0) {
    unavailable_reason_ = "no CUDA device: cudaGetDeviceCount found none";
    return;
  }
  const int logical = LogicalDevicesFromEnvironment();
  if (logical > 0) {
    for (int i = 0; i < logical; ++i) devices_.push_back(std::make_unique<CudaDevice>(i, 0));
  } else {
    for (int i = 0; i < physical_count; ++i) {
      devices_.push_back(std::make_unique<CudaDevice>(i, i));
    }
  }
}

CudaDevice& CudaDevices::device(int index) {
  if (devices_.empty()) {
    TANDEM_FAIL("cuda:", index, " is not available: ", unavailable_reason_);
  }
  TANDEM_CHECK(index >= 0 && index < count(), "cuda:", index, " does not exist: ", count(),
               " CUDA device(s) are visible (cuda:0 to cuda:", count() - 1, ")");
  return *devices_[index];
}

void CudaDevices::EnablePeerAccess(int to, int from) {
  if (to == from) return;
  std::lock_guard<std::mutex> lock(peer_mutex_);
  const std::pair<int, int> pair(to, from);
  if (std::find(peer_pairs_done_.begin(), peer_pairs_done_.end(), pair) != peer_pairs_done_.end()) {
    return;
  }
  int can_access = 0;
  TANDEM_CUDA_CHECK(cudaDeviceCanAccessPeer(&can_access, to, from), kHostSide);
  if (can_access) {
    DeviceGuard guard(to);
    const cudaError_t status = cudaDeviceEnablePeerAccess(from, 0);
    if (status == cudaErrorPeerAccessAlreadyEnabled) {
      cudaGetLastError();  // enabled by other code in the process: fine
    } else {
      TANDEM_CUDA_CHECK(status, kHostSide);
    }
  }
  peer_pairs_done_.push_back(pair);
}

}  // namespace cuda
}  // namespace tandem
