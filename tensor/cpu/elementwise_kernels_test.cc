// Tests of the CPU backend's Unary and Binary kernels: every op of the op tables
// (tensor/runtime/op_tables.h) in every dtype against the double-precision math, bitwise
// against the shared scalar math on strided, transposed, broadcast and in-place views, and the
// 16-bit floats as the float function rounded once.
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

// ---- Unary and Binary ----------------------------------------------------------------------

const std::vector<UnaryOp> kAllUnaryOps = AllUnaryOps();

const std::vector<BinaryOp> kAllBinaryOps = AllBinaryOps();

// Every row of TANDEM_FORALL_UNARY_OPS in every dtype, contiguous and through a transposed
// view, against the double math; the dtypes an op is not defined on must be refused.
template <typename T>
void CheckUnaryAgainstDouble(UnaryOp op) {
  const DType dtype = DTypeOf<T>::value;
  const bool floating = IsFloatingPoint(dtype);
  const int64_t rows = 37, cols = 111;  // past the 16-bit float chunks and one thread's grain
  const int64_t n = rows * cols;
  const double scalar = floating ? 1.5 : 3.0;  // an integral scalar for the integers
  std::unique_ptr<T[]> input = RandomOf<T>(n, HasPositiveDomain(op) ? 0.01 : -4.0, 4.0, 21);
  if (floating) {
    const double specials[] = {NAN, INFINITY, -INFINITY, 0.0, -0.0};
    for (int i = 0; i < 5; ++i) input[i] = FromDouble<T>(specials[i]);
    for (int64_t i = 5; i < n; i += 97) input[i] = FromDouble<T>(scalar);  // ties for ge
  }
  auto out = std::make_unique<T[]>(n), out_t = std::make_unique<T[]>(n);
  const KernelTensor in = View(input.get(), {rows, cols});
  const KernelTensor transposed = View(input.get(), {cols, rows}, {1, cols});
  if (!floating && (!UnarySupportsIntegers(op) || (dtype == kBool && RejectsBool(op)))) {
    EXPECT_THROW(Cpu().Unary(0, op, View(out.get(), {rows, cols}), in, scalar), Error);
    return;
  }
  Cpu().Unary(0, op, View(out.get(), {rows, cols}), in, scalar);
  Cpu().Unary(0, op, View(out_t.get(), {cols, rows}), transposed, scalar);
  const auto expected = [&](int64_t at) {
    return StoredAs<T>(ApplyUnary<double>(op, ToDouble(input[at]), scalar));
  };
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_TRUE(NearOracle(expected(i), out[i])) << "at " << i << ", input " << ToDouble(input[i]);
    ASSERT_TRUE(NearOracle(expected(OffsetOf(transposed, i)), out_t[i])) << "transposed, at " << i;
  }
}

TEST(CpuBackendTest, EveryUnaryOpInEveryDTypeMatchesTheDoubleMath) {
  WithEachThreadCount([] {
    for (UnaryOp op : AllUnaryOps()) {
      SCOPED_TRACE(std::string("op ") + OpName(op));
      ForEachDType([&](auto tag) { CheckUnaryAgainstDouble<typename decltype(tag)::type>(op); });
    }
  });
}

