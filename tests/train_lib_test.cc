// The trainer's pieces (//examples:train_lib): the progress bar, the SVG chart and the
// checkpoint of a whole run.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "examples/progress.h"
#include "examples/svg_plot.h"
#include "examples/trainer_state.h"
#include "nn/checkpoint.h"
#include "nn/nn.h"
#include "tensor/runtime/profiler.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace tandem::examples {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

template <typename F>
std::string ErrorOf(F f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The names in `dir`, sorted, each followed by a space.
std::string Listing(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  std::string out;
  for (const std::string& name : names) out += name + " ";
  return out;
}

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) ++n;
  return n;
}

// Everything written to a FILE* by `f`.
template <typename F>
std::string Captured(F f) {
  std::FILE* file = std::tmpfile();
  f(file);
  std::fflush(file);
  std::rewind(file);
  std::string text;
  for (int c; (c = std::fgetc(file)) != EOF;) text.push_back(static_cast<char>(c));
  std::fclose(file);
  return text;
}

TEST(ProgressBarTest, RendersCountsRateLossAndTimeLeft) {
  EXPECT_EQ(ProgressBar::Render("epoch 3/10", 50, 200, 6400, 0.34126, 2.0, 10),
            "epoch 3/10 [##........]  50/200  3200 samples/s  loss 0.3413  6.0 s left");
  EXPECT_EQ(ProgressBar::Render("e", 0, 4, 0, 0.0, 0.0, 4),
            "e [....] 0/4  0 samples/s  loss 0.0000  ? left");
  EXPECT_EQ(ProgressBar::Render("e", 2, 4, 20, std::nan(""), 1.0, 4),
            "e [##..] 2/4  20 samples/s  1.0 s left");
  EXPECT_EQ(ProgressBar::FormatDuration(125.2), "2 min 05 s");
  EXPECT_EQ(ProgressBar::FormatDuration(3720), "1 h 02 min");
}

TEST(ProgressBarTest, PrintsThreePlainLinesAnEpochToAFile) {
  const std::string text = Captured([](std::FILE* out) {
    ProgressBar bar(out, "epoch 1/1", 100, /*interactive=*/0);
    for (int step = 1; step <= 100; ++step) bar.Update(step, step * 10, 1.0, step * 0.01);
    bar.Finish();
  });
  EXPECT_EQ(Count(text, "\n"), 3) << text;
  EXPECT_THAT(text, HasSubstr(" 25/100"));
  EXPECT_THAT(text, HasSubstr(" 50/100"));
  EXPECT_THAT(text, HasSubstr(" 75/100"));
  EXPECT_THAT(text, Not(HasSubstr("\r")));
}

TEST(ProgressBarTest, RedrawsInPlaceOnATerminalAndClearsAtTheEnd) {
  const std::string text = Captured([](std::FILE* out) {
    ProgressBar bar(out, "epoch 1/1", 3, /*interactive=*/1);
    bar.Update(1, 10, 1.0, 0.5);
    bar.Update(2, 20, 1.0, 0.55);  // within 0.1 s of the last draw: skipped
    bar.Update(3, 30, 1.0, 0.6);   // the last step is always drawn
    bar.Finish();
  });
  EXPECT_EQ(Count(text, "\n"), 0);
  EXPECT_THAT(text, HasSubstr("\repoch 1/1 [######..............] 1/3"));
  EXPECT_THAT(text, Not(HasSubstr("2/3")));
  EXPECT_THAT(text, HasSubstr("3/3"));
  EXPECT_EQ(text.back(), '\r');
}

TEST(SvgPlotTest, NiceTicksCoverTheRangeInRoundSteps) {
  EXPECT_EQ(NiceTicks(0.16, 0.52, 6), (std::vector<double>{0.1, 0.2, 0.3, 0.4, 0.5, 0.6}));
  const std::vector<double> ticks = NiceTicks(0.853, 0.8957, 6);
  ASSERT_GE(ticks.size(), 2u);
  EXPECT_LE(ticks.front(), 0.853);
  EXPECT_GE(ticks.back(), 0.8957);
  EXPECT_NEAR(ticks[1] - ticks[0], 0.01, 1e-12);
  EXPECT_EQ(NiceTicks(5, 5, 4).size() >= 2, true);  // a flat range is widened
  EXPECT_THAT(ErrorOf([] { NiceTicks(1, 0, 4); }), HasSubstr("expected finite low <= high"));
}

