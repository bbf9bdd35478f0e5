// RunProgram: runs one of the repository's programs from a test's runfiles, as a user runs it
// from a shell, and returns its exit status and what it printed. For the tests of the
// trainer and the benchmarks; each names its output files, so one test can keep several runs'.
//
//   const ProgramResult r = RunProgram("tools/bench/train_step", "--steps=3", "train_step");
//   ASSERT_EQ(r.exit_code, 0) << r.err;
//   EXPECT_THAT(LastLine(r.out), HasSubstr("\"benchmark\""));
#ifndef TANDEM_TESTS_RUN_PROGRAM_H_
#define TANDEM_TESTS_RUN_PROGRAM_H_

#include <string>

namespace tandem::testing {

struct ProgramResult {
  int exit_code = -1;  // 128 + the signal's number when a signal ended it
  std::string out, err;
};

// Runs `program` (a path in the runfiles, e.g. "examples/train") with `flags` (shell words).
// Its standard output and error go to <TestTempDir()>/<name>.out and .err, then into the
// result.
ProgramResult RunProgram(const std::string& program, const std::string& flags,
                         const std::string& name);

// The test's temporary folder ($TEST_TMPDIR), or /tmp outside Bazel.
std::string TestTempDir();

// A whole file, bytes as they are ("" if it cannot be read).
std::string ReadFile(const std::string& path);

// The last line of `text`, without trailing newlines.
std::string LastLine(const std::string& text);

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_RUN_PROGRAM_H_
