// Distributed benchmark, run under mpirun (rank 0 prints):
//
//   bazel build -c opt //parallel/distributed:distributed_benchmark
//   mpirun --allow-run-as-root -np 2 --bind-to none
//   bazel-bin/parallel/distributed/distributed_benchmark [--steps=20]
//
// 1. All-reduce (sum, float32) bandwidth from 4 KB to 64 MB: ProcessGroupMpi
//    (allreduce(t)->wait()) against a bare blocking MPI_Allreduce on the same buffer, in
//    alternating blocks in the same run, each side's median block. Bandwidth is bytes / time
//    per all-reduce (nccl-tests' algbw).
// 1b. DDP's bfloat16 gradient compression against the float32 all-reduce (--nocompression
//    skips it).
// 1c. Sharded data parallelism's collectives (--nosharding skips them): reduce_scatter (sum,
//    float32) against a bare blocking MPI_Reduce_scatter_block, and allgather against a bare
//    MPI_Allgather, of the same buffers, alternating as in 1; bytes are the whole buffer (the
//    reduce-scatter's input, the all-gather's output), world size x chunk.
// 2. A training step (forward, cross-entropy, backward, SGD) of the MLP 784-256-128-10 at
//    batch 256 per rank and of the CNN at batch 32 per rank, one thread per rank: rank 0
//    alone on the plain module (the others sleep), every rank on its own plain module at once
//    (no communication: what the machine allows), and every rank in DistributedDataParallel.
//    Speed-up = ranks x single time / DDP time (throughput), set against the same perfectly
//    parallel reference loop as DataParallel's benchmark (tools/bench) and against the
//    no-communication run. The all-reduce's cost is the buckets' all-reduces run alone; how
//    much of it backward hides is measured twice: by how long the last bucket's reduction
//    ends after the last rank's backward ended (exposed; the ranks share one steady clock on
//    one machine, so the wait for a slower rank's backward is not counted as communication),
//    and by how much longer the DDP step is than the no-communication one (which also counts
//    the CPU that communication takes from backward on a full machine).
// 3. PowerSGD on the small GPT (--nopowersgd skips it): bytes all-reduced per step (this
//    rank's all-reduce inputs, counted by a wrapper around the process group) and step time
//    (forward, loss, backward, AdamW) of DDP against PowerSGD rank 2 (compressing from the
//    first step), in alternating steps, each side's median and range.
// 4. --overlap[=gpt|gpt2] (this section alone): DDP steps of the small GPT (or GPT-2) with
//    25, 4 and 1 MB buckets in float32 and bfloat16 on a network: time in backward, the
//    all-reduces alone, what of them backward did not hide. tools/cluster/overlap_benchmark.sh
//    runs it on two hosts of tools/cluster at 1 and 10 Gbit/s.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "examples/gpt.h"
#include "nn/nn.h"
#include "parallel/distributed/distributed_data_parallel.h"
#include "parallel/distributed/powersgd_hook.h"
#include "parallel/distributed/process_group_mpi.h"
#include "parallel/reference_loop.h"
#include "tensor/tensor.h"

