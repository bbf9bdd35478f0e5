// The train_step benchmark (//tools/bench:train_step) runs a few steps and ends with its
// JSON line, with the scaling comparison when given several CPU devices; bad flags are
// one-line errors. (Its figures are measurements, never checked here.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "tests/run_program.h"

namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::Not;

using ::tandem::testing::LastLine;
using ::tandem::testing::ProgramResult;

ProgramResult Bench(const std::string& flags) {
  return ::tandem::testing::RunProgram("tools/bench/train_step", flags, "train_step");
}

TEST(TrainStepTest, OneDeviceEndsWithItsJsonLine) {
  const ProgramResult r = Bench(
      "--model=mlp --batch_size=32 --devices=cpu:0 --threads=1 --steps=3 "
      "--warmup=1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("peak / least"));
  EXPECT_THAT(LastLine(r.out),
              MatchesRegex("\\{\"benchmark\":\"train_step\",\"model\":\"mlp\",\"batch_size\":32,"
                           "\"devices\":\\[\"cpu:0\"\\],\"threads\":1,\"steps\":3,"
                           "\"step_ms_median\":[0-9.]+,\"step_ms_p90\":[0-9.]+,"
                           "\"samples_per_s\":[0-9.]+,\"peak_bytes\":[0-9]+,"
                           "\"min_bytes\":[0-9]+\\}"));
}

TEST(TrainStepTest, TwoDevicesCompareWithOneAndWithAParallelLoop) {
  const ProgramResult r = Bench(
      "--model=mlp --batch_size=33 --devices=cpu:0,cpu:1 --threads=1 "
      "--steps=2 --warmup=1 --noforward_loss");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("17+16"));
  EXPECT_THAT(r.out, HasSubstr("perfectly parallel loop"));
  EXPECT_THAT(LastLine(r.out), MatchesRegex(".*\"devices\":\\[\"cpu:0\",\"cpu:1\"\\].*"
                                            "\"speedup\":[0-9.]+,\"loop_speedup\":[0-9.]+,"
                                            "\"speedup_ratio\":[0-9.]+\\}"));
}

TEST(TrainStepTest, TraceShowsTheReplicasAndBackwardOnEachDevicesThread) {
  const std::string path = ::tandem::testing::TestTempDir() + "/train_step_trace.json";
  const ProgramResult r = Bench(
      "--model=mlp --batch_size=32 --devices=cpu:0,cpu:1 --threads=1 --steps=2 --warmup=1 "
      "--nocompare --trace=" +
      path);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("trace of 2 steps: " + path));  // the 2 timed steps
  const std::string trace = ::tandem::testing::ReadFile(path);
  EXPECT_THAT(trace, HasSubstr("\"args\":{\"name\":\"main\"}"));
  EXPECT_THAT(trace, HasSubstr("\"args\":{\"name\":\"cpu:1 worker\"}"));
  EXPECT_THAT(trace, HasSubstr("\"name\":\"replica 1 on cpu:1\""));
  EXPECT_THAT(trace, HasSubstr("\"name\":\"BroadcastBackward\""));
  EXPECT_THAT(trace, HasSubstr("\"name\":\"SGD.step\""));
  EXPECT_THAT(trace, HasSubstr("\"name\":\"step 1\""));

  const ProgramResult bad = Bench("--steps=1 --warmup=0 --trace=/nonexistent/dir/trace.json");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_THAT(bad.err, HasSubstr("--trace"));
}

TEST(TrainStepTest, GptJsonNamesItsLayersAndCountsNothingOnTheCpu) {
  const ProgramResult r = Bench(
      "--model=gpt --n_layer=1 --batch_size=2 --tokens=8 --devices=cpu:0 --threads=1 --steps=1 "
      "--warmup=0");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(LastLine(r.out), MatchesRegex(".*\"tokens\":8,\"n_layer\":1\\}"));
  EXPECT_THAT(r.out, Not(HasSubstr("Device work of one step")));
}

