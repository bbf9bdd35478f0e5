// The CUDA devices of this process (internal to tensor/cuda/): which logical devices exist,
// which physical GPU each one runs on, and each one's stream, cuBLAS handle and caching
// allocator, created at first use.
//
// Every logical device owns one non-blocking stream, and all of its kernels, cuBLAS calls
// and copies are queued there, so work on one device runs in order and work on different
// devices overlaps. Host threads share the streams (CUDA streams are thread-safe); the
// cuBLAS handle, which is not, is used under its device's mutex.
//
//   CudaDevice& device = CudaDevices::Get().device(0);
//   DeviceGuard guard(device.physical());
//   LaunchUnary(device.Launch(), UnaryOp::kRelu, dst, src, 0.0);
#ifndef TANDEM_TENSOR_CUDA_CUDA_DEVICE_H_
#define TANDEM_TENSOR_CUDA_CUDA_DEVICE_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tensor/caching_allocator.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/pinned_host_allocator.h"

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
  CudaDevice(int index, int physical);
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  int index() const { return index_; }
  int physical() const { return physical_; }

  // The device's stream (created on first use).
  cudaStream_t stream();
  // The device's cuBLAS handle, bound to stream(); hold blas_mutex() while using it.
  cublasHandle_t blas();
  std::mutex& blas_mutex() { return blas_mutex_; }
  // The cuBLAS math mode last set on blas() (kept here to set it only when it changes).
  cublasMath_t& blas_math_mode() { return blas_math_mode_; }

  CachingAllocator& allocator() { return *allocator_; }
  // What kernel launchers need: stream, SM count, the allocator for workspaces.
  LaunchContext Launch();

 private:
  void InitStream();

  const int index_;
  const int physical_;
  std::once_flag stream_once_;
  cudaStream_t stream_ = nullptr;
  int num_sms_ = 1;
  std::once_flag blas_once_;
  cublasHandle_t blas_ = nullptr;
  cublasMath_t blas_math_mode_ = CUBLAS_DEFAULT_MATH;
  std::mutex blas_mutex_;
  std::unique_ptr<CachingAllocator> allocator_;
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

}  // namespace cuda
}  // namespace tandem

#endif  // TANDEM_TENSOR_CUDA_CUDA_DEVICE_H_
