// Runs the saxpy kernel on the GPU and checks it against a CPU loop. Where the
// CUDA runtime cannot be used (no driver or no GPU: cudaGetDeviceCount fails,
// e.g. with cudaErrorInsufficientDriver) the test prints why and skips.
#include "tools/cuda/tests/saxpy.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

namespace tandem::cuda_tests {
namespace {

TEST(SaxpyTest, MatchesCpuLoop) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    std::string reason = err != cudaSuccess
                             ? std::string("cudaGetDeviceCount: ") + cudaGetErrorName(err) + " (" +
                                   cudaGetErrorString(err) + ")"
                             : std::string("no CUDA device");
    std::printf("Skipping GPU test: %s\n", reason.c_str());
    GTEST_SKIP() << reason;
  }

  const int n = 1 << 20;
  const float a = 2.5f;
  std::vector<float> x(n), y(n), expected(n);
  for (int i = 0; i < n; ++i) {
    x[i] = static_cast<float>(i % 1000) * 0.001f;
    y[i] = static_cast<float>(i % 7) - 3.0f;
    expected[i] = a * x[i] + y[i];
  }
  ASSERT_EQ(SaxpyOnDevice(a, x.data(), y.data(), n), "");
  for (int i = 0; i < n; ++i) {
    ASSERT_FLOAT_EQ(y[i], expected[i]) << "at i=" << i;
  }
}

}  // namespace
}  // namespace tandem::cuda_tests
