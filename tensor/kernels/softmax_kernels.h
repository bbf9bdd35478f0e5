// The softmax kernel of softmax and log_softmax (KernelStub, tensor/runtime/kernel_stub.h), over
// the middle axis of a contiguous [outer, dim, inner] floating tensor (float32, float64,
// bfloat16, float16; the 16-bit ones computed in float). Each backend registers its kernel beside
// its code (tensor/cpu/reduce_kernels.cc, tensor/cuda/softmax_kernels.cc); tensor/ops/softmax.cc
// calls RunSoftmax, which checks the sizes once and dispatches on the device's type.
//
//   RunSoftmax(x.device(), x.dtype(), /*log=*/false, out_ptr, x_ptr, outer, dim, inner);
#ifndef TANDEM_TENSOR_KERNELS_SOFTMAX_KERNELS_H_
#define TANDEM_TENSOR_KERNELS_SOFTMAX_KERNELS_H_

#include <cstdint>

#include "tensor/base/device.h"
#include "tensor/base/dtype.h"
#include "tensor/runtime/kernel_stub.h"

namespace tandem {

// Softmax (or log-softmax when `log`) of each row along `dim`; rows are `inner` apart.
TANDEM_DECLARE_KERNEL(SoftmaxKernel,
                      void(int index, DType dtype, bool log, void* dst, const void* src,
                           int64_t outer, int64_t dim, int64_t inner));

// Checks that the sizes are non-negative (tandem::Error naming the device otherwise), then calls
// the kernel of `device`'s type.
void RunSoftmax(Device device, DType dtype, bool log, void* dst, const void* src, int64_t outer,
                int64_t dim, int64_t inner);

}  // namespace tandem

#endif  // TANDEM_TENSOR_KERNELS_SOFTMAX_KERNELS_H_