TEST(SvgPlotTest, ChartHasTitleAxesTicksLegendAndOneLinePerSeries) {
  PlotPanel loss{"Loss",
                 "cross-entropy",
                 {{"train", {1, 2, 3}, {0.5, 0.3, 0.2}, "#1f77b4"},
                  {"test", {1, 2, 3}, {0.4, 0.35, 0.33}, "#ff7f0e", true}}};
  PlotPanel accuracy{"Accuracy",
                     "accuracy",
                     {{"test accuracy", {1, 2, 3}, {0.85, 0.87, 0.88}}},
                     /*percent=*/true};
  const std::string svg = RenderSvgChart("mlp on cpu:0 & cpu:1", "epoch", {loss, accuracy});
  EXPECT_THAT(svg, HasSubstr("<svg xmlns=\"http://www.w3.org/2000/svg\""));
  EXPECT_THAT(svg, HasSubstr(">mlp on cpu:0 &amp; cpu:1</text>"));
  EXPECT_EQ(Count(svg, "<polyline"), 3);
  EXPECT_EQ(Count(svg, "<circle"), 9);
  EXPECT_EQ(Count(svg, "stroke-dasharray"), 2);  // the dashed line and its legend sample
  EXPECT_EQ(Count(svg, ">epoch</text>"), 2);
  EXPECT_THAT(svg, HasSubstr(">cross-entropy</text>"));
  EXPECT_THAT(svg, HasSubstr(">88%</text>"));   // percent ticks
  EXPECT_THAT(svg, HasSubstr(">0.30</text>"));  // steps of 0.05
  for (const char* tick : {">1</text>", ">2</text>", ">3</text>"}) {
    EXPECT_EQ(Count(svg, tick), 2) << tick;  // integer epochs on both x axes
  }
  for (const char* name : {">train</text>", ">test</text>", ">test accuracy</text>"}) {
    EXPECT_THAT(svg, HasSubstr(name));
  }
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
  EXPECT_EQ(Count(svg, "<g"), Count(svg, "</g>"));
}

TEST(SvgPlotTest, RejectsMismatchedSeriesAndNoPanels) {
  EXPECT_THAT(ErrorOf([] { RenderSvgChart("t", "x", {}); }), HasSubstr("at least one panel"));
  PlotPanel bad{"p", "y", {{"s", {1, 2}, {1}}}};
  EXPECT_THAT(ErrorOf([&] { RenderSvgChart("t", "x", {bad}); }),
              HasSubstr("series 's' has 2 x values but 1 y values"));
  EXPECT_EQ(XmlEscape("<a href='x'>\"&\"</a>"),
            "&lt;a href=&apos;x&apos;&gt;&quot;&amp;&quot;&lt;/a&gt;");
}

class TrainerStateTest : public ::testing::Test {
 protected:
  void SetUp() override { SetCpuDeviceCount(2); }

  // What the trainer saves after two epochs on cpu:0 and cpu:1.
  static TrainerState SavedState() {
    TrainerState state;
    state.config = "model=tiny optimizer=sgd";
    state.settings = "devices=cpu:0,cpu:1 batch_size=4 seed=3";
    state.epochs_done = 2;
    state.sampler_epoch = 2;
    state.generators = {{Device::Cpu(0), GeneratorState{3, 40}},
                        {Device::Cpu(1), GeneratorState{3, 80}}};
    state.history = {{1, 0.5, 0.45, 0.85, 1.0, 10.0}, {2, 0.4, 0.41, 0.86, 1.0, 10.0}};
    return state;
  }

  // A small model with one SGD step taken, so the optimizer has state.
  static void Train(nn::Sequential& model, nn::Optimizer& optimizer) {
    Tensor x = randn({4, 3});
    cross_entropy(model.forward(x), from_vector(std::vector<int64_t>{0, 1, 1, 0}, {4})).backward();
    optimizer.step();
  }
};

TEST_F(TrainerStateTest, RoundTripsModelOptimizerProgressGeneratorsAndHistory) {
  manual_seed(3);
  nn::Sequential model(nn::Linear(3, 4), nn::ReLU(), nn::Linear(4, 2));
  nn::SGD sgd(model.parameters(), nn::SGDOptions(0.1).momentum(0.9));
  Train(model, sgd);
  TrainerState state;
  state.config = "model=tiny optimizer=sgd";
  state.settings = "devices=cpu:0,cpu:1";
  state.epochs_done = 2;
  state.sampler_epoch = 2;
  state.generators = {{Device::Cpu(0), GeneratorState{3, 12345}},
                      {Device::Cpu(1), GeneratorState{3, (uint64_t{1} << 40) + 8}}};
  state.history = {{1, 0.5, 0.45, 0.8512345678901, 1.25, 1000.5},
                   {2, 0.4, 0.41, 0.86, 1.5, 900.25}};
  const std::string path = TempPath("roundtrip.ckpt");
  SaveTrainerCheckpoint(path, model, sgd, state);

  manual_seed(4);
  nn::Sequential other(nn::Linear(3, 4), nn::ReLU(), nn::Linear(4, 2));
  nn::SGD other_sgd(other.parameters(), nn::SGDOptions(0.1).momentum(0.9));
  TrainerState loaded;
  loaded.config = state.config;
  ASSERT_TRUE(LoadTrainerCheckpoint(path, other, other_sgd, &loaded));
  EXPECT_EQ(loaded.settings, state.settings);
  EXPECT_EQ(loaded.epochs_done, 2);
  EXPECT_EQ(loaded.sampler_epoch, 2);
  ASSERT_EQ(loaded.generators.size(), 2u);
  EXPECT_EQ(loaded.generators[1].first, Device::Cpu(1));
  EXPECT_EQ(loaded.generators[1].second, state.generators[1].second);
  ASSERT_EQ(loaded.history.size(), 2u);
  EXPECT_EQ(loaded.history[0].test_accuracy, 0.8512345678901);  // doubles, bit for bit
  EXPECT_EQ(loaded.history[1].samples_per_s, 900.25);
  const auto a = model.named_parameters(), b = other.named_parameters();
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].value.to_vector<float>(), b[i].value.to_vector<float>()) << a[i].name;
    EXPECT_EQ(sgd.momentum_buffer(i).to_vector<float>(),
              other_sgd.momentum_buffer(i).to_vector<float>());
  }
}

