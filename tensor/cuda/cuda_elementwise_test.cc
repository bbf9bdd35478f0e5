// Copy, Fill, Unary and Binary (elementwise) CUDA kernels against the CPU backend, in every
// dtype, and the errors of bad arguments.
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

// ---- Copy and Fill --------------------------------------------------------------------------

TEST_F(CudaBackendTest, CopyContiguousStridedAndConverting) {
  for (int64_t rows : {0, 1, 3, 257}) {
    for (int64_t cols : {1, 5, 1029}) {
      const int64_t n = rows * cols;
      Buffer<float> src(Random<float>(n, -100.0f, 100.0f));
      // Contiguous copy.
      Buffer<float> dst(n);
      cpu_.Copy(0, dst.CpuView({rows, cols}), src.CpuView({rows, cols}));
      gpu_.Copy(0, dst.GpuView({rows, cols}), src.GpuView({rows, cols}));
      ExpectBitwiseEqual(dst.Cpu(), dst.Gpu(), Note("contiguous copy"));
      // Transposing copy: dst[c][r] = src[r][c].
      Buffer<float> transposed(n);
      cpu_.Copy(0, transposed.CpuView({rows, cols}, {1, rows}), src.CpuView({rows, cols}));
      gpu_.Copy(0, transposed.GpuView({rows, cols}, {1, rows}), src.GpuView({rows, cols}));
      ExpectBitwiseEqual(transposed.Cpu(), transposed.Gpu(), Note("transposing copy"));
      // float32 -> int64 and back.
      Buffer<int64_t> as_int(n);
      cpu_.Copy(0, as_int.CpuView({rows, cols}), src.CpuView({rows, cols}));
      gpu_.Copy(0, as_int.GpuView({rows, cols}), src.GpuView({rows, cols}));
      ExpectEqual(as_int.Cpu(), as_int.Gpu(), Note("float32 -> int64 copy"));
      Buffer<float> back(n);
      cpu_.Copy(0, back.CpuView({rows, cols}), as_int.CpuView({rows, cols}));
      gpu_.Copy(0, back.GpuView({rows, cols}), as_int.GpuView({rows, cols}));
      ExpectBitwiseEqual(back.Cpu(), back.Gpu(), Note("int64 -> float32 copy"));
    }
  }
}

TEST_F(CudaBackendTest, CopyBroadcastsAndLeavesOtherElementsAlone) {
  // A row broadcast into every other column of a wider buffer: stride-0 source, strided
  // destination; the untouched columns must stay poisoned.
  const int64_t rows = 33, cols = 70;
  Buffer<float> row(Random<float>(cols));
  Buffer<float> dst(rows * cols * 2);
  cpu_.Copy(0, dst.CpuView({rows, cols}, {2 * cols, 2}, 1), row.CpuView({rows, cols}, {0, 1}));
  gpu_.Copy(0, dst.GpuView({rows, cols}, {2 * cols, 2}, 1), row.GpuView({rows, cols}, {0, 1}));
  ExpectBitwiseEqual(dst.Cpu(), dst.Gpu(), Note("broadcasting strided copy"));
}

TEST_F(CudaBackendTest, FillContiguousStridedAndInt64) {
  for (int64_t n : {0, 1, 3, 4, 1000, 100003}) {
    for (double value : {0.0, -0.0, 2.5, -1e30}) {
      for (int64_t offset : {0, 1}) {  // 1: not 16-byte aligned
        Buffer<float> dst(n + 1);
        cpu_.Fill(0, dst.CpuView({n}, {}, offset), value);
        gpu_.Fill(0, dst.GpuView({n}, {}, offset), value);
        ExpectBitwiseEqual(dst.Cpu(), dst.Gpu(), Note("float fill"));
      }
    }
    Buffer<float> every_third(3 * n);
    cpu_.Fill(0, every_third.CpuView({n}, {3}), 7.0);
    gpu_.Fill(0, every_third.GpuView({n}, {3}), 7.0);
    ExpectBitwiseEqual(every_third.Cpu(), every_third.Gpu(), Note("strided fill"));
    Buffer<int64_t> ints(n);
    cpu_.Fill(0, ints.CpuView({n}), -42.0);
    gpu_.Fill(0, ints.GpuView({n}), -42.0);
    ExpectEqual(ints.Cpu(), ints.Gpu(), Note("int64 fill"));
  }
}

// ---- Unary and Binary ---------------------------------------------------------------------------

const std::vector<UnaryOp> kAllUnary = AllUnaryOps();

