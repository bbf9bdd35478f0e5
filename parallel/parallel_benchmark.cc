// What DataParallel costs and what it gains, over logical CPU devices (and CUDA devices where
// there are at least two):
//
//   bazel run -c opt //parallel:parallel_benchmark
//   bazel run -c opt //parallel:parallel_benchmark -- --benchmark_filter=Speedup
//
// (a) BM_Linear5x2_*: forward+backward of Linear(5, 2) at batch 30 called directly, and under
//     DataParallel over 1, 2 and 4 CPU devices (4 logical devices, whatever the cores).
//     us_per_device is the step time over the devices; overhead_us_per_device subtracts the
//     direct call's time, measured in the same benchmark just before it.
// (b) BM_Mlp_*: forward+backward (CrossEntropyLoss) of the MLP 784-256-128-10 at batch 256
//     on cpu:0 alone and under DataParallel over cpu:0,cpu:1, with the loss on the gathered
//     output or inside the replicas (forward_loss), and with the gradient reduction in
//     several buckets or in one. The machine is split into 2 logical CPU devices, so each
//     gets cores / 2 threads: one thread each on a 2-core machine (the label says).
// (c) BM_ParallelLoop_*: a perfectly parallel reference (a fixed arithmetic kernel that
//     touches no shared memory) on one device worker, and split over two.
//     BM_Speedup_* runs (b) and (c) interleaved, step by step, in one benchmark and reports
//     both speed-ups over one device and their ratio (dp_speedup / loop_speedup), so that the
//     comparison holds on a machine whose speed drifts (shared vCPUs).
// (d) BM_BroadcastCoalesced / BM_ReduceAddCoalesced: the MLP's parameters (940,584 bytes)
//     over 2 devices. bytes_per_second counts, for a broadcast, the bytes delivered to the
//     devices other than the source (between logical CPU devices nothing is copied: the
//     copies are views of the same memory); for a reduce-add, the bytes summed (every
//     device's copy).
// (e) BM_Replicate_Mlp: what a training step's replicate costs for the MLP over 2 and 3
//     CPU devices: the differentiable broadcast plus a fresh clone of the module's structure
//     per replica (BM_ReplicateStructure_Mlp: the clone alone, no tensor copied).
//
// Every time is wall-clock (UseRealTime): the work runs on the devices' worker threads.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <future>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "nn/nn.h"
#include "parallel/parallel.h"
#include "parallel/reference_loop.h"
#include "tensor/runtime/threads.h"
#include "tensor/tensor.h"

