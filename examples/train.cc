// Trains a classifier on Fashion-MNIST, or a GPT on English text (--model=gpt: Debian's
// fortunes, byte by byte), with DataParallel: the model lives on the first device, each batch
// is split across all of them, and the replicas run in parallel (on a machine without a GPU,
// on logical CPU devices, one per core by default). Tandem's main job: tensor, nn, data and
// parallel end to end. What differs between the two lives in examples/task.h.
//
//   bazel run -c opt //examples:train -- --devices=cpu:0,cpu:1 --epochs=10
//   bazel run -c opt //examples:train -- --model=cnn --optimizer=adam --lr=0.001
//   bazel run -c opt //examples:train -- --checkpoint=/tmp/mlp.ckpt --plot=/tmp/mlp.svg
//   bazel run -c opt //examples:train -- --model=gpt --epochs=5 --prompt="Love is"
//
// While it runs: a progress bar per epoch (redrawn in place on a terminal, a few plain lines
// in a file or pipe), then one line per epoch (losses; test accuracy, or for text the
// validation loss, perplexity and next-byte accuracy; samples/s; how the batches were split).
// At the end: a summary table, for text the trained model's continuation of --prompt, the peak
// memory of each device, and as the very last line one JSON object with the run's figures.
// With --checkpoint the run saves everything after each epoch and resumes from the file when
// it exists, finishing with exactly the parameters of an uninterrupted run (same seed, devices
// and flags).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "data/data.h"
#include "examples/cli.h"
#include "examples/distributed_training.h"
#include "examples/models.h"
#include "examples/progress.h"
#include "examples/svg_plot.h"
#include "examples/task.h"
#include "examples/trainer_state.h"
#include "nn/nn.h"
#include "parallel/comm.h"
#include "parallel/data_parallel.h"
#include "tensor/core/anomaly_mode.h"
#include "tensor/runtime/allocator.h"
#include "tensor/runtime/profiler.h"
#include "tensor/tensor.h"

ABSL_FLAG(std::string, devices, "",
          "Devices to train on, comma-separated (cpu:0,cpu:1 or cuda:0,cuda:1); the model lives "
          "on the first, each batch is split across all. Default: every CUDA GPU, or without "
          "one the CPU layout the model's size suits (parallel::ChooseCpuLayout: a logical "
          "device per core, or one device with every core for large models)");
ABSL_FLAG(std::string, device, "", "One device to train on: an alias of --devices=DEVICE");
ABSL_FLAG(int, threads, 0,
          "Cores each CPU device may use (0: the machine's cores / the number of CPU devices)");
ABSL_FLAG(std::string, model, "mlp",
          "mlp (784-256-128-10), cnn (two conv+pool blocks) or resnet (conv+BN stem, three "
          "residual stages of 16/32/64 channels, global average pooling) on Fashion-MNIST; or "
          "gpt (GPT-2's architecture, sized by --context, --n_layer, --n_head, --n_embd) on "
          "the fortunes corpus, byte by byte");
ABSL_FLAG(std::string, optimizer, "",
          "sgd (momentum 0.9), adam or adamw (empty: sgd for images, adamw for gpt)");
ABSL_FLAG(double, lr, 0,
          "Peak learning rate (0: the model's default, 0.05 for images, 0.001 for gpt; 0.001 "
          "suits adam on images)");
ABSL_FLAG(double, weight_decay, 0.0,
          "L2 penalty added to every gradient, as PyTorch's SGD and Adam (5e-4 suits the resnet)");
ABSL_FLAG(std::string, lr_decay, "cosine",
          "cosine (from --lr down to near 0 over the epochs, one value per epoch) or none");
ABSL_FLAG(int, epochs, 10,
          "Passes over the training set (60,000 images; for gpt --train_limit windows)");
ABSL_FLAG(int, batch_size, 0,
          "Images (or text windows) per step, split across the devices (0: 128 images, 8 "
          "windows)");