// Every float op on `sizes` elements at each of `offsets` (0: aligned, the vectorised path;
// 1: misaligned), and through a transposed view into a transposed view (the strided path).
template <typename T>
void CudaBackendTest::ExpectUnaryOpsMatch(const std::vector<int64_t>& sizes,
                                          const std::vector<int64_t>& offsets) {
  for (UnaryOp op : kAllUnary) {
    const bool positive_only = HasPositiveDomain(op);
    // Ops through erf, exp and the like may round differently on the two sides; the rest are
    // the same correctly rounded operations (nvcc -fmad=false) and must agree to the bit.
    auto expect_match = [&](const std::vector<T>& cpu, const std::vector<T>& gpu,
                            const std::string& what) {
      if (IsTranscendental(op)) {
        ExpectNear(cpu, gpu, Tolerance<T>::kUnaryRtol, Tolerance<T>::kUnaryAtol, what);
      } else {
        ExpectBitwiseEqual(cpu, gpu, what);
      }
    };
    for (int64_t n : sizes) {
      const std::string what =
          Note(DTypePrefix<T>() + "unary op " + std::to_string(static_cast<int>(op)) + " on " +
               std::to_string(n) + " elements");
      Buffer<T> src(positive_only ? Random<T>(n + 1, 0.01, 5.0) : Random<T>(n + 1));
      for (int64_t offset : offsets) {
        Buffer<T> dst(n + 1);
        cpu_.Unary(0, op, dst.CpuView({n}, {}, offset), src.CpuView({n}, {}, offset), 1.5);
        gpu_.Unary(0, op, dst.GpuView({n}, {}, offset), src.GpuView({n}, {}, offset), 1.5);
        expect_match(dst.Cpu(), dst.Gpu(), what);
      }
      const int64_t rows = n / 7, cols = 7;
      Buffer<T> dst(n + 1);
      cpu_.Unary(0, op, dst.CpuView({cols, rows}, {1, cols}), src.CpuView({cols, rows}, {1, cols}),
                 -0.5);
      gpu_.Unary(0, op, dst.GpuView({cols, rows}, {1, cols}), src.GpuView({cols, rows}, {1, cols}),
                 -0.5);
      expect_match(dst.Cpu(), dst.Gpu(), what + " (strided)");
    }
  }
}

TEST_F(CudaBackendTest, UnaryFloatOpsMatchTheCpu) {
  ExpectUnaryOpsMatch<float>({0, 1, 7, 1024, 100001}, {0, 1});
  ExpectUnaryOpsMatch<double>({0, 1, 7, 4099}, {1});
  // A scalar that float32 cannot hold: float64 must not round it through float.
  Buffer<double> x(std::vector<double>{1.0, 2.0});
  Buffer<double> y(2);
  gpu_.Unary(0, UnaryOp::kAddScalar, y.GpuView({2}), x.GpuView({2}), 0.1);
  EXPECT_EQ(y.Gpu(), (std::vector<double>{1.0 + 0.1, 2.0 + 0.1}));
}

TEST_F(CudaBackendTest, UnaryInPlaceAndInt64) {
  const int64_t n = 5003;
  Buffer<float> x(Random<float>(n));
  cpu_.Unary(0, UnaryOp::kRelu, x.CpuView({n}), x.CpuView({n}), 0.0);
  gpu_.Unary(0, UnaryOp::kRelu, x.GpuView({n}), x.GpuView({n}), 0.0);
  ExpectBitwiseEqual(x.Cpu(), x.Gpu(), Note("in-place relu"));
  for (UnaryOp op : kAllUnary) {
    if (!UnarySupportsIntegers(op)) continue;
    Buffer<int64_t> src(RandomInts(n, -1000000, 1000000));
    Buffer<int64_t> dst(n);
    cpu_.Unary(0, op, dst.CpuView({n}), src.CpuView({n}), -3.0);
    gpu_.Unary(0, op, dst.GpuView({n}), src.GpuView({n}), -3.0);
    ExpectEqual(dst.Cpu(), dst.Gpu(),
                Note("int64 unary op " + std::to_string(static_cast<int>(op))));
  }
  Buffer<int64_t> ints(4);
  EXPECT_THROW(gpu_.Unary(0, UnaryOp::kExp, ints.GpuView({4}), ints.GpuView({4}), 0.0), Error);
}

const std::vector<BinaryOp> kAllBinary = AllBinaryOps();

// Ops through erf or exp (IsTranscendental, tensor/runtime/op_tables.h), whose float results
// CUDA and glibc may round differently (on a GPU; under cudasim they are bitwise equal).
template <typename Op>
bool IsTranscendentalOp(Op op) {
  return IsTranscendental(op);
}

// Shapes of b relative to a's [rows, cols] output: full, a row, a column, a scalar.
struct Broadcast {
  const char* name;
  bool row, column;
};
const Broadcast kBroadcasts[] = {
    {"full", false, false}, {"row", true, false}, {"column", false, true}, {"scalar", true, true}};

