// Data-loading throughput: Fashion-MNIST epochs through the DataLoader at batch 256 with
// 0, 1 and 2 workers (shuffle on), alone and overlapped with a simulated training step;
// the cost of one batch through FashionMnist's direct get_batch against the
// one-example-at-a-time path of the Dataset base class; and reading the files.
//
//   bazel run -c opt //data:data_benchmark
#include <benchmark/benchmark.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "data/data.h"
#include "tensor/tensor.h"

namespace tandem {
namespace data {
namespace {

constexpr int64_t kBatchSize = 256;

// Loaded once: the benchmarks measure loading batches, not reading the files.
std::shared_ptr<const FashionMnist> Train() {
  static const std::shared_ptr<const FashionMnist> train = [] {
    const std::string images =
        std::string(FashionMnist::kDefaultRoot) + "/train-images-idx3-ubyte.gz";
    return std::filesystem::exists(images) ? std::make_shared<const FashionMnist>() : nullptr;
  }();
  return train;
}

// The training split, or nullptr after marking the benchmark skipped when it is not installed.
std::shared_ptr<const FashionMnist> TrainOrSkip(benchmark::State& state) {
  auto train = Train();
  if (train == nullptr) {
    state.SkipWithError("Fashion-MNIST missing: apt-get install dataset-fashion-mnist");
  }
  return train;
}

void BM_FashionMnistEpoch(benchmark::State& state) {
  const auto train = TrainOrSkip(state);
  if (train == nullptr) return;
  DataLoader loader(train, DataLoaderOptions()
                               .batch_size(kBatchSize)
                               .shuffle(true)
                               .seed(0)
                               .num_workers(static_cast<int>(state.range(0))));
  int64_t batches = 0;
  int64_t items = 0;
  float checksum = 0;
  for (auto _ : state) {
    for (Batch& batch : loader) {
      // Touch the batch as a consumer would, so nothing is optimised away.
      checksum += batch.data().data<float>()[0];
      ++batches;
      items += batch.size();
    }
  }
  benchmark::DoNotOptimize(checksum);
  state.SetItemsProcessed(items);
  state.counters["batches/s"] =
      benchmark::Counter(static_cast<double>(batches), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_FashionMnistEpoch)
    ->ArgName("workers")
    ->Arg(0)
    ->Arg(1)
    ->Arg(2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The same epochs with a consumer that works `step_us` microseconds per batch, as a training
// step would: without workers loading and working add up, with workers they overlap.
void BM_FashionMnistEpochWithStep(benchmark::State& state) {
  const auto train = TrainOrSkip(state);
  if (train == nullptr) return;
  const auto step = std::chrono::microseconds(state.range(1));
  DataLoader loader(train, DataLoaderOptions()
                               .batch_size(kBatchSize)
                               .shuffle(true)
                               .seed(0)
                               .num_workers(static_cast<int>(state.range(0))));
  int64_t batches = 0;
  for (auto _ : state) {
    for (Batch& batch : loader) {
      benchmark::DoNotOptimize(batch.data().data<float>());
      // Busy, like a training step on this thread (sleeping would free the core).
      const auto until = std::chrono::steady_clock::now() + step;
      while (std::chrono::steady_clock::now() < until) {
      }
      ++batches;
    }
  }
  state.SetItemsProcessed(batches * kBatchSize);
  state.counters["batches/s"] =
      benchmark::Counter(static_cast<double>(batches), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_FashionMnistEpochWithStep)
    ->ArgNames({"workers", "step_us"})
    ->Args({0, 300})
    ->Args({1, 300})
    ->Args({2, 300})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

std::vector<int64_t> ShuffledBatchIndices() {
  std::vector<int64_t> order = RandomSampler(Train()->size(), 1).Permutation(0);
  order.resize(kBatchSize);
  return order;
}

void BM_FashionMnistGetBatch(benchmark::State& state) {
  if (TrainOrSkip(state) == nullptr) return;
  const std::vector<int64_t> indices = ShuffledBatchIndices();
  for (auto _ : state) benchmark::DoNotOptimize(Train()->get_batch(indices));
  state.SetItemsProcessed(state.iterations() * kBatchSize);
}
BENCHMARK(BM_FashionMnistGetBatch)->Unit(benchmark::kMicrosecond);

void BM_FashionMnistGetBatchOneByOne(benchmark::State& state) {
  if (TrainOrSkip(state) == nullptr) return;
  const std::vector<int64_t> indices = ShuffledBatchIndices();
  for (auto _ : state) benchmark::DoNotOptimize(Train()->Dataset::get_batch(indices));
  state.SetItemsProcessed(state.iterations() * kBatchSize);
}
BENCHMARK(BM_FashionMnistGetBatchOneByOne)->Unit(benchmark::kMicrosecond);

// Reading and checking both training files (gzip inflate + IDX checks).
void BM_FashionMnistLoadFiles(benchmark::State& state) {
  if (TrainOrSkip(state) == nullptr) return;
  for (auto _ : state) benchmark::DoNotOptimize(FashionMnist().size());
  state.SetItemsProcessed(state.iterations() * 60000);
}
BENCHMARK(BM_FashionMnistLoadFiles)->Unit(benchmark::kMillisecond)->Iterations(3);

}  // namespace
}  // namespace data
}  // namespace tandem
