// Benchmarks of the CUDA backend against the hardware's own yardsticks, timed with CUDA
// events on the device's stream (manual time: the GPU's time, not the host's):
//   - SGEMM through Backend::Gemm vs cublasSgemm called directly (TFLOP/s): the backend's
//     row-major wrapper should cost nothing.
//   - Elementwise add vs a device-to-device cudaMemcpy (GB/s of reads + writes): a
//     bandwidth-bound kernel should get close to the copy engine.
//   - Host <-> device copies from pinned and pageable memory (GB/s).
//   - Fused causal attention at GPT-2's shapes (8 x 12 heads of 1024 tokens) in bfloat16 on
//     tensor cores, forward and backward (TFLOP/s, counting the causal half of the products as
//     FlashAttention does: forward 2 GEMMs, backward 5 of their size).
// Linked into //tensor:tensor_benchmark (and //tensor/cuda:cuda_benchmarks); every
// benchmark reports an error and skips where there is no usable GPU.
//
//   bazel run -c opt //tensor/cuda:cuda_benchmarks -- --benchmark_filter=Sgemm
#include <benchmark/benchmark.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensor/base/device.h"
#include "tensor/cuda/cuda.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/kernels/attention_kernels.h"
#include "tensor/runtime/allocator.h"
#include "tensor/runtime/backend.h"

namespace tandem {
namespace cuda {
namespace {

constexpr int kDevice = 0;

// Skips the benchmark (with the reason) when there is no GPU; returns whether it may run.
bool RequireGpu(benchmark::State& state) {
  if (DeviceCount() > 0) return true;
  state.SkipWithError(("no usable CUDA device: " + UnavailableReason()).c_str());
  return false;
}

cudaStream_t DeviceStream() { return static_cast<cudaStream_t>(Stream(kDevice)); }

// Times work queued on the device's stream between Start and Stop.
class StreamTimer {
 public:
  StreamTimer() {
    TANDEM_CUDA_CHECK(cudaEventCreate(&start_), kDevice);
    TANDEM_CUDA_CHECK(cudaEventCreate(&stop_), kDevice);
  }
  ~StreamTimer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  void Start() { TANDEM_CUDA_CHECK(cudaEventRecord(start_, DeviceStream()), kDevice); }
  double StopSeconds() {
    TANDEM_CUDA_CHECK(cudaEventRecord(stop_, DeviceStream()), kDevice);
    TANDEM_CUDA_CHECK(cudaEventSynchronize(stop_), kDevice);
    float milliseconds = 0.0f;
    TANDEM_CUDA_CHECK(cudaEventElapsedTime(&milliseconds, start_, stop_), kDevice);
    return milliseconds * 1e-3;
  }

 private:
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
};

// Runs `work` once to warm up, then times each iteration with events on the device's stream.
template <typename Work>
void TimeOnStream(benchmark::State& state, Work&& work) {
  work();
  StreamTimer timer;
  for (auto _ : state) {
    timer.Start();
    work();
    state.SetIterationTime(timer.StopSeconds());
  }
}

std::shared_ptr<void> DeviceBuffer(size_t bytes) {
  return GetAllocator(Device::Cuda(kDevice)).Allocate(bytes);
}

void SetRate(benchmark::State& state, const char* name, double per_iteration) {
  state.counters[name] =
      benchmark::Counter(per_iteration, benchmark::Counter::kIsIterationInvariantRate);
}

// ---- SGEMM ----------------------------------------------------------------------------------

struct GemmOperands {
  explicit GemmOperands(int64_t n) : n(n) {
    Backend& backend = GetBackend(DeviceType::kCUDA);
    const size_t bytes = static_cast<size_t>(n * n) * sizeof(float);
    a = DeviceBuffer(bytes);
    b = DeviceBuffer(bytes);
    c = DeviceBuffer(bytes);
    backend.RandomUniform(kDevice, kFloat32, a.get(), n * n, 1, 0, -1.0, 1.0);
    backend.RandomUniform(kDevice, kFloat32, b.get(), n * n, 2, 0, -1.0, 1.0);
  }
  const float* A() const { return static_cast<const float*>(a.get()); }
  const float* B() const { return static_cast<const float*>(b.get()); }
  float* C() const { return static_cast<float*>(c.get()); }

