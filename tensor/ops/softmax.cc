// softmax and log_softmax along one dimension.
#include <cstdint>
#include <vector>

#include "tensor/core/autograd.h"
#include "tensor/core/internal/tensor_impl.h"
#include "tensor/core/tensor.h"
#include "tensor/kernels/softmax_kernels.h"
#include "tensor/ops/autocast.h"
#include "tensor/ops/internal/op_helpers.h"
#include "tensor/ops/ops.h"
#include "tensor/runtime/backend.h"

namespace tandem {

namespace {

Tensor SoftmaxImpl(const Tensor& a, int64_t dim, bool log) {
  const char* name = log ? "log_softmax" : "softmax";
  CheckDefined(a, name, "input");
  CheckFloat(a, name, "input");
  const int64_t d = Dim(dim, a.dim(), name);
  const Shape shape = a.dim() == 0 ? Shape{1} : a.shape();
  Tensor x = ContiguousRaw(a);
  Tensor out = NewTensor(a.shape(), a.dtype(), a.device());
  if (out.numel() > 0) {
    const auto split = static_cast<size_t>(d);
    RunSoftmax(a.device(), x.dtype(), log, DataPtr(out), DataPtr(x), Product(shape, 0, split),
               shape[split], Product(shape, split + 1, shape.size()));
  }
  if (NeedsGrad({a})) {
    Record(
        log ? "LogSoftmaxBackward" : "SoftmaxBackward", {a}, out,
        [log, d, saved = out.detach()](const Tensor& grad) {
          const std::vector<int64_t> dims = {d};
          const Tensor y = SavedOutput(saved);
          if (log) {
            // d log_softmax: g - softmax * sum(g).
            return std::vector<Tensor>{sub(grad, mul(exp(y), sum(grad, dims, true)))};
          }
          // d softmax: y * (g - sum(g * y)).
          return std::vector<Tensor>{mul(y, sub(grad, sum(mul(grad, y), dims, true)))};
        },
        DoubleBackward::kSupported);
  }
  return out;
}

}  // namespace

Tensor softmax(const Tensor& a, int64_t dim) {
  TANDEM_AUTOCAST(kFloat32, softmax, a, dim);
  return SoftmaxImpl(a, dim, false);
}
Tensor log_softmax(const Tensor& a, int64_t dim) {
  TANDEM_AUTOCAST(kFloat32, log_softmax, a, dim);
  return SoftmaxImpl(a, dim, true);
}

}  // namespace tandem
