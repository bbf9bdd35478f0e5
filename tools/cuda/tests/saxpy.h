// Host-side interface to a tiny CUDA kernel. Plain C++: no CUDA types, so any
// cc_library/cc_test can include it; the implementation is in saxpy.cu.
#ifndef TANDEM_TOOLS_CUDA_TESTS_SAXPY_H_
#define TANDEM_TOOLS_CUDA_TESTS_SAXPY_H_

#include <string>

namespace tandem::cuda_tests {

// y[i] = a * x[i] + y[i] for i < n, computed on the current CUDA device.
// x and y are host arrays. Returns "" on success, otherwise the CUDA error.
std::string SaxpyOnDevice(float a, const float* x, float* y, int n);

// The number of CUDA devices, or -1 with *reason set when the CUDA runtime
// cannot be used (no driver, no device, ...).
int CudaDeviceCount(std::string* reason);

}  // namespace tandem::cuda_tests

#endif  // TANDEM_TOOLS_CUDA_TESTS_SAXPY_H_
