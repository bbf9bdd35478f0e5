// The trainer binary (//examples:train) with --model=gpt end to end on a few hundred windows
// of the fortunes corpus and a tiny GPT: the validation loss falls, the run ends with a sample
// of the prompt and the JSON line; a run killed in epoch 2 and restarted from its checkpoint
// ends with exactly the parameters and AdamW state of a run never interrupted; the same
// flags print the same sample; bf16 autocast and --trace work, the loss inside the replicas
// equals the one on the gathered logits; --checkpoint_activations trains the same model; bad GPT
// flags are one-line errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "nn/checkpoint.h"
#include "tensor/tensor.h"
#include "tests/run_program.h"

namespace tandem {
namespace {

using ::tandem::testing::LastLine;
using ::tandem::testing::ProgramResult;
using ::tandem::testing::ReadFile;
using ::tandem::testing::TestTempDir;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::Not;
using ::testing::StartsWith;

constexpr char kFortunes[] = "/usr/share/games/fortunes";
// A tiny GPT (about 15K parameters) on 192 windows of 32 bytes: seconds an epoch.
constexpr char kCommon[] =
    " --model=gpt --devices=cpu:0,cpu:1 --threads=1 --batch_size=16 --train_limit=192"
    " --test_limit=64 --context=32 --n_layer=1 --n_head=2 --n_embd=32 --lr=0.003 --workers=1"
    " --seed=5 --max_new_tokens=40";

// Runs the trainer with `flags`; its output goes to files named after `name`. A run with
// --kill_in_epoch (a test hook, not a flag of the shipped trainer) runs
// //examples:train_with_test_hooks, the same trainer built with its hooks.
ProgramResult Train(const std::string& name, const std::string& flags) {
  const bool hooked = flags.find("--kill_in_epoch") != std::string::npos;
  return ::tandem::testing::RunProgram(hooked ? "examples/train_with_test_hooks" : "examples/train",
                                       flags, name);
}

bool Exists(const std::string& path) {
  struct stat info;
  return stat(path.c_str(), &info) == 0;
}

// Every tensor in a checkpoint, by name, as float64 values (exact for float32 and for the
// small integers of step counts and generator states).
std::map<std::string, std::vector<double>> Contents(const std::string& path) {
  std::map<std::string, std::vector<double>> contents;
  for (const nn::CheckpointEntry& e : nn::ReadCheckpoint(path)) {
    const Tensor v = e.value.contiguous();
    contents[e.name] = v.reshape({v.numel()}).to(kFloat64).to_vector<double>();
  }
  return contents;
}

// The validation losses of the CSV log, one per epoch (column 3).
std::vector<double> ValidationLosses(const std::string& csv) {
  std::vector<double> losses;
  std::istringstream in(csv);
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    std::istringstream row(line);
    std::string field;
    for (int i = 0; i < 3; ++i) std::getline(row, field, ',');
    losses.push_back(std::stod(field));
  }
  return losses;
}

class TrainGptTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!Exists(kFortunes)) {
      GTEST_SKIP() << "the fortunes corpus is not installed in " << kFortunes
                   << " (Debian package fortunes; bash tools/setup.sh installs it)";
    }
  }
};