// Every op with each broadcast of b on [rows, cols] `shapes`, at each of `offsets`, then in
// place into a (dst aliases a exactly). The same expression on both devices: bitwise.
template <typename T>
void CudaBackendTest::ExpectBinaryOpsMatch(const std::vector<std::pair<int64_t, int64_t>>& shapes,
                                           const std::vector<int64_t>& offsets) {
  for (BinaryOp op : kAllBinary) {
    for (const Broadcast& broadcast : kBroadcasts) {
      for (auto [rows, cols] : shapes) {
        const std::string what =
            Note(DTypePrefix<T>() + "binary op " + std::to_string(static_cast<int>(op)) + ", " +
                 broadcast.name + " b, " + std::to_string(rows) + "x" + std::to_string(cols));
        const int64_t n = rows * cols;
        // Integer-valued inputs make comparisons hit equality too.
        Buffer<T> a(RandomIntegers<T>(n + 1, -4, 4));
        Buffer<T> b(op == BinaryOp::kDiv ? Random<T>(n + 1, 0.5, 3.0)
                                         : RandomIntegers<T>(n + 1, -4, 4));
        const std::vector<int64_t> b_strides = {broadcast.column ? 0 : cols, broadcast.row ? 0 : 1};
        for (int64_t offset : offsets) {
          Buffer<T> dst(n + 1);
          cpu_.Binary(0, op, dst.CpuView({rows, cols}, {}, offset),
                      a.CpuView({rows, cols}, {}, offset),
                      b.CpuView({rows, cols}, b_strides, offset));
          gpu_.Binary(0, op, dst.GpuView({rows, cols}, {}, offset),
                      a.GpuView({rows, cols}, {}, offset),
                      b.GpuView({rows, cols}, b_strides, offset));
          if (IsTranscendentalOp(op)) {
            ExpectNear(dst.Cpu(), dst.Gpu(), Tolerance<T>::kUnaryRtol, Tolerance<T>::kUnaryAtol,
                       what);
          } else {
            ExpectBitwiseEqual(dst.Cpu(), dst.Gpu(), what);
          }
        }
        if (IsTranscendentalOp(op)) continue;  // in place, compared bitwise, needs exact inputs
        cpu_.Binary(0, op, a.CpuView({rows, cols}), a.CpuView({rows, cols}),
                    b.CpuView({rows, cols}, b_strides));
        gpu_.Binary(0, op, a.GpuView({rows, cols}), a.GpuView({rows, cols}),
                    b.GpuView({rows, cols}, b_strides));
        ExpectBitwiseEqual(a.Cpu(), a.Gpu(), what + " (in place)");
      }
    }
  }
}

TEST_F(CudaBackendTest, BinaryFloatOpsWithBroadcasting) {
  ExpectBinaryOpsMatch<float>({{0, 3}, {1, 1}, {3, 5}, {129, 257}}, {0, 1});
  ExpectBinaryOpsMatch<double>({{33, 65}}, {0});
}

TEST_F(CudaBackendTest, BinaryInt64OpsAndTransposedOutput) {
  const int64_t rows = 37, cols = 41, n = rows * cols;
  for (BinaryOp op : kAllBinary) {
    if (BinaryIsFloatingOnly(op)) continue;  // refused on integers (ExpectIntegralKernelsMatch)
    Buffer<int64_t> a(RandomInts(n, -50, 50));
    Buffer<int64_t> b(RandomInts(n, 1, 9));  // no division by zero
    Buffer<int64_t> dst(n);
    // The output is written transposed: dst viewed [rows, cols] with strides {1, rows}.
    cpu_.Binary(0, op, dst.CpuView({rows, cols}, {1, rows}), a.CpuView({rows, cols}),
                b.CpuView({rows, cols}));
    gpu_.Binary(0, op, dst.GpuView({rows, cols}, {1, rows}), a.GpuView({rows, cols}),
                b.GpuView({rows, cols}));
    ExpectEqual(dst.Cpu(), dst.Gpu(),
                Note("int64 binary op " + std::to_string(static_cast<int>(op))));
  }
}

TEST_F(CudaBackendTest, ElementwiseOnLargeFourDimensionalViews) {
  // A permuted 4-D view that merges into nothing simpler (the strided path), plus a
  // broadcast over two of its dimensions.
  const std::vector<int64_t> sizes = {3, 17, 5, 129};
  const int64_t n = 3 * 17 * 5 * 129;
  Buffer<float> a(Random<float>(n));
  Buffer<float> b(Random<float>(17 * 129));
  Buffer<float> dst(n);
  const std::vector<int64_t> a_strides = {5 * 129, 3 * 5 * 129, 1, 5};  // a permutation
  const std::vector<int64_t> b_strides = {0, 129, 0, 1};
  cpu_.Binary(0, BinaryOp::kMul, dst.CpuView(sizes), a.CpuView(sizes, a_strides),
              b.CpuView(sizes, b_strides));
  gpu_.Binary(0, BinaryOp::kMul, dst.GpuView(sizes), a.GpuView(sizes, a_strides),
              b.GpuView(sizes, b_strides));
  ExpectBitwiseEqual(dst.Cpu(), dst.Gpu(), Note("4-D strided multiply"));
}

// ---- float64 only ---------------------------------------------------------------------------
// The checks float64 has and float32 does not (the shared ones run both dtypes above).
// Kernels whose arithmetic is the same expression on both devices must agree bitwise.

