#include "examples/trainer_state.h"

#include <sys/stat.h>

#include <cstring>
#include <map>

#include "absl/strings/str_format.h"
#include "examples/cli.h"
#include "examples/svg_plot.h"
#include "nn/checkpoint.h"
#include "tensor/error.h"

namespace tandem::examples {
namespace {

constexpr char kModel[] = "model.";
constexpr char kOptimizer[] = "optimizer.";
constexpr char kConfig[] = "trainer.config";
constexpr char kSettings[] = "trainer.settings";
constexpr char kProgress[] = "trainer.progress";  // [epochs_done, sampler_epoch]
constexpr char kGenerator[] = "trainer.generator.";
constexpr char kHistory[] = "trainer.history";  // [epochs, 6] doubles, stored bit for bit
constexpr int64_t kHistoryColumns = 6;

bool StartsWith(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

// Text and doubles ride in int64 tensors (the file format holds float32 and int64).
Tensor TextTensor(const std::string& text) {
  std::vector<int64_t> codes(text.begin(), text.end());
  return from_vector(codes, {static_cast<int64_t>(codes.size())});
}

std::vector<int64_t> Int64s(const Tensor& t) {
  return t.to(Device::Cpu(0)).reshape({t.numel()}).to_vector<int64_t>();
}

std::string TextOf(const Tensor& t) {
  std::string text;
  for (int64_t c : Int64s(t)) text.push_back(static_cast<char>(c));
  return text;
}

int64_t Bits(double v) {
  int64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return bits;
}

double FromBits(int64_t bits) {
  double v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

}  // namespace

void SaveTrainerCheckpoint(const std::string& path, const nn::Module& model,
                           const nn::Optimizer& optimizer, const TrainerState& state) {
  std::vector<nn::CheckpointEntry> entries;
  for (nn::CheckpointEntry& e : nn::ModuleCheckpointEntries(model)) {
    entries.push_back({kModel + e.name, e.is_buffer, std::move(e.value)});
  }
  for (auto& [name, value] : optimizer.state_dict()) {
    entries.push_back({kOptimizer + name, true, value});
  }
  entries.push_back({kConfig, true, TextTensor(state.config)});
  entries.push_back({kSettings, true, TextTensor(state.settings)});
  entries.push_back(
      {kProgress, true,
       from_vector(std::vector<int64_t>{state.epochs_done, state.sampler_epoch}, {2})});
  for (const auto& [device, generator] : state.generators) {
    entries.push_back({kGenerator + device.ToString(), true,
                       from_vector(std::vector<int64_t>{static_cast<int64_t>(generator.seed),
                                                        static_cast<int64_t>(generator.offset)},
                                   {2})});
  }
  std::vector<int64_t> history;
  for (const EpochStats& e : state.history) {
    for (double v : {static_cast<double>(e.epoch), e.train_loss, e.test_loss, e.test_accuracy,
                     e.seconds, e.samples_per_s}) {
      history.push_back(Bits(v));
    }
  }
  entries.push_back(
      {kHistory, true,
       from_vector(history, {static_cast<int64_t>(state.history.size()), kHistoryColumns})});
  nn::WriteCheckpoint(entries, path);
}

bool LoadTrainerCheckpoint(const std::string& path, nn::Module& model, nn::Optimizer& optimizer,
                           TrainerState* state) {
  struct stat info;
  if (stat(path.c_str(), &info) != 0) return false;
  std::vector<nn::CheckpointEntry> model_entries;
  nn::OptimizerState optimizer_state;
  std::map<std::string, Tensor> trainer;
  for (nn::CheckpointEntry& e : nn::ReadCheckpoint(path)) {
    if (StartsWith(e.name, kModel)) {
      model_entries.push_back({e.name.substr(sizeof kModel - 1), e.is_buffer, e.value});
    } else if (StartsWith(e.name, kOptimizer)) {
      optimizer_state[e.name.substr(sizeof kOptimizer - 1)] = e.value;
    } else {
      trainer[e.name] = e.value;
    }
  }
  TANDEM_CHECK(trainer.count(kConfig) && trainer.count(kProgress) && trainer.count(kHistory), "'",
               path,
               "' is not a checkpoint of this trainer (it lacks trainer.config, "
               "trainer.progress or trainer.history); pass another --checkpoint path");
  const std::string config = TextOf(trainer[kConfig]);
  TANDEM_CHECK(config == state->config, "checkpoint '", path, "' was saved by a run with ", config,
               " but this run has ", state->config,
               "; pass the same flags to resume it, or another --checkpoint path to start afresh");
  const std::vector<int64_t> progress = Int64s(trainer[kProgress]);
  TANDEM_CHECK(progress.size() == 2 && progress[0] >= 1 && progress[1] >= 0, "checkpoint '", path,
               "' has a malformed trainer.progress; delete it or pass another --checkpoint path");
  const Tensor& history_tensor = trainer[kHistory];
  TANDEM_CHECK(history_tensor.dim() == 2 && history_tensor.size(1) == kHistoryColumns &&
                   history_tensor.size(0) == progress[0],
               "checkpoint '", path, "' has a malformed trainer.history (",
               ShapeToString(history_tensor.shape()), " for ", progress[0],
               " epochs); delete it or pass another --checkpoint path");
  // Column 0 holds epoch numbers 1, 2, ... as doubles: anything else (NaN, 1e300) is refused
  // here, before the cast to int64 below (undefined behaviour; found by fuzz/checkpoint_fuzzer).
  const std::vector<int64_t> bits = Int64s(history_tensor);
  for (int64_t i = 0; i < progress[0]; ++i) {
    const double epoch = FromBits(bits[i * kHistoryColumns]);
    TANDEM_CHECK(epoch == static_cast<double>(i + 1), "checkpoint '", path,
                 "' has a malformed trainer.history (row ", i, " is for epoch ", epoch,
                 ", expected ", i + 1, "); delete it or pass another --checkpoint path");
  }
  std::vector<std::pair<Device, GeneratorState>> generators;
  for (const auto& [name, value] : trainer) {
    if (!StartsWith(name, kGenerator)) continue;
    const std::vector<int64_t> v = Int64s(value);
    TANDEM_CHECK(v.size() == 2, "checkpoint '", path, "' has a malformed ", name);
    generators.push_back(
        {Device::Parse(name.substr(sizeof kGenerator - 1)),
         GeneratorState{static_cast<uint64_t>(v[0]), static_cast<uint64_t>(v[1])}});
  }
  // The optimizer and the model check their entries before changing anything; the optimizer
  // goes first and is put back if the model refuses, so a mismatch leaves both as they were.
  try {
    const nn::OptimizerState current = optimizer.state_dict();
    optimizer.load_state_dict(optimizer_state);
    try {
      nn::LoadModuleEntries(model, model_entries, path);
    } catch (...) {
      optimizer.load_state_dict(current);
      throw;
    }
  } catch (const Error& e) {
    std::string message = e.what();
    for (char& c : message) c = c == '\n' ? ';' : c;
    TANDEM_FAIL("checkpoint '", path, "' does not fit this model and optimizer: ", message);
  }
  state->settings = trainer.count(kSettings) ? TextOf(trainer[kSettings]) : "";
  state->epochs_done = progress[0];
  state->sampler_epoch = progress[1];
  state->generators = std::move(generators);
  state->history.clear();
  for (int64_t i = 0; i < progress[0]; ++i) {
    const int64_t* row = &bits[i * kHistoryColumns];
    state->history.push_back({static_cast<int64_t>(FromBits(row[0])), FromBits(row[1]),
                              FromBits(row[2]), FromBits(row[3]), FromBits(row[4]),
                              FromBits(row[5])});
  }
  return true;
}

std::string EpochsCsv(const std::vector<EpochStats>& history) {
  std::string out = "epoch,train_loss,test_loss,test_accuracy,seconds,samples_per_s\n";
  for (const EpochStats& e : history) {
    absl::StrAppendFormat(&out, "%d,%.6f,%.6f,%.6f,%.3f,%.1f\n", e.epoch, e.train_loss, e.test_loss,
                          e.test_accuracy, e.seconds, e.samples_per_s);
  }
  return out;
}

std::string EpochsChart(const std::vector<EpochStats>& history, const std::string& title) {
  PlotSeries train{"train loss", {}, {}, "#1f77b4"};
  PlotSeries test{"test loss", {}, {}, "#ff7f0e", /*dashed=*/true};
  PlotSeries accuracy{"test accuracy", {}, {}, "#2ca02c"};
  for (const EpochStats& e : history) {
    for (PlotSeries* s : {&train, &test, &accuracy}) s->x.push_back(e.epoch);
    train.y.push_back(e.train_loss);
    test.y.push_back(e.test_loss);
    accuracy.y.push_back(e.test_accuracy);
  }
  return RenderSvgChart(title, "epoch",
                        {{"Loss", "cross-entropy loss", {train, test}},
                         {"Test accuracy", "accuracy", {accuracy}, /*percent=*/true}});
}

void WriteEpochLogs(const std::vector<EpochStats>& history, const std::string& csv_path,
                    const std::string& plot_path, const std::string& title) {
  if (!csv_path.empty()) WriteFileAtomically(csv_path, EpochsCsv(history), "--log_csv");
  if (!plot_path.empty()) WriteFileAtomically(plot_path, EpochsChart(history, title), "--plot");
}

}  // namespace tandem::examples
