// Tests of the CPU backend's reductions (Reduce) and Softmax against references in double, on
// rows and columns long enough to be split over the device's threads.
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
#include "tensor/kernels/softmax_kernels.h"
#include "tensor/kernels/vectorized.h"
#include "tensor/runtime/backend.h"
#include "tensor/runtime/devices.h"

namespace tandem {
namespace {

using namespace ::tandem::cpu_backend_testing;  // NOLINT(build/namespaces)

TYPED_TEST_SUITE(ReducedFloatTest, ReducedFloatTypes);

// ---- Reduce ------------------------------------------------------------------------------

// Reference reduction in double (sum) or by the definition (first index on ties, NaN wins).
template <typename T>
std::vector<double> ReferenceReduce(ReduceKind op, const std::vector<T>& x, int64_t outer,
                                    int64_t reduce, int64_t inner) {
  std::vector<double> out(outer * inner);
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t j = 0; j < inner; ++j) {
      auto at = [&](int64_t r) { return x[(o * reduce + r) * inner + j]; };
      if (op == ReduceKind::kSum) {
        double sum = 0;
        for (int64_t r = 0; r < reduce; ++r) sum += static_cast<double>(at(r));
        out[o * inner + j] = sum;
        continue;
      }
      const bool want_max = OpFlags(op) & kOpMax;
      int64_t best = 0;
      for (int64_t r = 1; r < reduce; ++r) {
        const T v = at(r), b = at(best);
        if constexpr (std::is_floating_point_v<T>) {
          if (std::isnan(b)) break;
          if (std::isnan(v)) {
            best = r;
            break;
          }
        }
        if (want_max ? v > b : v < b) best = r;
      }
      const bool arg = IsArgReduction(op);
      out[o * inner + j] = arg ? static_cast<double>(best) : static_cast<double>(at(best));
    }
  }
  return out;
}

// Every row of TANDEM_FORALL_REDUCE_KINDS in every dtype, over rows (one long enough to be
// split into blocks) and columns, against the reduction in double; NaN in the floating types.
template <typename T>
void CheckReduceAgainstDouble(ReduceKind op) {
  const bool floating = IsFloatingPoint(DTypeOf<T>::value);
  for (auto [outer, reduce, inner] :
       {std::array<int64_t, 3>{3, 1001, 1}, std::array<int64_t, 3>{2, 70001, 1},
        std::array<int64_t, 3>{4, 37, 65}}) {
    SCOPED_TRACE(std::to_string(outer) + "x" + std::to_string(reduce) + "x" +
                 std::to_string(inner));
    const int64_t n = outer * reduce * inner;
    std::unique_ptr<T[]> x = RandomOf<T>(n, -4.0, 4.0, 24);
    std::vector<double> wide(n);
    for (int64_t i = 0; i < n; ++i) {
      // A coarse grid, so that max and min have exact ties.
      if (floating) x[i] = FromDouble<T>(std::round(ToDouble(x[i]) * 4) / 4);
      wide[i] = ToDouble(x[i]);
    }
    if (floating) x[2 * inner] = FromDouble<T>(NAN), wide[2 * inner] = NAN;
    const std::vector<double> expected = ReferenceReduce(op, wide, outer, reduce, inner);
    auto values = std::make_unique<T[]>(outer * inner);
    std::vector<int64_t> indices(outer * inner, -1);
    const bool arg = IsArgReduction(op);
    Cpu().Reduce(0, op,
                 arg ? View(indices.data(), {outer, inner}) : View(values.get(), {outer, inner}),
                 View(x.get(), {n}), outer, reduce, inner);
    for (int64_t i = 0; i < outer * inner; ++i) {
      if (arg) {
        ASSERT_EQ(indices[i], static_cast<int64_t>(expected[i])) << "at " << i;
      } else {
        ASSERT_TRUE(NearOracle(StoredAs<T>(expected[i]), values[i])) << "at " << i;
      }
    }
  }
}

TEST(CpuBackendTest, EveryReductionInEveryDTypeMatchesTheDoubleMath) {
  WithEachThreadCount([] {
    for (ReduceKind op : AllReduceKinds()) {
      SCOPED_TRACE(std::string("reduction ") + OpName(op));
      ForEachDType([&](auto tag) { CheckReduceAgainstDouble<typename decltype(tag)::type>(op); });
    }
  });
}

