// Builds with and without CUDA (if_cuda() in BUILD picks deps and defines).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#if TANDEM_WITH_CUDA
#include "tools/cuda/tests/saxpy.h"
#endif

namespace {

TEST(IfCudaTest, BuildsEitherWay) {
#if TANDEM_WITH_CUDA
  std::string reason;
  int count = tandem::cuda_tests::CudaDeviceCount(&reason);
  if (count <= 0) {
    std::printf("CUDA build, but no usable device: %s\n", reason.c_str());
    GTEST_SKIP() << (count < 0 ? reason : "no CUDA device");
  }
  float x[3] = {1, 2, 3};
  float y[3] = {1, 1, 1};
  ASSERT_EQ(tandem::cuda_tests::SaxpyOnDevice(2.0f, x, y, 3), "");
  EXPECT_FLOAT_EQ(y[2], 7.0f);
#else
  std::printf("CPU-only build (--//tools/cuda:enabled=false)\n");
  SUCCEED();
#endif
}

}  // namespace
