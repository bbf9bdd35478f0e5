// BFloat16 and Half: the two 16-bit floating-point element types (torch.bfloat16 and
// torch.float16), as values that convert to and from float. Use them as a tensor's element
// type (kBFloat16, kFloat16) and in kernels, which load them as float, compute in float and
// round once when they store (PyTorch's opmath).
//
//   tandem::BFloat16 b = 1.1f;      // rounds to nearest even: 1.1015625
//   float f = b;                    // exact: every bfloat16 is a float
//   tandem::Half h(65520.0f);       // overflows to +inf, as the IEEE conversion does
//
// Note [Reduced precision conversions]: the conversions are written with integer operations
// only, so the host and CUDA kernels round every value to the same bits (the CPU is the oracle
// for the GPU) and no compiler flag or instruction set changes them. bfloat16 is float32's top
// 16 bits (8 exponent bits, 7 mantissa bits); float16 is IEEE binary16 (5 and 10), with
// subnormals. Both round to nearest, ties to even, and keep NaN a NaN.
#ifndef TANDEM_TENSOR_BASE_HALF_H_
#define TANDEM_TENSOR_BASE_HALF_H_

#include <cstdint>
#include <cstring>
#include <limits>
#include <ostream>

#include "tensor/base/philox.h"  // TANDEM_HOST_DEVICE

namespace tandem {

namespace half_internal {
TANDEM_HOST_DEVICE uint32_t FloatBits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}
TANDEM_HOST_DEVICE float BitsFloat(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

TANDEM_HOST_DEVICE uint16_t FloatToBFloat16Bits(float f) {
  const uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

TANDEM_HOST_DEVICE uint16_t FloatToHalfBits(float f) {
  const uint32_t u = FloatBits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x1ffu));
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520
  if (abs < 0x38800000u) {
    // Below float16's smallest normal (2^-14): a subnormal, m * 2^-24 with m rounded.
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // below half of 2^-24: zero
    const uint32_t exponent = abs >> 23;                        // 102 .. 112
    const uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - exponent;  // 14 .. 24
    uint32_t m = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (rest > half || (rest == half && (m & 1u))) ++m;
    return static_cast<uint16_t>(sign | m);
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits.
  const uint32_t rebased = abs - 0x38000000u;
  const uint32_t rounded = rebased + 0xfffu + ((rebased >> 13) & 1u);
  return static_cast<uint16_t>(sign | (rounded >> 13));
}

TANDEM_HOST_DEVICE float HalfBitsToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1fu) return BitsFloat(sign | 0x7f800000u | (mantissa << 13));  // inf, NaN
  if (exponent != 0) return BitsFloat(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  if (mantissa == 0) return BitsFloat(sign);
  // Subnormal: normalise the mantissa.
  uint32_t e = 113;
  while ((mantissa & 0x400u) == 0) {
    mantissa <<= 1;
    --e;
  }
  return BitsFloat(sign | (e << 23) | ((mantissa & 0x3ffu) << 13));
}
}  // namespace half_internal

// A 16-bit float stored as its bits. Arithmetic and comparisons go through the implicit
// conversion to float, so `a * b + c` is float arithmetic and rounds once, when the result is
// stored back into a 16-bit value. Trivial (uninitialised) by default, as float is, so that
// arrays of it cost nothing to create.
#define TANDEM_DEFINE_16BIT_FLOAT(Name, to_bits, from_bits)                                 \
  struct alignas(2) Name {                                                                  \
    uint16_t bits;                                                                          \
    Name() = default;                                                                       \
    TANDEM_HOST_DEVICE Name(float f) : bits(half_internal::to_bits(f)) {}                   \
    TANDEM_HOST_DEVICE explicit Name(double d) : Name(static_cast<float>(d)) {}             \
    TANDEM_HOST_DEVICE explicit Name(int64_t i) : Name(static_cast<float>(i)) {}            \
    TANDEM_HOST_DEVICE explicit Name(int i) : Name(static_cast<float>(i)) {}                \
    TANDEM_HOST_DEVICE operator float() const { return from_bits; }                         \
    TANDEM_HOST_DEVICE static Name FromBits(uint16_t b) {                                   \
      Name v;                                                                               \
      v.bits = b;                                                                           \
      return v;                                                                             \
    }                                                                                       \
    TANDEM_HOST_DEVICE Name& operator+=(float x) { return *this = Name(float(*this) + x); } \
    TANDEM_HOST_DEVICE Name& operator-=(float x) { return *this = Name(float(*this) - x); } \
    TANDEM_HOST_DEVICE Name& operator*=(float x) { return *this = Name(float(*this) * x); } \
    TANDEM_HOST_DEVICE Name& operator/=(float x) { return *this = Name(float(*this) / x); } \
  };                                                                                        \
  inline std::ostream& operator<<(std::ostream& out, Name v) { return out << float(v); }