TEST(CpuBackendTest, ReducesFloatRowsAndColumns) {
  WithEachThreadCount([] {
    struct Case {
      int64_t outer, reduce, inner;
    };
    for (Case c : {Case{1, 1, 1}, Case{3, 7, 1}, Case{1000, 67, 1}, Case{2, 100003, 1},
                   Case{5, 9, 300}, Case{1, 50000, 3}, Case{17, 1, 33}, Case{4, 130, 257}}) {
      SCOPED_TRACE(std::to_string(c.outer) + "x" + std::to_string(c.reduce) + "x" +
                   std::to_string(c.inner));
      const int64_t n = c.outer * c.reduce * c.inner;
      // Values rounded to a coarse grid so that max/min have exact ties.
      std::vector<float> x = RandomFloats(n, -4, 4, 12);
      for (float& v : x) v = std::round(v * 4) / 4;
      for (ReduceKind op : AllReduceKinds()) {
        const std::vector<double> expected = ReferenceReduce(op, x, c.outer, c.reduce, c.inner);
        const bool arg = IsArgReduction(op);
        std::vector<float> values(c.outer * c.inner, kNaN);
        std::vector<int64_t> indices(c.outer * c.inner, -1);
        KernelTensor dst = arg ? View(indices.data(), {c.outer, c.inner})
                               : View(values.data(), {c.outer, c.inner});
        Cpu().Reduce(0, op, dst, View(x.data(), {n}), c.outer, c.reduce, c.inner);
        for (size_t i = 0; i < expected.size(); ++i) {
          if (arg) {
            ASSERT_EQ(indices[i], static_cast<int64_t>(expected[i])) << "op " << int(op);
          } else if (op == ReduceKind::kSum) {
            // Double accumulation: the only error is the final rounding to float.
            ASSERT_NEAR(values[i], expected[i], 1e-6 * (1 + std::abs(expected[i])));
          } else {
            ASSERT_EQ(values[i], static_cast<float>(expected[i])) << "op " << int(op);
          }
        }
      }
    }
  });
}

TEST(CpuBackendTest, SumOfALongRowKeepsFloat32Precision) {
  // 2^24 + 1 ones: a float32 running sum would stop at 2^24.
  const int64_t n = (int64_t{1} << 24) + 8;
  std::vector<float> ones(n, 1.0f);
  float sum = 0;
  Cpu().Reduce(0, ReduceKind::kSum, View(&sum, {}), View(ones.data(), {n}), 1, n, 1);
  EXPECT_EQ(sum, static_cast<float>(n));
  // Ones between a large value and its negation: float32 partial sums would lose them.
  std::vector<float> mixed(100000, 1.0f);
  mixed.front() = 1e8f;
  mixed.back() = -1e8f;
  Cpu().Reduce(0, ReduceKind::kSum, View(&sum, {}), View(mixed.data(), {100000}), 1, 100000, 1);
  EXPECT_EQ(sum, 99998.0f);
}