// Every row of TANDEM_FORALL_BINARY_OPS in every dtype, with b a row broadcast over a's rows
// and both ways round, against the double math; comparisons also into a bool output.
template <typename T>
void CheckBinaryAgainstDouble(BinaryOp op) {
  const DType dtype = DTypeOf<T>::value;
  const bool floating = IsFloatingPoint(dtype);
  const int64_t rows = 29, cols = 151;
  const int64_t n = rows * cols;
  std::unique_ptr<T[]> a = RandomOf<T>(n, -4.0, 4.0, 22), b = RandomOf<T>(cols, -4.0, 4.0, 23);
  // No division by zero in the integers (either way round); elsewhere quotients stay in
  // float16's range.
  const auto away_from_zero = [&](T& v) {
    if (std::fabs(ToDouble(v)) < 0.25) v = FromDouble<T>(floating ? 0.5 : 1.0);
  };
  for (int64_t j = 0; j < cols; ++j) away_from_zero(b[j]);
  for (int64_t i = 0; i < n; ++i) away_from_zero(a[i]);
  for (int64_t i = 0; i < n; i += 11) a[i] = b[i % cols];  // ties for the comparisons
  if (floating) {
    a[3] = FromDouble<T>(NAN);
    b[5] = FromDouble<T>(0.0);  // division by zero: inf or NaN
  }
  auto out = std::make_unique<T[]>(n);
  auto flags = std::make_unique<bool[]>(n);
  const KernelTensor full = View(a.get(), {rows, cols});
  const KernelTensor row = View(b.get(), {rows, cols}, {0, 1});
  if ((!floating && BinaryIsFloatingOnly(op)) || (dtype == kBool && RejectsBool(op))) {
    EXPECT_THROW(Cpu().Binary(0, op, View(out.get(), {rows, cols}), full, row), Error);
    return;
  }
  for (bool row_first : {false, true}) {
    SCOPED_TRACE(row_first ? "b op a" : "a op b");
    Cpu().Binary(0, op, View(out.get(), {rows, cols}), row_first ? row : full,
                 row_first ? full : row);
    if (IsComparison(op)) {
      Cpu().Binary(0, op, View(flags.get(), {rows, cols}), row_first ? row : full,
                   row_first ? full : row);
    }
    for (int64_t i = 0; i < n; ++i) {
      double x = ToDouble(a[i]), y = ToDouble(b[i % cols]);
      if (row_first) std::swap(x, y);
      ASSERT_TRUE(NearOracle(StoredAs<T>(ApplyBinary<double>(op, x, y)), out[i]))
          << "at " << i << ": " << x << ", " << y;
      if (IsComparison(op)) {
        ASSERT_EQ(flags[i], ApplyComparison<double>(op, x, y)) << "at " << i;
      }
    }
  }
}

TEST(CpuBackendTest, EveryBinaryOpInEveryDTypeMatchesTheDoubleMath) {
  WithEachThreadCount([] {
    for (BinaryOp op : AllBinaryOps()) {
      SCOPED_TRACE(std::string("op ") + OpName(op));
      ForEachDType([&](auto tag) { CheckBinaryAgainstDouble<typename decltype(tag)::type>(op); });
    }
  });
}

TEST(CpuBackendTest, UnaryMatchesTheSharedScalarMath) {
  WithEachThreadCount([] {
    const int64_t rows = 129, cols = 517;  // 66 693 elements
    // Positive inputs for log/sqrt/pow, with exact ties for kGeScalar.
    std::vector<float> input = RandomFloats(rows * cols, 0.01f, 4.0f, 4);
    for (int64_t i = 0; i < rows * cols; i += 97) input[i] = 1.5f;
    const float scalar = 1.5f;
    for (UnaryOp op : kAllUnaryOps) {
      SCOPED_TRACE(std::string("op ") + OpName(op));
      std::vector<float> signed_input = input;
      if (!HasPositiveDomain(op)) {
        for (int64_t i = 0; i < rows * cols; i += 2) signed_input[i] = -signed_input[i];
      }
      // Contiguous.
      std::vector<float> out(rows * cols, kNaN);
      Cpu().Unary(0, op, View(out.data(), {rows, cols}), View(signed_input.data(), {rows, cols}),
                  scalar);
      for (int64_t i = 0; i < rows * cols; ++i) {
        ASSERT_TRUE(SameFloat(ApplyUnary(op, signed_input[i], scalar), out[i])) << "at " << i;
      }
      // Transposed input into a contiguous output.
      KernelTensor transposed = View(signed_input.data(), {cols, rows}, {1, cols});
      Cpu().Unary(0, op, View(out.data(), {cols, rows}), transposed, scalar);
      for (int64_t i = 0; i < rows * cols; ++i) {
        ASSERT_TRUE(
            SameFloat(ApplyUnary(op, signed_input[OffsetOf(transposed, i)], scalar), out[i]));
      }
      // In place (dst aliases src exactly).
      std::vector<float> in_place = signed_input;
      Cpu().Unary(0, op, View(in_place.data(), {rows * cols}), View(in_place.data(), {rows * cols}),
                  scalar);
      for (int64_t i = 0; i < rows * cols; ++i) {
        ASSERT_TRUE(SameFloat(ApplyUnary(op, signed_input[i], scalar), in_place[i]));
      }
    }
  });
}

