#include "tensor/cuda/cuda_device.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>

#include "tensor/cuda/cuda_check.h"
#include "tensor/device.h"
#include "tensor/error.h"

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
    const cudaError_t status = cudaMalloc(&ptr, bytes);
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

  uintptr_t CurrentStream() override { return reinterpret_cast<uintptr_t>(device_->stream()); }
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
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), index_);
  TANDEM_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, physical_),
                    index_);
}

cudaStream_t CudaDevice::stream() {
  std::call_once(stream_once_, [this] { InitStream(); });
  return stream_;
}

cublasHandle_t CudaDevice::blas() {
  std::call_once(blas_once_, [this] {
    cudaStream_t s = stream();
    DeviceGuard guard(physical_);
    TANDEM_CUBLAS_CHECK(cublasCreate(&blas_), index_);
    TANDEM_CUBLAS_CHECK(cublasSetStream(blas_, s), index_);
    // Full float32 products unless TF32 is allowed (see cuda.h); set per call by Gemm.
    TANDEM_CUBLAS_CHECK(cublasSetMathMode(blas_, CUBLAS_DEFAULT_MATH), index_);
    blas_math_mode_ = CUBLAS_DEFAULT_MATH;
  });
  return blas_;
}

LaunchContext CudaDevice::Launch() {
  LaunchContext context;
  context.stream = stream();
  context.device = index_;
  context.num_sms = num_sms_;
  context.workspace = allocator_.get();
  return context;
}

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