TANDEM_DEFINE_16BIT_FLOAT(BFloat16, FloatToBFloat16Bits,
                          half_internal::BitsFloat(static_cast<uint32_t>(bits) << 16))
TANDEM_DEFINE_16BIT_FLOAT(Half, FloatToHalfBits, half_internal::HalfBitsToFloat(bits))
#undef TANDEM_DEFINE_16BIT_FLOAT

// The type a kernel computes in for element type T (PyTorch's opmath_type): float for the
// 16-bit floats, T itself otherwise.
template <typename T>
struct OpMathTypeOf {
  using type = T;
};
template <>
struct OpMathTypeOf<BFloat16> {
  using type = float;
};
template <>
struct OpMathTypeOf<Half> {
  using type = float;
};
template <typename T>
using OpMath = typename OpMathTypeOf<T>::type;

template <typename T>
inline constexpr bool kIsReducedFloat = false;
template <>
inline constexpr bool kIsReducedFloat<BFloat16> = true;
template <>
inline constexpr bool kIsReducedFloat<Half> = true;

}  // namespace tandem

// numeric_limits as PyTorch's torch.finfo reports them.
namespace std {
template <>
class numeric_limits<tandem::BFloat16> {
 public:
  static constexpr bool is_specialized = true;
  static constexpr bool has_quiet_NaN = true;
  static constexpr bool has_infinity = true;
  static constexpr int digits = 8;
  static TANDEM_HOST_DEVICE tandem::BFloat16 lowest() { return tandem::BFloat16::FromBits(0xff7f); }
  static TANDEM_HOST_DEVICE tandem::BFloat16 max() { return tandem::BFloat16::FromBits(0x7f7f); }
  static TANDEM_HOST_DEVICE tandem::BFloat16 min() { return tandem::BFloat16::FromBits(0x0080); }
  static TANDEM_HOST_DEVICE tandem::BFloat16 epsilon() {
    return tandem::BFloat16::FromBits(0x3c00);
  }
  static TANDEM_HOST_DEVICE tandem::BFloat16 infinity() {
    return tandem::BFloat16::FromBits(0x7f80);
  }
  static TANDEM_HOST_DEVICE tandem::BFloat16 quiet_NaN() {
    return tandem::BFloat16::FromBits(0x7fc0);
  }
};
template <>
class numeric_limits<tandem::Half> {
 public:
  static constexpr bool is_specialized = true;
  static constexpr bool has_quiet_NaN = true;
  static constexpr bool has_infinity = true;
  static constexpr int digits = 11;
  static TANDEM_HOST_DEVICE tandem::Half lowest() { return tandem::Half::FromBits(0xfbff); }
  static TANDEM_HOST_DEVICE tandem::Half max() { return tandem::Half::FromBits(0x7bff); }
  static TANDEM_HOST_DEVICE tandem::Half min() { return tandem::Half::FromBits(0x0400); }
  static TANDEM_HOST_DEVICE tandem::Half epsilon() { return tandem::Half::FromBits(0x1400); }
  static TANDEM_HOST_DEVICE tandem::Half infinity() { return tandem::Half::FromBits(0x7c00); }
  static TANDEM_HOST_DEVICE tandem::Half quiet_NaN() { return tandem::Half::FromBits(0x7e00); }
};
}  // namespace std

#endif  // TANDEM_TENSOR_BASE_HALF_H_
