// GEMM on CUDA (cuBLAS, cuBLASLt's epilogues and the scale helper) against the CPU backend, and
// linear / linear_gelu on CUDA (fused into cuBLASLt where they can be) against the CPU's.
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
#include "tensor/core/autograd.h"
#include "tensor/cuda/cuda_backend_testing.h"
#include "tensor/kernels/internal/elementwise_math.h"
#include "tensor/ops/autocast.h"
#include "tensor/ops/ops.h"
#include "tensor/runtime/backend.h"
#include "tensor/tensor.h"
#include "tools/cuda/device_counters.h"

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

// ---- cuBLASLt epilogues (Note [cuBLASLt epilogues]) -------------------------------------------
// The oracle: the CPU backend's float32 GEMM of the widened operands, then the epilogue in
// float on the host (bias added, tanh GELU), rounded once to T; the bias gradient's column
// sums in double. float32 with TF32 off agrees within float32's GEMM rounding; 16-bit within an
// ulp of T per element plus the GEMM's rounding (as GemmEx, Note [cudasim GemmEx]).

float GeluTanh(float x) {
  return 0.5f * x * (1.0f + std::tanh(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

// d gelu_tanh(x) / dx, as the CPU's kGeluTanhBackward computes it.
float GeluTanhDerivative(float x) {
  return UnaryMath(UnaryTag<UnaryOp::kGeluTanhDerivative>{}, x, 0.0f);
}

class CudaGemmEpilogueTest : public CudaBackendReducedTest {
 protected:
  template <typename T>
  void ExpectEpiloguesMatch(bool float_output);
  template <typename T>
  void ExpectGeluGradientMatches(bool float_bias_grad);
};

// kDGeluTanhBiasGrad: C = (op(A) op(B)) * gelu_tanh'(aux) in T and the bias gradient, C's column
// sums, in T or float32, against the oracle's float product, derivative and double sums.
template <typename T>
void CudaGemmEpilogueTest::ExpectGeluGradientMatches(bool float_bias_grad) {
  const DType dtype = DTypeOf<T>::value;
  const bool reduced = !std::is_same_v<T, float>;
  for (const GemmCase& g : {GemmCase{1, 8, 1, 1}, GemmCase{7, 16, 3, 1}, GemmCase{33, 24, 65, 1},
                            GemmCase{64, 48, 256, 1}}) {
    for (bool trans_a : {false, true}) {
      for (bool trans_b : {false, true}) {
        const std::string what =
            Note(DTypePrefix<T>() + "gemm DGELU_BGRAD m=" + std::to_string(g.m) + " n=" +
                 std::to_string(g.n) + " k=" + std::to_string(g.k) + (trans_a ? " A^T" : "") +
                 (trans_b ? " B^T" : "") + (float_bias_grad ? " float bias gradient" : ""));
        const int64_t a_rows = trans_a ? g.k : g.m, a_cols = trans_a ? g.m : g.k;
        const int64_t b_rows = trans_b ? g.n : g.k, b_cols = trans_b ? g.k : g.n;
        const int64_t lda = a_cols + 3, ldb = b_cols + 1, ldc = g.n + 2, ld_aux = g.n + 8;
        const auto values = [&](int64_t n) {
          if constexpr (std::is_same_v<T, float>) {
            return Random<float>(n, -1.0, 1.0);
          } else {
            return RandomReduced<T>(n, -1.0, 1.0);
          }
        };
        const std::vector<T> a_values = values(a_rows * lda), b_values = values(b_rows * ldb);
        const std::vector<T> aux_values = values(g.m * ld_aux);
        Buffer<T> a(a_values), b(b_values), aux(aux_values), out(g.m * ldc), grad(g.n);
        Buffer<float> grad32(g.n);
        Buffer<float> wide_a(Widened(a_values)), wide_b(Widened(b_values)), product(g.m * ldc);
        cpu_.Gemm(0, kFloat32, trans_a, trans_b, g.m, g.n, g.k, 1.0, wide_a.cpu(), lda, 0,
                  wide_b.cpu(), ldb, 0, 0.0, product.cpu(), ldc, 0, 1);
        Backend::GemmEpilogueArgs epilogue;
        epilogue.kind = Backend::GemmEpilogue::kDGeluTanhBiasGrad;
        epilogue.aux = aux.gpu();
        epilogue.ld_aux = ld_aux;
        epilogue.bias_grad = float_bias_grad ? static_cast<void*>(grad32.gpu()) : grad.gpu();
        epilogue.float_bias_grad = float_bias_grad;
        ASSERT_TRUE(gpu_.GemmWithEpilogue(0, dtype, dtype, trans_a, trans_b, g.m, g.n, g.k, a.gpu(),
                                          lda, b.gpu(), ldb, out.gpu(), ldc, epilogue))
            << what;
        const std::vector<float> wide_aux = Widened(aux_values);
        std::vector<float> expected(g.m * ldc, std::numeric_limits<float>::quiet_NaN());
        std::vector<double> sums(g.n, 0.0);
        for (int64_t i = 0; i < g.m; ++i) {
          for (int64_t j = 0; j < g.n; ++j) {
            const float value =
                product.Cpu()[i * ldc + j] * GeluTanhDerivative(wide_aux[i * ld_aux + j]);
            expected[i * ldc + j] = value;
            sums[j] += value;
          }
        }
        double atol = 1e-6 + 4e-6 * std::sqrt(static_cast<double>(g.k));
        if (reduced) {
          atol += Ulp<T>() * std::sqrt(static_cast<double>(g.k));
          for (float& e : expected) e = std::isnan(e) ? e : static_cast<float>(T(e));
        }
        const double rtol = reduced ? 2 * Ulp<T>() : 1e-5;
        ExpectNear(expected, Widened(out.Gpu()), rtol, atol, what + " C");
        const std::vector<float> expected_sums(sums.begin(), sums.end());
        const std::vector<float> got_sums = float_bias_grad ? grad32.Gpu() : Widened(grad.Gpu());
        ExpectNear(float_bias_grad || !reduced ? expected_sums : Widened(Rounded<T>(expected_sums)),
                   got_sums, reduced && !float_bias_grad ? Ulp<T>() : 1e-5, atol * g.m,
                   what + " bias gradient");
      }
    }
  }
}

template <typename T>
void CudaGemmEpilogueTest::ExpectEpiloguesMatch(bool float_output) {
  const DType dtype = DTypeOf<T>::value;
  const DType c_dtype = float_output ? kFloat32 : dtype;
  const bool reduced = !std::is_same_v<T, float>;
  for (const GemmCase& g : {GemmCase{1, 1, 1, 1}, GemmCase{7, 5, 3, 1}, GemmCase{33, 17, 65, 1},
                            GemmCase{64, 48, 256, 1}, GemmCase{20, 8, 9, 1}}) {
    for (bool trans_a : {false, true}) {
      for (bool trans_b : {false, true}) {
        for (Backend::GemmEpilogue kind :
             {Backend::GemmEpilogue::kBias, Backend::GemmEpilogue::kGeluTanhBias,
              Backend::GemmEpilogue::kBiasGradA}) {
          const std::string what =
              Note(DTypePrefix<T>() + "gemm epilogue " + std::to_string(static_cast<int>(kind)) +
                   " m=" + std::to_string(g.m) + " n=" + std::to_string(g.n) +
                   " k=" + std::to_string(g.k) + (trans_a ? " A^T" : "") + (trans_b ? " B^T" : "") +
                   (float_output ? " float output" : ""));
          const int64_t a_rows = trans_a ? g.k : g.m, a_cols = trans_a ? g.m : g.k;
          const int64_t b_rows = trans_b ? g.n : g.k, b_cols = trans_b ? g.k : g.n;
          // Padded rows, to test strides; the aux rows a multiple of 8 as cuBLASLt needs.
          const int64_t lda = a_cols + 3, ldb = b_cols + 1, ldc = g.n + 2;
          const int64_t ld_aux = (g.n + 7) / 8 * 8;
          std::vector<T> a_values, b_values, bias_values;
          if constexpr (std::is_same_v<T, float>) {
            a_values = Random<float>(a_rows * lda, -1.0, 1.0);
            b_values = Random<float>(b_rows * ldb, -1.0, 1.0);
            bias_values = Random<float>(g.n, -1.0, 1.0);
          } else {
            a_values = RandomReduced<T>(a_rows * lda, -1.0, 1.0);
            b_values = RandomReduced<T>(b_rows * ldb, -1.0, 1.0);
            bias_values = RandomReduced<T>(g.n, -1.0, 1.0);
          }
          Buffer<T> a(a_values), b(b_values);
          const std::vector<float> wa = Widened(a_values), wb = Widened(b_values);
          Buffer<float> wide_a(wa), wide_b(wb), product(g.m * ldc);
          cpu_.Gemm(0, kFloat32, trans_a, trans_b, g.m, g.n, g.k, 1.0, wide_a.cpu(), lda, 0,
                    wide_b.cpu(), ldb, 0, 0.0, product.cpu(), ldc, 0, 1);
          // The bias (and its gradient) is in C's dtype.
          std::vector<float> bias_float = Widened(bias_values);
          Buffer<float> bias32(bias_float), grad32(g.m), out32(g.m * ldc);
          Buffer<T> bias16(bias_values), grad16(g.m), out16(g.m * ldc), aux16(g.m * ld_aux);
          Buffer<float> aux32(g.m * ld_aux);
          const bool f32c = float_output || !reduced;
          Backend::GemmEpilogueArgs epilogue;
          epilogue.kind = kind;
          epilogue.bias = f32c ? static_cast<void*>(bias32.gpu()) : bias16.gpu();
          epilogue.bias_grad = f32c ? static_cast<void*>(grad32.gpu()) : grad16.gpu();
          if (kind == Backend::GemmEpilogue::kGeluTanhBias) {
            epilogue.aux = f32c ? static_cast<void*>(aux32.gpu()) : aux16.gpu();
            epilogue.ld_aux = ld_aux;
          }
          ASSERT_TRUE(gpu_.GemmWithEpilogue(
              0, dtype, c_dtype, trans_a, trans_b, g.m, g.n, g.k, a.gpu(), lda, b.gpu(), ldb,
              f32c ? static_cast<void*>(out32.gpu()) : out16.gpu(), ldc, epilogue))
              << what;
          // Expected C (and aux), NaN in the padding that must stay unwritten.
          std::vector<float> expected(g.m * ldc, std::numeric_limits<float>::quiet_NaN());
          std::vector<float> expected_aux(g.m * ld_aux, std::numeric_limits<float>::quiet_NaN());
          double atol = 1e-6 + 2e-6 * std::sqrt(static_cast<double>(g.k));
          for (int64_t i = 0; i < g.m; ++i) {
            for (int64_t j = 0; j < g.n; ++j) {
              float pre = product.Cpu()[i * ldc + j];
              if (kind != Backend::GemmEpilogue::kBiasGradA) pre += bias_float[j];
              if (!f32c) pre = static_cast<float>(T(pre));
              expected_aux[i * ld_aux + j] = pre;
              const float pre_exact =
                  product.Cpu()[i * ldc + j] +
                  (kind != Backend::GemmEpilogue::kBiasGradA ? bias_float[j] : 0.0f);
              expected[i * ldc + j] =
                  kind == Backend::GemmEpilogue::kGeluTanhBias ? GeluTanh(pre_exact) : pre_exact;
            }
          }
          const double rtol =
              f32c ? Tolerance<float>::kGemmRtol + Tolerance<float>::kUnaryRtol : 2 * Ulp<T>();
          if (!f32c) atol += Ulp<T>() * std::sqrt(static_cast<double>(g.k));
          std::vector<float> got = f32c ? out32.Gpu() : Widened(out16.Gpu());
          if (!f32c) {
            for (float& e : expected) e = std::isnan(e) ? e : static_cast<float>(T(e));
          }
          ExpectNear(expected, got, rtol, atol, what + " C");
          if (kind == Backend::GemmEpilogue::kGeluTanhBias) {
            std::vector<float> aux = f32c ? aux32.Gpu() : Widened(aux16.Gpu());
            ExpectNear(expected_aux, aux, rtol, atol, what + " aux");
          }
          if (kind == Backend::GemmEpilogue::kBiasGradA) {
            std::vector<float> sums(g.m);
            for (int64_t i = 0; i < g.m; ++i) {
              double sum = 0.0;
              for (int64_t p = 0; p < g.k; ++p) sum += wa[trans_a ? p * lda + i : i * lda + p];
              sums[i] = static_cast<float>(sum);
            }
            const std::vector<float> grad = f32c ? grad32.Gpu() : Widened(grad16.Gpu());
            ExpectNear(f32c ? sums : Widened(Rounded<T>(sums)), grad, f32c ? 1e-6 : Ulp<T>(),
                       1e-6 * g.k, what + " bias gradient");
          }
        }
      }
    }
  }
}

TEST_F(CudaGemmEpilogueTest, Float32) { ExpectEpiloguesMatch<float>(false); }
TEST_F(CudaGemmEpilogueTest, BFloat16) { ExpectEpiloguesMatch<BFloat16>(false); }
TEST_F(CudaGemmEpilogueTest, Float16) { ExpectEpiloguesMatch<Half>(false); }
TEST_F(CudaGemmEpilogueTest, BFloat16IntoFloat32) { ExpectEpiloguesMatch<BFloat16>(true); }
TEST_F(CudaGemmEpilogueTest, Float16IntoFloat32) { ExpectEpiloguesMatch<Half>(true); }
TEST_F(CudaGemmEpilogueTest, GeluGradientFloat32) { ExpectGeluGradientMatches<float>(false); }
TEST_F(CudaGemmEpilogueTest, GeluGradientBFloat16) { ExpectGeluGradientMatches<BFloat16>(false); }
TEST_F(CudaGemmEpilogueTest, GeluGradientFloat16) { ExpectGeluGradientMatches<Half>(false); }
TEST_F(CudaGemmEpilogueTest, GeluGradientBFloat16WithFloatBiasGradient) {
  ExpectGeluGradientMatches<BFloat16>(true);
}

// What cuBLASLt does not take is declined, nothing written, for the caller to compose:
// float64 (legacy cuBLAS's DGEMM), an aux row stride cuBLASLt refuses, an empty sum.
TEST_F(CudaGemmEpilogueTest, DeclinesFloat64OddAuxRowsAndEmptySums) {
  Buffer<double> ad(std::vector<double>{1.0, 2.0}), bd(std::vector<double>{3.0, 4.0});
  Buffer<double> cd(1), bias_d(std::vector<double>{0.5});
  Backend::GemmEpilogueArgs epilogue;
  epilogue.bias = bias_d.gpu();
  EXPECT_FALSE(gpu_.GemmWithEpilogue(0, kFloat64, kFloat64, false, false, 1, 1, 2, ad.gpu(), 2,
                                     bd.gpu(), 1, cd.gpu(), 1, epilogue));
  EXPECT_TRUE(std::isnan(cd.Gpu()[0]));
  Buffer<float> a(Random<float>(6)), b(Random<float>(6)), c(9), bias(Random<float>(3)), aux(9);
  epilogue.kind = Backend::GemmEpilogue::kGeluTanhBias;
  epilogue.bias = bias.gpu();
  epilogue.aux = aux.gpu();
  epilogue.ld_aux = 3;  // cuBLASLt wants a multiple of 8
  EXPECT_FALSE(gpu_.GemmWithEpilogue(0, kFloat32, kFloat32, false, false, 3, 3, 2, a.gpu(), 2,
                                     b.gpu(), 3, c.gpu(), 3, epilogue));
  epilogue.aux = nullptr;
  EXPECT_FALSE(gpu_.GemmWithEpilogue(0, kFloat32, kFloat32, false, false, 3, 3, 0, a.gpu(), 2,
                                     b.gpu(), 3, c.gpu(), 3, epilogue));
  for (float x : c.Gpu()) EXPECT_TRUE(std::isnan(x)) << "a declined epilogue GEMM wrote C";
  // A row stride shorter than the row: the CPU's error, as Gemm's.
  EXPECT_THROW(gpu_.GemmWithEpilogue(0, kFloat32, kFloat32, false, false, 3, 3, 2, a.gpu(), 1,
                                     b.gpu(), 3, c.gpu(), 3, epilogue),
               Error);
}

// TF32 (cuda::AllowTf32) switches the float32 matmul to CUBLAS_COMPUTE_32F_FAST_TF32: within
// TF32's rounding of the CPU's float32 result (10 mantissa bits per operand: each product off
// by at most 2^-10 relative), and visibly less precise than with the switch off.
TEST_F(CudaGemmEpilogueTest, Tf32SwitchAppliesToTheEpilogueMatmul) {
  const int64_t m = 64, n = 96, k = 512;
  Buffer<float> a(Random<float>(m * k, -1.0, 1.0)), b(Random<float>(k * n, -1.0, 1.0));
  Buffer<float> bias(Random<float>(n, -1.0, 1.0)), c(m * n);
  cpu_.Gemm(0, kFloat32, false, false, m, n, k, 1.0, a.cpu(), k, 0, b.cpu(), n, 0, 0.0, c.cpu(), n,
            0, 1);
  Backend::GemmEpilogueArgs epilogue;
  epilogue.bias = bias.gpu();
  const auto run = [&](bool tf32) {
    cuda::SetAllowTf32(tf32);
    EXPECT_TRUE(gpu_.GemmWithEpilogue(0, kFloat32, kFloat32, false, false, m, n, k, a.gpu(), k,
                                      b.gpu(), n, c.gpu(), n, epilogue));
    cuda::SetAllowTf32(false);
    return c.Gpu();
  };
  ASSERT_FALSE(cuda::AllowTf32());
  const std::vector<float> fp32 = run(false), tf32 = run(true);
  double fp32_error = 0.0, tf32_error = 0.0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double abs_sum = 0.0;
      for (int64_t p = 0; p < k; ++p) abs_sum += std::fabs(a.Cpu()[i * k + p] * b.Cpu()[p * n + j]);
      const double expected = static_cast<double>(c.Cpu()[i * n + j]) + bias.Cpu()[j];
      const double e32 = std::fabs(fp32[i * n + j] - expected);
      const double etf = std::fabs(tf32[i * n + j] - expected);
      fp32_error = std::max(fp32_error, e32);
      tf32_error = std::max(tf32_error, etf);
      EXPECT_LE(etf, std::ldexp(1.0, -9) * abs_sum + 1e-5)
          << Note("TF32 element " + std::to_string(i * n + j));
    }
  }
  EXPECT_LT(fp32_error, 1e-4) << Note("float32 epilogue matmul");
  EXPECT_GT(tf32_error, fp32_error) << Note("allowing TF32 changed nothing");
}

// ---- linear and linear_gelu on CUDA against the CPU ---------------------------------------------

struct LinearCase {
  int64_t rows, in, out;
  bool transposed_x;  // x a transposed view (column-major rows): the GEMM reads it in place
};

class CudaLinearTest : public CudaBackendTest {
 protected:
  // y = f(x W^T + b) on cuda:0 and the CPU, and the gradients of sum(y * r), compared.
  void ExpectLinearMatches(DType dtype, bool with_gelu, const LinearCase& c) {
    const std::string what =
        Note(std::string(with_gelu ? "linear_gelu " : "linear ") + DTypeName(dtype) +
             " rows=" + std::to_string(c.rows) + " in=" + std::to_string(c.in) +
             " out=" + std::to_string(c.out) + (c.transposed_x ? " x^T" : ""));
    Tensor x0 = c.transposed_x ? randn({c.in, c.rows}).t() : randn({c.rows, c.in});
    const Tensor w0 = randn({c.out, c.in}) * (1.0 / std::sqrt(static_cast<double>(c.in)));
    const Tensor b0 = randn({c.out}), r0 = randn({c.rows, c.out});
    std::vector<std::vector<float>> results[2];
    for (int device = 0; device < 2; ++device) {
      const Device where = device == 0 ? Device::Cpu(0) : Device::Cuda(0);
      const auto leaf = [&](const Tensor& t) {
        Tensor v = t.to(dtype).to(where).detach();
        v.set_requires_grad(true);
        return v;
      };
      // The transposed view kept on both devices (to() of a view copies it contiguous).
      Tensor x = c.transposed_x ? leaf(x0.t().contiguous()) : leaf(x0);
      Tensor w = leaf(w0), b = leaf(b0);
      const Tensor x_used = c.transposed_x ? x.t() : x;
      const Tensor y = with_gelu ? linear_gelu(x_used, w, b, "tanh") : linear(x_used, w, b);
      (y * r0.to(dtype).to(where)).sum().backward();
      for (const Tensor& t : {y, x.grad(), w.grad(), b.grad()}) {
        results[device].push_back(t.to(Device::Cpu(0)).to(kFloat32).to_vector<float>());
      }
    }
    const double ulp = dtype == kBFloat16 ? 1.0 / 128 : dtype == kFloat16 ? 1.0 / 1024 : 0.0;
    const double tol_scale = std::sqrt(static_cast<double>(std::max(c.in, c.rows)));
    const double rtol = dtype == kFloat64 ? 1e-12 : dtype == kFloat32 ? 2e-5 : 4 * ulp;
    const double atol = dtype == kFloat64   ? 1e-12
                        : dtype == kFloat32 ? 4e-6 * tol_scale
                                            : 4 * ulp * tol_scale;
    const char* names[] = {"y", "x.grad", "w.grad", "b.grad"};
    for (int i = 0; i < 4; ++i) {
      ExpectNear(results[0][i], results[1][i], rtol, atol, what + " " + names[i]);
    }
  }
};

TEST_F(CudaLinearTest, LinearAndLinearGeluMatchTheCpuInEveryDType) {
  for (DType dtype : {kFloat32, kBFloat16, kFloat16, kFloat64}) {
    for (bool with_gelu : {false, true}) {
      // out = 64: the fused GELU (aux rows a multiple of 8); out = 33: linear_gelu composed;
      // 1-row and 1-column products; a transposed x.
      for (const LinearCase& c :
           {LinearCase{16, 24, 64, false}, LinearCase{37, 19, 33, false},
            LinearCase{1, 5, 8, false}, LinearCase{9, 1, 16, true}, LinearCase{40, 32, 64, true}}) {
        ExpectLinearMatches(dtype, with_gelu, c);
      }
    }
  }
}

// A gradient penalty through linear_gelu: under create_graph the fused node's backward
// recomputes through gelu(linear(...)), so the second derivative on cuda:0 (fused forward)
// matches the CPU's (composed throughout).
TEST_F(CudaLinearTest, LinearGeluDifferentiatesTwice) {
  const Tensor x0 = randn({16, 24}), w0 = randn({64, 24}) * 0.2, b0 = randn({64}),
               r0 = randn({16, 64});
  std::vector<std::vector<float>> results[2];
  for (int device = 0; device < 2; ++device) {
    const Device where = device == 0 ? Device::Cpu(0) : Device::Cuda(0);
    const auto leaf = [&](const Tensor& t) {
      Tensor v = t.to(where).detach();
      v.set_requires_grad(true);
      return v;
    };
    Tensor x = leaf(x0), w = leaf(w0), b = leaf(b0);
    const Tensor y = linear_gelu(x, w, b, "tanh");
    const Tensor g = autograd::grad({(y * r0.to(where)).sum()}, {x}, {}, /*create_graph=*/true)[0];
    (g * g).sum().backward();
    for (const Tensor& t : {g, x.grad(), w.grad(), b.grad()}) {
      results[device].push_back(t.to(Device::Cpu(0)).to_vector<float>());
    }
  }
  const char* names[] = {"g", "x.grad", "w.grad", "b.grad"};
  for (int i = 0; i < 4; ++i) {
    ExpectNear(results[0][i], results[1][i], 1e-4, 1e-4, std::string("linear_gelu ") + names[i]);
  }
}

// Under the simulator the fused paths are counted: a linear's forward is one cuBLASLt matmul (no
// broadcast copy of the bias), linear_gelu's too (no GELU kernel), and the backward reduces no
// bias gradient apart (BGRADB in the weight gradient's matmul).
TEST_F(CudaLinearTest, BiasGeluAndBiasGradientAreFusedIntoTheGemm) {
  Tensor x = randn({32, 48}, Device::Cuda(0)).detach();
  x.set_requires_grad(true);
  Tensor w = randn({64, 48}, Device::Cuda(0)).detach(), b = randn({64}, Device::Cuda(0)).detach();
  w.set_requires_grad(true);
  b.set_requires_grad(true);
  cuda::Synchronize(0);
  for (bool with_gelu : {false, true}) {
    ResetDeviceCounters();
    const Tensor y = with_gelu ? linear_gelu(x, w, b, "tanh") : linear(x, w, b);
    const DeviceCounters forward = ReadDeviceCounters();
    if (!forward.counted) GTEST_SKIP() << "launches are counted under cudasim only";
    ASSERT_EQ(forward.kernels.size(), 1u) << Note(with_gelu ? "linear_gelu" : "linear");
    EXPECT_EQ(forward.kernels[0].name, "cublasLtMatmul");
    EXPECT_EQ(forward.launches, 1);
    // Its work, counted for the roofline: 2 m n k FLOPs; x, W and y, the bias, and under
    // autograd the GELU's pre-activation, each once.
    EXPECT_TRUE(forward.kernels[0].work_counted);
    EXPECT_EQ(forward.kernels[0].math, "fp32");
    EXPECT_DOUBLE_EQ(forward.kernels[0].flops, 2.0 * 32 * 64 * 48);
    EXPECT_DOUBLE_EQ(forward.kernels[0].bytes,
                     4.0 * (32 * 48 + 48 * 64 + 32 * 64 + 64 + (with_gelu ? 32 * 64 : 0)));
    const Tensor g = randn({32, 64}, Device::Cuda(0));
    ResetDeviceCounters();
    y.backward(g);
    cuda::Synchronize(0);
    long long lt = 0;
    for (const KernelLaunches& k : ReadDeviceCounters().kernels) {
      if (k.name == "cublasLtMatmul") lt += k.launches;
      EXPECT_EQ(k.name.find("Reduce"), std::string::npos) << "a reduction in backward: " << k.name;
    }
    EXPECT_EQ(lt, 1) << "the weight gradient with its bias gradient (BGRADB)";
  }
}

// Autocast's float32-weight linear (Note [Autocast linear]) on cuda:0 in bfloat16 against the
// CPU's: the bias in the forward GEMM, and the weight gradient into float32 with the bias
// gradient summed in float beside it (BGRADB), where the CPU reduces the bias gradient in
// bfloat16 and converts it: within a bfloat16 ulp of each other. The 3-D input is the batch
// (no gradient: the float32 batch's own path) or an activation (with one).
TEST_F(CudaLinearTest, AutocastLinearMatchesTheCpu) {
  for (bool grad_x : {false, true}) {
    // Forward launches on cuda:0 (under cudasim): linear_gelu's equal linear's, the GELU
    // being in the GEMM's epilogue rather than a kernel of its own.
    long long forward_launches[2] = {-1, -1};
    for (bool with_gelu : {false, true}) {
      const Tensor x0 = randn({3, 10, 24}), w0 = randn({40, 24}) * 0.2, b0 = randn({40});
      const Tensor r0 = randn({3, 10, 40});
      std::vector<std::vector<float>> results[2];
      for (int device = 0; device < 2; ++device) {
        const Device where = device == 0 ? Device::Cpu(0) : Device::Cuda(0);
        Tensor x = x0.to(where).detach(), w = w0.to(where).detach(), b = b0.to(where).detach();
        x.set_requires_grad(grad_x);
        w.set_requires_grad(true);
        b.set_requires_grad(true);
        Tensor y;
        {
          AutocastGuard autocast(where.type(), kBFloat16);
          if (device == 1) {
            cuda::Synchronize(0);
            ResetDeviceCounters();
          }
          // linear_gelu: fused on cuda:0 (AutocastLinearGelu), composed on the CPU.
          y = with_gelu ? linear_gelu(x, w, b, "tanh") : linear(x, w, b);
          if (device == 1 && ReadDeviceCounters().counted) {
            forward_launches[with_gelu] = ReadDeviceCounters().launches;
          }
        }
        (y.to(kFloat32) * r0.to(where)).sum().backward();
        std::vector<Tensor> outputs = {y, w.grad(), b.grad()};
        if (grad_x) outputs.push_back(x.grad());
        for (const Tensor& t : outputs) {
          results[device].push_back(t.to(Device::Cpu(0)).to(kFloat32).to_vector<float>());
        }
      }
      const char* names[] = {"y", "w.grad", "b.grad", "x.grad"};
      for (size_t i = 0; i < results[0].size(); ++i) {
        ExpectNear(results[0][i], results[1][i], 4.0 / 128, 0.05,
                   Note(std::string(with_gelu ? "autocast linear_gelu " : "autocast linear ") +
                        names[i] + (grad_x ? " grad_x" : "")));
      }
    }
    EXPECT_EQ(forward_launches[1], forward_launches[0]) << Note("autocast linear_gelu fused");
  }
}

// ---- linear_gelu_linear (Note [Fused MLP]) on CUDA against the CPU -----------------------------

struct MlpCase {
  int64_t rows, in, hidden, out;
  bool proj_bias;
};

// y = linear_gelu_linear(x, ...) and the gradients of sum(y * r) for x and the four parameters on
// `where`, as float32 vectors; under autocast to bfloat16 when `autocast`.
std::vector<std::vector<float>> MlpResults(const Device& where, DType dtype, bool autocast,
                                           const MlpCase& c, bool create_graph = false) {
  manual_seed(11);
  const Tensor x0 = randn({2, c.rows, c.in});
  const Tensor w1 = randn({c.hidden, c.in}) * (1.0 / std::sqrt(static_cast<double>(c.in)));
  const Tensor b1 = randn({c.hidden});
  const Tensor w2 = randn({c.out, c.hidden}) * (1.0 / std::sqrt(static_cast<double>(c.hidden)));
  const Tensor b2 = randn({c.out}), r0 = randn({2, c.rows, c.out});
  const auto leaf = [&](const Tensor& t) {
    Tensor v = t.to(dtype).to(where).detach();
    v.set_requires_grad(true);
    return v;
  };
  std::vector<Tensor> params = {leaf(x0), leaf(w1), leaf(b1), leaf(w2)};
  if (c.proj_bias) params.push_back(leaf(b2));
  Tensor y;
  {
    AutocastGuard guard(where.type(), kBFloat16, /*enabled=*/autocast);
    y = linear_gelu_linear(params[0], params[1], params[2], params[3],
                           c.proj_bias ? params[4] : Tensor());
  }
  const Tensor loss = (y.to(dtype) * r0.to(dtype).to(where)).sum();
  std::vector<std::vector<float>> results = {y.to(Device::Cpu(0)).to(kFloat32).to_vector<float>()};
  if (create_graph) {
    // A gradient penalty: the gradient of x, then backward through it.
    const Tensor g = autograd::grad({loss}, {params[0]}, {}, /*create_graph=*/true)[0];
    (g * g).sum().backward();
    results.push_back(g.to(Device::Cpu(0)).to(kFloat32).to_vector<float>());
  } else {
    loss.backward();
  }
  for (const Tensor& p : params) {
    // Undefined where the result does not depend on it (proj's bias under the penalty).
    results.push_back(p.grad().defined()
                          ? p.grad().to(Device::Cpu(0)).to(kFloat32).to_vector<float>()
                          : std::vector<float>());
  }
  return results;
}

// The fused MLP on cuda:0 (hidden a multiple of 8: the GELU's aux rows as cuBLASLt takes them)
// and composed (hidden 20: linear_gelu composed, so the op too) against the CPU's composed ops, in
// every dtype, with and without proj's bias.
TEST_F(CudaLinearTest, LinearGeluLinearMatchesTheCpuInEveryDType) {
  for (DType dtype : {kFloat32, kBFloat16, kFloat16, kFloat64}) {
    for (const MlpCase& c :
         {MlpCase{8, 16, 64, 16, true}, MlpCase{5, 12, 32, 7, false}, MlpCase{3, 9, 20, 6, true}}) {
      const std::string what =
          Note(std::string("linear_gelu_linear ") + DTypeName(dtype) +
               " hidden=" + std::to_string(c.hidden) + (c.proj_bias ? "" : " no proj bias"));
      const auto cpu = MlpResults(Device::Cpu(0), dtype, false, c);
      const auto gpu = MlpResults(Device::Cuda(0), dtype, false, c);
      const double ulp = dtype == kBFloat16 ? 1.0 / 128 : dtype == kFloat16 ? 1.0 / 1024 : 0.0;
      const double rtol = dtype == kFloat64 ? 1e-12 : dtype == kFloat32 ? 2e-5 : 4 * ulp;
      const double atol = dtype == kFloat64 ? 1e-12 : dtype == kFloat32 ? 4e-5 : 16 * ulp;
      const char* names[] = {
          "y", "x.grad", "fc_weight.grad", "fc_bias.grad", "proj_weight.grad", "proj_bias.grad"};
      ASSERT_EQ(cpu.size(), gpu.size());
      for (size_t i = 0; i < cpu.size(); ++i)
        ExpectNear(cpu[i], gpu[i], rtol, atol, what + names[i]);
    }
  }
}

// Under autocast (float32 parameters, bfloat16 GEMMs) the fused node's gradients, the parameters'
// in float32, against the CPU's composed autocast ops: within bfloat16's rounding.
TEST_F(CudaLinearTest, AutocastLinearGeluLinearMatchesTheCpu) {
  const MlpCase c{8, 16, 64, 16, true};
  const auto cpu = MlpResults(Device::Cpu(0), kFloat32, true, c);
  const auto gpu = MlpResults(Device::Cuda(0), kFloat32, true, c);
  const char* names[] = {
      "y", "x.grad", "fc_weight.grad", "fc_bias.grad", "proj_weight.grad", "proj_bias.grad"};
  for (size_t i = 0; i < cpu.size(); ++i) {
    ExpectNear(cpu[i], gpu[i], 4.0 / 128, 0.05, Note(std::string("autocast MLP ") + names[i]));
  }
}

// A gradient penalty through the fused MLP: under create_graph its backward recomputes through
// the composed ops, so cuda:0 matches the CPU to second order.
TEST_F(CudaLinearTest, LinearGeluLinearDifferentiatesTwice) {
  const MlpCase c{8, 16, 64, 16, true};
  const auto cpu = MlpResults(Device::Cpu(0), kFloat32, false, c, /*create_graph=*/true);
  const auto gpu = MlpResults(Device::Cuda(0), kFloat32, false, c, /*create_graph=*/true);
  for (size_t i = 0; i < cpu.size(); ++i) {
    ExpectNear(cpu[i], gpu[i], 1e-4, 1e-4,
               Note("MLP gradient penalty, result " + std::to_string(i)));
  }
}

// Counted under the simulator: the fused MLP's forward is two cuBLASLt matmuls and its backward
// four GEMMs and nothing else (no GELU gradient pass, no bias reduction).
TEST_F(CudaLinearTest, LinearGeluLinearBackwardIsFourGemms) {
  Tensor x = randn({32, 48}, Device::Cuda(0)).detach();
  x.set_requires_grad(true);
  std::vector<Tensor> params = {randn({64, 48}, Device::Cuda(0)), randn({64}, Device::Cuda(0)),
                                randn({48, 64}, Device::Cuda(0)), randn({48}, Device::Cuda(0))};
  for (Tensor& p : params) p = p.detach().set_requires_grad(true);
  cuda::Synchronize(0);
  ResetDeviceCounters();
  const Tensor y = linear_gelu_linear(x, params[0], params[1], params[2], params[3]);
  const DeviceCounters forward = ReadDeviceCounters();
  if (!forward.counted) GTEST_SKIP() << "launches are counted under cudasim only";
  EXPECT_EQ(forward.launches, 2);
  const Tensor g = randn({32, 48}, Device::Cuda(0));
  cuda::Synchronize(0);
  ResetDeviceCounters();
  y.backward(g);
  cuda::Synchronize(0);
  const DeviceCounters backward = ReadDeviceCounters();
  EXPECT_EQ(backward.launches, 4);
  for (const KernelLaunches& k : backward.kernels) {
    EXPECT_EQ(k.name.rfind("cublas", 0), 0u)
        << "a kernel other than a GEMM in backward: " << k.name;
  }
}

// Note [Autocast cross-entropy] on cuda:0: bfloat16 logits are read by the fused kernels
// themselves, one launch fewer each way than casting them to float32 first, and the loss and the
// logits' gradient are the cast path's to the bit.
TEST_F(CudaLinearTest, AutocastCrossEntropyReadsSixteenBitLogits) {
  manual_seed(3);
  const Tensor x0 = (randn({33, 1000}) * 4.0).to(kBFloat16).to(Device::Cuda(0));
  std::vector<int64_t> classes(33);
  for (size_t i = 0; i < classes.size(); ++i) classes[i] = static_cast<int64_t>(i * 37 % 1000);
  const Tensor labels = from_vector(classes, {33}, Device::Cuda(0));
  std::vector<float> losses[2], grads[2];
  long long launches[2][2] = {{-1, -1}, {-1, -1}};  // [cast first][forward, backward]
  for (int cast_first = 0; cast_first < 2; ++cast_first) {
    Tensor x = x0.detach();
    x.set_requires_grad(true);
    cuda::Synchronize(0);
    ResetDeviceCounters();
    Tensor loss;
    {
      AutocastGuard autocast(DeviceType::kCUDA, kBFloat16);
      loss = cross_entropy(cast_first ? x.to(kFloat32) : x, labels);
    }
    launches[cast_first][0] = ReadDeviceCounters().launches;
    ResetDeviceCounters();
    loss.backward();
    cuda::Synchronize(0);
    launches[cast_first][1] = ReadDeviceCounters().launches;
    EXPECT_EQ(loss.dtype(), kFloat32);
    EXPECT_EQ(x.grad().dtype(), kBFloat16);
    losses[cast_first] = loss.to(Device::Cpu(0)).to_vector<float>();
    grads[cast_first] = x.grad().to(Device::Cpu(0)).to(kFloat32).to_vector<float>();
  }
  EXPECT_EQ(losses[0], losses[1]);
  EXPECT_EQ(grads[0], grads[1]);
  if (ReadDeviceCounters().counted) {
    EXPECT_EQ(launches[0][0], launches[1][0] - 1) << "forward: no cast of the logits";
    EXPECT_EQ(launches[0][1], launches[1][1] - 1) << "backward: no cast of their gradient";
  }
}

// The elementwise kernels declare their work at launch (DeclareKernelWork): each stored element
// once, a broadcast operand's once.
TEST_F(CudaLinearTest, ElementwiseKernelsDeclareTheirBytes) {
  const Tensor a = randn({64, 32}, Device::Cuda(0)), b = randn({32}, Device::Cuda(0));
  cuda::Synchronize(0);
  ResetDeviceCounters();
  const Tensor c = a + b;
  const DeviceCounters counted = ReadDeviceCounters();
  if (!counted.counted) GTEST_SKIP() << "work is counted under cudasim only";
  ASSERT_EQ(counted.kernels.size(), 1u);
  EXPECT_TRUE(counted.kernels[0].work_counted);
  EXPECT_DOUBLE_EQ(counted.kernels[0].bytes, 4.0 * (64 * 32 * 2 + 32));
  EXPECT_DOUBLE_EQ(counted.kernels[0].flops, 64.0 * 32);
}

}  // namespace cuda_test
}  // namespace tandem
