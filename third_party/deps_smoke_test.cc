// Links and exercises every system library from WORKSPACE: gtest/gmock,
// Abseil, OpenBLAS (CBLAS), zlib and Google Benchmark.
#include "third_party/deps_smoke.h"

#include <benchmark/benchmark.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_join.h"

namespace tandem::deps_smoke {
namespace {

using ::testing::ElementsAre;

TEST(DepsSmokeTest, Abseil) {
  EXPECT_EQ(FormatPair("x", 42), "x=42");
  absl::flat_hash_map<std::string, int> m = {{"a", 1}, {"b", 2}};
  EXPECT_EQ(m.at("b"), 2);
  EXPECT_EQ(absl::StrJoin({"p", "q"}, ","), "p,q");
}

TEST(DepsSmokeTest, OpenBlasSgemm2x2) {
  const float a[4] = {1, 2, 3, 4};
  const float b[4] = {5, 6, 7, 8};
  float c[4] = {0, 0, 0, 0};
  Sgemm2x2(a, b, c);
  EXPECT_THAT(c, ElementsAre(19.0f, 22.0f, 43.0f, 50.0f));
}

TEST(DepsSmokeTest, ZlibCrc32) {
  EXPECT_EQ(Crc32("123456789"), 0xCBF43926u);  // The standard CRC-32 check value.
}

void BM_Nothing(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(state.iterations());
}
BENCHMARK(BM_Nothing);

TEST(DepsSmokeTest, BenchmarkLinks) {
  char arg0[] = "deps_smoke_test";
  char arg1[] = "--benchmark_min_time=0.001";
  char* argv[] = {arg0, arg1, nullptr};
  int argc = 2;
  benchmark::Initialize(&argc, argv);
  EXPECT_EQ(benchmark::RunSpecifiedBenchmarks("BM_Nothing"), 1u);
}

}  // namespace
}  // namespace tandem::deps_smoke
