// TrainStrategy: what differs between training in one process with DataParallel (every
// device of the machine, examples/data_parallel_training.h) and one process per device with
// DistributedDataParallel (examples/distributed_training.h): the devices, how the data is
// shared out, where the loss runs, which process reports, what the ranks agree on before
// the first step, and the random state a resume restores. RunTraining (examples/trainer.h)
// calls these in its one loop, in the order they are declared.
//
//   std::unique_ptr<TrainStrategy> s = distributed ? MakeDistributedStrategy()
//                                                  : MakeDataParallelStrategy();
//   return s->Guard([&] { return RunTraining(config, *s, reporter); });
#ifndef TANDEM_EXAMPLES_TRAIN_STRATEGY_H_
#define TANDEM_EXAMPLES_TRAIN_STRATEGY_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/sampler.h"
#include "examples/cli.h"
#include "examples/models.h"
#include "examples/task.h"
#include "examples/trainer.h"
#include "examples/trainer_state.h"
#include "nn/nn.h"
#include "tensor/tensor.h"

namespace tandem::examples {

class TrainStrategy {
 public:
  virtual ~TrainStrategy() = default;

  // Runs `training` and turns its errors into this strategy's exit (a rank's error must end
  // every rank). The default lets them through to RunMain.
  virtual int Guard(const std::function<int()>& training) { return training(); }

  // Checks the strategy's own settings, chooses and configures this process's devices (the
  // task makes a model to measure) and joins the other ranks. First.
  virtual void Start(const TrainConfig& config, Task& task) = 0;
  // Where the model lives.
  virtual Device device() const = 0;
  // Every device of this process (its memory is reported).
  virtual std::vector<Device> local_devices() const = 0;
  // Whether this process prints, evaluates and writes files (rank 0).
  virtual bool lead() const { return true; }
  // Processes that share each step (the bar's samples are this many times the rank's).
  virtual int world() const { return 1; }
  // Cores each CPU device uses (0: none is a CPU device).
  virtual int threads() const = 0;
  // The run's settings as a checkpoint records them (a resume with others prints a note).
  virtual std::string Settings(const TrainConfig& config) const = 0;

  // Before the resume: every rank has the same settings (throws when not).
  virtual void AgreeOnSettings(const TrainConfig&) {}
  // The loss scaler for float16 (a pass-through unless options.enabled()). A strategy whose
  // ranks each unscale a shard of the gradients gives one that agrees across them.
  virtual std::unique_ptr<nn::GradScaler> MakeGradScaler(const nn::GradScalerOptions& options) {
    return std::make_unique<nn::GradScaler>(options);
  }
  // The optimizer over `model`'s parameters (on device()), as --optimizer, --lr and
  // --weight_decay say; a strategy that shards the optimizer state wraps it.
  virtual TrainerOptimizer MakeOptimizer(const TrainConfig& config, nn::Module& model) {
    return examples::MakeOptimizer(config.task.optimizer, model, config.task.lr,
                                   config.weight_decay);
  }
  // After a checkpoint's load: restores this process's generators; what it says about them.
  virtual std::string RestoreGenerators(const TrainerState& state, uint64_t seed) = 0;
  // This process's share of each epoch of `size` examples, from `epoch` on.
  virtual std::unique_ptr<data::Sampler> MakeSampler(int64_t size, uint64_t seed,
                                                     int64_t epoch) = 0;
  // The sampler's epoch counter (for the checkpoint).
  virtual int64_t sampler_epoch() const = 0;
  // Before the first step: every rank has the same data (`examples` in all, `steps` per
  // epoch) and resume point (throws when not).
  virtual void AgreeOnData(int64_t /*examples*/, int64_t /*steps*/, const TrainerState&) {}
  // Wraps the model (on device()) for training; `config` says how.
  virtual void Wrap(std::shared_ptr<nn::Module> model, const TrainConfig& config) = 0;
  // Lines after the data's: where and how it trains.
  virtual std::string Header(const TrainConfig& config) const = 0;
  // Where the loss runs, for the optimizer line.
  virtual std::string LossWhere(const TrainConfig& config) const = 0;
  // The wrapper, printed.
  virtual std::string WrapperText() const = 0;
  // -1: redraw the progress bar on a terminal; 0: plain lines.
  virtual int interactive_bar() const { return -1; }

