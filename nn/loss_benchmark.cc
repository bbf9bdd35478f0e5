// Loss throughput: forward + backward of each loss at classifier-sized shapes, and what the
// options cost next to the fused op of tensor/ops/ops.h (tandem::cross_entropy).
//
//   bazel run -c opt //nn:loss_benchmark
//   bazel run -c opt //nn:loss_benchmark -- --benchmark_filter=CrossEntropy
//
// Each iteration computes the loss of a [batch, classes] input, back-propagates into it and
// reads one element of the gradient back (so CUDA timings would include the kernels).
// items/s counts samples.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "nn/loss.h"
#include "tensor/core/autograd.h"
#include "tensor/tensor.h"

namespace tandem::nn {
namespace {

using LossFunction = std::function<Tensor(const Tensor&, const Tensor&)>;

// Labels 0..classes-1 in a fixed pattern; every `ignore_every`-th one is -100 (none if 0).
Tensor Labels(int64_t batch, int64_t classes, int64_t ignore_every = 0) {
  std::vector<int64_t> labels(batch);
  for (int64_t i = 0; i < batch; ++i) {
    labels[i] = ignore_every > 0 && i % ignore_every == 0 ? -100 : (i * 7) % classes;
  }
  return from_vector(labels, {batch}, kInt64);
}

void Run(benchmark::State& state, const LossFunction& loss, const Tensor& target) {
  const int64_t batch = state.range(0), classes = state.range(1);
  manual_seed(0);
  Tensor input = randn({batch, classes}).set_requires_grad(true);
  for (auto _ : state) {
    input.set_grad(Tensor());
    loss(input, target).backward();
    benchmark::DoNotOptimize(input.grad().flatten().narrow(0, 0, 1).item());
  }
  state.SetItemsProcessed(state.iterations() * batch);
}

void Shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"batch", "classes"});
  b->Args({128, 10})->Args({1024, 10})->Args({256, 1000});
}

// The fused op the trainer used before the options existed.
void BM_CrossEntropy_FusedOp(benchmark::State& state) {
  Run(
      state, [](const Tensor& x, const Tensor& t) { return tandem::cross_entropy(x, t); },
      Labels(state.range(0), state.range(1)));
}
BENCHMARK(BM_CrossEntropy_FusedOp)->Apply(Shapes);

// CrossEntropyLoss() with PyTorch's defaults (ignore_index -100 checked, then the fused op).
void BM_CrossEntropy_Default(benchmark::State& state) {
  CrossEntropyLoss criterion;
  Run(
      state, [&](const Tensor& x, const Tensor& t) { return criterion.forward(x, t); },
      Labels(state.range(0), state.range(1)));
}
BENCHMARK(BM_CrossEntropy_Default)->Apply(Shapes);

// Some targets ignored: the composed path (log_softmax, gather, masks).
void BM_CrossEntropy_Ignored(benchmark::State& state) {
  CrossEntropyLoss criterion;
  Run(
      state, [&](const Tensor& x, const Tensor& t) { return criterion.forward(x, t); },
      Labels(state.range(0), state.range(1), 10));
}
BENCHMARK(BM_CrossEntropy_Ignored)->Apply(Shapes);

// Class weights and label smoothing.
void BM_CrossEntropy_WeightSmoothing(benchmark::State& state) {
  CrossEntropyLoss criterion(
      CrossEntropyLossOptions().weight(rand({state.range(1)})).label_smoothing(0.1));
  Run(
      state, [&](const Tensor& x, const Tensor& t) { return criterion.forward(x, t); },
      Labels(state.range(0), state.range(1)));
}
BENCHMARK(BM_CrossEntropy_WeightSmoothing)->Apply(Shapes);

void BM_BCEWithLogits(benchmark::State& state) {
  BCEWithLogitsLoss criterion(BCEWithLogitsLossOptions().pos_weight(rand({state.range(1)})));
  Run(
      state, [&](const Tensor& x, const Tensor& t) { return criterion.forward(x, t); },
      rand({state.range(0), state.range(1)}));
}
BENCHMARK(BM_BCEWithLogits)->Apply(Shapes);

void BM_MSE(benchmark::State& state) {
  MSELoss criterion;
  Run(
      state, [&](const Tensor& x, const Tensor& t) { return criterion.forward(x, t); },
      randn({state.range(0), state.range(1)}));
}
BENCHMARK(BM_MSE)->Apply(Shapes);

void BM_SmoothL1(benchmark::State& state) {
  SmoothL1Loss criterion;
  Run(
      state, [&](const Tensor& x, const Tensor& t) { return criterion.forward(x, t); },
      randn({state.range(0), state.range(1)}));
}
BENCHMARK(BM_SmoothL1)->Apply(Shapes);

}  // namespace
}  // namespace tandem::nn