TEST(CpuBackendTest, UnaryOnInt64) {
  std::vector<int64_t> input = RandomInts(1001, -(int64_t{1} << 40), int64_t{1} << 40, 5);
  for (UnaryOp op : kAllUnaryOps) {
    std::vector<int64_t> out(input.size());
    if (!UnarySupportsInt64(op)) {
      EXPECT_THROW(Cpu().Unary(0, op, View(out.data(), {1001}), View(input.data(), {1001}), 2.0),
                   Error);
      continue;
    }
    Cpu().Unary(0, op, View(out.data(), {1001}), View(input.data(), {1001}), 3.0);
    for (size_t i = 0; i < input.size(); ++i) ASSERT_EQ(out[i], ApplyUnary(op, input[i], 3.0));
  }
}

TEST(CpuBackendTest, UnaryHandlesBroadcastEmptyAndZeroDim) {
  float one = 2.0f;
  std::vector<float> out(5);
  Cpu().Unary(0, UnaryOp::kSquare, View(out.data(), {5}), View(&one, {5}, {0}), 0.0);
  for (float x : out) EXPECT_EQ(x, 4.0f);
  float scalar_out = 0;
  Cpu().Unary(0, UnaryOp::kExp, View(&scalar_out, {}), View(&one, {}), 0.0);
  EXPECT_EQ(scalar_out, std::exp(2.0f));
  Cpu().Unary(0, UnaryOp::kExp, View(static_cast<float*>(nullptr), {0, 4}),
              View(static_cast<float*>(nullptr), {0, 4}), 0.0);
  std::vector<int64_t> ints(5);
  EXPECT_THROW(Cpu().Unary(0, UnaryOp::kNeg, View(ints.data(), {5}), View(out.data(), {5}), 0.0),
               Error);
}

template <typename T>
void CheckBinary(BinaryOp op, const KernelTensor& a, const KernelTensor& b,
                 std::vector<int64_t> shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::vector<T> out(n);
  Cpu().Binary(0, op, View(out.data(), shape), a, b);
  for (int64_t i = 0; i < n; ++i) {
    const T expected =
        ApplyBinary(op, a.ptr<const T>()[OffsetOf(a, i)], b.ptr<const T>()[OffsetOf(b, i)]);
    if constexpr (std::is_same_v<T, float>) {
      ASSERT_TRUE(SameFloat(expected, out[i])) << "at " << i;
    } else {
      ASSERT_EQ(expected, out[i]) << "at " << i;
    }
  }
}

TEST(CpuBackendTest, BinaryMatchesTheSharedScalarMathWithBroadcasting) {
  WithEachThreadCount([] {
    const int64_t rows = 301, cols = 233;  // 70 133 elements
    std::vector<float> a = RandomFloats(rows * cols, -3, 3, 6);
    std::vector<float> b = RandomFloats(rows * cols, -3, 3, 7);
    for (int64_t i = 0; i < rows * cols; i += 11) b[i] = a[i];  // ties for comparisons
    b[5] = 0.0f;                                                // division by zero: inf
    a[9] = kNaN;
    std::vector<int64_t> ai = RandomInts(rows * cols, -50, 50, 8);
    std::vector<int64_t> bi = RandomInts(rows * cols, 1, 50, 9);  // no division by zero
    for (int64_t i = 0; i < rows * cols; i += 13) bi[i] = ai[i] == 0 ? 1 : ai[i];
    for (BinaryOp op : kAllBinaryOps) {
      SCOPED_TRACE(std::string("op ") + OpName(op));
      // Same shape, contiguous.
      CheckBinary<float>(op, View(a.data(), {rows, cols}), View(b.data(), {rows, cols}),
                         {rows, cols});
      // Row vector broadcast over rows, column vector over columns, a scalar.
      CheckBinary<float>(op, View(a.data(), {rows, cols}), View(b.data(), {rows, cols}, {0, 1}),
                         {rows, cols});
      CheckBinary<float>(op, View(a.data(), {rows, cols}, {1, 0}), View(b.data(), {rows, cols}),
                         {rows, cols});
      CheckBinary<float>(op, View(a.data(), {rows, cols}), View(b.data() + 3, {rows, cols}, {0, 0}),
                         {rows, cols});
      // Transposed operand.
      CheckBinary<float>(op, View(a.data(), {cols, rows}, {1, cols}), View(b.data(), {cols, rows}),
                         {cols, rows});
      // 3-D with a broadcast middle dimension and odd sizes.
      CheckBinary<float>(op, View(a.data(), {7, 5, 13}, {65, 0, 5}), View(b.data(), {7, 5, 13}),
                         {7, 5, 13});
      if (BinaryIsFloatingOnly(op)) {
        std::vector<int64_t> out(rows * cols);
        EXPECT_THROW(Cpu().Binary(0, op, View(out.data(), {rows, cols}),
                                  View(ai.data(), {rows, cols}), View(bi.data(), {rows, cols})),
                     Error);
        continue;
      }
      // int64.
      CheckBinary<int64_t>(op, View(ai.data(), {rows, cols}), View(bi.data(), {rows, cols}, {0, 1}),
                           {rows, cols});
      CheckBinary<int64_t>(op, View(ai.data(), {rows, cols}), View(bi.data(), {rows, cols}),
                           {rows, cols});
    }
  });
}

