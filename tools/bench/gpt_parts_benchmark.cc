// The two parts of a GPT-2 124M training step whose backward the issue measured as wasted
// work, at that step's sizes (batch 4 x 64 = 256 tokens, vocabulary 50257, 768 channels):
//   - the tied embedding: wte [50257, 768] both looked up (index_select, as nn::Embedding)
//     and multiplied as a dense weight; its gradient is the dense one plus the looked-up rows
//   - cross_entropy over [256, 50257] logits
// Each iteration runs forward and backward and reads one gradient element back.
//
//   bazel run -c opt //tools/bench:gpt_parts_benchmark -- --benchmark_repetitions=5
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace tandem {
namespace {

constexpr int64_t kTokens = 256, kVocab = 50257, kChannels = 768;

Tensor TokenIds() {
  std::vector<int64_t> ids(kTokens);
  for (int64_t i = 0; i < kTokens; ++i) ids[i] = (i * 7919 + 13) % kVocab;
  return from_vector(ids, {kTokens}, kInt64);
}

// sum(wte * c) stands for the head: its backward hands the leaf a fresh [V, C] gradient, as
// linear's weight gradient does, without the head's GEMM (the same in either version).
void BM_TiedEmbeddingBackward(benchmark::State& state) {
  manual_seed(0);
  Tensor wte = (randn({kVocab, kChannels}) * 0.02).set_requires_grad(true);
  const Tensor ids = TokenIds();
  const Tensor weights = randn({kTokens, kChannels});
  for (auto _ : state) {
    wte.set_grad(Tensor());
    (sum(wte * 0.5) + sum(index_select(wte, 0, ids) * weights)).backward();
    benchmark::DoNotOptimize(wte.grad().flatten().narrow(0, 0, 1).item());
  }
}
BENCHMARK(BM_TiedEmbeddingBackward)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_CrossEntropyForwardBackward(benchmark::State& state) {
  manual_seed(0);
  Tensor logits = randn({kTokens, kVocab}).set_requires_grad(true);
  const Tensor targets = TokenIds();
  for (auto _ : state) {
    logits.set_grad(Tensor());
    cross_entropy(logits, targets).backward();
    benchmark::DoNotOptimize(logits.grad().flatten().narrow(0, 0, 1).item());
  }
}
BENCHMARK(BM_CrossEntropyForwardBackward)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace tandem
