// What the trainer (examples/train.cc, and its --distributed mode) learns: a Task owns the
// parts that differ between classifying Fashion-MNIST images (--model=mlp|cnn|resnet) and
// next-byte prediction on English text with a GPT (--model=gpt): the datasets, the model, the
// criterion, the evaluation (accuracy for images; loss per token, perplexity and next-byte
// accuracy for text), the lines that describe the run and the end-of-run report (a chance-level
// warning for images, a sampled continuation of a prompt for text). The training loop, the
// checkpoints, the logs and the summary stay in the trainer, shared by every task.
//
//   TaskOptions options;
//   options.model = "gpt";
//   ResolveTaskDefaults(&options);                  // --lr, --batch_size, ... left unset
//   std::unique_ptr<Task> task = MakeTask(options);
//   std::shared_ptr<nn::Module> model = task->MakeModel();
//   task->LoadData(/*with_test=*/true);
//   Tensor loss = dp.forward_loss(task->criterion(), task->Input(batch), batch.target());
//   EvalTotals totals = Evaluate(*task, test_loader, forward);   // sums over the test set
#ifndef TANDEM_EXAMPLES_TASK_H_
#define TANDEM_EXAMPLES_TASK_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "data/dataloader.h"
#include "data/dataset.h"
#include "examples/gpt.h"
#include "examples/trainer_state.h"
#include "nn/nn.h"
#include "tensor/tensor.h"

namespace tandem::examples {

// The trainer's flags that a task reads. Fields left at their "unset" value (empty, 0 or -1,
// as noted) take the task's default in ResolveTaskDefaults.
struct TaskOptions {
  std::string model = "mlp";  // mlp, cnn, resnet (Fashion-MNIST) or gpt (fortunes)
  std::string optimizer;      // "": sgd for images, adamw for gpt
  double lr = 0;              // 0: 0.05 for images, 0.001 for gpt
  int64_t batch_size = 0;     // 0: 128 images, 8 windows of text
  std::string data_dir;       // "": the task's corpus in its Debian package's folder
  int64_t train_limit = -1;   // -1: images all (0); gpt 1024 windows spread over the text
  int64_t test_limit = -1;    // -1: images all (0); gpt 256 windows spread over the text
  uint64_t seed = 1;
  // --model=gpt: the model's sizes (context is GptConfig::block_size) and the sample.
  GptConfig gpt = GptConfig::Small();
  std::string prompt = "The meaning of life is";
  int64_t max_new_tokens = 200;
  double temperature = 0.8;
  int64_t top_k = 40;
};

// Fills the unset fields of `options` with its model's defaults (see TaskOptions).
void ResolveTaskDefaults(TaskOptions* options);

// Sums over evaluated predictions: a prediction is an image's class, or one next token.
struct EvalTotals {
  double loss_sum = 0;  // cross-entropy summed over the predictions
  int64_t correct = 0;  // predictions whose argmax is the target
  int64_t count = 0;    // predictions

  void Add(const EvalTotals& other);
  double loss() const;      // mean cross-entropy per prediction (0 without any)
  double accuracy() const;  // correct / count (0 without any)
  // exp(loss()): the model is as unsure as a uniform choice among this many tokens.
  double perplexity() const;
};

// The totals of one batch: logits [N, C] with int64 targets [N], or logits [B, T, V] with
// targets [B, T] (each of the B * T positions is a prediction). Any device; no graph needed.
EvalTotals ScoreBatch(const Tensor& logits, const Tensor& targets);

class Task {
 public:
  virtual ~Task() = default;

  // "Fashion-MNIST" or "fortunes", for titles.
  virtual std::string DataName() const = 0;
  // A fresh model on the CPU, initialised from the default generator (seed it first).
  virtual std::shared_ptr<nn::Module> MakeModel() = 0;
  // Reads the training set, and the test (validation) set when `with_test` (DDP: rank 0).
  // Throws a tandem::Error naming the fix when the data is missing.
  virtual void LoadData(bool with_test) = 0;
  const std::shared_ptr<const data::Dataset>& train_set() const { return train_set_; }
  const std::shared_ptr<const data::Dataset>& test_set() const { return test_set_; }
  // One line (without newline) on the data, e.g. "Fashion-MNIST: 60000 training and ...".
  virtual std::string DataLine() const = 0;
  // Lines (each ending in a newline) describing the model, printed before DataParallel's
  // printout; "" for none.
  virtual std::string ModelLines() const { return ""; }
  // The model's input from a batch already on its device.
  virtual Tensor Input(const data::Batch& batch) const = 0;
  // The training loss as a module: criterion(model(Input(batch)), batch.target()). It can be
  // passed to DataParallel::forward_loss.
  virtual nn::Module& criterion() = 0;
  virtual int64_t eval_batch_size() const = 0;
  // Rows each sample puts through the model's layers (tokens for text, 1 for an image): the
  // work per sample that parallel::ChooseCpuLayout weighs against the parameters.
  virtual int64_t rows_per_sample() const { return 1; }

  // After evaluating an epoch: its test metrics for the epoch line, e.g. "test loss 0.4 ...".
  virtual std::string EpochMetrics(const EpochStats& epoch) const = 0;
  // The summary table's header and rows (two leading spaces, no newline).
  virtual std::string SummaryHeader() const = 0;
  virtual std::string SummaryRow(const EpochStats& epoch) const = 0;
  // The end of the run (after the summary table; lines ending in newlines): for images a
  // warning when the final accuracy is at chance level, for text a sampled continuation of
  // the prompt by `model` (the trained module MakeModel returned).
  virtual std::string Report(const std::vector<EpochStats>& history, const std::string& optimizer,
                             double lr) = 0;
  // The forward the report runs instead of the model's own: a sharded wrapper's, whose
  // forward is collective (every rank then runs Report with the same generator state).
  void set_report_forward(std::function<Tensor(const Tensor&)> forward) {
    report_forward_ = std::move(forward);
  }
  // The JSON line's fields after "batch_size" and before "train_seconds" (each followed by a
  // comma), and the last ones (no trailing comma).
  virtual std::string JsonMetrics(const std::vector<EpochStats>& history) const = 0;
  virtual std::string JsonTail() const = 0;

 protected:
  std::shared_ptr<const data::Dataset> train_set_, test_set_;
  std::function<Tensor(const Tensor&)> report_forward_;  // nullptr: the model's own
};

// The task of resolved `options` (ResolveTaskDefaults first). Throws UsageError for an unknown
// --model or GPT sizes that do not fit (n_embd not a multiple of n_head, ...).
std::unique_ptr<Task> MakeTask(const TaskOptions& options);

// Sums over every batch of `loader` of ScoreBatch(forward(task.Input(batch)), target), without
// a graph. The caller puts the model in evaluation mode (and autocast) around it.
EvalTotals Evaluate(const Task& task, data::DataLoader& loader,
                    const std::function<Tensor(const Tensor&)>& forward);
}  // namespace tandem::examples

#endif  // TANDEM_EXAMPLES_TASK_H_