TEST_F(TrainerStateTest, MissingFileLoadsNothingAndMismatchesAreRefusedWholesale) {
  manual_seed(3);
  nn::Sequential model(nn::Linear(3, 4), nn::ReLU(), nn::Linear(4, 2));
  nn::SGD sgd(model.parameters(), nn::SGDOptions(0.1).momentum(0.9));
  TrainerState state;
  state.config = "model=tiny optimizer=sgd";
  EXPECT_FALSE(LoadTrainerCheckpoint(TempPath("does-not-exist.ckpt"), model, sgd, &state));
  Train(model, sgd);
  state.settings = "devices=cpu:0";
  state.generators = {{Device::Cpu(0), GeneratorState{3, 4}}};
  state.epochs_done = 1;
  state.history = {{1, 0.5, 0.45, 0.85, 1.0, 10.0}};
  const std::string path = TempPath("mismatch.ckpt");
  SaveTrainerCheckpoint(path, model, sgd, state);

  // Another configuration: refused before anything is read into the model.
  nn::Sequential wider(nn::Linear(3, 8), nn::ReLU(), nn::Linear(8, 2));
  nn::Adam adam(wider.parameters());
  TrainerState other;
  other.config = "model=wide optimizer=adam";
  const std::string config_error =
      ErrorOf([&] { LoadTrainerCheckpoint(path, wider, adam, &other); });
  EXPECT_THAT(config_error, HasSubstr("was saved by a run with model=tiny optimizer=sgd but this "
                                      "run has model=wide optimizer=adam"));
  EXPECT_THAT(config_error, Not(HasSubstr("\n")));

  // The same configuration string but tensors that do not fit: nothing changes.
  nn::SGD wider_sgd(wider.parameters(), nn::SGDOptions(0.1).momentum(0.9));
  Train(wider, wider_sgd);
  const std::vector<float> before = wider.named_parameters()[0].value.to_vector<float>();
  const std::vector<float> buffer = wider_sgd.momentum_buffer(0).to_vector<float>();
  other.config = state.config;
  const std::string shape_error =
      ErrorOf([&] { LoadTrainerCheckpoint(path, wider, wider_sgd, &other); });
  EXPECT_THAT(shape_error, HasSubstr("does not fit this model and optimizer"));
  EXPECT_THAT(shape_error, Not(HasSubstr("\n")));
  EXPECT_EQ(wider.named_parameters()[0].value.to_vector<float>(), before);
  EXPECT_EQ(wider_sgd.momentum_buffer(0).to_vector<float>(), buffer);
  EXPECT_EQ(other.epochs_done, 0);

  // Not a trainer checkpoint at all (a plain module checkpoint).
  nn::SaveCheckpoint(model, TempPath("plain.ckpt"));
  EXPECT_THAT(ErrorOf([&] { LoadTrainerCheckpoint(TempPath("plain.ckpt"), model, sgd, &other); }),
              HasSubstr("is not a checkpoint of this trainer"));
}

// fuzz/regressions/checkpoint/history-epoch-1e178: an epoch number of 3.2e178 in the history
// was cast to int64 (undefined behaviour, reported by UBSan in the fuzz build).
TEST_F(TrainerStateTest, AHistoryWithImpossibleEpochNumbersIsRefusedBeforeLoading) {
  manual_seed(3);
  nn::Sequential model(nn::Linear(3, 4), nn::ReLU(), nn::Linear(4, 2));
  nn::SGD sgd(model.parameters(), nn::SGDOptions(0.1).momentum(0.9));
  TrainerState state = SavedState();
  const std::string path = TempPath("history.ckpt");
  for (const double epoch : {3.2e178, std::nan(""), 1.5, 1.0}) {
    SaveTrainerCheckpoint(path, model, sgd, state);
    // Rewrite row 1's epoch (stored bit for bit in an int64 tensor) with `epoch`.
    std::vector<nn::CheckpointEntry> entries = nn::ReadCheckpoint(path);
    for (nn::CheckpointEntry& e : entries) {
      if (e.name != "trainer.history") continue;
      std::vector<int64_t> bits = e.value.to_vector<int64_t>();
      std::memcpy(&bits[6], &epoch, sizeof epoch);
      e.value = from_vector(bits, e.value.shape());
    }
    nn::WriteCheckpoint(entries, path);
    nn::Sequential other(nn::Linear(3, 4), nn::ReLU(), nn::Linear(4, 2));
    nn::SGD other_sgd(other.parameters(), nn::SGDOptions(0.1).momentum(0.9));
    const std::vector<float> before = other.named_parameters()[0].value.to_vector<float>();
    TrainerState loaded;
    loaded.config = state.config;
    EXPECT_THAT(ErrorOf([&] { LoadTrainerCheckpoint(path, other, other_sgd, &loaded); }),
                HasSubstr("entry 'trainer.history' is malformed: row 1 is for epoch "))
        << epoch;
    EXPECT_EQ(other.named_parameters()[0].value.to_vector<float>(), before);
    EXPECT_EQ(loaded.epochs_done, 0);
  }
}

// Issue 21, item 8: a saved checkpoint altered by `edit` (its entries, as the file holds them)
// is refused with an error naming the file and the entry; nothing is loaded.
class AlteredCheckpointTest : public TrainerStateTest {
 protected:
  using Entries = std::vector<nn::CheckpointEntry>;

