// CUDAGraph (cuda_graph.h) on cuda:0: a captured training step replayed on new batches equals
// the same steps run eagerly, bit for bit; a replay is one launch; what a capture allocates is
// nobody else's until reset(); what a capture forbids (host reads, random draws, the compute
// stream, CPU devices) fails clearly. Skips without a CUDA device (runs under cudasim).
#include "tensor/cuda/cuda_graph.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "tensor/cuda/cuda.h"
#include "tensor/runtime/allocator.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"
#include "tools/cuda/device_counters.h"

namespace tandem::cuda {
namespace {

using ::tandem::testing::MaxAbsDiff;
using ::testing::HasSubstr;

const Device kGpu = Device::Cuda(0);

#define SKIP_WITHOUT_CUDA()                                                        \
  do {                                                                             \
    if (!IsAvailable()) GTEST_SKIP() << "no CUDA device: " << UnavailableReason(); \
  } while (false)

std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& error) {
    return error.what();
  }
  return "(no error)";
}

// A two-layer MLP with a LayerNorm trained by plain gradient descent, its gradients set to none
// before each step (so that backward allocates them: in a capture, from the graph's pool). The
// norm's backward is one launch whose blocks count arrivals on the capture's own counters
// (Note [Stream semaphores], cuda_device.h), replayed on another stream.
struct Mlp {
  std::vector<Tensor> params;

  explicit Mlp(Device device) {
    manual_seed(7);
    for (const Shape& shape : {Shape{6, 16}, Shape{16}, Shape{16, 3}, Shape{16}, Shape{16}}) {
      Tensor p = (randn(shape) * 0.3).to(device);
      p.set_requires_grad(true);
      params.push_back(p);
    }
  }

  Tensor Step(const Tensor& x, const Tensor& y) {
    for (Tensor& p : params) p.set_grad(Tensor());
    const Tensor hidden =
        relu(layer_norm(matmul(x, params[0]) + params[1], {16}, params[3], params[4]));
    const Tensor loss = mse_loss(matmul(hidden, params[2]), y);
    loss.backward();
    NoGradGuard no_grad;
    for (Tensor& p : params) p.sub_(p.grad() * 0.1);
    return loss.detach();
  }
};

Tensor Batch(int step, const Shape& shape) {
  manual_seed(100 + step);
  return randn(shape);
}

TEST(CudaGraphTest, ReplayedTrainingStepEqualsEagerBitForBit) {
  SKIP_WITHOUT_CUDA();
  Mlp eager(kGpu), graphed(kGpu);
  const Shape x_shape{8, 6}, y_shape{8, 3};
  Tensor static_x = zeros(x_shape, TensorOptions().device(kGpu));
  Tensor static_y = zeros(y_shape, TensorOptions().device(kGpu));
  const tandem::Stream side = SideStream(kGpu);
  side.Wait(CurrentStream(kGpu));
  CUDAGraph graph;
  Tensor static_loss;
  constexpr int kWarmup = 2;
  {
    StreamGuard guard(side);
    for (int step = 0; step < kWarmup; ++step) {
      static_x.copy_(Batch(step, x_shape));
      static_y.copy_(Batch(1000 + step, y_shape));
      graphed.Step(static_x, static_y);
    }
    CUDAGraphCapture capture(graph, kGpu);
    static_loss = graphed.Step(static_x, static_y);
  }
  CurrentStream(kGpu).Wait(side);
  EXPECT_TRUE(graph.captured());
  EXPECT_GT(graph.num_nodes(), 10);
  for (int step = 0; step < kWarmup; ++step) {
    eager.Step(Batch(step, x_shape).to(kGpu), Batch(1000 + step, y_shape).to(kGpu));
  }
  for (int step = kWarmup; step < kWarmup + 4; ++step) {
    SCOPED_TRACE(step);
    const Tensor x = Batch(step, x_shape), y = Batch(1000 + step, y_shape);
    const Tensor want = eager.Step(x.to(kGpu), y.to(kGpu));
    static_x.copy_(x);
    static_y.copy_(y);
    ResetDeviceCounters();
    graph.replay();
    const DeviceCounters counted = ReadDeviceCounters();
    if (counted.counted) {
      EXPECT_EQ(counted.launches, 0);
      EXPECT_EQ(counted.graph_launches, 1);
      EXPECT_GT(counted.graph_kernels, 10);  // every kernel of the step, in one launch
      EXPECT_LE(counted.graph_kernels, graph.num_nodes());
    }
    EXPECT_EQ(MaxAbsDiff(static_loss.to(Device::Cpu()), want.to(Device::Cpu())), 0.0);
    for (size_t i = 0; i < eager.params.size(); ++i) {
      EXPECT_EQ(MaxAbsDiff(graphed.params[i].detach().to(Device::Cpu()),
                           eager.params[i].detach().to(Device::Cpu())),
                0.0)
          << "parameter " << i;
    }
  }
  graph.reset();
  EXPECT_FALSE(graph.captured());
  // The tensors the capture made outlive the graph.
  EXPECT_EQ(static_loss.to(Device::Cpu()).numel(), 1);
}

