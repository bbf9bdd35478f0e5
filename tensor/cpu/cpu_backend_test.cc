// Tests of the CPU backend's kernels against naive reference loops, through the Backend
// interface with raw buffers (no Tensor), on random inputs of awkward sizes: strided,
// transposed and broadcast views, dtype conversion, empty and 0-dim tensors, and loops long
// enough to be split over the device's threads.
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
#include "tensor/kernels/float_conversions.h"
#include "tensor/kernels/internal/elementwise_math.h"
#include "tensor/kernels/vectorized.h"
#include "tensor/runtime/backend.h"
#include "tensor/runtime/devices.h"

namespace tandem {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

Backend& Cpu() { return GetBackend(DeviceType::kCPU); }

// A view of `data` with the given sizes and strides (contiguous strides when omitted).
template <typename T>
KernelTensor View(T* data, std::vector<int64_t> sizes, std::vector<int64_t> strides = {}) {
  KernelTensor t;
  t.data = const_cast<std::remove_const_t<T>*>(data);  // kernels only read inputs
  t.dtype = DTypeOf<std::remove_const_t<T>>::value;
  t.ndim = static_cast<int>(sizes.size());
  if (strides.empty()) {
    strides.resize(sizes.size());
    int64_t stride = 1;
    for (int d = t.ndim - 1; d >= 0; --d) {
      strides[d] = stride;
      stride *= sizes[d];
    }
  }
  for (int d = 0; d < t.ndim; ++d) {
    t.sizes[d] = sizes[d];
    t.strides[d] = strides[d];
  }
  return t;
}

// Element offset of the i-th element (row-major order) of a view.
int64_t OffsetOf(const KernelTensor& t, int64_t i) {
  int64_t offset = 0;
  for (int d = t.ndim - 1; d >= 0; --d) {
    offset += (i % t.sizes[d]) * t.strides[d];
    i /= t.sizes[d];
  }
  return offset;
}

std::vector<float> RandomFloats(int64_t n, float low, float high, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(low, high);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<int64_t> RandomInts(int64_t n, int64_t low, int64_t high, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> dist(low, high);
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t& x : v) x = dist(rng);
  return v;
}

// Bitwise equality that treats NaN == NaN, for kernels that must match a reference exactly.
::testing::AssertionResult SameFloat(float expected, float actual) {
  if (std::isnan(expected) && std::isnan(actual)) return ::testing::AssertionSuccess();
  if (expected == actual) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "expected " << expected << " but got " << actual;
}

// Runs `body` once with each logical CPU device on one thread and once with one device on
// all cores, so that kernels are exercised both inline and split over threads.
template <typename Body>
void WithEachThreadCount(Body body) {
  const int original = CpuDeviceCount();
  for (int devices : {HardwareCores(), 1}) {
    SetCpuDeviceCount(devices);
    SCOPED_TRACE("threads per device: " + std::to_string(CpuThreadsPerDevice()));
    body();
  }
  SetCpuDeviceCount(original);
}

// ---- Backend basics ----------------------------------------------------------------------

TEST(CpuBackendTest, IsRegisteredForTheCpu) {
  Backend& backend = Cpu();
  EXPECT_EQ(backend.type(), DeviceType::kCPU);
  EXPECT_EQ(backend.DeviceCount(), CpuDeviceCount());
  EXPECT_EQ(backend.UnavailableReason(), "");
  EXPECT_EQ(backend.AllocatePinnedHost(64), nullptr);
}

TEST(CpuBackendTest, HasOneAllocatorPerLogicalDevice) {
  Allocator& cpu0 = Cpu().GetAllocator(0);
  EXPECT_EQ(&cpu0, &Cpu().GetAllocator(0));
  EXPECT_NE(&cpu0, &Cpu().GetAllocator(1));
  std::shared_ptr<void> block = cpu0.Allocate(100);
  ASSERT_NE(block, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(block.get()) % kHostAlignment, 0u);
  EXPECT_THROW(Cpu().GetAllocator(-1), Error);
}

TEST(CpuBackendTest, CopiesBytes) {
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{1000}, size_t{5} << 20}) {
    std::vector<char> src(bytes), dst(bytes, 0), back(bytes, 0), other(bytes, 0);
    for (size_t i = 0; i < bytes; ++i) src[i] = static_cast<char>(i * 7 + 3);
    Cpu().CopyFromHost(0, dst.data(), src.data(), bytes);
    Cpu().CopyBetweenDevices(1, other.data(), 0, dst.data(), bytes);
    Cpu().CopyToHost(1, back.data(), other.data(), bytes);
    Cpu().Synchronize(0);
    EXPECT_EQ(src, dst);
    EXPECT_EQ(src, back);
  }
}

// ---- Copy and Fill -----------------------------------------------------------------------

TEST(CpuBackendTest, CopiesStridedViews) {
  WithEachThreadCount([] {
    // src: a [A, B, C] tensor viewed with its dimensions permuted to [C, A, B].
    const int64_t A = 37, B = 41, C = 53;  // 80 401 elements: enough to be split
    std::vector<float> base = RandomFloats(A * B * C, -5, 5, 1);
    KernelTensor src = View(base.data(), {C, A, B}, {1, B * C, C});
    std::vector<float> out(A * B * C, kNaN);
    Cpu().Copy(0, View(out.data(), {C, A, B}), src);
    for (int64_t i = 0; i < A * B * C; ++i) {
      ASSERT_EQ(out[i], base[OffsetOf(src, i)]) << "element " << i;
    }
    // dst strided: every other element of a larger buffer, in reverse row order.
    std::vector<float> wide(2 * A * B * C, -1.0f);
    KernelTensor dst = View(wide.data() + 2 * (A - 1) * B * C, {A, B * C}, {-2 * B * C, 2});
    Cpu().Copy(0, dst, View(base.data(), {A, B * C}));
    for (int64_t i = 0; i < A * B * C; ++i) {
      ASSERT_EQ(wide.data()[2 * (A - 1) * B * C + OffsetOf(dst, i)], base[i]);
    }
    for (int64_t i = 1; i < 2 * A * B * C; i += 2) ASSERT_EQ(wide[i], -1.0f);
  });
}

TEST(CpuBackendTest, CopyBroadcastsStrideZero) {
  std::vector<float> row = {1.5f, -2.0f, 3.25f};
  std::vector<float> out(4 * 3);
  Cpu().Copy(0, View(out.data(), {4, 3}), View(row.data(), {4, 3}, {0, 1}));
  for (int r = 0; r < 4; ++r) {
    for (int c = 0; c < 3; ++c) EXPECT_EQ(out[r * 3 + c], row[c]);
  }
}

// A column broadcast along rows (conv2d's bias over its output planes), rows long enough for
// the vector loop and its tail, on the baseline and AVX2 builds, float and int64.
TEST(CpuBackendTest, CopyBroadcastsAColumnAlongRows) {
  for (const bool baseline : {false, true}) {
    const vec::BaselineVectorsForTesting vectors(baseline);
    std::vector<float> column = {1.5f, -0.0f, kNaN, 3.25f, -7.0f};
    std::vector<float> out(5 * 37, 0.0f);
    Cpu().Copy(0, View(out.data(), {5, 37}), View(column.data(), {5, 37}, {1, 0}));
    for (int r = 0; r < 5; ++r) {
      for (int c = 0; c < 37; ++c) {
        ASSERT_EQ(std::memcmp(&out[r * 37 + c], &column[r], sizeof(float)), 0) << r << ", " << c;
      }
    }
    std::vector<float> from_int(3 * 21, 0.0f);
    std::vector<int64_t> ints = {-4, 0, 1 << 20};
    KernelTensor int_view = View(ints.data(), {3, 21}, {1, 0});
    Cpu().Copy(0, View(from_int.data(), {3, 21}), int_view);
    for (int r = 0; r < 3; ++r) {
      for (int c = 0; c < 21; ++c) ASSERT_EQ(from_int[r * 21 + c], static_cast<float>(ints[r]));
    }
  }
}

