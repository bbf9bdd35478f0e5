#include "examples/distributed_training.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "data/distributed_sampler.h"
#include "examples/cli.h"
#include "examples/gpt.h"
#include "examples/train_strategy.h"
#include "examples/trainer.h"
#include "examples/trainer_state.h"
#include "nn/nn.h"
#include "parallel/distributed/distributed_data_parallel.h"
#include "parallel/distributed/fully_sharded_data_parallel.h"
#include "parallel/distributed/join.h"
#include "parallel/distributed/process_group_mpi.h"
#include "parallel/distributed/same_configuration.h"
#include "parallel/distributed/sharded_checkpoint.h"
#include "parallel/distributed/sharded_grad_scaler.h"
#include "parallel/distributed/sync_batch_norm.h"
#include "parallel/distributed/zero_redundancy_optimizer.h"
#include "tensor/tensor.h"

namespace tandem::examples {
namespace distributed = parallel::distributed;
namespace {

// This rank's device: --devices (one), else cuda:<local rank> or cpu:0.
Device ResolveDevice(const std::string& text) {
  if (text.empty()) {
    const int gpus = DeviceCount(DeviceType::kCUDA);
    return gpus > 0 ? Device::Cuda(distributed::LocalRank() % gpus) : Device::Cpu(0);
  }
  const std::vector<Device> devices = ParseDevices(text);
  Require(devices.size() == 1, "--distributed runs one device per process but --devices lists ",
          devices.size(), " (", text, "); start one process per device with mpirun -np N");
  return devices[0];
}

// Sums `values` over the ranks, on every rank (in float32: enough for a report of loss
// sums and sample counts below 2^24).
std::vector<double> SumOverRanks(distributed::ProcessGroup& group, const std::vector<double>& v) {
  std::vector<float> values(v.begin(), v.end());
  Tensor t = from_vector(values, {static_cast<int64_t>(values.size())});
  group.allreduce(t)->wait();
  std::vector<float> summed = t.to_vector<float>();
  return std::vector<double>(summed.begin(), summed.end());
}

// Every rank's generator state for its device, on every rank: {seed, offset} per rank.
std::vector<GeneratorState> GatherGenerators(distributed::ProcessGroup& group, Device device) {
  const GeneratorState own = default_generator(device).state();
  Tensor mine = from_vector(
      std::vector<int64_t>{static_cast<int64_t>(own.seed), static_cast<int64_t>(own.offset)}, {2});
  Tensor all = zeros({2 * group.size()}, kInt64);
  group.allgather(all, mine)->wait();
  const std::vector<int64_t> v = all.to_vector<int64_t>();
  std::vector<GeneratorState> states;
  for (int r = 0; r < group.size(); ++r) {
    states.push_back({static_cast<uint64_t>(v[2 * r]), static_cast<uint64_t>(v[2 * r + 1])});
  }
  return states;
}

// --sharding=full and shard_grad_op: FullyShardedDataParallel's strategy.
std::optional<distributed::ShardingStrategy> FsdpStrategyOf(const std::string& sharding) {
  if (sharding == "full") return distributed::ShardingStrategy::kFullShard;
  if (sharding == "shard_grad_op" || sharding == "zero2") {
    return distributed::ShardingStrategy::kShardGradOp;
  }
  return std::nullopt;
}

// The trainer's optimizer under --sharding=full|shard_grad_op. The trainer makes its optimizer,
// and loads a whole checkpoint into it, over the model's parameters before it wraps the model;
// the flat shards that FullyShardedDataParallel steps exist only once it has (Bind). Until then
// this one keeps a loaded state, in the plain optimizer's layout, and hands each rank its shard
// of it. Its own state is saved sharded (SaveShardedCheckpoint over local()).
class FsdpTrainerOptimizer : public nn::Optimizer {
 public:
  using Factory = std::function<std::unique_ptr<nn::Optimizer>(std::vector<nn::ParamGroup>)>;
  FsdpTrainerOptimizer(std::vector<Tensor> parameters, Factory factory)
      : nn::Optimizer("FullyShardedOptimizer", factory({nn::ParamGroup({})})->defaults().clone()),
        factory_(std::move(factory)),
        model_parameters_(parameters) {
    AddGroups({nn::ParamGroup(std::move(parameters))}, /*from_parameter_list=*/true);
  }