ABSL_FLAG(int, workers, 1, "DataLoader threads that prefetch batches (0: load inline)");
ABSL_FLAG(uint64_t, seed, 1, "Seed for initialisation and shuffling");
ABSL_FLAG(std::string, data_dir, "",
          "Folder with the gzipped IDX files (Debian package dataset-fashion-mnist; default "
          "/usr/share/datasets/fashion-mnist), for gpt with the fortune files (package "
          "fortunes; default /usr/share/games/fortunes)");
ABSL_FLAG(bool, forward_loss, true,
          "Compute the loss inside the replicas (DataParallel::forward_loss); false gathers "
          "the outputs on the first device and computes the loss there, as PyTorch does");
ABSL_FLAG(std::string, autocast, "",
          "bf16 or fp16: run the forward under autocast (matmul, linear and convolution in that "
          "precision, losses and norms in float32; fp16 with a GradScaler); empty: float32");
ABSL_FLAG(std::string, ddp_compression, "none",
          "With --distributed: all-reduce the gradient buckets in bf16 or fp16 instead of float32 "
          "(half the bytes; PyTorch's bf16_compress_hook), or none");
ABSL_FLAG(bool, detect_anomaly, false,
          "Stop at the first NaN or inf in an op's output or a gradient, naming the op and "
          "the pass (forward or backward); slow, for finding where a NaN loss comes from "
          "(PyTorch's torch.autograd.detect_anomaly)");
ABSL_FLAG(std::string, checkpoint, "",
          "Save model, optimizer, data order and random state here after each epoch (atomically); "
          "resume from it at start when it exists");
ABSL_FLAG(std::string, log_csv, "", "Write one row per epoch to this CSV file");
ABSL_FLAG(std::string, plot, "", "Draw train/test loss and test accuracy per epoch to this SVG");
ABSL_FLAG(std::string, save, "", "Write a checkpoint of the trained model alone here");
ABSL_FLAG(std::string, trace, "",
          "Write a Chrome trace of the run's first 50 training steps to this path (open it in "
          "chrome://tracing or ui.perfetto.dev): one row per thread (with --distributed, rank "
          "0's process)");
// Images: for tests and quick looks, the first N only. Text: the epoch's size, N windows
// spread evenly over the text, so that a short epoch sees every file.
ABSL_FLAG(int, train_limit, -1,
          "Use only the first N training images (-1 or 0: all); for gpt, N windows spread over "
          "the training text (-1: 1024; 0: every window, about 18,000 at context 128)");
ABSL_FLAG(int, test_limit, -1,
          "Use only the first N test images (-1 or 0: all); for gpt, N validation windows "
          "spread over the validation text (-1: 256; 0: all)");
// --model=gpt: the model's sizes (GptConfig::Small()'s by default) and the final sample.
ABSL_FLAG(int, context, 128, "gpt: tokens (bytes) per window, the model's block size");
ABSL_FLAG(int, n_layer, 4, "gpt: transformer blocks");
ABSL_FLAG(int, n_head, 4, "gpt: attention heads per block (a divisor of --n_embd)");
ABSL_FLAG(int, n_embd, 128, "gpt: channels");
ABSL_FLAG(double, dropout, 0.1, "gpt: dropout on embeddings, attention weights and residuals");
ABSL_FLAG(std::string, prompt, "The meaning of life is",
          "gpt: the text the trained model continues at the end");
ABSL_FLAG(int, max_new_tokens, 200, "gpt: bytes sampled after --prompt");
ABSL_FLAG(double, temperature, 0.8, "gpt: the sample's temperature (lower: more predictable)");
ABSL_FLAG(int, top_k, 40, "gpt: sample among the k most likely bytes only");
// For the resume test: the process kills itself (SIGKILL) half-way through this epoch.
ABSL_FLAG(int, kill_in_epoch, 0, "(testing) SIGKILL the process half-way through this epoch");
ABSL_FLAG(bool, distributed, false,
          "One process per device under mpirun, with DistributedDataParallel: mpirun -np 2 "
          "train --distributed (see examples/distributed_training.h)");