namespace tandem::parallel::distributed {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Seconds per all-reduce of `tensor` over `iters` calls, as rank 0 sees it (between barriers).
template <typename Fn>
double TimeBlock(ProcessGroupMpi& group, int iters, Fn&& allreduce) {
  MPI_Barrier(MPI_COMM_WORLD);
  const Clock::time_point start = Clock::now();
  for (int i = 0; i < iters; ++i) allreduce();
  const double seconds = Seconds(start) / iters;
  MPI_Barrier(MPI_COMM_WORLD);
  double slowest = 0;
  MPI_Allreduce(&seconds, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return slowest;
}

constexpr int kBandwidthRounds = 9;

void AllreduceBandwidth(ProcessGroupMpi& group) {
  if (group.rank() == 0) {
    std::printf(
        "allreduce (sum, float32), %d ranks: GB/s = bytes / time per call; median of %d blocks "
        "each, alternating\n",
        group.size(), kBandwidthRounds);
    std::printf("%10s %14s %14s %12s %12s %8s\n", "bytes", "MPI us", "group us", "MPI GB/s",
                "group GB/s", "ratio");
  }
  for (int64_t bytes = 4 << 10; bytes <= (64 << 20); bytes *= 4) {
    const int64_t n = bytes / 4;
    Tensor tensor = ones({n});
    float* data = tensor.data<float>();
    const int iters = static_cast<int>(std::clamp<int64_t>((256 << 20) / bytes, 5, 2000));
    auto bare = [&] {
      MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    };
    auto through_group = [&] { group.allreduce(tensor)->wait(); };
    TimeBlock(group, 2, bare);  // warm-up
    TimeBlock(group, 2, through_group);
    // Blocks alternate, so that both sides see the same spells of a shared machine, and each
    // side's median block counts (a best-of-a-few let one lucky block decide the ratio: on
    // a VM two blocks of the same code differ by up to 10%).
    std::vector<double> bare_times;
    std::vector<double> group_times;
    for (int round = 0; round < kBandwidthRounds; ++round) {
      bare_times.push_back(TimeBlock(group, iters, bare));
      group_times.push_back(TimeBlock(group, iters, through_group));
    }
    const double bare_time = Median(bare_times);
    const double group_time = Median(group_times);
    if (group.rank() == 0) {
      std::printf("%10lld %14.1f %14.1f %12.2f %12.2f %7.1f%%\n", static_cast<long long>(bytes),
                  bare_time * 1e6, group_time * 1e6, bytes / bare_time / 1e9,
                  bytes / group_time / 1e9, 100.0 * bare_time / group_time);
    }
  }
}

// DistributedDataParallel's gradient_compression(kBFloat16) against float32: per all-reduce
// (average) of n float32 gradients, the float32 all-reduce against the compressed path as DDP
// runs it (bf16_compress_hook: copy into the float32 bucket, cast it to bfloat16, all-reduce,
// cast back into the bucket, copy into .grad) and against rounding straight into a bfloat16 bucket
// (what DDP did before compression became a hook), alternating blocks.
void CompressedAllreduce(ProcessGroupMpi& group) {
  if (group.rank() == 0) {
    std::printf(
        "\nallreduce (average) of float32 gradients, %d ranks: float32 against bfloat16 "
        "compression (bfloat16 all-reduce summing in float32); median of %d\n",
        group.size(), kBandwidthRounds);
    std::printf("%10s %14s %14s %14s %14s %8s\n", "f32 bytes", "float32 us", "bf16 hook us",
                "bf16 bucket us", "bf16 wire us", "ratio");
  }
  for (int64_t bytes = 64 << 10; bytes <= (64 << 20); bytes *= 4) {
    const int64_t n = bytes / 4;
    Tensor grads = full({n}, 0.001 * (group.rank() + 1));
    Tensor plain = grads.clone();
    Tensor flat = grads.clone();
    Tensor bucket = grads.to(kBFloat16);
    const int iters = static_cast<int>(std::clamp<int64_t>((256 << 20) / bytes, 5, 2000));
    auto float32 = [&] { group.allreduce(plain, ReduceOp::kAverage)->wait(); };
    auto hooked = [&] {
      flat.copy_(grads);
      Tensor compressed = flat.to(kBFloat16);
      group.allreduce(compressed, ReduceOp::kAverage)->wait();
      flat.copy_(compressed);
      grads.copy_(flat);
    };
    auto in_bucket = [&] {
      bucket.copy_(grads);
      group.allreduce(bucket, ReduceOp::kAverage)->wait();
      grads.copy_(bucket);
    };
    auto wire_only = [&] { group.allreduce(bucket, ReduceOp::kAverage)->wait(); };
    TimeBlock(group, 2, float32);
    TimeBlock(group, 2, hooked);
    TimeBlock(group, 2, in_bucket);
    std::vector<double> float_times, hooked_times, bucket_times, wire_times;
    for (int round = 0; round < kBandwidthRounds; ++round) {
      float_times.push_back(TimeBlock(group, iters, float32));
      hooked_times.push_back(TimeBlock(group, iters, hooked));
      bucket_times.push_back(TimeBlock(group, iters, in_bucket));
      wire_times.push_back(TimeBlock(group, iters, wire_only));
    }
    const double f = Median(float_times);
    const double c = Median(hooked_times);
    if (group.rank() == 0) {
      std::printf("%10lld %14.1f %14.1f %14.1f %14.1f %7.2fx\n", static_cast<long long>(bytes),
                  f * 1e6, c * 1e6, Median(bucket_times) * 1e6, Median(wire_times) * 1e6, c / f);
    }
  }
}

// reduce_scatter and allgather (ZeRO's and FSDP's collectives) against the bare MPI calls.
void ShardingCollectives(ProcessGroupMpi& group) {
  const int world = group.size();
  if (group.rank() == 0) {
    std::printf(
        "\nreduce_scatter (sum, float32) and allgather, %d ranks: bytes = world x chunk; GB/s "
        "= bytes / time per call; median of %d blocks each, alternating\n",
        world, kBandwidthRounds);
    std::printf("%10s %10s %10s %10s %7s %10s %10s %10s %7s\n", "bytes", "RS MPI us", "RS us",
                "RS GB/s", "ratio", "AG MPI us", "AG us", "AG GB/s", "ratio");
  }
  for (int64_t bytes = 4 << 10; bytes <= (64 << 20); bytes *= 4) {
    const int64_t chunk = bytes / 4 / world;
    const int64_t total = chunk * world;
    Tensor input = full({total}, 1.0 + group.rank());
    Tensor shard = zeros({chunk});
    Tensor gathered = zeros({total});
    const int iters = static_cast<int>(std::clamp<int64_t>((256 << 20) / bytes, 5, 2000));
    auto bare_scatter = [&] {
      MPI_Reduce_scatter_block(input.data<float>(), shard.data<float>(), static_cast<int>(chunk),
                               MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    };
    auto group_scatter = [&] { group.reduce_scatter(shard, input)->wait(); };
    auto bare_gather = [&] {
      MPI_Allgather(shard.data<float>(), static_cast<int>(chunk), MPI_FLOAT, gathered.data<float>(),
                    static_cast<int>(chunk), MPI_FLOAT, MPI_COMM_WORLD);
    };
    auto group_gather = [&] { group.allgather(gathered, shard)->wait(); };
    TimeBlock(group, 2, bare_scatter);  // warm-up
    TimeBlock(group, 2, group_scatter);
    TimeBlock(group, 2, bare_gather);
    TimeBlock(group, 2, group_gather);
    std::vector<double> bs, gs, ba, ga;
    for (int round = 0; round < kBandwidthRounds; ++round) {
      bs.push_back(TimeBlock(group, iters, bare_scatter));
      gs.push_back(TimeBlock(group, iters, group_scatter));
      ba.push_back(TimeBlock(group, iters, bare_gather));
      ga.push_back(TimeBlock(group, iters, group_gather));
    }
    const double b_s = Median(bs), g_s = Median(gs), b_a = Median(ba), g_a = Median(ga);
    const double real_bytes = static_cast<double>(total) * 4;
    if (group.rank() == 0) {
      std::printf("%10lld %10.1f %10.1f %10.2f %6.0f%% %10.1f %10.1f %10.2f %6.0f%%\n",
                  static_cast<long long>(total * 4), b_s * 1e6, g_s * 1e6, real_bytes / g_s / 1e9,
                  100.0 * b_s / g_s, b_a * 1e6, g_a * 1e6, real_bytes / g_a / 1e9,
                  100.0 * b_a / g_a);
    }
  }
}

std::shared_ptr<nn::Sequential> MakeModel(const std::string& kind) {
  manual_seed(1);
  if (kind == "mlp") {
    return std::make_shared<nn::Sequential>(nn::Flatten(), nn::Linear(784, 256), nn::ReLU(),
                                            nn::Linear(256, 128), nn::ReLU(), nn::Linear(128, 10));
  }
  return std::make_shared<nn::Sequential>(
      nn::Conv2d(nn::Conv2dOptions(1, 32, 3).padding(1)), nn::ReLU(), nn::MaxPool2d(2),
      nn::Conv2d(nn::Conv2dOptions(32, 64, 3).padding(1)), nn::ReLU(), nn::MaxPool2d(2),
      nn::Flatten(), nn::Linear(64 * 7 * 7, 128), nn::ReLU(), nn::Linear(128, 10));
}

// Median seconds of one training step of `forward` over `steps` (after 3 warm-up steps).
template <typename Forward>
double TimeSteps(nn::Module& model, Forward&& forward, const Tensor& x, const Tensor& y, int steps,
                 std::vector<ReductionStats>* per_step = nullptr,
                 const DistributedDataParallel* ddp = nullptr) {
  nn::SGD optimizer(model.parameters(), nn::SGDOptions(0.01).momentum(0.9));
  std::vector<double> times;
  for (int step = 0; step < steps + 3; ++step) {
    const Clock::time_point start = Clock::now();
    optimizer.zero_grad();
    cross_entropy(forward(x), y).backward();
    optimizer.step();
    if (step < 3) continue;
    times.push_back(Seconds(start));
    if (per_step != nullptr) per_step->push_back(ddp->last_reduction_stats());
  }
  return Median(times);
}

void TrainingStep(const std::shared_ptr<ProcessGroupMpi>& group_ptr, const std::string& kind,
                  int64_t batch, int steps) {
  ProcessGroupMpi& group = *group_ptr;
  const int world = group.size();
  const Tensor x = randn(kind == "mlp" ? Shape{batch, 784} : Shape{batch, 1, 28, 28});
  std::vector<int64_t> labels(batch);
  for (int64_t i = 0; i < batch; ++i) labels[i] = (i * 7 + group.rank()) % 10;
  const Tensor y = from_vector(labels, {batch});

  // Rank 0 alone (the others wait in a barrier, which sleeps).
  double single = 0;
  if (group.rank() == 0) {
    auto model = MakeModel(kind);
    single = TimeSteps(
        *model, [&](const Tensor& in) { return model->forward(in); }, x, y, steps);
  }
  group.barrier()->wait();

  // Every rank on its own plain module at once, with no communication: what the machine's
  // shared caches, memory bandwidth and cores leave of a perfect speed-up for this model, the
  // ceiling for DDP here (the reference loop below touches no memory).
  double independent = 0;
  {
    auto model = MakeModel(kind);
    MPI_Barrier(MPI_COMM_WORLD);
    const double mine = TimeSteps(
        *model, [&](const Tensor& in) { return model->forward(in); }, x, y, steps);
    MPI_Allreduce(&mine, &independent, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  }

  auto model = MakeModel(kind);
  auto ddp = std::make_shared<DistributedDataParallel>(model, group_ptr);
  std::vector<ReductionStats> per_step;
  const double distributed = TimeSteps(
      *model, [&](const Tensor& in) { return ddp->forward(in); }, x, y, steps, &per_step,
      ddp.get());
  double slowest = 0;
  MPI_Allreduce(&distributed, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  // Per step, when the last rank finished backward and when the last one had its gradients
  // reduced (steady_clock is one clock for every process on this machine): what came after
  // the former is communication no rank's backward hid. The wait at the end of backward that
  // DDP measures also holds the time a rank waits for a slower peer to finish its backward.
  ReductionStats total;
  std::vector<double> backward_done, reduced;
  for (const ReductionStats& stats : per_step) {
    total.buckets = stats.buckets;
    total.communication_seconds += stats.communication_seconds;
    total.wait_seconds += stats.wait_seconds;
    backward_done.push_back(
        std::chrono::duration<double>(stats.backward_done.time_since_epoch()).count());
    reduced.push_back(std::chrono::duration<double>(stats.reduced.time_since_epoch()).count());
  }
  MPI_Allreduce(MPI_IN_PLACE, backward_done.data(), static_cast<int>(backward_done.size()),
                MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, reduced.data(), static_cast<int>(reduced.size()), MPI_DOUBLE, MPI_MAX,
                MPI_COMM_WORLD);
  double exposed_after_last = 0;
  for (size_t i = 0; i < reduced.size(); ++i) {
    exposed_after_last += std::max(0.0, reduced[i] - backward_done[i]);
  }
  exposed_after_last /= std::max<size_t>(1, reduced.size());

  // The buckets' all-reduces alone, one after another as DDP issues them (nothing to
  // overlap): what the communication costs when none of it is hidden.
  std::vector<Tensor> buckets;
  {
    std::map<std::string, int64_t> sizes;
    for (const nn::NamedTensor& p : model->named_parameters()) sizes[p.name] = p.value.numel();
    for (const std::vector<std::string>& names : ddp->bucket_parameter_names()) {
      int64_t n = 0;
      for (const std::string& name : names) n += sizes.at(name);
      buckets.push_back(ones({n}));
    }
  }
  std::vector<double> alone_times;
  for (int rep = 0; rep < 3 + steps; ++rep) {
    MPI_Barrier(MPI_COMM_WORLD);
    const Clock::time_point start = Clock::now();
    std::vector<std::shared_ptr<Work>> works;
    for (const Tensor& bucket : buckets)
      works.push_back(group.allreduce(bucket, ReduceOp::kAverage));
    for (const std::shared_ptr<Work>& work : works) work->wait();
    if (rep >= 3) alone_times.push_back(Seconds(start));
  }
  double alone = 0;
  const double my_alone = Median(alone_times);
  MPI_Allreduce(&my_alone, &alone, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);

  // The perfectly parallel reference: the same work on rank 0 alone, then on every rank.
  const int64_t reps = parallel::CalibratedReps(0.05);
  double ref_single = 0;
  if (group.rank() == 0) {
    std::vector<double> t;
    for (int i = 0; i < 5; ++i) {
      const Clock::time_point start = Clock::now();
      parallel::ReferenceKernel(reps, 1.0f);
      t.push_back(Seconds(start));
    }
    ref_single = Median(t);
  }
  group.barrier()->wait();
  std::vector<double> t;
  for (int i = 0; i < 5; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    const Clock::time_point start = Clock::now();
    parallel::ReferenceKernel(reps, 1.0f);
    double mine = Seconds(start);
    double worst = 0;
    MPI_Allreduce(&mine, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    t.push_back(worst);
  }
  const double ref_all = Median(t);

  if (group.rank() == 0) {
    const double speedup = world * single / slowest;
    const double ideal = world * ref_single / ref_all;
    const int64_t params = [&] {
      int64_t p = 0;
      for (const Tensor& w : model->parameters()) p += w.numel();
      return p;
    }();
    const double ceiling = world * single / independent;
    const double waited = total.wait_seconds / steps;
    const double extra = slowest - independent;
    std::printf(
        "%s batch %lld/rank (%.2f MB of gradients, %d bucket(s)): 1 rank %.2f ms/step; %d ranks "
        "%.2f ms/step in DDP, %.2f ms/step each on its own (no communication)\n"
        "  throughput speed-up %.2fx: %.0f%% of the reference loop's %.2fx, %.0f%% of the "
        "%.2fx without communication\n"
        "  all-reduce: the buckets alone %.2f ms/step; in DDP %.2f ms/step of it still to go "
        "after the last rank's backward (%.0f%% hidden); the end of backward waited %.2f "
        "ms/step (that, and for the slower rank); the DDP step takes %.2f ms more than without "
        "communication (%.0f%% hidden by that measure); group's thread %.2f ms/step, %.0f%% of "
        "it while backward ran\n",
        kind.c_str(), static_cast<long long>(batch), params * 4 / 1e6, total.buckets, single * 1e3,
        world, slowest * 1e3, independent * 1e3, speedup, 100 * speedup / ideal, ideal,
        100 * speedup / ceiling, ceiling, alone * 1e3, exposed_after_last * 1e3,
        100 * std::clamp(1 - exposed_after_last / alone, 0.0, 1.0), waited * 1e3, extra * 1e3,
        100 * std::clamp(1 - extra / alone, 0.0, 1.0), total.communication_seconds / steps * 1e3,
        100 * total.overlap_fraction());
  }
}

// --- 3. PowerSGD on the GPT -------------------------------------------------------------------

// A process group that counts the bytes it is given to all-reduce and passes everything on.
class CountingProcessGroup : public ProcessGroup {
 public:
  explicit CountingProcessGroup(std::shared_ptr<ProcessGroup> inner)
      : ProcessGroup(inner->rank(), inner->size()), inner_(std::move(inner)) {}
  std::string backend() const override { return inner_->backend(); }
  Device device() const override { return inner_->device(); }
  std::shared_ptr<Work> allreduce(Tensor tensor, ReduceOp op) override {
    allreduced_bytes += tensor.numel() * static_cast<int64_t>(ElementSize(tensor.dtype()));
    return inner_->allreduce(std::move(tensor), op);
  }
  std::shared_ptr<Work> broadcast(Tensor tensor, int root) override {
    return inner_->broadcast(std::move(tensor), root);
  }
  std::shared_ptr<Work> allgather(Tensor output, Tensor input) override {
    return inner_->allgather(std::move(output), std::move(input));
  }
  std::shared_ptr<Work> reduce_scatter(Tensor output, Tensor input, ReduceOp op) override {
    return inner_->reduce_scatter(std::move(output), std::move(input), op);
  }
  std::shared_ptr<Work> barrier() override { return inner_->barrier(); }

  int64_t allreduced_bytes = 0;

 private:
  std::shared_ptr<ProcessGroup> inner_;
};

void PowerSgdGpt(const std::shared_ptr<ProcessGroupMpi>& mpi, int64_t batch, int pairs) {
  const examples::GptConfig config = examples::GptConfig::Small().dropout(0.0);
  const int64_t tokens = config.block_size();
  const examples::TokenBatch data = examples::SyntheticTokenBatch(
      config, batch, tokens, /*seed=*/100 + static_cast<uint64_t>(mpi->rank()));
  const Tensor &x = data.x, &y = data.y;
  struct Side {
    std::string name;
    std::shared_ptr<CountingProcessGroup> group;
    std::shared_ptr<examples::Gpt> model;
    std::shared_ptr<DistributedDataParallel> ddp;
    std::unique_ptr<nn::AdamW> optimizer;
    std::vector<double> times, bytes, losses;
  };
  std::vector<Side> sides(2);
  int64_t parameters = 0;
  for (int k = 0; k < 2; ++k) {
    Side& side = sides[k];
    side.name = k == 0 ? "DDP (float32 all-reduce)" : "PowerSGD rank 2";
    side.group = std::make_shared<CountingProcessGroup>(mpi);
    manual_seed(5);
    side.model = std::make_shared<examples::Gpt>(config);
    side.ddp = std::make_shared<DistributedDataParallel>(side.model, side.group);
    if (k == 1) {
      side.ddp->register_comm_hook(
          std::make_shared<PowerSGDState>(
              side.group, PowerSGDOptions().matrix_approximation_rank(2).start_powerSGD_iter(0)),
          powersgd_hook);
    }
    side.optimizer = std::make_unique<nn::AdamW>(side.model->parameters(), nn::AdamWOptions(1e-3));
    parameters = 0;
    for (const Tensor& p : side.model->parameters()) parameters += p.numel();
  }
  // Alternating steps (DDP, PowerSGD, DDP, ...), so that both see the same machine; the first
  // pair warms up.
  for (int pair = 0; pair <= pairs; ++pair) {
    for (Side& side : sides) {
      MPI_Barrier(MPI_COMM_WORLD);
      side.group->allreduced_bytes = 0;
      const Clock::time_point start = Clock::now();
      side.optimizer->zero_grad();
      Tensor loss = side.model->loss(side.ddp->forward(x), y);
      loss.backward();
      side.optimizer->step();
      double seconds = Seconds(start);
      MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (pair == 0) continue;
      side.times.push_back(seconds);
      side.bytes.push_back(static_cast<double>(side.group->allreduced_bytes));
      side.losses.push_back(loss.item());
    }
  }
  if (mpi->rank() != 0) return;
  std::printf(
      "\nPowerSGD on the small GPT (%lld parameters), batch %lld x %lld tokens per rank, "
      "%d ranks, %d alternating pairs of steps (AdamW 1e-3):\n",
      static_cast<long long>(parameters), static_cast<long long>(batch),
      static_cast<long long>(tokens), mpi->size(), pairs);
  for (const Side& side : sides) {
    const auto [fastest, slowest] = std::minmax_element(side.times.begin(), side.times.end());
    std::printf(
        "  %-26s %10.0f bytes all-reduced/step   step %7.1f ms (median; %.1f-%.1f)   "
        "loss %.4f after %d steps\n",
        side.name.c_str(), Median(side.bytes), 1e3 * Median(side.times), 1e3 * *fastest,
        1e3 * *slowest, side.losses.back(), pairs + 1);
  }
  std::printf("  PowerSGD / DDP: bytes %.4fx, step time %.2fx (medians)\n",
              Median(sides[1].bytes) / Median(sides[0].bytes),
              Median(sides[1].times) / Median(sides[0].times));
}

// 4. Overlap on a network (--overlap; see tools/cluster/overlap_benchmark.sh, which runs it on
// two hosts of tools/cluster at 1 and 10 Gbit/s): DDP training steps of a GPT (examples/gpt.h)
// with each bucket size and gradient dtype of `settings`, reporting per step the time in
// backward (this rank's, until its last gradient was ready), the buckets' all-reduces run
// alone (their cost when nothing hides them), how much of them was still to go after the last
// rank's backward (steady_clock is one clock for all the namespaces of one machine) and the
// fraction hidden. Self-contained: its own model, data and DDP per setting.
struct OverlapSetting {
  const char* name;
  double bucket_cap_mb;
  std::optional<DType> compression;
};

void NetworkOverlap(const std::shared_ptr<ProcessGroupMpi>& group, const std::string& kind,
                    int steps) {
  const examples::GptConfig config =
      kind == "gpt2" ? examples::GptConfig::Gpt2() : examples::GptConfig::Small().dropout(0.0);
  const int64_t batch = kind == "gpt2" ? 1 : 8, tokens = kind == "gpt2" ? 256 : 128;
  const examples::TokenBatch data = examples::SyntheticTokenBatch(
      config, batch, tokens, /*seed=*/12345 + static_cast<uint64_t>(group->rank()));
  const Tensor &x = data.x, &y = data.y;
  const OverlapSetting settings[] = {
      {"float32, 25 MB buckets (default)", 25, std::nullopt},
      {"float32, 1 MB buckets", 1, std::nullopt},
      {"float32, 4 MB buckets", 4, std::nullopt},
      {"bf16, 25 MB buckets", 25, kBFloat16},
      {"bf16, 1 MB buckets", 1, kBFloat16},
  };
  char host[MPI_MAX_PROCESSOR_NAME] = {};
  int length = 0;
  MPI_Get_processor_name(host, &length);
  if (group->rank() == 0) {
    std::printf(
        "\noverlap: %s, batch %lld x %lld tokens per rank, SGD, %d ranks (rank 0 on %s); per "
        "step, medians: backward on the slowest rank, the buckets' all-reduces alone, what was "
        "left of them after the last rank's backward, hidden = 1 - left / alone\n",
        kind.c_str(), static_cast<long long>(batch), static_cast<long long>(tokens), group->size(),
        host);
  }
  std::map<std::string, double> alone_of;
  for (const OverlapSetting& setting : settings) {
    manual_seed(1);
    auto model = std::make_shared<examples::Gpt>(config);
    auto ddp =
        std::make_shared<DistributedDataParallel>(model, group,
                                                  DistributedDataParallelOptions()
                                                      .bucket_cap_mb(setting.bucket_cap_mb)
                                                      .gradient_compression(setting.compression));
    nn::SGD optimizer(ddp->parameters(), nn::SGDOptions(1e-4));
    std::vector<double> backward, backward_done, reduced;
    for (int step = 0; step < steps + 2; ++step) {
      optimizer.zero_grad();
      MPI_Barrier(MPI_COMM_WORLD);
      Tensor loss = model->loss(ddp->forward(x), y);
      const Clock::time_point backward_start = Clock::now();
      loss.backward();
      optimizer.step();
      if (step < 2) continue;  // warm-up
      const ReductionStats stats = ddp->last_reduction_stats();
      backward.push_back(
          std::chrono::duration<double>(stats.backward_done - backward_start).count());
      backward_done.push_back(
          std::chrono::duration<double>(stats.backward_done.time_since_epoch()).count());
      reduced.push_back(std::chrono::duration<double>(stats.reduced.time_since_epoch()).count());
    }
    const int n = static_cast<int>(backward.size());
    MPI_Allreduce(MPI_IN_PLACE, backward.data(), n, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, backward_done.data(), n, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, reduced.data(), n, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    std::vector<double> left(n);
    for (int i = 0; i < n; ++i) left[i] = std::max(0.0, reduced[i] - backward_done[i]);

    // The same buckets, in the same dtype, all-reduced alone as DDP issues them.
    std::map<std::string, int64_t> sizes;
    for (const nn::NamedTensor& p : model->named_parameters()) sizes[p.name] = p.value.numel();
    std::vector<Tensor> buckets;
    for (const std::vector<std::string>& names : ddp->bucket_parameter_names()) {
      int64_t elements = 0;
      for (const std::string& name : names) elements += sizes.at(name);
      buckets.push_back(ones({elements}).to(setting.compression.value_or(kFloat32)));
    }
    // The last bucket issued holds the first layers' gradients, ready only when backward ends:
    // its all-reduce can hide behind nothing, which bounds the fraction hidden.
    std::string bucket_mb;
    for (const Tensor& bucket : buckets) {
      char mb[32];
      std::snprintf(mb, sizeof(mb), "%s%.2f", bucket_mb.empty() ? "" : "+",
                    bucket.numel() * 4 / 1e6);
      bucket_mb += mb;
    }
    std::vector<double> alone_times;
    for (int rep = 0; rep < steps + 2; ++rep) {
      MPI_Barrier(MPI_COMM_WORLD);
      const Clock::time_point start = Clock::now();
      std::vector<std::shared_ptr<Work>> works;
      for (const Tensor& bucket : buckets) {
        works.push_back(group->allreduce(bucket, ReduceOp::kAverage));
      }
      for (const std::shared_ptr<Work>& work : works) work->wait();
      double seconds = Seconds(start);
      MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (rep >= 2) alone_times.push_back(seconds);
    }
    const double alone = Median(alone_times), exposed = Median(left);
    alone_of[setting.name] = alone;
    if (group->rank() == 0) {
      std::printf(
          "  %-34s buckets of %s MB (float32, in issue order): backward %.1f ms, all-reduce "
          "alone %.1f ms, left after backward %.1f ms, hidden %.0f%%\n",
          setting.name, bucket_mb.c_str(), Median(backward) * 1e3, alone * 1e3, exposed * 1e3,
          100 * std::clamp(1 - exposed / alone, 0.0, 1.0));
    }
  }
  if (group->rank() == 0) {
    std::printf(
        "  bf16 against float32 communication (buckets alone): %.2fx at 25 MB, %.2fx at 1 MB\n",
        alone_of["float32, 25 MB buckets (default)"] / alone_of["bf16, 25 MB buckets"],
        alone_of["float32, 1 MB buckets"] / alone_of["bf16, 1 MB buckets"]);
  }
}

int Main(int argc, char** argv) {
  bool allreduce = true;
  bool train = true;
  bool compression = true;
  bool sharding = true;
  bool powersgd = true;
  int steps = 20;
  std::string overlap;  // --overlap=gpt or gpt2: section 3 alone
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--overlap" || arg == "--overlap=gpt" || arg == "--overlap=gpt2") {
      overlap = arg == "--overlap=gpt2" ? "gpt2" : "gpt";
    } else if (arg == "--noallreduce") {
      allreduce = false;
    } else if (arg == "--notrain") {
      train = false;
    } else if (arg == "--nocompression") {
      compression = false;
    } else if (arg == "--nosharding") {
      sharding = false;
    } else if (arg == "--nopowersgd") {
      powersgd = false;
    } else if (arg.rfind("--steps=", 0) == 0) {
      steps = std::atoi(arg.c_str() + 8);
    } else {
      std::fprintf(
          stderr,
          "usage: %s [--noallreduce] [--nocompression] [--nosharding] [--notrain] [--nopowersgd] "
          "[--steps=N] [--overlap[=gpt|gpt2]]\n",
          argv[0]);
      return 1;
    }
  }
  // One logical CPU device with one thread per rank: the ranks are the parallelism.
  SetCpuDeviceCount(1);
  SetCpuThreadsPerDevice(1);
  auto group = std::make_shared<ProcessGroupMpi>();
  if (group->rank() == 0) {
    std::printf("%d ranks, 1 thread each (plus each group's communication thread)\n\n",
                group->size());
  }
  if (!overlap.empty()) {
    NetworkOverlap(group, overlap, steps);
    group->barrier()->wait();
    return 0;
  }
  if (allreduce) AllreduceBandwidth(*group);
  if (compression) CompressedAllreduce(*group);
  if (sharding) ShardingCollectives(*group);
  if (train) {
    if (group->rank() == 0) std::printf("\n");
    TrainingStep(group, "mlp", 256, steps);
    TrainingStep(group, "cnn", 32, steps / 2);
  }
  if (powersgd) PowerSgdGpt(group, 8, steps / 2);
  group->barrier()->wait();
  return 0;
}

}  // namespace
}  // namespace tandem::parallel::distributed

int main(int argc, char** argv) { return tandem::parallel::distributed::Main(argc, argv); }
