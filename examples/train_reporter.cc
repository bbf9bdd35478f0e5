#include "examples/train_reporter.h"

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace tandem::examples {

void TrainReporter::Print(const std::string& text) {
  if (!enabled_) return;
  std::fputs(text.c_str(), out_);
  std::fflush(out_);
}

void TrainReporter::BeginEpoch(const std::string& label, int64_t steps, int interactive) {
  if (enabled_) bar_ = std::make_unique<ProgressBar>(out_, label, steps, interactive);
}

void TrainReporter::Step(int64_t step, int64_t samples, double loss, double seconds) {
  if (bar_) bar_->Update(step, samples, loss, seconds);
}

void TrainReporter::EndEpoch() {
  if (bar_) bar_->Finish();
  bar_.reset();
}

void TrainReporter::EpochLine(int epoch, int epochs, double train_loss, const std::string& metrics,
                              double samples_per_s, double seconds, const std::string& note) {
  Print(absl::StrFormat("epoch %*d/%d  train loss %.4f  %s  %.0f samples/s  %.1f s%s\n",
                        static_cast<int>(std::to_string(epochs).size()), epoch, epochs, train_loss,
                        metrics, samples_per_s, seconds, note));
}

void TrainReporter::Summary(const std::string& model, const std::string& where,
                            const std::vector<EpochStats>& history, Task& task,
                            const std::string& optimizer, double lr) {
  if (!enabled_) return;
  double train_seconds = 0;
  for (const EpochStats& e : history) train_seconds += e.seconds;
  std::string text =
      absl::StrFormat("\nSummary: %s%s, %d epoch%s, %.1f s of training\n", model, where,
                      history.size(), history.size() == 1 ? "" : "s", train_seconds);
  text += task.SummaryHeader() + "\n";
  for (const EpochStats& e : history) text += task.SummaryRow(e) + "\n";
  text += task.Report(history, optimizer, lr);
  Print(text);
}

void TrainReporter::WriteLogs(const std::vector<EpochStats>& history, const std::string& csv,
                              const std::string& plot, const std::string& title) {
  if (enabled_) WriteEpochLogs(history, csv, plot, title);
}

void TrainReporter::Json(const std::string& model, const std::vector<std::string>& devices,
                         const std::string& extra, const std::vector<EpochStats>& history,
                         int64_t batch_size, const std::string& task_metrics,
                         const std::string& task_tail) {
  double train_seconds = 0, samples = 0;
  for (const EpochStats& e : history) {
    train_seconds += e.seconds;
    samples += e.samples_per_s * e.seconds;
  }
  std::vector<std::string> quoted;
  for (const std::string& d : devices) quoted.push_back("\"" + d + "\"");
  Print(absl::StrFormat(
      "{\"model\":\"%s\",\"devices\":[%s],%s\"epochs\":%d,\"batch_size\":%d,%s"
      "\"train_seconds\":%.1f,\"samples_per_s\":%.1f,%s}\n",
      model, absl::StrJoin(quoted, ","), extra, history.size(), batch_size, task_metrics,
      train_seconds, train_seconds > 0 ? samples / train_seconds : 0.0, task_tail));
}

}  // namespace tandem::examples
