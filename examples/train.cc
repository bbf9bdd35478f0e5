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
// and flags). With --distributed, one process per device under mpirun trains with
// DistributedDataParallel (examples/distributed_training.h).
//
// This file is the flags alone: they fill an examples::TrainConfig, and the one training loop
// (examples/trainer.h) runs it with a strategy (examples/train_strategy.h). Built with
// TANDEM_TRAIN_TEST_HOOKS (//examples:train_with_test_hooks, tests only) it has one more flag,
// --kill_in_epoch, that SIGKILLs the process half-way through that epoch.
#include <csignal>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "examples/cli.h"
#include "examples/data_parallel_training.h"
#include "examples/distributed_training.h"
#include "examples/train_reporter.h"
#include "examples/train_strategy.h"
#include "examples/trainer.h"

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
ABSL_FLAG(bool, checkpoint_activations, false,
          "gpt: recompute each transformer block's activations in backward instead of keeping "
          "them (nn::checkpoint): less memory for longer contexts, about a third more time");
ABSL_FLAG(std::string, prompt, "The meaning of life is",
          "gpt: the text the trained model continues at the end");
ABSL_FLAG(int, max_new_tokens, 200, "gpt: bytes sampled after --prompt");
ABSL_FLAG(double, temperature, 0.8, "gpt: the sample's temperature (lower: more predictable)");
ABSL_FLAG(int, top_k, 40, "gpt: sample among the k most likely bytes only");
ABSL_FLAG(bool, distributed, false,
          "One process per device under mpirun, with DistributedDataParallel: mpirun -np 2 "
          "train --distributed (see examples/distributed_training.h)");
ABSL_FLAG(std::string, sharding, "none",
          "With --distributed: none (every rank keeps the whole model and optimizer state), "
          "zero1 (each rank keeps the state of its share of the parameters, steps it and "
          "broadcasts it: PyTorch's ZeroRedundancyOptimizer), zero2 or shard_grad_op (FSDP's "
          "SHARD_GRAD_OP: gradients and state sharded) or full (FSDP's FULL_SHARD: parameters "
          "too, gathered a unit at a time; sharded checkpoints). The same numbers as none");
ABSL_FLAG(bool, sync_bn, false,
          "Batch normalisation over the whole batch (PyTorch's SyncBatchNorm; for "
          "--model=resnet): across the ranks with --distributed, else across DataParallel's "
          "devices, instead of each one's share");
ABSL_FLAG(double, collective_timeout, 300,
          "With --distributed: seconds a collective may wait for the other ranks before the run "
          "fails, naming the ranks that did not answer (a stopped, hung or dead rank) and the "
          "collective; raise it if rank 0's evaluation or checkpoint takes longer");

#ifdef TANDEM_TRAIN_TEST_HOOKS
// Tests only (the resume tests): the process kills itself (SIGKILL) half-way through this epoch.
ABSL_FLAG(int, kill_in_epoch, 0, "(testing) SIGKILL the process half-way through this epoch");
#endif

namespace tandem {
namespace {

// The flags, as the trainer's settings.
examples::TrainConfig ConfigFromFlags() {
  examples::TrainConfig c;
  examples::TaskOptions& o = c.task;
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
              .dropout(absl::GetFlag(FLAGS_dropout))
              .checkpoint_activations(absl::GetFlag(FLAGS_checkpoint_activations));
  o.prompt = absl::GetFlag(FLAGS_prompt);
  o.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  o.temperature = absl::GetFlag(FLAGS_temperature);
  o.top_k = absl::GetFlag(FLAGS_top_k);
  const std::string devices = absl::GetFlag(FLAGS_devices);
  const std::string device = absl::GetFlag(FLAGS_device);
  examples::Require(devices.empty() || device.empty(), "--device=", device,
                    " and --devices=", devices,
                    " are both set; --device is an alias of --devices with one device: pass one "
                    "of them");
  c.devices = devices.empty() ? device : devices;
  c.threads = absl::GetFlag(FLAGS_threads);
  c.weight_decay = absl::GetFlag(FLAGS_weight_decay);
  c.lr_decay = absl::GetFlag(FLAGS_lr_decay);
  c.epochs = absl::GetFlag(FLAGS_epochs);
  c.workers = absl::GetFlag(FLAGS_workers);
  c.forward_loss = absl::GetFlag(FLAGS_forward_loss);
  c.autocast = absl::GetFlag(FLAGS_autocast);
  c.ddp_compression = absl::GetFlag(FLAGS_ddp_compression);
  c.sharding = absl::GetFlag(FLAGS_sharding);
  c.sync_bn = absl::GetFlag(FLAGS_sync_bn);
  c.detect_anomaly = absl::GetFlag(FLAGS_detect_anomaly);
  c.checkpoint = absl::GetFlag(FLAGS_checkpoint);
  c.log_csv = absl::GetFlag(FLAGS_log_csv);
  c.plot = absl::GetFlag(FLAGS_plot);
  c.save = absl::GetFlag(FLAGS_save);
  c.trace = absl::GetFlag(FLAGS_trace);
  c.collective_timeout = absl::GetFlag(FLAGS_collective_timeout);
#ifdef TANDEM_TRAIN_TEST_HOOKS
  if (const int kill_in_epoch = absl::GetFlag(FLAGS_kill_in_epoch); kill_in_epoch > 0) {
    c.after_step = [kill_in_epoch](int epoch, int64_t step, int64_t steps) {
      if (epoch == kill_in_epoch && step == steps / 2) std::raise(SIGKILL);
    };
  }
#endif
  return c;
}

int Run() {
  const examples::TrainConfig config = ConfigFromFlags();
  std::unique_ptr<examples::TrainStrategy> strategy = absl::GetFlag(FLAGS_distributed)
                                                          ? examples::MakeDistributedStrategy()
                                                          : examples::MakeDataParallelStrategy();
  examples::TrainReporter reporter(stdout);
  return strategy->Guard([&] { return examples::RunTraining(config, *strategy, reporter); });
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