TEST(CpuBackendTest, CopyConvertsDtypes) {
  WithEachThreadCount([] {
    const int64_t n = 70001;
    std::vector<float> floats = RandomFloats(n, -1000, 1000, 2);
    floats[0] = -2.7f;  // conversion truncates toward zero, like static_cast and PyTorch
    floats[1] = 2.7f;
    std::vector<int64_t> ints(n);
    Cpu().Copy(0, View(ints.data(), {n}), View(floats.data(), {n}));
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(ints[i], static_cast<int64_t>(floats[i]));
    EXPECT_EQ(ints[0], -2);
    EXPECT_EQ(ints[1], 2);

    std::vector<int64_t> big = RandomInts(n, -(int64_t{1} << 40), int64_t{1} << 40, 3);
    std::vector<float> back(n);
    // Transposed source: a [n/7, 7] buffer read as [7, n/7].
    const int64_t rows = 7, cols = n / 7;
    Cpu().Copy(0, View(back.data(), {rows, cols}), View(big.data(), {rows, cols}, {1, rows}));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        ASSERT_EQ(back[r * cols + c], static_cast<float>(big[c * rows + r]));
      }
    }
  });
}

TEST(CpuBackendTest, CopyHandlesEmptyAndZeroDimTensors) {
  float scalar_in = 4.5f, scalar_out = 0.0f;
  Cpu().Copy(0, View(&scalar_out, {}), View(&scalar_in, {}));
  EXPECT_EQ(scalar_out, 4.5f);
  int64_t converted = 0;
  Cpu().Copy(0, View(&converted, {}), View(&scalar_in, {}));
  EXPECT_EQ(converted, 4);
  // Empty: nothing is read or written (null pointers would crash otherwise).
  Cpu().Copy(0, View(static_cast<float*>(nullptr), {3, 0, 2}),
             View(static_cast<float*>(nullptr), {3, 0, 2}));
  // A view copied onto itself.
  std::vector<float> same = {1, 2, 3};
  Cpu().Copy(0, View(same.data(), {3}), View(same.data(), {3}));
  EXPECT_EQ(same, (std::vector<float>{1, 2, 3}));
}

TEST(CpuBackendTest, CopyRejectsMismatchedShapes) {
  std::vector<float> a(6), b(6);
  EXPECT_THROW(Cpu().Copy(0, View(a.data(), {2, 3}), View(b.data(), {3, 2})), Error);
  EXPECT_THROW(Cpu().Copy(0, View(a.data(), {6}), View(b.data(), {2, 3})), Error);
}

TEST(CpuBackendTest, FillsStridedViewsOfBothDtypes) {
  WithEachThreadCount([] {
    const int64_t n = 100003;
    std::vector<float> floats(2 * n, 1.0f);
    Cpu().Fill(0, View(floats.data(), {n}, {2}), -3.5);
    for (int64_t i = 0; i < 2 * n; ++i) ASSERT_EQ(floats[i], i % 2 == 0 ? -3.5f : 1.0f);
    std::vector<int64_t> ints(n, 0);
    Cpu().Fill(0, View(ints.data(), {n}), 1e12);
    for (int64_t x : ints) ASSERT_EQ(x, int64_t{1000000000000});
    float scalar = 0;
    Cpu().Fill(0, View(&scalar, {}), 2.0);
    EXPECT_EQ(scalar, 2.0f);
    Cpu().Fill(0, View(static_cast<float*>(nullptr), {0}), 2.0);
  });
}

// ---- Unary and Binary ----------------------------------------------------------------------

const std::vector<UnaryOp> kAllUnaryOps = AllUnaryOps();

const std::vector<BinaryOp> kAllBinaryOps = AllBinaryOps();

