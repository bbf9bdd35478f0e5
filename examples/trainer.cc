#include "examples/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "data/dataloader.h"
#include "examples/cli.h"
#include "examples/models.h"
#include "examples/progress.h"
#include "examples/train_reporter.h"
#include "examples/train_strategy.h"
#include "examples/trainer_state.h"
#include "nn/nn.h"
#include "tensor/core/anomaly_mode.h"
#include "tensor/runtime/allocator.h"
#include "tensor/runtime/profiler.h"
#include "tensor/tensor.h"

namespace tandem::examples {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string MiB(int64_t bytes) { return absl::StrFormat("%.1f MiB", bytes / 1048576.0); }

// Every check of a setting that needs no device, before any work.
void CheckSettings(const TrainConfig& c) {
  const TaskOptions& t = c.task;
  Require(t.train_limit >= -1 && t.test_limit >= -1,
          "--train_limit and --test_limit must be at least -1 (the default) but are ",
          t.train_limit, " and ", t.test_limit);
  Require(c.epochs >= 1, "--epochs must be at least 1 but is ", c.epochs);
  Require(t.batch_size >= 1, "--batch_size must be at least 1 but is ", t.batch_size);
  Require(std::isfinite(t.lr) && t.lr > 0, "--lr must be a positive finite number but is ", t.lr,
          "; try --lr=0.05 for sgd or --lr=0.001 for adam");
  Require(c.lr_decay == "cosine" || c.lr_decay == "none",
          "--lr_decay must be 'cosine' or 'none' but is '", c.lr_decay, "'");
  Require(std::isfinite(c.weight_decay) && c.weight_decay >= 0,
          "--weight_decay must be a finite number of at least 0 but is ", c.weight_decay,
          "; try --weight_decay=5e-4");
  Require(c.workers >= 0, "--workers must be at least 0 but is ", c.workers);
}

// The loss became NaN or inf: the run cannot recover.
std::runtime_error Diverged(const TrainConfig& c, double loss, int epoch, int64_t step,
                            int64_t steps) {
  return std::runtime_error(absl::StrFormat(
      "the training loss became %s at epoch %d, step %d of %d (learning rate %g): "
      "training diverged and cannot recover; expected a finite loss, so lower --lr "
      "(now %g) and start again (--detect_anomaly names the op that made the first one)",
      std::isnan(loss) ? "NaN"
      : loss > 0       ? "inf"
                       : "-inf",
      epoch, step, steps, LearningRate(c.task.lr, c.lr_decay, epoch - 1, c.epochs), c.task.lr));
}

}  // namespace

// Steps between reads of the training loss to the host (RunTraining).
constexpr int64_t kLossReadSteps = 10;
constexpr double kNoLoss = std::numeric_limits<double>::quiet_NaN();

std::vector<NamedSetting> NamedSettings(const TrainConfig& c) {
  const TaskOptions& t = c.task;
  const GptConfig& g = t.gpt;
  std::vector<NamedSetting> s = {
      {"--autocast", c.autocast},
      {"--batch_size", absl::StrCat(t.batch_size)},
      {"--checkpoint", c.checkpoint.empty() ? "not given" : "given"},
      {"--checkpoint_activations", g.checkpoint_activations() ? "true" : "false"},
      {"--collective_timeout", absl::StrCat(c.collective_timeout)},
      {"--context", absl::StrCat(g.block_size())},
      {"--data_dir", t.data_dir, true},
      {"--ddp_compression", c.ddp_compression},
      {"--detect_anomaly", c.detect_anomaly ? "true" : "false"},
      {"--devices", c.devices, true},
      {"--dropout", absl::StrCat(g.dropout())},
      {"--epochs", absl::StrCat(c.epochs)},
      {"--forward_loss", c.forward_loss ? "true" : "false"},
      {"--log_csv", c.log_csv, true},
      {"--lr", absl::StrCat(t.lr)},
      {"--lr_decay", c.lr_decay},
      {"--max_new_tokens", absl::StrCat(t.max_new_tokens)},
      {"--model", t.model},
      {"--n_embd", absl::StrCat(g.n_embd())},
      {"--n_head", absl::StrCat(g.n_head())},
      {"--n_layer", absl::StrCat(g.n_layer())},
      {"--optimizer", t.optimizer},
      {"--plot", c.plot, true},
      {"--prompt", t.prompt},
      {"--save", c.save, true},
      {"--seed", absl::StrCat(t.seed)},
      {"--sharding", c.sharding},
      {"--sync_bn", c.sync_bn ? "true" : "false"},
      {"--temperature", absl::StrCat(t.temperature)},
      {"--test_limit", absl::StrCat(t.test_limit)},
      {"--threads", absl::StrCat(c.threads), true},
      {"--top_k", absl::StrCat(t.top_k)},
      {"--trace", c.trace, true},
      {"--train_limit", absl::StrCat(t.train_limit)},
      {"--weight_decay", absl::StrCat(c.weight_decay)},
      {"--workers", absl::StrCat(c.workers), true},
  };
  return s;
}