  std::string LoadAltered(const std::function<void(Entries&)>& edit) {
    manual_seed(3);
    nn::Sequential model(nn::Linear(3, 4), nn::ReLU(), nn::Linear(4, 2));
    nn::SGD sgd(model.parameters(), nn::SGDOptions(0.1).momentum(0.9));
    Train(model, sgd);
    SaveTrainerCheckpoint(path_, model, sgd, SavedState());
    Entries entries = nn::ReadCheckpoint(path_);
    edit(entries);
    nn::WriteCheckpoint(entries, path_);

    nn::Sequential other(nn::Linear(3, 4), nn::ReLU(), nn::Linear(4, 2));
    nn::SGD other_sgd(other.parameters(), nn::SGDOptions(0.1).momentum(0.9));
    const std::vector<float> before = other.named_parameters()[0].value.to_vector<float>();
    TrainerState loaded;
    loaded.config = SavedState().config;
    const std::string error =
        ErrorOf([&] { LoadTrainerCheckpoint(path_, other, other_sgd, &loaded); });
    EXPECT_EQ(other.named_parameters()[0].value.to_vector<float>(), before);
    EXPECT_EQ(loaded.epochs_done, 0);
    EXPECT_THAT(error, HasSubstr("'" + path_ + "'"));
    EXPECT_THAT(error, Not(HasSubstr("\n")));
    return error;
  }

  static void Rename(Entries& entries, const std::string& from, const std::string& to) {
    for (nn::CheckpointEntry& e : entries) {
      if (e.name == from) e.name = to;
    }
  }
  static void Remove(Entries& entries, const std::string& name) {
    entries.erase(std::remove_if(entries.begin(), entries.end(),
                                 [&](const nn::CheckpointEntry& e) { return e.name == name; }),
                  entries.end());
  }
  static nn::CheckpointEntry& Find(Entries& entries, const std::string& name) {
    for (nn::CheckpointEntry& e : entries) {
      if (e.name == name) return e;
    }
    throw std::runtime_error("no entry " + name);
  }
  // Sets history row `row`, column `column` (stored bit for bit in an int64 tensor).
  static void SetHistory(Entries& entries, int row, int column, double value) {
    nn::CheckpointEntry& e = Find(entries, "trainer.history");
    std::vector<int64_t> bits = e.value.to_vector<int64_t>();
    std::memcpy(&bits[row * 6 + column], &value, sizeof value);
    e.value = from_vector(bits, e.value.shape());
  }

  const std::string path_ = TempPath("altered.ckpt");
};

TEST_F(AlteredCheckpointTest, AMissingRenamedOrExtraGeneratorIsRefused) {
  const std::string fix = "delete it or pass another --checkpoint path";
  std::string error = LoadAltered([](Entries& e) { Remove(e, "trainer.generator.cpu:0"); });
  EXPECT_THAT(error, HasSubstr("entry 'trainer.generator.cpu:0' is missing, but the run that "
                               "saved the file trained on cpu:0 (trainer.settings: "
                               "devices=cpu:0,cpu:1 batch_size=4 seed=3)"));
  EXPECT_THAT(error, HasSubstr(fix));
  for (const std::string renamed : {"cpu:7", "cpu:5000", "cuda:0", "cpu"}) {
    error = LoadAltered(
        [&](Entries& e) { Rename(e, "trainer.generator.cpu:0", "trainer.generator." + renamed); });
    EXPECT_THAT(error, HasSubstr("entry 'trainer.generator." + renamed +
                                 "' is not for a device of the run that saved it "
                                 "(trainer.settings: devices=cpu:0,cpu:1"))
        << renamed;
    EXPECT_THAT(error, HasSubstr(fix)) << renamed;
  }
  error = LoadAltered(
      [](Entries& e) { Rename(e, "trainer.generator.cpu:0", "trainer.generator.gpu"); });
  EXPECT_THAT(error, HasSubstr("entry 'trainer.generator.gpu' is not named after a device "
                               "(invalid device 'gpu'"));
  error = LoadAltered([](Entries& e) {
    e.push_back({"trainer.generator.cpu:2", true, from_vector(std::vector<int64_t>{3, 1}, {2})});
  });
  EXPECT_THAT(error, HasSubstr("entry 'trainer.generator.cpu:2' is not for a device of the run"));
  error = LoadAltered([](Entries& e) {
    Find(e, "trainer.generator.cpu:1").value = from_vector(std::vector<int64_t>{3, 1, 4}, {3});
  });
  EXPECT_THAT(error, HasSubstr("entry 'trainer.generator.cpu:1' holds 3 values; expected 2"));
  error = LoadAltered([](Entries& e) {
    e.push_back({"trainer.extra", true, from_vector(std::vector<int64_t>{1}, {1})});
  });
  EXPECT_THAT(error, HasSubstr("holds an entry 'trainer.extra' that this trainer does not write"));
  error = LoadAltered([](Entries& e) { Remove(e, "trainer.settings"); });
  EXPECT_THAT(error, HasSubstr("is not a checkpoint of this trainer (it lacks trainer.settings)"));
}