TEST(CpuBackendTest, MaxMinAndArgPropagateNaNAndPickTheFirstTie) {
  // Rows: a tie, a NaN after the max, a NaN first, two NaNs, infinities.
  const std::vector<float> x = {1, 5, 5, 2,    1, 9,    kNaN,  3,    kNaN, 1,
                                2, 3, 4, kNaN, 0, kNaN, -kInf, kInf, kInf, 0};
  const int64_t rows = 5, cols = 4;
  for (ReduceKind op : AllReduceKinds()) {
    if (op == ReduceKind::kSum) continue;
    const std::vector<double> expected = ReferenceReduce(op, x, rows, cols, 1);
    const bool arg = IsArgReduction(op);
    std::vector<float> values(rows);
    std::vector<int64_t> indices(rows);
    Cpu().Reduce(0, op, arg ? View(indices.data(), {rows}) : View(values.data(), {rows}),
                 View(x.data(), {rows, cols}), rows, cols, 1);
    // And the same data reduced over columns of its transpose (the tiled path).
    std::vector<float> xt(rows * cols);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) xt[c * rows + r] = x[r * cols + c];
    }
    std::vector<float> values_t(rows);
    std::vector<int64_t> indices_t(rows);
    Cpu().Reduce(0, op, arg ? View(indices_t.data(), {rows}) : View(values_t.data(), {rows}),
                 View(xt.data(), {cols, rows}), 1, cols, rows);
    for (int64_t r = 0; r < rows; ++r) {
      if (arg) {
        EXPECT_EQ(indices[r], expected[r]) << "op " << int(op) << " row " << r;
        EXPECT_EQ(indices_t[r], expected[r]) << "op " << int(op) << " row " << r;
      } else {
        EXPECT_TRUE(SameFloat(static_cast<float>(expected[r]), values[r])) << "row " << r;
        EXPECT_TRUE(SameFloat(static_cast<float>(expected[r]), values_t[r])) << "row " << r;
      }
    }
  }
  // Spot checks of the policy itself.
  std::vector<int64_t> argmax(rows);
  Cpu().Reduce(0, ReduceKind::kArgMax, View(argmax.data(), {rows}), View(x.data(), {rows, cols}),
               rows, cols, 1);
  EXPECT_EQ(argmax, (std::vector<int64_t>{1, 2, 0, 1, 1}));
}

TEST(CpuBackendTest, ReducesInt64) {
  const int64_t outer = 6, reduce = 1001, inner = 3;
  std::vector<int64_t> x = RandomInts(outer * reduce * inner, -20, 20, 13);
  for (ReduceKind op : AllReduceKinds()) {
    std::vector<double> expected = ReferenceReduce(op, x, outer, reduce, inner);
    std::vector<int64_t> out(outer * inner);
    Cpu().Reduce(0, op, View(out.data(), {outer, inner}), View(x.data(), {outer, reduce, inner}),
                 outer, reduce, inner);
    for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i], expected[i]) << "op " << int(op);
  }
}

TEST(CpuBackendTest, ReduceHandlesEmptyInputsAndChecksArguments) {
  std::vector<float> sums(4, kNaN);
  Cpu().Reduce(0, ReduceKind::kSum, View(sums.data(), {2, 2}),
               View(static_cast<float*>(nullptr), {2, 0, 2}), 2, 0, 2);
  EXPECT_EQ(sums, std::vector<float>(4, 0.0f));
  EXPECT_THROW(Cpu().Reduce(0, ReduceKind::kMax, View(sums.data(), {2, 2}),
                            View(static_cast<float*>(nullptr), {2, 0, 2}), 2, 0, 2),
               Error);
  // Nothing to write.
  Cpu().Reduce(0, ReduceKind::kMax, View(static_cast<float*>(nullptr), {0}),
               View(static_cast<float*>(nullptr), {0, 5}), 0, 5, 1);
  std::vector<float> x(6);
  float out = 0;
  EXPECT_THROW(Cpu().Reduce(0, ReduceKind::kArgMax, View(&out, {}), View(x.data(), {6}), 1, 6, 1),
               Error);  // argmax writes int64
  EXPECT_THROW(Cpu().Reduce(0, ReduceKind::kSum, View(&out, {}), View(x.data(), {6}), 1, 5, 1),
               Error);  // sizes do not match
}

// ---- Softmax -----------------------------------------------------------------------------

