// Sharded data parallelism against DistributedDataParallel with the plain optimizer, on the same
// GPT step with AdamW, side by side under mpirun: each rank's memory and the step time. The
// schemes: ddp, ddp_bucket_view (its gradient_as_bucket_view), zero1 (ZeroRedundancyOptimizer
// over DDP), shard_grad_op and full (FullyShardedDataParallel, one unit per transformer block:
// ZeRO-2 and ZeRO-3), full_prefetch (full with forward_prefetch).
//
//   bazel build -c opt //tools/bench:zero_benchmark
//   mpirun -np 2 --oversubscribe bazel-bin/tools/bench/zero_benchmark --model=gpt2 --rounds=3
//
// Each round builds the model afresh for each scheme, rotating which goes first, runs
// --warmup then --steps steps (the step time is the slowest rank's), and reads the allocator
// after the last optimizer step, before zero_grad: what a rank holds between steps
// (parameters, gradients, DDP's gradient buckets, optimizer state), the optimizer state alone,
// and the step's peak. ZeRO's accounting for AdamW in float32 is 16P bytes a rank for DDP,
// 8P + 8P/N for ZeRO-1 (parameters 4P, gradients 4P, state 8P or 8P/N) and 16P/N between steps
// for both FSDP strategies; Tandem's DDP also holds its gradient buckets (4P more, as PyTorch
// without gradient_as_bucket_view). FSDP's peak adds the units gathered at once: the root
// (embeddings, final norm) and a block or two under full, every unit under shard_grad_op; the
// summary gives the peak against 16P/N plus one and plus three of the largest unit.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_split.h"
#include "examples/cli.h"
#include "examples/gpt.h"
#include "nn/nn.h"
#include "parallel/distributed/distributed_data_parallel.h"
#include "parallel/distributed/fully_sharded_data_parallel.h"
#include "parallel/distributed/process_group_mpi.h"
#include "parallel/distributed/zero_redundancy_optimizer.h"
#include "tensor/base/error.h"
#include "tensor/runtime/allocator.h"
#include "tensor/tensor.h"

ABSL_FLAG(std::string, model, "gpt", "gpt (the small byte-level GPT) or gpt2 (GPT-2 124M)");
ABSL_FLAG(int64_t, batch_size, 0, "sequences per rank (0: 8 for gpt, 2 for gpt2)");
ABSL_FLAG(int64_t, tokens, 64, "tokens per sequence (at most the context)");
ABSL_FLAG(int, steps, 3, "timed steps per scheme and round");
ABSL_FLAG(int, warmup, 1, "untimed steps before them");
ABSL_FLAG(int, rounds, 3, "rounds; each runs every scheme, rotating which goes first");
ABSL_FLAG(int64_t, memory_limit_mib, 0,
          "instead of timing: the largest GPT (--model's width, as many blocks as fit) that "
          "trains --warmup + --steps steps under this limit of allocated memory per rank, for "
          "each scheme");
ABSL_FLAG(std::string, schemes, "ddp,zero1,shard_grad_op,full",
          "the schemes to compare (ddp first: the others' ratios are to it)");

