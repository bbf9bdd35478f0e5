// cudasim's CUDA Graphs (Note [cudasim graphs] in runtime.cc): what a capture records runs only
// at cudaGraphLaunch, with the arguments it was captured with and on the memory's contents at
// replay; other streams join through events (fork and join); what CUDA forbids during a capture
// fails with CUDA's error and invalidates it; the counters count a replay as one graph launch.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

#include "tools/cudasim/counters.h"
#include "tools/cudasim/tests/sim_kernels.h"

namespace cudasim_tests {
namespace {

constexpr int kN = 1000;

class GraphTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    for (float** buffer : {&x_, &y_, &z_}) {
      ASSERT_EQ(cudaMalloc(buffer, kN * sizeof(float)), cudaSuccess);
    }
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
    ASSERT_EQ(cudaStreamCreate(&side_), cudaSuccess);
    ASSERT_EQ(cudaEventCreate(&fork_), cudaSuccess);
    ASSERT_EQ(cudaEventCreate(&join_), cudaSuccess);
  }
  void TearDown() override {
    if (exec_ != nullptr) EXPECT_EQ(cudaGraphExecDestroy(exec_), cudaSuccess);
    if (graph_ != nullptr) EXPECT_EQ(cudaGraphDestroy(graph_), cudaSuccess);
    EXPECT_EQ(cudaEventDestroy(fork_), cudaSuccess);
    EXPECT_EQ(cudaEventDestroy(join_), cudaSuccess);
    EXPECT_EQ(cudaStreamDestroy(stream_), cudaSuccess);
    EXPECT_EQ(cudaStreamDestroy(side_), cudaSuccess);
    for (float* buffer : {x_, y_, z_}) EXPECT_EQ(cudaFree(buffer), cudaSuccess);
    cudaGetLastError();
  }