  // Each epoch: before its first step (ranks start the clock together).
  virtual void StartEpoch() {}
  // Each epoch, around its steps: `shadow_step` is the trainer's optimizer step, for a rank
  // that has run out of batches while others still train (it runs it on their averaged
  // gradients).
  virtual void BeginSteps(std::function<void()> /*shadow_step*/) {}
  virtual void EndSteps() {}
  // The loss of one batch.
  virtual Tensor Loss(nn::Module& criterion, const Tensor& input, const Tensor& target) = 0;
  // After each step's optimizer step.
  virtual void StepDone() {}
  // {loss sum, samples} of the epoch over every rank, on every rank.
  virtual std::vector<double> EpochTotals(double loss_sum, double seen) = 0;
  // Stores the generators a checkpoint keeps in `state` (every rank; `checkpointing`: a
  // checkpoint will be written); a note for the lead to print, or "".
  virtual std::string SaveGenerators(TrainerState* state, bool checkpointing) = 0;
  // Every rank, before the lead writes a checkpoint of `optimizer`: a sharded optimizer
  // gathers its state to the lead.
  virtual void BeforeCheckpoint(nn::Optimizer& /*optimizer*/) {}
  // Whether the model's forward is collective (a sharded model gathers each unit from every
  // rank as the forward reads it, and no rank ever holds it whole). Then every rank evaluates
  // its share of the test set, runs the report's forward (the GPT's sample) and takes part in
  // --save's gathering; otherwise the lead does them alone.
  virtual bool ForwardIsCollective() const { return false; }
  // The test set's indices this process evaluates, batched by `batch_size`: all, in order,
  // unless the forward is collective.
  virtual std::unique_ptr<data::Sampler> MakeEvalSampler(int64_t size, int64_t /*batch_size*/) {
    return std::make_unique<data::SequentialSampler>(size);
  }
  // The test set's totals (the lead's; a collective forward's ranks each score their share
  // and add every rank's, in the batches' order: the lead alone would get the same sums).
  virtual EvalTotals Evaluate(const Task& task, data::DataLoader& loader,
                              const std::function<Tensor(const Tensor&)>& forward) {
    return examples::Evaluate(task, loader, forward);
  }
  // What --save writes of `model` (the lead writes it; under a collective forward every rank
  // calls this and the others get nothing).
  virtual std::vector<nn::CheckpointEntry> SaveEntries(const nn::Module& model) {
    return nn::ModuleCheckpointEntries(model);
  }
  // Whether checkpoints are sharded (parallel/distributed/sharded_checkpoint.h: every rank
  // writes its own shard of the model and optimizer state, rank 0 an index holding the
  // trainer's entries) rather than written whole by the lead.
  virtual bool ShardsCheckpoints() const { return false; }
  // Sharded checkpoints, every rank (collective): the model and optimizer from the shards of
  // the checkpoint at `path` once the model is wrapped; this epoch's, with `entries` (the
  // trainer's, rank 0's are written), after the lead's evaluation.
  virtual void LoadShardedCheckpoint(const std::string& /*path*/) {}
  virtual void SaveShardedCheckpoint(const std::string& /*path*/,
                                     const std::vector<nn::CheckpointEntry>& /*entries*/) {}
  // The model's output for evaluation (the lead alone, or every rank when the forward is
  // collective; in evaluation mode: SetTraining).
  virtual Tensor EvalForward(const Tensor& input) = 0;
  virtual void SetTraining(bool on) = 0;
  // What the epoch's line adds at its end ("" or "  split ...").
  virtual std::string EpochNote() { return ""; }
  // After the last epoch, every rank.
  virtual void Finish() {}

  // What follows the model's name in the summary and the plot's title: " on cpu:0, cpu:1,
  // batch 128" or ", 2 ranks on cpu:0, cpu:0, batch 8 per rank" (devices joined by
  // `separator`).
  virtual std::string Where(int64_t batch_size, const std::string& separator) const = 0;
  // The devices for the JSON line, and what the JSON line adds ("" or "\"ranks\":2,").
  virtual std::vector<std::string> DeviceNames() const = 0;
  virtual std::string JsonExtra() const { return ""; }
};

// --sync_bn's check, alike for every strategy: it converted `synchronized` layers of
// --model=`model`, and none is an error the user fixes.
inline void RequireSynchronizedNorms(int synchronized, const std::string& model) {
  Require(synchronized > 0, "--sync_bn synchronizes BatchNorm layers but --model=", model,
          " has none; drop the flag, or train --model=resnet");
}

}  // namespace tandem::examples

#endif  // TANDEM_EXAMPLES_TRAIN_STRATEGY_H_
