// Whether two tensors' elements share memory, as PyTorch's at::MemOverlap tells it: an op that
// writes one tensor while reading another must refuse a *partial* overlap (the result would
// depend on the order the elements are visited in, which differs between the CPU's loops, a
// GPU's grid and cudaMemcpyAsync), while a full alias (x.add_(x), x.copy_(x)) is allowed.
// Every in-place write of tensor/ (copy_, the in-place arithmetic) checks with these.
//
//   Tensor x = arange(4);
//   CheckNoPartialOverlap(x.narrow(0, 1, 3), x.narrow(0, 0, 3), "copy_");   // throws
//   CheckNoPartialOverlap(x, x, "add_");                                   // fine
#ifndef TANDEM_TENSOR_CORE_MEM_OVERLAP_H_
#define TANDEM_TENSOR_CORE_MEM_OVERLAP_H_

#include "tensor/core/tensor.h"

namespace tandem {

enum class MemOverlap {
  kNo,       // no element in common
  kFull,     // the same elements in the same order (an alias)
  kPartial,  // some elements in common
  kTooHard,  // strided layouts that would need an element-by-element search (allowed)
};

// kNo for tensors on different storages or disjoint ranges of one; kFull for the same view;
// kPartial when the spans of two non-overlapping-and-dense layouts intersect otherwise (the
// same span in another order included); kTooHard for other layouts of one storage (PyTorch
// allows those too).
MemOverlap OverlapOf(const Tensor& a, const Tensor& b);

// Throws unless some elements of `written` are the same memory location (an expanded tensor:
// a stride 0 over a dimension of size > 1). `op` names the caller in the message.
void CheckNoInternalOverlap(const Tensor& written, const char* op);

// Throws when `written` and `read` overlap partially (OverlapOf is kPartial); returns their
// overlap otherwise (kFull lets a copy skip itself).
MemOverlap CheckNoPartialOverlap(const Tensor& written, const Tensor& read, const char* op);

}  // namespace tandem

#endif  // TANDEM_TENSOR_CORE_MEM_OVERLAP_H_