TEST_F(CudaBackendFloat64Test, CopyConvertsBetweenEveryPairOfDTypes) {
  const int64_t rows = 37, cols = 129, n = rows * cols;
  // Values with more precision than float32 and a range past int32, so that every
  // conversion rounds or truncates somewhere.
  Buffer<double> doubles(Random<double>(n, -3e9, 3e9));
  Buffer<float> floats(n);
  Buffer<int64_t> ints(n);
  cpu_.Copy(0, floats.CpuView({n}), doubles.CpuView({n}));
  gpu_.Copy(0, floats.GpuView({n}), doubles.GpuView({n}));
  ExpectBitwiseEqual(floats.Cpu(), floats.Gpu(), Note("float64 -> float32"));
  cpu_.Copy(0, ints.CpuView({n}), doubles.CpuView({n}));
  gpu_.Copy(0, ints.GpuView({n}), doubles.GpuView({n}));
  ExpectEqual(ints.Cpu(), ints.Gpu(), Note("float64 -> int64"));
  // Every target from every source, contiguous and transposed (the strided path).
  for (bool transposed : {false, true}) {
    const std::vector<int64_t> shape = {rows, cols};
    const std::vector<int64_t> strides =
        transposed ? std::vector<int64_t>{1, rows} : std::vector<int64_t>{};
    const std::string how = transposed ? " (transposed)" : "";
    Buffer<double> from_float(n), from_int(n), from_double(n);
    cpu_.Copy(0, from_float.CpuView(shape, strides), floats.CpuView(shape));
    gpu_.Copy(0, from_float.GpuView(shape, strides), floats.GpuView(shape));
    ExpectBitwiseEqual(from_float.Cpu(), from_float.Gpu(), Note("float32 -> float64" + how));
    cpu_.Copy(0, from_int.CpuView(shape, strides), ints.CpuView(shape));
    gpu_.Copy(0, from_int.GpuView(shape, strides), ints.GpuView(shape));
    ExpectBitwiseEqual(from_int.Cpu(), from_int.Gpu(), Note("int64 -> float64" + how));
    cpu_.Copy(0, from_double.CpuView(shape, strides), doubles.CpuView(shape));
    gpu_.Copy(0, from_double.GpuView(shape, strides), doubles.GpuView(shape));
    ExpectBitwiseEqual(from_double.Cpu(), from_double.Gpu(), Note("float64 -> float64" + how));
    Buffer<float> to_float(n);
    Buffer<int64_t> to_int(n);
    cpu_.Copy(0, to_float.CpuView(shape, strides), doubles.CpuView(shape));
    gpu_.Copy(0, to_float.GpuView(shape, strides), doubles.GpuView(shape));
    ExpectBitwiseEqual(to_float.Cpu(), to_float.Gpu(), Note("float64 -> float32" + how));
    cpu_.Copy(0, to_int.CpuView(shape, strides), doubles.CpuView(shape));
    gpu_.Copy(0, to_int.GpuView(shape, strides), doubles.GpuView(shape));
    ExpectEqual(to_int.Cpu(), to_int.Gpu(), Note("float64 -> int64" + how));
  }
  for (double value : {0.0, -0.0, 0.1, -1e300}) {
    Buffer<double> filled(n + 1);
    cpu_.Fill(0, filled.CpuView({n}, {}, 1), value);
    gpu_.Fill(0, filled.GpuView({n}, {}, 1), value);
    ExpectBitwiseEqual(filled.Cpu(), filled.Gpu(), Note("float64 fill"));
  }
}

// ---- bfloat16 and float16 ----------------------------------------------------------------

