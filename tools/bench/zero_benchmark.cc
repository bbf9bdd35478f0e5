// ZeRO-1 (ZeroRedundancyOptimizer) against DistributedDataParallel with the plain optimizer, on
// the same GPT step with AdamW, side by side under mpirun: each rank's memory and the step time.
//
//   bazel build -c opt //tools/bench:zero_benchmark
//   mpirun -np 2 --oversubscribe bazel-bin/tools/bench/zero_benchmark --model=gpt2 --rounds=3
//
// Each round builds the model afresh for each scheme, alternating which goes first, runs
// --warmup then --steps steps (the step time is the slowest rank's), and reads the allocator
// after the last optimizer step, before zero_grad: what a rank holds between steps
// (parameters, gradients, DDP's gradient buckets, optimizer state), the optimizer state alone,
// and the step's peak. ZeRO's accounting for AdamW in float32 is 16P bytes a rank for DDP and
// 8P + 8P/N for ZeRO-1 (parameters 4P, gradients 4P, state 8P or 8P/N); Tandem's DDP also
// holds its gradient buckets (4P more, as PyTorch without gradient_as_bucket_view).
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "examples/cli.h"
#include "examples/gpt.h"
#include "nn/nn.h"
#include "parallel/distributed/distributed_data_parallel.h"
#include "parallel/distributed/process_group_mpi.h"
#include "parallel/distributed/zero_redundancy_optimizer.h"
#include "tensor/runtime/allocator.h"
#include "tensor/tensor.h"

ABSL_FLAG(std::string, model, "gpt", "gpt (the small byte-level GPT) or gpt2 (GPT-2 124M)");
ABSL_FLAG(int64_t, batch_size, 0, "sequences per rank (0: 8 for gpt, 2 for gpt2)");
ABSL_FLAG(int64_t, tokens, 64, "tokens per sequence (at most the context)");
ABSL_FLAG(int, steps, 3, "timed steps per scheme and round");
ABSL_FLAG(int, warmup, 1, "untimed steps before them");
ABSL_FLAG(int, rounds, 3, "rounds; each runs both schemes, alternating which goes first");