TEST(CpuBackendTest, SoftmaxAndLogSoftmaxMatchADoubleReference) {
  WithEachThreadCount([] {
    struct Case {
      int64_t outer, dim, inner;
    };
    for (Case c :
         {Case{1, 1, 1}, Case{300, 10, 1}, Case{7, 1000, 1}, Case{3, 17, 40}, Case{2000, 33, 1}}) {
      const int64_t n = c.outer * c.dim * c.inner;
      std::vector<float> x = RandomFloats(n, -10, 10, 14);
      x[0] = 1000.0f;  // large logits must not overflow
      for (bool log : {false, true}) {
        std::vector<float> out(n, kNaN);
        RunSoftmax(Device::Cpu(0), kFloat32, log, out.data(), x.data(), c.outer, c.dim, c.inner);
        for (int64_t o = 0; o < c.outer; ++o) {
          for (int64_t j = 0; j < c.inner; ++j) {
            auto at = [&](int64_t i) { return (o * c.dim + i) * c.inner + j; };
            double max = -INFINITY, sum = 0;
            for (int64_t i = 0; i < c.dim; ++i) max = std::max<double>(max, x[at(i)]);
            for (int64_t i = 0; i < c.dim; ++i) sum += std::exp(x[at(i)] - max);
            double total = 0;
            for (int64_t i = 0; i < c.dim; ++i) {
              const double expected =
                  log ? x[at(i)] - max - std::log(sum) : std::exp(x[at(i)] - max) / sum;
              ASSERT_NEAR(out[at(i)], expected, 1e-5 * (1 + std::abs(expected)));
              total += out[at(i)];
            }
            if (!log) {
              ASSERT_NEAR(total, 1.0, 1e-5);
            }
          }
        }
      }
    }
  });
  std::vector<float> inf_row = {-kInf, 0.0f, -kInf};
  std::vector<float> out(3);
  RunSoftmax(Device::Cpu(0), kFloat32, false, out.data(), inf_row.data(), 1, 3, 1);
  EXPECT_EQ(out, (std::vector<float>{0, 1, 0}));
  RunSoftmax(Device::Cpu(0), kFloat32, true, out.data(), nullptr, 0, 3, 1);  // empty
}

TYPED_TEST(ReducedFloatTest, SumsAccumulateWideAndMaxMinPropagateNaN) {
  using T = TypeParam;
  WithEachThreadCount([] {
    // Rows (one of them long enough to be split into blocks) and columns.
    for (auto [outer, reduce, inner] :
         {std::array<int64_t, 3>{3, 100003, 1}, std::array<int64_t, 3>{5, 77, 300},
          std::array<int64_t, 3>{1000, 13, 1}}) {
      std::vector<T> x = Rounded<T>(RandomFloats(outer * reduce * inner, -1, 2, 51));
      x[2 * inner] = T(kNaN);  // row/column 0 has a NaN
      const std::vector<float> x32 = Widened(x);
      for (ReduceKind op : AllReduceKinds()) {
        const bool arg = IsArgReduction(op);
        std::vector<float> expected(outer * inner);
        std::vector<int64_t> expected_at(outer * inner), at(outer * inner);
        std::vector<T> out(outer * inner);
        const KernelTensor src32 = View(x32.data(), {outer * reduce * inner});
        const KernelTensor src16 = View(x.data(), {outer * reduce * inner});
        if (arg) {
          Cpu().Reduce(0, op, View(expected_at.data(), {outer * inner}), src32, outer, reduce,
                       inner);
          Cpu().Reduce(0, op, View(at.data(), {outer * inner}), src16, outer, reduce, inner);
          ASSERT_EQ(at, expected_at);
          continue;
        }
        Cpu().Reduce(0, op, View(expected.data(), {outer * inner}), src32, outer, reduce, inner);
        Cpu().Reduce(0, op, View(out.data(), {outer * inner}), src16, outer, reduce, inner);
        // The sum of the same values in the same order, in double: the float32 result
        // rounded (both round the double sum to float first).
        for (size_t i = 0; i < out.size(); ++i) ASSERT_TRUE(IsRounded(expected[i], out[i])) << i;
        ASSERT_TRUE(std::isnan(static_cast<float>(out[0])));
      }
    }
  });
}

TYPED_TEST(ReducedFloatTest, SoftmaxMatchesFloat32WithinTolerance) {
  using T = TypeParam;
  for (bool log : {false, true}) {
    const int64_t outer = 6, dim = 257, inner = 3;
    std::vector<T> x = Rounded<T>(RandomFloats(outer * dim * inner, -8, 8, 61));
    const std::vector<float> x32 = Widened(x);
    std::vector<float> expected(x.size());
    std::vector<T> out(x.size());
    RunSoftmax(Device::Cpu(0), kFloat32, log, expected.data(), x32.data(), outer, dim, inner);
    RunSoftmax(Device::Cpu(0), DTypeOf<T>::value, log, out.data(), x.data(), outer, dim, inner);
    for (size_t i = 0; i < x.size(); ++i) ASSERT_TRUE(CloseFor<T>(expected[i], out[i])) << i;
  }
}

}  // namespace
}  // namespace tandem
