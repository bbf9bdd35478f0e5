// Streaming conversions between float and the 16-bit floats (BFloat16, Half) over contiguous
// arrays, vectorised with AVX2 where the CPU has it (tensor/kernels/vectorized.h), and rounding
// float to bfloat16 with AVX512-BF16's conversion instruction where the CPU has that. Use them
// wherever a CPU loop loads 16-bit values as float or rounds floats into 16-bit storage in
// bulk (kernels, copies, GEMM scratch buffers); a single value converts with the types' own
// constructor and operator float.
//
//   vec::ToFloat(bf16_in, float_out, n);      // exact
//   vec::FromFloat(float_in, bf16_out, n);    // round to nearest even, NaN stays NaN
//
// The element functions are branch-free rewrites of half.h's conversions (Note [Reduced
// precision conversions]) and give the same bits for every input: half.h's versions branch
// (and normalise float16 subnormals in a loop), which keeps a compiler from vectorising them.
// Only integer operations and an exact int-to-float conversion are used, so the results do not
// depend on the vector unit, the rounding mode or flush-to-zero.
#ifndef TANDEM_TENSOR_KERNELS_FLOAT_CONVERSIONS_H_
#define TANDEM_TENSOR_KERNELS_FLOAT_CONVERSIONS_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "tensor/base/half.h"
#include "tensor/kernels/vectorized.h"