  void Fill(float* device, float value) {
    std::vector<float> host(kN, value);
    ASSERT_EQ(cudaMemcpy(device, host.data(), kN * sizeof(float), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  std::vector<float> Read(const float* device) {
    std::vector<float> host(kN);
    EXPECT_EQ(cudaMemcpy(host.data(), device, kN * sizeof(float), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return host;
  }
  size_t Nodes() {
    size_t n = 0;
    EXPECT_EQ(cudaGraphGetNodes(graph_, nullptr, &n), cudaSuccess);
    return n;
  }
  cudaStreamCaptureStatus Status(cudaStream_t stream) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    EXPECT_EQ(cudaStreamIsCapturing(stream, &status), cudaSuccess);
    return status;
  }

  float *x_ = nullptr, *y_ = nullptr, *z_ = nullptr;
  cudaStream_t stream_ = nullptr, side_ = nullptr;
  cudaEvent_t fork_ = nullptr, join_ = nullptr;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

TEST_F(GraphTest, ReplayRerunsTheCapturedWorkOnTodaysData) {
  Fill(x_, 1.0f);
  Fill(y_, 0.0f);
  ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(Status(stream_), cudaStreamCaptureStatusActive);
  ASSERT_EQ(SlowAddOne(x_, y_, kN, 0, stream_), cudaSuccess);  // y = x + 1
  ASSERT_EQ(cudaMemcpyAsync(z_, y_, kN * sizeof(float), cudaMemcpyDeviceToDevice, stream_),
            cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(x_, 0, kN * sizeof(float), stream_), cudaSuccess);
  ASSERT_EQ(cudaStreamEndCapture(stream_, &graph_), cudaSuccess);
  EXPECT_EQ(Status(stream_), cudaStreamCaptureStatusNone);
  EXPECT_EQ(Nodes(), 3u);
  // Nothing ran during the capture.
  EXPECT_EQ(Read(y_)[0], 0.0f);
  EXPECT_EQ(Read(x_)[0], 1.0f);

  ASSERT_EQ(cudaGraphInstantiate(&exec_, graph_, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphDestroy(graph_), cudaSuccess);  // the executable graph keeps its own copy
  graph_ = nullptr;
  for (float input : {1.0f, 5.0f, -2.5f}) {
    Fill(x_, input);
    ASSERT_EQ(cudaGraphLaunch(exec_, stream_), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    const std::vector<float> z = Read(z_), x = Read(x_);
    for (int i = 0; i < kN; ++i) {
      ASSERT_EQ(z[i], input + 1.0f) << i;
      ASSERT_EQ(x[i], 0.0f) << i;
    }
  }
}

TEST_F(GraphTest, StreamsForkAndJoinThroughEvents) {
  Fill(x_, 3.0f);
  ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(fork_, stream_), cudaSuccess);
  EXPECT_EQ(Status(side_), cudaStreamCaptureStatusNone);
  ASSERT_EQ(cudaStreamWaitEvent(side_, fork_, 0), cudaSuccess);  // side joins the capture
  EXPECT_EQ(Status(side_), cudaStreamCaptureStatusActive);
  unsigned long long main_id = 0, side_id = 0;
  cudaStreamCaptureStatus status;
  ASSERT_EQ(cudaStreamGetCaptureInfo(stream_, &status, &main_id), cudaSuccess);
  ASSERT_EQ(cudaStreamGetCaptureInfo(side_, &status, &side_id), cudaSuccess);
  EXPECT_EQ(main_id, side_id);
  // The side branch is slow; the main stream's last kernel reads its result.
  ASSERT_EQ(SlowAddOne(x_, y_, kN, 2000000, side_), cudaSuccess);  // y = x + 1
  ASSERT_EQ(cudaEventRecord(join_, side_), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(stream_, join_, 0), cudaSuccess);
  ASSERT_EQ(SlowAddOne(y_, z_, kN, 0, stream_), cudaSuccess);  // z = y + 1
  ASSERT_EQ(cudaStreamEndCapture(stream_, &graph_), cudaSuccess);
  EXPECT_EQ(Status(side_), cudaStreamCaptureStatusNone);
  EXPECT_EQ(Nodes(), 2u);  // events order nodes; they are not nodes themselves
  ASSERT_EQ(cudaGraphInstantiate(&exec_, graph_), cudaSuccess);
  for (int replay = 0; replay < 3; ++replay) {
    Fill(y_, 0.0f);
    ASSERT_EQ(cudaGraphLaunch(exec_, stream_), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    EXPECT_EQ(Read(z_)[kN - 1], 5.0f);
  }
}

TEST_F(GraphTest, AForkNotJoinedBackFailsTheCapture) {
  ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(fork_, stream_), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(side_, fork_, 0), cudaSuccess);
  ASSERT_EQ(SlowAddOne(x_, y_, kN, 0, side_), cudaSuccess);
  EXPECT_EQ(cudaStreamEndCapture(side_, &graph_), cudaErrorStreamCaptureUnmatched);
  EXPECT_EQ(cudaStreamEndCapture(stream_, &graph_), cudaErrorStreamCaptureUnjoined);
  EXPECT_EQ(graph_, nullptr);
  EXPECT_EQ(Status(side_), cudaStreamCaptureStatusNone);
}

TEST_F(GraphTest, SynchronizingACapturingStreamInvalidatesTheCapture) {
  ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_EQ(SlowAddOne(x_, y_, kN, 0, stream_), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream_), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(Status(stream_), cudaStreamCaptureStatusInvalidated);
  EXPECT_EQ(SlowAddOne(x_, y_, kN, 0, stream_), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(cudaMemsetAsync(x_, 0, 4, stream_), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(cudaStreamEndCapture(stream_, &graph_), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(graph_, nullptr);
  // The stream works as before afterwards (once the last error is read).
  EXPECT_EQ(cudaGetLastError(), cudaErrorStreamCaptureInvalidated);
  Fill(x_, 1.0f);
  ASSERT_EQ(SlowAddOne(x_, y_, kN, 0, stream_), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  EXPECT_EQ(Read(y_)[0], 2.0f);
}

TEST_F(GraphTest, UnsafeCallsFollowTheCaptureMode) {
  float* extra = nullptr;
  // Global: forbidden on this thread and on others.
  ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal), cudaSuccess);
  cudaError_t other_thread = cudaSuccess;
  std::thread([&] { other_thread = cudaMalloc(&extra, 256); }).join();
  EXPECT_EQ(other_thread, cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(Status(stream_), cudaStreamCaptureStatusInvalidated);
  EXPECT_EQ(cudaStreamEndCapture(stream_, &graph_), cudaErrorStreamCaptureInvalidated);

  ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&extra, 256), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(cudaStreamEndCapture(stream_, &graph_), cudaErrorStreamCaptureInvalidated);

  // Thread-local: other threads may; a relaxed thread may, even in a global capture.
  ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  std::thread([&] {
    other_thread = cudaMalloc(&extra, 256);
    if (other_thread == cudaSuccess) other_thread = cudaFree(extra);
  }).join();
  EXPECT_EQ(other_thread, cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(cudaStreamEndCapture(stream_, &graph_), cudaErrorStreamCaptureInvalidated);

  ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal), cudaSuccess);
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  ASSERT_EQ(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);
  EXPECT_EQ(mode, cudaStreamCaptureModeGlobal);
  ASSERT_EQ(cudaMalloc(&extra, 256), cudaSuccess);
  ASSERT_EQ(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);
  cudaGetLastError();  // the failures above
  ASSERT_EQ(SlowAddOne(x_, y_, kN, 0, stream_), cudaSuccess);
  EXPECT_EQ(cudaStreamEndCapture(stream_, &graph_), cudaSuccess);
  EXPECT_EQ(cudaFree(extra), cudaSuccess);

  // A global capture must end on the thread that began it.
  cudaGraph_t other = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(side_, cudaStreamCaptureModeGlobal), cudaSuccess);
  std::thread([&] { other_thread = cudaStreamEndCapture(side_, &other); }).join();
  EXPECT_EQ(other_thread, cudaErrorStreamCaptureWrongThread);
  ASSERT_EQ(cudaStreamEndCapture(side_, &other), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(other), cudaSuccess);
  EXPECT_EQ(cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeGlobal),
            cudaErrorStreamCaptureUnsupported);
}

TEST_F(GraphTest, HostCopiesOnlyFromPinnedMemory) {
  std::vector<float> pageable(kN, 7.0f);
  ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(
      cudaMemcpyAsync(x_, pageable.data(), kN * sizeof(float), cudaMemcpyHostToDevice, stream_),
      cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(cudaStreamEndCapture(stream_, &graph_), cudaErrorStreamCaptureInvalidated);

  EXPECT_EQ(cudaGetLastError(), cudaErrorStreamCaptureInvalidated);
  float* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned, kN * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(x_, pinned, kN * sizeof(float), cudaMemcpyHostToDevice, stream_),
            cudaSuccess);
  ASSERT_EQ(SlowAddOne(x_, y_, kN, 0, stream_), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(pinned, y_, kN * sizeof(float), cudaMemcpyDeviceToHost, stream_),
            cudaSuccess);
  ASSERT_EQ(cudaStreamEndCapture(stream_, &graph_), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec_, graph_), cudaSuccess);
  for (int i = 0; i < kN; ++i) pinned[i] = static_cast<float>(i);
  ASSERT_EQ(cudaGraphLaunch(exec_, stream_), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec_, stream_), cudaSuccess);  // reads what the first wrote
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  for (int i = 0; i < kN; ++i) ASSERT_EQ(pinned[i], i + 2.0f) << i;
  ASSERT_EQ(cudaFreeHost(pinned), cudaSuccess);
}

TEST_F(GraphTest, EventsOfACaptureCannotBeQueriedAndOutsideEventsNotWaitedFor) {
  ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(fork_, stream_), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(fork_), cudaErrorCapturedEvent);
  EXPECT_EQ(cudaStreamEndCapture(stream_, &graph_), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(cudaEventQuery(fork_), cudaSuccess);  // the capture is over

  ASSERT_EQ(cudaEventRecord(join_, side_), cudaSuccess);  // outside any capture
  ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(cudaStreamWaitEvent(stream_, join_, 0), cudaErrorStreamCaptureIsolation);
  EXPECT_EQ(cudaStreamEndCapture(stream_, &graph_), cudaErrorStreamCaptureInvalidated);

  // Two captures cannot merge.
  cudaGraph_t other = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(side_, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(cudaStreamBeginCapture(side_, cudaStreamCaptureModeGlobal), cudaErrorIllegalState);
  ASSERT_EQ(cudaEventRecord(fork_, stream_), cudaSuccess);
  EXPECT_EQ(cudaStreamWaitEvent(side_, fork_, 0), cudaErrorStreamCaptureMerge);
  EXPECT_EQ(cudaStreamEndCapture(side_, &other), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(cudaStreamEndCapture(stream_, &graph_), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(cudaStreamEndCapture(stream_, &graph_), cudaErrorIllegalState);
}

TEST_F(GraphTest, CountersCountAReplayAsOneGraphLaunch) {
  cublasHandle_t handle = nullptr;
  ASSERT_EQ(cublasCreate(&handle), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasSetStream(handle, stream_), CUBLAS_STATUS_SUCCESS);
  Fill(x_, 1.0f);
  const float alpha = 1.0f, beta = 0.0f;
  cudasim::ResetCounters();
  ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_EQ(SlowAddOne(x_, y_, kN, 0, stream_), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(z_, 0, kN * sizeof(float), stream_), cudaSuccess);
  ASSERT_EQ(
      cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &alpha, x_, 8, y_, 8, &beta, z_, 8),
      CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cudaStreamEndCapture(stream_, &graph_), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec_, graph_), cudaSuccess);
  cudasim::Counters counted = cudasim::SnapshotCounters();
  EXPECT_EQ(counted.launches, 0);  // capturing launches nothing
  EXPECT_EQ(counted.graph_launches, 0);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(cudaGraphLaunch(exec_, stream_), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  counted = cudasim::SnapshotCounters();
  EXPECT_EQ(counted.launches, 0);
  EXPECT_EQ(counted.graph_launches, 3);
  EXPECT_EQ(counted.graph_kernels, 6);  // the kernel and the GEMM, three times
  EXPECT_EQ(counted.host_syncs, 1);
  EXPECT_EQ(Read(z_)[0], 16.0f);  // y = x + 1 = 2, then z = x y: 8 products of 1 and 2
  ASSERT_EQ(cublasDestroy(handle), CUBLAS_STATUS_SUCCESS);
}

TEST_F(GraphTest, BadHandlesAreRefused) {
  EXPECT_EQ(cudaGraphLaunch(nullptr, stream_), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaGraphInstantiate(&exec_, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cudaStreamEndCapture(stream_, &graph_), cudaErrorIllegalState);
  EXPECT_EQ(cudaGraphDestroy(nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGraphExecDestroy(nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cudaStreamBeginCapture(stream_, static_cast<cudaStreamCaptureMode>(7)),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace cudasim_tests
