#include "examples/distributed_training.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "data/dataloader.h"
#include "data/distributed_sampler.h"
#include "examples/cli.h"
#include "examples/models.h"
#include "examples/progress.h"
#include "examples/task.h"
#include "examples/trainer_state.h"
#include "nn/nn.h"
#include "parallel/distributed/distributed_data_parallel.h"
#include "parallel/distributed/process_group_mpi.h"
#include "parallel/distributed/same_configuration.h"
#include "tensor/runtime/profiler.h"
#include "tensor/tensor.h"

// The trainer's flags (defined in examples/train.cc).
ABSL_DECLARE_FLAG(std::string, devices);
ABSL_DECLARE_FLAG(std::string, device);
ABSL_DECLARE_FLAG(int, threads);
ABSL_DECLARE_FLAG(std::string, trace);
ABSL_DECLARE_FLAG(std::string, lr_decay);
ABSL_DECLARE_FLAG(double, weight_decay);
ABSL_DECLARE_FLAG(int, epochs);
ABSL_DECLARE_FLAG(int, workers);
ABSL_DECLARE_FLAG(uint64_t, seed);
ABSL_DECLARE_FLAG(std::string, checkpoint);
ABSL_DECLARE_FLAG(std::string, log_csv);
ABSL_DECLARE_FLAG(std::string, plot);
ABSL_DECLARE_FLAG(std::string, save);
ABSL_DECLARE_FLAG(double, collective_timeout);
ABSL_DECLARE_FLAG(int, kill_in_epoch);
ABSL_DECLARE_FLAG(std::string, autocast);
ABSL_DECLARE_FLAG(std::string, ddp_compression);

