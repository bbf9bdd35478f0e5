// Backward passes where several logical CPU devices' gradients meet in one set of leaves,
// as DataParallel's replicas' gradients meet in the original parameters. Measures the
// autograd engine's gradient accumulation: run with --benchmark_filter=Backward.
//
//   bazel run -c opt //tensor:autograd_benchmark
#include <benchmark/benchmark.h>

#include <vector>

#include "tensor/core/anomaly_mode.h"
#include "tensor/core/autograd.h"
#include "tensor/runtime/devices.h"
#include "tensor/tensor.h"

namespace tandem {
namespace {

// The MLP 784-256-128-10's parameters as leaves on cpu:0.
std::vector<Tensor> MlpLeaves() {
  manual_seed(0);
  const TensorOptions grad = TensorOptions().requires_grad(true);
  return {randn({256, 784}, grad), randn({256}, grad),     randn({128, 256}, grad),
          randn({128}, grad),      randn({10, 128}, grad), randn({10}, grad)};
}

// Every device holds its own copy of the leaves and the pass starts from those copies with
// given gradients, so it is made of the copies back to cpu:0 and the sums in the leaves:
// the gradient accumulation that DataParallel's replicas meet in. The graph is recorded
// once; each iteration runs backward over it.
void BM_BackwardGradientsMeetInLeaves(benchmark::State& state) {
  const int devices = static_cast<int>(state.range(0));
  SetCpuDeviceCount(devices);
  std::vector<Tensor> leaves = MlpLeaves();
  std::vector<Tensor> roots;
  std::vector<Tensor> grads;
  for (int d = 0; d < devices; ++d) {
    for (const Tensor& leaf : leaves) {
      roots.push_back(leaf.to(Device::Cpu(d)));
      grads.push_back(full(leaf.shape(), d + 1.0, Device::Cpu(d)));
    }
  }
  for (auto _ : state) {
    RunBackward(roots, grads);
    ZeroGrad(leaves);
  }
  state.counters["devices"] = devices;
}
BENCHMARK(BM_BackwardGradientsMeetInLeaves)
    ->Arg(1)
    ->Arg(2)
    ->Arg(4)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// The MLP's forward and backward at batch 64 per device, on 4 devices sharing the leaves.
void BM_BackwardMlpOnDevicesSharingLeaves(benchmark::State& state) {
  const int devices = static_cast<int>(state.range(0));
  SetCpuDeviceCount(devices);
  std::vector<Tensor> leaves = MlpLeaves();
  std::vector<Tensor> inputs;
  for (int d = 0; d < devices; ++d) inputs.push_back(randn({64, 784}, Device::Cpu(d)));
  for (auto _ : state) {
    Tensor total;
    for (int d = 0; d < devices; ++d) {
      const Device device = Device::Cpu(d);
      Tensor h = inputs[d];
      for (size_t layer = 0; layer < 3; ++layer) {
        h = linear(h, leaves[2 * layer].to(device), leaves[2 * layer + 1].to(device));
        if (layer < 2) h = h.relu();
      }
      Tensor part = h.sum().to(Device::Cpu(0));
      total = total.defined() ? add(total, part) : part;
    }
    total.backward();
    ZeroGrad(leaves);
  }
  state.counters["devices"] = devices;
}
BENCHMARK(BM_BackwardMlpOnDevicesSharingLeaves)
    ->Arg(1)
    ->Arg(4)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// One training step's autograd work (forward, cross-entropy, backward) of the MLP at batch
// 128 on cpu:0 with anomaly mode off (0) and on (1): what --detect_anomaly costs. Run with
// --benchmark_filter=AnomalyMode.
void BM_MlpStepAnomalyMode(benchmark::State& state) {
  SetCpuDeviceCount(1);
  std::vector<Tensor> leaves = MlpLeaves();
  const Tensor x = randn({128, 784});
  std::vector<int64_t> labels(128);
  for (int64_t i = 0; i < 128; ++i) labels[i] = i % 10;
  const Tensor y = from_vector(labels, {128});
  DetectAnomalyGuard anomaly(state.range(0) != 0);
  for (auto _ : state) {
    Tensor h = x;
    for (size_t layer = 0; layer < 3; ++layer) {
      h = linear(h, leaves[2 * layer], leaves[2 * layer + 1]);
      if (layer < 2) h = h.relu();
    }
    cross_entropy(h, y).backward();
    ZeroGrad(leaves);
  }
  state.counters["anomaly_mode"] = static_cast<double>(state.range(0));
}
BENCHMARK(BM_MlpStepAnomalyMode)->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace tandem