namespace tandem::tools {
namespace {

using parallel::distributed::DistributedDataParallel;
using parallel::distributed::MakeOptimizerFactory;
using parallel::distributed::ProcessGroupMpi;
using parallel::distributed::ZeroRedundancyOptimizer;

struct Measure {
  double step_ms = 0;       // median over the timed steps of the slowest rank's time
  int64_t held_bytes = 0;   // in use after the optimizer step (most of any rank)
  int64_t state_bytes = 0;  // optimizer state (most of any rank)
  int64_t peak_bytes = 0;   // the steps' peak (most of any rank)
};

int64_t StateBytes(const nn::OptimizerState& state) {
  int64_t bytes = 0;
  for (const auto& [name, value] : state) {
    bytes += value.numel() * static_cast<int64_t>(ElementSize(value.dtype()));
  }
  return bytes;
}

int64_t MaxOverRanks(int64_t value) {
  int64_t most = 0;
  MPI_Allreduce(&value, &most, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
  return most;
}

Measure Run(const std::shared_ptr<ProcessGroupMpi>& group, bool zero,
            const examples::GptConfig& config, const Tensor& x, const Tensor& y) {
  const Device cpu = Device::Cpu(0);
  manual_seed(1);
  auto model = std::make_shared<examples::Gpt>(config);
  DistributedDataParallel ddp(model, group);
  const nn::AdamWOptions adamw = nn::AdamWOptions(6e-4).weight_decay(0.1);
  std::unique_ptr<nn::Optimizer> optimizer;
  ZeroRedundancyOptimizer* sharded = nullptr;
  if (zero) {
    auto owned = std::make_unique<ZeroRedundancyOptimizer>(model->parameters(), group,
                                                           MakeOptimizerFactory<nn::AdamW>(adamw));
    sharded = owned.get();
    optimizer = std::move(owned);
  } else {
    optimizer = std::make_unique<nn::AdamW>(model->parameters(), adamw);
  }
  const int warmup = absl::GetFlag(FLAGS_warmup), steps = absl::GetFlag(FLAGS_steps);
  std::vector<double> times;
  Measure m;
  ResetPeakMemory(cpu);
  for (int step = 0; step < warmup + steps; ++step) {
    optimizer->zero_grad();
    MPI_Barrier(MPI_COMM_WORLD);
    const double start = MPI_Wtime();
    model->loss(ddp.forward(x), y).backward();
    optimizer->step();
    double seconds = MPI_Wtime() - start;
    MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (step >= warmup) times.push_back(seconds * 1e3);
    if (step + 1 == warmup + steps) {
      m.held_bytes = MaxOverRanks(GetMemoryStats(cpu).in_use_bytes);
      m.peak_bytes = MaxOverRanks(GetMemoryStats(cpu).peak_bytes);
      m.state_bytes = MaxOverRanks(StateBytes(
          sharded != nullptr ? sharded->local_optimizer().state_dict() : optimizer->state_dict()));
    }
  }
  std::sort(times.begin(), times.end());
  m.step_ms = times[times.size() / 2];
  return m;
}

std::string MiB(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return text;
}

int Main() {
  // One logical CPU device with one thread per rank: the ranks are the parallelism.
  SetCpuDeviceCount(1);
  SetCpuThreadsPerDevice(1);
  auto group = std::make_shared<ProcessGroupMpi>();
  const bool lead = group->rank() == 0;
  const std::string kind = absl::GetFlag(FLAGS_model);
  examples::Require(kind == "gpt" || kind == "gpt2", "--model must be 'gpt' or 'gpt2' but is '",
                    kind, "'");
  const examples::GptConfig config =
      kind == "gpt2" ? examples::GptConfig::Gpt2() : examples::GptConfig::Small().dropout(0.0);
  int64_t batch = absl::GetFlag(FLAGS_batch_size);
  if (batch == 0) batch = kind == "gpt2" ? 2 : 8;
  const int64_t tokens = absl::GetFlag(FLAGS_tokens);
  examples::Require(batch >= 1, "--batch_size must be >= 1 but is ", batch);
  examples::Require(tokens >= 1 && tokens <= config.block_size(), "--tokens must be in [1, ",
                    config.block_size(), "] but is ", tokens);
  examples::Require(absl::GetFlag(FLAGS_steps) >= 1 && absl::GetFlag(FLAGS_warmup) >= 0 &&
                        absl::GetFlag(FLAGS_rounds) >= 1,
                    "--steps and --rounds must be >= 1 and --warmup >= 0");

  // Each rank's own batch: a fixed pseudo-random sequence per row, the targets the next tokens.
  std::vector<int64_t> ids(batch * (tokens + 1));
  uint64_t state = 12345 + static_cast<uint64_t>(group->rank());
  for (int64_t& id : ids) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    id = static_cast<int64_t>((state >> 33) % static_cast<uint64_t>(config.vocab_size()));
  }
  const Tensor all = from_vector(ids, {batch, tokens + 1});
  const Tensor x = all.narrow(1, 0, tokens).contiguous(), y = all.narrow(1, 1, tokens).contiguous();

  int64_t parameters = 0;
  {
    manual_seed(1);
    for (const Tensor& p : examples::Gpt(config).parameters()) parameters += p.numel();
  }
  const int world = group->size();
  if (lead) {
    std::printf(
        "zero_benchmark: %s (%lld parameters), AdamW, %d ranks x 1 thread, batch %lld x "
        "%lld tokens per rank, %d+%d steps x %d rounds\n",
        kind.c_str(), static_cast<long long>(parameters), world, static_cast<long long>(batch),
        static_cast<long long>(tokens), absl::GetFlag(FLAGS_warmup), absl::GetFlag(FLAGS_steps),
        absl::GetFlag(FLAGS_rounds));
    std::printf("  %-6s %-6s %10s %14s %14s %14s\n", "round", "scheme", "step", "held", "opt state",
                "peak");
  }
  std::vector<Measure> ddp, zero;
  std::vector<double> ratios;
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    const bool zero_first = round % 2 == 1;
    Measure d, z;
    if (zero_first) z = Run(group, true, config, x, y);
    d = Run(group, false, config, x, y);
    if (!zero_first) z = Run(group, true, config, x, y);
    ddp.push_back(d);
    zero.push_back(z);
    ratios.push_back(z.step_ms / d.step_ms);
    if (lead) {
      for (const auto& [name, m] : {std::pair<const char*, Measure>{"ddp", d}, {"zero1", z}}) {
        std::printf("  %-6d %-6s %7.1f ms %14s %14s %14s\n", round, name, m.step_ms,
                    MiB(m.held_bytes).c_str(), MiB(m.state_bytes).c_str(),
                    MiB(m.peak_bytes).c_str());
      }
      std::fflush(stdout);
    }
  }
  if (lead) {
    std::sort(ratios.begin(), ratios.end());
    const int64_t p4 = 4 * parameters;
    const Measure& d = ddp.back();
    const Measure& z = zero.back();
    std::printf("\nsummary (%d ranks)\n", world);
    std::printf("  step time zero1 / ddp: median %.2f (rounds %.2f-%.2f)\n",
                ratios[ratios.size() / 2], ratios.front(), ratios.back());
    std::printf("  optimizer state per rank: ddp %s (8P = %s), zero1 %s (8P/N = %s): %.2fx less\n",
                MiB(d.state_bytes).c_str(), MiB(2 * p4).c_str(), MiB(z.state_bytes).c_str(),
                MiB(2 * p4 / world).c_str(),
                static_cast<double>(d.state_bytes) / static_cast<double>(z.state_bytes));
    std::printf(
        "  held per rank: ddp %s (%.2fx of 16P + buckets 4P = %s), zero1 %s (%.2fx of "
        "8P + 8P/N + buckets 4P = %s)\n",
        MiB(d.held_bytes).c_str(), static_cast<double>(d.held_bytes) / (5.0 * p4),
        MiB(5 * p4).c_str(), MiB(z.held_bytes).c_str(),
        static_cast<double>(z.held_bytes) / (3.0 * p4 + 2.0 * p4 / world),
        MiB(3 * p4 + 2 * p4 / world).c_str());
  }
  group->barrier()->wait();
  return 0;
}

}  // namespace
}  // namespace tandem::tools

int main(int argc, char** argv) {
  return tandem::examples::RunMain(argc, argv, "zero_benchmark",
                                   "ZeRO-1 against DDP on a GPT step, under mpirun.\n"
                                   "  mpirun -np 2 zero_benchmark --model=gpt2 --rounds=3",
                                   [] { return tandem::tools::Main(); });
}
