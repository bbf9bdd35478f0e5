// The CPU backend's reductions: every kind of the reduction table (tensor/runtime/op_tables.h)
// over the middle axis of [outer, reduce, inner], split over cpu:`index`'s pool.
// Results do not depend on the split (sums accumulate in double, in fixed blocks).
// CpuBackend's overrides call these after checking the index. Internal to the CPU backend.
//
//   cpu_internal::Reduce(/*index=*/0, ReduceKind::kSum, dst, src, outer, reduce, inner);
#ifndef TANDEM_TENSOR_CPU_INTERNAL_REDUCE_KERNELS_H_
#define TANDEM_TENSOR_CPU_INTERNAL_REDUCE_KERNELS_H_

#include <cstdint>

#include "tensor/base/dtype.h"
#include "tensor/runtime/backend.h"

namespace tandem {
namespace cpu_internal {

// Backend::Reduce (its contract is in tensor/runtime/backend.h). reduce_kernels.cc also
// registers the CPU's SoftmaxKernel (tensor/kernels/softmax_kernels.h).
void Reduce(int index, ReduceKind op, const KernelTensor& dst, const KernelTensor& src,
            int64_t outer, int64_t reduce, int64_t inner);

}  // namespace cpu_internal
}  // namespace tandem

#endif  // TANDEM_TENSOR_CPU_INTERNAL_REDUCE_KERNELS_H_
