// Links cuBLAS and NCCL from @local_cuda. ncclGetVersion works without a GPU;
// cublasCreate needs a driver and a device, so that part skips without one.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <cstdio>

namespace {

TEST(CudaLibsTest, NcclVersion) {
  int version = 0;
  ASSERT_EQ(ncclGetVersion(&version), ncclSuccess);
  std::printf("NCCL version code %d\n", version);
  EXPECT_GE(version, 20000);
}

TEST(CudaLibsTest, CublasHandle) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    std::printf("Skipping cuBLAS test: %s\n",
                err != cudaSuccess ? cudaGetErrorString(err) : "no CUDA device");
    GTEST_SKIP() << "no usable CUDA device";
  }
  cublasHandle_t handle = nullptr;
  ASSERT_EQ(cublasCreate(&handle), CUBLAS_STATUS_SUCCESS);
  int version = 0;
  EXPECT_EQ(cublasGetVersion(handle, &version), CUBLAS_STATUS_SUCCESS);
  EXPECT_GT(version, 0);
  EXPECT_EQ(cublasDestroy(handle), CUBLAS_STATUS_SUCCESS);
}

}  // namespace
