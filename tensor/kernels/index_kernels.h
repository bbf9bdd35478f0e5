// The gather and scatter-add kernels of gather, cross_entropy/nll_loss and the sparse gradients
// of embedding (KernelStub, tensor/runtime/kernel_stub.h), over floating operands (float32,
// float64, bfloat16, float16; the indices are int64). Each backend registers its kernels beside
// its code (tensor/cpu/index_kernels.cc, tensor/cuda/index_kernels.cc); the ops call the stub
// with their tensor's device. Indices must be in range: the ops validate them, the kernels do
// not, except that backends which check them on the device instead (CUDA: Note [Device-side
// index checks], tensor/cuda/kernels.h) skip a bad one and report it, naming `op` (a string
// literal), at their next host synchronization. Scatter-adds into a 16-bit dst round after each
// add, as PyTorch does.
//
//   GatherKernel(x.device(), x.dtype(), out_ptr, x_ptr, idx_ptr, outer, src_dim, idx_dim,
//                inner, "gather");
#ifndef TANDEM_TENSOR_KERNELS_INDEX_KERNELS_H_
#define TANDEM_TENSOR_KERNELS_INDEX_KERNELS_H_

#include <cstdint>

#include "tensor/base/dtype.h"
#include "tensor/runtime/kernel_stub.h"

namespace tandem {

// dst[r] = src[r * cols + idx[r]] for r in [0, rows); indices in [0, cols).
TANDEM_DECLARE_KERNEL(GatherColumnsKernel,
                      void(int index, DType dtype, void* dst, const void* src, const int64_t* idx,
                           int64_t rows, int64_t cols, const char* op));
// dst[r * cols + idx[r]] += src[r] (dst is not cleared).
TANDEM_DECLARE_KERNEL(ScatterAddColumnsKernel,
                      void(int index, DType dtype, void* dst, const void* src, const int64_t* idx,
                           int64_t rows, int64_t cols));
// torch.gather over the middle axis of contiguous tensors: src [outer, src_dim, inner], idx and
// dst [outer, idx_dim, inner]: dst[o, j, i] = src[o, idx[o, j, i], i]; indices in [0, src_dim).
TANDEM_DECLARE_KERNEL(GatherKernel, void(int index, DType dtype, void* dst, const void* src,
                                         const int64_t* idx, int64_t outer, int64_t src_dim,
                                         int64_t idx_dim, int64_t inner, const char* op));
// The adjoint of Gather: dst[o, idx[o, j, i], i] += src[o, j, i] for dst [outer, dst_dim, inner]
// (not cleared). Repeated indices accumulate.
TANDEM_DECLARE_KERNEL(ScatterAddKernel,
                      void(int index, DType dtype, void* dst, const void* src, const int64_t* idx,
                           int64_t outer, int64_t dst_dim, int64_t idx_dim, int64_t inner));

}  // namespace tandem

#endif  // TANDEM_TENSOR_KERNELS_INDEX_KERNELS_H_
