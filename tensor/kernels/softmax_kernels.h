// The softmax kernel of softmax and log_softmax (KernelStub, tensor/runtime/kernel_stub.h), over
// the middle axis of a contiguous [outer, dim, inner] floating tensor (float32, float64,
// bfloat16, float16; the 16-bit ones computed in float), and the fused cross-entropy's forward
// and backward (tensor/ops/loss.cc), which keep a log-sum-exp per row instead of the
// log-probabilities. Each backend registers its kernel beside
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

// Note [Fused cross-entropy]: over contiguous [rows, cols] logits and int64 targets [rows],
// the forward writes each row's log-sum-exp `lse` and its loss lse - logits[target], both in
// float32 (float64 for float64 logits: CrossEntropyLseType, the type the kernels compute in);
// the backward writes grad_logits = (exp(logits - lse) - onehot(targets)) * grad[0] * scale in
// the logits' dtype, `grad` one element of CrossEntropyLseType on the device, in one pass and
// rounding once. 16-bit logits are widened as they are read, so the results are those of the
// logits cast to float32 first, the gradient rounded once (Note [Autocast cross-entropy]). A target
// out of [0, cols) gives loss 0 and no onehot term; the forward records it as an index kernel does
// (Note [Device-side index checks] in tensor/cuda/kernels.h, as `op`; the CPU's caller checks
// targets before).
TANDEM_DECLARE_KERNEL(CrossEntropyForwardKernel,
                      void(int index, DType dtype, void* row_loss, void* lse, const void* logits,
                           const int64_t* targets, int64_t rows, int64_t cols, const char* op));
TANDEM_DECLARE_KERNEL(CrossEntropyBackwardKernel,
                      void(int index, DType dtype, void* grad_logits, const void* logits,
                           const void* lse, const int64_t* targets, const void* grad, double scale,
                           int64_t rows, int64_t cols));

// The dtype of a fused cross-entropy's log-sum-exp for `dtype` logits: OpMath's.
inline DType CrossEntropyLseType(DType dtype) { return dtype == kFloat64 ? kFloat64 : kFloat32; }

// Checks that the sizes are non-negative (tandem::Error naming the device otherwise), then calls
// the kernel of `device`'s type.
void RunSoftmax(Device device, DType dtype, bool log, void* dst, const void* src, int64_t outer,
                int64_t dim, int64_t inner);

}  // namespace tandem

#endif  // TANDEM_TENSOR_KERNELS_SOFTMAX_KERNELS_H_
