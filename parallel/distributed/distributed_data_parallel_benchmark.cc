// DistributedDataParallel on a bfloat16 (or float64) model: the bytes each rank hands to the
// all-reduce per step (the buckets a communication hook sees) and the step time (forward,
// cross-entropy, backward, SGD) of an MLP 784-1024-1024-10 at batch 64 per rank. Buckets hold
// their parameters' dtype, so a bfloat16 model sends 2 bytes a gradient (float32 buckets sent
// 4). Run under mpirun; rank 0 prints:
//
//   bazel build -c opt //parallel/distributed:distributed_data_parallel_benchmark
//   mpirun --allow-run-as-root -np 2 --bind-to none
//   bazel-bin/parallel/distributed/distributed_data_parallel_benchmark [--steps=30]
//   [--dtype=bfloat16|float32|float64]
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "nn/nn.h"
#include "parallel/distributed/distributed_data_parallel.h"
#include "parallel/distributed/process_group_mpi.h"
#include "tensor/tensor.h"

namespace tandem::parallel::distributed {
namespace {

using Clock = std::chrono::steady_clock;

int Main(int argc, char** argv) {
  int steps = 30;
  DType dtype = kBFloat16;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--steps=", 0) == 0) {
      steps = std::max(1, std::atoi(arg.c_str() + 8));
    } else if (arg == "--dtype=bfloat16" || arg == "--dtype=float32" || arg == "--dtype=float64") {
      dtype = arg == "--dtype=bfloat16"  ? kBFloat16
              : arg == "--dtype=float32" ? kFloat32
                                         : kFloat64;
    } else {
      std::fprintf(stderr, "usage: %s [--steps=N] [--dtype=bfloat16|float32|float64]\n", argv[0]);
      return 1;
    }
  }
  // One thread per rank: the ranks are the parallelism.
  SetCpuDeviceCount(1);
  SetCpuThreadsPerDevice(1);
  auto group = std::make_shared<ProcessGroupMpi>();
  constexpr int64_t kBatch = 64;
  manual_seed(1);
  auto model = std::make_shared<nn::Sequential>(
      nn::Linear(784, 1024), nn::ReLU(), nn::Linear(1024, 1024), nn::ReLU(), nn::Linear(1024, 10));
  model->to(dtype);
  int64_t parameters = 0;
  for (const Tensor& p : model->parameters()) parameters += p.numel();
  DistributedDataParallel ddp(model, group);
  int64_t bytes = 0;  // handed to the all-reduce since the step began
  ddp.register_comm_hook(group, [&bytes](ProcessGroup& g, GradBucket& bucket) {
    bytes += bucket.buffer().numel() * static_cast<int64_t>(ElementSize(bucket.buffer().dtype()));
    return allreduce_hook(g, bucket);
  });
  nn::SGD optimizer(model->parameters(), nn::SGDOptions(0.01));
  Generator gen(100 + static_cast<uint64_t>(group->rank()));
  const Tensor x = randn({kBatch, 784}, {}, &gen).to(dtype);
  std::vector<int64_t> labels(kBatch);
  for (int64_t i = 0; i < kBatch; ++i) labels[i] = i % 10;
  const Tensor y = from_vector(labels, {kBatch});
  std::vector<double> times, communication;
  for (int step = 0; step < steps + 3; ++step) {  // 3 warm-up steps
    MPI_Barrier(MPI_COMM_WORLD);
    bytes = 0;
    const Clock::time_point start = Clock::now();
    optimizer.zero_grad();
    cross_entropy(ddp.forward(x), y).backward();
    optimizer.step();
    double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (step < 3) continue;
    times.push_back(seconds);
    communication.push_back(ddp.last_reduction_stats().communication_seconds);
  }
  if (group->rank() == 0) {
    std::sort(times.begin(), times.end());
    std::sort(communication.begin(), communication.end());
    const Tensor grad = model->parameters()[0].grad();
    std::printf(
        "%d ranks, %s MLP 784-1024-1024-10 (%lld parameters), batch %lld per rank, %d steps:\n"
        "  all-reduced per step: %lld bytes (%.2f per parameter); .grad is %s\n"
        "  step: median %.2f ms (range %.2f-%.2f); buckets' all-reduce: median %.2f ms\n",
        group->size(), DTypeName(dtype), static_cast<long long>(parameters),
        static_cast<long long>(kBatch), steps, static_cast<long long>(bytes),
        static_cast<double>(bytes) / static_cast<double>(parameters), DTypeName(grad.dtype()),
        times[times.size() / 2] * 1e3, times.front() * 1e3, times.back() * 1e3,
        communication[communication.size() / 2] * 1e3);
  }
  group->barrier()->wait();
  return 0;
}

}  // namespace
}  // namespace tandem::parallel::distributed

int main(int argc, char** argv) { return tandem::parallel::distributed::Main(argc, argv); }