TEST(CpuBackendTest, UnaryMatchesTheSharedScalarMath) {
  WithEachThreadCount([] {
    const int64_t rows = 129, cols = 517;  // 66 693 elements
    // Positive inputs for log/sqrt/pow, with exact ties for kGeScalar.
    std::vector<float> input = RandomFloats(rows * cols, 0.01f, 4.0f, 4);
    for (int64_t i = 0; i < rows * cols; i += 97) input[i] = 1.5f;
    const float scalar = 1.5f;
    for (UnaryOp op : kAllUnaryOps) {
      SCOPED_TRACE("op " + std::to_string(static_cast<int>(op)));
      std::vector<float> signed_input = input;
      if (op != UnaryOp::kLog && op != UnaryOp::kSqrt && op != UnaryOp::kPowScalar) {
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
      SCOPED_TRACE("op " + std::to_string(static_cast<int>(op)));
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
      const bool want_max = op == ReduceKind::kMax || op == ReduceKind::kArgMax;
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
      const bool arg = op == ReduceKind::kArgMax || op == ReduceKind::kArgMin;
      out[o * inner + j] = arg ? static_cast<double>(best) : static_cast<double>(at(best));
    }
  }
  return out;
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
      for (ReduceKind op : {ReduceKind::kSum, ReduceKind::kMax, ReduceKind::kMin,
                            ReduceKind::kArgMax, ReduceKind::kArgMin}) {
        const std::vector<double> expected = ReferenceReduce(op, x, c.outer, c.reduce, c.inner);
        const bool arg = op == ReduceKind::kArgMax || op == ReduceKind::kArgMin;
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
  for (ReduceKind op :
       {ReduceKind::kMax, ReduceKind::kMin, ReduceKind::kArgMax, ReduceKind::kArgMin}) {
    const std::vector<double> expected = ReferenceReduce(op, x, rows, cols, 1);
    const bool arg = op == ReduceKind::kArgMax || op == ReduceKind::kArgMin;
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
  for (ReduceKind op : {ReduceKind::kSum, ReduceKind::kMax, ReduceKind::kMin, ReduceKind::kArgMax,
                        ReduceKind::kArgMin}) {
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
        Cpu().Softmax(0, kFloat32, log, out.data(), x.data(), c.outer, c.dim, c.inner);
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
  Cpu().Softmax(0, kFloat32, false, out.data(), inf_row.data(), 1, 3, 1);
  EXPECT_EQ(out, (std::vector<float>{0, 1, 0}));
  Cpu().Softmax(0, kFloat32, true, out.data(), nullptr, 0, 3, 1);  // empty
}

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

// ---- Convolution helpers and pooling -----------------------------------------------------

// Strides, padding and dilation, rows long enough for the vector loops and short ones, and
// each in both column layouts.
std::vector<Conv2dGeometry> ConvGeometries() {
  std::vector<Conv2dGeometry> geometries = {Conv2dGeometry::Make(2, 3, 7, 9, 3, 3, 1, 1, 1, 1),
                                            Conv2dGeometry::Make(1, 2, 8, 5, 2, 3, 2, 1, 0, 1),
                                            Conv2dGeometry::Make(3, 1, 6, 6, 5, 4, 3, 2, 2, 2),
                                            Conv2dGeometry::Make(1, 1, 1, 1, 1, 1, 1, 1, 0, 0),
                                            Conv2dGeometry::Make(4, 16, 28, 28, 5, 5, 1, 1, 2, 2),
                                            Conv2dGeometry::Make(3, 2, 14, 37, 3, 3, 2, 2, 1, 1)};
  for (Conv2dGeometry g : {Conv2dGeometry::Make(2, 3, 11, 30, 3, 3, 1, 1, 2, 2),
                           Conv2dGeometry::Make(2, 2, 12, 19, 3, 2, 2, 1, 1, 3)}) {
    g.dilation_h = 2;
    g.dilation_w = 3;
    geometries.push_back(g);
  }
  const size_t count = geometries.size();
  for (size_t i = 0; i < count; ++i) {
    geometries.push_back(geometries[i]);
    geometries.back().batch_in_columns = true;
  }
  return geometries;
}

std::vector<float> ReferenceIm2Col(const Conv2dGeometry& g, const std::vector<float>& image) {
  const int64_t oh = g.out_h(), ow = g.out_w();
  std::vector<float> columns(g.batch * g.channels * g.kernel_h * g.kernel_w * oh * ow, kNaN);
  for (int64_t b = 0; b < g.batch; ++b) {
    for (int64_t c = 0; c < g.channels; ++c) {
      for (int64_t ky = 0; ky < g.kernel_h; ++ky) {
        for (int64_t kx = 0; kx < g.kernel_w; ++kx) {
          const int64_t row = g.columns_start(b, c, oh * ow) +
                              (ky * g.kernel_w + kx) * g.columns_tap_stride(oh * ow);
          for (int64_t y = 0; y < oh; ++y) {
            for (int64_t x = 0; x < ow; ++x) {
              const int64_t iy = y * g.stride_h - g.pad_h + ky * g.dilation_h;
              const int64_t ix = x * g.stride_w - g.pad_w + kx * g.dilation_w;
              const bool inside = iy >= 0 && iy < g.height && ix >= 0 && ix < g.width;
              columns[row + y * ow + x] =
                  inside ? image[((b * g.channels + c) * g.height + iy) * g.width + ix] : 0.0f;
            }
          }
        }
      }
    }
  }
  return columns;
}

TEST(CpuBackendTest, Im2ColMatchesTheDefinition) {
  WithEachThreadCount([] {
    for (const bool baseline : {false, true}) {
      const vec::BaselineVectorsForTesting vectors(baseline);
      for (const Conv2dGeometry& g : ConvGeometries()) {
        std::vector<float> image =
            RandomFloats(g.batch * g.channels * g.height * g.width, -1, 1, 18);
        const std::vector<float> expected = ReferenceIm2Col(g, image);
        std::vector<float> columns(expected.size(), kNaN);
        Cpu().Im2Col(0, kFloat32, g, image.data(), columns.data());
        ASSERT_EQ(columns, expected);
      }
    }
  });
}

TEST(CpuBackendTest, Col2ImIsTheAdjointOfIm2Col) {
  WithEachThreadCount([] {
    for (const bool baseline : {false, true}) {
      const vec::BaselineVectorsForTesting vectors(baseline);
      for (const Conv2dGeometry& g : ConvGeometries()) {
        const int64_t image_size = g.batch * g.channels * g.height * g.width;
        const int64_t column_size =
            g.batch * g.channels * g.kernel_h * g.kernel_w * g.out_h() * g.out_w();
        std::vector<float> x = RandomFloats(image_size, -1, 1, 19);
        std::vector<float> y = RandomFloats(column_size, -1, 1, 20);
        std::vector<float> im2col_x(column_size), col2im_y(image_size, kNaN);
        Cpu().Im2Col(0, kFloat32, g, x.data(), im2col_x.data());
        Cpu().Col2Im(0, kFloat32, g, y.data(), col2im_y.data());
        // <col2im(y), x> == <y, im2col(x)>
        double lhs = 0, rhs = 0;
        for (int64_t i = 0; i < image_size; ++i) lhs += double{col2im_y[i]} * x[i];
        for (int64_t i = 0; i < column_size; ++i) rhs += double{y[i]} * im2col_x[i];
        EXPECT_NEAR(lhs, rhs, 1e-4 * (1 + std::abs(rhs)));
        // And elementwise: col2im sums every column entry into the pixel it came from.
        std::vector<float> expected(image_size, 0.0f);
        const std::vector<float> index_image = [&] {
          std::vector<float> v(image_size);
          std::iota(v.begin(), v.end(), 0.0f);
          return v;
        }();
        const std::vector<float> source = ReferenceIm2Col(g, index_image);
        const std::vector<float> ones(image_size, 1.0f);
        const std::vector<float> inside = ReferenceIm2Col(g, ones);  // 0 where padding
        for (int64_t i = 0; i < column_size; ++i) {
          if (inside[i] != 0.0f) expected[static_cast<int64_t>(source[i])] += y[i];
        }
        for (int64_t i = 0; i < image_size; ++i) ASSERT_NEAR(col2im_y[i], expected[i], 1e-5);
      }
    }
  });
}

TEST(CpuBackendTest, Im2ColRejectsBadGeometry) {
  float buffer[16] = {};
  EXPECT_THROW(
      Cpu().Im2Col(0, kFloat32, Conv2dGeometry::Make(1, 1, 2, 2, 3, 3, 1, 1, 0, 0), buffer, buffer),
      Error);
  EXPECT_THROW(
      Cpu().Im2Col(0, kFloat32, Conv2dGeometry::Make(1, 1, 4, 4, 2, 2, 0, 1, 0, 0), buffer, buffer),
      Error);
}

TEST(CpuBackendTest, MaxPoolWithPaddingMatchesTheDefinition) {
  WithEachThreadCount([] {
    for (const Conv2dGeometry& g : {Conv2dGeometry::Make(2, 3, 7, 9, 3, 3, 2, 2, 1, 1),
                                    Conv2dGeometry::Make(1, 2, 8, 5, 2, 2, 2, 2, 0, 0),
                                    Conv2dGeometry::Make(3, 4, 6, 6, 4, 3, 1, 2, 2, 1),
                                    Conv2dGeometry::Make(8, 32, 28, 28, 2, 2, 2, 2, 1, 0)}) {
      const int64_t plane = g.height * g.width, out_plane = g.out_h() * g.out_w();
      const int64_t planes = g.batch * g.channels;
      // Negative values so that padding (-inf, never chosen) cannot be confused with zeros,
      // and a coarse grid so that windows hold ties.
      std::vector<float> input = RandomFloats(planes * plane, -8, -1, 21);
      for (float& v : input) v = std::round(v);
      std::vector<float> output(planes * out_plane, kNaN);
      std::vector<int64_t> argmax(planes * out_plane, -1);
      Cpu().MaxPool2d(0, kFloat32, g, input.data(), output.data(), argmax.data());
      for (int64_t p = 0; p < planes; ++p) {
        for (int64_t oy = 0; oy < g.out_h(); ++oy) {
          for (int64_t ox = 0; ox < g.out_w(); ++ox) {
            float best = -kInf;
            int64_t best_at = -1;
            for (int64_t ky = 0; ky < g.kernel_h; ++ky) {
              for (int64_t kx = 0; kx < g.kernel_w; ++kx) {
                const int64_t y = oy * g.stride_h - g.pad_h + ky;
                const int64_t x = ox * g.stride_w - g.pad_w + kx;
                if (y < 0 || y >= g.height || x < 0 || x >= g.width) continue;
                const float v = input[p * plane + y * g.width + x];
                // First in row-major window order on ties.
                if (best_at < 0 || v > best) {  // row-major window order: first tie stays
                  best = v;
                  best_at = y * g.width + x;
                }
              }
            }
            const int64_t o = p * out_plane + oy * g.out_w() + ox;
            ASSERT_EQ(output[o], best);
            ASSERT_EQ(argmax[o], best_at);
          }
        }
      }
      // Backward: each output's gradient lands on its argmax; overlapping windows add up.
      std::vector<float> grad_output = RandomFloats(planes * out_plane, -1, 1, 22);
      std::vector<float> grad_input(planes * plane, kNaN), expected(planes * plane, 0.0f);
      for (int64_t p = 0; p < planes; ++p) {
        for (int64_t o = 0; o < out_plane; ++o) {
          expected[p * plane + argmax[p * out_plane + o]] += grad_output[p * out_plane + o];
        }
      }
      Cpu().MaxPool2dBackward(0, kFloat32, g, grad_output.data(), argmax.data(), grad_input.data());
      for (int64_t i = 0; i < planes * plane; ++i) ASSERT_FLOAT_EQ(grad_input[i], expected[i]);
    }
  });
}

TEST(CpuBackendTest, MaxPoolPropagatesNaN) {
  const Conv2dGeometry g = Conv2dGeometry::Make(1, 1, 2, 2, 2, 2, 2, 2, 0, 0);
  std::vector<float> input = {1, kNaN, 3, kNaN};
  float output = 0;
  int64_t argmax = -1;
  Cpu().MaxPool2d(0, kFloat32, g, input.data(), &output, &argmax);
  EXPECT_TRUE(std::isnan(output));
  EXPECT_EQ(argmax, 1);  // the first NaN
  EXPECT_THROW(Cpu().MaxPool2d(0, kFloat32, Conv2dGeometry::Make(1, 1, 4, 4, 2, 2, 1, 1, 2, 2),
                               input.data(), &output, &argmax),
               Error);  // padding beyond half the kernel
}

uint32_t Bits(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  return bits;
}

// Max pooling's bits and argmax against the scan of each window in row-major order (NaN
// wins, the first NaN among several; ties, -0 against +0 included, keep the earlier), on
// rows long enough for the vector loops and their tails, with the baseline build and, where
// the CPU has it, the AVX2 one.
TEST(CpuBackendTest, MaxPoolMatchesTheScanBitForBitOnEveryVectorUnit) {
  float other_nan;  // a second NaN payload, to tell which NaN was taken
  const uint32_t other_nan_bits = Bits(kNaN) | 0x1234u;
  std::memcpy(&other_nan, &other_nan_bits, sizeof(other_nan));
  std::vector<Conv2dGeometry> geometries = {
      Conv2dGeometry::Make(2, 3, 28, 28, 2, 2, 2, 2, 0, 0),
      Conv2dGeometry::Make(1, 2, 9, 61, 2, 2, 2, 2, 1, 1),
      Conv2dGeometry::Make(2, 2, 7, 45, 3, 3, 1, 1, 1, 1),
      Conv2dGeometry::Make(1, 3, 11, 50, 3, 2, 3, 3, 1, 0),
      Conv2dGeometry::Make(1, 1, 5, 70, 1, 5, 1, 5, 0, 2),
      Conv2dGeometry::Make(1, 2, 10, 33, 4, 4, 2, 2, 2, 2),
      Conv2dGeometry::Make(1, 2, 11, 42, 3, 2, 1, 2, 1, 1),
  };
  for (Conv2dGeometry g : {Conv2dGeometry::Make(2, 2, 13, 39, 3, 3, 2, 2, 1, 1),
                           Conv2dGeometry::Make(1, 2, 12, 37, 2, 2, 2, 2, 0, 0),
                           Conv2dGeometry::Make(1, 1, 10, 44, 3, 3, 3, 3, 0, 1)}) {
    g.ceil_mode = true;
    geometries.push_back(g);
  }
  for (const bool baseline : {false, true}) {
    const vec::BaselineVectorsForTesting vectors(baseline);
    SCOPED_TRACE(baseline ? "baseline build" : "best vector unit");
    for (const Conv2dGeometry& g : geometries) {
      SCOPED_TRACE(::testing::Message()
                   << g.height << "x" << g.width << " kernel " << g.kernel_h << "x" << g.kernel_w
                   << " stride " << g.stride_h << "x" << g.stride_w << " pad " << g.pad_h << "x"
                   << g.pad_w << (g.ceil_mode ? " ceil" : ""));
      const int64_t plane = g.height * g.width, out_h = g.out_h(), out_w = g.out_w();
      const int64_t out_plane = out_h * out_w, planes = g.batch * g.channels;
      // A coarse grid for ties, zeros of both signs and a few NaNs of two payloads.
      std::vector<float> input = RandomFloats(planes * plane, -3, 3, 31);
      const std::vector<int64_t> kind = RandomInts(planes * plane, 0, 49, 32);
      for (int64_t i = 0; i < planes * plane; ++i) {
        input[i] = std::round(input[i]);
        if (input[i] == 0.0f && kind[i] % 2 == 0) input[i] = -0.0f;
        if (kind[i] == 0) input[i] = kNaN;
        if (kind[i] == 1) input[i] = other_nan;
      }
      std::vector<float> output(planes * out_plane, 7.0f);
      std::vector<int64_t> argmax(planes * out_plane, -1);
      Cpu().MaxPool2d(0, kFloat32, g, input.data(), output.data(), argmax.data());
      for (int64_t p = 0; p < planes; ++p) {
        for (int64_t oy = 0; oy < out_h; ++oy) {
          for (int64_t ox = 0; ox < out_w; ++ox) {
            int64_t best_at = -1;
            for (int64_t y = oy * g.stride_h - g.pad_h; y < oy * g.stride_h - g.pad_h + g.kernel_h;
                 ++y) {
              for (int64_t x = ox * g.stride_w - g.pad_w;
                   x < ox * g.stride_w - g.pad_w + g.kernel_w; ++x) {
                if (y < 0 || y >= g.height || x < 0 || x >= g.width) continue;
                const float v = input[p * plane + y * g.width + x];
                const float best = best_at < 0 ? 0.0f : input[p * plane + best_at];
                if (best_at < 0 || v > best || (std::isnan(v) && !std::isnan(best))) {
                  best_at = y * g.width + x;
                }
              }
            }
            const int64_t o = p * out_plane + oy * out_w + ox;
            ASSERT_EQ(argmax[o], best_at) << "output " << oy << ", " << ox << " of plane " << p;
            ASSERT_EQ(Bits(output[o]), Bits(input[p * plane + best_at]))
                << "output " << oy << ", " << ox << " of plane " << p;
          }
        }
      }
    }
  }
}

// ---- Gather / scatter --------------------------------------------------------------------

TEST(CpuBackendTest, GatherAndScatterAddColumns) {
  WithEachThreadCount([] {
    const int64_t rows = 100003, cols = 11;
    std::vector<float> src = RandomFloats(rows * cols, -1, 1, 23);
    std::vector<int64_t> idx = RandomInts(rows, 0, cols - 1, 24);
    std::vector<float> gathered(rows);
    Cpu().GatherColumns(0, kFloat32, gathered.data(), src.data(), idx.data(), rows, cols);
    for (int64_t r = 0; r < rows; ++r) ASSERT_EQ(gathered[r], src[r * cols + idx[r]]);

    std::vector<float> dst = src, expected = src;
    for (int64_t r = 0; r < rows; ++r) expected[r * cols + idx[r]] += gathered[r];
    Cpu().ScatterAddColumns(0, kFloat32, dst.data(), gathered.data(), idx.data(), rows, cols);
    ASSERT_EQ(dst, expected);
    Cpu().GatherColumns(0, kFloat32, nullptr, nullptr, nullptr, 0, cols);
    Cpu().ScatterAddColumns(0, kFloat32, nullptr, nullptr, nullptr, 0, cols);
  });
}

// ---- Random numbers ----------------------------------------------------------------------

TEST(CpuBackendTest, RandomUniformIsPhiloxAtOffsetPlusIndex) {
  WithEachThreadCount([] {
    const int64_t n = 100001;
    const uint64_t seed = 1234, offset = 7;  // unaligned: starts mid-block
    std::vector<float> out(n);
    Cpu().RandomUniform(0, kFloat32, out.data(), n, seed, offset, -2.0f, 3.0f);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(out[i], -2.0f + 5.0f * philox::Uniform(seed, offset + i)) << "at " << i;
    }
  });
}

TEST(CpuBackendTest, RandomNormalIsPhiloxAtOffsetPlusIndex) {
  WithEachThreadCount([] {
    const int64_t n = 100001;
    const uint64_t seed = 99, offset = 3;
    std::vector<float> out(n);
    Cpu().RandomNormal(0, kFloat32, out.data(), n, seed, offset, 0.5f, 2.0f);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(out[i], 0.5f + 2.0f * philox::Normal(seed, offset + i)) << "at " << i;
    }
  });
}

TEST(CpuBackendTest, RandomNumbersDoNotDependOnHowTheRequestIsSplit) {
  const int64_t n = 200000;
  const int original = CpuDeviceCount();
  std::vector<float> whole_uniform(n), whole_normal(n);
  SetCpuDeviceCount(1);  // all cores on cpu:0
  Cpu().RandomUniform(0, kFloat32, whole_uniform.data(), n, 5, 11, 0.0f, 1.0f);
  Cpu().RandomNormal(0, kFloat32, whole_normal.data(), n, 5, 11, 0.0f, 1.0f);
  SetCpuDeviceCount(HardwareCores());  // one thread per device
  // The same counters requested in pieces that start and end inside Philox blocks.
  std::vector<float> uniform(n), normal(n);
  const std::vector<int64_t> cuts = {0, 1, 6, 77777, 155557, n};
  for (size_t piece = 0; piece + 1 < cuts.size(); ++piece) {
    const int64_t begin = cuts[piece], size = cuts[piece + 1] - begin;
    Cpu().RandomUniform(0, kFloat32, uniform.data() + begin, size, 5, 11 + begin, 0.0f, 1.0f);
    Cpu().RandomNormal(0, kFloat32, normal.data() + begin, size, 5, 11 + begin, 0.0f, 1.0f);
  }
  SetCpuDeviceCount(original);
  EXPECT_EQ(uniform, whole_uniform);
  EXPECT_EQ(normal, whole_normal);
  // Another seed gives other numbers.
  Cpu().RandomUniform(0, kFloat32, uniform.data(), n, 6, 11, 0.0f, 1.0f);
  EXPECT_NE(uniform, whole_uniform);
}

TEST(CpuBackendTest, RandomDistributionsHaveTheRightMoments) {
  const int64_t n = 1 << 20;
  std::vector<float> u(n), z(n);
  Cpu().RandomUniform(0, kFloat32, u.data(), n, 42, 0, -1.0f, 3.0f);
  Cpu().RandomNormal(0, kFloat32, z.data(), n, 42, 0, 1.5f, 0.5f);
  auto moments = [](const std::vector<float>& v) {
    double sum = 0, sum_sq = 0;
    for (float x : v) sum += x;
    const double mean = sum / v.size();
    for (float x : v) sum_sq += (x - mean) * (x - mean);
    return std::make_pair(mean, sum_sq / (v.size() - 1));
  };
  const auto [u_mean, u_var] = moments(u);
  const auto [z_mean, z_var] = moments(z);
  // Five standard errors: mean error sigma / sqrt(n); variance error ~ sigma^2 sqrt(2 / n)
  // (uniform: sqrt(4/5) instead of sqrt(2)).
  const double u_sigma2 = 16.0 / 12.0;
  EXPECT_NEAR(u_mean, 1.0, 5 * std::sqrt(u_sigma2 / n));
  EXPECT_NEAR(u_var, u_sigma2, 5 * u_sigma2 * std::sqrt(0.8 / n));
  EXPECT_NEAR(z_mean, 1.5, 5 * 0.5 / std::sqrt(n));
  EXPECT_NEAR(z_var, 0.25, 5 * 0.25 * std::sqrt(2.0 / n));
  EXPECT_GE(*std::min_element(u.begin(), u.end()), -1.0f);
  EXPECT_LT(*std::max_element(u.begin(), u.end()), 3.0f);
  // Tails: about 0.27% of a normal lies beyond three standard deviations.
  const double beyond =
      std::count_if(z.begin(), z.end(), [](float x) { return std::abs(x - 1.5f) > 1.5f; }) /
      static_cast<double>(n);
  EXPECT_NEAR(beyond, 0.0027, 0.0005);
}

TEST(CpuBackendTest, RandomUniformStaysBelowHigh) {
  // With high one ulp above low, low + (high - low) * u rounds up to high for about half
  // of the u in [0, 1); the interval is half-open, so every value must be low.
  const float low = 1.0f, high = std::nextafter(1.0f, 2.0f);
  std::vector<float> values(1000);
  Cpu().RandomUniform(0, kFloat32, values.data(), 1000, 8, 0, low, high);
  for (float v : values) ASSERT_EQ(v, low);
}

// ---- 16-bit floats, integers and bool ----------------------------------------------------
// Each kernel in BFloat16 and Half against the float32 kernel run on the same (rounded)
// inputs: where the 16-bit kernel computes exactly the float32 function and rounds once, the
// results must be the float32 results rounded, bit for bit; elsewhere (accumulations whose
// order or precision differ) within PyTorch's tolerance.

template <typename T>
class ReducedFloatTest : public ::testing::Test {};
using ReducedFloatTypes = ::testing::Types<BFloat16, Half>;
TYPED_TEST_SUITE(ReducedFloatTest, ReducedFloatTypes);

template <typename T>
std::vector<T> Rounded(const std::vector<float>& values) {
  std::vector<T> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = T(values[i]);
  return out;
}

template <typename T>
std::vector<float> Widened(const std::vector<T>& values) {
  return std::vector<float>(values.begin(), values.end());
}

// PyTorch's tolerance for T (torch.testing.assert_close), rtol scaled by `scale` for long
// accumulations.
template <typename T>
::testing::AssertionResult CloseFor(float expected, float actual, float scale = 1.0f) {
  const float rtol = (std::is_same_v<T, BFloat16> ? 1.6e-2f : 1e-3f) * scale;
  const float atol = 1e-5f * scale;
  if (std::isnan(expected) && std::isnan(actual)) return ::testing::AssertionSuccess();
  if (std::fabs(expected - actual) <= atol + rtol * std::fabs(expected)) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "expected " << expected << " but got " << actual;
}

// Whether the 16-bit value `actual` has the bits of `expected` rounded to T.
template <typename T>
::testing::AssertionResult IsRounded(float expected, T actual) {
  const T want(expected);
  if (want.bits == actual.bits) return ::testing::AssertionSuccess();
  // NaN payloads may differ only where the float NaNs did.
  if (std::isnan(expected) && std::isnan(static_cast<float>(actual))) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "expected " << expected << " rounded (" << static_cast<float>(want) << ", bits "
         << want.bits << ") but got " << static_cast<float>(actual) << " (bits " << actual.bits
         << ")";
}

// Float values that exercise every rounding case of both conversions: specials, the limits of
// both formats, subnormals of both, exact ties and their neighbours, and random bit patterns.
std::vector<float> ConversionProbes() {
  std::vector<float> v = {0.0f,   -0.0f,   kInf,     -kInf,    kNaN,      -kNaN,
                          1.0f,   -1.0f,   65504.0f, 65519.0f, 65520.0f,  65536.0f,
                          1e-8f,  -1e-8f,  6.1e-5f,  5.96e-8f, 2.98e-8f,  2.99e-8f,
                          1e-45f, 3.4e38f, -3.4e38f, 1.1f,     1.0039062f};
  const auto add_bits = [&](uint32_t u) {
    float f;
    std::memcpy(&f, &u, sizeof(f));
    v.push_back(f);
  };
  for (uint32_t sign : {0u, 0x80000000u}) {
    // NaNs with payloads in the bits each format keeps and drops; the smallest NaN.
    for (uint32_t u : {0x7f800001u, 0x7fc00000u, 0x7fbfffffu, 0x7f802000u, 0x7fffffffu}) {
      add_bits(sign | u);
    }
    for (uint32_t h = 0; h < 0x7c00u; h += 7) {
      // Every 7th float16 value (normal and subnormal), the ties halfway to the next, and
      // one float ulp on either side of the ties.
      const uint32_t base = vec::conversions_internal::Bits(
          vec::conversions_internal::HalfToFloat(static_cast<uint16_t>(h)));
      const float next = vec::conversions_internal::HalfToFloat(static_cast<uint16_t>(h + 1));
      const float tie = (vec::conversions_internal::FromBits(base) + next) / 2;
      const uint32_t t = vec::conversions_internal::Bits(tie);
      add_bits(sign | base);
      for (uint32_t u : {t - 1, t, t + 1}) add_bits(sign | u);
    }
    // bfloat16 ties (low 16 bits 0x8000) over the whole exponent range, and their neighbours.
    for (uint32_t e = 0; e < 255; ++e) {
      for (uint32_t low : {0x7fffu, 0x8000u, 0x8001u, 0x18000u}) {
        add_bits(sign | (e << 23) | low);
      }
    }
  }
  std::mt19937 rng(2024);
  for (int i = 0; i < 200000; ++i) add_bits(rng());
  return v;
}

template <typename T>
void CheckConversions() {
  // To float: all 65536 bit patterns.
  std::vector<T> all(65536);
  for (uint32_t b = 0; b < 65536; ++b) all[b] = T::FromBits(static_cast<uint16_t>(b));
  std::vector<float> widened(all.size());
  vec::ToFloat(all.data(), widened.data(), static_cast<int64_t>(all.size()));
  for (uint32_t b = 0; b < 65536; ++b) {
    const float expected = all[b];
    ASSERT_EQ(vec::conversions_internal::Bits(expected),
              vec::conversions_internal::Bits(widened[b]))
        << "bits " << b;
  }
  // From float: the probes, bit for bit against half.h's scalar constructor.
  const std::vector<float> probes = ConversionProbes();
  std::vector<T> narrowed(probes.size());
  vec::FromFloat(probes.data(), narrowed.data(), static_cast<int64_t>(probes.size()));
  for (size_t i = 0; i < probes.size(); ++i) {
    ASSERT_EQ(T(probes[i]).bits, narrowed[i].bits)
        << "float bits " << vec::conversions_internal::Bits(probes[i]);
  }
  // Through the backend's Copy, contiguous (the vectorised loops) and strided (per element).
  std::vector<T> copied(probes.size());
  const int64_t n = static_cast<int64_t>(probes.size());
  Cpu().Copy(0, View(copied.data(), {n}), View(probes.data(), {n}));
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(T(probes[i]).bits, copied[i].bits);
  std::vector<float> back(all.size(), 0.0f);
  Cpu().Copy(0, View(back.data(), {65536}), View(all.data(), {65536}));
  for (uint32_t b = 0; b < 65536; ++b) {
    ASSERT_EQ(vec::conversions_internal::Bits(all[b]), vec::conversions_internal::Bits(back[b]));
  }
  std::vector<T> strided(2 * 1000);
  Cpu().Copy(0, View(strided.data(), {1000}, {2}), View(probes.data(), {1000}));
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(T(probes[i]).bits, strided[2 * i].bits);
}

TYPED_TEST(ReducedFloatTest, ConversionsAreBitExactOnEveryVectorUnit) {
  for (bool baseline : {false, true}) {
    SCOPED_TRACE(baseline ? "baseline vectors" : "best vectors");
    vec::BaselineVectorsForTesting force(baseline);
    CheckConversions<TypeParam>();
  }
}

TYPED_TEST(ReducedFloatTest, UnaryIsTheFloatFunctionRoundedOnce) {
  using T = TypeParam;
  const int64_t rows = 37, cols = 1001;  // crosses the float chunks, splits over threads
  std::vector<T> input = Rounded<T>(RandomFloats(rows * cols, -3, 3, 31));
  input[5] = T(kNaN);
  input[6] = T(kInf);
  const std::vector<float> input32 = Widened(input);
  for (UnaryOp op : {UnaryOp::kNeg, UnaryOp::kExp, UnaryOp::kLog, UnaryOp::kRelu, UnaryOp::kSqrt,
                     UnaryOp::kAbs, UnaryOp::kTanh, UnaryOp::kSigmoid, UnaryOp::kSquare,
                     UnaryOp::kAddScalar, UnaryOp::kMulScalar, UnaryOp::kPowScalar,
                     UnaryOp::kGeScalar, UnaryOp::kGelu, UnaryOp::kGeluDerivative}) {
    SCOPED_TRACE("op " + std::to_string(static_cast<int>(op)));
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
  for (int op_index = 0; op_index < kNumBinaryOps; ++op_index) {
    const BinaryOp op = static_cast<BinaryOp>(op_index);
    SCOPED_TRACE("op " + std::to_string(op_index));
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
      for (ReduceKind op : {ReduceKind::kSum, ReduceKind::kMax, ReduceKind::kMin,
                            ReduceKind::kArgMax, ReduceKind::kArgMin}) {
        const bool arg = op == ReduceKind::kArgMax || op == ReduceKind::kArgMin;
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
    Cpu().Softmax(0, kFloat32, log, expected.data(), x32.data(), outer, dim, inner);
    Cpu().Softmax(0, DTypeOf<T>::value, log, out.data(), x.data(), outer, dim, inner);
    for (size_t i = 0; i < x.size(); ++i) ASSERT_TRUE(CloseFor<T>(expected[i], out[i])) << i;
  }
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

TYPED_TEST(ReducedFloatTest, ConvolutionAndPoolingKernelsMatchFloat32) {
  using T = TypeParam;
  const DType dtype = DTypeOf<T>::value;
  Conv2dGeometry g = Conv2dGeometry::Make(2, 3, 9, 11, 3, 3, 2, 1, 1, 1);
  const int64_t image_size = g.batch * g.channels * g.height * g.width;
  const int64_t columns_size =
      g.batch * g.channels * g.kernel_h * g.kernel_w * g.out_h() * g.out_w();
  std::vector<T> image = Rounded<T>(RandomFloats(image_size, -2, 2, 81));
  image[4] = T(kNaN);
  const std::vector<float> image32 = Widened(image);
  // Im2Col moves values: exact.
  std::vector<float> columns32(columns_size);
  std::vector<T> columns(columns_size);
  Cpu().Im2Col(0, kFloat32, g, image32.data(), columns32.data());
  Cpu().Im2Col(0, dtype, g, image.data(), columns.data());
  for (int64_t i = 0; i < columns_size; ++i) ASSERT_TRUE(IsRounded(columns32[i], columns[i]));
  // Col2Im sums each pixel's taps in float, in the float32 kernel's order: rounded once.
  std::vector<T> grad_columns = Rounded<T>(RandomFloats(columns_size, -2, 2, 82));
  const std::vector<float> grad_columns32 = Widened(grad_columns);
  std::vector<float> summed32(image_size);
  std::vector<T> summed(image_size);
  Cpu().Col2Im(0, kFloat32, g, grad_columns32.data(), summed32.data());
  Cpu().Col2Im(0, dtype, g, grad_columns.data(), summed.data());
  for (int64_t i = 0; i < image_size; ++i) ASSERT_TRUE(IsRounded(summed32[i], summed[i]));

  // Max pooling (overlapping windows) and its backward, average pooling and adaptive average
  // pooling and their backwards: computed in float, rounded once.
  Conv2dGeometry pool = Conv2dGeometry::Make(2, 3, 9, 11, 3, 3, 2, 2, 1, 1);
  const int64_t out_size = pool.batch * pool.channels * pool.out_h() * pool.out_w();
  std::vector<float> pooled32(out_size);
  std::vector<T> pooled(out_size);
  std::vector<int64_t> at32(out_size), at(out_size);
  Cpu().MaxPool2d(0, kFloat32, pool, image32.data(), pooled32.data(), at32.data());
  Cpu().MaxPool2d(0, dtype, pool, image.data(), pooled.data(), at.data());
  ASSERT_EQ(at, at32);
  for (int64_t i = 0; i < out_size; ++i) ASSERT_TRUE(IsRounded(pooled32[i], pooled[i]));
  std::vector<T> grad_out = Rounded<T>(RandomFloats(out_size, -2, 2, 83));
  const std::vector<float> grad_out32 = Widened(grad_out);
  std::vector<float> grad_in32(image_size);
  std::vector<T> grad_in(image_size);
  Cpu().MaxPool2dBackward(0, kFloat32, pool, grad_out32.data(), at.data(), grad_in32.data());
  Cpu().MaxPool2dBackward(0, dtype, pool, grad_out.data(), at.data(), grad_in.data());
  for (int64_t i = 0; i < image_size; ++i) ASSERT_TRUE(IsRounded(grad_in32[i], grad_in[i]));
  for (bool include_pad : {false, true}) {
    Cpu().AvgPool2d(0, kFloat32, pool, include_pad, image32.data(), pooled32.data());
    Cpu().AvgPool2d(0, dtype, pool, include_pad, image.data(), pooled.data());
    for (int64_t i = 0; i < out_size; ++i) ASSERT_TRUE(IsRounded(pooled32[i], pooled[i]));
    Cpu().AvgPool2dBackward(0, kFloat32, pool, include_pad, grad_out32.data(), grad_in32.data());
    Cpu().AvgPool2dBackward(0, dtype, pool, include_pad, grad_out.data(), grad_in.data());
    for (int64_t i = 0; i < image_size; ++i) ASSERT_TRUE(IsRounded(grad_in32[i], grad_in[i]));
  }
  const int64_t planes = g.batch * g.channels, out_h = 4, out_w = 3;
  std::vector<float> adaptive32(planes * out_h * out_w);
  std::vector<T> adaptive(planes * out_h * out_w);
  Cpu().AdaptiveAvgPool2d(0, kFloat32, planes, g.height, g.width, out_h, out_w, image32.data(),
                          adaptive32.data());
  Cpu().AdaptiveAvgPool2d(0, dtype, planes, g.height, g.width, out_h, out_w, image.data(),
                          adaptive.data());
  for (size_t i = 0; i < adaptive.size(); ++i) ASSERT_TRUE(IsRounded(adaptive32[i], adaptive[i]));
  const std::vector<float> adaptive_grad32 = Widened(adaptive);
  Cpu().AdaptiveAvgPool2dBackward(0, kFloat32, planes, g.height, g.width, out_h, out_w,
                                  adaptive_grad32.data(), grad_in32.data());
  Cpu().AdaptiveAvgPool2dBackward(0, dtype, planes, g.height, g.width, out_h, out_w,
                                  adaptive.data(), grad_in.data());
  for (int64_t i = 0; i < image_size; ++i) ASSERT_TRUE(IsRounded(grad_in32[i], grad_in[i]));
}

TYPED_TEST(ReducedFloatTest, GathersAndScatterAdds) {
  using T = TypeParam;
  const DType dtype = DTypeOf<T>::value;
  const int64_t outer = 7, dim = 13, idx_dim = 40, inner = 5;
  std::vector<T> src = Rounded<T>(RandomFloats(outer * dim * inner, -1, 1, 91));
  const std::vector<float> src32 = Widened(src);
  std::vector<int64_t> idx = RandomInts(outer * idx_dim * inner, 0, dim - 1, 92);
  std::vector<T> gathered(idx.size());
  Cpu().Gather(0, dtype, gathered.data(), src.data(), idx.data(), outer, dim, idx_dim, inner);
  for (size_t e = 0; e < idx.size(); ++e) {
    const int64_t o = e / (idx_dim * inner), i = e % inner;
    ASSERT_EQ(gathered[e].bits, src[(o * dim + idx[e]) * inner + i].bits);
  }
  // ScatterAdd with repeated indices: PyTorch rounds after each add, so the result is within
  // the tolerance of the float32 sums, scaled by the adds per element (idx_dim / dim ~ 3).
  std::vector<T> dst = src;
  std::vector<float> dst32 = src32;
  const std::vector<float> gathered32 = Widened(gathered);
  Cpu().ScatterAdd(0, kFloat32, dst32.data(), gathered32.data(), idx.data(), outer, dim, idx_dim,
                   inner);
  Cpu().ScatterAdd(0, dtype, dst.data(), gathered.data(), idx.data(), outer, dim, idx_dim, inner);
  for (size_t i = 0; i < dst.size(); ++i) ASSERT_TRUE(CloseFor<T>(dst32[i], dst[i], 8.0f)) << i;
  // Columns: one add per element, rounded once.
  const int64_t rows = 1000, cols = 9;
  std::vector<T> table = Rounded<T>(RandomFloats(rows * cols, -1, 1, 93));
  std::vector<float> table32 = Widened(table);
  std::vector<int64_t> column = RandomInts(rows, 0, cols - 1, 94);
  std::vector<T> picked(rows);
  Cpu().GatherColumns(0, dtype, picked.data(), table.data(), column.data(), rows, cols);
  for (int64_t r = 0; r < rows; ++r) ASSERT_EQ(picked[r].bits, table[r * cols + column[r]].bits);
  const std::vector<float> picked32 = Widened(picked);
  Cpu().ScatterAddColumns(0, kFloat32, table32.data(), picked32.data(), column.data(), rows, cols);
  Cpu().ScatterAddColumns(0, dtype, table.data(), picked.data(), column.data(), rows, cols);
  for (size_t i = 0; i < table.size(); ++i) ASSERT_TRUE(IsRounded(table32[i], table[i]));
}

TYPED_TEST(ReducedFloatTest, RandomDrawsAreTheFloat32DrawsRounded) {
  using T = TypeParam;
  const DType dtype = DTypeOf<T>::value;
  const int64_t n = 100001;
  std::vector<float> uniform32(n), normal32(n);
  std::vector<T> uniform(n), normal(n);
  // [0, 1): many float32 draws round up to 1 in 16 bits; they take the value below 1.
  Cpu().RandomUniform(0, kFloat32, uniform32.data(), n, 5, 3, 0.0, 1.0);
  Cpu().RandomUniform(0, dtype, uniform.data(), n, 5, 3, 0.0, 1.0);
  const float below_one = std::is_same_v<T, BFloat16> ? 1.0f - 1.0f / 256 : 1.0f - 1.0f / 2048;
  int64_t clamped = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (static_cast<float>(T(uniform32[i])) >= 1.0f) {
      ++clamped;
      ASSERT_EQ(static_cast<float>(uniform[i]), below_one);
    } else {
      ASSERT_TRUE(IsRounded(uniform32[i], uniform[i])) << i;
    }
  }
  EXPECT_GT(clamped, 0);
  Cpu().RandomNormal(0, kFloat32, normal32.data(), n, 5, 3, 1.0, 2.0);
  Cpu().RandomNormal(0, dtype, normal.data(), n, 5, 3, 1.0, 2.0);
  for (int64_t i = 0; i < n; ++i) ASSERT_TRUE(IsRounded(normal32[i], normal[i])) << i;
}

TYPED_TEST(ReducedFloatTest, FusedOptimizerStepsComputeInFloatAndRoundOnStore) {
  using T = TypeParam;
  const DType dtype = DTypeOf<T>::value;
  const int64_t n = 40000;  // several pieces
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kAdam, OptimizerKind::kRmsprop}) {
    SCOPED_TRACE("kind " + std::to_string(static_cast<int>(kind)));
    std::vector<T> p = Rounded<T>(RandomFloats(n, -1, 1, 101));
    std::vector<T> g = Rounded<T>(RandomFloats(n, -1, 1, 102));
    std::vector<T> s0 = Rounded<T>(RandomFloats(n, 0, 1, 103));
    std::vector<T> s1 = Rounded<T>(RandomFloats(n, 0, 1, 104));
    std::vector<T> s2 = Rounded<T>(RandomFloats(n, -0.1f, 0.1f, 105));
    std::vector<float> p32 = Widened(p), g32 = Widened(g), s0_32 = Widened(s0), s1_32 = Widened(s1),
                       s2_32 = Widened(s2);
    FusedUpdate u;
    u.kind = kind;
    u.numel = n;
    u.lr = 0.01;
    u.momentum = 0.9;
    u.dampening = 0.1;
    u.weight_decay = 0.01;
    u.nesterov = true;
    u.beta1 = 0.9;
    u.beta2 = 0.999;
    u.eps = 1e-8;
    u.alpha = 0.99;
    u.step_size = 0.01 / 0.1;
    u.inv_bc2_sqrt = 1 / std::sqrt(0.001);
    u.decay_factor = 0.999;
    FusedUpdate u32 = u;
    const bool two_states = kind != OptimizerKind::kSgd, three = kind == OptimizerKind::kRmsprop;
    u.param = p.data(), u.grad = g.data(), u.state0 = s0.data();
    u.state1 = two_states ? s1.data() : nullptr;
    u.state2 = three ? s2.data() : nullptr;
    u32.param = p32.data(), u32.grad = g32.data(), u32.state0 = s0_32.data();
    u32.state1 = two_states ? s1_32.data() : nullptr;
    u32.state2 = three ? s2_32.data() : nullptr;
    Cpu().FusedOptimizerUpdate(0, kFloat32, {u32});
    Cpu().FusedOptimizerUpdate(0, dtype, {u});
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_TRUE(IsRounded(p32[i], p[i])) << i;
      ASSERT_TRUE(IsRounded(s0_32[i], s0[i])) << i;
      if (two_states) ASSERT_TRUE(IsRounded(s1_32[i], s1[i])) << i;
      if (three) ASSERT_TRUE(IsRounded(s2_32[i], s2[i])) << i;
    }
  }
}

TEST(CpuBackendTest, CopyConvertsBetweenAllDtypes) {
  // Values every dtype holds exactly (uint8 and bool aside), through every pair.
  const std::vector<double> values = {0, 1, 2, 3, 5, 100, 7, 0, 1, 42};
  std::vector<std::vector<char>> buffers;
  for (int from = 0; from < kNumDTypes; ++from) {
    for (int to = 0; to < kNumDTypes; ++to) {
      const DType from_dtype = static_cast<DType>(from), to_dtype = static_cast<DType>(to);
      SCOPED_TRACE(std::string(DTypeName(from_dtype)) + " -> " + DTypeName(to_dtype));
      const int64_t n = static_cast<int64_t>(values.size());
      std::vector<char> src(n * ElementSize(from_dtype)), dst(n * ElementSize(to_dtype));
      KernelTensor s = KernelTensor::Vector(src.data(), n, from_dtype);
      KernelTensor d = KernelTensor::Vector(dst.data(), n, to_dtype);
      for (int64_t i = 0; i < n; ++i) {
        Cpu().Fill(0, KernelTensor::Vector(src.data() + i * ElementSize(from_dtype), 1, from_dtype),
                   values[i]);
      }
      Cpu().Copy(0, d, s);
      DispatchDType(to_dtype, "test", [&](auto tag) {
        using To = typename decltype(tag)::type;
        const To* out = reinterpret_cast<const To*>(dst.data());
        for (int64_t i = 0; i < n; ++i) {
          double expected = values[i];
          if (from_dtype == kBool || to_dtype == kBool) expected = values[i] != 0;
          ASSERT_EQ(static_cast<double>(static_cast<OpMath<To>>(out[i])), expected) << i;
        }
      });
    }
  }
  // Into bool: nonzero (NaN too) is true; floats into uint8 wrap through int64.
  std::vector<float> floats = {0.0f, -0.0f, 0.5f, kNaN, -3.0f, 300.0f};
  bool flags[6];
  Cpu().Copy(0, View(flags, {6}), View(floats.data(), {6}));
  EXPECT_EQ(std::vector<bool>(flags, flags + 6),
            std::vector<bool>({false, false, true, true, true, true}));
  uint8_t bytes[2];
  Cpu().Copy(0, View(bytes, {2}), View(floats.data() + 4, {2}));
  EXPECT_EQ(bytes[0], 253);
  EXPECT_EQ(bytes[1], 44);
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
  for (UnaryOp op : {UnaryOp::kNeg, UnaryOp::kAbs, UnaryOp::kAddScalar, UnaryOp::kMulScalar}) {
    std::vector<T> out(n);
    Cpu().Unary(0, op, View(out.data(), {n}), View(a.data(), {n}), 3.0);
    for (int64_t i = 0; i < n; ++i) {
      int64_t expected = ints_a[i];
      if (op == UnaryOp::kNeg) expected = -expected;
      if (op == UnaryOp::kAddScalar) expected += 3;
      if (op == UnaryOp::kMulScalar) expected *= 3;
      ASSERT_EQ(out[i], static_cast<T>(expected)) << i;  // uint8 wraps
    }
  }
  EXPECT_THROW(Cpu().Unary(0, UnaryOp::kExp, View(a.data(), {n}), View(a.data(), {n}), 0.0), Error);
  for (BinaryOp op : {BinaryOp::kAdd, BinaryOp::kSub, BinaryOp::kMul, BinaryOp::kMaximum,
                      BinaryOp::kMinimum, BinaryOp::kLt, BinaryOp::kEq}) {
    std::vector<T> out(n);
    std::unique_ptr<bool[]> flags(new bool[n]);
    Cpu().Binary(0, op, View(out.data(), {n}), View(a.data(), {n}), View(b.data(), {n}));
    for (int64_t i = 0; i < n; ++i) {
      const int64_t x = ints_a[i], y = ints_b[i];
      int64_t expected = 0;
      switch (op) {
        case BinaryOp::kAdd:
          expected = x + y;
          break;
        case BinaryOp::kSub:
          expected = x - y;
          break;
        case BinaryOp::kMul:
          expected = x * y;
          break;
        case BinaryOp::kMaximum:
          expected = std::max(x, y);
          break;
        case BinaryOp::kMinimum:
          expected = std::min(x, y);
          break;
        case BinaryOp::kLt:
          expected = x < y;
          break;
        default:
          expected = x == y;
          break;
      }
      ASSERT_EQ(out[i], static_cast<T>(expected)) << i;
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
//   bazel test --config=cpu //tensor/cpu:cpu_backend_test
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

TEST(BFloat16SelectionTest, TwoByTwoMaxPoolMatchesFloat32) {
  // Even widths (the whole-plane pair pass) and an odd one (the window loop), with NaNs,
  // ties and zeros of both signs among random values.
  for (int64_t width : {28, 14, 6, 7}) {
    SCOPED_TRACE("width " + std::to_string(width));
    const Conv2dGeometry g = Conv2dGeometry::Make(3, 5, 6, width, 2, 2, 2, 2, 0, 0);
    const int64_t size = g.batch * g.channels * g.height * g.width;
    std::vector<BFloat16> image = Rounded<BFloat16>(RandomFloats(size, -2, 2, 91));
    for (int64_t i = 0; i < size; i += 17) image[i] = BFloat16(kNaN);
    for (int64_t i = 3; i < size; i += 13) image[i] = image[i - 1];
    for (int64_t i = 5; i < size; i += 29) image[i] = BFloat16(i % 2 == 0 ? 0.0f : -0.0f);
    const std::vector<float> image32 = Widened(image);
    const int64_t out_size = g.batch * g.channels * g.out_h() * g.out_w();
    std::vector<float> pooled32(out_size);
    std::vector<BFloat16> pooled(out_size);
    std::vector<int64_t> at32(out_size), at(out_size);
    Cpu().MaxPool2d(0, kFloat32, g, image32.data(), pooled32.data(), at32.data());
    Cpu().MaxPool2d(0, kBFloat16, g, image.data(), pooled.data(), at.data());
    ASSERT_EQ(at, at32);
    for (int64_t i = 0; i < out_size; ++i) ASSERT_TRUE(IsRounded(pooled32[i], pooled[i])) << i;
  }
}

}  // namespace
}  // namespace tandem
