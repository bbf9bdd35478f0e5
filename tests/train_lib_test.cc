// The trainer's pieces (//examples:train_lib): the progress bar, the SVG chart and the
// checkpoint of a whole run.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "examples/progress.h"
#include "examples/svg_plot.h"
#include "examples/trainer_state.h"
#include "nn/checkpoint.h"
#include "nn/nn.h"
#include "tensor/tensor.h"

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
  TrainerState state;
  state.config = "model=tiny optimizer=sgd";
  state.epochs_done = 2;
  state.history = {{1, 0.5, 0.45, 0.85, 1.0, 10.0}, {2, 0.4, 0.41, 0.86, 1.0, 10.0}};
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
                HasSubstr("has a malformed trainer.history (row 1 is for epoch "))
        << epoch;
    EXPECT_EQ(other.named_parameters()[0].value.to_vector<float>(), before);
    EXPECT_EQ(loaded.epochs_done, 0);
  }
}

}  // namespace
}  // namespace tandem::examples
