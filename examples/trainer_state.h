// The trainer's checkpoint: everything a run needs to continue exactly where it stopped —
// the model's parameters and buffers, the optimizer's state (momentum buffers, Adam moments
// and step counts), the epochs done, the shuffling sampler's epoch, every device's random
// generator, the per-epoch results so far (for the summary, the CSV and the plot), and for a
// float16 run the GradScaler's scale and growth tracker (so that the resumed run skips and
// grows exactly where the uninterrupted one would).
//
// One file in nn/checkpoint.h's format, written atomically (a temporary file renamed over
// the old one), with entries named "model.<name>", "optimizer.<name>", "scaler.<name>" (an
// enabled GradScaler's state_dict) and "trainer.<what>". Under --sharding=full and shard_grad_op
// the file is instead a sharded checkpoint's index (parallel/distributed/sharded_checkpoint.h)
// holding the trainer.* entries, the model and optimizer in a shard file per rank.
//
//   examples::TrainerState state{...};
//   examples::SaveTrainerCheckpoint("/tmp/run.ckpt", *model, *optimizer, state, &scaler);
//   if (examples::LoadTrainerCheckpoint("/tmp/run.ckpt", *model, *optimizer, &state,
//                                       &scaler)) ...
#ifndef TANDEM_EXAMPLES_TRAINER_STATE_H_
#define TANDEM_EXAMPLES_TRAINER_STATE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "data/dataset.h"
#include "nn/checkpoint.h"
#include "nn/grad_scaler.h"
#include "nn/module.h"
#include "nn/optim.h"
#include "tensor/tensor.h"