ABSL_FLAG(double, collective_timeout, 300,
          "With --distributed: seconds a collective may wait for the other ranks before the run "
          "fails, naming the ranks that did not answer (a stopped, hung or dead rank) and the "
          "collective; raise it if rank 0's evaluation or checkpoint takes longer");

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;
using examples::EpochStats;
using examples::ParseAutocast;
using examples::Require;
using examples::UsageError;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string Split(const std::vector<int64_t>& chunks) { return absl::StrJoin(chunks, "+"); }

std::string MiB(int64_t bytes) { return absl::StrFormat("%.1f MiB", bytes / 1048576.0); }

// --devices, or --device (its one-device alias).
std::vector<Device> ResolveDevices() {
  const std::string devices_flag = absl::GetFlag(FLAGS_devices);
  const std::string device_flag = absl::GetFlag(FLAGS_device);
  Require(devices_flag.empty() || device_flag.empty(), "--device=", device_flag,
          " and --devices=", devices_flag,
          " are both set; --device is an alias of --devices with one device: pass one of them");
  return examples::ParseDevices(devices_flag.empty() ? device_flag : devices_flag);
}

// The trainer's flags that a task reads, with the task's defaults for those left unset.
examples::TaskOptions TaskOptionsFromFlags() {
  examples::TaskOptions o;
  o.model = absl::GetFlag(FLAGS_model);
  o.optimizer = absl::GetFlag(FLAGS_optimizer);
  o.lr = absl::GetFlag(FLAGS_lr);
  o.batch_size = absl::GetFlag(FLAGS_batch_size);
  o.data_dir = absl::GetFlag(FLAGS_data_dir);
  o.train_limit = absl::GetFlag(FLAGS_train_limit);
  o.test_limit = absl::GetFlag(FLAGS_test_limit);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.gpt = examples::GptConfig::Small()
              .block_size(absl::GetFlag(FLAGS_context))
              .n_layer(absl::GetFlag(FLAGS_n_layer))
              .n_head(absl::GetFlag(FLAGS_n_head))
              .n_embd(absl::GetFlag(FLAGS_n_embd))
              .dropout(absl::GetFlag(FLAGS_dropout));
  o.prompt = absl::GetFlag(FLAGS_prompt);
  o.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  o.temperature = absl::GetFlag(FLAGS_temperature);
  o.top_k = absl::GetFlag(FLAGS_top_k);
  examples::ResolveTaskDefaults(&o);
  Require(o.train_limit >= -1 && o.test_limit >= -1,
          "--train_limit and --test_limit must be at least -1 (the default) but are ",
          o.train_limit, " and ", o.test_limit);
  return o;
}