  int64_t n;
  std::shared_ptr<void> a, b, c;
};

void BM_CudaSgemmBackend(benchmark::State& state) {
  if (!RequireGpu(state)) return;
  const int64_t n = state.range(0);
  Backend& backend = GetBackend(DeviceType::kCUDA);
  GemmOperands operands(n);
  auto gemm = [&] {
    backend.Gemm(kDevice, kFloat32, false, false, n, n, n, 1.0, operands.A(), n, 0, operands.B(), n,
                 0, 0.0, operands.C(), n, 0, 1);
  };
  TimeOnStream(state, gemm);
  SetRate(state, "TFLOP/s", 2.0 * n * n * n * 1e-12);
}

void BM_CudaSgemmCublas(benchmark::State& state) {
  if (!RequireGpu(state)) return;
  const int n = static_cast<int>(state.range(0));
  GemmOperands operands(n);
  cublasHandle_t handle;
  TANDEM_CUBLAS_CHECK(cublasCreate(&handle), kDevice);
  TANDEM_CUBLAS_CHECK(cublasSetStream(handle, DeviceStream()), kDevice);
  TANDEM_CUBLAS_CHECK(
      cublasSetMathMode(handle, AllowTf32() ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH),
      kDevice);
  const float alpha = 1.0f, beta = 0.0f;
  auto gemm = [&] {
    TANDEM_CUBLAS_CHECK(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, operands.B(),
                                    n, operands.A(), n, &beta, operands.C(), n),
                        kDevice);
  };
  TimeOnStream(state, gemm);
  cublasDestroy(handle);
  SetRate(state, "TFLOP/s", 2.0 * n * n * static_cast<double>(n) * 1e-12);
}

BENCHMARK(BM_CudaSgemmBackend)
    ->Arg(1024)
    ->Arg(2048)
    ->Arg(4096)
    ->Arg(8192)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_CudaSgemmCublas)
    ->Arg(1024)
    ->Arg(2048)
    ->Arg(4096)
    ->Arg(8192)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// ---- Bandwidth
// ------------------------------------------------------------------------------------

void BM_CudaAdd(benchmark::State& state) {
  if (!RequireGpu(state)) return;
  const int64_t n = state.range(0);
  Backend& backend = GetBackend(DeviceType::kCUDA);
  std::shared_ptr<void> a = DeviceBuffer(n * sizeof(float)), b = DeviceBuffer(n * sizeof(float)),
                        c = DeviceBuffer(n * sizeof(float));
  backend.Fill(kDevice, KernelTensor::Vector(a.get(), n), 1.0);
  backend.Fill(kDevice, KernelTensor::Vector(b.get(), n), 2.0);
  auto add = [&] {
    backend.Binary(kDevice, BinaryOp::kAdd, KernelTensor::Vector(c.get(), n),
                   KernelTensor::Vector(a.get(), n), KernelTensor::Vector(b.get(), n));
  };
  TimeOnStream(state, add);
  SetRate(state, "GB/s", 3.0 * n * sizeof(float) * 1e-9);  // two reads, one write
}

void BM_CudaMemcpyDeviceToDevice(benchmark::State& state) {
  if (!RequireGpu(state)) return;
  const size_t bytes = static_cast<size_t>(state.range(0)) * sizeof(float);
  std::shared_ptr<void> src = DeviceBuffer(bytes), dst = DeviceBuffer(bytes);
  auto copy = [&] {
    TANDEM_CUDA_CHECK(
        cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, DeviceStream()),
        kDevice);
  };
  TimeOnStream(state, copy);
  SetRate(state, "GB/s", 2.0 * bytes * 1e-9);  // one read, one write
}

BENCHMARK(BM_CudaAdd)->Arg(1 << 20)->Arg(1 << 26)->UseManualTime();
BENCHMARK(BM_CudaMemcpyDeviceToDevice)->Arg(1 << 20)->Arg(1 << 26)->UseManualTime();

// ---- Host <-> device ----------------------------------------------------------------------------

// range(0): bytes; range(1): 1 for pinned host memory, 0 for pageable.
std::shared_ptr<void> HostBuffer(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  if (state.range(1) == 1) {
    return GetBackend(DeviceType::kCUDA).AllocatePinnedHost(bytes);
  }
  std::shared_ptr<std::vector<char>> pageable = std::make_shared<std::vector<char>>(bytes, 1);
  return std::shared_ptr<void>(pageable, pageable->data());
}