TEST_F(AlteredCheckpointTest, HistoryRowsWithANanLossOrAnImpossibleAccuracyAreRefused) {
  struct Case {
    int column;
    double value;
    const char* message;
  };
  for (const Case& c : std::vector<Case>{
           {1, std::nan(""),
            "row 1 (epoch 2) has train_loss nan, expected a finite number of "
            "at least 0"},
           {2, -0.5, "row 1 (epoch 2) has test_loss -0.5"},
           {3, -5, "row 1 (epoch 2) has test_accuracy -5, expected a finite number from 0 to 1"},
           {3, 1.5, "has test_accuracy 1.5"},
           {4, HUGE_VAL, "has seconds inf"},
           {5, -HUGE_VAL, "has samples_per_s -inf"},
       }) {
    const std::string error = LoadAltered([&](Entries& e) { SetHistory(e, 1, c.column, c.value); });
    EXPECT_THAT(error, HasSubstr("entry 'trainer.history' is malformed: row 1 (epoch 2) has "))
        << c.value;
    EXPECT_THAT(error, HasSubstr(c.message)) << c.value;
  }
}

TEST_F(AlteredCheckpointTest, EntriesOfTheWrongDtypeOrShapeAreRefusedByName) {
  std::string error = LoadAltered([](Entries& e) {
    Find(e, "trainer.progress").value = from_vector(std::vector<float>{2, 2}, {2});
  });
  EXPECT_THAT(error, HasSubstr("entry 'trainer.progress' is float32 but this trainer stores it "
                               "as int64"));
  EXPECT_THAT(error, Not(HasSubstr("to_vector")));
  error = LoadAltered([](Entries& e) {
    Find(e, "trainer.generator.cpu:1").value = from_vector(std::vector<float>{3, 1}, {2});
  });
  EXPECT_THAT(error, HasSubstr("entry 'trainer.generator.cpu:1' is float32"));
  error = LoadAltered([](Entries& e) {
    Find(e, "trainer.progress").value = from_vector(std::vector<int64_t>{2, 2}, {1, 2});
  });
  EXPECT_THAT(error, HasSubstr("entry 'trainer.progress' has shape [1, 2] but expected a vector"));
  error = LoadAltered([](Entries& e) {
    Find(e, "trainer.progress").value = from_vector(std::vector<int64_t>{0, 2}, {2});
  });
  EXPECT_THAT(error, HasSubstr("entry 'trainer.progress' holds 0, 2; expected 2 values: the "
                               "epochs done (at least 1)"));
  error = LoadAltered([](Entries& e) {
    Find(e, "trainer.history").value = zeros({2, 6});  // float32
  });
  EXPECT_THAT(error, HasSubstr("entry 'trainer.history' is float32"));
}

TEST_F(AlteredCheckpointTest, TextWithOutOfRangeCharacterCodesIsRefusedWholly) {
  for (const int64_t code : {int64_t{1} << 40, int64_t{0}, int64_t{256}, int64_t{-129}}) {
    const std::string error = LoadAltered([&](Entries& e) {
      std::vector<int64_t> codes(5, 'm');
      codes[2] = code;
      Find(e, "trainer.config").value = from_vector(codes, {5});
    });
    EXPECT_THAT(error,
                HasSubstr("entry 'trainer.config' holds character code " + std::to_string(code) +
                          " at position 2; expected text (byte codes 1 to 255)"))
        << code;
    EXPECT_THAT(error, HasSubstr("delete it or pass another --checkpoint path")) << code;
  }
  const std::string error = LoadAltered([](Entries& e) {
    Find(e, "trainer.settings").value = from_vector(std::vector<int64_t>{1 << 20}, {1});
  });
  EXPECT_THAT(error, HasSubstr("entry 'trainer.settings' holds character code 1048576"));
}

TEST_F(TrainerStateTest, TextOutsideAsciiRoundTrips) {
  manual_seed(3);
  nn::Sequential model(nn::Linear(3, 4), nn::ReLU(), nn::Linear(4, 2));
  nn::SGD sgd(model.parameters(), nn::SGDOptions(0.1).momentum(0.9));
  TrainerState state = SavedState();
  state.config = "model=m\xc3\xa9lange optimizer=sgd";  // UTF-8 bytes above 127
  const std::string path = TempPath("utf8.ckpt");
  SaveTrainerCheckpoint(path, model, sgd, state);
  // Files of earlier versions stored such bytes as negative codes (signed chars).
  std::vector<nn::CheckpointEntry> entries = nn::ReadCheckpoint(path);
  for (nn::CheckpointEntry& e : entries) {
    if (e.name != "trainer.settings") continue;
    std::vector<int64_t> codes = e.value.to_vector<int64_t>();
    codes.push_back(static_cast<int64_t>(static_cast<signed char>('\xc3')));
    codes.push_back(static_cast<int64_t>(static_cast<signed char>('\xa9')));
    e.value = from_vector(codes, {static_cast<int64_t>(codes.size())});
  }
  nn::WriteCheckpoint(entries, path);
  TrainerState loaded;
  loaded.config = state.config;
  ASSERT_TRUE(LoadTrainerCheckpoint(path, model, sgd, &loaded));
  EXPECT_EQ(loaded.settings, state.settings + "\xc3\xa9");
}

