#include "examples/trainer_state.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <sstream>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "examples/cli.h"
#include "examples/svg_plot.h"
#include "nn/checkpoint.h"
#include "tensor/base/atomic_file.h"
#include "tensor/base/error.h"

namespace tandem::examples {
namespace {

constexpr char kModel[] = "model.";
constexpr char kOptimizer[] = "optimizer.";
constexpr char kScaler[] = "scaler.";
// A sharded checkpoint's index (parallel/distributed/sharded_checkpoint.h): its own entries.
constexpr char kShardedIndex[] = "fsdp.";
constexpr char kShardedBuffer[] = "buffer.";
constexpr char kConfig[] = "trainer.config";
constexpr char kSettings[] = "trainer.settings";
constexpr char kProgress[] = "trainer.progress";  // [epochs_done, sampler_epoch]
constexpr char kGenerator[] = "trainer.generator.";
constexpr char kHistory[] = "trainer.history";  // [epochs, 6] doubles, stored bit for bit
constexpr int64_t kHistoryColumns = 6;

bool StartsWith(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

// Text and doubles ride in int64 tensors (the file format holds float32 and int64): text as
// one byte code (1 to 255) per element.
Tensor TextTensor(const std::string& text) {
  std::vector<int64_t> codes;
  for (unsigned char c : text) codes.push_back(c);
  return from_vector(codes, {static_cast<int64_t>(codes.size())});
}

std::vector<int64_t> Int64s(const Tensor& t) {
  return t.to(Device::Cpu(0)).reshape({t.numel()}).to_vector<int64_t>();
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

// How every refusal of a damaged or altered file ends.
constexpr char kFix[] =
    "; the file was not written by this trainer or was altered: delete it or pass another "
    "--checkpoint path";

// The trainer's own entries of one file, checked as they are read: each error names the
// file and the entry.
class TrainerEntries {
 public:
  TrainerEntries(std::string path, std::map<std::string, Tensor> entries)
      : path_(std::move(path)), entries_(std::move(entries)) {}

  const std::map<std::string, Tensor>& all() const { return entries_; }

  // Entry `name` as int64 values, of rank `rank` with `columns` columns when rank is 2.
  std::vector<int64_t> Values(const std::string& name, int64_t rank, int64_t columns = 0) const {
    const Tensor& t = entries_.at(name);
    TANDEM_CHECK(t.dtype() == kInt64, "checkpoint '", path_, "': entry '", name, "' is ",
                 DTypeName(t.dtype()), " but this trainer stores it as int64", kFix);
    TANDEM_CHECK(t.dim() == rank && (rank != 2 || t.size(1) == columns), "checkpoint '", path_,
                 "': entry '", name, "' has shape ", ShapeToString(t.shape()), " but expected ",
                 rank == 1 ? "a vector" : "a matrix of " + std::to_string(columns) + " columns",
                 kFix);
    return Int64s(t);
  }

  // Entry `name` as text: byte codes 1 to 255 (-128 to -1 in files of earlier versions,
  // which stored signed chars).
  std::string Text(const std::string& name) const {
    std::string text;
    const std::vector<int64_t> codes = Values(name, 1);
    for (size_t i = 0; i < codes.size(); ++i) {
      const int64_t c = codes[i];
      TANDEM_CHECK(c != 0 && c >= -128 && c <= 255, "checkpoint '", path_, "': entry '", name,
                   "' holds character code ", c, " at position ", i,
                   "; expected text (byte codes 1 to 255)", kFix);
      text.push_back(static_cast<char>(c));
    }
    return text;
  }

  [[noreturn]] void Fail(const std::string& name, const std::string& what) const {
    TANDEM_FAIL("checkpoint '", path_, "': entry '", name, "' ", what, kFix);
  }

 private:
  std::string path_;
  std::map<std::string, Tensor> entries_;
};

// The devices the run that wrote `settings` trained on: its "devices=a,b" (DataParallel) or
// "device=a" (one rank of --distributed).
std::vector<Device> SettingsDevices(const std::string& settings, const std::string& path) {
  std::istringstream words(settings);
  for (std::string word; words >> word;) {
    for (const std::string key : {"devices=", "device="}) {
      if (!StartsWith(word, key)) continue;
      try {
        return Device::ParseList(word.substr(key.size()));
      } catch (const Error&) {
        TANDEM_FAIL("checkpoint '", path, "': entry 'trainer.settings' names devices '",
                    word.substr(key.size()), "' that are not a device list", kFix);
      }
    }
  }
  TANDEM_FAIL("checkpoint '", path, "': entry 'trainer.settings' ('", settings,
              "') names no devices; expected devices=... as this trainer writes", kFix);
}

}  // namespace

std::vector<nn::CheckpointEntry> TrainerCheckpointEntries(const TrainerState& state,
                                                          const nn::GradScaler* scaler) {
  std::vector<nn::CheckpointEntry> entries;
  if (scaler != nullptr && scaler->is_enabled()) {
    for (auto& [name, value] : scaler->state_dict()) {
      entries.push_back({kScaler + name, true, value});
    }
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
  return entries;
}

void SaveTrainerCheckpoint(const std::string& path, const nn::Module& model,
                           const nn::Optimizer& optimizer, const TrainerState& state,
                           const nn::GradScaler* scaler) {
  std::vector<nn::CheckpointEntry> entries;
  for (nn::CheckpointEntry& e : nn::ModuleCheckpointEntries(model)) {
    entries.push_back({kModel + e.name, e.is_buffer, std::move(e.value)});
  }
  for (auto& [name, value] : optimizer.state_dict()) {
    entries.push_back({kOptimizer + name, true, value});
  }
  for (nn::CheckpointEntry& e : TrainerCheckpointEntries(state, scaler)) {
    entries.push_back(std::move(e));
  }
  nn::WriteCheckpoint(entries, path);
}

bool LoadTrainerCheckpoint(const std::string& path, nn::Module& model, nn::Optimizer& optimizer,
                           TrainerState* state, nn::GradScaler* scaler) {
  struct stat info;
  if (stat(path.c_str(), &info) != 0) return false;
  std::vector<nn::CheckpointEntry> model_entries;
  nn::OptimizerState optimizer_state;
  nn::GradScalerState scaler_state;
  std::map<std::string, Tensor> trainer;
  bool sharded = false;
  for (nn::CheckpointEntry& e : nn::ReadCheckpoint(path)) {
    if (StartsWith(e.name, kShardedIndex) || StartsWith(e.name, kShardedBuffer)) {
      sharded = true;  // a sharded checkpoint's own entries: the strategy reads them
    } else if (StartsWith(e.name, kModel)) {
      model_entries.push_back({e.name.substr(sizeof kModel - 1), e.is_buffer, e.value});
    } else if (StartsWith(e.name, kOptimizer)) {
      optimizer_state[e.name.substr(sizeof kOptimizer - 1)] = e.value;
    } else if (StartsWith(e.name, kScaler)) {
      scaler_state[e.name.substr(sizeof kScaler - 1)] = e.value;
    } else {
      trainer[e.name] = e.value;
    }
  }
  std::vector<std::string> missing;
  for (const char* name : {kConfig, kSettings, kProgress, kHistory}) {
    if (!trainer.count(name)) missing.push_back(name);
  }
  TANDEM_CHECK(missing.empty(), "'", path, "' is not a checkpoint of this trainer (it lacks ",
               absl::StrJoin(missing, ", "), "); pass another --checkpoint path");
  for (const auto& [name, value] : trainer) {
    TANDEM_CHECK(name == kConfig || name == kSettings || name == kProgress || name == kHistory ||
                     StartsWith(name, kGenerator),
                 "checkpoint '", path, "' holds an entry '", name,
                 "' that this trainer does not write; expected model.*, optimizer.*, scaler.*, ",
                 kConfig, ", ", kSettings, ", ", kProgress, ", ", kHistory, " and ", kGenerator,
                 "<device>", kFix);
  }
  const TrainerEntries entries(path, std::move(trainer));
  const std::string config = entries.Text(kConfig);
  TANDEM_CHECK(config == state->config, "checkpoint '", path, "' was saved by a run with ", config,
               " but this run has ", state->config,
               "; pass the same flags to resume it, or another --checkpoint path to start afresh");
  const std::string settings = entries.Text(kSettings);
  const std::vector<int64_t> progress = entries.Values(kProgress, 1);
  if (progress.size() != 2 || progress[0] < 1 || progress[1] < 0) {
    entries.Fail(kProgress, "holds " + absl::StrJoin(progress, ", ") +
                                "; expected 2 values: the epochs done (at least 1) and the "
                                "sampler's epoch (at least 0)");
  }
  const std::vector<int64_t> bits = entries.Values(kHistory, 2, kHistoryColumns);
  if (static_cast<int64_t>(bits.size()) / kHistoryColumns != progress[0]) {
    entries.Fail(kHistory, "has " + std::to_string(bits.size() / kHistoryColumns) + " rows for " +
                               std::to_string(progress[0]) +
                               " epochs done (trainer.progress); expected one row per epoch");
  }
  // Column 0 holds epoch numbers 1, 2, ... as doubles: anything else (NaN, 1e300) is refused
  // here, before the cast to int64 below (undefined behaviour; found by fuzz/checkpoint_fuzzer).
  // The other columns are what a finished epoch measured: finite, not negative, an accuracy
  // of at most 1 (the trainer stops at a non-finite loss, so it never saves one).
  static const char* const kColumns[kHistoryColumns] = {
      "epoch", "train_loss", "test_loss", "test_accuracy", "seconds", "samples_per_s"};
  for (int64_t i = 0; i < progress[0]; ++i) {
    const double epoch = FromBits(bits[i * kHistoryColumns]);
    if (epoch != static_cast<double>(i + 1)) {
      entries.Fail(kHistory, absl::StrFormat("is malformed: row %d is for epoch %g, expected %d", i,
                                             epoch, i + 1));
    }
    for (int64_t column = 1; column < kHistoryColumns; ++column) {
      const double v = FromBits(bits[i * kHistoryColumns + column]);
      const double high = column == 3 ? 1.0 : std::numeric_limits<double>::max();
      if (!(v >= 0 && v <= high)) {
        entries.Fail(kHistory,
                     absl::StrFormat("is malformed: row %d (epoch %d) has %s %g, expected a "
                                     "finite number %s",
                                     i, i + 1, kColumns[column], v,
                                     column == 3 ? "from 0 to 1" : "of at least 0"));
      }
    }
  }
  // One generator per device of the run that saved the file, named as Device::ToString
  // writes it: a missing, extra or renamed one would make the resume silently inexact.
  const std::vector<Device> saved_devices = SettingsDevices(settings, path);
  std::vector<std::pair<Device, GeneratorState>> generators;
  for (const auto& [name, value] : entries.all()) {
    if (!StartsWith(name, kGenerator)) continue;
    const std::string device_name = name.substr(sizeof kGenerator - 1);
    Device device = Device::Cpu(0);
    try {
      device = Device::Parse(device_name);
    } catch (const Error& e) {
      entries.Fail(name, "is not named after a device (" + examples::OneLine(e.what()) + ")");
    }
    if (device.ToString() != device_name ||
        std::find(saved_devices.begin(), saved_devices.end(), device) == saved_devices.end()) {
      entries.Fail(name, "is not for a device of the run that saved it (trainer.settings: " +
                             settings + ")");
    }
    const std::vector<int64_t> v = entries.Values(name, 1);
    if (v.size() != 2) {
      entries.Fail(name, "holds " + std::to_string(v.size()) +
                             " values; expected 2 (a generator's seed and offset)");
    }
    generators.push_back(
        {device, GeneratorState{static_cast<uint64_t>(v[0]), static_cast<uint64_t>(v[1])}});
  }
  for (Device d : saved_devices) {
    const bool found = std::any_of(generators.begin(), generators.end(),
                                   [&](const auto& g) { return g.first == d; });
    if (!found) {
      entries.Fail(kGenerator + d.ToString(),
                   "is missing, but the run that saved the file trained on " + d.ToString() +
                       " (trainer.settings: " + settings +
                       ") and a resume needs its random state to repeat that run exactly");
    }
  }
  TANDEM_CHECK(!sharded || (model_entries.empty() && optimizer_state.empty()), "checkpoint '", path,
               "' holds both a sharded checkpoint's entries and model.* or optimizer.*", kFix);
  const bool has_scaler = scaler != nullptr && scaler->is_enabled();
  if (!scaler_state.empty() && !has_scaler) {
    const auto scale = scaler_state.find("scale");
    const bool one_value = scale != scaler_state.end() && scale->second.numel() == 1;
    TANDEM_FAIL("checkpoint '", path, "' holds a GradScaler's state",
                one_value ? " (scale " + std::to_string(scale->second.to(kFloat64).item()) + ")"
                          : std::string(),
                " of a float16 run but this run has no GradScaler; resume it with "
                "--autocast=fp16, or pass another --checkpoint path to start afresh");
  }
  TANDEM_CHECK(!scaler_state.empty() || !has_scaler, "checkpoint '", path,
               "' holds no GradScaler state (it was saved by a run without float16 autocast) "
               "but this run has one (--autocast=fp16); resume it with that run's --autocast, or "
               "pass another --checkpoint path to start afresh");
  // The scaler, the optimizer and the model check their entries before changing anything; each
  // is put back if a later one refuses, so a mismatch leaves all three as they were.
  const nn::GradScalerState scaler_before =
      has_scaler ? scaler->state_dict() : nn::GradScalerState();
  if (has_scaler) {
    try {
      scaler->load_state_dict(scaler_state);
    } catch (const Error& e) {
      TANDEM_FAIL("checkpoint '", path, "': its scaler.* entries are not a GradScaler's state (",
                  examples::OneLine(e.what()), ")", kFix);
    }
  }
  if (!sharded) {
    try {
      // The model first, then the optimizer, whose refusal puts the model back from a copy (the
      // optimizer's own state may not be at hand to put back: a ZeroRedundancyOptimizer's is
      // spread over the ranks).
      std::vector<nn::CheckpointEntry> model_before = nn::ModuleCheckpointEntries(model);
      for (nn::CheckpointEntry& e : model_before) e.value = e.value.detach().clone();
      nn::LoadModuleEntries(model, model_entries, path);
      try {
        optimizer.load_state_dict(optimizer_state);
      } catch (...) {
        nn::LoadModuleEntries(model, model_before, path);
        throw;
      }
    } catch (const Error& e) {
      if (has_scaler) scaler->load_state_dict(scaler_before);
      std::string message = e.what();
      for (char& c : message) c = c == '\n' ? ';' : c;
      TANDEM_FAIL("checkpoint '", path, "' does not fit this model and optimizer: ", message);
    }
  }
  state->sharded_model = sharded;
  state->settings = settings;
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

std::string RestoreGenerators(const TrainerState& state, const std::vector<Device>& devices,
                              uint64_t seed) {
  std::vector<std::string> fresh, unused;
  for (Device d : devices) {
    auto it = std::find_if(state.generators.begin(), state.generators.end(),
                           [&](const auto& g) { return g.first == d; });
    if (it == state.generators.end()) {
      fresh.push_back(d.ToString());
    } else {
      default_generator(d).set_state(it->second);
    }
  }
  for (const auto& [device, generator] : state.generators) {
    if (std::find(devices.begin(), devices.end(), device) == devices.end()) {
      unused.push_back(device.ToString());
    }
  }
  std::string note;
  if (!fresh.empty()) {
    note += absl::StrFormat(
        "note: the checkpoint holds no random state for %s (it was saved by a run on other "
        "devices): %s random generator%s start%s afresh from --seed=%d\n",
        absl::StrJoin(fresh, ", "), fresh.size() == 1 ? "its" : "their",
        fresh.size() == 1 ? "" : "s", fresh.size() == 1 ? "s" : "", seed);
  }
  if (!unused.empty()) {
    note += absl::StrFormat(
        "note: the checkpoint's random state for %s is not used (not a device of this run)\n",
        absl::StrJoin(unused, ", "));
  }
  return note;
}

std::string TrainerConfig(const std::string& model, const std::string& optimizer, DType autocast) {
  std::string config = "model=" + model + " optimizer=" + optimizer;
  if (autocast != kFloat32) config += std::string(" autocast=") + DTypeName(autocast);
  return config;
}

double ChanceLevel(int64_t classes, double majority_share) {
  return std::max(classes > 0 ? 1.0 / static_cast<double>(classes) : 0.0, majority_share);
}

bool AtChanceLevel(double accuracy, double chance, int64_t test_images) {
  if (test_images <= 0 || !(chance > 0 && chance < 1)) return false;
  const double spread = std::sqrt(chance * (1 - chance) / static_cast<double>(test_images));
  return accuracy <= chance + 3 * spread;
}

double MajorityShare(const data::Dataset& dataset) {
  const int64_t n = dataset.size();
  if (n == 0) return 0;
  std::map<int64_t, int64_t> per_class;
  int64_t most = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t label = dataset.get(i).at(1).to(Device::Cpu(0)).item<int64_t>();
    most = std::max(most, ++per_class[label]);
  }
  return static_cast<double>(most) / static_cast<double>(n);
}

std::string ChanceLevelWarning(double accuracy, int64_t classes, double majority_share,
                               int64_t test_images, const std::string& optimizer, double lr) {
  const double guessing = 1.0 / static_cast<double>(classes);
  if (!AtChanceLevel(accuracy, ChanceLevel(classes, majority_share), test_images)) return "";
  const std::string most_common =
      majority_share > guessing
          ? absl::StrFormat(
                ", %.2f%% by always answering the most common class of these %d "
                "test images",
                100.0 * majority_share, test_images)
          : "";
  return absl::StrFormat(
      "warning: the final test accuracy (%.2f%%) is at chance level for %d classes (%.2f%% by "
      "guessing%s): the model did not learn. Look at --lr (now %g; 0.05 suits sgd, 0.001 adam) "
      "and --optimizer (now %s)\n",
      100.0 * accuracy, classes, 100.0 * guessing, most_common, lr, optimizer);
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
  if (!csv_path.empty()) WriteFileAtomically(csv_path, EpochsCsv(history), "--log_csv file");
  if (!plot_path.empty())
    WriteFileAtomically(plot_path, EpochsChart(history, title), "--plot file");
}

}  // namespace tandem::examples
