#include "tensor/cuda/cuda_check.h"

#include <string>

#include "tensor/base/error.h"

namespace tandem {
namespace cuda {
namespace internal {

std::string DeviceName(int device) {
  return device == kHostSide ? std::string("the host") : "cuda:" + std::to_string(device);
}

void ThrowCudaError(const char* file, int line, const char* call, cudaError_t error, int device) {
  // Clear the thread's "last error" (unless the context is broken for good), so that the
  // next launch check does not report this failure a second time.
  cudaGetLastError();
  tandem::internal::ThrowError(
      file, line,
      tandem::internal::Concat("CUDA call ", call, " failed on ", DeviceName(device), ": ",
                               cudaGetErrorName(error), " (", cudaGetErrorString(error), ")"));
}

void ThrowCublasError(const char* file, int line, const char* call, cublasStatus_t status,
                      int device) {
  tandem::internal::ThrowError(
      file, line,
      tandem::internal::Concat("cuBLAS call ", call, " failed on ", DeviceName(device), ": ",
                               cublasGetStatusName(status), " (", cublasGetStatusString(status),
                               ")"));
}

}  // namespace internal
}  // namespace cuda
}  // namespace tandem
