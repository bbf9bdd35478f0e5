// dropout: zeroes elements with probability p in training and rescales the rest.
#include <cstdint>
#include <vector>

#include "tensor/base/error.h"
#include "tensor/core/autograd.h"
#include "tensor/core/internal/tensor_impl.h"
#include "tensor/core/tensor.h"
#include "tensor/ops/internal/op_helpers.h"
#include "tensor/ops/ops.h"
#include "tensor/runtime/backend.h"

namespace tandem {

Tensor dropout(const Tensor& input, double p, bool training, Generator* gen) {
  CheckDefined(input, "dropout", "input");
  CheckFloat(input, "dropout", "input");
  TANDEM_CHECK(p >= 0.0 && p <= 1.0, "dropout: p (the probability of zeroing an element) must ",
               "be in [0, 1] but is ", p);
  if (!training || p == 0.0) return input;
  // p = 1 zeroes everything (NaN * 0 stays NaN, and the gradient is 0), as PyTorch does.
  if (p == 1.0) return mul(input, FilledRaw({}, input.dtype(), input.device(), 0.0));
  // The input's device draws from its own default generator (see "Random numbers" in
  // tensor/tensor.h), so replicas on different devices never race for one stream.
  Generator& generator = gen != nullptr ? *gen : default_generator(input.device());
  const int64_t n = input.numel();
  const GeneratorState claimed = generator.Claim(static_cast<uint64_t>(n));
  const uint64_t seed = claimed.seed;
  const uint64_t offset = claimed.offset;
  // 16-bit inputs draw and scale their mask in float32, as PyTorch's fused dropout computes
  // in float: the same seed keeps the same elements whatever the dtype (a uniform rounded to
  // bfloat16 would move elements across p), and the kept values are rounded once.
  const DType mask_dtype = IsReducedFloatingPoint(input.dtype()) ? kFloat32 : input.dtype();
  Tensor mask = NewTensor(input.shape(), mask_dtype, input.device());
  if (n > 0) {
    Backend& backend = BackendOf(input);
    const int index = IndexOf(input);
    backend.RandomUniform(index, mask.dtype(), DataPtr(mask), n, seed, offset, 0.0f, 1.0f);
    // Keep where u >= p (probability 1 - p), scaled so that the expectation is unchanged.
    backend.Unary(index, UnaryOp::kGeScalar, ToKernel(mask), ToKernel(mask), p);
    backend.Unary(index, UnaryOp::kMulScalar, ToKernel(mask), ToKernel(mask), 1.0 / (1.0 - p));
  }
  Tensor out = CastRaw(BinaryRaw(BinaryOp::kMul, CastRaw(input, mask_dtype), mask, "dropout"),
                       input.dtype());
  if (NeedsGrad({input})) {
    Record(
        "DropoutBackward", {input}, out,
        [mask](const Tensor& grad) {
          return std::vector<Tensor>{mul(grad, mask).to(grad.dtype())};
        },
        DoubleBackward::kSupported);
  }
  return out;
}

}  // namespace tandem
