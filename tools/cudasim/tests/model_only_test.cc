// cudasim's model-only mode (Note [cudasim model-only mode] in runtime.cc): the same kernels,
// GEMMs, copies, syncs and graph replays give the same counters with the mode on as off, while
// the kernels' and GEMMs' outputs stay as they were (their bodies did not run) and copies and
// memsets still run.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "tools/cudasim/counters.h"
#include "tools/cudasim/tests/sim_kernels.h"

namespace cudasim_tests {
namespace {

constexpr int kN = 1024;  // floats per buffer; 32 x 32 for the GEMMs

// The float whose four bytes are all `byte` (what cudaMemset leaves).
float Pattern(unsigned char byte) {
  float value;
  std::memset(&value, byte, sizeof(value));
  return value;
}

// What the mode must not change, and the buffers' contents afterwards.
struct Sequence {
  cudasim::Counters counters;
  std::vector<float> copied;  // x: copied in, untouched by kernels
  std::vector<float> kernel;  // y: written by kernels only
  std::vector<float> gemm;    // c: written by cublasSgemm only
  std::vector<float> graph;   // z: a graph's memset, then its kernel
};

// A fixed sequence: a copy in, three kernels of two names, an SGEMM, a bf16 GemmEx, a stream
// capture of a memset and a kernel replayed twice, and copies out. y, c and z are memset to
// 0x7f (a large positive float) first, so that whatever did not run leaves that pattern.
Sequence RunSequence(bool model_only) {
  Sequence run;
  cudasim::SetModelOnly(model_only);
  float *x = nullptr, *y = nullptr, *c = nullptr, *z = nullptr;
  uint16_t *a16 = nullptr, *c16 = nullptr;
  EXPECT_EQ(cudaMalloc(&x, kN * sizeof(float)), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&y, kN * sizeof(float)), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&c, kN * sizeof(float)), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&z, kN * sizeof(float)), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&a16, kN * sizeof(uint16_t)), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&c16, kN * sizeof(uint16_t)), cudaSuccess);
  cudaStream_t stream = nullptr;
  EXPECT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  cublasHandle_t handle = nullptr;
  EXPECT_EQ(cublasCreate(&handle), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasSetStream(handle, stream), CUBLAS_STATUS_SUCCESS);
  std::vector<float> host(kN);
  for (int i = 0; i < kN; ++i) host[i] = static_cast<float>(i % 7) - 3.0f;
  const std::vector<uint16_t> ones16(kN, 0x3f80);  // bfloat16 1.0
  for (float* buffer : {y, c, z}) {
    EXPECT_EQ(cudaMemset(buffer, 0x7f, kN * sizeof(float)), cudaSuccess);
  }
  EXPECT_EQ(cudaMemcpy(a16, ones16.data(), kN * sizeof(uint16_t), cudaMemcpyHostToDevice),
            cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudasim::ResetCounters();

  EXPECT_EQ(cudaMemcpyAsync(x, host.data(), kN * sizeof(float), cudaMemcpyHostToDevice, stream),
            cudaSuccess);
  EXPECT_EQ(ReverseInBlocks(x, y, 4, 256, stream), cudaSuccess);
  EXPECT_EQ(ReverseInBlocks(x, y, 2, 256, stream), cudaSuccess);
  EXPECT_EQ(SlowAddOne(x, y, kN, 0, stream), cudaSuccess);
  // A launch that fails its configuration check fails the same way in the mode.
  EXPECT_EQ(EmptyKernel(2048, 0, stream), cudaErrorInvalidConfiguration);
  const float alpha = 1.0f, beta = 0.0f;
  EXPECT_EQ(
      cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, 32, 32, 32, &alpha, x, 32, x, 32, &beta, c, 32),
      CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_T, 32, 32, 32, &alpha, a16, CUDA_R_16BF, 32,
                         a16, CUDA_R_16BF, 32, &beta, c16, CUDA_R_16BF, 32, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_SUCCESS);

  // A captured memset and kernel, replayed twice: the memset runs in the mode, the kernel not.
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  EXPECT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(cudaMemsetAsync(z, 0, kN * sizeof(float), stream), cudaSuccess);
  EXPECT_EQ(SlowAddOne(z, z, kN, 0, stream), cudaSuccess);
  EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  EXPECT_EQ(cudaGraphInstantiate(&exec, graph), cudaSuccess);
  EXPECT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  EXPECT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);

  run.copied.resize(kN);
  run.kernel.resize(kN);
  run.gemm.resize(kN);
  run.graph.resize(kN);
  for (auto [to, from] :
       {std::pair{&run.copied, x}, {&run.kernel, y}, {&run.gemm, c}, {&run.graph, z}}) {
    to->resize(kN);
    EXPECT_EQ(cudaMemcpyAsync(to->data(), from, kN * sizeof(float), cudaMemcpyDeviceToHost, stream),
              cudaSuccess);
  }
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  run.counters = cudasim::SnapshotCounters();

  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  EXPECT_EQ(cublasDestroy(handle), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  for (void* buffer : {static_cast<void*>(x), static_cast<void*>(y), static_cast<void*>(c),
                       static_cast<void*>(z), static_cast<void*>(a16), static_cast<void*>(c16)}) {
    EXPECT_EQ(cudaFree(buffer), cudaSuccess);
  }
  cudasim::SetModelOnly(false);
  return run;
}

