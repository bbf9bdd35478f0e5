// Error checking for CUDA runtime and cuBLAS calls (internal to tensor/cuda/).
//
// Every CUDA and cuBLAS call in the backend goes through these macros, which throw a
// tandem::Error naming the call, the error and the logical device it was made for:
//
//   TANDEM_CUDA_CHECK(cudaMemsetAsync(ptr, 0, bytes, stream), device);
//   TANDEM_CUBLAS_CHECK(cublasSetStream(handle, stream), device);
//   TANDEM_CUDA_CHECK_LAUNCH(device);  // after a <<<...>>> launch
//
// `device` is the logical CUDA device index, or kHostSide for calls tied to no device.
#ifndef TANDEM_TENSOR_CUDA_CUDA_CHECK_H_
#define TANDEM_TENSOR_CUDA_CUDA_CHECK_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <string>

namespace tandem {
namespace cuda {

// The `device` argument for calls that belong to no device (pinned host memory, queries).
inline constexpr int kHostSide = -1;

namespace internal {

// "cuda:1" (physical GPU 0)" or "host" for kHostSide.
std::string DeviceName(int device);

[[noreturn]] void ThrowCudaError(const char* file, int line, const char* call, cudaError_t error,
                                 int device);
[[noreturn]] void ThrowCublasError(const char* file, int line, const char* call,
                                   cublasStatus_t status, int device);

}  // namespace internal
}  // namespace cuda
}  // namespace tandem

#define TANDEM_CUDA_CHECK(call, device)                                                      \
  do {                                                                                       \
    const cudaError_t tandem_cuda_error = (call);                                            \
    if (tandem_cuda_error != cudaSuccess) {                                                  \
      ::tandem::cuda::internal::ThrowCudaError(__FILE__, __LINE__, #call, tandem_cuda_error, \
                                               (device));                                    \
    }                                                                                        \
  } while (false)

#define TANDEM_CUBLAS_CHECK(call, device)                                                         \
  do {                                                                                            \
    const cublasStatus_t tandem_cublas_status = (call);                                           \
    if (tandem_cublas_status != CUBLAS_STATUS_SUCCESS) {                                          \
      ::tandem::cuda::internal::ThrowCublasError(__FILE__, __LINE__, #call, tandem_cublas_status, \
                                                 (device));                                       \
    }                                                                                             \
  } while (false)

// Kernel launches report configuration errors (too many threads, too much shared memory,
// no kernel image for this GPU) only through cudaGetLastError.
#define TANDEM_CUDA_CHECK_LAUNCH(device) TANDEM_CUDA_CHECK(cudaGetLastError(), device)

#endif  // TANDEM_TENSOR_CUDA_CUDA_CHECK_H_
