// cudasim's stand-in for <cuda_fp16.h>: `__half` (IEEE binary16 as its bits) with the
// conversions a kernel needs to hand 16-bit data to WMMA (<mma.h>): __float2half (to nearest
// even), __half2float, and the implicit conversions CUDA's C++ type has. Arithmetic goes
// through float, as in Tandem's own tensor/base/half.h; the simulator's conversions are its own
// (tools/cudasim/float16.h) so that they check Tandem's instead of sharing them.
//
//   __half h = __float2half(1.5f);
//   float f = __half2float(h);  // 1.5f
#ifndef TANDEM_TOOLS_CUDASIM_INCLUDE_CUDA_FP16_H_
#define TANDEM_TOOLS_CUDASIM_INCLUDE_CUDA_FP16_H_

#include <cstdint>

#include "tools/cudasim/float16.h"

struct alignas(2) __half {
  uint16_t __x;
  __half() = default;
  __half(float f) : __x(::cudasim::internal::FloatToHalf(f)) {}  // NOLINT: CUDA's is implicit
  operator float() const { return ::cudasim::internal::HalfToFloat(__x); }
};

inline __half __float2half(float f) { return __half(f); }
inline __half __float2half_rn(float f) { return __half(f); }
inline float __half2float(__half h) { return static_cast<float>(h); }

#endif  // TANDEM_TOOLS_CUDASIM_INCLUDE_CUDA_FP16_H_
