// Uniform and normal random numbers from Philox counters (LaunchRandomUniform,
// LaunchRandomNormal of kernels.h), bitwise or nearly the CPU backend's.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "tensor/base/error.h"
#include "tensor/base/philox.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/internal/launch_utils.cuh"
#include "tensor/cuda/kernels.h"

namespace tandem {
namespace cuda {
namespace {

// ---- Random numbers ---------------------------------------------------------------------
// Element i is a function of counter offset + i alone (tensor/base/philox.h). Each thread owns
// one Philox block — 4 counters for uniforms, 2 for normals — and writes the elements of
// the request that fall in it, so a block is generated once and the output is the same
// whatever the grid. __fmul_rn/__fadd_rn keep nvcc from fusing a * b + c into an FMA,
// whose single rounding would differ from the CPU's two. T is only the stored type: float64
// requests compute in float32 too and widen (Note [Random float64] in tensor/runtime/backend.h).

template <typename T>
__global__ void RandomUniformKernel(T* dst, int64_t n, uint64_t key, uint64_t offset, float low,
                                    float range, float high, float below_high) {
  const uint64_t first_block = offset / 4;
  const uint64_t blocks = (offset + n + 3) / 4 - first_block;
  for (int64_t b = GlobalThread(); b < static_cast<int64_t>(blocks); b += GridThreads()) {
    const uint64_t block_index = first_block + b;
    const philox::Block block = philox::Generate(key, block_index);
#pragma unroll
    for (int lane = 0; lane < 4; ++lane) {
      const uint64_t counter = block_index * 4 + lane;
      if (counter < offset || counter >= offset + n) continue;
      const float value = __fadd_rn(low, __fmul_rn(range, philox::ToUnit(block.x[lane])));
      dst[counter - offset] = static_cast<T>(value >= high && high > low ? below_high : value);
    }
  }
}

template <typename T>
__global__ void RandomNormalKernel(T* dst, int64_t n, uint64_t key, uint64_t offset, float mean,
                                   float stddev) {
  const uint64_t first_block = offset / 2;
  const uint64_t blocks = (offset + n + 1) / 2 - first_block;
  for (int64_t b = GlobalThread(); b < static_cast<int64_t>(blocks); b += GridThreads()) {
    const uint64_t block_index = first_block + b;
    const philox::Block block = philox::Generate(key, block_index);
#pragma unroll
    for (int lane = 0; lane < 2; ++lane) {
      const uint64_t counter = block_index * 2 + lane;
      if (counter < offset || counter >= offset + n) continue;
      // The arithmetic of philox::Normal (and of the CPU backend), step by step.
      const float u1 = ((block.x[2 * lane] >> 8) + 1) * (1.0f / 16777216.0f);
      const float u2 = philox::ToUnit(block.x[2 * lane + 1]);
      const float radius = sqrtf(-2.0f * logf(u1));
      const float z = __fmul_rn(radius, cosf(__fmul_rn(6.2831853071795864769f, u2)));
      dst[counter - offset] = static_cast<T>(__fadd_rn(mean, __fmul_rn(stddev, z)));
    }
  }
}

}  // namespace

void LaunchRandomUniform(const LaunchContext& context, DType dtype, void* dst, int64_t n,
                         uint64_t seed, uint64_t offset, double low_value, double high_value) {
  DispatchAllFloatingTypes(dtype, "CUDA RandomUniform", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (n <= 0) return;
    // In float32 whatever T is (Note [Random float64]). As in the CPU backend: low + range * u
    // can round up to `high`; the largest float below it keeps the interval half-open.
    const float low = static_cast<float>(low_value), high = static_cast<float>(high_value);
    const float range = high - low;
    const float below_high = std::nextafter(high, low);
    const int64_t blocks = static_cast<int64_t>((offset + n + 3) / 4 - offset / 4);
    RandomUniformKernel<T><<<GridFor(context, blocks), kThreads, 0, context.stream>>>(
        static_cast<T*>(dst), n, seed ^ philox::kUniformStream, offset, low, range, high,
        below_high);
    TANDEM_CUDA_CHECK_LAUNCH(context.device);
  });
}

void LaunchRandomNormal(const LaunchContext& context, DType dtype, void* dst, int64_t n,
                        uint64_t seed, uint64_t offset, double mean, double stddev) {
  DispatchAllFloatingTypes(dtype, "CUDA RandomNormal", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (n <= 0) return;
    const int64_t blocks = static_cast<int64_t>((offset + n + 1) / 2 - offset / 2);
    RandomNormalKernel<T><<<GridFor(context, blocks), kThreads, 0, context.stream>>>(
        static_cast<T*>(dst), n, seed ^ philox::kNormalStream, offset, static_cast<float>(mean),
        static_cast<float>(stddev));
    TANDEM_CUDA_CHECK_LAUNCH(context.device);
  });
}

}  // namespace cuda
}  // namespace tandem
