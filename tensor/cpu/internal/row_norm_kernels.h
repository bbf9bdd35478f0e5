// The CPU backend's fused row norms (Note [Fused row norms] in tensor/runtime/backend.h):
// layer norm and RMS norm over the last axis of [rows, cols], forward and backward, computed in
// OpMath<T> with rows split over cpu:`index`'s pool. CpuBackend's overrides call these after
// checking the index. Internal to the CPU backend.
//
//   cpu_internal::RowNorm(/*index=*/0, kFloat32, /*rms=*/false, rows, cols, 1e-5, x, weight,
//                         bias, y, mean, rstd);
#ifndef TANDEM_TENSOR_CPU_INTERNAL_ROW_NORM_KERNELS_H_
#define TANDEM_TENSOR_CPU_INTERNAL_ROW_NORM_KERNELS_H_

#include <cstdint>

#include "tensor/base/dtype.h"

namespace tandem {
namespace cpu_internal {

// Backend::RowNorm and RowNormBackward (their contracts are in tensor/runtime/backend.h).
void RowNorm(int index, DType dtype, bool rms, int64_t rows, int64_t cols, double eps,
             const void* x, const void* weight, const void* bias, void* y, void* mean, void* rstd);
void RowNormBackward(int index, DType dtype, bool rms, int64_t rows, int64_t cols,
                     const void* grad_y, const void* x, const void* mean, const void* rstd,
                     const void* weight, void* grad_x, void* grad_weight, void* grad_bias);

}  // namespace cpu_internal
}  // namespace tandem

#endif  // TANDEM_TENSOR_CPU_INTERNAL_ROW_NORM_KERNELS_H_