void ExpectSameCounters(const cudasim::Counters& full, const cudasim::Counters& model) {
  EXPECT_EQ(model.launches, full.launches);
  EXPECT_EQ(model.graph_launches, full.graph_launches);
  EXPECT_EQ(model.graph_kernels, full.graph_kernels);
  EXPECT_EQ(model.host_syncs, full.host_syncs);
  EXPECT_EQ(model.bytes_host_to_device, full.bytes_host_to_device);
  EXPECT_EQ(model.bytes_device_to_host, full.bytes_device_to_host);
  ASSERT_EQ(model.kernels.size(), full.kernels.size());
  for (size_t i = 0; i < full.kernels.size(); ++i) {
    const cudasim::KernelCount &f = full.kernels[i], &m = model.kernels[i];
    SCOPED_TRACE(f.name);
    EXPECT_EQ(m.name, f.name);
    EXPECT_EQ(m.launches, f.launches);
    EXPECT_EQ(m.min_blocks, f.min_blocks);
    EXPECT_EQ(m.max_blocks, f.max_blocks);
    EXPECT_EQ(m.threads_per_block, f.threads_per_block);
    EXPECT_EQ(m.work_counted, f.work_counted);
    EXPECT_EQ(m.flops, f.flops);
    EXPECT_EQ(m.bytes, f.bytes);
    EXPECT_EQ(m.math, f.math);
  }
}

TEST(CudasimModelOnlyTest, CountsTheSameAndRunsNoKernelOrGemm) {
  const Sequence full = RunSequence(false);
  const Sequence model = RunSequence(true);
  EXPECT_FALSE(cudasim::ModelOnly());  // RunSequence turned it off again

  // The sequence counted as expected (counters_test checks the counting itself) ...
  EXPECT_EQ(full.counters.launches, 5);  // 3 kernels, 2 GEMMs
  EXPECT_EQ(full.counters.graph_launches, 2);
  EXPECT_EQ(full.counters.graph_kernels, 2);
  ExpectSameCounters(full.counters, model.counters);

  const float untouched = Pattern(0x7f);
  for (int i = 0; i < kN; ++i) {
    SCOPED_TRACE(i);
    // ... copies ran both ways ...
    ASSERT_EQ(model.copied[i], full.copied[i]);
    // ... kernels and GEMMs only without the mode: with it, their outputs keep the memset ...
    ASSERT_NE(full.kernel[i], untouched);
    ASSERT_EQ(model.kernel[i], untouched);
    ASSERT_NE(full.gemm[i], untouched);
    ASSERT_EQ(model.gemm[i], untouched);
    // ... and a replay runs its memset, not its kernel.
    ASSERT_EQ(full.graph[i], 1.0f);
    ASSERT_EQ(model.graph[i], 0.0f);
  }
}

// A graph captured with the mode off runs no kernel when launched with it on: whether a kernel
// runs is decided when the host launches it (the graph), as documented in counters.h.
TEST(CudasimModelOnlyTest, AGraphCapturedBeforeRunsNoKernelsInTheMode) {
  float* z = nullptr;
  ASSERT_EQ(cudaMalloc(&z, kN * sizeof(float)), cudaSuccess);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(z, 0, kN * sizeof(float), stream), cudaSuccess);
  ASSERT_EQ(SlowAddOne(z, z, kN, 0, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph), cudaSuccess);
  std::vector<float> host(kN);

  cudasim::SetModelOnly(true);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  cudasim::SetModelOnly(false);  // after the launch: the replay still runs no kernel
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(host.data(), z, kN * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(host[0], 0.0f);
  EXPECT_EQ(host[kN - 1], 0.0f);

  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(host.data(), z, kN * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(host[0], 1.0f);
  EXPECT_EQ(host[kN - 1], 1.0f);

  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  EXPECT_EQ(cudaFree(z), cudaSuccess);
}

}  // namespace
}  // namespace cudasim_tests