  // From here on its parameters() are the flat shards, whose gradients a GradScaler unscales.
  void Bind(distributed::FullyShardedDataParallel* fsdp) {
    fsdp_ = fsdp;
    parameters_ = fsdp->parameters();
    local_ = factory_({nn::ParamGroup(fsdp->parameters())});
    if (pending_) {
      local_->load_state_dict(fsdp->shard_optimizer_state(*pending_));
      pending_.reset();
    }
  }
  void step() override {
    Require(local_ != nullptr, "internal error: the sharded optimizer stepped before Bind");
    local_->param_groups()[0].set_options(groups_[0].options().clone());  // the trainer's lr
    local_->step();
  }
  void zero_grad(bool set_to_none = true) override {
    if (local_ != nullptr) local_->zero_grad(set_to_none);
  }
  // Sharded checkpoints save and load this one.
  nn::Optimizer& local() { return *local_; }
  nn::OptimizerState state_dict() const override {
    TANDEM_FAIL(
        "internal error: the sharded optimizer's state is saved sharded "
        "(SaveShardedCheckpoint), not by state_dict()");
  }
  void load_state_dict(const nn::OptimizerState& state) override {
    // Checked as the plain optimizer over the model's parameters would check it.
    factory_({nn::ParamGroup(model_parameters_)})->load_state_dict(state);
    if (fsdp_ != nullptr) {
      local_->load_state_dict(fsdp_->shard_optimizer_state(state));
    } else {
      pending_ = state;
    }
  }

 protected:
  void CheckOptions(const nn::OptimizerOptions& options) const override {
    nn::ParamGroup probe({});
    probe.set_options(options.clone());
    factory_({probe});
  }
  void ResizeState(size_t) override {}

 private:
  Factory factory_;
  std::vector<Tensor> model_parameters_;
  distributed::FullyShardedDataParallel* fsdp_ = nullptr;
  std::unique_ptr<nn::Optimizer> local_;  // over the flat shards
  std::optional<nn::OptimizerState> pending_;
};

// A collective evaluation's share of the test set: its batches (of `batch_size`) dealt to the
// ranks in turn, batch b to rank b % world, so that each batch is the one the lead alone would
// score. A rank with fewer than the most batches any rank has repeats batch 0 last (its score
// dropped: the forward only keeps its units' gathers in step with the other ranks').
class EvalShareSampler : public data::Sampler {
 public:
  EvalShareSampler(int64_t size, int64_t batch_size, int rank, int world)
      : size_(size), batch_size_(batch_size) {
    const int64_t batches = (size + batch_size - 1) / batch_size;
    for (int64_t b = rank; b < batches; b += world) own_.push_back(b);
    steps_ = (batches + world - 1) / world;
  }
  int64_t size() const override {
    int64_t n = 0;
    for (int64_t b : Batches()) n += std::min(batch_size_, size_ - b * batch_size_);
    return n;
  }
  std::vector<int64_t> NextEpoch() override {
    std::vector<int64_t> indices;
    for (int64_t b : Batches()) {
      for (int64_t i = b * batch_size_; i < std::min(size_, (b + 1) * batch_size_); ++i) {
        indices.push_back(i);
      }
    }
    return indices;
  }
  // The test set's batches this rank scores, in order (the others it runs are padding).
  int64_t scored() const { return static_cast<int64_t>(own_.size()); }
  // Batches every rank runs.
  int64_t steps() const { return steps_; }