namespace tandem::examples {
namespace distributed = parallel::distributed;
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// This rank's device: --devices/--device (one), else cuda:<local rank> or cpu:0.
Device ResolveDevice() {
  const std::string devices_flag = absl::GetFlag(FLAGS_devices);
  const std::string device_flag = absl::GetFlag(FLAGS_device);
  Require(devices_flag.empty() || device_flag.empty(), "--device=", device_flag,
          " and --devices=", devices_flag, " are both set: pass one of them");
  const std::string text = devices_flag.empty() ? device_flag : devices_flag;
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

// After a load: this rank's device generator. A checkpoint of --distributed holds one
// generator, rank 0's under rank 0's device, that stands for every rank's (the ranks seed
// theirs alike and draw alike, which rank 0 checks when it saves): each rank restores it on
// its own device, so a resume repeats the run exactly whatever device each rank has now. A
// checkpoint of the single-process trainer holds one per device of that run: a rank restores
// its own device's, if there, as that trainer does (RestoreGenerators says what starts afresh).
std::string RestoreRankGenerator(const TrainerState& saved, Device device, uint64_t seed) {
  TrainerState state = saved;
  if (absl::StartsWith(state.settings, "distributed ") && state.generators.size() == 1) {
    state.generators[0].first = device;
  }
  return RestoreGenerators(state, {device}, seed);
}

// The trainer's flags that may differ between ranks, and why; every other flag of the
// trainer (examples/train.cc, a flag added there later included) must be the same on every
// rank, since it changes the number of collectives the ranks run (--epochs, --batch_size,
// --train_limit, --checkpoint's resume) or what they compute together (--model, --optimizer,
// --lr, --seed: ranks with different optimizers would each apply the same averaged gradient
// differently and drift apart without a word).
const std::set<std::string>& FlagsThatMayDiffer() {
  static const auto* flags = new std::set<std::string>{
      "devices", "device",  // each rank's own device
      "threads",            // the cores of each rank's machine: its own arithmetic only
      "workers",            // loader threads: the batches and their order are the same
      "data_dir",           // a path on each machine; the data's size is compared instead
      "checkpoint",         // a path on each machine; compared as given or not, and as the
                            // epoch it resumes at
      "log_csv", "plot", "save", "trace",  // rank 0 alone writes them
  };
  return *flags;
}

// Every trainer flag that must agree, by name and current value ("--epochs", "10"). Those
// whose unset value stands for the task's default (--optimizer, --lr, --batch_size and the
// limits: ResolveTaskDefaults) by the value the task resolved, so that ranks that differ are
// told what each would train with, not an empty string.
std::vector<distributed::Setting> FlagsThatMustAgree(const TaskOptions& task) {
  const std::map<std::string, std::string> resolved = {
      {"optimizer", task.optimizer},
      {"lr", absl::StrCat(task.lr)},
      {"batch_size", absl::StrCat(task.batch_size)},
      {"train_limit", absl::StrCat(task.train_limit)},
      {"test_limit", absl::StrCat(task.test_limit)},
  };
  std::vector<distributed::Setting> settings;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (!absl::EndsWith(flag->Filename(), "examples/train.cc")) continue;
    const std::string key(name);
    if (FlagsThatMayDiffer().count(key)) continue;
    const auto it = resolved.find(key);
    settings.push_back({"--" + key, it != resolved.end() ? it->second : flag->CurrentValue()});
  }
  std::sort(settings.begin(), settings.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  // Without the flags' file names (a build that strips them) nothing would be compared.
  TANDEM_CHECK(std::any_of(settings.begin(), settings.end(),
                           [](const auto& s) { return s.name == "--epochs"; }),
               "train --distributed: the trainer's flags were not found by their file "
               "(examples/train.cc), so the ranks' flags cannot be compared");
  return settings;
}

int Train(const TaskOptions& task_options);

}  // namespace

int RunDistributedTraining(const TaskOptions& task_options) {
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  try {
    return Train(task_options);
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

namespace {

int Train(const TaskOptions& task_options) {
  Require(distributed::LaunchedByMpirun(),
          "--distributed runs one process per device and needs mpirun: mpirun -np 2 ",
          "bazel-bin/examples/train --distributed");
  const int epochs = absl::GetFlag(FLAGS_epochs);
  const int batch_size = static_cast<int>(task_options.batch_size);
  const double lr = task_options.lr;
  const std::string model_kind = task_options.model;
  const std::string optimizer_kind = task_options.optimizer;
  const std::string lr_decay = absl::GetFlag(FLAGS_lr_decay);
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  const std::string checkpoint = absl::GetFlag(FLAGS_checkpoint);
  const DType autocast = ParseAutocast(absl::GetFlag(FLAGS_autocast));
  const std::optional<DType> compression =
      ParseDdpCompression(absl::GetFlag(FLAGS_ddp_compression));
  Require(epochs >= 1, "--epochs must be at least 1 but is ", epochs);
  Require(batch_size >= 1, "--batch_size must be at least 1 but is ", batch_size);
  Require(std::isfinite(lr) && lr > 0, "--lr must be a positive finite number but is ", lr);
  Require(lr_decay == "cosine" || lr_decay == "none",
          "--lr_decay must be 'cosine' or 'none' but is '", lr_decay, "'");
  Require(optimizer_kind == "sgd" || optimizer_kind == "adam" || optimizer_kind == "adamw",
          "--optimizer must be 'sgd', 'adam' or 'adamw' but is '", optimizer_kind, "'");
  std::unique_ptr<Task> task = MakeTask(task_options);
  const double timeout_s = absl::GetFlag(FLAGS_collective_timeout);
  Require(std::isfinite(timeout_s) && timeout_s >= 0.001 && timeout_s <= 1e6,
          "--collective_timeout must be a number of seconds in [0.001, 1000000] but is ",
          timeout_s);

  const Device device = ResolveDevice();
  int threads = absl::GetFlag(FLAGS_threads);
  if (threads == 0 && device.type() == DeviceType::kCPU) {
    const char* local_size = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    const int ranks_here = local_size == nullptr ? 1 : std::max(1, std::atoi(local_size));
    threads = std::max(1, HardwareCores() / ranks_here);
  }
  threads = ConfigureCpuDevices({device}, threads);

  auto group = std::make_shared<distributed::ProcessGroupMpi>(
      distributed::ProcessGroupMpiOptions()
          .timeout(std::chrono::milliseconds(std::llround(timeout_s * 1000)))
          .timeout_name("--collective_timeout"));
  const int rank = group->rank();
  const int world = group->size();
  const bool lead = rank == 0;
  if (lead) RequireWritableFile("--checkpoint", checkpoint);
  if (lead) RequireWritableFile("--save", absl::GetFlag(FLAGS_save));
  if (lead) RequireWritableFile("--log_csv", absl::GetFlag(FLAGS_log_csv));
  if (lead) RequireWritableFile("--plot", absl::GetFlag(FLAGS_plot));
  if (lead) RequireWritableFile("--trace", absl::GetFlag(FLAGS_trace));

  manual_seed(seed);
  std::shared_ptr<nn::Module> model = task->MakeModel();
  model->to(device);
  TrainerOptimizer trainer_optimizer =
      MakeOptimizer(optimizer_kind, *model, lr, absl::GetFlag(FLAGS_weight_decay));
  std::unique_ptr<nn::Optimizer> optimizer = std::move(trainer_optimizer.optimizer);
  const std::function<void(double)> set_lr = std::move(trainer_optimizer.set_lr);
  // Loss scaling for float16. Every rank holds the same averaged gradients after backward, so
  // every rank finds the same inf/NaN, skips the same steps and keeps the same scale.
  nn::GradScaler scaler(nn::GradScalerOptions().enabled(autocast == kFloat16));

  // Every rank resumes from the checkpoint (a path all ranks can read): rank 0's model
  // reaches the others through DDP's broadcast; each rank needs the optimizer state.
  TrainerState state;
  state.config = TrainerConfig(model_kind, optimizer_kind, autocast);
  state.settings = absl::StrFormat(
      "distributed ranks=%d device=%s threads=%d batch_size=%d "
      "seed=%d lr=%g lr_decay=%s epochs=%d train_limit=%d autocast=%s ddp_compression=%s",
      world, device.ToString(), threads, batch_size, seed, lr, lr_decay, epochs,
      task_options.train_limit, autocast == kFloat32 ? "none" : DTypeName(autocast),
      compression ? DTypeName(*compression) : "none");
  // The flags first: a rank given another --model or --optimizer would otherwise fail alone,
  // inside the checkpoint's load, instead of every rank naming the flag.
  const std::string advice =
      "start every rank with the same values of these flags (one mpirun command line for all "
      "of them), the same training data and the same checkpoint";
  std::vector<distributed::Setting> flags = FlagsThatMustAgree(task_options);
  flags.push_back({"--checkpoint", checkpoint.empty() ? "not given" : "given"});
  distributed::RequireSameConfiguration(*group, flags, advice);
  if (model_kind == "gpt") {
    // The sizes are checked by the tensors' shapes on load; dropout is not.
    state.settings += absl::StrFormat(" dropout=%g", task_options.gpt.dropout());
  }
  const bool resumed =
      !checkpoint.empty() && LoadTrainerCheckpoint(checkpoint, *model, *optimizer, &state, &scaler);
  const std::string generator_note = resumed ? RestoreRankGenerator(state, device, seed) : "";

  task->LoadData(/*with_test=*/lead);
  const std::shared_ptr<const data::Dataset>& train_set = task->train_set();
  auto sampler =
      std::make_unique<data::DistributedSampler>(train_set->size(), rank, world, true, seed);
  sampler->set_epoch(state.sampler_epoch);
  data::DistributedSampler* shares = sampler.get();
  const auto loader_options = data::DataLoaderOptions()
                                  .num_workers(absl::GetFlag(FLAGS_workers))
                                  .pin_memory(device.is_cuda())
                                  .device(device);
  data::DataLoader train_loader(train_set, std::move(sampler),
                                data::DataLoaderOptions(loader_options).batch_size(batch_size));
  std::unique_ptr<data::DataLoader> test_loader;
  if (lead) {
    test_loader = std::make_unique<data::DataLoader>(
        task->test_set(),
        data::DataLoaderOptions(loader_options).batch_size(task->eval_batch_size()));
  }

  // Before the first collective whose number depends on them: ranks with other flags, data or
  // checkpoints would wait for each other in different collectives, or drift apart silently.
  distributed::RequireSameConfiguration(
      *group,
      {{"training examples", std::to_string(train_set->size()), true},
       {"examples per rank per epoch", std::to_string(shares->size()), true},
       {"steps per epoch", std::to_string(train_loader.size()), true},
       {"epochs done (from --checkpoint)", std::to_string(state.epochs_done), true},
       {"data order (from --checkpoint)", std::to_string(state.sampler_epoch), true}},
      advice);
  auto ddp = std::make_shared<distributed::DistributedDataParallel>(
      model, group,
      distributed::DistributedDataParallelOptions().gradient_compression(compression));

  // Every rank's device, for the report.
  Tensor mine = from_vector(std::vector<int64_t>{device.is_cuda() ? 1 : 0, device.index()}, {2});
  Tensor all = zeros({2 * world}, kInt64);
  group->allgather(all, mine)->wait();
  std::vector<std::string> device_names;
  const std::vector<int64_t> ids = all.to_vector<int64_t>();
  for (int r = 0; r < world; ++r) {
    device_names.push_back((ids[2 * r] ? Device::Cuda(static_cast<int>(ids[2 * r + 1]))
                                       : Device::Cpu(static_cast<int>(ids[2 * r + 1])))
                               .ToString());
  }

  if (lead) {
    std::printf("%s\n", task->DataLine().c_str());
    std::printf("DistributedDataParallel over %d processes (Open MPI) on %s", world,
                absl::StrJoin(device_names, ", ").c_str());
    if (threads > 0) std::printf(" (%d thread%s per CPU device)", threads, threads == 1 ? "" : "s");
    std::printf(", batch %d per rank (%d in all), %lld examples per rank per epoch\n", batch_size,
                batch_size * world, static_cast<long long>(shares->size()));
    std::printf("%s lr %g (%s decay), seed %llu\n", optimizer_kind.c_str(), lr, lr_decay.c_str(),
                static_cast<unsigned long long>(seed));
    if (autocast != kFloat32) {
      std::printf("Autocast to %s (--autocast)%s\n", DTypeName(autocast),
                  autocast == kFloat16 ? " with a GradScaler" : "");
    }
    if (compression) {
      std::printf("Gradients all-reduced in %s (--ddp_compression)\n", DTypeName(*compression));
    }
    std::printf("%s", task->ModelLines().c_str());
    std::cout << *ddp << "\n";
    if (resumed) {
      std::printf("Resuming from %s: %lld of %d epochs done\n", checkpoint.c_str(),
                  static_cast<long long>(state.epochs_done), epochs);
    }
  }
  // Each rank's own (its device may have had a saved state or not), after rank 0's lines.
  if (!generator_note.empty()) std::printf("rank %d: %s", rank, generator_note.c_str());
  if (lead) std::printf("\n");
  std::fflush(stdout);

  nn::Module& criterion = task->criterion();
  const int64_t steps = train_loader.size();
  const int kill_in_epoch = absl::GetFlag(FLAGS_kill_in_epoch);
  bool said_generators_differ = false;  // once: they stay apart
  StepTrace trace(lead ? absl::GetFlag(FLAGS_trace) : std::string(), 50);
  for (int epoch = static_cast<int>(state.epochs_done) + 1; epoch <= epochs; ++epoch) {
    set_lr(LearningRate(lr, lr_decay, epoch - 1, epochs));
    const std::string label = absl::StrFormat(
        "epoch %*d/%d", static_cast<int>(std::to_string(epochs).size()), epoch, epochs);
    std::unique_ptr<ProgressBar> bar;
    // Plain lines, never a redrawn bar: Open MPI gives every rank's standard output a
    // pseudo-terminal, whether mpirun's own output is a terminal, a file or a pipe, so the
    // rank cannot tell, and a redrawn bar would fill a log with carriage returns.
    if (lead) bar = std::make_unique<ProgressBar>(stdout, label, steps, /*interactive=*/0);
    group->barrier()->wait();  // every rank starts the clock together
    const auto epoch_start = Clock::now();
    double loss_sum = 0;
    int64_t seen = 0, step = 0;
    for (data::Batch& batch : train_loader) {
      TANDEM_PROFILE_SCOPE("step", absl::StrFormat("epoch %d step %d", epoch, step + 1));
      Tensor loss;
      {
        AutocastGuard guard(device.type(), autocast == kFloat32 ? kBFloat16 : autocast,
                            /*enabled=*/autocast != kFloat32);
        loss = criterion.forward_tensors({ddp->forward(task->Input(batch)), batch.target()})[0];
      }
      optimizer->zero_grad();
      scaler.scale(loss).backward();
      scaler.step(*optimizer);  // skipped on an inf/NaN gradient (float16), on every rank alike
      scaler.update();
      const double loss_value = loss.item();
      ++step;
      if (!std::isfinite(loss_value)) {
        throw std::runtime_error(absl::StrFormat(
            "rank %d: the training loss became %g at epoch %d, step %d of %d: training "
            "diverged; lower --lr (now %g) and start again",
            rank, loss_value, epoch, step, steps, lr));
      }
      loss_sum += loss_value * batch.size();
      seen += batch.size();
      if (bar) bar->Update(step, seen * world, loss_sum / seen, SecondsSince(epoch_start));
      // Rank 0 dies as a machine would; mpirun then ends the others.
      if (lead && epoch == kill_in_epoch && step == steps / 2) std::raise(SIGKILL);
      trace.StepDone();
    }
    trace.EpochDone();
    const std::vector<double> totals = SumOverRanks(*group, {loss_sum, static_cast<double>(seen)});
    const double seconds = SecondsSince(epoch_start);
    state.epochs_done = epoch;
    state.sampler_epoch = shares->epoch();
    // The checkpoint holds rank 0's generator for every rank (see RestoreRankGenerator):
    // exact while the ranks' states agree, so rank 0 says so (once) when they do not. Only
    // with --checkpoint, whose presence every rank agrees on, so all or none gather.
    std::vector<GeneratorState> generators;
    if (!checkpoint.empty()) {
      generators = GatherGenerators(*group, device);
      state.generators = {{device, generators[0]}};
    }
    if (!lead) continue;
    bar->Finish();
    std::vector<std::string> differing;
    for (size_t r = 1; r < generators.size(); ++r) {
      if (generators[r].seed != generators[0].seed ||
          generators[r].offset != generators[0].offset) {
        differing.push_back(absl::StrFormat("rank %d seed %d offset %d", r, generators[r].seed,
                                            generators[r].offset));
      }
    }
    if (!differing.empty() && !said_generators_differ) {
      said_generators_differ = true;
      std::printf(
          "note: the ranks' random generators differ after epoch %d (rank 0 seed %llu offset %llu; "
          "%s): the checkpoint holds rank 0's, which a resume restores on every rank, so a "
          "resume will not repeat this run exactly\n",
          epoch, static_cast<unsigned long long>(generators[0].seed),
          static_cast<unsigned long long>(generators[0].offset),
          absl::StrJoin(differing, "; ").c_str());
    }
    EvalTotals test;
    {
      // Rank 0 alone (no collective), under the training's autocast.
      AutocastGuard guard(device.type(), autocast == kFloat32 ? kBFloat16 : autocast,
                          /*enabled=*/autocast != kFloat32);
      model->eval();
      test = Evaluate(*task, *test_loader,
                      [&](const Tensor& input) { return model->forward_tensors({input})[0]; });
      model->train();
    }
    state.history.push_back(
        {epoch, totals[0] / totals[1], test.loss(), test.accuracy(), seconds, totals[1] / seconds});
    std::printf("epoch %*d/%d  train loss %.4f  %s  %.0f samples/s  %.1f s\n",
                static_cast<int>(std::to_string(epochs).size()), epoch, epochs,
                totals[0] / totals[1], task->EpochMetrics(state.history.back()).c_str(),
                totals[1] / seconds, seconds);
    std::printf("%s", trace.TakeMessage().c_str());
    std::fflush(stdout);
    if (!checkpoint.empty()) SaveTrainerCheckpoint(checkpoint, *model, *optimizer, state, &scaler);
    WriteEpochLogs(state.history, absl::GetFlag(FLAGS_log_csv), absl::GetFlag(FLAGS_plot),
                   absl::StrFormat("%s: %s, %d ranks on %s, batch %d per rank", task->DataName(),
                                   model_kind, world, device.ToString(), batch_size));
  }
  group->barrier()->wait();
  if (!lead) return 0;

  double train_seconds = 0;
  double samples = 0;
  for (const EpochStats& e : state.history) {
    train_seconds += e.seconds;
    samples += e.samples_per_s * e.seconds;
  }
  std::printf(
      "\nSummary: %s on %d ranks (%s), batch %d per rank, %zu epoch%s, %.1f s of training\n",
      model_kind.c_str(), world, absl::StrJoin(device_names, ", ").c_str(), batch_size,
      state.history.size(), state.history.size() == 1 ? "" : "s", train_seconds);
  std::printf("%s\n", task->SummaryHeader().c_str());
  for (const EpochStats& e : state.history) std::printf("%s\n", task->SummaryRow(e).c_str());
  std::printf("%s", task->Report(state.history, optimizer_kind, lr).c_str());
  const std::string save = absl::GetFlag(FLAGS_save);
  if (!save.empty()) {
    nn::SaveCheckpoint(*model, save);
    std::printf("Model written to %s\n", save.c_str());
  }
  if (!checkpoint.empty()) std::printf("Checkpoint: %s\n", checkpoint.c_str());
  if (!absl::GetFlag(FLAGS_log_csv).empty()) {
    std::printf("CSV log: %s\n", absl::GetFlag(FLAGS_log_csv).c_str());
  }
  if (!absl::GetFlag(FLAGS_plot).empty()) {
    std::printf("Plot: %s\n", absl::GetFlag(FLAGS_plot).c_str());
  }
  std::vector<std::string> quoted;
  for (const std::string& name : device_names) quoted.push_back("\"" + name + "\"");
  std::printf(
      "{\"model\":\"%s\",\"devices\":[%s],\"ranks\":%d,\"epochs\":%zu,\"batch_size\":%d,%s"
      "\"train_seconds\":%.1f,\"samples_per_s\":%.1f,%s}\n",
      model_kind.c_str(), absl::StrJoin(quoted, ",").c_str(), world, state.history.size(),
      batch_size, task->JsonMetrics(state.history).c_str(), train_seconds,
      train_seconds > 0 ? samples / train_seconds : 0.0, task->JsonTail().c_str());
  return 0;
}

}  // namespace
}  // namespace tandem::examples
