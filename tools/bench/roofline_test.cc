#include "tools/bench/roofline.h"

#include <gtest/gtest.h>

namespace tandem::bench {
namespace {

TEST(RooflineTest, AKernelTakesTheLongerOfItsBytesAndItsFlops) {
  // 3.35 GB moved: 1 ms at HBM3's 3.35 TB/s, whatever little math it does.
  EXPECT_DOUBLE_EQ(RooflineSeconds(1e6, 3.35e9, "fp32"), 1e-3);
  // 989 GFLOP of bf16: 1 ms on the tensor cores; the same FLOPs in TF32 twice as long (495),
  // on FP32 CUDA cores 989/67 times as long.
  EXPECT_DOUBLE_EQ(RooflineSeconds(989e9, 1e3, "bf16"), 1e-3);
  EXPECT_DOUBLE_EQ(RooflineSeconds(989e9, 1e3, "fp16"), 1e-3);
  EXPECT_DOUBLE_EQ(RooflineSeconds(495e9, 1e3, "tf32"), 1e-3);
  EXPECT_DOUBLE_EQ(RooflineSeconds(67e9, 1e3, "fp32"), 1e-3);
  EXPECT_DOUBLE_EQ(H100PeakFlops("mixed"), 67e12);  // the slowest, for mixed math
}

TEST(RooflineTest, ModelSumsCountedKernelsAndListsTheOthers) {
  DeviceCounters counters;
  counters.counted = true;
  counters.kernels.push_back(
      {"Elementwise (a.cu:1)", 10, 264, 264, 256, true, 1e6, 3.35e9, "fp32"});
  counters.kernels.push_back({"cublasLtMatmul", 4, 0, 0, 0, true, 2 * 989e9, 1e6, "bf16"});
  counters.kernels.push_back({"Attention (b.cu:2)", 3, 8, 8, 64, false, 0, 0, ""});
  const RooflineReport report = ModelOnH100(counters);
  ASSERT_EQ(report.rows.size(), 3u);
  EXPECT_EQ(report.rows[0].name, "cublasLtMatmul");  // 2 ms, math-bound
  EXPECT_FALSE(report.rows[0].memory_bound);
  EXPECT_DOUBLE_EQ(report.rows[0].seconds, 2e-3);
  EXPECT_TRUE(report.rows[1].memory_bound);  // 1 ms of bytes
  EXPECT_FALSE(report.rows[2].counted);      // listed last, not in the total
  EXPECT_DOUBLE_EQ(report.seconds, 3e-3);
  EXPECT_EQ(report.launches, 17);
  EXPECT_EQ(report.uncounted_launches, 3);
  EXPECT_FALSE(ModelOnH100(DeviceCounters()).counted);
}

// The GEMMs of a GPT step are the 6 N D rule's: 6 FLOPs per weight of the linears and of the
// tied head (forward 2, backward 4) per token; causal attention 3.5 times its forward's
// 2 B T^2 C per layer.
TEST(RooflineTest, GptIdealStepCountsSixFlopsPerWeightAndTokenAndCausalAttention) {
  const examples::GptConfig config = examples::GptConfig::Gpt2();
  const int64_t batch = 8, tokens = 1024;
  const GptIdealStep ideal = GptGemmAndAttentionRoofline(config, batch, tokens, "bf16");
  const double c = 768, n = batch * tokens;
  const double weights = 12 * (3 * c * c + c * c + 4 * c * c + 4 * c * c) + c * 50304;
  EXPECT_DOUBLE_EQ(ideal.gemm_flops, 6 * weights * n);
  EXPECT_DOUBLE_EQ(ideal.attention_flops, 12 * 3.5 * 2 * batch * 1024.0 * 1024.0 * c);
  // At GPT-2's sizes every GEMM is math-bound: the time is the FLOPs at 989 TFLOP/s.
  EXPECT_NEAR(ideal.gemm_seconds, ideal.gemm_flops / 989e12, 1e-9);
  EXPECT_GT(ideal.seconds(), ideal.gemm_seconds);
  // float32 without TF32 runs on the CUDA cores: 989 / 67 times as long.
  EXPECT_NEAR(GptGemmAndAttentionRoofline(config, batch, tokens, "fp32").gemm_seconds,
              ideal.gemm_flops / 67e12, 1e-6);
}

}  // namespace
}  // namespace tandem::bench
