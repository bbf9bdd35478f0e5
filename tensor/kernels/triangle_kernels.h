// The triangle kernel of tril and triu (KernelStub, tensor/runtime/kernel_stub.h): keeps the
// lower or upper triangle of `batch` contiguous rows x cols matrices and zeroes the rest. Each
// backend registers its kernel beside its code (tensor/cpu/triangle_kernels.cc,
// tensor/cuda/triangle_kernels.cc); tensor/ops/triangle.cc calls RunTriangle, which checks the
// sizes once and dispatches on the device's type.
//
//   RunTriangle(x.device(), x.dtype(), /*lower=*/true, /*diagonal=*/0, batch, rows, cols, src,
//               dst);
#ifndef TANDEM_TENSOR_KERNELS_TRIANGLE_KERNELS_H_
#define TANDEM_TENSOR_KERNELS_TRIANGLE_KERNELS_H_

#include <cstdint>

#include "tensor/base/device.h"
#include "tensor/base/dtype.h"
#include "tensor/runtime/kernel_stub.h"

namespace tandem {

// torch.tril (lower) / torch.triu, any dtype: dst keeps src's element (i, j) where
// j - i <= diagonal (lower) or j - i >= diagonal (upper), and is zero elsewhere. dst may be src
// (in place).
TANDEM_DECLARE_KERNEL(TriangleKernel,
                      void(int index, DType dtype, bool lower, int64_t diagonal, int64_t batch,
                           int64_t rows, int64_t cols, const void* src, void* dst));

// Checks that the sizes are non-negative (tandem::Error naming the device otherwise), then calls
// the kernel of `device`'s type.
void RunTriangle(Device device, DType dtype, bool lower, int64_t diagonal, int64_t batch,
                 int64_t rows, int64_t cols, const void* src, void* dst);

}  // namespace tandem

#endif  // TANDEM_TENSOR_KERNELS_TRIANGLE_KERNELS_H_