// A resume on other devices than the saved run's is still right but not exact: what is reset
// is said.
// A float16 run's GradScaler (--autocast=fp16) is saved as scaler.* entries and restored on
// resume: the scale, the growth tracker and the options, so the resumed run skips and grows
// the scale at the same steps as an uninterrupted one.
TEST_F(TrainerStateTest, AFloat16RunsScaleAndGrowthTrackerRoundTrip) {
  EXPECT_EQ(TrainerConfig("tiny", "sgd", kFloat32), "model=tiny optimizer=sgd");
  EXPECT_EQ(TrainerConfig("tiny", "sgd", kFloat16), "model=tiny optimizer=sgd autocast=float16");
  EXPECT_EQ(TrainerConfig("tiny", "sgd", kBFloat16), "model=tiny optimizer=sgd autocast=bfloat16");
  manual_seed(3);
  nn::Sequential model(nn::Linear(3, 4), nn::ReLU(), nn::Linear(4, 2));
  nn::SGD sgd(model.parameters(), nn::SGDOptions(0.1).momentum(0.9));
  nn::GradScaler scaler(nn::GradScalerOptions().init_scale(1024).growth_interval(7));
  scaler.update(256.0);  // as after backoffs: not the initial scale
  for (int step = 0; step < 3; ++step) {
    sgd.zero_grad();
    scaler
        .scale(cross_entropy(model.forward(randn({4, 3})),
                             from_vector(std::vector<int64_t>{0, 1, 1, 0}, {4})))
        .backward();
    ASSERT_TRUE(scaler.step(sgd));
    scaler.update();
  }
  ASSERT_EQ(scaler.get_scale(), 256.0);
  ASSERT_EQ(scaler.get_growth_tracker(), 3);
  TrainerState state = SavedState();
  state.config = TrainerConfig("tiny", "sgd", kFloat16);
  const std::string path = TempPath("fp16.ckpt");
  SaveTrainerCheckpoint(path, model, sgd, state, &scaler);
  int scaler_entries = 0;
  for (const nn::CheckpointEntry& e : nn::ReadCheckpoint(path)) {
    scaler_entries += e.name.rfind("scaler.", 0) == 0;
  }
  EXPECT_EQ(scaler_entries, static_cast<int>(scaler.state_dict().size()));

  manual_seed(4);
  nn::Sequential other(nn::Linear(3, 4), nn::ReLU(), nn::Linear(4, 2));
  nn::SGD other_sgd(other.parameters(), nn::SGDOptions(0.1).momentum(0.9));
  nn::GradScaler resumed;  // the defaults: 65536, interval 2000
  TrainerState loaded;
  loaded.config = state.config;
  ASSERT_TRUE(LoadTrainerCheckpoint(path, other, other_sgd, &loaded, &resumed));
  EXPECT_EQ(resumed.get_scale(), 256.0);
  EXPECT_EQ(resumed.get_growth_tracker(), 3);
  EXPECT_EQ(resumed.get_growth_interval(), 7);
  EXPECT_EQ(other.named_parameters()[0].value.to_vector<float>(),
            model.named_parameters()[0].value.to_vector<float>());
  // Four more clean steps reach the interval: both double at the same step.
  for (nn::GradScaler* s : {&scaler, &resumed}) {
    for (int step = 0; step < 4; ++step) {
      nn::SGD& opt = s == &scaler ? sgd : other_sgd;
      nn::Sequential& m = s == &scaler ? model : other;
      opt.zero_grad();
      s->scale(sum(m.forward(ones({2, 3})))).backward();
      s->step(opt);
      s->update();
      EXPECT_EQ(s->get_scale(), step < 3 ? 256.0 : 512.0) << "step " << step;
    }
  }
}

