// The CPU backend's fused attention kernels (Note [Fused attention], tensor/runtime/backend.h):
// CpuBackend::AttentionForward/AttentionBackward call these; they are apart from
// cpu_backend.cc only to keep that file's kernels and these tile loops separately readable.
// Internal to the CPU backend.
//
//   CpuAttentionForward(/*index=*/0, kFloat32, geometry, q, k, v, /*mask=*/nullptr, out, lse);
#ifndef TANDEM_TENSOR_CPU_INTERNAL_ATTENTION_KERNELS_H_
#define TANDEM_TENSOR_CPU_INTERNAL_ATTENTION_KERNELS_H_

#include "tensor/base/dtype.h"
#include "tensor/runtime/backend.h"

namespace tandem {

// Blocks of queries split over cpu:`index`'s pool; within a block, tiles of keys through
// single-threaded BLAS GEMMs and an online softmax.
void CpuAttentionForward(int index, DType dtype, const AttentionGeometry& g, const void* q,
                         const void* k, const void* v, const void* mask, void* out,
                         void* logsumexp);
// FlashAttention-2's backward, one head per work item (each head's dk and dv are summed over
// all of its query blocks, so splitting a head would need a reduction).
void CpuAttentionBackward(int index, DType dtype, const AttentionGeometry& g, const void* q,
                          const void* k, const void* v, const void* mask, const void* out,
                          const void* dout, const void* logsumexp, void* dq, void* dk, void* dv);

}  // namespace tandem

#endif  // TANDEM_TENSOR_CPU_INTERNAL_ATTENTION_KERNELS_H_