TEST(CpuBackendTest, BinaryInPlaceAndEdgeCases) {
  std::vector<float> a = RandomFloats(1000, -1, 1, 10), b = RandomFloats(1000, -1, 1, 11);
  std::vector<float> expected(1000);
  for (int i = 0; i < 1000; ++i) expected[i] = a[i] * b[i];
  Cpu().Binary(0, BinaryOp::kMul, View(a.data(), {1000}), View(a.data(), {1000}),
               View(b.data(), {1000}));
  EXPECT_EQ(a, expected);
  float x = 3, y = 4, z = 0;
  Cpu().Binary(0, BinaryOp::kSub, View(&z, {}), View(&x, {}), View(&y, {}));
  EXPECT_EQ(z, -1.0f);
  Cpu().Binary(0, BinaryOp::kAdd, View(static_cast<float*>(nullptr), {2, 0}),
               View(static_cast<float*>(nullptr), {2, 0}),
               View(static_cast<float*>(nullptr), {2, 0}));
  int64_t i = 0;
  EXPECT_THROW(Cpu().Binary(0, BinaryOp::kAdd, View(&z, {}), View(&x, {}), View(&i, {})), Error);
  EXPECT_THROW(Cpu().Binary(0, BinaryOp::kAdd, View(&z, {1}), View(&x, {}), View(&y, {})), Error);
}

TYPED_TEST(ReducedFloatTest, UnaryIsTheFloatFunctionRoundedOnce) {
  using T = TypeParam;
  const int64_t rows = 37, cols = 1001;  // crosses the float chunks, splits over threads
  std::vector<T> input = Rounded<T>(RandomFloats(rows * cols, -3, 3, 31));
  input[5] = T(kNaN);
  input[6] = T(kInf);
  const std::vector<float> input32 = Widened(input);
  for (UnaryOp op : kAllUnaryOps) {
    SCOPED_TRACE(std::string("op ") + OpName(op));
    const float scalar = 0.7f;
    std::vector<float> expected(input32.size());
    Cpu().Unary(0, op, View(expected.data(), {rows, cols}), View(input32.data(), {rows, cols}),
                scalar);
    for (bool baseline : {false, true}) {
      vec::BaselineVectorsForTesting force(baseline);
      std::vector<T> out(input.size());
      Cpu().Unary(0, op, View(out.data(), {rows, cols}), View(input.data(), {rows, cols}), scalar);
      for (size_t i = 0; i < out.size(); ++i) ASSERT_TRUE(IsRounded(expected[i], out[i])) << i;
    }
    // Transposed (strided) and broadcast (stride 0) inputs.
    std::vector<T> transposed(input.size());
    Cpu().Unary(0, op, View(transposed.data(), {cols, rows}),
                View(input.data(), {cols, rows}, {1, cols}), scalar);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        ASSERT_TRUE(IsRounded(expected[r * cols + c], transposed[c * rows + r]));
      }
    }
    std::vector<T> broadcast(cols);
    Cpu().Unary(0, op, View(broadcast.data(), {cols}), View(input.data() + 7, {cols}, {0}), scalar);
    for (int64_t c = 0; c < cols; ++c) ASSERT_TRUE(IsRounded(expected[7], broadcast[c]));
  }
  // The constants are float's: gelu(1) is 0.8413447 in float, which ApplyUnary<BFloat16>
  // would compute from 1/sqrt(2) rounded to 0.70703125.
  std::vector<T> one = {T(1.0f)}, gelu(1);
  Cpu().Unary(0, UnaryOp::kGelu, View(gelu.data(), {1}), View(one.data(), {1}), 0.0);
  EXPECT_TRUE(IsRounded(ApplyUnary<float>(UnaryOp::kGelu, 1.0f, 0.0f), gelu[0]));
}

