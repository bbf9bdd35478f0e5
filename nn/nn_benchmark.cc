// Layer throughput: forward and forward+backward of Linear and Conv2d at training-sized
// shapes, a whole MLP training step, optimizer steps, and clone() (which DataParallel's
// replicate uses).
//
//   bazel run -c opt //nn:nn_benchmark
//   TANDEM_CPU_DEVICES=1 bazel run -c opt //nn:nn_benchmark   # cpu:0 gets every core
//
// items/s counts samples; FLOP/s counts the multiply-adds of the layer (2 FLOPs each) over
// forward (and the two gradient products for backward). Each timed iteration ends by
// waiting for the device, so CUDA timings include the kernels.
#include <benchmark/benchmark.h>

#include <memory>
#include <string>

#include "nn/nn.h"
#include "tensor/core/autograd.h"
#include "tensor/runtime/devices.h"

namespace tandem::nn {
namespace {

// False (and the benchmark marked skipped, saying why) when `device` is absent.
bool Available(benchmark::State& state, Device device) {
  if (device.is_cuda() && DeviceCount(DeviceType::kCUDA) == 0) {
    state.SkipWithError("no CUDA device in this process (no GPU, no driver, or a CPU-only build)");
    return false;
  }
  if (device.is_cpu()) {
    state.SetLabel(std::to_string(CpuThreadsPerDevice()) + " threads on " + device.ToString());
  }
  return true;
}

// Waits for the device to finish the work that produced `t` (reading one element back).
void Wait(const Tensor& t) { benchmark::DoNotOptimize(t.flatten().narrow(0, 0, 1).item()); }

void SetRates(benchmark::State& state, int64_t batch, double flops_per_iteration) {
  state.SetItemsProcessed(state.iterations() * batch);
  state.counters["FLOP/s"] =
      benchmark::Counter(flops_per_iteration * state.iterations(), benchmark::Counter::kIsRate);
}

// Forward only (inference, no graph), or forward + backward with fresh gradients each time.
void RunLayer(benchmark::State& state, Module& layer, const Tensor& input, bool backward,
              int64_t batch, double forward_flops) {
  Tensor upstream;
  for (auto _ : state) {
    if (!backward) {
      NoGradGuard no_grad;
      Wait(layer.forward_tensors({input})[0]);
      continue;
    }
    layer.zero_grad();
    Tensor out = layer.forward_tensors({input})[0];
    if (!upstream.defined()) upstream = ones(out.shape(), TensorOptions().device(out.device()));
    out.backward(upstream);
    Wait(layer.parameters()[0].grad());
  }
  // Backward of a linear map is two products of the forward's size (input and weight).
  SetRates(state, batch, forward_flops * (backward ? 3.0 : 1.0));
}

void BM_Linear(benchmark::State& state, Device device, bool backward) {
  if (!Available(state, device)) return;
  const int64_t batch = 256, in = 784, out = 256;
  manual_seed(0);
  Linear layer(in, out);
  layer.to(device);
  Tensor x = randn({batch, in}, TensorOptions().device(device));
  RunLayer(state, layer, x, backward, batch, 2.0 * batch * in * out);
}

void BM_Conv2d(benchmark::State& state, Device device, bool backward) {
  if (!Available(state, device)) return;
  const int64_t batch = 64, in = 1, out = 32, size = 28, kernel = 3;
  manual_seed(0);
  Conv2d layer(in, out, kernel, /*stride=*/1, /*padding=*/1);
  layer.to(device);
  Tensor x = randn({batch, in, size, size}, TensorOptions().device(device));
  RunLayer(state, layer, x, backward, batch,
           2.0 * batch * out * in * kernel * kernel * size * size);
}

// One optimisation step of a 784-256-10 MLP on a batch of 256.
void BM_MlpTrainStep(benchmark::State& state, Device device) {
  if (!Available(state, device)) return;
  const int64_t batch = 256;
  manual_seed(0);
  Sequential model(Linear(784, 256), ReLU(), Linear(256, 10));
  model.to(device);
  SGD optimizer(model.parameters(), SGDOptions(0.01).momentum(0.9));
  CrossEntropyLoss criterion;
  Tensor x = randn({batch, 784}, TensorOptions().device(device));
  std::vector<int64_t> classes(batch);
  for (int64_t i = 0; i < batch; ++i) classes[i] = i % 10;
  Tensor labels = from_vector(classes, {batch}, TensorOptions(kInt64).device(device));
  for (auto _ : state) {
    optimizer.zero_grad();
    criterion.forward(model.forward(x), labels).backward();
    optimizer.step();
    Wait(model.parameters()[0]);
  }
  SetRates(state, batch, 3.0 * 2.0 * batch * (784 * 256 + 256 * 10));
}

// One optimizer step over that MLP's parameters (203,530 floats) with gradients in place.
template <typename MakeOptimizer>
void RunOptimizerStep(benchmark::State& state, Device device, MakeOptimizer make_optimizer) {
  if (!Available(state, device)) return;
  manual_seed(0);
  Sequential model(Linear(784, 256), ReLU(), Linear(256, 10));
  model.to(device);
  model.forward(randn({8, 784}, TensorOptions().device(device))).sum().backward();
  auto optimizer = make_optimizer(model.parameters());
  int64_t elements = 0;
  for (const Tensor& p : model.parameters()) elements += p.numel();
  for (auto _ : state) {
    optimizer->step();
    Wait(model.parameters()[0]);
  }
  state.SetItemsProcessed(state.iterations() * elements);  // parameters updated per second
}

void BM_SgdMomentumStep(benchmark::State& state, Device device) {
  RunOptimizerStep(state, device, [](std::vector<Tensor> params) {
    return std::make_unique<SGD>(std::move(params), SGDOptions(0.01).momentum(0.9));
  });
}

void BM_AdamStep(benchmark::State& state, Device device) {
  RunOptimizerStep(state, device, [](std::vector<Tensor> params) {
    return std::make_unique<Adam>(std::move(params), AdamOptions(1e-3));
  });
}

// clone() of that MLP onto another device of the same type.
void BM_CloneMlp(benchmark::State& state, Device from, Device to) {
  if (!Available(state, from) || !Available(state, to)) return;
  if (to.is_cpu() && to.index() >= CpuDeviceCount()) {
    state.SkipWithError("needs two CPU devices (TANDEM_CPU_DEVICES >= 2)");
    return;
  }
  if (to.is_cuda() && to.index() >= DeviceCount(DeviceType::kCUDA)) {
    state.SkipWithError("needs two CUDA devices");
    return;
  }
  manual_seed(0);
  Sequential model(Linear(784, 256), ReLU(), Linear(256, 10));
  model.to(from);
  for (auto _ : state) {
    std::shared_ptr<Module> copy = model.clone(to);
    Wait(copy->parameters()[0]);
  }
  state.SetBytesProcessed(state.iterations() * (784 * 256 + 256 + 256 * 10 + 10) * 4);
}

BENCHMARK_CAPTURE(BM_Linear, forward_cpu0, Device::Cpu(0), false)->UseRealTime();
BENCHMARK_CAPTURE(BM_Linear, forward_backward_cpu0, Device::Cpu(0), true)->UseRealTime();
BENCHMARK_CAPTURE(BM_Linear, forward_cuda0, Device::Cuda(0), false)->UseRealTime();
BENCHMARK_CAPTURE(BM_Linear, forward_backward_cuda0, Device::Cuda(0), true)->UseRealTime();
BENCHMARK_CAPTURE(BM_Conv2d, forward_cpu0, Device::Cpu(0), false)->UseRealTime();
BENCHMARK_CAPTURE(BM_Conv2d, forward_backward_cpu0, Device::Cpu(0), true)->UseRealTime();
BENCHMARK_CAPTURE(BM_Conv2d, forward_cuda0, Device::Cuda(0), false)->UseRealTime();
BENCHMARK_CAPTURE(BM_Conv2d, forward_backward_cuda0, Device::Cuda(0), true)->UseRealTime();
BENCHMARK_CAPTURE(BM_MlpTrainStep, cpu0, Device::Cpu(0))->UseRealTime();
BENCHMARK_CAPTURE(BM_MlpTrainStep, cuda0, Device::Cuda(0))->UseRealTime();
BENCHMARK_CAPTURE(BM_SgdMomentumStep, cpu0, Device::Cpu(0))->UseRealTime();
BENCHMARK_CAPTURE(BM_SgdMomentumStep, cuda0, Device::Cuda(0))->UseRealTime();
BENCHMARK_CAPTURE(BM_AdamStep, cpu0, Device::Cpu(0))->UseRealTime();
BENCHMARK_CAPTURE(BM_AdamStep, cuda0, Device::Cuda(0))->UseRealTime();
BENCHMARK_CAPTURE(BM_CloneMlp, cpu0_to_cpu1, Device::Cpu(0), Device::Cpu(1))->UseRealTime();
BENCHMARK_CAPTURE(BM_CloneMlp, cuda0_to_cuda1, Device::Cuda(0), Device::Cuda(1))->UseRealTime();

}  // namespace
}  // namespace tandem::nn
