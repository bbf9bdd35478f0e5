#include "tools/bench/roofline.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "absl/strings/str_format.h"

namespace tandem::bench {

double H100PeakFlops(const std::string& math) {
  if (math == "bf16" || math == "fp16") return 989e12;
  if (math == "tf32") return 495e12;
  return 67e12;  // fp32 on CUDA cores, fp64 on tensor cores, and the slowest for "mixed"
}

double RooflineSeconds(double flops, double bytes, const std::string& math) {
  return std::max(bytes / kH100HbmBytesPerSecond, flops / H100PeakFlops(math));
}

RooflineReport ModelOnH100(const DeviceCounters& counters) {
  RooflineReport report;
  report.counted = counters.counted;
  report.why_not = counters.not_counted;
  for (const KernelLaunches& k : counters.kernels) {
    RooflineRow row;
    row.name = k.name;
    row.launches = k.launches;
    row.counted = k.work_counted;
    row.flops = k.flops;
    row.bytes = k.bytes;
    row.math = k.math;
    report.launches += k.launches;
    if (row.counted) {
      row.seconds = RooflineSeconds(k.flops, k.bytes, k.math);
      row.memory_bound = k.bytes / kH100HbmBytesPerSecond >= k.flops / H100PeakFlops(k.math);
      report.seconds += row.seconds;
    } else {
      report.uncounted_launches += k.launches;
    }
    report.rows.push_back(row);
  }
  std::stable_sort(report.rows.begin(), report.rows.end(),
                   [](const RooflineRow& a, const RooflineRow& b) {
                     if (a.counted != b.counted) return a.counted;
                     return a.seconds > b.seconds;
                   });
  return report;
}

void PrintRoofline(const RooflineReport& report, int rows) {
  std::printf(
      "\nH100 SXM roofline of one step (model, not measured: HBM3 3.35 TB/s; dense "
      "bf16/fp16 989, TF32 495, FP32 67 TFLOP/s)");
  if (!report.counted) {
    std::printf(": %s\n", report.why_not.c_str());
    return;
  }
  std::printf(":\n  %8s %10s %10s %-6s %-7s %10s  %s\n", "launches", "GFLOP", "MB", "math", "bound",
              "model us", "kernel");
  const int shown = rows > 0 ? std::min<int>(rows, report.rows.size()) : report.rows.size();
  for (int i = 0; i < shown; ++i) {
    const RooflineRow& r = report.rows[i];
    if (r.counted) {
      std::printf("  %8lld %10.4f %10.3f %-6s %-7s %10.2f  %s\n", r.launches, r.flops / 1e9,
                  r.bytes / 1e6, r.math.c_str(), r.memory_bound ? "memory" : "math",
                  r.seconds * 1e6, r.name.c_str());
    } else {
      std::printf("  %8lld %10s %10s %-6s %-7s %10s  %s\n", r.launches, "-", "-", "-", "-",
                  "not decl.", r.name.c_str());
    }
  }
  if (shown < static_cast<int>(report.rows.size())) {
    std::printf("  ... %zu more kernels\n", report.rows.size() - shown);
  }
  std::printf(
      "  modelled H100 step: %.3f ms over %lld launches; %lld launches of kernels that "
      "declare no work are not in it\n",
      report.seconds * 1e3, report.launches - report.uncounted_launches, report.uncounted_launches);
}

GptIdealStep GptGemmAndAttentionRoofline(const examples::GptConfig& config, int64_t batch,
                                         int64_t tokens, const std::string& math) {
  const double element = (math == "bf16" || math == "fp16") ? 2.0 : 4.0;
  const double n = static_cast<double>(batch) * static_cast<double>(tokens);
  const double c = static_cast<double>(config.n_embd());
  GptIdealStep ideal;
  // One linear [n, in] -> [n, out] forward and backward: three GEMMs of 2 n in out FLOPs (y,
  // the input's gradient, the weight's), each reading its two operands and writing its result.
  const auto linear = [&](double in, double out, double count) {
    const double flops = 2.0 * n * in * out;
    const double y = (n * in + in * out + n * out) * element;   // x, W -> y
    const double dx = (n * out + out * in + n * in) * element;  // dy, W -> dx
    const double dw = (out * n + n * in + out * in) * element;  // dy^T, x -> dW
    ideal.gemm_flops += count * 3.0 * flops;
    ideal.gemm_seconds +=
        count * (RooflineSeconds(flops, y, math) + RooflineSeconds(flops, dx, math) +
                 RooflineSeconds(flops, dw, math));
  };
  const double layers = static_cast<double>(config.n_layer());
  linear(c, 3.0 * c, layers);                                       // c_attn
  linear(c, c, layers);                                             // attn.c_proj
  linear(c, 4.0 * c, layers);                                       // mlp.c_fc
  linear(4.0 * c, c, layers);                                       // mlp.c_proj
  linear(c, static_cast<double>(config.padded_vocab_size()), 1.0);  // the tied head
  // Causal flash attention per layer: forward reads q, k, v and writes o (4 n C elements);
  // backward reads q, k, v, o, do and writes dq, dk, dv (8 n C).
  const double t = static_cast<double>(tokens);
  const double forward = 2.0 * static_cast<double>(batch) * t * t * c;
  ideal.attention_flops = layers * 3.5 * forward;
  ideal.attention_seconds = layers * (RooflineSeconds(forward, 4.0 * n * c * element, math) +
                                      RooflineSeconds(2.5 * forward, 8.0 * n * c * element, math));
  return ideal;
}

std::string ReportRoofline(const DeviceCounters& work, const DeviceCounters* through_backward,
                           const examples::GptConfig* gpt, int64_t batch, int64_t tokens,
                           const std::string& math, double measured_ms, bool on_gpu, int rows) {
  std::string json;
  const RooflineReport model = ModelOnH100(work);
  PrintRoofline(model, rows);
  if (model.counted) {
    absl::StrAppendFormat(&json, ",\"modelled_h100_ms\":%.4f", model.seconds * 1e3);
  }
  // The forward and backward alone: the ideal's scope.
  const RooflineReport forward_backward =
      through_backward != nullptr ? ModelOnH100(*through_backward) : RooflineReport();
  if (forward_backward.counted) {
    std::printf(
        "  of which forward and backward: %.3f ms; the optimizer step and the rest: %.3f ms\n",
        forward_backward.seconds * 1e3, (model.seconds - forward_backward.seconds) * 1e3);
    absl::StrAppendFormat(&json, ",\"modelled_forward_backward_h100_ms\":%.4f",
                          forward_backward.seconds * 1e3);
  }
  if (gpt == nullptr) return json;
  const GptIdealStep ideal = GptGemmAndAttentionRoofline(*gpt, batch, tokens, math);
  std::printf(
      "  ideal of this GPT step's GEMMs and causal flash attention at %lld x %lld in %s (model, "
      "not measured; forward and backward, optimizer not counted): %.3f ms (GEMMs %.3f ms, "
      "%.1f TFLOP; attention %.3f ms, %.2f TFLOP)\n",
      static_cast<long long>(batch), static_cast<long long>(tokens), math.c_str(),
      ideal.seconds() * 1e3, ideal.gemm_seconds * 1e3, ideal.gemm_flops / 1e12,
      ideal.attention_seconds * 1e3, ideal.attention_flops / 1e12);
  if (forward_backward.counted && ideal.seconds() > 0) {
    std::printf(
        "  modelled forward and backward / that ideal: %.2fx (target: within 1.5x); the whole "
        "step / that ideal: %.2fx\n",
        forward_backward.seconds / ideal.seconds(), model.seconds / ideal.seconds());
  } else if (model.counted && ideal.seconds() > 0) {
    std::printf("  modelled step / that ideal: %.2fx\n", model.seconds / ideal.seconds());
  }
  if (on_gpu) {
    std::printf(
        "  measured step on this GPU: %.3f ms, %.2fx that ideal (an H100 SXM's figures; "
        "an H200 has 4.8 TB/s of HBM3e and the same peaks)\n",
        measured_ms, measured_ms / (ideal.seconds() * 1e3));
  }
  absl::StrAppendFormat(&json, ",\"roofline_gemm_attention_h100_ms\":%.4f", ideal.seconds() * 1e3);
  return json;
}

}  // namespace tandem::bench