template <typename T>
void CudaBackendReducedTest::ExpectElementwiseMatches() {
  const std::string dtype = DTypePrefix<T>();
  for (UnaryOp op : kAllUnary) {
    const bool positive_only = HasPositiveDomain(op);
    const double rtol = IsTranscendentalOp(op) ? Ulp<T>() : 0.0;
    for (int64_t n : {0, 1, 7, 1029}) {
      const std::string what = Note(dtype + "unary op " + std::to_string(static_cast<int>(op)) +
                                    " on " + std::to_string(n) + " elements");
      Buffer<T> src(positive_only ? RandomReduced<T>(n, 0.01, 5.0) : RandomReduced<T>(n));
      Buffer<float> wide = Wide(src);
      // Contiguous, then a transposed view into a transposed view (the strided path).
      for (bool strided : {false, true}) {
        const int64_t rows = strided ? n / 7 : n, cols = strided ? 7 : 1;
        const std::vector<int64_t> sizes = {cols, rows};
        const std::vector<int64_t> strides = {1, cols};
        Buffer<float> expected(n);
        Buffer<T> dst(n);
        cpu_.Unary(0, op, expected.CpuView(sizes, strides), wide.CpuView(sizes, strides), 1.5);
        gpu_.Unary(0, op, dst.GpuView(sizes, strides), src.GpuView(sizes, strides), 1.5);
        const std::vector<T> rounded = Rounded<T>(expected.Cpu());
        if (rtol == 0.0) {
          ExpectBitwiseEqual(rounded, dst.Gpu(), what);
        } else {
          ExpectNear(rounded, dst.Gpu(), rtol, Tolerance<float>::kUnaryAtol, what);
        }
      }
    }
  }
  // Every binary op with each broadcast of b; comparisons also into a bool output.
  const int64_t rows = 33, cols = 65, n = rows * cols;
  for (BinaryOp op : kAllBinary) {
    for (const Broadcast& broadcast : kBroadcasts) {
      const std::string what = Note(dtype + "binary op " + std::to_string(static_cast<int>(op)) +
                                    ", " + broadcast.name + " b");
      Buffer<T> a(Rounded<T>(Widened(RandomIntegers<float>(n, -4, 4))));
      Buffer<T> b(op == BinaryOp::kDiv ? RandomReduced<T>(n, 0.5, 3.0)
                                       : Rounded<T>(Widened(RandomIntegers<float>(n, -4, 4))));
      // Non-integers too, so that sums and products round.
      if (op != BinaryOp::kDiv) a.Set(RandomReduced<T>(n, -4.0, 4.0));
      Buffer<float> wide_a = Wide(a), wide_b = Wide(b);
      const std::vector<int64_t> shape = {rows, cols};
      const std::vector<int64_t> b_strides = {broadcast.column ? 0 : cols, broadcast.row ? 0 : 1};
      Buffer<float> expected(n);
      Buffer<T> dst(n);
      cpu_.Binary(0, op, expected.CpuView(shape), wide_a.CpuView(shape),
                  wide_b.CpuView(shape, b_strides));
      gpu_.Binary(0, op, dst.GpuView(shape), a.GpuView(shape), b.GpuView(shape, b_strides));
      if (IsTranscendentalOp(op)) {
        // One ulp of T, or float's own absolute tolerance where float's result cancelled
        // (float16's subnormals below 6e-5 are 6e-8 apart: seen one apart on an H200).
        ExpectNear(Rounded<T>(expected.Cpu()), dst.Gpu(), Ulp<T>(), Tolerance<float>::kUnaryAtol,
                   what);
      } else {
        ExpectBitwiseEqual(Rounded<T>(expected.Cpu()), dst.Gpu(), what);
      }
      if (IsComparison(op)) {
        Buffer<uint8_t> mask(n, kBool), expected_mask(n, kBool);
        cpu_.Copy(0, expected_mask.CpuView(shape), expected.CpuView(shape));
        gpu_.Binary(0, op, mask.GpuView(shape), a.GpuView(shape), b.GpuView(shape, b_strides));
        ExpectBitwiseEqual(expected_mask.Cpu(), mask.Gpu(), what + " into bool");
      }
    }
  }
}

// The packed kernels (eight 16-bit elements a 128-bit access) against the scalar ones, bit for
// bit: the same values once at the start of their buffers (aligned: packed) and once one
// element in (unaligned: the scalar contiguous kernel), for sizes below, at and around a pack
// and with a tail; every unary and binary op, fills, and casts to and from float32 and the other
// 16-bit type.
template <typename T>
void CudaBackendReducedTest::ExpectPackedMatchesScalar() {
  using Other = std::conditional_t<std::is_same_v<T, BFloat16>, Half, BFloat16>;
  const std::string dtype = DTypePrefix<T>();
  for (int64_t n : {1, 7, 8, 9, 17, 1029}) {
    const std::vector<int64_t> shape = {n};
    const std::vector<T> x = RandomReduced<T>(n, 0.01, 5.0), y = RandomReduced<T>(n, 0.5, 3.0);
    // Buffers of n + 1 holding the values at offset 0 (aligned) and at offset 1 (unaligned).
    auto at = [&](const std::vector<T>& values, int64_t offset) {
      std::vector<T> padded(n + 1, T(0.0f));
      std::copy(values.begin(), values.end(), padded.begin() + offset);
      return Buffer<T>(padded);
    };
    Buffer<T> a0 = at(x, 0), a1 = at(x, 1), b0 = at(y, 0), b1 = at(y, 1);
    // Calls run(dst, a, b, offset) on both placements and compares the n results.
    auto expect_same = [&](auto tag, const std::string& what, auto run) {
      using Out = typename decltype(tag)::type;
      Buffer<Out> packed(n + 1), scalar(n + 1);
      run(packed.GpuView(shape), a0.GpuView(shape), b0.GpuView(shape));
      run(scalar.GpuView(shape, {}, 1), a1.GpuView(shape, {}, 1), b1.GpuView(shape, {}, 1));
      const std::vector<Out> p = packed.Gpu(), s = scalar.Gpu();
      ExpectBitwiseEqual(std::vector<Out>(s.begin() + 1, s.end()),
                         std::vector<Out>(p.begin(), p.end() - 1),
                         Note(dtype + what + " on " + std::to_string(n) + " elements"));
    };
    for (UnaryOp op : kAllUnary) {
      expect_same(
          DTypeTag<T>{}, "unary op " + std::to_string(static_cast<int>(op)),
          [&](KernelTensor d, KernelTensor a, KernelTensor) { gpu_.Unary(0, op, d, a, 1.5); });
    }
    for (BinaryOp op : kAllBinary) {
      expect_same(
          DTypeTag<T>{}, "binary op " + std::to_string(static_cast<int>(op)),
          [&](KernelTensor d, KernelTensor a, KernelTensor b) { gpu_.Binary(0, op, d, a, b); });
    }
    for (double value : {1.5, -0.1}) {
      expect_same(DTypeTag<T>{}, "fill with " + std::to_string(value),
                  [&](KernelTensor d, KernelTensor, KernelTensor) { gpu_.Fill(0, d, value); });
    }
    expect_same(DTypeTag<float>{}, "cast to float32",
                [&](KernelTensor d, KernelTensor a, KernelTensor) { gpu_.Copy(0, d, a); });
    expect_same(DTypeTag<Other>{}, "cast to the other 16-bit type",
                [&](KernelTensor d, KernelTensor a, KernelTensor) { gpu_.Copy(0, d, a); });
    // From float32: wide values with bits below the 16-bit mantissa, so that rounding happens.
    Buffer<float> f0(n + 1), f1(n + 1);
    {
      std::vector<float> w = Random<float>(n, -3.0, 3.0), w0(n + 1, 0.0f), w1(n + 1, 0.0f);
      std::copy(w.begin(), w.end(), w0.begin());
      std::copy(w.begin(), w.end(), w1.begin() + 1);
      f0.Set(w0);
      f1.Set(w1);
    }
    Buffer<T> packed(n + 1), scalar(n + 1);
    gpu_.Copy(0, packed.GpuView(shape), f0.GpuView(shape));
    gpu_.Copy(0, scalar.GpuView(shape, {}, 1), f1.GpuView(shape, {}, 1));
    const std::vector<T> p = packed.Gpu(), s = scalar.Gpu();
    ExpectBitwiseEqual(std::vector<T>(s.begin() + 1, s.end()),
                       std::vector<T>(p.begin(), p.end() - 1),
                       Note(dtype + "cast from float32 on " + std::to_string(n) + " elements"));
  }
}

