// Tests of the CPU backend's Copy and Fill: strided, broadcast and empty views, and every dtype
// conversion (bit-exact float <-> 16-bit float on every vector unit).
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

}  // namespace
}  // namespace tandem
