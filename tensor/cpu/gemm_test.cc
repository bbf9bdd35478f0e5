// Tests of the CPU backend's GEMM (OpenBLAS, oneDNN for the 16-bit floats) against a naive
// reference: every transposition, batches, degenerate sizes, and products split over threads.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/base/device.h"
#include "tensor/base/error.h"
#include "tensor/base/half.h"
#include "tensor/base/philox.h"
#include "tensor/cpu/cpu_backend_testing.h"
#include "tensor/kernels/float_conversions.h"
#include "tensor/kernels/internal/elementwise_math.h"
#include "tensor/kernels/vectorized.h"
#include "tensor/runtime/backend.h"
#include "tensor/runtime/devices.h"

namespace tandem {
namespace {

using namespace ::tandem::cpu_backend_testing;  // NOLINT(build/namespaces)

TYPED_TEST_SUITE(ReducedFloatTest, ReducedFloatTypes);

// ---- GEMM --------------------------------------------------------------------------------

struct GemmCase {
  bool trans_a, trans_b;
  int64_t m, n, k, batch;
  float alpha, beta;
  bool share_a;  // stride_a = 0: one A for the whole batch
};

void CheckGemm(const GemmCase& c) {
  SCOPED_TRACE("trans_a=" + std::to_string(c.trans_a) + " trans_b=" + std::to_string(c.trans_b) +
               " m=" + std::to_string(c.m) + " n=" + std::to_string(c.n) +
               " k=" + std::to_string(c.k) + " batch=" + std::to_string(c.batch));
  // Stored shapes, with padded rows (ld > row length) to check that ld is honoured.
  const int64_t a_rows = c.trans_a ? c.k : c.m, a_cols = c.trans_a ? c.m : c.k;
  const int64_t b_rows = c.trans_b ? c.n : c.k, b_cols = c.trans_b ? c.k : c.n;
  const int64_t lda = a_cols + 3, ldb = b_cols + 1, ldc = c.n + 2;
  const int64_t stride_a = c.share_a ? 0 : a_rows * lda, stride_b = b_rows * ldb;
  const int64_t stride_c = c.m * ldc;
  std::vector<float> a = RandomFloats(std::max<int64_t>(1, c.batch * a_rows * lda), -1, 1, 15);
  std::vector<float> b = RandomFloats(std::max<int64_t>(1, c.batch * stride_b), -1, 1, 16);
  std::vector<float> cm = RandomFloats(std::max<int64_t>(1, c.batch * stride_c), -1, 1, 17);
  std::vector<float> expected = cm;
  for (int64_t p = 0; p < c.batch; ++p) {
    for (int64_t i = 0; i < c.m; ++i) {
      for (int64_t j = 0; j < c.n; ++j) {
        double sum = 0;
        for (int64_t l = 0; l < c.k; ++l) {
          const float av =
              c.trans_a ? a[p * stride_a + l * lda + i] : a[p * stride_a + i * lda + l];
          const float bv =
              c.trans_b ? b[p * stride_b + j * ldb + l] : b[p * stride_b + l * ldb + j];
          sum += static_cast<double>(av) * bv;
        }
        float& out = expected[p * stride_c + i * ldc + j];
        out = static_cast<float>(c.alpha * sum + (c.beta == 0 ? 0.0 : c.beta * out));
      }
    }
  }
  Cpu().Gemm(0, kFloat32, c.trans_a, c.trans_b, c.m, c.n, c.k, c.alpha, a.data(), lda, stride_a,
             b.data(), ldb, stride_b, c.beta, cm.data(), ldc, stride_c, c.batch);
  for (size_t i = 0; i < cm.size(); ++i) {
    const bool padding = c.n == 0 || static_cast<int64_t>(i % ldc) >= c.n;
    if (padding) {
      ASSERT_EQ(cm[i], expected[i]) << "padding at " << i << " was written";
    } else {
      ASSERT_NEAR(cm[i], expected[i], 1e-4 * (1 + std::sqrt(static_cast<double>(c.k))))
          << "at " << i;
    }
  }
}

TEST(CpuBackendTest, GemmAllTranspositions) {
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      CheckGemm({ta, tb, 37, 53, 29, 1, 1.0f, 0.0f, false});
      CheckGemm({ta, tb, 13, 7, 61, 1, -0.5f, 2.0f, false});
      CheckGemm({ta, tb, 1, 9, 5, 1, 1.0f, 1.0f, false});
      CheckGemm({ta, tb, 9, 1, 5, 1, 1.0f, 0.0f, false});
    }
  }
}

TEST(CpuBackendTest, GemmLargeProductsAreSplitAcrossThreads) {
  WithEachThreadCount([] {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        CheckGemm({ta, tb, 301, 67, 130, 1, 1.0f, 0.5f, false});  // split over M
        CheckGemm({ta, tb, 21, 403, 97, 1, 2.0f, 0.0f, false});   // split over N
      }
    }
  });
}