 private:
  std::vector<int64_t> Batches() const {
    std::vector<int64_t> batches = own_;
    if (size_ > 0) batches.resize(steps_, 0);
    return batches;
  }
  int64_t size_, batch_size_, steps_ = 0;
  std::vector<int64_t> own_;
};

const char* const kAdvice =
    "start every rank with the same values of these flags (one mpirun command line for all "
    "of them), the same training data and the same checkpoint";

class DistributedStrategy : public TrainStrategy {
 public:
  int Guard(const std::function<int()>& training) override {
    const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
    try {
      return training();
    } catch (const distributed::ConfigurationMismatch& e) {
      // Every rank found the same disagreement: each stops on its own, with the same message.
      std::fprintf(stderr, "train (rank %s): %s\n", rank == nullptr ? "?" : rank,
                   OneLine(e.what()).c_str());
      return 1;
    } catch (const std::exception& e) {
      if (!distributed::LaunchedByMpirun()) throw;
      // One rank that stops must stop them all: the others would wait for it in a collective.
      std::fprintf(stderr, "train (rank %s): %s\n", rank == nullptr ? "?" : rank,
                   OneLine(e.what()).c_str());
      distributed::AbortJob(1);
    }
  }

  void Start(const TrainConfig& config, Task&) override {
    Require(distributed::LaunchedByMpirun(),
            "--distributed runs one process per device and needs mpirun: mpirun -np 2 ",
            "bazel-bin/examples/train --distributed");
    const std::string& optimizer = config.task.optimizer;
    Require(optimizer == "sgd" || optimizer == "adam" || optimizer == "adamw",
            "--optimizer must be 'sgd', 'adam' or 'adamw' but is '", optimizer, "'");
    compression_ = ParseDdpCompression(config.ddp_compression);
    Require(config.sharding == "none" || config.sharding == "zero1" ||
                FsdpStrategyOf(config.sharding).has_value(),
            "--sharding must be 'none' (every rank keeps the whole model and optimizer state), "
            "'zero1' (the optimizer state sharded across the ranks), 'zero2' or 'shard_grad_op' "
            "(gradients too) or 'full' (parameters too) but is '",
            config.sharding, "'");
    sharding_ = config.sharding;
    uneven_ = (config.sharding == "none" || config.sharding == "zero1") && !config.sync_bn;
    if (FsdpStrategyOf(config.sharding)) {
      Require(!compression_,
              "--ddp_compression compresses DistributedDataParallel's all-reduce, "
              "but --sharding=",
              config.sharding, " reduce-scatters with FullyShardedDataParallel; drop one of them");
    }
    const double timeout_s = config.collective_timeout;
    Require(std::isfinite(timeout_s) && timeout_s >= 0.001 && timeout_s <= 1e6,
            "--collective_timeout must be a number of seconds in [0.001, 1000000] but is ",
            timeout_s);
    device_ = ResolveDevice(config.devices);
    int threads = config.threads;
    if (threads == 0 && device_.type() == DeviceType::kCPU) {
      const char* local_size = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
      const int ranks_here = local_size == nullptr ? 1 : std::max(1, std::atoi(local_size));
      threads = std::max(1, HardwareCores() / ranks_here);
    }
    threads_ = ConfigureCpuDevices({device_}, threads);
    group_ = std::make_shared<distributed::ProcessGroupMpi>(
        distributed::ProcessGroupMpiOptions()
            .timeout(std::chrono::milliseconds(std::llround(timeout_s * 1000)))
            .timeout_name("--collective_timeout"));
    rank_ = group_->rank();
    world_ = group_->size();
  }
  Device device() const override { return device_; }
  std::vector<Device> local_devices() const override { return {device_}; }
  bool lead() const override { return rank_ == 0; }
  int world() const override { return world_; }
  int threads() const override { return threads_; }
  std::string Settings(const TrainConfig& c) const override {
    const DType autocast = ParseAutocast(c.autocast);
    return absl::StrFormat(
        "distributed ranks=%d device=%s threads=%d batch_size=%d "
        "seed=%d lr=%g lr_decay=%s epochs=%d train_limit=%d autocast=%s ddp_compression=%s "
        "sharding=%s sync_bn=%s",
        world_, device_.ToString(), threads_, c.task.batch_size, c.task.seed, c.task.lr, c.lr_decay,
        c.epochs, c.task.train_limit, autocast == kFloat32 ? "none" : DTypeName(autocast),
        compression_ ? DTypeName(*compression_) : "none", c.sharding, c.sync_bn ? "true" : "false");
  }
  // Every setting but those that may differ per rank or machine: they change the number of
  // collectives the ranks run (--epochs, --batch_size, --train_limit, --checkpoint's resume)
  // or what they compute together (--model, --optimizer, --lr, --seed: ranks with different
  // optimizers would each apply the same averaged gradient differently and drift apart
  // without a word).
  void AgreeOnSettings(const TrainConfig& config) override {
    std::vector<distributed::Setting> settings;
    for (const NamedSetting& s : NamedSettings(config)) {
      if (!s.may_differ) settings.push_back({s.flag, s.value});
    }
    distributed::RequireSameConfiguration(*group_, settings, kAdvice);
  }
  // A checkpoint of --distributed holds one generator, rank 0's under rank 0's device, that
  // stands for every rank's (the ranks seed theirs alike and draw alike, which rank 0 checks
  // when it saves): each rank restores it on its own device, so a resume repeats the run
  // exactly whatever device each rank has now. A checkpoint of the single-process trainer
  // holds one per device of that run: a rank restores its own device's, if there.
  std::string RestoreGenerators(const TrainerState& saved, uint64_t seed) override {
    TrainerState state = saved;
    if (absl::StartsWith(state.settings, "distributed ") && state.generators.size() == 1) {
      state.generators[0].first = device_;
    }
    const std::string note = examples::RestoreGenerators(state, {device_}, seed);
    return note.empty() ? "" : absl::StrFormat("rank %d: %s", rank_, note);
  }
  // --sharding=zero1: ZeRO stage 1 over the same optimizer. Its steps give every rank the
  // parameters the plain optimizer would, to the bit, so the rest of the loop is unchanged.
  TrainerOptimizer MakeOptimizer(const TrainConfig& config, nn::Module& model) override {
    const std::string kind = config.task.optimizer;
    const double lr = config.task.lr, weight_decay = config.weight_decay;
    if (FsdpStrategyOf(config.sharding)) {
      auto sharded = std::make_unique<FsdpTrainerOptimizer>(
          model.parameters(), [kind, lr, weight_decay](std::vector<nn::ParamGroup> groups) {
            return examples::MakeOptimizer(kind, std::move(groups), lr, weight_decay);
          });
      fsdp_optimizer_ = sharded.get();
      return TrainerOptimizer(std::move(sharded));
    }
    if (config.sharding != "zero1") return TrainStrategy::MakeOptimizer(config, model);
    auto zero = std::make_unique<distributed::ZeroRedundancyOptimizer>(
        model.parameters(), group_, [kind, lr, weight_decay](std::vector<nn::ParamGroup> groups) {
          return examples::MakeOptimizer(kind, std::move(groups), lr, weight_decay);
        });
    zero_ = zero.get();
    return TrainerOptimizer(std::move(zero));
  }
  // The lead writes the whole optimizer state, gathered from every rank's share: a
  // checkpoint of --sharding=zero1 resumes with any number of ranks and with or without it.
  void BeforeCheckpoint(nn::Optimizer&) override {
    if (zero_ != nullptr) zero_->consolidate_state_dict(0);
  }
  // Under FSDP no rank holds the whole model: every rank evaluates its share through the
  // sharded forward (one unit gathered at a time, as in training), samples the report's text
  // with it, and --save gathers the model unit by unit to rank 0 alone.
  bool ForwardIsCollective() const override { return FsdpStrategyOf(sharding_).has_value(); }
  std::unique_ptr<data::Sampler> MakeEvalSampler(int64_t size, int64_t batch_size) override {
    if (!ForwardIsCollective()) return TrainStrategy::MakeEvalSampler(size, batch_size);
    auto sampler = std::make_unique<EvalShareSampler>(size, batch_size, rank_, world_);
    eval_sampler_ = sampler.get();
    return sampler;
  }
  // Each rank scores its batches; the totals of every batch are gathered and added in the
  // batches' order, as the lead alone adds them (the same sums, to the bit).
  EvalTotals Evaluate(const Task& task, data::DataLoader& loader,
                      const std::function<Tensor(const Tensor&)>& forward) override {
    if (fsdp_ == nullptr) return TrainStrategy::Evaluate(task, loader, forward);
    NoGradGuard no_grad;
    const int64_t steps = eval_sampler_->steps();
    // {loss sum, correct, count} of each batch this rank runs (padding: zeros).
    Tensor mine = zeros({steps, 3}, TensorOptions(kFloat64).device(group_->device()));
    int64_t step = 0;
    for (data::Batch& batch : loader) {
      const Tensor logits = forward(task.Input(batch));
      if (step < eval_sampler_->scored()) {
        const EvalTotals t = ScoreBatch(logits, batch.target());
        mine.select(0, step).copy_(
            from_vector(std::vector<double>{t.loss_sum, static_cast<double>(t.correct),
                                            static_cast<double>(t.count)},
                        {3}));
      }
      ++step;
    }
    Require(step == steps, "internal error: evaluated ", step, " batches, expected ", steps);
    Tensor all = zeros({world_ * steps * 3}, TensorOptions(kFloat64).device(group_->device()));
    group_->allgather(all, mine.reshape({-1}))->wait();
    const std::vector<double> v = all.to(Device::Cpu(0)).to_vector<double>();
    EvalTotals totals;
    for (int64_t b = 0; b < steps * world_; ++b) {  // batch b: rank b % world, its step b / world
      const double* t = v.data() + ((b % world_) * steps + b / world_) * 3;
      totals.Add({t[0], static_cast<int64_t>(t[1]), static_cast<int64_t>(t[2])});
    }
    return totals;
  }
  std::vector<nn::CheckpointEntry> SaveEntries(const nn::Module& model) override {
    if (fsdp_ == nullptr) return TrainStrategy::SaveEntries(model);
    const std::vector<nn::NamedTensor> state = fsdp_->full_state_dict(
        distributed::FullStateDictOptions().rank0_only(true).offload_to_cpu(true));
    if (state.empty()) return {};  // not rank 0
    // Parameters, then buffers, as nn::ModuleCheckpointEntries lists them.
    const size_t parameters = state.size() - model.named_buffers().size();
    std::vector<nn::CheckpointEntry> entries;
    for (size_t i = 0; i < state.size(); ++i) {
      entries.push_back({state[i].name, i >= parameters, state[i].value});
    }
    return entries;
  }
  bool ShardsCheckpoints() const override { return FsdpStrategyOf(sharding_).has_value(); }
  void LoadShardedCheckpoint(const std::string& path) override {
    distributed::LoadShardedCheckpoint(*fsdp_, fsdp_optimizer_->local(), path);
  }
  void SaveShardedCheckpoint(const std::string& path,
                             const std::vector<nn::CheckpointEntry>& entries) override {
    distributed::SaveShardedCheckpoint(*fsdp_, fsdp_optimizer_->local(), path, entries);
  }
  std::unique_ptr<nn::GradScaler> MakeGradScaler(const nn::GradScalerOptions& options) override {
    if (!FsdpStrategyOf(sharding_)) return TrainStrategy::MakeGradScaler(options);
    return std::make_unique<distributed::ShardedGradScaler>(group_, options);
  }
  std::unique_ptr<data::Sampler> MakeSampler(int64_t size, uint64_t seed, int64_t epoch) override {
    // Every example once an epoch, the ranks' step counts evened out by a Join; with fully
    // sharded units or SyncBatchNorm (collectives a Join does not shadow) equal shares, padded
    // as PyTorch's.
    auto sampler = std::make_unique<data::DistributedSampler>(size, rank_, world_, true, seed,
                                                              /*drop_last=*/false, !uneven_);
    sampler->set_epoch(epoch);
    sampler_ = sampler.get();
    return sampler;
  }
  int64_t sampler_epoch() const override { return sampler_->epoch(); }
  // Before the first collective whose number depends on them: ranks with other data or
  // checkpoints would wait for each other in different collectives, or drift apart silently.
  void AgreeOnData(int64_t examples, int64_t steps, const TrainerState& state) override {
    distributed::RequireSameConfiguration(
        *group_,
        {{"training examples", std::to_string(examples), true},
         // Uneven shares (a Join) differ by one example at most, and their steps by one.
         {"examples per rank per epoch", uneven_ ? "-" : std::to_string(sampler_->size()), true},
         {"steps per epoch", uneven_ ? "-" : std::to_string(steps), true},
         {"epochs done (from --checkpoint)", std::to_string(state.epochs_done), true},
         {"data order (from --checkpoint)", std::to_string(state.sampler_epoch), true}},
        kAdvice);
  }
  void Wrap(std::shared_ptr<nn::Module> model, const TrainConfig& config) override {
    model_ = model;
    if (config.sync_bn) {
      synchronized_norms_ = distributed::ConvertSyncBatchNorm(*model, group_);
      RequireSynchronizedNorms(synchronized_norms_, config.task.model);
    }
    if (const auto strategy = FsdpStrategyOf(config.sharding)) {
      // A transformer block per unit (PyTorch's transformer_auto_wrap_policy); elsewhere each
      // layer with parameters of its own.
      distributed::AutoWrapPolicy policy = config.task.model == "gpt"
                                               ? distributed::ModuleTypeWrapPolicy<GptBlock>()
                                               : [](const std::string&, const nn::Module& m) {
                                                   return !m.parameters(false).empty();
                                                 };
      fsdp_ = std::make_shared<distributed::FullyShardedDataParallel>(
          model, group_,
          distributed::FullyShardedDataParallelOptions()
              .sharding_strategy(*strategy)
              .auto_wrap_policy(policy));
      fsdp_optimizer_->Bind(fsdp_.get());
      wrapper_ = fsdp_;
    } else {
      auto ddp = std::make_shared<distributed::DistributedDataParallel>(
          model, group_,
          distributed::DistributedDataParallelOptions().gradient_compression(compression_));
      ddp_ = ddp.get();
      wrapper_ = ddp;
    }
    // Every rank's device, for the report.
    Tensor mine =
        from_vector(std::vector<int64_t>{device_.is_cuda() ? 1 : 0, device_.index()}, {2});
    Tensor all = zeros({2 * world_}, kInt64);
    group_->allgather(all, mine)->wait();
    const std::vector<int64_t> ids = all.to_vector<int64_t>();
    for (int r = 0; r < world_; ++r) {
      const int index = static_cast<int>(ids[2 * r + 1]);
      device_names_.push_back((ids[2 * r] ? Device::Cuda(index) : Device::Cpu(index)).ToString());
    }
  }
  std::string Header(const TrainConfig& config) const override {
    const int64_t batch = config.task.batch_size;
    std::string text =
        absl::StrFormat("%s over %d processes (Open MPI) on %s",
                        fsdp_ ? "FullyShardedDataParallel" : "DistributedDataParallel", world_,
                        absl::StrJoin(device_names_, ", "));
    if (threads_ > 0) {
      text += absl::StrFormat(" (%d thread%s per CPU device)", threads_, threads_ == 1 ? "" : "s");
    }
    if (uneven_ && sampler_->total_size() % world_ != 0) {
      text += absl::StrFormat(
          ", batch %d per rank (%d in all), %d or %d examples per rank per epoch (each example "
          "once; a Join evens out the steps)\n",
          batch, batch * world_, sampler_->total_size() / world_,
          sampler_->total_size() / world_ + 1);
    } else {
      text += absl::StrFormat(", batch %d per rank (%d in all), %d examples per rank per epoch\n",
                              batch, batch * world_, sampler_->size());
    }
    if (compression_) {
      text += absl::StrFormat("Gradients all-reduced in %s (--ddp_compression)\n",
                              DTypeName(*compression_));
    }
    if (synchronized_norms_ > 0) {
      text += absl::StrFormat(
          "BatchNorm over every rank's batch together (--sync_bn): %d layers synchronized\n",
          synchronized_norms_);
    }
    if (zero_ != nullptr) {
      int64_t total = 0;
      for (int64_t n : zero_->numel_per_rank()) total += n;
      std::vector<std::string> shares;
      for (int64_t n : zero_->numel_per_rank()) {
        shares.push_back(absl::StrFormat("%.1f%%", 100.0 * n / std::max<int64_t>(total, 1)));
      }
      text += absl::StrFormat(
          "Optimizer state sharded across the ranks (--sharding=zero1, ZeroRedundancyOptimizer): "
          "%s of the %d parameters' state on ranks 0..%d\n",
          absl::StrJoin(shares, ", "), total, world_ - 1);
    }
    if (fsdp_ != nullptr) {
      int64_t total = 0, shard = 0;
      for (const distributed::FsdpUnitInfo& u : fsdp_->units()) {
        total += u.numel;
        shard += u.shard_numel;
      }
      text += absl::StrFormat(
          "Parameters, gradients and optimizer state sharded across the ranks (--sharding=%s, "
          "%s): %d units, %d of the %d parameters on each rank\n",
          config.sharding, distributed::ShardingStrategyName(fsdp_->options().sharding_strategy()),
          fsdp_->units().size(), shard, total);
    }
    return text;
  }
  std::string LossWhere(const TrainConfig&) const override { return "in each rank"; }
  std::string WrapperText() const override {
    std::ostringstream out;
    if (fsdp_ != nullptr) {
      std::vector<std::string> names;
      for (const distributed::FsdpUnitInfo& u : fsdp_->units()) {
        names.push_back(u.name.empty() ? "(root)" : u.name);
      }
      out << "FullyShardedDataParallel(units: " << absl::StrJoin(names, ", ") << ")\n";
      out << *model_;
    } else {
      out << *wrapper_;
    }
    return out.str();
  }
  // Plain lines, never a redrawn bar: Open MPI gives every rank's standard output a
  // pseudo-terminal, whether mpirun's own output is a terminal, a file or a pipe, so the
  // rank cannot tell, and a redrawn bar would fill a log with carriage returns.
  int interactive_bar() const override { return 0; }
  void StartEpoch() override { group_->barrier()->wait(); }  // every rank starts the clock
  // Ranks with one step more than others: the others shadow it under a Join, running the
  // trainer's optimizer step on the averaged gradients, so every rank keeps the same model.
  void BeginSteps(std::function<void()> shadow_step) override {
    if (uneven_ && ddp_ != nullptr) {
      join_ = std::make_unique<distributed::Join>(*ddp_, std::move(shadow_step));
    }
  }
  void EndSteps() override {
    if (join_ != nullptr) {
      join_->Finish();
      join_.reset();
    }
  }
  Tensor Loss(nn::Module& criterion, const Tensor& input, const Tensor& target) override {
    return criterion.forward_tensors({wrapper_->forward_tensors({input})[0], target})[0];
  }
  std::vector<double> EpochTotals(double loss_sum, double seen) override {
    return SumOverRanks(*group_, {loss_sum, seen});
  }
  // DDP's all-reduces, this rank's view (no collective): their time on the group's thread,
  // and how much of it backward hid (the rest, and any wait for a slower rank's backward, is
  // what the end of backward waited).
  void StepDone() override {
    if (ddp_ == nullptr) return;
    const distributed::ReductionStats stats = ddp_->last_reduction_stats();
    communication_seconds_ += stats.communication_seconds;
    wait_seconds_ += stats.wait_seconds;
    ++reduced_steps_;
  }
  std::string EpochNote() override {
    if (reduced_steps_ == 0 || communication_seconds_ <= 0) return "";
    const std::string note =
        absl::StrFormat("  all-reduce %.1f ms/step, %.0f%% hidden behind backward",
                        communication_seconds_ / reduced_steps_ * 1e3,
                        100 * std::clamp(1 - wait_seconds_ / communication_seconds_, 0.0, 1.0));
    communication_seconds_ = wait_seconds_ = 0;
    reduced_steps_ = 0;
    return note;
  }
  // The checkpoint holds rank 0's generator for every rank (see RestoreGenerators): exact
  // while the ranks' states agree, so rank 0 says so (once) when they do not. Only with
  // --checkpoint, whose presence every rank agrees on, so all or none gather.
  std::string SaveGenerators(TrainerState* state, bool checkpointing) override {
    if (!checkpointing) return "";
    const std::vector<GeneratorState> generators = GatherGenerators(*group_, device_);
    state->generators = {{device_, generators[0]}};
    std::vector<std::string> differing;
    for (size_t r = 1; r < generators.size(); ++r) {
      if (generators[r].seed != generators[0].seed ||
          generators[r].offset != generators[0].offset) {
        differing.push_back(absl::StrFormat("rank %d seed %d offset %d", r, generators[r].seed,
                                            generators[r].offset));
      }
    }
    if (differing.empty() || said_generators_differ_) return "";
    said_generators_differ_ = true;  // once: they stay apart
    return absl::StrFormat(
        "note: the ranks' random generators differ after epoch %d (rank 0 seed %d offset %d; "
        "%s): the checkpoint holds rank 0's, which a resume restores on every rank, so a "
        "resume will not repeat this run exactly\n",
        state->epochs_done, generators[0].seed, generators[0].offset,
        absl::StrJoin(differing, "; "));
  }
  // Rank 0 alone (no collective), or under FSDP every rank through the wrapper.
  Tensor EvalForward(const Tensor& input) override {
    return evaluated().forward_tensors({input})[0];
  }
  void SetTraining(bool on) override { evaluated().train(on); }
  void Finish() override { group_->barrier()->wait(); }
  std::string Where(int64_t batch_size, const std::string& separator) const override {
    return absl::StrFormat(", %d ranks on %s, batch %d per rank", world_,
                           absl::StrJoin(device_names_, separator), batch_size);
  }
  std::vector<std::string> DeviceNames() const override { return device_names_; }
  std::string JsonExtra() const override {
    return absl::StrFormat("\"ranks\":%d,\"sharding\":\"%s\",", world_, sharding_);
  }

