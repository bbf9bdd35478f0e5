#include <cuda_runtime.h>

#include <string>

#include "tools/cuda/tests/saxpy.h"

namespace tandem::cuda_tests {
namespace {

__global__ void SaxpyKernel(float a, const float* __restrict__ x, float* __restrict__ y, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
    y[i] = a * x[i] + y[i];
  }
}

std::string ErrorString(const char* what, cudaError_t err) {
  return std::string(what) + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
}

}  // namespace

int CudaDeviceCount(std::string* reason) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    if (reason != nullptr) *reason = ErrorString("cudaGetDeviceCount", err);
    return -1;
  }
  return count;
}

std::string SaxpyOnDevice(float a, const float* x, float* y, int n) {
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  float* dx = nullptr;
  float* dy = nullptr;
  cudaError_t err;
  std::string result;
  if ((err = cudaMalloc(&dx, bytes)) != cudaSuccess) return ErrorString("cudaMalloc", err);
  if ((err = cudaMalloc(&dy, bytes)) != cudaSuccess) {
    cudaFree(dx);
    return ErrorString("cudaMalloc", err);
  }
  if ((err = cudaMemcpy(dx, x, bytes, cudaMemcpyHostToDevice)) != cudaSuccess ||
      (err = cudaMemcpy(dy, y, bytes, cudaMemcpyHostToDevice)) != cudaSuccess) {
    result = ErrorString("cudaMemcpy H2D", err);
  } else {
    const int threads = 256;
    const int blocks = (n + threads - 1) / threads;
    SaxpyKernel<<<blocks, threads>>>(a, dx, dy, n);
    if ((err = cudaGetLastError()) != cudaSuccess) {
      result = ErrorString("SaxpyKernel launch", err);
    } else if ((err = cudaMemcpy(y, dy, bytes, cudaMemcpyDeviceToHost)) != cudaSuccess) {
      result = ErrorString("cudaMemcpy D2H", err);
    }
  }
  cudaFree(dx);
  cudaFree(dy);
  return result;
}

}  // namespace tandem::cuda_tests