// Times one host<->device transfer of range(0) bytes, `copy(backend, host, device, bytes)`,
// on the device's stream.
template <typename Copy>
void BenchmarkHostTransfer(benchmark::State& state, Copy copy) {
  if (!RequireGpu(state)) return;
  const size_t bytes = static_cast<size_t>(state.range(0));
  Backend& backend = GetBackend(DeviceType::kCUDA);
  std::shared_ptr<void> host = HostBuffer(state);
  std::shared_ptr<void> device = DeviceBuffer(bytes);
  TimeOnStream(state, [&] { copy(backend, host.get(), device.get(), bytes); });
  SetRate(state, "GB/s", bytes * 1e-9);
  state.SetLabel(state.range(1) == 1 ? "pinned" : "pageable");
}

void BM_CudaHostToDevice(benchmark::State& state) {
  BenchmarkHostTransfer(state, [](Backend& backend, void* host, void* device, size_t bytes) {
    backend.CopyFromHost(kDevice, device, host, bytes);
  });
}

void BM_CudaDeviceToHost(benchmark::State& state) {
  BenchmarkHostTransfer(state, [](Backend& backend, void* host, void* device, size_t bytes) {
    backend.CopyToHost(kDevice, host, device, bytes);
  });
}

BENCHMARK(BM_CudaHostToDevice)
    ->Args({64 << 20, 1})
    ->Args({64 << 20, 0})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_CudaDeviceToHost)
    ->Args({64 << 20, 1})
    ->Args({64 << 20, 0})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// ---- Attention ---------------------------------------------------------------------------------

// Causal attention over 8 x 12 heads of 1024 tokens with heads of state.range(0), bfloat16; the
// backward when `backward`. Operands hold ones (the kernels' time does not depend on values).
void BenchmarkAttention(benchmark::State& state, bool backward) {
  if (!RequireGpu(state)) return;
  AttentionGeometry g;
  g.batch = 8 * 12;
  g.query_len = g.key_len = 1024;
  g.head_dim = g.value_dim = state.range(0);
  g.scale = 1.0 / std::sqrt(static_cast<double>(g.head_dim));
  g.causal = true;
  Backend& backend = GetBackend(DeviceType::kCUDA);
  const int64_t n = g.batch * g.query_len * g.head_dim;
  // q, k, v, out, dout, dq, dk, dv.
  std::vector<std::shared_ptr<void>> buffers;
  std::vector<void*> b;
  for (int i = 0; i < 8; ++i) {
    buffers.push_back(DeviceBuffer(n * 2));
    b.push_back(buffers.back().get());
    backend.Fill(kDevice, KernelTensor::Vector(b.back(), n, kBFloat16), 1.0);
  }
  std::shared_ptr<void> lse = DeviceBuffer(g.batch * g.query_len * sizeof(float));
  const Device device = Device::Cuda(kDevice);
  RunAttentionForward(device, kBFloat16, g, b[0], b[1], b[2], nullptr, b[3], lse.get());
  auto run = [&] {
    if (backward) {
      RunAttentionBackward(device, kBFloat16, g, b[0], b[1], b[2], nullptr, b[3], b[4], lse.get(),
                           b[5], b[6], b[7]);
    } else {
      RunAttentionForward(device, kBFloat16, g, b[0], b[1], b[2], nullptr, b[3], lse.get());
    }
  };
  TimeOnStream(state, run);
  const double gemm = 2.0 * g.batch * g.query_len * g.key_len * g.head_dim / 2;  // causal half
  SetRate(state, "TFLOP/s", (backward ? 5 : 2) * gemm * 1e-12);
}

void BM_CudaAttentionForwardBFloat16(benchmark::State& state) { BenchmarkAttention(state, false); }
void BM_CudaAttentionBackwardBFloat16(benchmark::State& state) { BenchmarkAttention(state, true); }

BENCHMARK(BM_CudaAttentionForwardBFloat16)
    ->Arg(64)
    ->Arg(128)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_CudaAttentionBackwardBFloat16)
    ->Arg(64)
    ->Arg(128)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace cuda
}  // namespace tandem