 private:
  // What evaluation runs: the model alone, or the sharded wrapper.
  nn::Module& evaluated() const { return fsdp_ != nullptr ? *fsdp_ : *model_; }

  Device device_ = Device::Cpu(0);
  int threads_ = 0, rank_ = 0, world_ = 1;
  bool said_generators_differ_ = false;
  std::optional<DType> compression_;
  distributed::ZeroRedundancyOptimizer* zero_ = nullptr;  // --sharding=zero1: the optimizer
  int synchronized_norms_ = 0;                            // --sync_bn
  std::shared_ptr<distributed::ProcessGroupMpi> group_;
  data::DistributedSampler* sampler_ = nullptr;  // owned by the loader
  std::shared_ptr<nn::Module> model_;
  std::shared_ptr<nn::Module> wrapper_;  // DistributedDataParallel, or FullyShardedDataParallel
  std::shared_ptr<distributed::FullyShardedDataParallel> fsdp_;  // --sharding=shard_grad_op|full
  FsdpTrainerOptimizer* fsdp_optimizer_ = nullptr;               // its optimizer
  EvalShareSampler* eval_sampler_ = nullptr;  // under FSDP; owned by the test loader
  std::string sharding_ = "none";
  bool uneven_ = false;  // every example once; a Join evens the steps
  distributed::DistributedDataParallel* ddp_ = nullptr;  // wrapper_, without sharding
  std::unique_ptr<distributed::Join> join_;              // this epoch's
  double communication_seconds_ = 0, wait_seconds_ = 0;  // this epoch's all-reduces
  int64_t reduced_steps_ = 0;
  std::vector<std::string> device_names_;
};

}  // namespace

std::unique_ptr<TrainStrategy> MakeDistributedStrategy() {
  return std::make_unique<DistributedStrategy>();
}

}  // namespace tandem::examples