TYPED_TEST(ReducedFloatTest, BinaryIsTheFloatFunctionRoundedOnceAndComparesIntoBool) {
  using T = TypeParam;
  const int64_t rows = 29, cols = 700;
  std::vector<T> a = Rounded<T>(RandomFloats(rows * cols, -4, 4, 41));
  std::vector<T> row = Rounded<T>(RandomFloats(cols, -4, 4, 42));
  a[3] = T(kNaN);
  row[9] = a[9];  // an equal pair for the comparisons
  const std::vector<float> a32 = Widened(a), row32 = Widened(row);
  for (BinaryOp op : kAllBinaryOps) {
    SCOPED_TRACE(std::string("op ") + OpName(op));
    // a [rows, cols] with row broadcast over the rows, both ways round.
    for (bool row_first : {false, true}) {
      const KernelTensor a16 = View(a.data(), {rows, cols});
      const KernelTensor r16 = View(row.data(), {rows, cols}, {0, 1});
      const KernelTensor a_f = View(a32.data(), {rows, cols});
      const KernelTensor r_f = View(row32.data(), {rows, cols}, {0, 1});
      std::vector<float> expected(a.size());
      std::vector<T> out(a.size());
      Cpu().Binary(0, op, View(expected.data(), {rows, cols}), row_first ? r_f : a_f,
                   row_first ? a_f : r_f);
      Cpu().Binary(0, op, View(out.data(), {rows, cols}), row_first ? r16 : a16,
                   row_first ? a16 : r16);
      for (size_t i = 0; i < out.size(); ++i) ASSERT_TRUE(IsRounded(expected[i], out[i])) << i;
      if (IsComparison(op)) {
        std::unique_ptr<bool[]> flags(new bool[a.size()]);
        Cpu().Binary(0, op, View(flags.get(), {rows, cols}), row_first ? r16 : a16,
                     row_first ? a16 : r16);
        for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(flags[i], expected[i] == 1.0f) << i;
      }
    }
    // A scalar (both operands broadcast) and a transposed output.
    std::vector<T> out(a.size());
    Cpu().Binary(0, op, View(out.data(), {cols, rows}, {1, cols}),
                 View(a.data(), {cols, rows}, {1, cols}),
                 View(row.data() + 1, {cols, rows}, {0, 0}));
    for (size_t i = 0; i < out.size(); ++i) {
      ASSERT_TRUE(IsRounded(ApplyBinary<float>(op, a32[i], row32[1]), out[i])) << i;
    }
  }
}

template <typename T>
void CheckIntegerKernels() {
  SCOPED_TRACE(DTypeName(DTypeOf<T>::value));
  const int64_t n = 1000;
  std::vector<T> a(n), b(n);
  std::vector<int64_t> ints_a = RandomInts(n, 0, 100, 111), ints_b = RandomInts(n, 1, 100, 112);
  for (int64_t i = 0; i < n; ++i) {
    a[i] = static_cast<T>(ints_a[i]);
    b[i] = static_cast<T>(ints_b[i]);
  }
  for (UnaryOp op : kAllUnaryOps) {
    if (!UnarySupportsIntegers(op)) continue;
    std::vector<T> out(n);
    Cpu().Unary(0, op, View(out.data(), {n}), View(a.data(), {n}), 3.0);
    for (int64_t i = 0; i < n; ++i) {
      const double expected = ApplyUnary<double>(op, static_cast<double>(ints_a[i]), 3.0);
      ASSERT_EQ(out[i], static_cast<T>(static_cast<int64_t>(expected))) << i;  // uint8 wraps
    }
  }
  EXPECT_THROW(Cpu().Unary(0, UnaryOp::kExp, View(a.data(), {n}), View(a.data(), {n}), 0.0), Error);
  for (BinaryOp op : kAllBinaryOps) {
    if (BinaryIsFloatingOnly(op)) continue;
    std::vector<T> out(n);
    std::unique_ptr<bool[]> flags(new bool[n]);
    Cpu().Binary(0, op, View(out.data(), {n}), View(a.data(), {n}), View(b.data(), {n}));
    for (int64_t i = 0; i < n; ++i) {
      const double expected =
          ApplyBinary<double>(op, static_cast<double>(ints_a[i]), static_cast<double>(ints_b[i]));
      ASSERT_EQ(out[i], static_cast<T>(static_cast<int64_t>(expected))) << i;
    }
    if (IsComparison(op)) {
      Cpu().Binary(0, op, View(flags.get(), {n}), View(a.data(), {n}), View(b.data(), {n}));
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(flags[i], static_cast<bool>(out[i]));
    }
  }
  // Sums keep the dtype (wrapping); max and argmax as for any ordered type.
  T sum;
  Cpu().Reduce(0, ReduceKind::kSum, View(&sum, {}), View(a.data(), {n}), 1, n, 1);
  EXPECT_EQ(sum, static_cast<T>(std::accumulate(ints_a.begin(), ints_a.end(), int64_t{0})));
  int64_t at;
  Cpu().Reduce(0, ReduceKind::kArgMax, View(&at, {}), View(a.data(), {n}), 1, n, 1);
  EXPECT_EQ(at, std::max_element(ints_a.begin(), ints_a.end()) - ints_a.begin());
}