TEST(CpuBackendTest, GemmBatched) {
  WithEachThreadCount([] {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        CheckGemm({ta, tb, 11, 6, 9, 23, 1.0f, 0.0f, false});
        CheckGemm({ta, tb, 11, 6, 9, 23, 0.5f, 1.0f, true});  // one A for all (stride 0)
        CheckGemm({ta, tb, 40, 50, 60, 5, 1.0f, 0.0f, false});
        // Large products, fewer than (or not a multiple of) the threads: products are cut.
        CheckGemm({ta, tb, 150, 40, 200, 3, 1.0f, 0.5f, false});
        CheckGemm({ta, tb, 20, 170, 200, 3, 1.0f, 0.0f, true});
      }
    }
  });
}

TEST(CpuBackendTest, GemmDegenerateSizes) {
  CheckGemm({false, false, 5, 4, 0, 1, 1.0f, 3.0f, false});  // k = 0: C = beta * C
  CheckGemm({true, false, 5, 4, 0, 2, 1.0f, 0.0f, false});
  CheckGemm({false, false, 0, 4, 3, 1, 1.0f, 0.0f, false});
  CheckGemm({false, true, 4, 0, 3, 1, 1.0f, 0.0f, false});
  CheckGemm({false, false, 4, 5, 3, 0, 1.0f, 0.0f, false});
  CheckGemm({false, false, 3, 3, 3, 1, 0.0f, 2.0f, false});  // alpha = 0
  // beta = 0 overwrites C even where it holds NaN.
  std::vector<float> a(4, 1.0f), b(4, 1.0f), c(4, kNaN);
  Cpu().Gemm(0, kFloat32, false, false, 2, 2, 2, 1.0f, a.data(), 2, 0, b.data(), 2, 0, 0.0f,
             c.data(), 2, 0, 1);
  EXPECT_EQ(c, std::vector<float>(4, 2.0f));
  // A single row or column with a tight leading dimension (what a [1, k] view gives).
  std::vector<float> row = {1, 2, 3}, col = {4, 5, 6};
  float dot = 0;
  Cpu().Gemm(0, kFloat32, false, false, 1, 1, 3, 1.0f, row.data(), 0, 0, col.data(), 1, 0, 0.0f,
             &dot, 0, 0, 1);
  EXPECT_EQ(dot, 32.0f);
  // Overlapping rows cannot go to BLAS.
  EXPECT_THROW(Cpu().Gemm(0, kFloat32, false, false, 2, 2, 2, 1.0f, a.data(), 1, 0, b.data(), 2, 0,
                          0.0f, c.data(), 2, 0, 1),
               Error);
  EXPECT_THROW(Cpu().Gemm(0, kFloat32, false, false, 2, 2, 2, 1.0f, a.data(), 2, 0, b.data(), 2, 0,
                          0.0f, c.data(), 2, 0, 3),
               Error);  // a batch writing one C
}

TYPED_TEST(ReducedFloatTest, GemmMatchesFloat32WithinTolerance) {
  using T = TypeParam;
  const DType dtype = DTypeOf<T>::value;
  for (bool trans_a : {false, true}) {
    for (bool trans_b : {false, true}) {
      const int64_t m = 33, n = 47, k = 129, batch = 3;
      std::vector<T> a = Rounded<T>(RandomFloats(batch * m * k, -1, 1, 71));
      std::vector<T> b = Rounded<T>(RandomFloats(k * n, -1, 1, 72));  // shared (stride 0)
      std::vector<T> c = Rounded<T>(RandomFloats(batch * m * n, -1, 1, 73));
      std::vector<float> a32 = Widened(a), b32 = Widened(b), c32 = Widened(c);
      const int64_t lda = trans_a ? m : k, ldb = trans_b ? k : n;
      for (double beta : {0.0, 0.5}) {
        std::vector<float> expected = c32;
        std::vector<T> out = c;
        Cpu().Gemm(0, kFloat32, trans_a, trans_b, m, n, k, 1.5, a32.data(), lda, m * k, b32.data(),
                   ldb, 0, beta, expected.data(), n, m * n, batch);
        Cpu().Gemm(0, dtype, trans_a, trans_b, m, n, k, 1.5, a.data(), lda, m * k, b.data(), ldb, 0,
                   beta, out.data(), n, m * n, batch);
        // The float GEMM of the same values, rounded once; oneDNN (bfloat16) sums the products
        // in its own order, so a result may be the other neighbour of the float sum, or off by
        // float32's order-dependent error near a cancellation.
        const float ulp = std::is_same_v<T, BFloat16> ? 0x1p-7f : 0x1p-10f;
        for (size_t i = 0; i < out.size(); ++i) {
          ASSERT_NEAR(static_cast<float>(out[i]), expected[i], ulp * std::fabs(expected[i]) + 1e-5f)
              << i;
        }
      }
    }
  }
  // A C with a row stride wider than n keeps the elements between rows.
  std::vector<T> a = {T(1.0f), T(2.0f)}, b = {T(3.0f), T(4.0f)}, c(6, T(9.0f));
  Cpu().Gemm(0, dtype, false, false, 2, 1, 1, 1.0, a.data(), 1, 0, b.data(), 1, 0, 0.0, c.data(), 3,
             0, 1);
  EXPECT_EQ(static_cast<float>(c[0]), 3.0f);
  EXPECT_EQ(static_cast<float>(c[1]), 9.0f);
  EXPECT_EQ(static_cast<float>(c[3]), 6.0f);
}

}  // namespace
}  // namespace tandem
