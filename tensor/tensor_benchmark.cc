// Benchmarks of the CPU backend: SGEMM through Backend::Gemm against OpenBLAS called directly,
// on one thread, on two threads of one logical device, and on two logical devices working at
// once; elementwise add bandwidth through Backend::Binary and through tandem::add; the round
// trip of an empty task to another device's worker (what each hand-off of DataParallel and of
// the autograd engine costs), right after the last one and after the worker sat idle; the
// fused layer_norm and gelu(x, "tanh") against the ops they replaced (forward + backward).
//
//   bazel run -c opt //tensor:tensor_benchmark
//   bazel run -c opt //tensor:tensor_benchmark -- --benchmark_filter=Sgemm
//
// Each benchmark names the threads it uses; where the machine has too few cores for that
// configuration it is skipped with a message.
#include <cblas.h>

#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "benchmark/benchmark.h"
#include "tensor/base/device.h"
#include "tensor/runtime/backend.h"
#include "tensor/runtime/devices.h"
#include "tensor/runtime/threads.h"
#include "tensor/tensor.h"

namespace tandem {
namespace {

Backend& CpuBackend() { return GetBackend(DeviceType::kCPU); }

// Gives each logical CPU device `threads` threads; false (and a skip message) when the
// machine cannot, or has too few devices for `devices` of them.
bool SetThreadsPerDevice(benchmark::State& state, int threads, int devices = 1) {
  const int count = HardwareCores() / threads;
  if (count < devices || count < 1) {
    state.SkipWithError(("needs " + std::to_string(threads * devices) +
                         " cores, this machine has " + std::to_string(HardwareCores()))
                            .c_str());
    return false;
  }
  SetCpuDeviceCount(count);
  if (CpuThreadsPerDevice() != threads) {
    state.SkipWithError("the cores do not divide into devices of this many threads");
    return false;
  }
  return true;
}

// Host buffers from the CPU allocator (64-byte aligned), filled with uniform numbers.
struct Buffer {
  Buffer(int64_t n, uint64_t seed)
      : block(CpuBackend().GetAllocator(0).Allocate(n * sizeof(float))) {
    CpuBackend().RandomUniform(0, kFloat32, data(), n, seed, 0, -1.0f, 1.0f);
  }
  float* data() const { return static_cast<float*>(block.get()); }
  std::shared_ptr<void> block;
};

struct GemmShape {
  int64_t m, n, k;
};

GemmShape ShapeOf(const benchmark::State& state) {
  return {state.range(0), state.range(1), state.range(2)};
}

void SetGemmCounters(benchmark::State& state, const GemmShape& s, int products) {
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * s.m * s.n * s.k * products * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

// C = A * B through the backend, on cpu:0 with `threads` (range 3) threads.
void BM_SgemmBackend(benchmark::State& state) {
  const GemmShape s = ShapeOf(state);
  if (!SetThreadsPerDevice(state, static_cast<int>(state.range(3)))) return;
  Buffer a(s.m * s.k, 1), b(s.k * s.n, 2), c(s.m * s.n, 3);
  for (auto _ : state) {
    CpuBackend().Gemm(0, kFloat32, false, false, s.m, s.n, s.k, 1.0f, a.data(), s.k, 0, b.data(),
                      s.n, 0, 0.0f, c.data(), s.n, 0, 1);
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  SetGemmCounters(state, s, 1);
}

// The same product by cblas_sgemm directly, OpenBLAS using `threads` of its own threads.
void BM_SgemmCblas(benchmark::State& state) {
  const GemmShape s = ShapeOf(state);
  const int threads = static_cast<int>(state.range(3));
  if (threads > HardwareCores()) {
    state.SkipWithError("not enough cores");
    return;
  }
  CpuBackend();  // the backend pins OpenBLAS to one thread when it starts; set ours after
  Buffer a(s.m * s.k, 1), b(s.k * s.n, 2), c(s.m * s.n, 3);
  openblas_set_num_threads(threads);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(s.m),
                static_cast<int>(s.n), static_cast<int>(s.k), 1.0f, a.data(), static_cast<int>(s.k),
                b.data(), static_cast<int>(s.n), 0.0f, c.data(), static_cast<int>(s.n));
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  openblas_set_num_threads(1);
  SetGemmCounters(state, s, 1);
}

// Two logical devices of one thread each, each computing its own product at the same time
// on its worker: what DataParallel over cpu:0 and cpu:1 does. GFLOP/s counts both.
void BM_SgemmTwoDevices(benchmark::State& state) {
  const GemmShape s = ShapeOf(state);
  if (!SetThreadsPerDevice(state, 1, 2)) return;
  std::vector<std::unique_ptr<Buffer>> buffers;
  for (int d = 0; d < 2; ++d) {
    buffers.push_back(std::make_unique<Buffer>(s.m * s.k, 1));
    buffers.push_back(std::make_unique<Buffer>(s.k * s.n, 2));
    buffers.push_back(std::make_unique<Buffer>(s.m * s.n, 3));
  }
  for (auto _ : state) {
    std::future<void> done[2];
    for (int d = 0; d < 2; ++d) {
      done[d] = DeviceWorker::For(Device::Cpu(d)).Submit([&, d] {
        CpuBackend().Gemm(d, kFloat32, false, false, s.m, s.n, s.k, 1.0f, buffers[3 * d]->data(),
                          s.k, 0, buffers[3 * d + 1]->data(), s.n, 0, 0.0f,
                          buffers[3 * d + 2]->data(), s.n, 0, 1);
      });
    }
    for (auto& future : done) future.get();
  }
  SetGemmCounters(state, s, 2);
}

void GemmArguments(benchmark::internal::Benchmark* b, bool with_threads) {
  b->ArgNames({"m", "n", "k", "threads"});
  for (int64_t threads : {1, 2}) {
    if (!with_threads && threads == 2) continue;
    for (int64_t size : {256, 512, 1024, 2048}) b->Args({size, size, size, threads});
    b->Args({256, 256, 784, threads});  // the MLP's first layer: [256, 784] x [784, 256]
  }
  b->UseRealTime()->Unit(benchmark::kMillisecond);
}

BENCHMARK(BM_SgemmBackend)->Apply([](auto* b) { GemmArguments(b, true); });
BENCHMARK(BM_SgemmCblas)->Apply([](auto* b) { GemmArguments(b, true); });
BENCHMARK(BM_SgemmTwoDevices)->Apply([](auto* b) { GemmArguments(b, false); });

void SetBandwidthCounter(benchmark::State& state, int64_t n) {
  // Two floats read and one written per element.
  state.counters["GB/s"] = benchmark::Counter(3.0 * n * sizeof(float) * 1e-9,
                                              benchmark::Counter::kIsIterationInvariantRate);
}

// out = a + b over n (range 0) floats through Backend::Binary, `threads` (range 1) threads.
void BM_AddBackend(benchmark::State& state) {
  const int64_t n = state.range(0);
  if (!SetThreadsPerDevice(state, static_cast<int>(state.range(1)))) return;
  Buffer a(n, 1), b(n, 2), out(n, 3);
  for (auto _ : state) {
    CpuBackend().Binary(0, BinaryOp::kAdd, KernelTensor::Vector(out.data(), n),
                        KernelTensor::Vector(a.data(), n), KernelTensor::Vector(b.data(), n));
    benchmark::ClobberMemory();
  }
  SetBandwidthCounter(state, n);
}

// The same through the Tensor API (allocates the result each time, as user code does).
void BM_AddTensor(benchmark::State& state) {
  const int64_t n = state.range(0);
  if (!SetThreadsPerDevice(state, static_cast<int>(state.range(1)))) return;
  Tensor a = rand({n}), b = rand({n});
  for (auto _ : state) {
    Tensor out = add(a, b);
    benchmark::DoNotOptimize(out);
  }
  SetBandwidthCounter(state, n);
}

void AddArguments(benchmark::internal::Benchmark* b) {
  b->ArgNames({"n", "threads"});
  for (int64_t threads : {1, 2}) {
    for (int64_t n : {int64_t{1} << 20, int64_t{1} << 24}) b->Args({n, threads});
  }
  b->UseRealTime()->Unit(benchmark::kMicrosecond);
}

BENCHMARK(BM_AddBackend)->Apply(AddArguments);
BENCHMARK(BM_AddTensor)->Apply(AddArguments);

// Submit an empty task to cpu:1's worker and wait for it, from the main thread; idle_us
// (untimed) between round trips lets the worker go to sleep first, as it does between a
// step's phases.
void BM_WorkerRoundTrip(benchmark::State& state) {
  SetCpuDeviceCount(2);
  const auto idle = std::chrono::microseconds(state.range(0));
  DeviceWorker& worker = DeviceWorker::For(Device::Cpu(1));
  worker.Submit([] {}).get();
  for (auto _ : state) {
    if (idle.count() > 0) std::this_thread::sleep_for(idle);
    const auto start = std::chrono::steady_clock::now();
    worker.Submit([] {}).get();
    state.SetIterationTime(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
}
BENCHMARK(BM_WorkerRoundTrip)
    ->ArgName("idle_us")
    ->Arg(0)
    ->Arg(500)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// ---- Fused ops against their composed forms (Note [Fused row norms]) -----------------------
// Each iteration times the fused op's forward + backward, then the same computed from the ops
// it replaced, back to back, so that both see the same machine load; the counters give each
// one's mean and the ratio (fused / composed; below 1 is faster).

template <typename Fused, typename Composed>
void RunAlternated(benchmark::State& state, const Tensor& input, Fused fused, Composed composed) {
  const Tensor upstream = randn(input.shape());
  double fused_seconds = 0, composed_seconds = 0;
  auto time = [&](auto&& f) {
    Tensor x = input.detach();
    x.set_requires_grad(true);
    const auto start = std::chrono::steady_clock::now();
    f(x).backward(upstream);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  for (auto _ : state) {
    const double a = time(fused), b = time(composed);
    fused_seconds += a;
    composed_seconds += b;
    state.SetIterationTime(a + b);
  }
  const double n = static_cast<double>(state.iterations());
  state.counters["fused_us"] = fused_seconds / n * 1e6;
  state.counters["composed_us"] = composed_seconds / n * 1e6;
  state.counters["fused/composed"] = fused_seconds / composed_seconds;
}

// layer_norm forward + backward (weight and bias) on [256, 768], GPT-2's width.
void BM_LayerNormFusedVsComposed(benchmark::State& state) {
  const Tensor weight = randn({768}).set_requires_grad(true);
  const Tensor bias = randn({768}).set_requires_grad(true);
  RunAlternated(
      state, randn({256, 768}),
      [&](const Tensor& x) { return layer_norm(x, {768}, weight, bias, 1e-5); },
      [&](const Tensor& x) {
        // What nn::LayerNorm computed before the fused kernel.
        const Tensor mean = x.mean({1}, true);
        const Tensor centered = x - mean;
        const Tensor var = square(centered).mean({1}, true);
        return centered / sqrt(var + 1e-5) * weight + bias;
      });
}
BENCHMARK(BM_LayerNormFusedVsComposed)->UseManualTime()->Unit(benchmark::kMicrosecond);

// gelu(x, "tanh") forward + backward on [256, 3072], GPT-2's MLP activation.
void BM_GeluTanhFusedVsComposed(benchmark::State& state) {
  RunAlternated(
      state, randn({256, 3072}), [](const Tensor& x) { return gelu(x, "tanh"); },
      [](const Tensor& x) {
        // What gelu(x, "tanh") composed before its fused kernel.
        const Tensor inner = mul(add(x, mul(pow(x, 3.0), 0.044715)), 0.7978845608028654);
        return mul(mul(x, 0.5), add(tanh(inner), 1.0));
      });
}
BENCHMARK(BM_GeluTanhFusedVsComposed)->UseManualTime()->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace tandem
