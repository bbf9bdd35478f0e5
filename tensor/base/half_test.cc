// BFloat16 and Half round as IEEE conversions do: every float16 value round-trips, every
// float rounds to the nearest representable value (ties to even), and overflow, subnormals
// and NaN behave as the hardware conversions (F16C's vcvtps2ph, AVX512-BF16's vcvtneps2bf16).
#include "tensor/base/half.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

namespace tandem {
namespace {

// The float16 nearest to f, found by searching the 65536 values instead of by bit tricks.
uint16_t NearestHalfBySearch(float f) {
  if (std::isnan(f)) return 0x7e00;
  uint16_t best = 0;
  double best_distance = INFINITY;
  for (uint32_t bits = 0; bits < 0x10000u; ++bits) {
    const float candidate = half_internal::HalfBitsToFloat(static_cast<uint16_t>(bits));
    if (std::isnan(candidate) || std::signbit(candidate) != std::signbit(f)) continue;
    const double distance = std::fabs(static_cast<double>(candidate) - f);
    const bool tie = distance == best_distance;
    if (distance < best_distance || (tie && (bits & 1u) == 0)) {
      best = static_cast<uint16_t>(bits);
      best_distance = distance;
    }
  }
  // Past the largest finite value, IEEE rounds to infinity from 65520 (half an ulp) up.
  if (std::fabs(f) >= 65520.0f) return std::signbit(f) ? 0xfc00 : 0x7c00;
  return best;
}

TEST(HalfTest, EveryFloat16RoundTripsThroughFloat) {
  for (uint32_t bits = 0; bits < 0x10000u; ++bits) {
    const Half h = Half::FromBits(static_cast<uint16_t>(bits));
    const float f = h;
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(static_cast<float>(Half(f)))) << bits;
      continue;
    }
    EXPECT_EQ(Half(f).bits, bits) << "float16 bits " << bits << " = " << f;
  }
}

TEST(HalfTest, FloatsRoundToTheNearestFloat16TiesToEven) {
  const float probes[] = {0.1f,           1.0f / 3,       65504.0f,  65519.0f, 65520.0f,
                          -65536.0f,      1e-8f,          2.98e-8f,  2.99e-8f, 6.0e-8f,
                          5.96e-8f,       6.1e-5f,        6.104e-5f, -0.0f,    1.0009765625f,
                          1.00048828125f, 1.00146484375f, 3.0e-5f,   1e30f};
  for (float f : probes) {
    EXPECT_EQ(Half(f).bits, NearestHalfBySearch(f)) << f;
  }
  // Halfway cases between consecutive float16 values in every binade go to the even one.
  for (uint32_t bits = 0x0001; bits < 0x7bff; bits += 97) {
    const float lo = half_internal::HalfBitsToFloat(static_cast<uint16_t>(bits));
    const float hi = half_internal::HalfBitsToFloat(static_cast<uint16_t>(bits + 1));
    const float mid = lo + (hi - lo) / 2;
    EXPECT_EQ(Half(mid).bits, (bits & 1u) ? bits + 1 : bits) << mid;
  }
  EXPECT_TRUE(std::isnan(static_cast<float>(Half(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(static_cast<float>(Half(INFINITY)), INFINITY);
}

TEST(BFloat16Test, RoundsToTheTopSixteenBitsNearestEven) {
  EXPECT_EQ(BFloat16(1.0f).bits, 0x3f80);
  EXPECT_EQ(static_cast<float>(BFloat16(1.1f)), 1.1015625f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to the even mantissa (1).
  EXPECT_EQ(static_cast<float>(BFloat16(1.00390625f)), 1.0f);
  EXPECT_EQ(static_cast<float>(BFloat16(1.01171875f)), 1.015625f);  // odd below: goes up
  EXPECT_EQ(BFloat16(3.4e38f).bits, 0x7f80);                        // past max: inf
  EXPECT_TRUE(std::isnan(static_cast<float>(BFloat16(std::nanf("")))));
  // Every bfloat16 is a float: the round trip is exact.
  for (uint32_t bits = 0; bits < 0x10000u; bits += 3) {
    const BFloat16 b = BFloat16::FromBits(static_cast<uint16_t>(bits));
    const float f = b;
    if (!std::isnan(f)) {
      EXPECT_EQ(BFloat16(f).bits, bits);
    }
  }
}

TEST(BFloat16Test, ArithmeticIsFloatArithmeticRoundedWhenStored) {
  const BFloat16 a = 1.0f, b = 0.00390625f;  // 2^-8: lost when added in bfloat16
  BFloat16 c = a + b + b;                    // float sum 1 + 2^-7, exact in bfloat16
  EXPECT_EQ(static_cast<float>(c), 1.0078125f);
  c += 1.0f;  // 2 + 2^-7 is halfway between 2 and 2 + 2^-6: ties to even
  EXPECT_EQ(static_cast<float>(c), 2.0f);
  EXPECT_TRUE(a > b);
  EXPECT_EQ(std::numeric_limits<BFloat16>::max().bits, 0x7f7f);
  EXPECT_EQ(static_cast<float>(std::numeric_limits<Half>::max()), 65504.0f);
}

}  // namespace
}  // namespace tandem
