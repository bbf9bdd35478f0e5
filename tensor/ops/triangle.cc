// tril and triu: the lower or upper triangle of the last two dimensions.
#include <cstdint>
#include <vector>

#include "tensor/base/error.h"
#include "tensor/core/autograd.h"
#include "tensor/core/internal/tensor_impl.h"
#include "tensor/core/tensor.h"
#include "tensor/kernels/triangle_kernels.h"
#include "tensor/ops/internal/op_helpers.h"
#include "tensor/ops/ops.h"
#include "tensor/runtime/backend.h"

namespace tandem {

namespace {

Tensor TriangleImpl(bool lower, const Tensor& input, int64_t diagonal, const char* op) {
  CheckDefined(input, op, "input");
  TANDEM_CHECK(input.dim() >= 2, op,
               ": expected a tensor with at least 2 dimensions (its last two "
               "are the matrix) but got ",
               ShapeToString(input.shape()), " (", input.dim(), "-D); unsqueeze a vector first");
  const Tensor x = ContiguousRaw(input);
  const Shape& shape = x.shape();
  const int64_t rows = shape[shape.size() - 2], cols = shape.back();
  Tensor out = NewTensor(shape, x.dtype(), x.device());
  if (out.numel() > 0) {
    RunTriangle(x.device(), x.dtype(), lower, diagonal, x.numel() / (rows * cols), rows, cols,
                DataPtr(x), DataPtr(out));
  }
  if (NeedsGrad({input})) {
    Record(
        lower ? "TrilBackward" : "TriuBackward", {input}, out,
        [lower, diagonal, op](const Tensor& grad) {
          return std::vector<Tensor>{TriangleImpl(lower, grad, diagonal, op)};
        },
        DoubleBackward::kSupported);
  }
  return out;
}

}  // namespace

Tensor tril(const Tensor& input, int64_t diagonal) {
  return TriangleImpl(true, input, diagonal, "tril");
}

Tensor triu(const Tensor& input, int64_t diagonal) {
  return TriangleImpl(false, input, diagonal, "triu");
}

}  // namespace tandem
