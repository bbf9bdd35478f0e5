// The multi-tensor cast KernelStub (tensor/runtime/kernel_stub.h): many contiguous float32
// tensors rounded to bfloat16 or float16 in one kernel call per device, as PyTorch's
// _foreach ops, instead of one cast launch per tensor. Autocast uses it to cast a model's GEMM
// weights once a step (autocast::CastWeights, tensor/ops/autocast_weights.h): a GPT-2 block
// has 8 of them, and 8 small launches a layer cost more than the work they do.
//
//   std::vector<ForeachCastTensor> casts = {{w.numel(), w.data_ptr(), w16.data_ptr()}, ...};
//   RunForeachCast(w.device(), kFloat32, kBFloat16, casts);  // w16[i] == BFloat16(w[i])
//
// Each backend registers its kernel beside its code (tensor/cpu/cast_kernels.cc,
// tensor/cuda/cast_kernels.cc). Every element rounds to nearest even exactly as Tensor::to
// rounds it on that device (the CPU's vec::FromFloat, CUDA's 16-bit constructor from float),
// so a tensor cast here is bitwise the one to() makes. Sources and destinations do not overlap.
#ifndef TANDEM_TENSOR_KERNELS_CAST_KERNELS_H_
#define TANDEM_TENSOR_KERNELS_CAST_KERNELS_H_

#include <cstdint>
#include <vector>

#include "tensor/base/device.h"
#include "tensor/base/dtype.h"
#include "tensor/runtime/kernel_stub.h"

namespace tandem {

// One tensor of a call: `numel` contiguous elements of the source dtype at `src`, written as the
// destination dtype at `dst`.
struct ForeachCastTensor {
  int64_t numel = 0;
  const void* src = nullptr;
  void* dst = nullptr;
};
TANDEM_DECLARE_KERNEL(ForeachCastKernel, void(int index, DType src_dtype, DType dst_dtype,
                                              const std::vector<ForeachCastTensor>& tensors));

// Whether ForeachCastKernel converts `src` to `dst`: float32 to bfloat16 or float16.
bool ForeachCastSupports(DType src, DType dst);

// Throws tandem::Error unless ForeachCastSupports(src, dst); `kernel` names the caller.
void CheckForeachCastDTypes(const char* kernel, DType src, DType dst);

// Checks the arguments (supported dtypes; each non-empty tensor has both pointers), throwing
// tandem::Error that names the tensor, then calls the kernel of `device`'s type. Nothing runs
// when a check fails.
void RunForeachCast(Device device, DType src_dtype, DType dst_dtype,
                    const std::vector<ForeachCastTensor>& tensors);

}  // namespace tandem

#endif  // TANDEM_TENSOR_KERNELS_CAST_KERNELS_H_
