#include "examples/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_format.h"
#include "tensor/runtime/profiler.h"

namespace tandem::examples {

ProgressBar::ProgressBar(std::FILE* out, std::string label, int64_t total, int interactive)
    : out_(out),
      label_(std::move(label)),
      total_(std::max<int64_t>(total, 1)),
      interactive_(interactive < 0 ? IsTerminal(out) : interactive != 0) {}

bool ProgressBar::IsTerminal(std::FILE* out) { return isatty(fileno(out)) == 1; }

std::string ProgressBar::FormatDuration(double seconds) {
  if (!(seconds >= 0) || !std::isfinite(seconds)) return "?";
  if (seconds < 60) return absl::StrFormat("%.1f s", seconds);
  const int64_t whole = static_cast<int64_t>(seconds + 0.5);
  if (whole < 3600) return absl::StrFormat("%d min %02d s", whole / 60, whole % 60);
  return absl::StrFormat("%d h %02d min", whole / 3600, (whole % 3600) / 60);
}

std::string ProgressBar::Render(const std::string& label, int64_t done, int64_t total,
                                int64_t samples, double loss, double seconds, int width) {
  total = std::max<int64_t>(total, 1);
  done = std::clamp<int64_t>(done, 0, total);
  const int filled = static_cast<int>(width * done / total);
  const std::string bar = std::string(filled, '#') + std::string(width - filled, '.');
  const int digits = static_cast<int>(std::to_string(total).size());
  const double rate = seconds > 0 ? samples / seconds : 0.0;
  const double left = done > 0 ? seconds * (total - done) / done : -1.0;
  const std::string loss_text = std::isnan(loss) ? "" : absl::StrFormat("  loss %.4f", loss);
  return absl::StrFormat("%s [%s] %*d/%d  %.0f samples/s%s  %s left", label, bar, digits, done,
                         total, rate, loss_text, FormatDuration(left));
}

void ProgressBar::Update(int64_t done, int64_t samples, double loss, double seconds) {
  if (interactive_) {
    if (done < total_ && last_draw_ >= 0 && seconds - last_draw_ < 0.1) return;
    last_draw_ = seconds;
    const std::string text = Render(label_, done, total_, samples, loss, seconds);
    // Pad with spaces over what a longer previous line left.
    const size_t pad = drawn_width_ > text.size() ? drawn_width_ - text.size() : 0;
    std::fprintf(out_, "\r%s%s", text.c_str(), std::string(pad, ' ').c_str());
    drawn_width_ = text.size();
    std::fflush(out_);
    return;
  }
  bool print = false;
  while (next_quarter_ <= 3 && done * 4 >= next_quarter_ * total_) {
    ++next_quarter_;
    print = true;
  }
  if (print && done < total_) {
    std::fprintf(out_, "%s\n", Render(label_, done, total_, samples, loss, seconds).c_str());
    std::fflush(out_);
  }
}

void ProgressBar::Finish() {
  if (interactive_ && drawn_width_ > 0) {
    std::fprintf(out_, "\r%s\r", std::string(drawn_width_, ' ').c_str());
    std::fflush(out_);
    drawn_width_ = 0;
  }
}

StepTrace::StepTrace(std::string path, int64_t steps) : path_(std::move(path)), steps_(steps) {
  if (path_.empty()) return;
  profiler::Start();
  recording_ = true;
}

StepTrace::~StepTrace() {
  if (recording_) profiler::Stop();
}

void StepTrace::StepDone() {
  if (recording_ && ++done_ == steps_) Write();
}

void StepTrace::EpochDone() {
  if (recording_) Write();
}

std::string StepTrace::TakeMessage() { return std::move(message_); }

void StepTrace::Write() {
  recording_ = false;
  const profiler::Trace trace = profiler::Stop();
  profiler::WriteChromeTrace(trace, path_);
  char line[64];
  std::snprintf(line, sizeof(line), "trace of %lld steps: ", static_cast<long long>(done_));
  message_ = line + path_ + " (" + std::to_string(trace.events.size()) + " regions on " +
             std::to_string(trace.thread_names.size()) + " threads)\n";
}

}  // namespace tandem::examples