TEST_F(TrainGptTest, ValidationLossFallsAndTheRunEndsWithASampleAndTheJsonLine) {
  const std::string csv = TestTempDir() + "/gpt.csv", svg = TestTempDir() + "/gpt.svg";
  const ProgramResult r = Train("gpt", std::string(kCommon) + " --epochs=2 --log_csv=" + csv +
                                           " --plot=" + svg + " --prompt='A fool'");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("fortunes: 192 training and 64 validation windows of 32 bytes"));
  EXPECT_THAT(r.out, HasSubstr("adamw lr 0.003"));
  EXPECT_THAT(r.out, HasSubstr("GPT: 1 layers, 2 heads, 32 channels, context 32"));
  EXPECT_THAT(r.out, ContainsRegex("epoch 1/2  train loss [0-9.]+  val loss [0-9.]+  val ppl "
                                   "[0-9.]+  next-byte acc [0-9.]+%"));
  EXPECT_THAT(r.out, HasSubstr("split 12 x 8+8"));  // 192 windows in batches of 16
  EXPECT_THAT(r.out, HasSubstr("Sample (--prompt, 40 new bytes, temperature 0.8, top-k 40"));
  EXPECT_THAT(r.out, HasSubstr("\nA fool"));
  const std::vector<double> losses = ValidationLosses(ReadFile(csv));
  ASSERT_EQ(losses.size(), 2u);
  EXPECT_LT(losses[1], losses[0]);
  EXPECT_LT(losses[0], std::log(256.0));  // better than a uniform guess after one epoch
  EXPECT_THAT(ReadFile(svg), HasSubstr("fortunes: gpt on cpu:0 + cpu:1, batch 16"));
  EXPECT_THAT(LastLine(r.out),
              MatchesRegex("\\{\"model\":\"gpt\",\"devices\":\\[\"cpu:0\",\"cpu:1\"\\],"
                           "\"epochs\":2,\"batch_size\":16,\"test_accuracy\":0\\.[0-9]{4},"
                           "\"val_loss\":[0-9]+\\.[0-9]{4},\"val_perplexity\":[0-9]+\\.[0-9]{3},"
                           "\"train_seconds\":[0-9]+\\.[0-9],\"samples_per_s\":[0-9]+\\.[0-9],"
                           "\"sample\":\"A fool[^\n]*\"\\}"));
}

TEST_F(TrainGptTest, RunKilledInEpochTwoResumesToExactlyTheSameModelAndSample) {
  const std::string straight = TestTempDir() + "/gpt_straight.ckpt";
  const std::string resumed = TestTempDir() + "/gpt_resumed.ckpt";
  std::remove(straight.c_str());
  std::remove(resumed.c_str());
  const std::string flags = std::string(kCommon) + " --epochs=3";

  const ProgramResult full = Train("gpt_straight", flags + " --checkpoint=" + straight);
  ASSERT_EQ(full.exit_code, 0) << full.err;
  const ProgramResult killed =
      Train("gpt_killed", flags + " --checkpoint=" + resumed + " --kill_in_epoch=2");
  ASSERT_EQ(killed.exit_code, 128 + SIGKILL) << killed.out << killed.err;
  EXPECT_THAT(killed.out, HasSubstr("epoch 1/3  train loss"));
  EXPECT_THAT(killed.out, Not(HasSubstr("epoch 2/3  train loss")));
  ASSERT_NE(Contents(resumed), Contents(straight));

  const ProgramResult restarted = Train("gpt_restarted", flags + " --checkpoint=" + resumed);
  ASSERT_EQ(restarted.exit_code, 0) << restarted.err;
  EXPECT_THAT(restarted.out, HasSubstr("Resuming from " + resumed + ": 1 of 3 epochs done"));
  EXPECT_THAT(restarted.out, Not(HasSubstr("will not repeat")));
  EXPECT_THAT(restarted.out, Not(HasSubstr("note:")));

  std::map<std::string, std::vector<double>> a = Contents(straight), b = Contents(resumed);
  ASSERT_EQ(a.size(), b.size());
  int model = 0, optimizer = 0;
  for (const auto& [name, values] : a) {
    if (name == "trainer.history") continue;  // differs in its timings only
    ASSERT_TRUE(b.count(name)) << name;
    EXPECT_TRUE(values == b[name]) << name << " differs";
    model += name.rfind("model.", 0) == 0;
    optimizer += name.rfind("optimizer.", 0) == 0;
  }
  EXPECT_GT(model, 10);
  EXPECT_GT(optimizer, 2 * model - 1);  // AdamW's two moments per parameter, and more
  // The same validation figures and the same sample in the final JSON line.
  std::string json_a = LastLine(full.out), json_b = LastLine(restarted.out);
  const auto strip = [](std::string s) {
    const size_t from = s.find("\"train_seconds\""), to = s.find("\"sample\"");
    return s.erase(from, to - from);
  };
  EXPECT_EQ(strip(json_a), strip(json_b));
  EXPECT_THAT(json_a, HasSubstr("\"sample\":\"The meaning of life is"));
}

// The first epoch's training loss, from its epoch line.
double FirstTrainLoss(const std::string& out) {
  const std::string key = "epoch 1/1  train loss ";
  const size_t at = out.find(key);
  return at == std::string::npos ? -1 : std::stod(out.substr(at + key.size()));
}

