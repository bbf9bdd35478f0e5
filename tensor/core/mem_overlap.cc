#include "tensor/core/mem_overlap.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "tensor/base/error.h"

namespace tandem {
namespace {

// PyTorch's is_non_overlapping_and_dense: the strides, sorted, are those of a contiguous
// tensor of the sizes in that order, so the elements fill [offset, offset + numel) exactly.
bool IsNonOverlappingAndDense(const Tensor& t) {
  if (t.is_contiguous()) return true;
  std::vector<int64_t> order(t.dim());
  std::iota(order.begin(), order.end(), 0);
  const std::vector<int64_t>& strides = t.strides();
  const Shape& shape = t.shape();
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return shape[a] < 2 || (shape[b] >= 2 && strides[a] < strides[b]);
  });
  int64_t expected = 1;
  for (int64_t d : order) {
    if (shape[d] == 1) continue;
    if (strides[d] != expected) return false;
    expected *= shape[d];
  }
  return true;
}

}  // namespace

MemOverlap OverlapOf(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined() || a.numel() == 0 || b.numel() == 0) return MemOverlap::kNo;
  if (!a.shares_storage_with(b)) return MemOverlap::kNo;
  const int64_t a_size = static_cast<int64_t>(ElementSize(a.dtype()));
  const int64_t b_size = static_cast<int64_t>(ElementSize(b.dtype()));
  if (a.storage_offset() * a_size == b.storage_offset() * b_size && a.shape() == b.shape() &&
      a.strides() == b.strides() && a_size == b_size) {
    return MemOverlap::kFull;
  }
  if (!IsNonOverlappingAndDense(a) || !IsNonOverlappingAndDense(b)) return MemOverlap::kTooHard;
  const int64_t a_begin = a.storage_offset() * a_size, a_end = a_begin + a.numel() * a_size;
  const int64_t b_begin = b.storage_offset() * b_size, b_end = b_begin + b.numel() * b_size;
  // The same span in another order (a square matrix and its transpose) is a partial overlap.
  if (a_begin == b_begin && a_end == b_end) {
    return a.strides() == b.strides() && a_size == b_size ? MemOverlap::kFull
                                                          : MemOverlap::kPartial;
  }
  return a_begin < b_end && b_begin < a_end ? MemOverlap::kPartial : MemOverlap::kNo;
}

void CheckNoInternalOverlap(const Tensor& written, const char* op) {
  for (int64_t d = 0; d < written.dim(); ++d) {
    TANDEM_CHECK(written.strides()[d] != 0 || written.shape()[d] < 2, op,
                 ": unsupported operation: more than one element of the written-to tensor "
                 "refers to a single memory location (dimension ",
                 d, " of shape ", ShapeToString(written.shape()),
                 " has stride 0, an expanded tensor); clone() it before writing to it, as "
                 "PyTorch requires");
  }
}

MemOverlap CheckNoPartialOverlap(const Tensor& written, const Tensor& read, const char* op) {
  const MemOverlap overlap = OverlapOf(written, read);
  TANDEM_CHECK(overlap != MemOverlap::kPartial, op,
               ": unsupported operation: some elements of the input tensor and the written-to "
               "tensor refer to a single memory location (they are overlapping views of one "
               "storage, at element offsets ",
               read.storage_offset(), " and ", written.storage_offset(),
               "); clone() the input first, as PyTorch requires");
  return overlap;
}

}  // namespace tandem
