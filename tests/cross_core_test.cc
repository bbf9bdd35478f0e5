// The cross-core benchmark (//tools/bench:cross_core) measures and ends with its JSON line;
// bad flags are one-line errors. (Its figures are measurements, never checked here.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sched.h>

#include <string>

#include "tests/run_program.h"

namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;

using ::tandem::testing::LastLine;
using ::tandem::testing::ProgramResult;

ProgramResult Bench(const std::string& flags) {
  return ::tandem::testing::RunProgram("tools/bench/cross_core", flags, "cross_core");
}

// The first two CPUs this process may run on, as "a,b", or "" if it has only one.
std::string TwoAllowedCpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return "";
  std::string cpus;
  int found = 0;
  for (int cpu = 0; cpu < CPU_SETSIZE && found < 2; ++cpu) {
    if (!CPU_ISSET(cpu, &set)) continue;
    cpus += (found++ == 0 ? "" : ",") + std::to_string(cpu);
  }
  return found == 2 ? cpus : "";
}

TEST(CrossCoreTest, MeasuresAndEndsWithItsJsonLine) {
  const std::string cpus = TwoAllowedCpus();
  if (cpus.empty()) GTEST_SKIP() << "needs two CPUs";
  const ProgramResult r = Bench("--cpus=" + cpus + " --bytes=65536 --rounds=3");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("has just written"));
  EXPECT_THAT(LastLine(r.out),
              MatchesRegex("\\{\"benchmark\":\"cross_core\",\"cpus\":\\[[0-9]+,[0-9]+\\],"
                           "\"bytes\":65536,\"own_us\":[0-9.]+,\"other_core_us\":[0-9.]+,"
                           "\"evicted_us\":[0-9.]+\\}"));
}

TEST(CrossCoreTest, BadFlagsAreOneLineErrors) {
  for (const char* flags : {"--cpus=0,0", "--cpus=0", "--cpus=a,b", "--bytes=10", "--rounds=0"}) {
    const ProgramResult r = Bench(flags);
    EXPECT_EQ(r.exit_code, 1) << flags;
    EXPECT_THAT(r.err, MatchesRegex("cross_core: [^\n]+\n")) << flags;
  }
}

}  // namespace