// An f32 run writes no scaler.* entries and resumes as f32; a run that changes whether it has
// a GradScaler (float16 or not) is refused with what to pass, and nothing is loaded.
TEST_F(TrainerStateTest, ACheckpointResumesOnlyWithTheSameGradScalerPresence) {
  manual_seed(3);
  nn::Sequential model(nn::Linear(3, 4), nn::ReLU(), nn::Linear(4, 2));
  nn::SGD sgd(model.parameters(), nn::SGDOptions(0.1).momentum(0.9));
  Train(model, sgd);
  nn::GradScaler disabled(nn::GradScalerOptions().enabled(false));
  TrainerState state = SavedState();
  const std::string f32_path = TempPath("f32.ckpt");
  SaveTrainerCheckpoint(f32_path, model, sgd, state, &disabled);
  for (const nn::CheckpointEntry& e : nn::ReadCheckpoint(f32_path)) {
    EXPECT_NE(e.name.rfind("scaler.", 0), 0u) << e.name;
  }
  TrainerState loaded;
  loaded.config = state.config;
  ASSERT_TRUE(LoadTrainerCheckpoint(f32_path, model, sgd, &loaded, &disabled));
  ASSERT_TRUE(LoadTrainerCheckpoint(f32_path, model, sgd, &loaded));  // no scaler at all

  // The f32 checkpoint into a float16 run (the API without the trainer's config check).
  manual_seed(5);
  nn::Sequential other(nn::Linear(3, 4), nn::ReLU(), nn::Linear(4, 2));
  nn::SGD other_sgd(other.parameters(), nn::SGDOptions(0.1).momentum(0.9));
  const std::vector<float> before = other.named_parameters()[0].value.to_vector<float>();
  nn::GradScaler enabled(nn::GradScalerOptions().init_scale(64));
  TrainerState into;
  into.config = state.config;
  const std::string no_scale =
      ErrorOf([&] { LoadTrainerCheckpoint(f32_path, other, other_sgd, &into, &enabled); });
  EXPECT_THAT(no_scale, HasSubstr("holds no GradScaler state (it was saved by a run without "
                                  "float16 autocast) but this run has one (--autocast=fp16)"));
  EXPECT_EQ(other.named_parameters()[0].value.to_vector<float>(), before);
  EXPECT_EQ(enabled.get_scale(), 64.0);
  EXPECT_EQ(into.epochs_done, 0);

  // A float16 checkpoint into a run without a scaler (disabled or none).
  nn::GradScaler scaler(nn::GradScalerOptions().init_scale(128));
  const std::string fp16_path = TempPath("fp16-refused.ckpt");
  SaveTrainerCheckpoint(fp16_path, model, sgd, state, &scaler);
  for (nn::GradScaler* none : {&disabled, static_cast<nn::GradScaler*>(nullptr)}) {
    const std::string dropped =
        ErrorOf([&] { LoadTrainerCheckpoint(fp16_path, other, other_sgd, &into, none); });
    EXPECT_THAT(dropped, HasSubstr("holds a GradScaler's state (scale 128.000000) of a float16 "
                                   "run but this run has no GradScaler; resume it with "
                                   "--autocast=fp16"));
    EXPECT_THAT(dropped, Not(HasSubstr("\n")));
  }
  EXPECT_EQ(other.named_parameters()[0].value.to_vector<float>(), before);

  // The trainer's own runs differ in config first, naming the precision.
  into.config = TrainerConfig("tiny", "sgd", kBFloat16);
  state.config = TrainerConfig("tiny", "sgd", kFloat16);
  SaveTrainerCheckpoint(fp16_path, model, sgd, state, &scaler);
  EXPECT_THAT(ErrorOf([&] { LoadTrainerCheckpoint(fp16_path, other, other_sgd, &into, &enabled); }),
              HasSubstr("was saved by a run with model=tiny optimizer=sgd autocast=float16 but "
                        "this run has model=tiny optimizer=sgd autocast=bfloat16"));

  // A model that does not fit: the scaler, loaded first, is put back.
  nn::Sequential wider(nn::Linear(3, 8), nn::ReLU(), nn::Linear(8, 2));
  nn::SGD wider_sgd(wider.parameters(), nn::SGDOptions(0.1).momentum(0.9));
  into.config = state.config;
  EXPECT_THAT(ErrorOf([&] { LoadTrainerCheckpoint(fp16_path, wider, wider_sgd, &into, &enabled); }),
              HasSubstr("does not fit this model and optimizer"));
  EXPECT_EQ(enabled.get_scale(), 64.0);

  // A damaged scale is refused by name.
  std::vector<nn::CheckpointEntry> entries = nn::ReadCheckpoint(fp16_path);
  for (nn::CheckpointEntry& e : entries) {
    if (e.name == "scaler.scale") e.value = full({}, -1.0, kFloat64);
  }
  nn::WriteCheckpoint(entries, fp16_path);
  EXPECT_THAT(ErrorOf([&] { LoadTrainerCheckpoint(fp16_path, other, other_sgd, &into, &enabled); }),
              HasSubstr("its scaler.* entries are not a GradScaler's state"));
  EXPECT_EQ(enabled.get_scale(), 64.0);
  EXPECT_EQ(other.named_parameters()[0].value.to_vector<float>(), before);
}

TEST_F(TrainerStateTest, RestoreGeneratorsSetsSavedStatesAndNamesWhatStartsAfresh) {
  TrainerState state = SavedState();
  SetCpuDeviceCount(3);
  EXPECT_EQ(RestoreGenerators(state, {Device::Cpu(0), Device::Cpu(1)}, 3), "");
  EXPECT_EQ(default_generator(Device::Cpu(0)).state(), (GeneratorState{3, 40}));
  EXPECT_EQ(default_generator(Device::Cpu(1)).state(), (GeneratorState{3, 80}));
  default_generator(Device::Cpu(2)).set_state(GeneratorState{9, 0});
  EXPECT_EQ(RestoreGenerators(state, {Device::Cpu(1), Device::Cpu(2)}, 9),
            "note: the checkpoint holds no random state for cpu:2 (it was saved by a run on "
            "other devices): its random generator starts afresh from --seed=9\n"
            "note: the checkpoint's random state for cpu:0 is not used (not a device of this "
            "run)\n");
  EXPECT_EQ(default_generator(Device::Cpu(1)).state(), (GeneratorState{3, 80}));
  EXPECT_EQ(default_generator(Device::Cpu(2)).state(), (GeneratorState{9, 0}));
  // A saved CUDA device on a machine without one is only named, never touched.
  state.generators = {{Device::Cuda(0), GeneratorState{3, 1}}};
  EXPECT_THAT(RestoreGenerators(state, {Device::Cpu(0)}, 3),
              HasSubstr("random state for cuda:0 is not used"));
}

