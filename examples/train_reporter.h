// TrainReporter: everything the trainer tells its user, in one place: the header, a progress
// bar per epoch, one line per epoch, the CSV log and SVG plot (rewritten after each epoch),
// the final summary and, as the very last line, one JSON object with the run's figures.
// Only the process that reports (rank 0) prints; RunTraining (examples/trainer.h) disables
// it on the others.
//
//   TrainReporter reporter(stdout);
//   reporter.BeginEpoch("epoch 1/2", steps, -1);
//   reporter.Step(1, 128, 2.3, 0.1);
//   reporter.EndEpoch();
#ifndef TANDEM_EXAMPLES_TRAIN_REPORTER_H_
#define TANDEM_EXAMPLES_TRAIN_REPORTER_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "examples/progress.h"
#include "examples/task.h"
#include "examples/trainer_state.h"

namespace tandem::examples {

class TrainReporter {
 public:
  explicit TrainReporter(std::FILE* out) : out_(out) {}

  void set_enabled(bool enabled) { enabled_ = enabled; }
  bool enabled() const { return enabled_; }

  // Text as it is (lines end in '\n'), flushed.
  void Print(const std::string& text);

  // The progress bar of one epoch (interactive: -1 on a terminal, 0 plain lines).
  void BeginEpoch(const std::string& label, int64_t steps, int interactive);
  void Step(int64_t step, int64_t samples, double loss, double seconds);
  void EndEpoch();

  // One line per epoch: "epoch 1/2  train loss ...  <task metrics>  N samples/s  S s<note>".
  void EpochLine(int epoch, int epochs, double train_loss, const std::string& metrics,
                 double samples_per_s, double seconds, const std::string& note);

  // The summary: every epoch of the run (a resumed run's earlier ones included) as the task
  // tabulates them, then the task's report (for text, the trained model's sample).
  void Summary(const std::string& model, const std::string& where,
               const std::vector<EpochStats>& history, Task& task, const std::string& optimizer,
               double lr);

  // The CSV and SVG files (paths may be empty: none), after each epoch.
  void WriteLogs(const std::vector<EpochStats>& history, const std::string& csv,
                 const std::string& plot, const std::string& title);

  // The final JSON line: {"model":...,"devices":[...],<extra>"epochs":...,...,<task's tail>}.
  void Json(const std::string& model, const std::vector<std::string>& devices,
            const std::string& extra, const std::vector<EpochStats>& history, int64_t batch_size,
            const std::string& task_metrics, const std::string& task_tail);

 private:
  std::FILE* out_;
  bool enabled_ = true;
  std::unique_ptr<ProgressBar> bar_;
};

}  // namespace tandem::examples

#endif  // TANDEM_EXAMPLES_TRAIN_REPORTER_H_
