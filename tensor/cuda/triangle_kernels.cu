// The lower or upper triangle of a batch of matrices (LaunchTriangle of kernels.h).
#include <cuda_runtime.h>

#include <cstdint>

#include "tensor/base/error.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/internal/launch_utils.cuh"
#include "tensor/cuda/kernels.h"

namespace tandem {
namespace cuda {
namespace {

// Unsigned integers of each element size: Triangle moves bits, whatever the dtype.
template <typename Bits>
__global__ void TriangleKernel(bool lower, int64_t diagonal, int64_t total, int64_t rows,
                               int64_t cols, const Bits* src, Bits* dst) {
  for (int64_t i = GlobalThread(); i < total; i += GridThreads()) {
    const int64_t column = i % cols, row = (i / cols) % rows;
    const bool keep = lower ? column - row <= diagonal : column - row >= diagonal;
    dst[i] = keep ? src[i] : Bits(0);
  }
}

}  // namespace

void LaunchTriangle(const LaunchContext& context, DType dtype, bool lower, int64_t diagonal,
                    int64_t batch, int64_t rows, int64_t cols, const void* src, void* dst) {
  const int64_t total = batch * rows * cols;
  if (total == 0) return;
  auto launch = [&](auto bits) {
    using Bits = decltype(bits);
    TriangleKernel<Bits><<<GridFor(context, total), kThreads, 0, context.stream>>>(
        lower, diagonal, total, rows, cols, static_cast<const Bits*>(src), static_cast<Bits*>(dst));
    TANDEM_CUDA_CHECK_LAUNCH(context.device);
  };
  switch (ElementSize(dtype)) {
    case 1:
      return launch(uint8_t{});
    case 2:
      return launch(uint16_t{});
    case 4:
      return launch(uint32_t{});
    case 8:
      return launch(uint64_t{});
    default:
      TANDEM_FAIL("CUDA Triangle: unsupported element size ", ElementSize(dtype), " of ", dtype);
  }
}

}  // namespace cuda
}  // namespace tandem