TEST_F(CudaBackendReducedTest, PackedBFloat16IsBitwiseScalar) {
  ExpectPackedMatchesScalar<BFloat16>();
}
TEST_F(CudaBackendReducedTest, PackedFloat16IsBitwiseScalar) { ExpectPackedMatchesScalar<Half>(); }

TEST_F(CudaBackendReducedTest, ElementwiseBFloat16) { ExpectElementwiseMatches<BFloat16>(); }
TEST_F(CudaBackendReducedTest, ElementwiseFloat16) { ExpectElementwiseMatches<Half>(); }

// ---- Every dtype: Copy, Fill; integer and bool kernels -------------------------------------

// Values of every dtype from one list of small non-negative numbers (exact in each, so that
// every conversion is defined: uint8 has no negatives), as T.
template <typename T>
std::vector<T> FromDoubles(const std::vector<double>& values) {
  std::vector<T> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    if constexpr (kIsReducedFloat<T>) {
      out[i] = T(static_cast<float>(values[i]));
    } else {
      out[i] = static_cast<T>(values[i]);
    }
  }
  return out;
}

// Calls f(DTypeTag<Storage>{}, dtype) for each of the 8 dtypes, with bool stored as uint8_t.
template <typename F>
void ForEveryDType(F&& f) {
  for (DType dtype : {kFloat32, kInt64, kFloat64, kBFloat16, kFloat16, kBool, kInt32, kUInt8}) {
    DispatchDType(dtype, "test", [&](auto tag) {
      if constexpr (std::is_same_v<typename decltype(tag)::type, bool>) {
        f(DTypeTag<uint8_t>{}, dtype);
      } else {
        f(tag, dtype);
      }
    });
  }
}

