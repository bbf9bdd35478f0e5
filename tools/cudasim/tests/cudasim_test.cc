// cudasim's own checks: the device built-ins behave as on a GPU (barriers wait, shuffles
// exchange, shared memory is per block, atomics add up), bugs that a GPU would hide or turn
// into garbage are reported (a missing __syncthreads, a deadlock, a write past a cudaMalloc
// block, bad launch configurations), and streams and events order work.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "tools/cudasim/tests/sim_kernels.h"

namespace cudasim_tests {
namespace {

template <typename T>
T* DeviceCopy(const std::vector<T>& host) {
  T* device = nullptr;
  EXPECT_EQ(cudaMalloc(&device, host.size() * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
            cudaSuccess);
  return device;
}

template <typename T>
std::vector<T> HostCopy(const T* device, size_t n) {
  std::vector<T> host(n);
  EXPECT_EQ(cudaMemcpy(host.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

std::vector<float> Ramp(int n) {
  std::vector<float> x(n);
  for (int i = 0; i < n; ++i) x[i] = static_cast<float>(i % 17) - 8.0f;
  return x;
}

TEST(CudasimTest, TwoSimulatedDevicesByDefault) {
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  EXPECT_EQ(count, 2);
  cudaDeviceProp prop;
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 1), cudaSuccess);
  EXPECT_EQ(prop.warpSize, 32);
  EXPECT_EQ(cudaSetDevice(2), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // not sticky
}

TEST(CudasimTest, BlockReductionWithBarriersAndShuffles) {
  for (int threads : {32, 64, 256, 1024}) {
    const int blocks = 5;
    const std::vector<float> x = Ramp(blocks * threads);
    float* in = DeviceCopy(x);
    float* out = nullptr;
    ASSERT_EQ(cudaMalloc(&out, blocks * sizeof(float)), cudaSuccess);
    ASSERT_EQ(BlockSums(in, out, blocks, threads, nullptr), cudaSuccess);
    const std::vector<float> sums = HostCopy(out, blocks);
    for (int b = 0; b < blocks; ++b) {
      const float expected =
          std::accumulate(x.begin() + b * threads, x.begin() + (b + 1) * threads, 0.0f);
      EXPECT_EQ(sums[b], expected) << "block " << b << " of " << threads << " threads";
    }
    cudaFree(in);
    cudaFree(out);
  }
}

// Without the barriers the threads of a block run each to its end in a shuffled order, so
// some read partial sums their neighbours have not written yet (NaN, from the poisoned
// shared memory): the missing __syncthreads shows as wrong sums instead of passing by luck.
TEST(CudasimTest, MissingSyncthreadsGivesWrongSums) {
  const int blocks = 4, threads = 256;
  const std::vector<float> x = Ramp(blocks * threads);
  float* in = DeviceCopy(x);
  float* out = nullptr;
  ASSERT_EQ(cudaMalloc(&out, blocks * sizeof(float)), cudaSuccess);
  ASSERT_EQ(BlockSums(in, out, blocks, threads, nullptr), cudaSuccess);  // warms shared memory
  ASSERT_EQ(BlockSumsWithoutBarrier(in, out, blocks, threads, nullptr), cudaSuccess);
  const std::vector<float> sums = HostCopy(out, blocks);
  int wrong = 0;
  for (int b = 0; b < blocks; ++b) {
    const float expected =
        std::accumulate(x.begin() + b * threads, x.begin() + (b + 1) * threads, 0.0f);
    wrong += !(sums[b] == expected);
  }
  EXPECT_EQ(wrong, blocks);
  cudaFree(in);
  cudaFree(out);
}

TEST(CudasimTest, ShufflesAndBallots) {
  const int n = 200;  // not a multiple of the block: the last warp has lanes past n
  std::vector<float> x = Ramp(n);
  float* in = DeviceCopy(x);
  float* out = nullptr;
  unsigned* ballot = nullptr;
  ASSERT_EQ(cudaMalloc(&out, n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&ballot, 8 * sizeof(unsigned)), cudaSuccess);
  ASSERT_EQ(WarpSwapAndBallot(in, out, ballot, n, nullptr), cudaSuccess);
  const std::vector<float> swapped = HostCopy(out, n);
  const std::vector<unsigned> votes = HostCopy(ballot, 7);
  for (int i = 0; i < n; ++i) {
    const float expected = (i ^ 1) < n ? x[i ^ 1] : 0.0f;
    EXPECT_EQ(swapped[i], expected) << i;
  }
  for (int w = 0; w < 7; ++w) {
    unsigned expected = 0;
    for (int lane = 0; lane < 32; ++lane) {
      const int i = w * 32 + lane;
      if (i < n && x[i] > 0.0f) expected |= 1u << lane;
    }
    EXPECT_EQ(votes[w], expected) << "warp " << w;
  }
  cudaFree(in);
  cudaFree(out);
  cudaFree(ballot);
}

TEST(CudasimTest, ThreadsRunInAShuffledOrder) {
  const int threads = 256;
  int* order = nullptr;
  ASSERT_EQ(cudaMalloc(&order, (threads + 1) * sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaMemset(order, 0, (threads + 1) * sizeof(int)), cudaSuccess);
  ASSERT_EQ(RecordOrder(order, threads, nullptr), cudaSuccess);
  std::vector<int> seen = HostCopy(order, threads);
  std::vector<int> identity(threads);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_NE(seen, identity);
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, identity);  // each thread ran once
  cudaFree(order);
}

TEST(CudasimTest, AtomicsFromManyStreams) {
  const int n = 10000;
  int* count = nullptr;
  float* fsum = nullptr;
  ASSERT_EQ(cudaMalloc(&count, sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&fsum, sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemset(count, 0, sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaMemset(fsum, 0, sizeof(float)), cudaSuccess);
  std::vector<cudaStream_t> streams(4);
  for (cudaStream_t& s : streams)
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  for (cudaStream_t s : streams) ASSERT_EQ(AtomicCount(count, fsum, n, s), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  // AtomicCount's grid is rounded up to whole blocks of 256.
  const int launched = (n + 255) / 256 * 256 * 4;
  EXPECT_EQ(HostCopy(count, 1)[0], launched);
  EXPECT_EQ(HostCopy(fsum, 1)[0], 0.5f * launched);
  for (cudaStream_t s : streams) EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
  cudaFree(count);
  cudaFree(fsum);
}

TEST(CudasimTest, DynamicSharedMemory) {
  const int blocks = 3, threads = 96;
  const std::vector<float> x = Ramp(blocks * threads);
  float* in = DeviceCopy(x);
  float* out = nullptr;
  ASSERT_EQ(cudaMalloc(&out, x.size() * sizeof(float)), cudaSuccess);
  ASSERT_EQ(ReverseInBlocks(in, out, blocks, threads, nullptr), cudaSuccess);
  const std::vector<float> y = HostCopy(out, x.size());
  for (int b = 0; b < blocks; ++b) {
    for (int t = 0; t < threads; ++t) {
      EXPECT_EQ(y[b * threads + t], x[b * threads + threads - 1 - t]);
    }
  }
  cudaFree(in);
  cudaFree(out);
}

// Past 48 KiB of dynamic shared memory a GPU launches a kernel only after it opted in on that
// device (cudaFuncSetAttribute), up to the device's opt-in limit. BUILD's
// TANDEM_CUDASIM_SHARED_OPTIN_BYTES keeps cuda:0 an H100 (232448) and makes cuda:1 an sm_86
// (101376).
TEST(CudasimTest, SharedMemoryPast48KiBNeedsTheKernelToOptIn) {
  constexpr int kH100 = 232448, kSm86 = 101376, kFloats = (100 << 10) / 4;
  int value = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&value, cudaDevAttrMaxSharedMemoryPerBlock, 0), cudaSuccess);
  EXPECT_EQ(value, 49152);
  ASSERT_EQ(cudaDeviceGetAttribute(&value, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0),
            cudaSuccess);
  EXPECT_EQ(value, kH100);
  const auto expect_round_trip = [](const float* out, int floats) {
    const std::vector<float> y = HostCopy(out, floats);
    int wrong = 0;
    for (int i = 0; i < floats; ++i) wrong += y[i] != static_cast<float>(floats - 1 - i);
    EXPECT_EQ(wrong, 0) << "of " << floats;
  };
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  float* out = nullptr;
  ASSERT_EQ(cudaMalloc(&out, kH100), cudaSuccess);
  // Not opted in: refused at the launch, and the error is not sticky.
  EXPECT_EQ(SharedRoundTrip(out, kFloats, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(OptInSharedRoundTrip(kH100 + 4), cudaErrorInvalidValue);  // past the device's limit
  ASSERT_EQ(OptInSharedRoundTrip(100 << 10), cudaSuccess);
  ASSERT_EQ(SharedRoundTrip(out, kFloats, nullptr), cudaSuccess);
  expect_round_trip(out, kFloats);
  EXPECT_EQ(SharedRoundTrip(out, kFloats + 1, nullptr), cudaErrorInvalidValue);  // past the opt-in
  ASSERT_EQ(OptInSharedRoundTrip(kH100), cudaSuccess);
  ASSERT_EQ(SharedRoundTrip(out, kH100 / 4, nullptr), cudaSuccess);
  expect_round_trip(out, kH100 / 4);
  EXPECT_EQ(cudaFree(out), cudaSuccess);

  int devices = 0;
  ASSERT_EQ(cudaGetDeviceCount(&devices), cudaSuccess);
  if (devices < 2) GTEST_SKIP() << "cuda:1 is not simulated (TANDEM_CUDASIM_DEVICES)";
  cudaDeviceProp prop;
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 1), cudaSuccess);
  EXPECT_EQ(prop.sharedMemPerBlockOptin, static_cast<size_t>(kSm86));
  // What cuda:0 allowed does not carry over: each device's context has its own setting.
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&out, kSm86), cudaSuccess);
  EXPECT_EQ(SharedRoundTrip(out, kFloats, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(OptInSharedRoundTrip(kH100), cudaErrorInvalidValue);
  ASSERT_EQ(OptInSharedRoundTrip(kSm86), cudaSuccess);
  ASSERT_EQ(SharedRoundTrip(out, kSm86 / 4, nullptr), cudaSuccess);
  expect_round_trip(out, kSm86 / 4);
  EXPECT_EQ(cudaFree(out), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
}

TEST(CudasimTest, BadLaunchConfigurationsAreErrors) {
  EXPECT_EQ(EmptyKernel(2048, 0, nullptr), cudaErrorInvalidConfiguration);
  EXPECT_EQ(EmptyKernel(0, 0, nullptr), cudaErrorInvalidConfiguration);
  EXPECT_EQ(EmptyKernel(32, 64 << 10, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(EmptyKernel(1024, 0, nullptr), cudaSuccess);  // the device still works
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

TEST(CudasimTest, CopiesCheckTheirPointers) {
  float* device = nullptr;
  ASSERT_EQ(cudaMalloc(&device, 64 * sizeof(float)), cudaSuccess);
  std::vector<float> host(128);
  EXPECT_EQ(cudaMemcpy(device, host.data(), 128 * sizeof(float), cudaMemcpyHostToDevice),
            cudaErrorInvalidValue);  // larger than the block
  EXPECT_EQ(cudaMemcpy(host.data(), device, 64 * sizeof(float), cudaMemcpyHostToDevice),
            cudaErrorInvalidValue);  // the wrong direction
  EXPECT_EQ(cudaFree(host.data()), cudaErrorInvalidValue);
  cudaGetLastError();
  EXPECT_EQ(cudaFree(device), cudaSuccess);
  EXPECT_EQ(cudaFree(device), cudaErrorInvalidValue);  // twice
  cudaGetLastError();
}

TEST(CudasimTest, StreamWaitEventOrdersStreams) {
  const int n = 4096;
  std::vector<float> x = Ramp(n);
  float* a = DeviceCopy(x);
  float* b = nullptr;
  float* c = nullptr;
  ASSERT_EQ(cudaMalloc(&b, n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&c, n * sizeof(float)), cudaSuccess);
  cudaStream_t first, second;
  cudaEvent_t done;
  ASSERT_EQ(cudaStreamCreateWithFlags(&first, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&second, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(SlowAddOne(a, b, n, 200'000'000, first), cudaSuccess);  // b = a + 1, slowly
  ASSERT_EQ(cudaEventRecord(done, first), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(done), cudaErrorNotReady);
  ASSERT_EQ(cudaStreamWaitEvent(second, done, 0), cudaSuccess);
  ASSERT_EQ(SlowAddOne(b, c, n, 0, second), cudaSuccess);  // c = b + 1 once b is written
  EXPECT_EQ(cudaStreamQuery(second), cudaErrorNotReady);
  ASSERT_EQ(cudaStreamSynchronize(second), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(done), cudaSuccess);
  const std::vector<float> y = HostCopy(c, n);
  for (int i = 0; i < n; ++i) ASSERT_EQ(y[i], x[i] + 2.0f) << i;
  cudaEventDestroy(done);
  cudaStreamDestroy(first);
  cudaStreamDestroy(second);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
}

// Column-major C = A^T B against a loop, as cuBLAS defines it.
TEST(CudasimTest, SgemmIsColumnMajor) {
  const int m = 3, n = 4, k = 5;
  std::vector<float> a(k * m), b(k * n), c(m * n, 1.0f);  // A is k x m (lda = k), B is k x n
  std::mt19937 random(7);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (float& v : a) v = uniform(random);
  for (float& v : b) v = uniform(random);
  float* da = DeviceCopy(a);
  float* db = DeviceCopy(b);
  float* dc = DeviceCopy(c);
  cublasHandle_t handle;
  ASSERT_EQ(cublasCreate(&handle), CUBLAS_STATUS_SUCCESS);
  const float alpha = 2.0f, beta = 0.5f;
  ASSERT_EQ(
      cublasSgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, da, k, db, k, &beta, dc, m),
      CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(
      cublasSgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, da, 1, db, k, &beta, dc, m),
      CUBLAS_STATUS_INVALID_VALUE);  // lda < k
  const std::vector<float> result = HostCopy(dc, m * n);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double expected = 0.5;
      for (int p = 0; p < k; ++p) expected += 2.0 * a[i * k + p] * b[j * k + p];
      EXPECT_NEAR(result[j * m + i], expected, 1e-5) << i << "," << j;
    }
  }
  cublasDestroy(handle);
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
}

// Note [cudasim cuBLAS workspaces]: one handle on two streams needs a workspace per stream.
TEST(CudasimCublasTest, AHandleOnTwoStreamsNeedsAWorkspacePerStream) {
  const int n = 4;
  const std::vector<float> ones(n * n, 1.0f);
  float* da = DeviceCopy(ones);
  float* dc = DeviceCopy(ones);
  cudaStream_t first = nullptr, second = nullptr;
  ASSERT_EQ(cudaStreamCreate(&first), cudaSuccess);
  ASSERT_EQ(cudaStreamCreate(&second), cudaSuccess);
  void* workspaces[2] = {nullptr, nullptr};
  ASSERT_EQ(cudaMalloc(&workspaces[0], 1 << 20), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&workspaces[1], 1 << 20), cudaSuccess);
  const float alpha = 1.0f, beta = 0.0f;
  auto gemm = [&](cublasHandle_t handle) {
    return cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, da, n, da, n, &beta, dc,
                       n);
  };
  // The default pool on two streams: refused on the second.
  cublasHandle_t pooled;
  ASSERT_EQ(cublasCreate(&pooled), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasSetStream(pooled, first), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(gemm(pooled), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasSetStream(pooled, second), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(gemm(pooled), CUBLAS_STATUS_NOT_SUPPORTED);
  cublasDestroy(pooled);
  // One workspace per stream, set after each cublasSetStream: fine.
  cublasHandle_t handle;
  ASSERT_EQ(cublasCreate(&handle), CUBLAS_STATUS_SUCCESS);
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < 2; ++i) {
      ASSERT_EQ(cublasSetStream(handle, i == 0 ? first : second), CUBLAS_STATUS_SUCCESS);
      ASSERT_EQ(cublasSetWorkspace(handle, workspaces[i], 1 << 20), CUBLAS_STATUS_SUCCESS);
      EXPECT_EQ(gemm(handle), CUBLAS_STATUS_SUCCESS);
    }
  }
  // A workspace handed to the other stream: refused.
  ASSERT_EQ(cublasSetStream(handle, first), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasSetWorkspace(handle, workspaces[1], 1 << 20), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(gemm(handle), CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(cublasSetWorkspace(handle, nullptr, 64), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasSetWorkspace(handle, static_cast<char*>(workspaces[0]) + 8, 64),
            CUBLAS_STATUS_INVALID_VALUE);
  cudaDeviceSynchronize();
  EXPECT_EQ(HostCopy(dc, n * n), std::vector<float>(n * n, static_cast<float>(n)));
  cublasDestroy(handle);
  cudaStreamDestroy(first);
  cudaStreamDestroy(second);
  cudaFree(workspaces[0]);
  cudaFree(workspaces[1]);
  cudaFree(da);
  cudaFree(dc);
}

// cudasim's own report of a fault in device memory; under AddressSanitizer, ASan's.
#if defined(__SANITIZE_ADDRESS__)
#define CUDASIM_FAULT(message) "AddressSanitizer: SEGV"
#else
#define CUDASIM_FAULT(message) message
#endif

// A kernel failure makes the device fail every later call (as a GPU's sticky errors do), so
// these run in a child process.
TEST(CudasimDeathTest, DeadlockIsReported) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        int* out = nullptr;
        cudaMalloc(&out, 32 * sizeof(int));
        Deadlock(out, nullptr);
        std::exit(cudaDeviceSynchronize() == cudaErrorLaunchFailure ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "deadlock.*waits in __syncthreads");
}

TEST(CudasimDeathTest, WritePastTheEndOfABlockFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        float* x = nullptr;
        cudaMalloc(&x, 1024 * sizeof(float));
        WritePastEnd(x, 1024, nullptr);
        cudaDeviceSynchronize();
      },
      CUDASIM_FAULT("illegal address .* 0 bytes past the end of a block of 4096 bytes on cuda:0 "
                    "in kernel WritePastEndKernel"));
}

TEST(CudasimDeathTest, UseAfterFreeFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        float* x = nullptr;
        cudaMalloc(&x, 1024 * sizeof(float));
        cudaFree(x);
        WritePastEnd(x, 0, nullptr);
        cudaDeviceSynchronize();
      },
      CUDASIM_FAULT("illegal address .* in device memory already freed"));
}

}  // namespace
}  // namespace cudasim_tests
