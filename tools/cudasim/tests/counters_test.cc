// cudasim's counters (tools/cudasim/counters.h) count a known sequence of CUDA calls exactly:
// kernels per name with their blocks, a cuBLAS GEMM as one launch, the calls that block the host,
// host<->device bytes, an NCCL collective as one launch; and what fails to launch or launches
// nothing is not counted.
#include "tools/cudasim/counters.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <vector>

#include "tools/cudasim/tests/sim_kernels.h"

namespace cudasim_tests {
namespace {

using ::testing::HasSubstr;

const cudasim::KernelCount* Find(const cudasim::Counters& c, const char* name) {
  for (const cudasim::KernelCount& k : c.kernels) {
    if (k.name.find(name) != std::string::npos) return &k;
  }
  return nullptr;
}

TEST(CudasimCountersTest, CountsAKnownSequenceExactly) {
  constexpr int kN = 1024;  // floats in each buffer; 32 x 32 for the GEMM
  float *x = nullptr, *y = nullptr, *c = nullptr;
  ASSERT_EQ(cudaMalloc(&x, kN * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&y, kN * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&c, kN * sizeof(float)), cudaSuccess);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  cublasHandle_t handle = nullptr;
  ASSERT_EQ(cublasCreate(&handle), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasSetStream(handle, stream), CUBLAS_STATUS_SUCCESS);
  cudaEvent_t done = nullptr;
  ASSERT_EQ(cudaEventCreate(&done), cudaSuccess);
  std::vector<float> host(kN, 1.0f);
  cudasim::ResetCounters();

  // Host to device from pageable memory: queued, the host does not wait.
  ASSERT_EQ(cudaMemcpyAsync(x, host.data(), kN * sizeof(float), cudaMemcpyHostToDevice, stream),
            cudaSuccess);
  // Two elementwise-style kernels of one name (4 and 2 blocks of 256), one of another.
  ASSERT_EQ(ReverseInBlocks(x, y, 4, 256, stream), cudaSuccess);
  ASSERT_EQ(ReverseInBlocks(y, x, 2, 256, stream), cudaSuccess);
  ASSERT_EQ(SlowAddOne(x, y, kN, 0, stream), cudaSuccess);
  // One GEMM: one launch; an empty one (m = 0) launches nothing, as in cuBLAS.
  const float alpha = 1.0f, beta = 0.0f;
  ASSERT_EQ(
      cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, 32, 32, 32, &alpha, x, 32, y, 32, &beta, c, 32),
      CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(
      cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, 0, 32, 32, &alpha, x, 1, y, 32, &beta, c, 1),
      CUBLAS_STATUS_SUCCESS);
  // A launch that fails its configuration check never reaches the GPU.
  EXPECT_EQ(EmptyKernel(2048, 0, stream), cudaErrorInvalidConfiguration);
  // What .item() does: a device-to-host copy into pageable memory waits (1 host sync).
  float item = 0.0f;
  ASSERT_EQ(cudaMemcpyAsync(&item, c, sizeof(float), cudaMemcpyDeviceToHost, stream), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(done, stream), cudaSuccess);
  ASSERT_EQ(cudaEventSynchronize(done), cudaSuccess);     // 2
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);  // 3
  ASSERT_EQ(cudaEventQuery(done), cudaSuccess);           // a query does not block: not a sync

  const cudasim::Counters counted = cudasim::SnapshotCounters();
  EXPECT_EQ(counted.launches, 4);
  EXPECT_EQ(counted.host_syncs, 3);
  EXPECT_EQ(counted.bytes_host_to_device, kN * 4);
  EXPECT_EQ(counted.bytes_device_to_host, 4);
  ASSERT_EQ(counted.kernels.size(), 3u);
  EXPECT_THAT(counted.kernels[0].name, HasSubstr("ReverseKernel"));  // most launches first
  const cudasim::KernelCount* reverse = Find(counted, "ReverseKernel");
  ASSERT_NE(reverse, nullptr);
  EXPECT_EQ(reverse->launches, 2);
  EXPECT_EQ(reverse->min_blocks, 2);
  EXPECT_EQ(reverse->max_blocks, 4);
  EXPECT_EQ(reverse->threads_per_block, 256);
  const cudasim::KernelCount* slow = Find(counted, "SlowAddOneKernel");
  ASSERT_NE(slow, nullptr);
  EXPECT_EQ(slow->launches, 1);
  EXPECT_EQ(slow->max_blocks, 4);
  const cudasim::KernelCount* gemm = Find(counted, "cublasSgemm");
  ASSERT_NE(gemm, nullptr);
  EXPECT_EQ(gemm->launches, 1);
  EXPECT_EQ(gemm->max_blocks, 0);  // cuBLAS picks its own grid

  // Synchronous copies and frees block the host too; a reset starts from zero.
  cudasim::ResetCounters();
  ASSERT_EQ(cudaMemcpy(host.data(), y, kN * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(cublasDestroy(handle), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cudaEventDestroy(done), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  ASSERT_EQ(cudaFree(x), cudaSuccess);
  ASSERT_EQ(cudaFree(y), cudaSuccess);
  ASSERT_EQ(cudaFree(c), cudaSuccess);
  const cudasim::Counters after = cudasim::SnapshotCounters();
  EXPECT_EQ(after.launches, 0);
  EXPECT_EQ(after.host_syncs, 5);  // cudaMemcpy, cudaDeviceSynchronize, three cudaFree
  EXPECT_EQ(after.bytes_device_to_host, kN * 4);
  EXPECT_EQ(after.bytes_host_to_device, 0);
  EXPECT_TRUE(after.kernels.empty());
}

// NCCL launches one kernel per collective; inside a group, when the group ends.
TEST(CudasimCountersTest, EachNcclCollectiveIsOneLaunch) {
  ncclComm_t comm = nullptr;
  const int device = 0;
  ASSERT_EQ(ncclCommInitAll(&comm, 1, &device), ncclSuccess);
  float* x = nullptr;
  ASSERT_EQ(cudaMalloc(&x, 64 * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemset(x, 0, 64 * sizeof(float)), cudaSuccess);
  cudasim::ResetCounters();
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclAllReduce(x, x, 64, ncclFloat, ncclSum, comm, nullptr), ncclSuccess);
  ASSERT_EQ(ncclBroadcast(x, x, 64, ncclFloat, 0, comm, nullptr), ncclSuccess);
  EXPECT_EQ(cudasim::SnapshotCounters().launches, 0);  // deferred to ncclGroupEnd
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  ASSERT_EQ(ncclAllReduce(x, x, 0, ncclFloat, ncclSum, comm, nullptr), ncclSuccess);  // no-op
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const cudasim::Counters counted = cudasim::SnapshotCounters();
  EXPECT_EQ(counted.launches, 2);
  EXPECT_EQ(counted.host_syncs, 1);
  ASSERT_NE(Find(counted, "ncclAllReduce"), nullptr);
  EXPECT_EQ(Find(counted, "ncclAllReduce")->launches, 1);
  ASSERT_NE(Find(counted, "ncclBroadcast"), nullptr);
  EXPECT_EQ(Find(counted, "ncclBroadcast")->launches, 1);
  ASSERT_EQ(cudaFree(x), cudaSuccess);
  ASSERT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

}  // namespace
}  // namespace cudasim_tests