TEST_F(TrainGptTest, AutocastTraceAndTheGatheredLossWork) {
  const std::string trace = TestTempDir() + "/gpt_trace.json";
  const ProgramResult bf16 =
      Train("gpt_bf16", std::string(kCommon) + " --epochs=1 --autocast=bf16 --trace=" + trace);
  ASSERT_EQ(bf16.exit_code, 0) << bf16.out << bf16.err;
  EXPECT_THAT(bf16.out, HasSubstr("Autocast to bfloat16 (--autocast)"));
  EXPECT_THAT(bf16.out, HasSubstr("trace of 12 steps: " + trace));
  EXPECT_THAT(ReadFile(trace), HasSubstr("\"name\":\"epoch 1 step 12\""));
  EXPECT_THAT(LastLine(bf16.out), StartsWith("{\"model\":\"gpt\""));

  // The loss inside the replicas (TokenCrossEntropy's means weighted by rows) and on the
  // gathered logits are the same loss: the same run to rounding.
  const ProgramResult inside = Train("gpt_inside", std::string(kCommon) + " --epochs=1");
  const ProgramResult gathered =
      Train("gpt_gathered", std::string(kCommon) + " --epochs=1 --noforward_loss");
  ASSERT_EQ(inside.exit_code, 0) << inside.err;
  ASSERT_EQ(gathered.exit_code, 0) << gathered.err;
  EXPECT_THAT(gathered.out, HasSubstr("loss on the gathered output"));
  EXPECT_GT(FirstTrainLoss(inside.out), 0);
  EXPECT_NEAR(FirstTrainLoss(inside.out), FirstTrainLoss(gathered.out), 2e-3);
}

// --checkpoint_activations recomputes each block in backward with the dropout masks of its
// forward: the same training, to the bit (the same losses and the same sample).
TEST_F(TrainGptTest, CheckpointedActivationsTrainTheSameModel) {
  const std::string flags = std::string(kCommon) + " --epochs=1 --dropout=0.1";
  const ProgramResult plain = Train("gpt_plain", flags);
  const ProgramResult checkpointed = Train("gpt_checkpointed", flags + " --checkpoint_activations");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  ASSERT_EQ(checkpointed.exit_code, 0) << checkpointed.err;
  const auto from_first_epoch = [](const std::string& out) {
    const std::string text = out.substr(out.find("epoch 1/1  train loss"));
    return text.substr(0, text.find("Peak memory"));  // losses, accuracy, the sample
  };
  EXPECT_EQ(FirstTrainLoss(plain.out), FirstTrainLoss(checkpointed.out));
  const std::string a = from_first_epoch(plain.out), b = from_first_epoch(checkpointed.out);
  const auto losses = [](const std::string& text) {  // up to the speed, which varies
    return text.substr(0, text.find('%') + 1);
  };
  EXPECT_EQ(losses(a), losses(b));
  EXPECT_EQ(a.substr(a.find("Sample (")), b.substr(b.find("Sample (")));
}

TEST_F(TrainGptTest, BadGptFlagsAreOneLineErrors) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--n_head=3", "--n_embd (32) must be a multiple of --n_head (3)"},
      {"--temperature=0", "--temperature must be a finite number above 0 but is 0"},
      {"--top_k=0", "--top_k must be at least 1 but is 0"},
      {"--prompt=", "--prompt must not be empty"},
      {"--dropout=1", "--dropout must be in [0, 1) but is 1"},
      {"--optimizer=rmsprop", "--optimizer must be 'sgd', 'adam' or 'adamw' but is 'rmsprop'"},
      {"--data_dir=/nonexistent", "TextCorpus::Fortunes: expected the fortune files"},
  };
  for (const auto& [flag, message] : cases) {
    const ProgramResult r = Train("bad", std::string(kCommon) + " --epochs=1 " + flag);
    EXPECT_EQ(r.exit_code, 1) << flag;
    EXPECT_THAT(r.err, StartsWith("train: ")) << flag;
    EXPECT_THAT(r.err, HasSubstr(message)) << flag;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << flag << ": " << r.err;
  }
}

}  // namespace
}  // namespace tandem
