// Philox4x32-10, the counter-based random number generator of Salmon et al. (SC'11), and
// the mapping from (seed, counter) to float32 uniforms and normals that every backend uses.
// Because each value is a pure function of (seed, counter), the CPU and a GPU produce the
// same numbers for the same seed however the work is split across threads.
//
// This header compiles as plain C++ and as CUDA (__host__ __device__). Use it where a value
// must be the one Tandem's random ops would draw for a (seed, counter) without building a
// tensor: a sampler's permutation, a procedural dataset, a test that recomputes a dropout mask.
//
//   float u = tandem::philox::Uniform(/*seed=*/42, /*counter=*/7);  // in [0, 1)
#ifndef TANDEM_TENSOR_BASE_PHILOX_H_
#define TANDEM_TENSOR_BASE_PHILOX_H_

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define TANDEM_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define TANDEM_HOST_DEVICE inline
#endif

namespace tandem {
namespace philox {

struct Block {
  uint32_t x[4];
};

TANDEM_HOST_DEVICE uint32_t MulHiLo(uint32_t a, uint32_t b, uint32_t* hi) {
  const uint64_t product = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(product >> 32);
  return static_cast<uint32_t>(product);
}

// Ten rounds of Philox4x32 on counter `block` with the 64-bit key `key`.
TANDEM_HOST_DEVICE Block Generate(uint64_t key, uint64_t block) {
  uint32_t c0 = static_cast<uint32_t>(block), c1 = static_cast<uint32_t>(block >> 32);
  uint32_t c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, hi1;
    const uint32_t lo0 = MulHiLo(0xD2511F53u, c0, &hi0);
    const uint32_t lo1 = MulHiLo(0xCD9E8D57u, c2, &hi1);
    const uint32_t n0 = hi1 ^ c1 ^ k0;
    const uint32_t n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return Block{{c0, c1, c2, c3}};
}

// Separate key streams so that uniform and normal requests never share random bits.
inline constexpr uint64_t kUniformStream = 0;
inline constexpr uint64_t kNormalStream = 0x9E3779B97F4A7C15ull;

// 24 random bits as a float in [0, 1).
TANDEM_HOST_DEVICE float ToUnit(uint32_t bits) { return (bits >> 8) * (1.0f / 16777216.0f); }

// The uniform [0, 1) value at `counter` for `seed`.
TANDEM_HOST_DEVICE float Uniform(uint64_t seed, uint64_t counter) {
  const Block b = Generate(seed ^ kUniformStream, counter >> 2);
  // Selected, not indexed: nvcc keeps an array indexed at run time in local memory (a stack
  // frame in every kernel that draws a uniform).
  const uint32_t lane = static_cast<uint32_t>(counter & 3);
  return ToUnit(lane == 0 ? b.x[0] : lane == 1 ? b.x[1] : lane == 2 ? b.x[2] : b.x[3]);
}

// The standard normal value at `counter` for `seed` (Box-Muller on two 24-bit uniforms).
// The CPU and CUDA agree to a few float32 ulps (their log/cos differ in the last bits).
TANDEM_HOST_DEVICE float Normal(uint64_t seed, uint64_t counter) {
  const Block b = Generate(seed ^ kNormalStream, counter >> 1);
  const int lane = static_cast<int>(counter & 1) * 2;
  const float u1 = ((b.x[lane] >> 8) + 1) * (1.0f / 16777216.0f);  // (0, 1]: log is finite
  const float u2 = ToUnit(b.x[lane + 1]);
  const float radius = sqrtf(-2.0f * logf(u1));
  return radius * cosf(6.2831853071795864769f * u2);
}

}  // namespace philox
}  // namespace tandem

#endif  // TANDEM_TENSOR_BASE_PHILOX_H_
