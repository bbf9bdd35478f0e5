// The trainer's --detect_anomaly (issue 14): a learning rate that makes training diverge
// stops at the first NaN or inf with one line naming the op and the pass, instead of at the
// NaN loss a step or more later; a healthy run with the flag trains as without it; --help
// lists the flag.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "tests/run_program.h"

namespace tandem {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

constexpr char kCommon[] =
    " --devices=cpu:0,cpu:1 --threads=1 --epochs=1 --batch_size=64 --train_limit=640"
    " --test_limit=300 --workers=1 --seed=7";

using ::tandem::testing::ProgramResult;

ProgramResult Train(const std::string& name, const std::string& flags) {
  return ::tandem::testing::RunProgram("examples/train", flags, name);
}

TEST(TrainAnomalyTest, ADivergingRunStopsAtTheFirstNonFiniteValueNamingTheOp) {
  const ProgramResult r =
      Train("anomaly", std::string(kCommon) + " --lr=1e6 --lr_decay=none --detect_anomaly");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_THAT(r.out, HasSubstr("Anomaly detection on (--detect_anomaly)"));
  EXPECT_THAT(r.err, StartsWith("train: stopped at epoch 1, step "));
  EXPECT_THAT(r.err, ContainsRegex("step [0-9]+ of 10 \\(--detect_anomaly\\): "));
  EXPECT_THAT(r.err, ContainsRegex("anomaly detected in the (forward|backward) pass: "));
  EXPECT_THAT(r.err, ContainsRegex("[A-Za-z0-9]+Backward on cpu:[01]"));
  EXPECT_THAT(r.err, ContainsRegex("[0-9]+ NaN and [0-9]+ inf among its [0-9]+ values"));
  EXPECT_THAT(r.err, Not(HasSubstr("the training loss became"))) << "caught only at the loss";
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

TEST(TrainAnomalyTest, AHealthyRunTrainsAsWithoutTheFlag) {
  const ProgramResult plain = Train("plain", kCommon);
  const ProgramResult checked = Train("checked", std::string(kCommon) + " --detect_anomaly");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  ASSERT_EQ(checked.exit_code, 0) << checked.err;
  // The same test accuracy and losses: the checks read tensors and change nothing.
  const std::string a = ::tandem::testing::LastLine(plain.out),
                    b = ::tandem::testing::LastLine(checked.out);
  auto field = [](const std::string& json, const std::string& key) {
    const size_t at = json.find("\"" + key + "\":");
    return at == std::string::npos ? std::string() : json.substr(at, json.find(',', at) - at);
  };
  ASSERT_FALSE(field(a, "test_accuracy").empty()) << a;
  EXPECT_EQ(field(a, "test_accuracy"), field(b, "test_accuracy"));
}

TEST(TrainAnomalyTest, HelpListsTheFlag) {
  const ProgramResult r = Train("help", "--help");
  EXPECT_THAT(r.out + r.err, HasSubstr("-detect_anomaly"));
  EXPECT_THAT(r.out + r.err, HasSubstr("torch.autograd.detect_anomaly"));
}

}  // namespace
}  // namespace tandem
