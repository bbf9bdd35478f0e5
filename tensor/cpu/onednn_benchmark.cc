// GFLOP/s of CpuBackend::Gemm for the trainer's GEMMs (the MLP's and the CNN's at batch 256,
// forward and both backward products) and a transformer-sized one, three ways:
//   bf16        bfloat16 through oneDNN (what the backend does for bfloat16)
//   f32 blas    float32 through OpenBLAS (OneDnnFloat32Policy::kNever)
//   f32 dnnl    float32 through oneDNN (OneDnnFloat32Policy::kAlways)
// on one logical CPU device with 1 and 2 threads. The three alternate within every round, so a
// busy machine slows them alike; each figure is the median over the rounds.
//
//   bazel run -c opt //tensor/cpu:onednn_benchmark [-- rounds]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tensor/base/half.h"
#include "tensor/cpu/internal/onednn_matmul.h"
#include "tensor/runtime/backend.h"
#include "tensor/runtime/devices.h"

namespace tandem {
namespace {

struct Shape {
  std::string name;
  bool trans_a, trans_b;
  int64_t m, n, k, batch;
  bool shared_a;  // stride_a = 0 (the convolution's weights, per image)
};

// Linear(in, out) at batch B: y = x W^T (m=B, n=out, k=in, W transposed), dx = dy W
// (m=B, n=in, k=out), dW = dy^T x (m=out, n=in, k=B, dy transposed).
std::vector<Shape> Shapes() {
  std::vector<Shape> shapes;
  const int64_t batch = 256;
  for (auto [in, out] :
       std::vector<std::pair<int64_t, int64_t>>{{784, 256}, {256, 128}, {128, 10}, {3136, 128}}) {
    const std::string tag = std::to_string(in) + "->" + std::to_string(out);
    shapes.push_back({"linear " + tag + " fwd", false, true, batch, out, in, 1, false});
    shapes.push_back({"linear " + tag + " dx", false, false, batch, in, out, 1, false});
    shapes.push_back({"linear " + tag + " dW", true, false, out, in, batch, 1, false});
  }
  // The CNN (tensor/ops/convolution.cc's conv2d): conv1 (1->32, 28x28, 9 rows) one GEMM per image;
  // conv2 (32->64, 14x14, 288 rows) one GEMM with every image's columns side by side.
  shapes.push_back({"conv1 fwd (per image)", false, false, 32, 784, 9, batch, true});
  shapes.push_back({"conv1 dW (per image)", false, true, 32, 9, 784, batch, false});
  shapes.push_back({"conv2 fwd", false, false, 64, batch * 196, 288, 1, false});
  shapes.push_back({"conv2 dx", true, false, 288, batch * 196, 64, 1, false});
  shapes.push_back({"conv2 dW", false, true, 64, 288, batch * 196, 1, false});
  // The same at 64 images: a quarter of the batch, each logical CPU device's share of 256 over
  // four devices (or of 128 over two).
  shapes.push_back({"conv2 fwd, 64 images", false, false, 64, 64 * 196, 288, 1, false});
  shapes.push_back({"conv2 dx, 64 images", true, false, 288, 64 * 196, 64, 1, false});
  shapes.push_back({"2048x768 -> 2304", false, false, 2048, 2304, 768, 1, false});
  return shapes;
}

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

struct Buffers {
  std::vector<float> a32, b32, c32;
  std::vector<BFloat16> a16, b16, c16;
};

// Seconds per call of one GEMM, over enough calls to take ~30 ms.
double TimeGemm(const Shape& s, DType dtype, Buffers& buffers) {
  const bool bf16 = dtype == kBFloat16;
  const int64_t lda = s.trans_a ? s.m : s.k, ldb = s.trans_b ? s.k : s.n, ldc = s.n;
  const int64_t stride_a = s.shared_a ? 0 : s.m * s.k, stride_b = s.k * s.n, stride_c = s.m * s.n;
  const void* a = bf16 ? static_cast<const void*>(buffers.a16.data()) : buffers.a32.data();
  const void* b = bf16 ? static_cast<const void*>(buffers.b16.data()) : buffers.b32.data();
  void* c = bf16 ? static_cast<void*>(buffers.c16.data()) : buffers.c32.data();
  Backend& cpu = GetBackend(DeviceType::kCPU);
  auto call = [&] {
    cpu.Gemm(0, dtype, s.trans_a, s.trans_b, s.m, s.n, s.k, 1.0, a, lda, stride_a, b, ldb, stride_b,
             0.0, c, ldc, stride_c, s.batch);
  };
  call();  // primitives made, memory touched
  auto start = std::chrono::steady_clock::now();
  call();
  const double once = Seconds(start);
  const int reps = std::max(1, static_cast<int>(0.03 / std::max(once, 1e-7)));
  start = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; ++r) call();
  return Seconds(start) / reps;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int Main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::max(1, std::atoi(argv[1])) : 5;
  std::printf("oneDNN bf16 %s, f16 %s; %d rounds, medians in GFLOP/s\n",
              OneDnnSupports(kBFloat16) ? "supported" : "NOT supported",
              OneDnnSupports(kFloat16) ? "supported" : "not supported", rounds);
  SetCpuDeviceCount(1);
  for (int threads : {1, 2}) {
    SetCpuThreadsPerDevice(threads);
    std::printf("\n%d thread%s\n%-24s %9s %9s %9s %8s %8s  %s\n", threads, threads > 1 ? "s" : "",
                "GEMM (m x n x k, batch)", "bf16", "f32 blas", "f32 dnnl", "bf16/f32", "dnnl/blas",
                "oneDNN kernel (bf16 | f32)");
    for (const Shape& s : Shapes()) {
      Buffers buffers;
      const int64_t a_size = (s.shared_a ? 1 : s.batch) * s.m * s.k;
      buffers.a32.resize(a_size);
      buffers.b32.resize(s.batch * s.k * s.n);
      buffers.c32.resize(s.batch * s.m * s.n);
      for (size_t i = 0; i < buffers.a32.size(); ++i) buffers.a32[i] = (i % 17) * 0.125f - 1.0f;
      for (size_t i = 0; i < buffers.b32.size(); ++i) buffers.b32[i] = (i % 13) * 0.125f - 0.75f;
      buffers.a16.assign(buffers.a32.begin(), buffers.a32.end());
      buffers.b16.assign(buffers.b32.begin(), buffers.b32.end());
      buffers.c16.resize(buffers.c32.size());
      std::vector<double> bf16, blas, dnnl;
      for (int round = 0; round < rounds; ++round) {
        if (OneDnnSupports(kBFloat16)) bf16.push_back(TimeGemm(s, kBFloat16, buffers));
        SetOneDnnFloat32Policy(OneDnnFloat32Policy::kNever);
        blas.push_back(TimeGemm(s, kFloat32, buffers));
        SetOneDnnFloat32Policy(OneDnnFloat32Policy::kAlways);
        dnnl.push_back(TimeGemm(s, kFloat32, buffers));
        SetOneDnnFloat32Policy(OneDnnFloat32Policy::kMeasured);
      }
      const double flops = 2.0 * s.m * s.n * s.k * s.batch;
      const double g16 = bf16.empty() ? 0 : flops / Median(bf16) / 1e9;
      const double gblas = flops / Median(blas) / 1e9, gdnnl = flops / Median(dnnl) / 1e9;
      const std::string kernels =
          OneDnnMatmulImplementation(kBFloat16, s.trans_a, s.trans_b, s.m, s.n, s.k,
                                     s.trans_a ? s.m : s.k, s.trans_b ? s.k : s.n, s.n) +
          " | " +
          OneDnnMatmulImplementation(kFloat32, s.trans_a, s.trans_b, s.m, s.n, s.k,
                                     s.trans_a ? s.m : s.k, s.trans_b ? s.k : s.n, s.n);
      char shape[64];
      std::snprintf(shape, sizeof(shape), "%ldx%ldx%ld", static_cast<long>(s.m),
                    static_cast<long>(s.n), static_cast<long>(s.k));
      std::printf("%-24s %9.1f %9.1f %9.1f %8.2f %8.2f  %s\n  (%s, batch %ld)\n", s.name.c_str(),
                  g16, gblas, gdnnl, g16 / gblas, gdnnl / gblas, kernels.c_str(), shape,
                  static_cast<long>(s.batch));
    }
  }
  SetCpuThreadsPerDevice(0);
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) { return tandem::Main(argc, argv); }
