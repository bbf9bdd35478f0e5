// The CPU backend's elementwise kernels: Copy (with dtype conversion), Fill, and every op of
// the unary and binary op tables (tensor/runtime/op_tables.h), over any strided layout, split
// over cpu:`index`'s pool. CpuBackend's overrides call these after checking the index.
// Internal to the CPU backend.
//
//   cpu_internal::Unary(/*index=*/0, UnaryOp::kExp, dst, src, /*scalar=*/0.0);
#ifndef TANDEM_TENSOR_CPU_INTERNAL_ELEMENTWISE_KERNELS_H_
#define TANDEM_TENSOR_CPU_INTERNAL_ELEMENTWISE_KERNELS_H_

#include "tensor/runtime/backend.h"

namespace tandem {
namespace cpu_internal {

// Backend::Copy, Fill, Unary and Binary (their contracts are in tensor/runtime/backend.h).
void Copy(int index, const KernelTensor& dst, const KernelTensor& src);
void Fill(int index, const KernelTensor& dst, double value);
void Unary(int index, UnaryOp op, const KernelTensor& dst, const KernelTensor& src, double scalar);
void Binary(int index, BinaryOp op, const KernelTensor& dst, const KernelTensor& a,
            const KernelTensor& b);

}  // namespace cpu_internal
}  // namespace tandem

#endif  // TANDEM_TENSOR_CPU_INTERNAL_ELEMENTWISE_KERNELS_H_