TEST_F(CudaBackendTest, CopyBetweenEveryPairOfDTypesAndFillEveryDType) {
  const int64_t rows = 37, cols = 29, n = rows * cols;
  std::vector<double> values(n);
  std::uniform_int_distribution<int> quarters(0, 400);
  for (double& v : values) v = quarters(rng_) / 4.0;  // 0 .. 100, zeros included
  ForEveryDType([&](auto from_tag, DType from) {
    using From = typename decltype(from_tag)::type;
    std::vector<From> from_values = FromDoubles<From>(values);
    if (from == kBool) {
      for (From& v : from_values) v = v != 0;
    }
    Buffer<From> src(from_values, from);
    ForEveryDType([&](auto to_tag, DType to) {
      using To = typename decltype(to_tag)::type;
      const std::string what =
          Note(std::string("copy ") + DTypeName(from) + " -> " + DTypeName(to));
      Buffer<To> dst(n, to);
      // Contiguous (a plain copy when the dtypes match) and transposed (the strided kernel).
      cpu_.Copy(0, dst.CpuView({rows, cols}), src.CpuView({rows, cols}));
      gpu_.Copy(0, dst.GpuView({rows, cols}), src.GpuView({rows, cols}));
      ExpectBitwiseEqual(dst.Cpu(), dst.Gpu(), what);
      Buffer<To> transposed(n, to);
      cpu_.Copy(0, transposed.CpuView({rows, cols}, {1, rows}), src.CpuView({rows, cols}));
      gpu_.Copy(0, transposed.GpuView({rows, cols}, {1, rows}), src.GpuView({rows, cols}));
      ExpectBitwiseEqual(transposed.Cpu(), transposed.Gpu(), what + " (transposing)");
    });
  });
  ForEveryDType([&](auto tag, DType dtype) {
    using T = typename decltype(tag)::type;
    for (double value : {0.0, -0.0, 1.0, 2.5, 100.0}) {
      for (int64_t offset : {0, 1}) {
        Buffer<T> dst(n + 1, dtype);
        cpu_.Fill(0, dst.CpuView({n}, {}, offset), value);
        gpu_.Fill(0, dst.GpuView({n}, {}, offset), value);
        ExpectBitwiseEqual(
            dst.Cpu(), dst.Gpu(),
            Note(std::string("fill ") + DTypeName(dtype) + " with " + std::to_string(value)));
      }
      Buffer<T> every_third(3 * n, dtype);
      cpu_.Fill(0, every_third.CpuView({n}, {3}), value);
      gpu_.Fill(0, every_third.GpuView({n}, {3}), value);
      ExpectBitwiseEqual(every_third.Cpu(), every_third.Gpu(),
                         Note(std::string("strided fill ") + DTypeName(dtype)));
    }
  });
}

// int32, uint8 and bool: the integer Unary ops, every Binary op (comparisons also into bool),
// every reduction, against the CPU on the same inputs. uint8 wraps around as PyTorch's does.
template <typename T>
void ExpectIntegralKernelsMatch(Backend& cpu, Backend& gpu, std::mt19937_64& rng,
                                const std::string& seed_note) {
  const DType dtype = std::is_same_v<T, bool> ? kBool : DTypeOf<T>::value;
  using Storage = std::conditional_t<std::is_same_v<T, bool>, uint8_t, T>;
  const bool is_bool = dtype == kBool;
  const int low = dtype == kInt32 ? -50 : 0, high = is_bool ? 1 : 50;
  std::uniform_int_distribution<int> dist(low, high), positive(1, is_bool ? 1 : 9);
  const int64_t rows = 37, cols = 41, n = rows * cols;
  auto random = [&](bool nonzero) {
    std::vector<Storage> v(n);
    for (Storage& x : v) x = static_cast<Storage>(nonzero ? positive(rng) : dist(rng));
    return v;
  };
  const std::string name = std::string(DTypeName(dtype)) + " ";
  for (UnaryOp op : kAllUnary) {
    if (!UnarySupportsIntegers(op)) continue;
    Buffer<Storage> src(random(false), dtype), dst(n, dtype);
    if (is_bool && RejectsBool(op)) {  // both backends refuse what PyTorch refuses
      EXPECT_THROW(cpu.Unary(0, op, dst.CpuView({rows, cols}), src.CpuView({rows, cols}), 0.0),
                   Error);
      EXPECT_THROW(gpu.Unary(0, op, dst.GpuView({rows, cols}), src.GpuView({rows, cols}), 0.0),
                   Error);
      continue;
    }
    cpu.Unary(0, op, dst.CpuView({rows, cols}), src.CpuView({rows, cols}), -3.0);
    gpu.Unary(0, op, dst.GpuView({rows, cols}), src.GpuView({rows, cols}), -3.0);
    ExpectBitwiseEqual(dst.Cpu(), dst.Gpu(),
                       name + "unary op " + std::to_string(static_cast<int>(op)) + seed_note);
  }
  for (BinaryOp op : kAllBinary) {
    Buffer<Storage> a(random(false), dtype);
    Buffer<Storage> b(random(op == BinaryOp::kDiv), dtype);  // no division by zero
    Buffer<Storage> dst(n, dtype);
    const std::string what = name + "binary op " + std::to_string(static_cast<int>(op)) + seed_note;
    if ((is_bool && RejectsBool(op)) || BinaryIsFloatingOnly(op)) {
      EXPECT_THROW(cpu.Binary(0, op, dst.CpuView({rows, cols}), a.CpuView({rows, cols}),
                              b.CpuView({rows, cols})),
                   Error);
      EXPECT_THROW(gpu.Binary(0, op, dst.GpuView({rows, cols}), a.GpuView({rows, cols}),
                              b.GpuView({rows, cols})),
                   Error);
      continue;
    }
    // The output written transposed.
    cpu.Binary(0, op, dst.CpuView({rows, cols}, {1, rows}), a.CpuView({rows, cols}),
               b.CpuView({rows, cols}));
    gpu.Binary(0, op, dst.GpuView({rows, cols}, {1, rows}), a.GpuView({rows, cols}),
               b.GpuView({rows, cols}));
    ExpectBitwiseEqual(dst.Cpu(), dst.Gpu(), what);
    if (IsComparison(op) && !is_bool) {
      // Into bool: the CPU's 1 or 0 in T, converted.
      Buffer<uint8_t> mask(n, kBool), expected(n, kBool);
      cpu.Copy(0, expected.CpuView({rows, cols}, {1, rows}), dst.CpuView({rows, cols}, {1, rows}));
      gpu.Binary(0, op, mask.GpuView({rows, cols}, {1, rows}), a.GpuView({rows, cols}),
                 b.GpuView({rows, cols}));
      ExpectBitwiseEqual(expected.Cpu(), mask.Gpu(), what + " into bool");
    }
  }
  for (ReduceKind op : AllReduceKinds()) {
    const bool arg = IsArgReduction(op);
    for (const ReduceShape& s : {ReduceShape{7, 3, 59}, ReduceShape{1, n, 1}}) {
      const std::string what = name + "reduce op " + std::to_string(static_cast<int>(op)) +
                               " over " + std::to_string(s.reduce) + seed_note;
      Buffer<Storage> src(random(false), dtype);
      const std::vector<int64_t> in_shape = {s.outer, s.reduce, s.inner};
      const std::vector<int64_t> out_shape = {s.outer, s.inner};
      if (arg) {
        Buffer<int64_t> dst(s.outer * s.inner);
        cpu.Reduce(0, op, dst.CpuView(out_shape), src.CpuView(in_shape), s.outer, s.reduce,
                   s.inner);
        gpu.Reduce(0, op, dst.GpuView(out_shape), src.GpuView(in_shape), s.outer, s.reduce,
                   s.inner);
        ExpectEqual(dst.Cpu(), dst.Gpu(), what);
      } else {
        Buffer<Storage> dst(s.outer * s.inner, dtype);
        cpu.Reduce(0, op, dst.CpuView(out_shape), src.CpuView(in_shape), s.outer, s.reduce,
                   s.inner);
        gpu.Reduce(0, op, dst.GpuView(out_shape), src.GpuView(in_shape), s.outer, s.reduce,
                   s.inner);
        ExpectBitwiseEqual(dst.Cpu(), dst.Gpu(), what);
      }
    }
  }
}