TEST(CpuBackendTest, IntegerKernels) {
  CheckIntegerKernels<int32_t>();
  CheckIntegerKernels<uint8_t>();
  CheckIntegerKernels<int64_t>();
}

TEST(CpuBackendTest, BoolKernelsFollowPyTorch) {
  bool a[4] = {false, false, true, true}, b[4] = {false, true, false, true}, out[4];
  const auto run = [&](BinaryOp op) {
    Cpu().Binary(0, op, View(out, {4}), View(a, {4}), View(b, {4}));
    return std::vector<bool>(out, out + 4);
  };
  EXPECT_EQ(run(BinaryOp::kAdd), std::vector<bool>({false, true, true, true}));    // or
  EXPECT_EQ(run(BinaryOp::kMul), std::vector<bool>({false, false, false, true}));  // and
  EXPECT_EQ(run(BinaryOp::kMaximum), std::vector<bool>({false, true, true, true}));
  EXPECT_EQ(run(BinaryOp::kMinimum), std::vector<bool>({false, false, false, true}));
  EXPECT_EQ(run(BinaryOp::kNe), std::vector<bool>({false, true, true, false}));
  EXPECT_EQ(run(BinaryOp::kLt), std::vector<bool>({false, true, false, false}));
  EXPECT_THROW(run(BinaryOp::kSub), Error);
  EXPECT_THROW(run(BinaryOp::kDiv), Error);
  EXPECT_THROW(Cpu().Unary(0, UnaryOp::kNeg, View(out, {4}), View(a, {4}), 0.0), Error);
  Cpu().Unary(0, UnaryOp::kMulScalar, View(out, {4}), View(b, {4}), 2.0);
  EXPECT_EQ(std::vector<bool>(out, out + 4), std::vector<bool>({false, true, false, true}));
  // sum of bool in bool is "any"; max is "any", min "all".
  bool any, all;
  Cpu().Reduce(0, ReduceKind::kSum, View(&any, {}), View(b, {4}), 1, 4, 1);
  Cpu().Reduce(0, ReduceKind::kMin, View(&all, {}), View(b, {4}), 1, 4, 1);
  EXPECT_TRUE(any);
  EXPECT_FALSE(all);
  // Comparisons of float32 into bool, and mismatched dtypes rejected.
  float x[3] = {1.0f, kNaN, 3.0f}, y[3] = {1.0f, kNaN, 2.0f};
  bool eq[3];
  Cpu().Binary(0, BinaryOp::kEq, View(eq, {3}), View(x, {3}), View(y, {3}));
  EXPECT_EQ(std::vector<bool>(eq, eq + 3), std::vector<bool>({true, false, false}));
  EXPECT_THROW(Cpu().Binary(0, BinaryOp::kAdd, View(eq, {3}), View(x, {3}), View(y, {3})), Error);
}