namespace tandem::examples {

// One epoch's results.
struct EpochStats {
  int64_t epoch = 0;  // 1-based
  double train_loss = 0;
  double test_loss = 0;
  double test_accuracy = 0;
  double seconds = 0;  // training only (evaluation excluded)
  double samples_per_s = 0;
};

struct TrainerState {
  // What must match for a resume to make sense, e.g. "model=mlp optimizer=sgd": loading a
  // checkpoint whose `config` differs is refused.
  std::string config;
  // The rest of the run's settings, e.g. "devices=cpu:0,cpu:1 batch_size=128 seed=1": a
  // resume with other settings works but does not repeat an uninterrupted run exactly.
  std::string settings;
  int64_t epochs_done = 0;
  int64_t sampler_epoch = 0;  // data::RandomSampler::epoch() after the last epoch done
  std::vector<std::pair<Device, GeneratorState>> generators;
  std::vector<EpochStats> history;
  // Set by LoadTrainerCheckpoint for a sharded checkpoint (--sharding=full or shard_grad_op):
  // its file is the index of parallel/distributed/sharded_checkpoint.h, the trainer's entries
  // beside its own, and the model and optimizer are in shard files that the strategy loads
  // once it has wrapped the model; LoadTrainerCheckpoint leaves them as they were.
  bool sharded_model = false;
};

// TrainerState::config for a run of `model` with `optimizer` under `autocast` (kFloat32:
// none): "model=mlp optimizer=sgd", plus " autocast=bfloat16" or " autocast=float16" under
// autocast. The precision is part of what a resume must match (a float16 run's optimizer state
// and scale belong to it); float32 runs keep the text earlier versions wrote, so their
// checkpoints still resume.
std::string TrainerConfig(const std::string& model, const std::string& optimizer, DType autocast);

// The per-epoch results as CSV (a header, then one row per epoch), and as an SVG chart of
// train and test loss and test accuracy per epoch under `title`.
std::string EpochsCsv(const std::vector<EpochStats>& history);
std::string EpochsChart(const std::vector<EpochStats>& history, const std::string& title);

// Writes EpochsCsv to `csv_path` and EpochsChart to `plot_path` (each atomically; an empty
// path writes nothing): what --log_csv and --plot do after each epoch.
void WriteEpochLogs(const std::vector<EpochStats>& history, const std::string& csv_path,
                    const std::string& plot_path, const std::string& title);

// Chance level: what a model that learned nothing scores on the test set, the larger of
// guessing (1 / classes) and always answering the test set's most common class (its share,
// `majority_share`; 0 if unknown). A final test accuracy is at chance level when it is no more
// than that plus three standard deviations of such a guesser's accuracy on `test_images`
// images (10.9% on Fashion-MNIST's 10,000 balanced test images, 19% on 100). False without
// test images.
double ChanceLevel(int64_t classes, double majority_share);
// The share of the most common class among the targets (field 1, a class index) of
// `dataset`'s examples: ChanceLevel's `majority_share`, read once a run (0 when empty).
double MajorityShare(const data::Dataset& dataset);
bool AtChanceLevel(double accuracy, double chance, int64_t test_images);

// The summary's warning for a run whose final accuracy is at chance level: what was found and
// the flags to look at (--lr, now `lr`; --optimizer, now `optimizer`), one line ending in a
// newline; "" for a run that learned.
std::string ChanceLevelWarning(double accuracy, int64_t classes, double majority_share,
                               int64_t test_images, const std::string& optimizer, double lr);

// The trainer's own entries of a checkpoint (trainer.*, and scaler.* for an enabled scaler):
// SaveTrainerCheckpoint writes them beside the model's and the optimizer's; a sharded
// checkpoint's index holds them beside its own.
std::vector<nn::CheckpointEntry> TrainerCheckpointEntries(const TrainerState& state,
                                                          const nn::GradScaler* scaler = nullptr);

// Writes the checkpoint (atomically: the previous file stays whole if this fails), with
// `scaler`'s state when it is given and enabled (a disabled scaler has none: nothing is written).
void SaveTrainerCheckpoint(const std::string& path, const nn::Module& model,
                           const nn::Optimizer& optimizer, const TrainerState& state,
                           const nn::GradScaler* scaler = nullptr);

// Returns false, changing nothing, when `path` does not exist. Otherwise loads it into
// `model`, `optimizer` and `*state` — after checking all of it: a corrupted file, a
// checkpoint of another configuration (state->config must be set to this run's before the
// call), one whose tensors do not fit the model, or one whose trainer entries are not what
// this trainer writes (a trainer.generator.<device> missing, extra or renamed against the
// devices in trainer.settings, a history row with a NaN or negative loss or an accuracy
// outside 0..1, an entry of the wrong dtype or shape, text that is not byte codes, an
// unknown trainer.* entry) throws a one-line tandem::Error naming the file and the entry,
// (a sharded checkpoint's index loads the trainer's entries alone: see sharded_model)
// saying what was found and what to do; nothing is changed then.
//
// The GradScaler's state must be there exactly when this run has an enabled `scaler` (float16
// autocast): a checkpoint with a scale loaded into a run without one, or one without a scale
// into a run with one, is refused (a float16 run restarted at the initial scale would skip
// steps the uninterrupted run took; a run that drops the scale changes precision silently).
// The trainer also puts a non-float32 --autocast into `config`, so its own runs are refused
// there first, naming the flag.
bool LoadTrainerCheckpoint(const std::string& path, nn::Module& model, nn::Optimizer& optimizer,
                           TrainerState* state, nn::GradScaler* scaler = nullptr);

// After a load: sets the default generator of each of `devices` (this run's) to its saved
// state. A resume on other devices than the saved run's is still right but not exact: the
// returned note (one "note: ..." line each, "" when there is nothing to say) names the
// devices whose generators had no saved state and start afresh from `seed`, and the saved
// states that are not used.
std::string RestoreGenerators(const TrainerState& state, const std::vector<Device>& devices,
                              uint64_t seed);

}  // namespace tandem::examples

#endif  // TANDEM_EXAMPLES_TRAINER_STATE_H_
