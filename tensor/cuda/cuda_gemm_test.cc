// GEMM on CUDA (cuBLAS and the scale helper) against the CPU backend.
//
// Shared fixture and helpers: cuda_backend_testing.h. Skips (with the reason) where there is
// no usable GPU; set TANDEM_TEST_SEED to replay a run.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "tensor/base/error.h"
#include "tensor/cuda/cuda_backend_testing.h"
#include "tensor/kernels/internal/elementwise_math.h"
#include "tensor/runtime/backend.h"

namespace tandem {
namespace cuda_test {

// ---- GEMM
// ----------------------------------------------------------------------------------------

struct GemmCase {
  int64_t m, n, k, batch;
};

// Each case with A and B transposed or not, A shared by the batch or not, beta 0 and 0.5.
template <typename T>
void CudaBackendTest::ExpectGemmMatches(const std::vector<GemmCase>& cases) {
  const DType dtype = DTypeOf<T>::value;
  for (const GemmCase& g : cases) {
    for (bool trans_a : {false, true}) {
      for (bool trans_b : {false, true}) {
        for (bool shared_a : {false, true}) {  // stride_a = 0: one A for the whole batch
          const std::string what = Note(
              DTypePrefix<T>() + "gemm m=" + std::to_string(g.m) + " n=" + std::to_string(g.n) +
              " k=" + std::to_string(g.k) + " batch=" + std::to_string(g.batch) +
              (trans_a ? " A^T" : "") + (trans_b ? " B^T" : "") + (shared_a ? " shared A" : ""));
          // Leading dimensions wider than the rows, to test strides.
          const int64_t lda = (trans_a ? g.m : g.k) + 3, ldb = (trans_b ? g.k : g.n) + 1,
                        ldc = g.n + 2;
          const int64_t a_rows = trans_a ? g.k : g.m, b_rows = trans_b ? g.n : g.k;
          const int64_t stride_a = shared_a ? 0 : a_rows * lda, stride_b = b_rows * ldb,
                        stride_c = g.m * ldc;
          Buffer<T> a(Random<T>((shared_a ? 1 : g.batch) * a_rows * lda, -1.0, 1.0));
          Buffer<T> b(Random<T>(g.batch * b_rows * ldb, -1.0, 1.0));
          Buffer<T> c(Random<T>(g.batch * stride_c, -1.0, 1.0));
          for (double beta : {0.0, 0.5}) {
            Buffer<T> out(c.Cpu());  // the same initial C on both devices
            cpu_.Gemm(0, dtype, trans_a, trans_b, g.m, g.n, g.k, 1.25, a.cpu(), lda, stride_a,
                      b.cpu(), ldb, stride_b, beta, out.cpu(), ldc, stride_c, g.batch);
            gpu_.Gemm(0, dtype, trans_a, trans_b, g.m, g.n, g.k, 1.25, a.gpu(), lda, stride_a,
                      b.gpu(), ldb, stride_b, beta, out.gpu(), ldc, stride_c, g.batch);
            ExpectNear(out.Cpu(), out.Gpu(), Tolerance<T>::kGemmRtol,
                       Tolerance<T>::kGemmAtolPerSqrtK * std::sqrt(static_cast<double>(g.k)),
                       what + " beta=" + std::to_string(beta));
          }
        }
      }
    }
  }
}

TEST_F(CudaBackendTest, GemmAllTranspositionsAndBatches) {
  ExpectGemmMatches<float>({{1, 1, 1, 1},
                            {33, 17, 65, 1},
                            {128, 256, 64, 1},
                            {5, 300, 2, 1},
                            {7, 9, 11, 4},
                            {64, 10, 784, 3}});
  ExpectGemmMatches<double>({{1, 1, 1, 1}, {33, 17, 65, 1}, {7, 9, 11, 4}, {64, 10, 300, 3}});
}

// k = 0 or alpha = 0: C = beta * C; beta = 0 clears even NaN. m = 0: nothing.
template <typename T>
void CudaBackendTest::ExpectDegenerateGemmMatches() {
  const DType dtype = DTypeOf<T>::value;
  const int64_t m = 3, n = 4;
  std::vector<T> c_values = Random<T>(m * n);
  c_values[5] = NAN;
  for (auto [k, alpha, beta] : {std::tuple<int64_t, double, double>{0, 1.0, 0.0},
                                {0, 1.0, 2.0},
                                {0, 1.0, 0.1},
                                {5, 0.0, 0.0},
                                {5, 0.0, -1.0}}) {
    Buffer<T> a(Random<T>(m * 5));
    Buffer<T> b(Random<T>(5 * n));
    Buffer<T> c(c_values);
    // With k = 0, A and B have no elements: null pointers show that neither backend reads them.
    const bool empty = k == 0;
    const int64_t lda = std::max<int64_t>(k, 1);  // BLAS wants a row stride of at least 1
    cpu_.Gemm(0, dtype, false, false, m, n, k, alpha, empty ? nullptr : a.cpu(), lda, 0,
              empty ? nullptr : b.cpu(), n, 0, beta, c.cpu(), n, 0, 1);
    gpu_.Gemm(0, dtype, false, false, m, n, k, alpha, empty ? nullptr : a.gpu(), lda, 0,
              empty ? nullptr : b.gpu(), n, 0, beta, c.gpu(), n, 0, 1);
    ExpectBitwiseEqual(c.Cpu(), c.Gpu(),
                       Note(DTypePrefix<T>() + "degenerate gemm k=" + std::to_string(k) +
                            " beta=" + std::to_string(beta)));
  }
  Buffer<T> c(c_values);
  gpu_.Gemm(0, dtype, false, false, 0, n, 5, 1.0, nullptr, 5, 0, nullptr, n, 0, 0.0, c.gpu(), n, 0,
            1);
  ExpectBitwiseEqual(c.Cpu(), c.Gpu(), Note(DTypePrefix<T>() + "gemm with m = 0 writes nothing"));
  EXPECT_THROW(gpu_.Gemm(0, dtype, false, false, m, n, 5, 1.0, c.gpu(), 2, 0, c.gpu(), n, 0, 0.0,
                         c.gpu(), n, 0, 1),
               Error);  // lda = 2 < k = 5
}

TEST_F(CudaBackendTest, GemmDegenerateSizes) {
  ExpectDegenerateGemmMatches<float>();
  ExpectDegenerateGemmMatches<double>();
}

TEST_F(CudaBackendTest, GemmTf32SwitchTradesPrecisionForSpeed) {
  const int64_t m = 256, n = 256, k = 1024;
  Buffer<float> a(Random<float>(m * k, -1.0f, 1.0f));
  Buffer<float> b(Random<float>(k * n, -1.0f, 1.0f));
  Buffer<float> c(m * n);
  cpu_.Gemm(0, kFloat32, false, false, m, n, k, 1.0f, a.cpu(), k, 0, b.cpu(), n, 0, 0.0f, c.cpu(),
            n, 0, 1);
  ASSERT_FALSE(cuda::AllowTf32());
  cuda::SetAllowTf32(true);
  gpu_.Gemm(0, kFloat32, false, false, m, n, k, 1.0f, a.gpu(), k, 0, b.gpu(), n, 0, 0.0f, c.gpu(),
            n, 0, 1);
  const std::vector<float> tf32 = c.Gpu();
  cuda::SetAllowTf32(false);
  gpu_.Gemm(0, kFloat32, false, false, m, n, k, 1.0f, a.gpu(), k, 0, b.gpu(), n, 0, 0.0f, c.gpu(),
            n, 0, 1);
  const std::vector<float> fp32 = c.Gpu();
  double tf32_error = 0.0, fp32_error = 0.0;
  for (int64_t i = 0; i < m * n; ++i) {
    tf32_error = std::max(tf32_error, std::fabs(static_cast<double>(tf32[i]) - c.Cpu()[i]));
    fp32_error = std::max(fp32_error, std::fabs(static_cast<double>(fp32[i]) - c.Cpu()[i]));
  }
  // TF32 keeps 10 mantissa bits: errors of order 1e-3 * sqrt(k) here; FP32 about 1e-5.
  EXPECT_LT(fp32_error, 1e-4);
  EXPECT_LT(tf32_error, 0.5);
  EXPECT_GT(tf32_error, fp32_error)
      << "allowing TF32 changed nothing: is NVIDIA_TF32_OVERRIDE=0 set?";
}

// ---- float64 only ---------------------------------------------------------------------------
// The checks float64 has and float32 does not (the shared ones run both dtypes above).
// Kernels whose arithmetic is the same expression on both devices must agree bitwise.

TEST_F(CudaBackendFloat64Test, GemmIgnoresTheTf32Switch) {
  const int64_t m = 31, n = 29, k = 257;
  Buffer<double> a(Random<double>(m * k, -1.0, 1.0));
  Buffer<double> b(Random<double>(k * n, -1.0, 1.0));
  Buffer<double> c(m * n);
  ASSERT_FALSE(cuda::AllowTf32());
  gpu_.Gemm(0, kFloat64, false, false, m, n, k, 1.0, a.gpu(), k, 0, b.gpu(), n, 0, 0.0, c.gpu(), n,
            0, 1);
  const std::vector<double> full = c.Gpu();
  cuda::SetAllowTf32(true);
  gpu_.Gemm(0, kFloat64, false, false, m, n, k, 1.0, a.gpu(), k, 0, b.gpu(), n, 0, 0.0, c.gpu(), n,
            0, 1);
  cuda::SetAllowTf32(false);
  ExpectBitwiseEqual(full, c.Gpu(), Note("float64 gemm with TF32 allowed"));
}

// ---- bfloat16 and float16 ----------------------------------------------------------------

template <typename T>
void CudaBackendReducedTest::ExpectGemmMatches16() {
  const DType dtype = DTypeOf<T>::value;
  for (const GemmCase& g : {GemmCase{1, 1, 1, 1}, GemmCase{7, 5, 3, 1}, GemmCase{33, 17, 65, 3},
                            GemmCase{64, 48, 256, 1}, GemmCase{5, 6, 0, 2}}) {
    for (bool trans_a : {false, true}) {
      for (bool trans_b : {false, true}) {
        const int64_t lda = (trans_a ? g.m : g.k) + 3, ldb = (trans_b ? g.k : g.n) + 1,
                      ldc = g.n + 2;
        const int64_t a_rows = trans_a ? g.k : g.m, b_rows = trans_b ? g.n : g.k;
        const int64_t stride_a = a_rows * lda, stride_b = b_rows * ldb, stride_c = g.m * ldc;
        Buffer<T> a(RandomReduced<T>(g.batch * stride_a, -1.0, 1.0));
        Buffer<T> b(RandomReduced<T>(g.batch * stride_b, -1.0, 1.0));
        const std::vector<T> c = RandomReduced<T>(g.batch * stride_c, -1.0, 1.0);
        Buffer<float> wide_a = Wide(a), wide_b = Wide(b);
        for (double beta : {0.0, 0.5}) {
          const std::string what = Note(
              DTypePrefix<T>() + "gemm m=" + std::to_string(g.m) + " n=" + std::to_string(g.n) +
              " k=" + std::to_string(g.k) + " batch=" + std::to_string(g.batch) +
              (trans_a ? " A^T" : "") + (trans_b ? " B^T" : "") + " beta=" + std::to_string(beta));
          Buffer<T> out(c);
          Buffer<float> expected(Widened(c));
          cpu_.Gemm(0, kFloat32, trans_a, trans_b, g.m, g.n, g.k, 1.25, wide_a.cpu(), lda, stride_a,
                    wide_b.cpu(), ldb, stride_b, beta, expected.cpu(), ldc, stride_c, g.batch);
          gpu_.Gemm(0, dtype, trans_a, trans_b, g.m, g.n, g.k, 1.25, a.gpu(), lda, stride_a,
                    b.gpu(), ldb, stride_b, beta, out.gpu(), ldc, stride_c, g.batch);
          // Padding between rows of C is not written: it must stay as it was.
          ExpectNear(Rounded<T>(expected.Cpu()), out.Gpu(), Ulp<T>(),
                     Ulp<T>() * std::sqrt(static_cast<double>(g.k)), what);
        }
      }
    }
  }
}

// GemmFloatOutput (16-bit A and B, float32 C) against the CPU's SGEMM of the widened operands:
// both multiply exactly and add in float in their own orders, and neither rounds C to 16 bits,
// so they agree to float32 rounding: per element within k * FLT_EPSILON * sum |a_ip b_pj| (a
// bound on both summation errors together) plus a little. A C rounded to T would miss this by
// orders of magnitude. C starts as NaN: every element must be written, the row padding not.
template <typename T>
void CudaBackendReducedTest::ExpectGemmFloatOutputMatches() {
  const DType dtype = DTypeOf<T>::value;
  const double eps = std::numeric_limits<float>::epsilon();
  for (const GemmCase& g : {GemmCase{1, 1, 1, 1}, GemmCase{7, 5, 3, 1}, GemmCase{33, 17, 65, 1},
                            GemmCase{128, 96, 200, 1}, GemmCase{5, 6, 0, 1}}) {
    for (bool trans_a : {false, true}) {
      for (bool trans_b : {false, true}) {
        for (bool padded : {false, true}) {
          const std::string what =
              Note(DTypePrefix<T>() + "gemm float output m=" + std::to_string(g.m) +
                   " n=" + std::to_string(g.n) + " k=" + std::to_string(g.k) +
                   (trans_a ? " A^T" : "") + (trans_b ? " B^T" : "") + (padded ? " padded" : ""));
          const int64_t a_rows = trans_a ? g.k : g.m, a_cols = trans_a ? g.m : g.k;
          const int64_t b_rows = trans_b ? g.n : g.k, b_cols = trans_b ? g.k : g.n;
          const int64_t lda = std::max<int64_t>(a_cols, 1) + (padded ? 3 : 0),
                        ldb = std::max<int64_t>(b_cols, 1) + (padded ? 1 : 0),
                        ldc = g.n + (padded ? 2 : 0);
          Buffer<T> a(RandomReduced<T>(std::max<int64_t>(a_rows * lda, 1), -1.0, 1.0));
          Buffer<T> b(RandomReduced<T>(std::max<int64_t>(b_rows * ldb, 1), -1.0, 1.0));
          Buffer<float> wide_a = Wide(a), wide_b = Wide(b);
          Buffer<float> expected(g.m * ldc), out(g.m * ldc);  // both NaN
          cpu_.Gemm(0, kFloat32, trans_a, trans_b, g.m, g.n, g.k, 1.0, wide_a.cpu(), lda, 0,
                    wide_b.cpu(), ldb, 0, 0.0, expected.cpu(), ldc, 0, 1);
          ASSERT_TRUE(gpu_.GemmFloatOutput(0, dtype, trans_a, trans_b, g.m, g.n, g.k, a.gpu(), lda,
                                           dtype, b.gpu(), ldb, out.gpu(), ldc))
              << what;
          const std::vector<float> got = out.Gpu();
          int64_t mismatches = 0;
          for (int64_t i = 0; i < g.m; ++i) {
            for (int64_t j = 0; j < ldc; ++j) {
              const float e = expected.Cpu()[i * ldc + j], x = got[i * ldc + j];
              bool ok;
              double bound = 0.0;
              if (j >= g.n) {
                ok = std::isnan(x);  // padding: not written
              } else {
                double abs_sum = 0.0;  // sum over p of |A(i, p) B(p, j)|
                for (int64_t p = 0; p < g.k; ++p) {
                  const float ai = wide_a.Cpu()[trans_a ? p * lda + i : i * lda + p];
                  const float bj = wide_b.Cpu()[trans_b ? j * ldb + p : p * ldb + j];
                  abs_sum += std::fabs(static_cast<double>(ai) * bj);
                }
                // k = 0: exactly zero.
                bound = (g.k == 0 ? 0.0 : 1e-5) + 1.3e-6 * std::fabs(e) + g.k * eps * abs_sum;
                ok = std::fabs(static_cast<double>(x) - e) <= bound;
              }
              if (!ok && mismatches++ < 5) {
                ADD_FAILURE() << what << ": C(" << i << ", " << j << ") is " << x << " on cuda but "
                              << e << " on cpu (bound " << bound << ")";
              }
            }
          }
          EXPECT_EQ(mismatches, 0) << what;
        }
      }
    }
  }
  // m = 0 and n = 0: nothing to do, nothing written.
  Buffer<T> a(RandomReduced<T>(12)), b(RandomReduced<T>(12));
  Buffer<float> c(12);
  EXPECT_TRUE(gpu_.GemmFloatOutput(0, dtype, false, false, 0, 3, 4, a.gpu(), 4, dtype, b.gpu(), 3,
                                   c.gpu(), 3));
  EXPECT_TRUE(gpu_.GemmFloatOutput(0, dtype, false, false, 3, 0, 4, a.gpu(), 4, dtype, b.gpu(), 1,
                                   c.gpu(), 1));
  for (float x : c.Gpu()) EXPECT_TRUE(std::isnan(x)) << DTypePrefix<T>() << "empty C written";
  // A row stride shorter than the row: the CPU's error.
  EXPECT_THROW(gpu_.GemmFloatOutput(0, dtype, false, false, 3, 3, 4, a.gpu(), 2, dtype, b.gpu(), 3,
                                    c.gpu(), 3),
               Error);
}

TEST_F(CudaBackendReducedTest, GemmExBFloat16) { ExpectGemmMatches16<BFloat16>(); }
TEST_F(CudaBackendReducedTest, GemmExFloat16) { ExpectGemmMatches16<Half>(); }
TEST_F(CudaBackendReducedTest, GemmFloatOutputBFloat16) {
  ExpectGemmFloatOutputMatches<BFloat16>();
}
TEST_F(CudaBackendReducedTest, GemmFloatOutputFloat16) { ExpectGemmFloatOutputMatches<Half>(); }
// Only 16-bit operands have a float32-output GEMM: other dtypes report false and write nothing,
// so the caller takes its fallback.
TEST_F(CudaBackendReducedTest, GemmFloatOutputDeclinesOtherDTypes) {
  Buffer<float> a(std::vector<float>{1.0f, 2.0f}), b(std::vector<float>{3.0f, 4.0f});
  Buffer<float> c(1);
  EXPECT_FALSE(gpu_.GemmFloatOutput(0, kFloat32, false, false, 1, 1, 2, a.gpu(), 2, kFloat32,
                                    b.gpu(), 1, c.gpu(), 1));
  Buffer<double> ad(std::vector<double>{1.0, 2.0}), bd(std::vector<double>{3.0, 4.0});
  EXPECT_FALSE(gpu_.GemmFloatOutput(0, kFloat64, false, false, 1, 1, 2, ad.gpu(), 2, kFloat64,
                                    bd.gpu(), 1, c.gpu(), 1));
  // A float32 B under 16-bit A is the caller's to cast on a GPU.
  Buffer<BFloat16> a16(RandomReduced<BFloat16>(2, -1.0, 1.0));
  EXPECT_FALSE(gpu_.GemmFloatOutput(0, kBFloat16, false, false, 1, 1, 2, a16.gpu(), 2, kFloat32,
                                    b.gpu(), 1, c.gpu(), 1));
  EXPECT_TRUE(std::isnan(c.Gpu()[0])) << "a declined GemmFloatOutput wrote C";
}

}  // namespace cuda_test
}  // namespace tandem
