// Runs //examples:tutorial (a data dependency) and checks its output against PyTorch's
// DataParallel tutorial: the greeting, one "In Model" line per replica with exactly
// PyTorch's chunk sizes (in any order within a batch: replicas run concurrently), and one
// "Outside" line per batch. Also its flags and their errors.
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::StartsWith;
using ::testing::UnorderedElementsAreArray;

struct RunResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Runs the tutorial binary (from the test's runfiles) with `args`.
RunResult RunTutorial(const std::string& args) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string err_path = std::string(tmp != nullptr ? tmp : "/tmp") + "/tutorial_stderr";
  const std::string command = "examples/tutorial " + args + " 2>" + err_path;
  RunResult result;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) {
    ADD_FAILURE() << "cannot run " << command;
    return result;
  }
  std::array<char, 4096> buffer;
  size_t n;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0)
    result.out.append(buffer.data(), n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  result.err = ReadFile(err_path);
  return result;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// One batch of the tutorial's output: the rows each replica got, and the gathered sizes.
struct BatchOutput {
  std::vector<int> replica_rows;
  int outside_rows = -1;
};

// Parses the output, checking the exact form of every line; `greeting` is the first line
// expected ("" for none).
std::vector<BatchOutput> ParseBatches(const std::string& out, const std::string& greeting) {
  const std::regex in_model(R"(\tIn Model: input size \[(\d+), 5\] output size \[(\d+), 2\])");
  const std::regex outside(R"(Outside: input size \[(\d+), 5\] output_size \[(\d+), 2\])");
  std::vector<std::string> lines = Lines(out);
  size_t first = 0;
  if (!greeting.empty()) {
    EXPECT_FALSE(lines.empty());
    if (lines.empty()) return {};
    EXPECT_EQ(lines[0], greeting);
    first = 1;
  }
  std::vector<BatchOutput> batches;
  BatchOutput current;
  for (size_t i = first; i < lines.size(); ++i) {
    std::smatch m;
    if (std::regex_match(lines[i], m, in_model)) {
      EXPECT_EQ(m[1], m[2]) << "line " << i << ": " << lines[i];
      current.replica_rows.push_back(std::stoi(m[1]));
    } else if (std::regex_match(lines[i], m, outside)) {
      EXPECT_EQ(m[1], m[2]) << "line " << i << ": " << lines[i];
      current.outside_rows = std::stoi(m[1]);
      batches.push_back(current);
      current = BatchOutput();
    } else {
      ADD_FAILURE() << "unexpected line " << i << ": '" << lines[i] << "'";
    }
  }
  EXPECT_TRUE(current.replica_rows.empty()) << "'In Model' lines after the last batch";
  return batches;
}

// Checks the batches against the expected per-replica rows of each batch (any order).
void ExpectBatches(const std::vector<BatchOutput>& batches,
                   const std::vector<std::vector<int>>& expected) {
  ASSERT_EQ(batches.size(), expected.size());
  for (size_t b = 0; b < batches.size(); ++b) {
    SCOPED_TRACE(::testing::Message() << "batch " << b);
    EXPECT_THAT(batches[b].replica_rows, UnorderedElementsAreArray(expected[b]));
    int total = 0;
    for (int rows : expected[b]) total += rows;
    EXPECT_EQ(batches[b].outside_rows, total);
  }
}

std::string CpuList(int n) {
  std::string list;
  for (int i = 0; i < n; ++i) list += (i > 0 ? ",cpu:" : "cpu:") + std::to_string(i);
  return list;
}

TEST(TutorialTest, TwoDevicesSplitEachBatchInHalves) {
  const RunResult run = RunTutorial("--devices=" + CpuList(2));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.err, IsEmpty());
  ExpectBatches(ParseBatches(run.out, "Let's use 2 devices!"),
                {{15, 15}, {15, 15}, {15, 15}, {5, 5}});
}

TEST(TutorialTest, ThreeDevicesAsInPyTorch) {
  const RunResult run = RunTutorial("--devices=" + CpuList(3));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  ExpectBatches(ParseBatches(run.out, "Let's use 3 devices!"),
                {{10, 10, 10}, {10, 10, 10}, {10, 10, 10}, {4, 4, 2}});
}

TEST(TutorialTest, EightDevicesGiveSevenChunksOfFourAndOneOfTwoThenFiveOfTwo) {
  const RunResult run = RunTutorial("--devices=" + CpuList(8));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const std::vector<int> full = {4, 4, 4, 4, 4, 4, 4, 2};
  ExpectBatches(ParseBatches(run.out, "Let's use 8 devices!"), {full, full, full, {2, 2, 2, 2, 2}});
}

TEST(TutorialTest, OneDeviceRunsTheModelOnTheWholeBatchWithoutAGreeting) {
  const RunResult run = RunTutorial("--devices=cpu:0");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  ExpectBatches(ParseBatches(run.out, ""), {{30}, {30}, {30}, {10}});
}

TEST(TutorialTest, BatchAndDataSizeFlags) {
  const RunResult run = RunTutorial("--devices=cpu:0,cpu:1,cpu:2 --batch_size=7 --data_size=10");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  ExpectBatches(ParseBatches(run.out, "Let's use 3 devices!"), {{3, 3, 1}, {1, 1, 1}});
}

TEST(TutorialTest, BadFlagsGiveAOneLineErrorAndExitCodeOne) {
  struct Case {
    std::string args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"--devices=gpu:0", "invalid device 'gpu:0'"},
      {"--devices=cpu:0,cpu:0", "device_ids must be distinct"},
      {"--batch_size=0", "--batch_size must be at least 1 but is 0"},
      {"--data_size=-3", "--data_size must be at least 1 but is -3"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.args);
    const RunResult run = RunTutorial(c.args);
    EXPECT_EQ(run.exit_code, 1);
    EXPECT_THAT(run.err, StartsWith("tutorial: "));
    EXPECT_THAT(run.err, HasSubstr(c.message));
    EXPECT_EQ(Lines(run.err).size(), 1u) << run.err;
    EXPECT_THAT(run.out, IsEmpty()) << "nothing is printed before the flags are checked";
  }
}

}  // namespace