namespace tandem::parallel {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Splits the machine into `count` logical CPU devices (before any work runs) and labels the
// benchmark with the threads each gets.
void UseCpuDevices(benchmark::State& state, int count) {
  SetCpuDeviceCount(count);
  state.SetLabel(std::to_string(count) + " CPU devices x " + std::to_string(CpuThreadsPerDevice()) +
                 " thread(s), " + std::to_string(HardwareCores()) + " cores");
}

// ---- (a) DataParallel's overhead on a tiny model ----------------------------------------------

constexpr int64_t kTinyBatch = 30;

// One forward+backward of `module` (directly or through DataParallel) on x.
void TinyStep(nn::Module& model, nn::Module& callee, const Tensor& x) {
  model.zero_grad();
  callee.forward_tensors({x})[0].sum().backward();
}

void BM_Linear5x2_Direct(benchmark::State& state) {
  UseCpuDevices(state, 4);
  manual_seed(0);
  auto model = std::make_shared<nn::Linear>(5, 2);
  const Tensor x = randn({kTinyBatch, 5});
  for (auto _ : state) TinyStep(*model, *model, x);
  benchmark::DoNotOptimize(model->weight().grad().data<float>()[0]);
}
BENCHMARK(BM_Linear5x2_Direct)->UseRealTime()->Unit(benchmark::kMicrosecond);

void BM_Linear5x2_DataParallel(benchmark::State& state) {
  const int devices = static_cast<int>(state.range(0));
  UseCpuDevices(state, 4);
  manual_seed(0);
  auto model = std::make_shared<nn::Linear>(5, 2);
  DataParallel dp(model, CpuDevices(devices));
  const Tensor x = randn({kTinyBatch, 5});
  // The direct call's time on this machine now, as the baseline.
  for (int i = 0; i < 100; ++i) TinyStep(*model, *model, x);
  const int baseline_steps = 2000;
  auto start = Clock::now();
  for (int i = 0; i < baseline_steps; ++i) TinyStep(*model, *model, x);
  const double direct_us = 1e6 * SecondsSince(start) / baseline_steps;

  for (int i = 0; i < 10; ++i) TinyStep(*model, dp, x);  // allocator and workers warm
  start = Clock::now();
  for (auto _ : state) TinyStep(*model, dp, x);
  const double step_us = 1e6 * SecondsSince(start) / static_cast<double>(state.iterations());
  benchmark::DoNotOptimize(model->weight().grad().data<float>()[0]);
  state.counters["direct_us"] = direct_us;
  state.counters["us_per_device"] = step_us / devices;
  state.counters["overhead_us_per_device"] = (step_us - direct_us) / devices;
}
BENCHMARK(BM_Linear5x2_DataParallel)
    ->ArgName("devices")
    ->Arg(1)
    ->Arg(2)
    ->Arg(4)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// ---- (b) the MLP, one device against two -------------------------------------------------------

constexpr int64_t kMlpBatch = 256;

struct Mlp {
  std::shared_ptr<nn::Sequential> model;
  Tensor x;
  Tensor labels;
  nn::CrossEntropyLoss criterion;

  Mlp() {
    manual_seed(0);
    model = std::make_shared<nn::Sequential>(nn::Linear(784, 256), nn::ReLU(), nn::Linear(256, 128),
                                             nn::ReLU(), nn::Linear(128, 10));
    x = randn({kMlpBatch, 784});
    std::vector<int64_t> classes(kMlpBatch);
    for (int64_t i = 0; i < kMlpBatch; ++i) classes[i] = i % 10;
    labels = from_vector(classes, {kMlpBatch});
  }

  int64_t parameter_bytes() const {
    int64_t bytes = 0;
    for (const Tensor& p : model->parameters()) bytes += p.numel() * 4;
    return bytes;
  }

  // One forward+backward on cpu:0 alone (the calling thread and cpu:0's pool).
  void SingleStep() {
    model->zero_grad();
    criterion.forward(model->forward(x), labels).backward();
  }

  // One forward+backward under DataParallel.
  void ParallelStep(DataParallel& dp, bool forward_loss) {
    model->zero_grad();
    Tensor loss = forward_loss ? dp.forward_loss(criterion, x, labels)
                               : criterion.forward(dp.forward(x), labels);
    loss.backward();
  }
};

// How DataParallel reduces the gradients: buckets of the default size (1 MiB: one bucket for
// this 0.94 MB MLP), of 256 KiB (two: the reduction of the last layers starts while the first
// layer's backward runs), or one bucket whatever the size.
enum class Buckets { kDefault, k256KiB, kOne };

void SetBuckets(DataParallel& dp, Buckets buckets) {
  if (buckets == Buckets::k256KiB) dp.set_bucket_bytes(size_t{256} << 10);
  if (buckets == Buckets::kOne) dp.set_bucket_bytes(std::numeric_limits<size_t>::max() / 2);
}

void BM_Mlp_OneDevice(benchmark::State& state) {
  UseCpuDevices(state, 2);
  Mlp mlp;
  for (int i = 0; i < 3; ++i) mlp.SingleStep();
  for (auto _ : state) mlp.SingleStep();
  state.SetItemsProcessed(state.iterations() * kMlpBatch);
}
BENCHMARK(BM_Mlp_OneDevice)->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_Mlp_DataParallel(benchmark::State& state, bool forward_loss, Buckets buckets) {
  UseCpuDevices(state, 2);
  Mlp mlp;
  DataParallel dp(mlp.model, CpuDevices(2));
  SetBuckets(dp, buckets);
  for (int i = 0; i < 3; ++i) mlp.ParallelStep(dp, forward_loss);
  for (auto _ : state) mlp.ParallelStep(dp, forward_loss);
  state.SetItemsProcessed(state.iterations() * kMlpBatch);
}
BENCHMARK_CAPTURE(BM_Mlp_DataParallel, gathered, false, Buckets::kDefault)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Mlp_DataParallel, gathered_256KiB_buckets, false, Buckets::k256KiB)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Mlp_DataParallel, gathered_one_bucket, false, Buckets::kOne)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Mlp_DataParallel, forward_loss, true, Buckets::kDefault)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Mlp_DataParallel, forward_loss_256KiB_buckets, true, Buckets::k256KiB)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Mlp_DataParallel, forward_loss_one_bucket, true, Buckets::kOne)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// ---- (e) replicate -----------------------------------------------------------------------------