int RunTraining(const TrainConfig& given, TrainStrategy& strategy, TrainReporter& reporter) {
  TrainConfig config = given;
  ResolveTaskDefaults(&config.task);
  CheckSettings(config);
  const TaskOptions& t = config.task;
  const DType autocast = ParseAutocast(config.autocast);
  std::unique_ptr<Task> task = MakeTask(t);
  strategy.Start(config, *task);
  const bool lead = strategy.lead();
  reporter.set_enabled(lead);
  // Every output's folder is checked now: a bad path must not cost a whole run.
  if (lead) {
    RequireWritableFile("--checkpoint", config.checkpoint);
    RequireWritableFile("--save", config.save);
    RequireWritableFile("--log_csv", config.log_csv);
    RequireWritableFile("--plot", config.plot);
    RequireWritableFile("--trace", config.trace);
  }

  // The model first: a bad device fails here, before the dataset is read.
  manual_seed(t.seed);
  std::shared_ptr<nn::Module> model = task->MakeModel();
  try {
    model->to(strategy.device());
  } catch (const Error& e) {
    throw UsageError("--devices: " + OneLine(e.what()));
  }
  // Loss scaling for float16 (its gradients underflow otherwise); a pass-through otherwise.
  // Every rank skips the same steps: each holds the same averaged gradients, or (sharded) the
  // strategy's scaler agrees across them.
  const std::unique_ptr<nn::GradScaler> owned_scaler =
      strategy.MakeGradScaler(nn::GradScalerOptions().enabled(autocast == kFloat16));
  nn::GradScaler& scaler = *owned_scaler;

  TrainerState state;
  state.config = TrainerConfig(t.model, t.optimizer, autocast);
  state.settings = strategy.Settings(config);
  // The settings first: a rank given another --model or --optimizer would otherwise fail
  // alone, inside the checkpoint's load, instead of every rank naming the setting.
  strategy.AgreeOnSettings(config);
  TrainerOptimizer optimizer = strategy.MakeOptimizer(config, *model);
  if (t.model == "gpt") {
    // The sizes are checked by the tensors' shapes on load; dropout is not.
    state.settings += absl::StrFormat(" dropout=%g", t.gpt.dropout());
  }
  const std::string settings = state.settings;
  const bool resumed =
      !config.checkpoint.empty() &&
      LoadTrainerCheckpoint(config.checkpoint, *model, *optimizer.optimizer, &state, &scaler);
  if (resumed && state.sharded_model && !strategy.ShardsCheckpoints()) {
    throw UsageError(absl::StrFormat(
        "--checkpoint=%s is a sharded checkpoint (of --distributed --sharding=full or "
        "shard_grad_op: each rank's shard in a file of its own); resume it with one of those, on "
        "any number of ranks, or pass another --checkpoint path",
        config.checkpoint));
  }
  const std::string generator_note = resumed ? strategy.RestoreGenerators(state, t.seed) : "";

  // A collective forward (a sharded model) evaluates, samples and saves on every rank.
  const bool collective = strategy.ForwardIsCollective();
  const bool evaluates = lead || collective;
  task->LoadData(/*with_test=*/evaluates);
  const std::shared_ptr<const data::Dataset>& train_set = task->train_set();
  const Device device = strategy.device();
  const auto loader_options = data::DataLoaderOptions()
                                  .num_workers(config.workers)
                                  .pin_memory(device.is_cuda())
                                  .device(device);
  data::DataLoader train_loader(
      train_set, strategy.MakeSampler(train_set->size(), t.seed, state.sampler_epoch),
      data::DataLoaderOptions(loader_options).batch_size(t.batch_size));
  std::unique_ptr<data::DataLoader> test_loader;
  if (evaluates) {
    test_loader = std::make_unique<data::DataLoader>(
        task->test_set(),
        strategy.MakeEvalSampler(task->test_set()->size(), task->eval_batch_size()),
        data::DataLoaderOptions(loader_options).batch_size(task->eval_batch_size()));
  }
  const int64_t steps = train_loader.size();
  // Before the first collective whose number depends on them.
  strategy.AgreeOnData(train_set->size(), steps, state);
  strategy.Wrap(model, config);
  if (resumed && state.sharded_model) strategy.LoadShardedCheckpoint(config.checkpoint);

  std::string header = task->DataLine() + "\n" + strategy.Header(config);
  header +=
      absl::StrFormat("%s lr %g (%s decay), weight decay %g, loss %s, seed %d\n", t.optimizer, t.lr,
                      config.lr_decay, config.weight_decay, strategy.LossWhere(config), t.seed);
  if (autocast != kFloat32) {
    header += absl::StrFormat("Autocast to %s (--autocast)%s\n", DTypeName(autocast),
                              autocast == kFloat16 ? " with a GradScaler" : "");
  }
  header += task->ModelLines() + strategy.WrapperText() + "\n";
  if (resumed) {
    header += absl::StrFormat("Resuming from %s: %d of %d epochs done\n", config.checkpoint,
                              state.epochs_done, config.epochs);
    if (state.settings != settings) {
      header += absl::StrFormat(
          "note: the checkpoint was made with %s; this run has %s, so it will not repeat "
          "an uninterrupted run exactly\n",
          state.settings, settings);
    }
  }
  if (config.detect_anomaly) {
    // Every op that records autograd and every backward node, in every replica, from the
    // first step on (evaluation records nothing, so it is not checked).
    AnomalyMode::SetEnabled(true);
    header += "Anomaly detection on (--detect_anomaly): the first NaN or inf stops training\n";
  }
  reporter.Print(header);
  // Each rank's own (its device may have had a saved state or not), after the lead's lines.
  if (!generator_note.empty()) {
    std::fputs(generator_note.c_str(), stdout);
    std::fflush(stdout);
  }
  reporter.Print("\n");

  std::vector<int64_t> in_use_before;
  for (Device d : strategy.local_devices()) {
    ResetPeakMemory(d);
    in_use_before.push_back(GetMemoryStats(d).in_use_bytes);
  }
  nn::Module& criterion = task->criterion();
  StepTrace trace(lead ? config.trace : std::string(), 50);
  const int width = static_cast<int>(std::to_string(config.epochs).size());
  for (int epoch = static_cast<int>(state.epochs_done) + 1; epoch <= config.epochs; ++epoch) {
    optimizer.set_lr(LearningRate(t.lr, config.lr_decay, epoch - 1, config.epochs));
    reporter.BeginEpoch(absl::StrFormat("epoch %*d/%d", width, epoch, config.epochs), steps,
                        strategy.interactive_bar());
    strategy.StartEpoch();
    strategy.BeginSteps([&] {
      scaler.step(*optimizer.optimizer);
      scaler.update();
    });
    const auto epoch_start = Clock::now();
    double loss_sum = 0;  // as of the last read of loss_total
    int64_t seen = 0, seen_read = 0, step = 0;
    // The losses, times their batch sizes, summed on the device (in float64, as the host summed
    // them before): read every kLossReadSteps steps and at the epoch's end, since a read makes
    // the host wait for the device and, each step, would keep a GPU's queue from filling.
    Tensor loss_total;
    const auto read_loss = [&] {
      if (seen_read == seen) return;
      loss_sum = loss_total.item();
      seen_read = seen;
      if (!std::isfinite(loss_sum)) {
        reporter.EndEpoch();
        throw Diverged(config, loss_sum, epoch, step, steps);
      }
    };
    for (data::Batch& batch : train_loader) {
      TANDEM_PROFILE_SCOPE("step", absl::StrFormat("epoch %d step %d", epoch, step + 1));
      Tensor loss;
      try {
        {
          AutocastGuard guard(device.type(), autocast == kFloat32 ? kBFloat16 : autocast,
                              /*enabled=*/autocast != kFloat32);
          loss = strategy.Loss(criterion, task->Input(batch), batch.target());
        }
        optimizer.optimizer->zero_grad();
        scaler.scale(loss).backward();
      } catch (const Error& e) {
        if (!AnomalyMode::IsEnabled()) throw;
        reporter.EndEpoch();  // --detect_anomaly found a NaN or inf: say where in the run
        throw std::runtime_error(
            absl::StrFormat("stopped at epoch %d, step %d of %d (--detect_anomaly): %s", epoch,
                            step + 1, steps, OneLine(e.what())));
      }
      scaler.step(*optimizer.optimizer);  // skipped on an inf/NaN gradient (float16)
      scaler.update();
      strategy.StepDone();
      {
        NoGradGuard no_grad;
        const Tensor weighted = loss.detach().to(kFloat64) * static_cast<double>(batch.size());
        loss_total = loss_total.defined() ? loss_total + weighted : weighted;
      }
      ++step;
      seen += batch.size();
      if (step % kLossReadSteps == 0 || step == steps) read_loss();
      reporter.Step(step, seen * strategy.world(), seen_read > 0 ? loss_sum / seen_read : kNoLoss,
                    SecondsSince(epoch_start));
      if (lead && config.after_step) config.after_step(epoch, step, steps);
      trace.StepDone();
    }
    read_loss();
    strategy.EndSteps();  // (ranks with fewer batches shadow the others' last steps)
    trace.EpochDone();
    const std::vector<double> totals = strategy.EpochTotals(loss_sum, static_cast<double>(seen));
    const double seconds = SecondsSince(epoch_start);
    state.epochs_done = epoch;
    state.sampler_epoch = strategy.sampler_epoch();
    const std::string generators_note = strategy.SaveGenerators(&state, !config.checkpoint.empty());
    if (!config.checkpoint.empty()) strategy.BeforeCheckpoint(*optimizer.optimizer);
    const bool sharded_checkpoint = !config.checkpoint.empty() && strategy.ShardsCheckpoints();
    if (lead) {
      reporter.EndEpoch();
      reporter.Print(generators_note);
    }
    EvalTotals test;
    if (evaluates) {
      // In evaluation mode, under the training's autocast.
      AutocastGuard guard(device.type(), autocast == kFloat32 ? kBFloat16 : autocast,
                          /*enabled=*/autocast != kFloat32);
      strategy.SetTraining(false);
      test = strategy.Evaluate(*task, *test_loader,
                               [&](const Tensor& input) { return strategy.EvalForward(input); });
      strategy.SetTraining(true);
    }
    if (!lead) {
      // Rank 0's part of the sharded save comes after its epoch line, below.
      if (sharded_checkpoint) strategy.SaveShardedCheckpoint(config.checkpoint, {});
      continue;
    }
    state.history.push_back(
        {epoch, totals[0] / totals[1], test.loss(), test.accuracy(), seconds, totals[1] / seconds});
    reporter.EpochLine(epoch, config.epochs, totals[0] / totals[1],
                       task->EpochMetrics(state.history.back()), totals[1] / seconds, seconds,
                       strategy.EpochNote());
    reporter.Print(trace.TakeMessage());
    if (sharded_checkpoint) {
      strategy.SaveShardedCheckpoint(config.checkpoint, TrainerCheckpointEntries(state, &scaler));
    } else if (!config.checkpoint.empty()) {
      SaveTrainerCheckpoint(config.checkpoint, *model, *optimizer.optimizer, state, &scaler);
    }
    reporter.WriteLogs(state.history, config.log_csv, config.plot,
                       absl::StrFormat("%s: %s%s", task->DataName(), t.model,
                                       strategy.Where(t.batch_size, " + ")));
  }
  strategy.Finish();
  if (collective) {
    task->set_report_forward([&](const Tensor& input) { return strategy.EvalForward(input); });
  }
  if (!lead) {
    // The lead's collective work, in its order: the report's forward, then --save's gathers.
    if (collective) {
      (void)task->Report(state.history, t.optimizer, t.lr);
      if (!config.save.empty()) (void)strategy.SaveEntries(*model);
    }
    return 0;
  }

  reporter.Summary(t.model, strategy.Where(t.batch_size, ", "), state.history, *task, t.optimizer,
                   t.lr);
  std::string tail = "Peak memory per device during this run's training (allocator statistics):\n";
  const std::vector<Device> devices = strategy.local_devices();
  for (size_t i = 0; i < devices.size(); ++i) {
    const MemoryStats stats = GetMemoryStats(devices[i]);
    tail += absl::StrFormat("  %-7s peak %10s  (%s in use when training started)\n",
                            devices[i].ToString(), MiB(stats.peak_bytes), MiB(in_use_before[i]));
  }
  if (!config.save.empty()) {
    nn::WriteCheckpoint(strategy.SaveEntries(*model), config.save);
    tail += absl::StrFormat("Model written to %s\n", config.save);
  }
  if (!config.checkpoint.empty()) tail += "Checkpoint: " + config.checkpoint + "\n";
  if (!config.log_csv.empty()) tail += "CSV log: " + config.log_csv + "\n";
  if (!config.plot.empty()) tail += "Plot: " + config.plot + "\n";
  reporter.Print(tail);
  reporter.Json(t.model, strategy.DeviceNames(), strategy.JsonExtra(), state.history, t.batch_size,
                task->JsonMetrics(state.history), task->JsonTail());
  return 0;
}

}  // namespace tandem::examples