TEST(CudaGraphTest, CapturedMemoryIsNobodyElsesUntilReset) {
  SKIP_WITHOUT_CUDA();
  const tandem::Stream side = SideStream(kGpu);
  side.Wait(CurrentStream(kGpu));
  StreamGuard guard(side);
  const Tensor x = ones({1000}, TensorOptions().device(kGpu));
  const Tensor warm = x * 2.0;  // the side stream's segment exists before the capture
  CUDAGraph graph;
  const void* temporary = nullptr;
  {
    CUDAGraphCapture capture(graph, kGpu);
    const Tensor t = x * 3.0;  // freed during the capture, written by every replay
    temporary = t.raw_data();
  }
  std::vector<Tensor> after;
  for (int i = 0; i < 8; ++i) {
    after.push_back(x * 4.0);
    EXPECT_NE(after.back().raw_data(), temporary);
  }
  after.clear();
  // Its segment stays while the graph lives, even through EmptyCache, and goes once reset.
  tandem::EmptyCache(kGpu);
  const int64_t reserved = tandem::GetMemoryStats(kGpu).reserved_bytes;
  graph.reset();
  tandem::EmptyCache(kGpu);
  EXPECT_LT(tandem::GetMemoryStats(kGpu).reserved_bytes, reserved);
}

TEST(CudaGraphTest, AHostReadDuringCaptureFailsTheCapture) {
  SKIP_WITHOUT_CUDA();
  const tandem::Stream side = SideStream(kGpu);
  StreamGuard guard(side);
  const Tensor x = ones({4}, TensorOptions().device(kGpu));
  CUDAGraph graph;
  graph.capture_begin(kGpu);
  const Tensor s = sum(x * 2.0);
  EXPECT_THAT(ErrorOf([&] { s.item(); }), HasSubstr("during a CUDA Graph capture"));
  const std::string error = ErrorOf([&] { graph.capture_end(); });
  EXPECT_THAT(error, HasSubstr("the capture failed"));
  EXPECT_THAT(error, HasSubstr("a copy to the host"));
  EXPECT_FALSE(graph.captured());
  EXPECT_THAT(ErrorOf([&] { graph.replay(); }), HasSubstr("nothing captured"));
  // The device and the stream work as before.
  EXPECT_EQ(sum(x * 2.0).item(), 8.0);
  // The scoped form abandons the capture when the error leaves its scope.
  EXPECT_THAT(ErrorOf([&] {
                CUDAGraphCapture capture(graph, kGpu);
                sum(x).item();
              }),
              HasSubstr("during a CUDA Graph capture"));
  EXPECT_FALSE(graph.capturing());
  EXPECT_EQ(sum(x).item(), 4.0);
}

TEST(CudaGraphTest, RandomDrawsDuringCaptureAreRefused) {
  SKIP_WITHOUT_CUDA();
  const tandem::Stream side = SideStream(kGpu);
  StreamGuard guard(side);
  const Tensor x = ones({64}, TensorOptions().device(kGpu));
  CUDAGraph graph;
  EXPECT_THAT(ErrorOf([&] {
                CUDAGraphCapture capture(graph, kGpu);
                dropout(x, 0.5, /*training=*/true);
              }),
              HasSubstr("every replay would draw the same numbers"));
  // Without a capture, and with p = 0 under one, dropout works.
  EXPECT_EQ(dropout(x, 0.5, true).numel(), 64);
  {
    CUDAGraphCapture capture(graph, kGpu);
    dropout(x, 0.0, true);
  }
  EXPECT_TRUE(graph.captured());
}

TEST(CudaGraphTest, RefusesCpuDevicesTheComputeStreamAndMisuse) {
  SKIP_WITHOUT_CUDA();
  CUDAGraph graph;
  EXPECT_THAT(ErrorOf([&] { graph.capture_begin(Device::Cpu()); }),
              HasSubstr("runs its kernels on the host"));
  EXPECT_THAT(ErrorOf([&] { graph.capture_begin(kGpu); }), HasSubstr("capture on a side stream"));
  EXPECT_THAT(ErrorOf([&] { graph.capture_end(); }), HasSubstr("no capture is underway"));
  StreamGuard guard(SideStream(kGpu));
  graph.capture_begin(kGpu);
  EXPECT_THAT(ErrorOf([&] { graph.capture_begin(kGpu); }), HasSubstr("capturing already"));
  EXPECT_THAT(ErrorOf([&] { graph.replay(); }), HasSubstr("still underway"));
  graph.capture_end();
  EXPECT_EQ(graph.num_nodes(), 0);
  graph.replay();  // an empty graph is a valid one
  EXPECT_THAT(ErrorOf([&] { graph.capture_begin(kGpu); }), HasSubstr("call reset()"));
}

}  // namespace
}  // namespace tandem::cuda
