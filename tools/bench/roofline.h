// What a training step would take on an H100 SXM by the roofline model — a model, not a
// measurement: each kernel at the peak of HBM3 bandwidth (3.35 TB/s) or of its math (dense
// bf16/fp16 tensor cores 989 TFLOP/s, TF32 495, FP32 on CUDA cores 67, FP64 67), whichever
// binds; launch latency, occupancy, caches and overlap ignored, so a real step is slower.
// Use it with the CUDA simulator's counted work (device_counters.h: GEMMs counted exactly,
// Tandem's kernels as they declare it) and, for a GPT, with the ideal step of its GEMMs and
// attention from its shapes alone:
//
//   const RooflineReport model = ModelOnH100(ReadDeviceCounters());
//   PrintRoofline(model);            // per kernel: launches, GFLOP, MB, bound, modelled us
//   GptIdealStep ideal = GptGemmAndAttentionRoofline(config, 8, 1024, "bf16");
#ifndef TANDEM_TOOLS_BENCH_ROOFLINE_H_
#define TANDEM_TOOLS_BENCH_ROOFLINE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "examples/gpt.h"
#include "tools/cuda/device_counters.h"

namespace tandem::bench {

// H100 SXM5's data-sheet peaks (dense, no sparsity).
inline constexpr double kH100HbmBytesPerSecond = 3.35e12;
// FLOP/s for a kernel's math ("bf16", "fp16", "tf32", "fp32", "fp64"; anything else, such as
// "mixed", the slowest of them, 67e12).
double H100PeakFlops(const std::string& math);
// max(bytes / bandwidth, flops / peak(math)) in seconds.
double RooflineSeconds(double flops, double bytes, const std::string& math);

struct RooflineRow {
  std::string name;
  long long launches = 0;
  bool counted = false;  // its work was counted or declared; else no time is modelled
  double flops = 0, bytes = 0;
  std::string math;
  double seconds = 0;  // modelled, from the sums over its launches
  bool memory_bound = false;
};

struct RooflineReport {
  bool counted = false;           // the counters were (under the simulator)
  std::string why_not;            // when not
  std::vector<RooflineRow> rows;  // by modelled time, longest first; uncounted ones last
  double seconds = 0;             // the modelled step: the sum over counted kernels
  long long launches = 0, uncounted_launches = 0;
};

// Each counted kernel's roofline time (from its FLOPs and bytes summed over its launches: a
// kernel whose launches differ in what binds them is modelled a little fast) and their sum.
RooflineReport ModelOnH100(const DeviceCounters& counters);
// The table (top `rows` kernels, 0: all), labelled "model, not measured", and the total.
void PrintRoofline(const RooflineReport& report, int rows = 0);

// The ideal of a GPT training step (forward and backward; the optimizer not counted) from its
// shapes: every GEMM of its linears and tied head (forward, and the input's and weight's
// gradients) and causal flash attention (forward 2 B T^2 C per layer, the causal half of QK^T
// and PV; backward 2.5 times that, FlashAttention-2's five products with QK^T recomputed),
// each at its own roofline with operands of `element_bytes` and `math`.
struct GptIdealStep {
  double gemm_flops = 0, gemm_seconds = 0;
  double attention_flops = 0, attention_seconds = 0;
  double seconds() const { return gemm_seconds + attention_seconds; }
};
GptIdealStep GptGemmAndAttentionRoofline(const examples::GptConfig& config, int64_t batch,
                                         int64_t tokens, const std::string& math);

// train_step's report for a step on a CUDA device: the counted kernels' model (PrintRoofline;
// under the simulator), and for a GPT (`gpt` non-null) the ideal of its GEMMs and attention at
// `batch` x `tokens` in `math` next to the modelled step and next to `measured_ms` when the step
// ran on a real GPU (`on_gpu`). `through_backward` (may be null) is the step's counts up to the
// end of its backward: its model is the ideal's scope (forward and backward), whose ratio to the
// ideal is the target (within 1.5x); the rest (the optimizer) is printed beside it.
// Returns the JSON fields it adds to train_step's line: "modelled_h100_ms" where counted,
// "modelled_forward_backward_h100_ms" with through_backward, "roofline_gemm_attention_h100_ms"
// for a GPT.
std::string ReportRoofline(const DeviceCounters& work, const DeviceCounters* through_backward,
                           const examples::GptConfig* gpt, int64_t batch, int64_t tokens,
                           const std::string& math, double measured_ms, bool on_gpu, int rows);

}  // namespace tandem::bench

#endif  // TANDEM_TOOLS_BENCH_ROOFLINE_H_