// Under --config=cudasim the simulator counts one step's launches and host syncs; on a real GPU
// they need CUPTI and are reported as not counted; without CUDA, or a GPU, there is no cuda:0.
TEST(TrainStepTest, CudaStepCountsLaunchesAndHostSyncs) {
#if !defined(TANDEM_TEST_CUDASIM) && !defined(TANDEM_TEST_CUDA)
  GTEST_SKIP() << "built without CUDA: --config=cudasim counts a step's launches";
#endif
  const ProgramResult r = Bench(
      "--model=gpt --n_layer=1 --batch_size=2 --tokens=8 --devices=cuda:0 --steps=1 --warmup=0 "
      "--top_kernels=3");
#ifndef TANDEM_TEST_CUDASIM
  if (r.exit_code == 1 && r.err.find("cuda:0 is not available") != std::string::npos) {
    GTEST_SKIP() << "CUDA build without a usable GPU: " << r.err;
  }
#endif
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("Device work of one step"));
#ifdef TANDEM_TEST_CUDASIM
  EXPECT_THAT(r.out, HasSubstr("loss read-back (.item())"));
  EXPECT_THAT(r.out, HasSubstr("top 3 of "));
  EXPECT_THAT(r.out, HasSubstr("cublasSgemm"));
  EXPECT_THAT(LastLine(r.out), MatchesRegex(".*\"n_layer\":1,\"launches_per_step\":[1-9][0-9]*,"
                                            "\"host_syncs_per_step\":[0-9]+,"
                                            "\"modelled_h100_ms\":[0-9.]+,"
                                            "\"roofline_gemm_attention_h100_ms\":[0-9.]+\\}"));
  // The H100 roofline of the counted kernels, labelled a model.
  EXPECT_THAT(r.out, HasSubstr("model, not measured"));
  EXPECT_THAT(r.out, HasSubstr("modelled H100 step: "));
#else
  EXPECT_THAT(r.out, HasSubstr("not counted"));
  EXPECT_THAT(LastLine(r.out), Not(HasSubstr("launches_per_step")));
  EXPECT_THAT(LastLine(r.out), Not(HasSubstr("modelled_h100_ms")));
  EXPECT_THAT(LastLine(r.out), HasSubstr("roofline_gemm_attention_h100_ms"));
#endif
}

// --cuda_graph captures the step once and replays it: the replayed steps' losses equal the same
// steps run eagerly, bit for bit, for the MLP and the small GPT (both with capturable AdamW).
TEST(TrainStepTest, CudaGraphReplayEqualsEagerBitForBit) {
#ifndef TANDEM_TEST_CUDASIM
  GTEST_SKIP() << "runs under --config=cudasim (on a GPU: owed to the GPU bundle)";
#endif
  for (const char* model :
       {"--model=mlp --batch_size=16", "--model=gpt --n_layer=1 --batch_size=2 --tokens=8"}) {
    const ProgramResult r =
        Bench(std::string(model) + " --devices=cuda:0 --steps=3 --warmup=2 --cuda_graph");
    ASSERT_EQ(r.exit_code, 0) << model << ": " << r.err;
    EXPECT_THAT(r.out, HasSubstr("losses equal bit for bit")) << model;
    EXPECT_THAT(LastLine(r.out), MatchesRegex(".*\"cuda_graph\":true,\"replay_equals_eager\":true,"
                                              "\"launches_per_step\":1,\"host_syncs_per_step\""
                                              ":[0-9]+,\"eager_launches_per_step\":[1-9][0-9]+,"
                                              "\"graph_kernels_per_step\":[1-9][0-9]+\\}"))
        << model;
  }
}

TEST(TrainStepTest, CudaGraphRefusesWhatItCannotCapture) {
  for (const char* flags :
       {"--cuda_graph --devices=cpu:0", "--cuda_graph --devices=cuda:0 --autocast=fp16",
        "--cuda_graph --devices=cuda:0 --model=gpt --checkpoint_activations"}) {
    const ProgramResult r = Bench(flags);
    EXPECT_EQ(r.exit_code, 1) << flags;
    EXPECT_THAT(r.err, HasSubstr("--cuda_graph")) << flags;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << flags << ": " << r.err;
  }
}

TEST(TrainStepTest, BadFlagsAreOneLineErrors) {
  for (const char* flags : {"--model=vgg", "--steps=0", "--devices=cpu:0,cpu:0", "--devices=tpu",
                            "--model=gpt --n_layer=-1"}) {
    const ProgramResult r = Bench(flags);
    EXPECT_EQ(r.exit_code, 1) << flags;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << flags << ": " << r.err;
  }
}

}  // namespace