// Not an assertion: the figures the CPU engineer reports (bf16 against f32 elementwise add,
// float <-> bf16/fp16 conversion throughput on 4M elements). Run with
//   bazel test --config=cpu //tensor/cpu:elementwise_kernels_test
//   --test_arg=--gtest_also_run_disabled_tests
//   --test_filter='*DISABLED_Measure*' --test_output=all
TEST(CpuBackendTest, DISABLED_MeasureReducedPrecisionThroughput) {
  const int64_t n = int64_t{4} << 20;
  std::vector<float> a32 = RandomFloats(n, -1, 1, 1), b32 = RandomFloats(n, -1, 1, 2), c32(n);
  std::vector<BFloat16> a16 = Rounded<BFloat16>(a32), b16 = Rounded<BFloat16>(b32), c16(n);
  std::vector<Half> h16(n);
  const auto time = [](const char* what, auto&& body) {
    body();  // warm up (page faults, caches)
    constexpr int kRounds = 20;
    double best = 1e30;
    for (int r = 0; r < kRounds; ++r) {
      const auto start = std::chrono::steady_clock::now();
      body();
      best = std::min(
          best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                    .count());
    }
    std::printf("%-44s %8.3f ms (best of %d), %.2f Gelem/s\n", what, best, kRounds,
                4.0 * (1 << 20) / best / 1e6);
  };
  const int original = CpuDeviceCount();
  for (int devices : {HardwareCores(), 1}) {
    SetCpuDeviceCount(devices);
    std::printf("threads per device: %d\n", CpuThreadsPerDevice());
    time("add f32 (4M)", [&] {
      Cpu().Binary(0, BinaryOp::kAdd, View(c32.data(), {n}), View(a32.data(), {n}),
                   View(b32.data(), {n}));
    });
    time("add bf16 (4M)", [&] {
      Cpu().Binary(0, BinaryOp::kAdd, View(c16.data(), {n}), View(a16.data(), {n}),
                   View(b16.data(), {n}));
    });
    time("copy f32 -> bf16 (4M)",
         [&] { Cpu().Copy(0, View(c16.data(), {n}), View(a32.data(), {n})); });
    time("copy bf16 -> f32 (4M)",
         [&] { Cpu().Copy(0, View(c32.data(), {n}), View(a16.data(), {n})); });
    time("copy f32 -> f16 (4M)",
         [&] { Cpu().Copy(0, View(h16.data(), {n}), View(a32.data(), {n})); });
    time("copy f16 -> f32 (4M)",
         [&] { Cpu().Copy(0, View(c32.data(), {n}), View(h16.data(), {n})); });
    {
      vec::BaselineVectorsForTesting baseline;
      time("copy f32 -> f16 (4M, baseline SSE2)",
           [&] { Cpu().Copy(0, View(h16.data(), {n}), View(a32.data(), {n})); });
    }
    time("scalar half.h f32 -> f16, one thread (4M)", [&] {
      for (int64_t i = 0; i < n; ++i) h16[i] = Half(a32[i]);
    });
  }
  SetCpuDeviceCount(original);
}

// ReLU, its backward and 2x2 max pooling select values, so bfloat16 takes them on the bits;
// every bfloat16 pattern (zeros of both signs, subnormals, infinities, NaNs) must give the
// float32 kernel's result exactly, and pooling the same argmax.
TEST(BFloat16SelectionTest, ReluAndItsBackwardMatchFloat32OnEveryBitPattern) {
  const int64_t n = 1 << 16;
  std::vector<BFloat16> x(n), grad(n);
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t bits = static_cast<uint16_t>(i);
    std::memcpy(&x[i], &bits, sizeof(bits));
    grad[i] = BFloat16(static_cast<float>(i % 7) - 3.0f);
  }
  const std::vector<float> x32 = Widened(x), grad32 = Widened(grad);
  std::vector<float> relu32(n), back32(n);
  std::vector<BFloat16> relu(n), back(n);
  Cpu().Unary(0, UnaryOp::kRelu, View(relu32.data(), {n}), View(x32.data(), {n}), 0.0);
  Cpu().Unary(0, UnaryOp::kRelu, View(relu.data(), {n}), View(x.data(), {n}), 0.0);
  Cpu().Binary(0, BinaryOp::kReluBackward, View(back32.data(), {n}), View(grad32.data(), {n}),
               View(x32.data(), {n}));
  Cpu().Binary(0, BinaryOp::kReluBackward, View(back.data(), {n}), View(grad.data(), {n}),
               View(x.data(), {n}));
  for (int64_t i = 0; i < n; ++i) {
    // Bitwise (-0 stays -0), NaN payloads aside.
    ASSERT_TRUE(IsRounded(relu32[i], relu[i])) << "relu of pattern " << i;
    ASSERT_TRUE(IsRounded(back32[i], back[i])) << "relu backward at pattern " << i;
  }
}

}  // namespace
}  // namespace tandem
