// cudasim's stand-in for <cuda_bf16.h>: `__nv_bfloat16` (float32's top half, as its bits) with
// __float2bfloat16 (to nearest even), __bfloat162float and the implicit conversions CUDA's C++
// type has; see cuda_fp16.h for why the conversions are the simulator's own.
//
//   __nv_bfloat16 b = __float2bfloat16(1.5f);
//   float f = __bfloat162float(b);  // 1.5f
#ifndef TANDEM_TOOLS_CUDASIM_INCLUDE_CUDA_BF16_H_
#define TANDEM_TOOLS_CUDASIM_INCLUDE_CUDA_BF16_H_

#include <cstdint>

#include "tools/cudasim/float16.h"

struct alignas(2) __nv_bfloat16 {
  uint16_t __x;
  __nv_bfloat16() = default;
  __nv_bfloat16(float f)  // NOLINT: CUDA's is implicit
      : __x(::cudasim::internal::FloatToBFloat16(f)) {}
  operator float() const { return ::cudasim::internal::BFloat16ToFloat(__x); }
};

inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline float __bfloat162float(__nv_bfloat16 b) { return static_cast<float>(b); }

#endif  // TANDEM_TOOLS_CUDASIM_INCLUDE_CUDA_BF16_H_
