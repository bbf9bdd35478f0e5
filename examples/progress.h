// ProgressBar: one epoch's progress for the trainer and the benchmarks. On a terminal it
// redraws one line in place (at most ten times a second):
//
//   epoch 3/10 [#########...........]  212/469  7281 samples/s  loss 0.3412  1.9 s left
//
// Written to a file or a pipe it prints a few plain lines instead (at 25%, 50% and 75%), so
// that logs stay short and readable.
//
//   examples::ProgressBar bar(stdout, "epoch 3/10", loader.size());
//   for (...) bar.Update(step, samples_so_far, running_loss, seconds_since_start);
//   bar.Finish();   // clears the line on a terminal
#ifndef TANDEM_EXAMPLES_PROGRESS_H_
#define TANDEM_EXAMPLES_PROGRESS_H_

#include <cstdint>
#include <cstdio>
#include <string>

namespace tandem::examples {

class ProgressBar {
 public:
  // `interactive`: redraw in place; unset, true when `out` is a terminal.
  ProgressBar(std::FILE* out, std::string label, int64_t total, int interactive = -1);

  // `done` of `total` steps finished after `seconds`, having seen `samples` samples, with
  // `loss` the running mean loss (NaN: none, and the bar shows no loss).
  void Update(int64_t done, int64_t samples, double loss, double seconds);
  // Ends the bar: on a terminal the line is cleared, so the next output starts clean.
  void Finish();

  // The text of the bar (without "\r"), for tests and for plain lines.
  static std::string Render(const std::string& label, int64_t done, int64_t total, int64_t samples,
                            double loss, double seconds, int width = 20);
  // "1.9 s", "2 min 05 s", "1 h 02 min".
  static std::string FormatDuration(double seconds);
  static bool IsTerminal(std::FILE* out);

 private:
  std::FILE* out_;
  std::string label_;
  int64_t total_;
  bool interactive_;
  double last_draw_ = -1.0;
  int next_quarter_ = 1;  // plain mode: the next quarter to print (1..3)
  size_t drawn_width_ = 0;
};

// The trainers' --trace: the run's first `steps` training steps recorded by the profiler
// (tensor/runtime/profiler.h) and written to `path` as a Chrome trace once they are done, or at the
// end of the first epoch if it is shorter. An empty path records nothing.
//
//   examples::StepTrace trace(absl::GetFlag(FLAGS_trace), 50);
//   for (...) { TrainStep(); trace.StepDone(); }
//   trace.EpochDone();
//   std::printf("%s", trace.TakeMessage().c_str());   // "trace of 50 steps: ..." once
class StepTrace {
 public:
  StepTrace(std::string path, int64_t steps);
  ~StepTrace();  // stops the profiler if it still records (an exception ended the run)
  StepTrace(const StepTrace&) = delete;
  StepTrace& operator=(const StepTrace&) = delete;

  void StepDone();
  void EpochDone();
  // The line saying where the trace went, once after it is written; "" otherwise.
  std::string TakeMessage();

 private:
  void Write();

  std::string path_;
  int64_t steps_;
  int64_t done_ = 0;
  bool recording_ = false;
  std::string message_;
};

}  // namespace tandem::examples

#endif  // TANDEM_EXAMPLES_PROGRESS_H_
