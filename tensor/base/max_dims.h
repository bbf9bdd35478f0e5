// kMaxDims: the most dimensions a tensor may have. Kernels size their fixed arrays of sizes and
// strides by it (KernelTensor, tensor/runtime/backend.h); code that reads shapes from outside
// (checkpoints, from_blob) checks against it.
//
//   if (rank > kMaxDims) return Error("at most " + std::to_string(kMaxDims) + " dimensions");
#ifndef TANDEM_TENSOR_BASE_MAX_DIMS_H_
#define TANDEM_TENSOR_BASE_MAX_DIMS_H_

namespace tandem {

inline constexpr int kMaxDims = 8;

}  // namespace tandem

#endif  // TANDEM_TENSOR_BASE_MAX_DIMS_H_
