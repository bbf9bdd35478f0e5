// StridedLayout: the iteration space of an elementwise kernel over several strided operands,
// simplified once on the host and shared by the CPU and CUDA backends.
//
// Size-1 dimensions are dropped and neighbouring dimensions merged wherever every operand
// is contiguous across them, so a contiguous op ends up with one dimension of stride 1 and
// a row-broadcast add with two. Operand 0 is the output; its shape is the shape of all.
//
//   const KernelTensor* operands[3] = {&dst, &a, &b};
//   const StridedLayout<3> layout = MakeStridedLayout(operands);
//   if (layout.IsContiguous()) { /* one flat loop */ }
#ifndef TANDEM_TENSOR_KERNELS_INTERNAL_STRIDED_LAYOUT_H_
#define TANDEM_TENSOR_KERNELS_INTERNAL_STRIDED_LAYOUT_H_

#include <cstdint>
#include <limits>

#include "tensor/runtime/backend.h"

namespace tandem {

template <int kArity>
struct StridedLayout {
  int ndim = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[kArity][kMaxDims] = {};

  // One flat run of unit stride for every operand (or a single element).
  bool IsContiguous() const {
    if (ndim == 0) return true;
    if (ndim > 1) return false;
    for (int a = 0; a < kArity; ++a) {
      if (strides[a][0] != 1) return false;
    }
    return true;
  }

  // Whether `numel` and every operand's furthest offset fit in int32 (cheaper GPU indexing).
  bool FitsInt32(int64_t numel) const {
    constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
    if (numel > kMax) return false;
    for (int a = 0; a < kArity; ++a) {
      int64_t extent = 0;
      for (int d = 0; d < ndim; ++d) {
        if (strides[a][d] < 0) return false;
        extent += (sizes[d] - 1) * strides[a][d];
      }
      if (extent > kMax) return false;
    }
    return true;
  }
};

template <int kArity>
StridedLayout<kArity> MakeStridedLayout(const KernelTensor* const (&operands)[kArity]) {
  const KernelTensor& shape = *operands[0];
  StridedLayout<kArity> layout;
  for (int d = 0; d < shape.ndim; ++d) {
    if (shape.sizes[d] == 1) continue;
    const int out = layout.ndim;
    bool merge = out > 0;
    for (int a = 0; a < kArity && merge; ++a) {
      merge = layout.strides[a][out - 1] == operands[a]->strides[d] * shape.sizes[d];
    }
    if (merge) {
      layout.sizes[out - 1] *= shape.sizes[d];
      for (int a = 0; a < kArity; ++a) layout.strides[a][out - 1] = operands[a]->strides[d];
    } else {
      layout.sizes[out] = shape.sizes[d];
      for (int a = 0; a < kArity; ++a) layout.strides[a][out] = operands[a]->strides[d];
      ++layout.ndim;
    }
  }
  return layout;
}

}  // namespace tandem

#endif  // TANDEM_TENSOR_KERNELS_INTERNAL_STRIDED_LAYOUT_H_