void BM_Replicate_Mlp(benchmark::State& state) {
  const int devices = static_cast<int>(state.range(0));
  UseCpuDevices(state, devices);
  Mlp mlp;
  Replicator replicator(mlp.model, CpuDevices(devices));
  for (int i = 0; i < 10; ++i) benchmark::DoNotOptimize(replicator.Replicate());
  for (auto _ : state) benchmark::DoNotOptimize(replicator.Replicate());
}
BENCHMARK(BM_Replicate_Mlp)
    ->ArgName("devices")
    ->Arg(2)
    ->Arg(3)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

void BM_ReplicateStructure_Mlp(benchmark::State& state) {
  UseCpuDevices(state, 2);
  Mlp mlp;
  nn::Module::TensorBindings bindings;
  for (const Tensor& p : mlp.model->parameters()) bindings.emplace(p.impl(), p);
  for (auto _ : state) benchmark::DoNotOptimize(mlp.model->replicate_structure(bindings));
}
BENCHMARK(BM_ReplicateStructure_Mlp)->UseRealTime()->Unit(benchmark::kMicrosecond);

// ---- (c) a perfectly parallel reference ---------------------------------------------------------

// As long as the MLP's step on one device (about 10 ms on one thread).
constexpr double kLoopSeconds = 0.01;

void BM_ParallelLoop(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  UseCpuDevices(state, 2);
  const int64_t reps = CalibratedReps(kLoopSeconds);
  for (auto _ : state) benchmark::DoNotOptimize(ReferenceLoop(CpuDevices(threads), reps));
}
BENCHMARK(BM_ParallelLoop)
    ->ArgName("threads")
    ->Arg(1)
    ->Arg(2)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// (b) and (c) interleaved: each iteration times one step of every variant, so all see the