TEST_F(CudaBackendTest, Int32KernelsMatchTheCpu) {
  ExpectIntegralKernelsMatch<int32_t>(cpu_, gpu_, rng_, Note(""));
}
TEST_F(CudaBackendTest, UInt8KernelsMatchTheCpu) {
  ExpectIntegralKernelsMatch<uint8_t>(cpu_, gpu_, rng_, Note(""));
}
TEST_F(CudaBackendTest, BoolKernelsMatchTheCpu) {
  ExpectIntegralKernelsMatch<bool>(cpu_, gpu_, rng_, Note(""));
}

TEST_F(CudaBackendTest, FloatComparisonsIntoBool) {
  const int64_t n = 1001;
  Buffer<float> a(RandomIntegers<float>(n, -3, 3)), b(RandomIntegers<float>(n, -3, 3));
  std::vector<float> with_nan = a.Cpu();
  with_nan[5] = NAN;  // NaN compares unequal to everything, itself included
  a.Set(with_nan);
  for (BinaryOp op : kAllBinary) {
    if (!IsComparison(op)) continue;
    Buffer<float> as_float(n);
    Buffer<uint8_t> expected(n, kBool), mask(n, kBool);
    cpu_.Binary(0, op, as_float.CpuView({n}), a.CpuView({n}), b.CpuView({n}));
    cpu_.Copy(0, expected.CpuView({n}), as_float.CpuView({n}));
    gpu_.Binary(0, op, mask.GpuView({n}), a.GpuView({n}), b.GpuView({n}));
    ExpectBitwiseEqual(expected.Cpu(), mask.Gpu(),
                       Note("float32 comparison " + std::to_string(static_cast<int>(op))));
  }
  // Only comparisons may write bool.
  Buffer<uint8_t> mask(n, kBool);
  EXPECT_THROW(gpu_.Binary(0, BinaryOp::kAdd, mask.GpuView({n}), a.GpuView({n}), b.GpuView({n})),
               Error);
}

// ---- Errors
// -------------------------------------------------------------------------------------------

TEST_F(CudaBackendTest, BadArgumentsThrowClearErrors) {
  Buffer<float> x(12);
  try {
    gpu_.Unary(0, UnaryOp::kNeg, x.GpuView({3, 4}), x.GpuView({4, 3}), 0.0);
    FAIL() << "a shape mismatch must throw";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("[3, 4]"), std::string::npos) << error.what();
  }
  const int count = DeviceCount(DeviceType::kCUDA);
  try {
    gpu_.Fill(count, x.GpuView({12}), 1.0);
    FAIL() << "a device index past the last device must throw";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("cuda:" + std::to_string(count)), std::string::npos)
        << error.what();
  }
}

}  // namespace cuda_test
}  // namespace tandem