namespace tandem::vec {
namespace conversions_internal {

inline uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
inline float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// a where `take`, else b, on the bits: GCC's if-conversion leaves nested ?: on integers as
// branches, which keep a loop scalar.
inline uint32_t Select(bool take, uint32_t a, uint32_t b) {
  const uint32_t mask = 0u - static_cast<uint32_t>(take);
  return (a & mask) | (b & ~mask);
}

inline uint16_t BFloat16BitsOf(float f) {
  const uint32_t u = Bits(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = (u >> 16) | 0x0040u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

inline float BFloat16ToFloat(uint16_t b) { return FromBits(static_cast<uint32_t>(b) << 16); }

// All ones where a < b, else zero; a and b below 2^31. Arithmetic instead of a comparison:
// GCC did not vectorise the float16 rounding with its comparisons' booleans in it.
inline uint32_t LessMask(uint32_t a, uint32_t b) {
  return static_cast<uint32_t>(static_cast<int32_t>(a - b) >> 31);
}
inline uint32_t MaskSelect(uint32_t mask, uint32_t a, uint32_t b) {
  return (a & mask) | (b & ~mask);
}

inline uint16_t HalfBitsOf(float f) {
  const uint32_t u = Bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  const uint32_t nan = 0x7e00u | ((abs >> 13) & 0x1ffu);
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits (wraps,
  // harmlessly, for the lanes that take another branch).
  const uint32_t rebased = abs - 0x38000000u;
  const uint32_t normal = (rebased + 0xfffu + ((rebased >> 13) & 1u)) >> 13;
  // Subnormal: m * 2^-24 with m the mantissa shifted right by 14 .. 24, rounded to nearest
  // even as the normal case is (a carry into bit 10 gives the smallest normal, as it should);
  // the shift is clamped so that the other lanes stay defined.
  const int32_t shift = std::min(std::max(126 - static_cast<int32_t>(abs >> 23), 14), 24);
  const uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
  const uint32_t subnormal =
      (mantissa + ((1u << (shift - 1)) - 1u) + ((mantissa >> shift) & 1u)) >> shift;
  const uint32_t below_normal = MaskSelect(LessMask(abs, 0x33000000u), 0u, subnormal);
  const uint32_t finite = MaskSelect(LessMask(abs, 0x38800000u), below_normal,
                                     MaskSelect(LessMask(abs, 0x477ff000u), normal, 0x7c00u));
  return static_cast<uint16_t>(sign | MaskSelect(LessMask(0x7f800000u, abs), nan, finite));
}

inline float HalfToFloat(uint16_t h) {
  const uint32_t x = h;
  const uint32_t sign = (x & 0x8000u) << 16;
  const uint32_t exponent = (x >> 10) & 0x1fu;
  const uint32_t mantissa = x & 0x3ffu;
  const uint32_t normal = ((exponent + 112u) << 23) | (mantissa << 13);
  const uint32_t special = 0x7f800000u | (mantissa << 13);  // inf, NaN
  // Subnormal: mantissa * 2^-24. The int-to-float conversion is exact (mantissa < 2^10), and
  // taking 24 from its exponent scales it by 2^-24 exactly.
  const uint32_t scaled = Bits(static_cast<float>(static_cast<int32_t>(mantissa))) - (24u << 23);
  const uint32_t subnormal = Select(mantissa == 0, 0u, scaled);
  const uint32_t magnitude =
      Select(exponent == 0x1fu, special, Select(exponent != 0, normal, subnormal));
  return FromBits(sign | magnitude);
}

template <typename T>
inline float ToFloatElement(T x) {
  if constexpr (std::is_same_v<T, BFloat16>) {
    return BFloat16ToFloat(x.bits);
  } else {
    return HalfToFloat(x.bits);
  }
}

template <typename T>
inline T FromFloatElement(float f) {
  if constexpr (std::is_same_v<T, BFloat16>) {
    return T::FromBits(BFloat16BitsOf(f));
  } else {
    return T::FromBits(HalfBitsOf(f));
  }
}

// Note [bfloat16 rounding in hardware]: AVX512-BF16's VCVTNEPS2BF16 rounds 16 floats to
// nearest even in one instruction, where the branch-free integer rounding above takes about
// ten AVX2 instructions per 8 (measured 2.7x the throughput on 200,704 floats in cache). Its
// results equal BFloat16BitsOf's bits for every input except subnormal floats, which it
// flushes to zero (whatever MXCSR says); a block of 16 with a subnormal in it takes the
// integer rounding instead, so the bits never depend on the CPU.
inline bool CpuHasAvx512Bf16() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool has = __builtin_cpu_supports("avx512bf16") &&
                          __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl");
  return has && !g_force_baseline_vectors.load(std::memory_order_relaxed);
#else
  return false;
#endif
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx512f,avx512bf16,avx512vl"))) inline void FromFloatAvx512Bf16(
    const float* in, BFloat16* out, int64_t n) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
  const __m512i one = _mm512_set1_epi32(1);
  const __m512i below_normal = _mm512_set1_epi32(0x007fffff);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(in + i);
    // Subnormal lanes: 0 < |bits| < 0x00800000, i.e. |bits| - 1 below 0x007fffff unsigned.
    const __m512i magnitude = _mm512_and_si512(_mm512_castps_si512(v), abs_mask);
    if (_mm512_cmplt_epu32_mask(_mm512_sub_epi32(magnitude, one), below_normal) != 0) {
      for (int64_t j = i; j < i + 16; ++j) out[j] = BFloat16::FromBits(BFloat16BitsOf(in[j]));
      continue;
    }
    const __m256bh rounded = _mm512_cvtneps_pbh(v);
    std::memcpy(out + i, &rounded, sizeof(rounded));
  }
  for (; i < n; ++i) out[i] = BFloat16::FromBits(BFloat16BitsOf(in[i]));
}
#endif

}  // namespace conversions_internal

// The loops, for use inside a caller's own vec::Vectorized (which inlines them); `in` and
// `out` must not overlap.
template <typename T>
TANDEM_VECTORIZE inline void ToFloatLoop(const T* __restrict in, float* __restrict out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = conversions_internal::ToFloatElement(in[i]);
}

template <typename T>
TANDEM_VECTORIZE inline void FromFloatLoop(const float* __restrict in, T* __restrict out,
                                           int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = conversions_internal::FromFloatElement<T>(in[i]);
}

// out[i] = float(in[i]) for T BFloat16 or Half.
template <typename T>
void ToFloat(const T* in, float* out, int64_t n) {
  Vectorized([&] { ToFloatLoop(in, out, n); });
}

// out[i] = T(in[i]), rounded to nearest even, as T's constructor from float.
template <typename T>
void FromFloat(const float* in, T* out, int64_t n) {
#if defined(__x86_64__) && defined(__GNUC__)
  if constexpr (std::is_same_v<T, BFloat16>) {
    if (conversions_internal::CpuHasAvx512Bf16()) {
      conversions_internal::FromFloatAvx512Bf16(in, out, n);
      return;
    }
  }
#endif
  if (std::is_same_v<T, Half> && !CpuHasAvx2()) {
    // Without AVX2's variable shifts the branch-free rounding runs about 5x slower than
    // half.h's scalar conversion, whose branches predict well on typical data (same bits).
    for (int64_t i = 0; i < n; ++i) out[i] = T(in[i]);
    return;
  }
  Vectorized([&] { FromFloatLoop(in, out, n); });
}

}  // namespace tandem::vec

#endif  // TANDEM_TENSOR_KERNELS_FLOAT_CONVERSIONS_H_