int Run() {
  const examples::TaskOptions task_options = TaskOptionsFromFlags();
  if (absl::GetFlag(FLAGS_distributed)) return examples::RunDistributedTraining(task_options);
  std::unique_ptr<examples::Task> task = examples::MakeTask(task_options);
  std::vector<Device> devices = ResolveDevices();
  // Without --devices, --device and --threads on a machine without a GPU, the layout follows
  // the model's size (parallel::ChooseCpuLayout): a logical device per core for models whose
  // replicas meet cheaply, one device with every core when the per-step gradient sum over
  // the parameters would outweigh the split.
  std::string layout_note;
  if (absl::GetFlag(FLAGS_devices).empty() && absl::GetFlag(FLAGS_device).empty() &&
      absl::GetFlag(FLAGS_threads) == 0 && !devices.empty() && devices[0].is_cpu()) {
    manual_seed(absl::GetFlag(FLAGS_seed));
    int64_t parameters = 0;
    for (const Tensor& p : task->MakeModel()->parameters()) parameters += p.numel();
    devices =
        parallel::ChooseCpuLayout(task_options.batch_size, parameters, task->rows_per_sample())
            .devices;
    layout_note = absl::StrFormat(
        "Layout: %d logical CPU device%s, chosen for %d parameters at batch %d "
        "(parallel::ChooseCpuLayout; --devices and --threads choose another)\n",
        devices.size(), devices.size() == 1 ? "" : "s", parameters, task_options.batch_size);
  }
  const int threads = examples::ConfigureCpuDevices(devices, absl::GetFlag(FLAGS_threads));
  const int epochs = absl::GetFlag(FLAGS_epochs);
  const int batch_size = static_cast<int>(task_options.batch_size);
  const double lr = task_options.lr;
  const std::string model_kind = task_options.model;
  const std::string optimizer_kind = task_options.optimizer;
  const std::string lr_decay = absl::GetFlag(FLAGS_lr_decay);
  const double weight_decay = absl::GetFlag(FLAGS_weight_decay);
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  const bool use_forward_loss = absl::GetFlag(FLAGS_forward_loss);
  const std::string checkpoint = absl::GetFlag(FLAGS_checkpoint);
  const DType autocast = ParseAutocast(absl::GetFlag(FLAGS_autocast));
  Require(!examples::ParseDdpCompression(absl::GetFlag(FLAGS_ddp_compression)),
          "--ddp_compression=", absl::GetFlag(FLAGS_ddp_compression),
          " compresses DistributedDataParallel's all-reduce and needs --distributed; DataParallel "
          "reduces its gradients without it: drop the flag or add --distributed");
  Require(epochs >= 1, "--epochs must be at least 1 but is ", epochs);
  Require(batch_size >= 1, "--batch_size must be at least 1 but is ", batch_size);
  Require(std::isfinite(lr) && lr > 0, "--lr must be a positive finite number but is ", lr,
          "; try --lr=0.05 for sgd or --lr=0.001 for adam");
  Require(lr_decay == "cosine" || lr_decay == "none",
          "--lr_decay must be 'cosine' or 'none' but is '", lr_decay, "'");
  Require(std::isfinite(weight_decay) && weight_decay >= 0,
          "--weight_decay must be a finite number of at least 0 but is ", weight_decay,
          "; try --weight_decay=5e-4");
  Require(absl::GetFlag(FLAGS_workers) >= 0, "--workers must be at least 0 but is ",
          absl::GetFlag(FLAGS_workers));
  // Every output's folder is checked now: a bad path must not cost a whole run.
  examples::RequireWritableFile("--checkpoint", checkpoint);
  examples::RequireWritableFile("--save", absl::GetFlag(FLAGS_save));
  examples::RequireWritableFile("--log_csv", absl::GetFlag(FLAGS_log_csv));
  examples::RequireWritableFile("--plot", absl::GetFlag(FLAGS_plot));
  examples::RequireWritableFile("--trace", absl::GetFlag(FLAGS_trace));

  // The model first: a bad device fails here, before the dataset is read.
  manual_seed(seed);
  std::shared_ptr<nn::Module> model = task->MakeModel();
  examples::TrainerOptimizer optimizer;
  std::shared_ptr<parallel::DataParallel> dp;
  try {
    model->to(devices[0]);
    optimizer = examples::MakeOptimizer(optimizer_kind, *model, lr, weight_decay);
    dp = std::make_shared<parallel::DataParallel>(model, devices);
  } catch (const Error& e) {
    throw UsageError("--devices: " + examples::OneLine(e.what()));
  }
  nn::Module& criterion = task->criterion();
  // Loss scaling for float16 (its gradients underflow otherwise); a pass-through otherwise.
  nn::GradScaler scaler(nn::GradScalerOptions().enabled(autocast == kFloat16));

  examples::TrainerState state;
  state.config = examples::TrainerConfig(model_kind, optimizer_kind, autocast);
  state.settings = absl::StrFormat(
      "devices=%s threads=%d batch_size=%d seed=%d lr=%g lr_decay=%s "
      "weight_decay=%g epochs=%d train_limit=%d autocast=%s",
      examples::DeviceNames(devices, ","), threads, batch_size, seed, lr, lr_decay, weight_decay,
      epochs, task_options.train_limit, autocast == kFloat32 ? "none" : DTypeName(autocast));
  if (model_kind == "gpt") {
    // The sizes are checked by the tensors' shapes on load; dropout is not.
    state.settings += absl::StrFormat(" dropout=%g", task_options.gpt.dropout());
  }
  const std::string settings = state.settings;
  bool resumed = false;
  std::string generator_note;
  if (!checkpoint.empty()) {
    resumed =
        examples::LoadTrainerCheckpoint(checkpoint, *model, *optimizer.optimizer, &state, &scaler);
    if (resumed) generator_note = examples::RestoreGenerators(state, devices, seed);
  }

  task->LoadData(/*with_test=*/true);
  const std::shared_ptr<const data::Dataset>& train_set = task->train_set();
  auto sampler = std::make_unique<data::RandomSampler>(train_set->size(), seed);
  sampler->set_epoch(state.sampler_epoch);
  data::RandomSampler* sampler_view = sampler.get();
  const auto loader_options = data::DataLoaderOptions()
                                  .num_workers(absl::GetFlag(FLAGS_workers))
                                  .pin_memory(devices[0].is_cuda())
                                  .device(devices[0]);
  data::DataLoader train_loader(train_set, std::move(sampler),
                                data::DataLoaderOptions(loader_options).batch_size(batch_size));
  data::DataLoader test_loader(
      task->test_set(),
      data::DataLoaderOptions(loader_options).batch_size(task->eval_batch_size()));

  const std::vector<int64_t> full_split =
      parallel::ChunkSizes(batch_size, static_cast<int64_t>(devices.size()));
  std::printf("%s\n", task->DataLine().c_str());
  std::printf("%s", layout_note.c_str());
  std::printf("DataParallel on %s", examples::DeviceNames(devices, ", ").c_str());
  if (threads > 0) std::printf(" (%d thread%s per CPU device)", threads, threads == 1 ? "" : "s");
  std::printf(", batch %d split %s", batch_size, Split(full_split).c_str());
  if (full_split.size() < devices.size()) {
    std::printf(" (%zu chunk%s for %zu devices: the rest idle; use a batch of at least %zu)",
                full_split.size(), full_split.size() == 1 ? "" : "s", devices.size(),
                devices.size());
  }
  std::printf("\n%s lr %g (%s decay), weight decay %g, loss %s, seed %llu\n",
              optimizer_kind.c_str(), lr, lr_decay.c_str(), weight_decay,
              use_forward_loss ? "inside the replicas (--forward_loss)"
                               : "on the gathered output (--noforward_loss)",
              static_cast<unsigned long long>(seed));
  if (autocast != kFloat32) {
    std::printf("Autocast to %s (--autocast)%s\n", DTypeName(autocast),
                autocast == kFloat16 ? " with a GradScaler" : "");
  }
  std::printf("%s", task->ModelLines().c_str());
  std::cout << *dp << "\n";
  if (resumed) {
    std::printf("Resuming from %s: %lld of %d epochs done\n", checkpoint.c_str(),
                static_cast<long long>(state.epochs_done), epochs);
    if (state.settings != settings) {
      std::printf(
          "note: the checkpoint was made with %s; this run has %s, so it will not repeat "
          "an uninterrupted run exactly\n",
          state.settings.c_str(), settings.c_str());
    }
    std::printf("%s", generator_note.c_str());
  }
  if (absl::GetFlag(FLAGS_detect_anomaly)) {
    // Every op that records autograd and every backward node, in every replica, from the
    // first step on (evaluation records nothing, so it is not checked).
    AnomalyMode::SetEnabled(true);
    std::printf("Anomaly detection on (--detect_anomaly): the first NaN or inf stops training\n");
  }
  std::printf("\n");
  std::fflush(stdout);

  std::vector<int64_t> in_use_before;
  for (Device d : devices) {
    ResetPeakMemory(d);
    in_use_before.push_back(GetMemoryStats(d).in_use_bytes);
  }
  const int64_t steps = train_loader.size();
  const int kill_in_epoch = absl::GetFlag(FLAGS_kill_in_epoch);
  examples::StepTrace trace(absl::GetFlag(FLAGS_trace), 50);
  for (int epoch = static_cast<int>(state.epochs_done) + 1; epoch <= epochs; ++epoch) {
    optimizer.set_lr(examples::LearningRate(lr, lr_decay, epoch - 1, epochs));
    const std::string label = absl::StrFormat(
        "epoch %*d/%d", static_cast<int>(std::to_string(epochs).size()), epoch, epochs);
    examples::ProgressBar bar(stdout, label, steps);
    std::map<std::vector<int64_t>, int64_t> splits;
    const auto epoch_start = Clock::now();
    double loss_sum = 0;
    int64_t seen = 0, step = 0;
    for (data::Batch& batch : train_loader) {
      TANDEM_PROFILE_SCOPE("step", absl::StrFormat("epoch %d step %d", epoch, step + 1));
      Tensor loss;
      try {
        {
          AutocastGuard guard(devices[0].type(), autocast == kFloat32 ? kBFloat16 : autocast,
                              /*enabled=*/autocast != kFloat32);
          const Tensor input = task->Input(batch);
          loss = use_forward_loss
                     ? dp->forward_loss(criterion, input, batch.target())
                     : criterion.forward_tensors({dp->forward(input), batch.target()})[0];
        }
        optimizer.optimizer->zero_grad();
        scaler.scale(loss).backward();
      } catch (const Error& e) {
        if (!AnomalyMode::IsEnabled()) throw;
        bar.Finish();  // --detect_anomaly found a NaN or inf: say where in the run
        throw std::runtime_error(
            absl::StrFormat("stopped at epoch %d, step %d of %d (--detect_anomaly): %s", epoch,
                            step + 1, steps, examples::OneLine(e.what())));
      }
      scaler.step(*optimizer.optimizer);  // skipped on an inf/NaN gradient (float16)
      scaler.update();
      ++splits[dp->last_chunk_sizes()];
      const int64_t n = batch.size();
      const double loss_value = loss.item();
      ++step;
      if (!std::isfinite(loss_value)) {
        bar.Finish();
        throw std::runtime_error(absl::StrFormat(
            "the training loss became %s at epoch %d, step %d of %d (learning rate %g): "
            "training diverged and cannot recover; expected a finite loss, so lower --lr "
            "(now %g) and start again (--detect_anomaly names the op that made the first one)",
            std::isnan(loss_value) ? "NaN"
            : loss_value > 0       ? "inf"
                                   : "-inf",
            epoch, step, steps, examples::LearningRate(lr, lr_decay, epoch - 1, epochs), lr));
      }
      loss_sum += loss_value * n;
      seen += n;
      bar.Update(step, seen, loss_sum / seen, SecondsSince(epoch_start));
      if (epoch == kill_in_epoch && step == steps / 2) std::raise(SIGKILL);
      trace.StepDone();
    }
    trace.EpochDone();
    const double seconds = SecondsSince(epoch_start);
    bar.Finish();
    examples::EvalTotals test;
    {
      // Data-parallel, in evaluation mode, under the training's autocast.
      AutocastGuard guard(devices[0].type(), autocast == kFloat32 ? kBFloat16 : autocast,
                          /*enabled=*/autocast != kFloat32);
      dp->eval();
      test = examples::Evaluate(*task, test_loader,
                                [&](const Tensor& input) { return dp->forward(input); });
      dp->train();
    }
    state.history.push_back(
        {epoch, loss_sum / seen, test.loss(), test.accuracy(), seconds, seen / seconds});
    std::vector<std::string> split_text;
    for (const auto& [chunks, count] : splits) {
      split_text.push_back(absl::StrFormat("%d x %s", count, Split(chunks)));
    }
    std::sort(split_text.begin(), split_text.end(), [](const std::string& a, const std::string& b) {
      return std::stoll(a) > std::stoll(b);
    });
    std::printf("epoch %*d/%d  train loss %.4f  %s  %.0f samples/s  %.1f s  split %s\n",
                static_cast<int>(std::to_string(epochs).size()), epoch, epochs, loss_sum / seen,
                task->EpochMetrics(state.history.back()).c_str(), seen / seconds, seconds,
                absl::StrJoin(split_text, ", ").c_str());
    std::printf("%s", trace.TakeMessage().c_str());
    std::fflush(stdout);

    state.epochs_done = epoch;
    state.sampler_epoch = sampler_view->epoch();
    state.generators.clear();
    for (Device d : devices) state.generators.push_back({d, default_generator(d).state()});
    if (!checkpoint.empty()) {
      examples::SaveTrainerCheckpoint(checkpoint, *model, *optimizer.optimizer, state, &scaler);
    }
    examples::WriteEpochLogs(state.history, absl::GetFlag(FLAGS_log_csv), absl::GetFlag(FLAGS_plot),
                             absl::StrFormat("%s: %s on %s, batch %d", task->DataName(), model_kind,
                                             examples::DeviceNames(devices, " + "), batch_size));
  }

  // Summary of every epoch (those of an earlier, resumed run included).
  double train_seconds = 0;
  for (const EpochStats& e : state.history) train_seconds += e.seconds;
  const double total_samples = static_cast<double>(train_set->size()) * state.history.size();
  std::printf("\nSummary: %s on %s, batch %d, %zu epoch%s, %.1f s of training\n",
              model_kind.c_str(), examples::DeviceNames(devices, ", ").c_str(), batch_size,
              state.history.size(), state.history.size() == 1 ? "" : "s", train_seconds);
  std::printf("%s\n", task->SummaryHeader().c_str());
  for (const EpochStats& e : state.history) std::printf("%s\n", task->SummaryRow(e).c_str());
  std::printf("%s", task->Report(state.history, optimizer_kind, lr).c_str());
  std::printf("Peak memory per device during this run's training (allocator statistics):\n");
  for (size_t i = 0; i < devices.size(); ++i) {
    const MemoryStats stats = GetMemoryStats(devices[i]);
    std::printf("  %-7s peak %10s  (%s in use when training started)\n",
                devices[i].ToString().c_str(), MiB(stats.peak_bytes).c_str(),
                MiB(in_use_before[i]).c_str());
  }
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
  for (Device d : devices) quoted.push_back("\"" + d.ToString() + "\"");
  std::printf(
      "{\"model\":\"%s\",\"devices\":[%s],\"epochs\":%zu,\"batch_size\":%d,%s"
      "\"train_seconds\":%.1f,\"samples_per_s\":%.1f,%s}\n",
      model_kind.c_str(), absl::StrJoin(quoted, ",").c_str(), state.history.size(), batch_size,
      task->JsonMetrics(state.history).c_str(), train_seconds,
      train_seconds > 0 ? total_samples / train_seconds : 0.0, task->JsonTail().c_str());
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  return tandem::examples::RunMain(
      argc, argv, "train",
      "Trains a classifier on Fashion-MNIST, or a GPT on text, with DataParallel.\n"
      "  train --devices=cpu:0,cpu:1 --epochs=10 --model=mlp --checkpoint=/tmp/mlp.ckpt\n"
      "  train --model=gpt --epochs=5 --prompt=\"The meaning of life is\"",
      [] { return tandem::Run(); });
}
