// Tensor's methods that are ops: expand (its backward is a reduction) and the op shorthands
// (relu, exp, sum, matmul, ...) declared in tensor/core/tensor.h.
#include <cstdint>
#include <vector>

#include "tensor/base/error.h"
#include "tensor/core/autograd.h"
#include "tensor/core/internal/tensor_impl.h"
#include "tensor/core/tensor.h"
#include "tensor/ops/internal/op_helpers.h"
#include "tensor/ops/ops.h"

namespace tandem {

// Defined here rather than with the other views in tensor/core/tensor_views.cc: its backward
// is a reduction (sum_to), an op.
Tensor Tensor::expand(const Shape& target) const {
  TANDEM_CHECK(static_cast<int64_t>(target.size()) >= dim(), "expand: cannot expand shape ",
               ShapeToString(shape()), " to fewer dimensions ", ShapeToString(target));
  const int64_t lead = static_cast<int64_t>(target.size()) - dim();
  std::vector<int64_t> st(target.size(), 0);
  Shape s = target;
  for (int64_t d = 0; d < static_cast<int64_t>(target.size()); ++d) {
    if (d < lead) continue;
    const int64_t size = shape()[d - lead];
    if (target[d] == -1) s[d] = size;
    TANDEM_CHECK(s[d] == size || size == 1, "expand: the size ", size, " of dimension ", d - lead,
                 " of ", ShapeToString(shape()), " must be 1 or match ", s[d], " in ",
                 ShapeToString(target));
    st[d] = s[d] == size ? strides()[d - lead] : 0;
  }
  Tensor out = MakeView(*this, s, st, storage_offset());
  const Shape original = shape();
  if (NeedsGrad({*this})) {
    Record(
        "ExpandBackward", {*this}, out,
        [original](const Tensor& g) { return std::vector<Tensor>{sum_to(g, original)}; },
        DoubleBackward::kSupported);
  }
  return out;
}

Tensor Tensor::relu() const { return tandem::relu(*this); }
Tensor Tensor::exp() const { return tandem::exp(*this); }
Tensor Tensor::log() const { return tandem::log(*this); }
Tensor Tensor::sum() const { return tandem::sum(*this); }
Tensor Tensor::sum(const std::vector<int64_t>& dims, bool keepdim) const {
  return tandem::sum(*this, dims, keepdim);
}
Tensor Tensor::mean() const { return tandem::mean(*this); }
Tensor Tensor::mean(const std::vector<int64_t>& dims, bool keepdim) const {
  return tandem::mean(*this, dims, keepdim);
}
Tensor Tensor::argmax(int64_t dim, bool keepdim) const {
  return tandem::argmax(*this, dim, keepdim);
}
Tensor Tensor::matmul(const Tensor& other) const { return tandem::matmul(*this, other); }

}  // namespace tandem