// same machine. Counters: the step times (ms), each speed-up over one device, and each
// speed-up's ratio to the reference loop's (the target is at least 0.9).
void BM_Speedup(benchmark::State& state, Buckets buckets) {
  UseCpuDevices(state, 2);
  Mlp mlp;
  DataParallel dp(mlp.model, CpuDevices(2));
  SetBuckets(dp, buckets);
  const int64_t reps = CalibratedReps(kLoopSeconds);
  const std::vector<Device> one = CpuDevices(1), two = CpuDevices(2);
  for (int i = 0; i < 2; ++i) {
    mlp.SingleStep();
    mlp.ParallelStep(dp, false);
    mlp.ParallelStep(dp, true);
  }
  double single = 0, gathered = 0, forward_loss = 0, loop1 = 0, loop2 = 0;
  auto time = [](double& total, auto&& work) {
    const auto start = Clock::now();
    work();
    total += SecondsSince(start);
  };
  for (auto _ : state) {
    time(single, [&] { mlp.SingleStep(); });
    time(gathered, [&] { mlp.ParallelStep(dp, false); });
    time(forward_loss, [&] { mlp.ParallelStep(dp, true); });
    time(loop1, [&] { benchmark::DoNotOptimize(ReferenceLoop(one, reps)); });
    time(loop2, [&] { benchmark::DoNotOptimize(ReferenceLoop(two, reps)); });
  }
  const double n = static_cast<double>(state.iterations());
  const double loop_speedup = loop1 / loop2;
  state.counters["one_device_ms"] = 1e3 * single / n;
  state.counters["dp_ms"] = 1e3 * gathered / n;
  state.counters["dp_forward_loss_ms"] = 1e3 * forward_loss / n;
  state.counters["loop_speedup"] = loop_speedup;
  state.counters["dp_speedup"] = single / gathered;
  state.counters["dp_forward_loss_speedup"] = single / forward_loss;
  state.counters["dp_ratio"] = single / gathered / loop_speedup;
  state.counters["dp_forward_loss_ratio"] = single / forward_loss / loop_speedup;
}
BENCHMARK_CAPTURE(BM_Speedup, default_buckets, Buckets::kDefault)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Speedup, 256KiB_buckets, Buckets::k256KiB)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Speedup, one_bucket, Buckets::kOne)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// ---- (d) collectives on the MLP's parameters ----------------------------------------------------

// Two CPU devices, or two CUDA devices (logical ones on one GPU count) when asked for.
bool TwoDevices(benchmark::State& state, bool cuda, std::vector<Device>& devices) {
  if (!cuda) {
    UseCpuDevices(state, 2);
    devices = CpuDevices(2);
    return true;
  }
  if (DeviceCount(DeviceType::kCUDA) < 2) {
    state.SkipWithError(
        "needs two CUDA devices (set TANDEM_CUDA_LOGICAL_DEVICES=2 for two on one GPU)");
    return false;
  }
  devices = {Device::Cuda(0), Device::Cuda(1)};
  return true;
}

void BM_BroadcastCoalesced(benchmark::State& state, bool cuda) {
  std::vector<Device> devices;
  if (!TwoDevices(state, cuda, devices)) return;
  Mlp mlp;
  mlp.model->to(devices[0]);
  const std::vector<Tensor> params = mlp.model->parameters();
  for (auto _ : state) {
    std::vector<std::vector<Tensor>> copies = broadcast_coalesced(params, devices);
    benchmark::DoNotOptimize(copies.back().back().flatten().narrow(0, 0, 1).item());
  }
  state.SetBytesProcessed(state.iterations() * mlp.parameter_bytes() *
                          static_cast<int64_t>(devices.size() - 1));
}
BENCHMARK_CAPTURE(BM_BroadcastCoalesced, cpu, false)->UseRealTime();
BENCHMARK_CAPTURE(BM_BroadcastCoalesced, cuda, true)->UseRealTime();

void BM_ReduceAddCoalesced(benchmark::State& state, bool cuda) {
  std::vector<Device> devices;
  if (!TwoDevices(state, cuda, devices)) return;
  Mlp mlp;
  std::vector<std::vector<Tensor>> per_device;
  for (Device d : devices) {
    std::vector<Tensor> grads;
    for (const Tensor& p : mlp.model->parameters()) {
      grads.push_back(randn(p.shape(), TensorOptions().device(d)));
    }
    per_device.push_back(std::move(grads));
  }
  for (auto _ : state) {
    std::vector<Tensor> sums = reduce_add_coalesced(per_device, devices[0]);
    benchmark::DoNotOptimize(sums.back().flatten().narrow(0, 0, 1).item());
  }
  state.SetBytesProcessed(state.iterations() * mlp.parameter_bytes() *
                          static_cast<int64_t>(devices.size()));
}
BENCHMARK_CAPTURE(BM_ReduceAddCoalesced, cpu, false)->UseRealTime();
BENCHMARK_CAPTURE(BM_ReduceAddCoalesced, cuda, true)->UseRealTime();

}  // namespace
}  // namespace tandem::parallel