// Issue 21, item 9: a run at chance level is named as such.
TEST(ChanceLevelTest, AccuracyWithinThreeStandardDeviationsOfGuessingIsChanceLevel) {
  EXPECT_EQ(ChanceLevel(10, 0.1), 0.1);
  EXPECT_EQ(ChanceLevel(10, 0.0), 0.1);      // unknown: guessing
  EXPECT_EQ(ChanceLevel(10, 0.131), 0.131);  // a test subset where one class is more common
  EXPECT_TRUE(AtChanceLevel(0.0999, 0.1, 10000));
  EXPECT_TRUE(AtChanceLevel(0.0, 0.1, 10000));
  EXPECT_TRUE(AtChanceLevel(0.109, 0.1, 10000));  // 0.1 + 3 * 0.003
  EXPECT_FALSE(AtChanceLevel(0.11, 0.1, 10000));
  EXPECT_TRUE(AtChanceLevel(0.18, 0.1, 100));  // 0.1 + 3 * 0.03
  EXPECT_FALSE(AtChanceLevel(0.20, 0.1, 100));
  EXPECT_TRUE(AtChanceLevel(0.152, 0.131, 1000));
  EXPECT_FALSE(AtChanceLevel(0.0, 0.1, 0));  // no test set: nothing to say
  EXPECT_EQ(ChanceLevelWarning(0.85, 10, 0.1, 10000, "adam", 0.001), "");
  EXPECT_EQ(ChanceLevelWarning(0.0999, 10, 0.1, 10000, "adam", 100),
            "warning: the final test accuracy (9.99%) is at chance level for 10 classes (10.00% "
            "by guessing): the model did not learn. Look at --lr (now 100; 0.05 suits sgd, 0.001 "
            "adam) and --optimizer (now adam)\n");
  EXPECT_THAT(ChanceLevelWarning(0.152, 10, 0.131, 1000, "sgd", 5),
              HasSubstr("(15.20%) is at chance level for 10 classes (10.00% by guessing, 13.10% "
                        "by always answering the most common class of these 1000 test images)"));
}

// Issue 21, item 7: --log_csv and --plot on a file system that refuses the write (files may
// not grow past 200 bytes: RLIMIT_FSIZE, SIGXFSZ ignored, so write() fails with EFBIG as it
// fails with ENOSPC on a full disk) say why, leave no temporary file and keep the previous
// files whole. (tensor/atomic_file_test has the full disk itself.)
TEST(EpochLogsTest, AFailedWriteSaysWhyAndKeepsThePreviousFiles) {
  const std::string dir = TempPath("epoch_logs");
  std::system(("rm -rf '" + dir + "' && mkdir -p '" + dir + "'").c_str());
  const std::string csv = dir + "/log.csv", svg = dir + "/plot.svg";
  const std::vector<EpochStats> one = {{1, 0.5, 0.45, 0.85, 1.0, 10.0}};
  WriteEpochLogs(one, csv, svg, "run");
  const std::string old_csv = ReadText(csv), old_svg = ReadText(svg);
  ASSERT_THAT(old_csv, HasSubstr("\n1,"));
  ASSERT_THAT(old_svg, HasSubstr("<svg"));
  std::vector<EpochStats> many;
  for (int i = 1; i <= 20; ++i) many.push_back({i, 0.5, 0.45, 0.85, 1.0, 10.0});

  std::string csv_error, svg_error;
  {
    tandem::testing::FileSizeLimit limit(200);
    csv_error = ErrorOf([&] { WriteEpochLogs(many, csv, "", "run"); });
    svg_error = ErrorOf([&] { WriteEpochLogs(many, "", svg, "run"); });
  }

  EXPECT_THAT(csv_error,
              HasSubstr("cannot write --log_csv file '" + csv + "': writing '" + csv + ".tmp."));
  EXPECT_THAT(svg_error,
              HasSubstr("cannot write --plot file '" + svg + "': writing '" + svg + ".tmp."));
  for (const std::string& error : {csv_error, svg_error}) {
    EXPECT_THAT(error, HasSubstr("' failed: File too large; the previous file, if any, is "
                                 "unchanged (the temporary file was removed)"));
  }
  EXPECT_EQ(ReadText(csv), old_csv);
  EXPECT_EQ(ReadText(svg), old_svg);
  EXPECT_EQ(Listing(dir), "log.csv plot.svg ");
}

// The same for --trace: the trace used to be written in place, truncating the previous one.
TEST(StepTraceTest, AFailedTraceWriteSaysWhyAndKeepsThePreviousTrace) {
  const std::string dir = TempPath("step_trace");
  std::system(("rm -rf '" + dir + "' && mkdir -p '" + dir + "'").c_str());
  const std::string path = dir + "/trace.json";
  {
    std::FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("{\"previous\":1}", f);
    std::fclose(f);
  }
  std::string error;
  {
    StepTrace trace(path, 3);
    for (int i = 0; i < 200; ++i) {
      TANDEM_PROFILE_SCOPE("step", "a region with a long enough name " + std::to_string(i));
    }
    trace.StepDone();
    trace.StepDone();
    tandem::testing::FileSizeLimit limit(200);
    error = ErrorOf([&] { trace.StepDone(); });  // the third step writes the trace
  }
  EXPECT_THAT(error,
              HasSubstr("cannot write Chrome trace '" + path + "': writing '" + path + ".tmp."));
  EXPECT_THAT(error, HasSubstr("failed: File too large; the previous file, if any, is unchanged"));
  EXPECT_EQ(ReadText(path), "{\"previous\":1}");
  EXPECT_EQ(Listing(dir), "trace.json ");
}

}  // namespace
}  // namespace tandem::examples
