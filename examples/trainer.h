// The trainer's one training loop: TrainConfig (what the trainer's flags set) and
// RunTraining, which trains a Task (examples/task.h) with a TrainStrategy (what differs
// between DataParallel in one process and DistributedDataParallel over ranks:
// examples/train_strategy.h) and prints through a TrainReporter (examples/train_reporter.h).
// Use it to train from a program; examples/train.cc turns its flags into a TrainConfig.
//
//   examples::TrainConfig config;
//   config.task.model = "cnn";
//   config.epochs = 2;
//   auto strategy = examples::MakeDataParallelStrategy();
//   examples::TrainReporter reporter(stdout);
//   return strategy->Guard([&] { return examples::RunTraining(config, *strategy, reporter); });
#ifndef TANDEM_EXAMPLES_TRAINER_H_
#define TANDEM_EXAMPLES_TRAINER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "examples/task.h"

namespace tandem::examples {

class TrainStrategy;
class TrainReporter;

// Called by the process that reports (rank 0) after each training step: a test's hook
// (//examples:train_with_test_hooks kills the process there). Empty: nothing.
using AfterStepHook = std::function<void(int epoch, int64_t step, int64_t steps)>;

// One training run: each field is what the trainer's flag of the same name sets (see
// examples/train.cc for their meaning); the task's (model, optimizer, lr, batch size, data,
// limits, seed, GPT sizes, sample) in `task`, unset ones resolved by RunTraining.
struct TrainConfig {
  TaskOptions task;
  std::string devices;  // "": the strategy's default
  int threads = 0;      // cores per CPU device (0: the machine's, shared)
  double weight_decay = 0;
  std::string lr_decay = "cosine";
  int epochs = 10;
  int workers = 1;
  bool forward_loss = true;
  std::string autocast;                  // "", bf16 or fp16
  std::string ddp_compression = "none";  // --distributed only
  std::string sharding = "none";         // --distributed only: none or zero1
  bool sync_bn = false;                  // --distributed only
  bool detect_anomaly = false;
  std::string checkpoint, log_csv, plot, save, trace;
  double collective_timeout = 300;  // --distributed only, seconds
  AfterStepHook after_step;         // tests only; not a setting
};

// A setting by the flag that sets it ("--epochs", "10"), and whether ranks may differ in it.
struct NamedSetting {
  std::string flag, value;
  bool may_differ = false;  // a per-machine path or resource, or what rank 0 alone writes
};

// Every setting of `config` (its task resolved) by flag name, in name order: the one list the
// distributed strategy compares across ranks. A field added to TrainConfig belongs here.
std::vector<NamedSetting> NamedSettings(const TrainConfig& config);

// Runs the whole training; returns the exit status. Throws UsageError for a bad setting.
int RunTraining(const TrainConfig& config, TrainStrategy& strategy, TrainReporter& reporter);

}  // namespace tandem::examples

#endif  // TANDEM_EXAMPLES_TRAINER_H_
