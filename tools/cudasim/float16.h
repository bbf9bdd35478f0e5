// cudasim internals: round-to-nearest-even conversions between float and IEEE binary16 or
// bfloat16 (float's top half), and float's rounding to TF32, for the simulated libraries that
// compute 16-bit data in float (cuBLAS's GemmEx, NCCL's reductions). Written here rather than taken
// from Tandem's tensor/base/half.h so that the simulator checks that header's conversions instead
// of sharing them. Not for use outside tools/cudasim.
//
//   uint16_t sum = cudasim::internal::FloatToBFloat16(cudasim::internal::BFloat16ToFloat(a) +
//                                                     cudasim::internal::BFloat16ToFloat(b));
#ifndef TANDEM_TOOLS_CUDASIM_FLOAT16_H_
#define TANDEM_TOOLS_CUDASIM_FLOAT16_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace cudasim {
namespace internal {

inline float BFloat16ToFloat(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline uint16_t FloatToBFloat16(float f) {
  if (std::isnan(f)) return 0x7fc0;
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}
inline float HalfToFloat(uint16_t h) {
  const int exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  const float sign = (h & 0x8000) ? -1.0f : 1.0f;
  if (exponent == 0x1f) return mantissa ? NAN : sign * INFINITY;
  if (exponent == 0) return sign * std::ldexp(static_cast<float>(mantissa), -24);
  return sign * std::ldexp(static_cast<float>(mantissa | 0x400), exponent - 25);
}
// Through double, with the exact arithmetic of ldexp and nearbyint (the default rounding mode
// is to nearest, ties to even).
inline uint16_t FloatToHalf(float f) {
  if (std::isnan(f)) return 0x7e00;
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  double a = std::fabs(static_cast<double>(f));
  if (a >= 65520.0) return sign | 0x7c00;  // rounds to infinity
  int exponent;
  std::frexp(a, &exponent);                // a = m * 2^exponent, m in [0.5, 1)
  exponent = std::max(exponent - 1, -14);  // float16's exponent of a (subnormals: -14)
  const double mantissa = std::nearbyint(std::ldexp(a, 10 - exponent));  // 11 significant bits
  // mantissa may round up to 2048 (the next binade), which the encoding below carries into the
  // exponent; below 1024 it is a subnormal (stored exponent 0).
  const uint32_t m = static_cast<uint32_t>(mantissa);
  if (m < 1024) return sign | static_cast<uint16_t>(m);
  return sign | static_cast<uint16_t>(((exponent + 15) << 10) + (m - 1024));
}

// TF32 as the tensor cores take it: float32 rounded (to nearest, ties to even) to 10 mantissa
// bits (cuBLAS's CUBLAS_TF32_TENSOR_OP_MATH, cuBLASLt's CUBLAS_COMPUTE_32F_FAST_TF32).
inline float RoundToTf32(float x) {
  if (!std::isfinite(x)) return x;
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  bits += 0x0fffu + ((bits >> 13) & 1u);
  bits &= ~0x1fffu;
  std::memcpy(&x, &bits, 4);
  return x;
}

}  // namespace internal
}  // namespace cudasim

#endif  // TANDEM_TOOLS_CUDASIM_FLOAT16_H_