namespace tandem::tools {
namespace {

using parallel::distributed::DistributedDataParallel;
using parallel::distributed::FullyShardedDataParallel;
using parallel::distributed::FullyShardedDataParallelOptions;
using parallel::distributed::MakeOptimizerFactory;
using parallel::distributed::ModuleTypeWrapPolicy;
using parallel::distributed::ProcessGroupMpi;
using parallel::distributed::ShardingStrategy;
using parallel::distributed::ZeroRedundancyOptimizer;

struct Measure {
  double step_ms = 0;       // median over the timed steps of the slowest rank's time
  int64_t held_bytes = 0;   // in use after the optimizer step (most of any rank)
  int64_t state_bytes = 0;  // optimizer state (most of any rank)
  int64_t peak_bytes = 0;   // the steps' peak (most of any rank)
  // The last step's peak in forward, backward and the optimizer step (most of any rank).
  int64_t forward_peak = 0, backward_peak = 0, step_peak = 0;
  int64_t largest_unit_bytes = 0;  // FSDP: its largest unit's parameters, whole
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

Measure Run(const std::shared_ptr<ProcessGroupMpi>& group, const std::string& scheme,
            const examples::GptConfig& config, const Tensor& x, const Tensor& y) {
  const Device cpu = Device::Cpu(0);
  manual_seed(1);
  auto model = std::make_shared<examples::Gpt>(config);
  std::shared_ptr<nn::Module> wrapper;
  const bool fsdp = scheme == "full" || scheme == "full_prefetch" || scheme == "shard_grad_op";
  Measure m;
  if (fsdp) {
    auto sharded_model = std::make_shared<FullyShardedDataParallel>(
        model, group,
        FullyShardedDataParallelOptions()
            .sharding_strategy(scheme == "shard_grad_op" ? ShardingStrategy::kShardGradOp
                                                         : ShardingStrategy::kFullShard)
            .forward_prefetch(scheme == "full_prefetch")
            .auto_wrap_policy(ModuleTypeWrapPolicy<examples::GptBlock>()));
    for (const auto& unit : sharded_model->units()) {
      m.largest_unit_bytes = std::max<int64_t>(m.largest_unit_bytes, unit.numel * 4);
    }
    wrapper = sharded_model;
  } else {
    wrapper = std::make_shared<DistributedDataParallel>(
        model, group,
        parallel::distributed::DistributedDataParallelOptions().gradient_as_bucket_view(
            scheme == "ddp_bucket_view"));
  }
  const nn::AdamWOptions adamw = nn::AdamWOptions(6e-4).weight_decay(0.1);
  std::unique_ptr<nn::Optimizer> optimizer;
  ZeroRedundancyOptimizer* sharded = nullptr;
  if (scheme == "zero1") {
    auto owned = std::make_unique<ZeroRedundancyOptimizer>(model->parameters(), group,
                                                           MakeOptimizerFactory<nn::AdamW>(adamw));
    sharded = owned.get();
    optimizer = std::move(owned);
  } else {
    optimizer = std::make_unique<nn::AdamW>(wrapper->parameters(), adamw);
  }
  const int warmup = absl::GetFlag(FLAGS_warmup), steps = absl::GetFlag(FLAGS_steps);
  std::vector<double> times;
  ResetPeakMemory(cpu);
  for (int step = 0; step < warmup + steps; ++step) {
    optimizer->zero_grad();
    MPI_Barrier(MPI_COMM_WORLD);
    const double start = MPI_Wtime();
    const bool last = step + 1 == warmup + steps;
    int64_t forward_peak = 0, backward_peak = 0, step_peak = 0;
    auto phase_peak = [&](int64_t* peak) {
      if (!last) return;
      *peak = GetMemoryStats(cpu).peak_bytes;
      m.peak_bytes = std::max(m.peak_bytes, *peak);
      ResetPeakMemory(cpu);
    };
    if (last) {
      m.peak_bytes = GetMemoryStats(cpu).peak_bytes;
      ResetPeakMemory(cpu);
    }
    Tensor loss = model->loss(wrapper->forward_tensors({x})[0], y);
    phase_peak(&forward_peak);
    loss.backward();
    loss = Tensor();
    phase_peak(&backward_peak);
    optimizer->step();
    phase_peak(&step_peak);
    double seconds = MPI_Wtime() - start;
    MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (step >= warmup) times.push_back(seconds * 1e3);
    if (last) {
      m.held_bytes = MaxOverRanks(GetMemoryStats(cpu).in_use_bytes);
      m.peak_bytes = MaxOverRanks(m.peak_bytes);
      m.forward_peak = MaxOverRanks(forward_peak);
      m.backward_peak = MaxOverRanks(backward_peak);
      m.step_peak = MaxOverRanks(step_peak);
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

// Whether a GPT of `layers` blocks trains under `scheme` within `limit` bytes per rank (every
// rank's answer: all fit or none). Each try gets a group of its own, in case a rank ran out of
// memory inside a collective (the ranks allocate alike, so they run out at the same point).
bool Fits(const std::string& scheme, examples::GptConfig config, int64_t layers, int64_t limit,
          const Tensor& x, const Tensor& y) {
  config.n_layer(layers);
  const Device cpu = Device::Cpu(0);
  int ok = 1;
  try {
    auto group = std::make_shared<ProcessGroupMpi>(
        parallel::distributed::ProcessGroupMpiOptions().timeout(std::chrono::seconds(120)));
    SetMemoryLimit(cpu, limit);
    const Measure m = Run(group, scheme, config, x, y);
    (void)m;
  } catch (const Error& e) {
    ok = 0;
  }
  SetMemoryLimit(cpu, 0);
  MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return ok == 1;
}

// The parameters of a GPT of `config`'s shape with `layers` blocks (embeddings, blocks, final
// norm; the head is tied to the token embedding).
int64_t ParameterCount(const examples::GptConfig& config, int64_t layers) {
  const int64_t d = config.n_embd(), bias = config.bias() ? 1 : 0;
  const int64_t block = 2 * (d + bias * d)            // two LayerNorms
                        + (d * 3 * d + bias * 3 * d)  // attention's q, k, v
                        + (d * d + bias * d)          // its projection
                        + (d * 4 * d + bias * 4 * d) + (4 * d * d + bias * d);  // the MLP
  return (config.padded_vocab_size() + config.block_size()) * d + layers * block + d + bias * d;
}

// The largest number of blocks that trains under each scheme (doubling, then bisecting).
int Largest(const std::vector<std::string>& schemes, const examples::GptConfig& config,
            const Tensor& x, const Tensor& y, int64_t limit, bool lead) {
  if (lead) {
    std::printf("\nthe largest GPT of this width that trains under %s per rank:\n",
                MiB(limit).c_str());
  }
  std::vector<int64_t> largest(schemes.size(), 0);
  for (size_t s = 0; s < schemes.size(); ++s) {
    auto fits = [&](int64_t layers) {
      const int64_t parameters = ParameterCount(config, layers);
      const bool ok = Fits(schemes[s], config, layers, limit, x, y);
      if (lead) {
        std::printf("  %-13s %3lld blocks (%lld parameters): %s\n", schemes[s].c_str(),
                    static_cast<long long>(layers), static_cast<long long>(parameters),
                    ok ? "trains" : "out of memory");
        std::fflush(stdout);
      }
      if (ok) largest[s] = parameters;
      return ok;
    };
    int64_t good = 0, bad = 1;
    while (fits(bad)) {
      good = bad;
      bad *= 2;
    }
    while (bad - good > 1) {
      const int64_t mid = (good + bad) / 2;
      (fits(mid) ? good : bad) = mid;
    }
  }
  if (lead) {
    std::printf("\nsummary: the largest model under %s per rank\n", MiB(limit).c_str());
    for (size_t s = 0; s < schemes.size(); ++s) {
      std::printf("  %-13s %lld parameters (%.2fx ddp's)\n", schemes[s].c_str(),
                  static_cast<long long>(largest[s]),
                  largest[0] > 0 ? static_cast<double>(largest[s]) / largest[0] : 0.0);
    }
  }
  return 0;
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

  // Each rank's own batch.
  const examples::TokenBatch data = examples::SyntheticTokenBatch(
      config, batch, tokens, /*seed=*/12345 + static_cast<uint64_t>(group->rank()));
  const Tensor &x = data.x, &y = data.y;

  int64_t parameters = 0;
  {
    manual_seed(1);
    for (const Tensor& p : examples::Gpt(config).parameters()) parameters += p.numel();
  }
  examples::Require(ParameterCount(config, config.n_layer()) == parameters,
                    "internal error: ParameterCount gives ",
                    ParameterCount(config, config.n_layer()), " parameters for a GPT of ",
                    parameters);
  const int world = group->size();
  if (lead) {
    std::printf(
        "zero_benchmark: %s (%lld parameters), AdamW, %d ranks x 1 thread, batch %lld x "
        "%lld tokens per rank, %d+%d steps x %d rounds\n",
        kind.c_str(), static_cast<long long>(parameters), world, static_cast<long long>(batch),
        static_cast<long long>(tokens), absl::GetFlag(FLAGS_warmup), absl::GetFlag(FLAGS_steps),
        absl::GetFlag(FLAGS_rounds));
  }
  const std::vector<std::string> schemes =
      absl::StrSplit(absl::GetFlag(FLAGS_schemes), ',', absl::SkipEmpty());
  for (const std::string& scheme : schemes) {
    examples::Require(
        scheme == "ddp" || scheme == "ddp_bucket_view" || scheme == "zero1" ||
            scheme == "shard_grad_op" || scheme == "full" || scheme == "full_prefetch",
        "--schemes takes ddp, ddp_bucket_view, zero1, shard_grad_op, full and full_prefetch, but "
        "has '",
        scheme, "'");
  }
  examples::Require(!schemes.empty() && schemes[0] == "ddp",
                    "--schemes must start with ddp (the others are compared with it)");
  if (const int64_t limit_mib = absl::GetFlag(FLAGS_memory_limit_mib); limit_mib > 0) {
    return Largest(schemes, config, x, y, limit_mib << 20, lead);
  }
  if (lead) {
    std::printf("  %-6s %-13s %10s %14s %14s %14s   %s\n", "round", "scheme", "step", "held",
                "opt state", "peak", "(peak in forward / backward / optimizer step)");
  }
  // measures[s][round]
  std::vector<std::vector<Measure>> measures(schemes.size());
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    for (size_t k = 0; k < schemes.size(); ++k) {
      const size_t s = (k + static_cast<size_t>(round)) % schemes.size();
      measures[s].push_back(Run(group, schemes[s], config, x, y));
      if (lead) {
        const Measure& m = measures[s].back();
        std::printf("  %-6d %-13s %7.1f ms %14s %14s %14s   (%s / %s / %s)\n", round,
                    schemes[s].c_str(), m.step_ms, MiB(m.held_bytes).c_str(),
                    MiB(m.state_bytes).c_str(), MiB(m.peak_bytes).c_str(),
                    MiB(m.forward_peak).c_str(), MiB(m.backward_peak).c_str(),
                    MiB(m.step_peak).c_str());
        std::fflush(stdout);
      }
    }
  }
  if (lead) {
    const double p4 = 4.0 * static_cast<double>(parameters);
    std::printf("\nsummary (%d ranks; P = %lld parameters; formulas for AdamW in float32)\n", world,
                static_cast<long long>(parameters));
    for (size_t s = 0; s < schemes.size(); ++s) {
      // Held between steps: ZeRO's table, plus DDP's gradient buckets (4P) where DDP runs.
      const std::string& name = schemes[s];
      // (gradient_as_bucket_view: .grad lives in the buckets.)
      const double formula = name == "ddp"               ? 5.0 * p4
                             : name == "ddp_bucket_view" ? 4.0 * p4
                             : name == "zero1"           ? 3.0 * p4 + 2.0 * p4 / world
                                                         : 4.0 * p4 / world;
      const char* text = name == "ddp"               ? "16P + buckets 4P"
                         : name == "ddp_bucket_view" ? "16P (.grad in the buckets)"
                         : name == "zero1"           ? "8P + 8P/N + buckets 4P"
                                                     : "16P/N";
      std::vector<double> ratios;
      for (size_t r = 0; r < measures[s].size(); ++r) {
        ratios.push_back(measures[s][r].step_ms / measures[0][r].step_ms);
      }
      std::sort(ratios.begin(), ratios.end());
      const Measure& m = measures[s].back();
      std::printf(
          "  %-13s step / ddp: median %.2f (rounds %.2f-%.2f); held %s = %.2fx of %s (%s); "
          "optimizer state %s; peak %s\n",
          name.c_str(), ratios[ratios.size() / 2], ratios.front(), ratios.back(),
          MiB(m.held_bytes).c_str(), static_cast<double>(m.held_bytes) / formula, text,
          MiB(static_cast<int64_t>(formula)).c_str(), MiB(m.state_bytes).c_str(),
          MiB(m.peak_bytes).c_str());
      if (m.largest_unit_bytes > 0) {
        const double one = formula + m.largest_unit_bytes,
                     three = formula + 3.0 * m.largest_unit_bytes;
        std::printf(
            "  %-13s peak = %.2fx of 16P/N + 1 largest unit (%s), %.2fx of 16P/N + 3 (%s)\n", "",
            m.peak_bytes / one, MiB(static_cast<int64_t>(one)).c_str(), m.peak_bytes / three,
            MiB(static_cast<int64_t>(three)).c_str());
      }
    }
  }
  group->barrier()->wait();
  return 0;
}

}  // namespace
}  // namespace tandem::tools

int main(int argc, char** argv) {
  return tandem::examples::RunMain(
      argc, argv, "zero_benchmark",
      "Sharded data parallelism (ZeRO-1, FSDP) against DDP on a GPT step, under mpirun.\n"
      "  mpirun -np 2 zero_benchmark --model=gpt2 --rounds=3",
      [] { return tandem::tools::Main(); });
}
