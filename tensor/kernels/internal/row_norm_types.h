// The element types of the row-norm kernels (tensor/kernels/norm_kernels.h), dispatched once for
// the CPU and CUDA backends: the norm's dtype T and its i/o dtype L (Note [Autocast residual
// norm]), which is T but for float32 with bfloat16 or float16.
//
//   DispatchRowNormTypes(dtype, io_dtype, "CPU RowNorm", [&](auto t, auto l) {
//     RowNormTyped<typename decltype(t)::type, typename decltype(l)::type>(...);
//   });
#ifndef TANDEM_TENSOR_KERNELS_INTERNAL_ROW_NORM_TYPES_H_
#define TANDEM_TENSOR_KERNELS_INTERNAL_ROW_NORM_TYPES_H_

#include "tensor/base/dtype.h"
#include "tensor/base/error.h"
#include "tensor/base/half.h"

namespace tandem {

// Calls f(DTypeTag<T>{}, DTypeTag<L>{}); a pair the kernels do not take throws (RunRowNorm has
// checked it with RowNormTakesIoDType before a backend is reached).
template <typename F>
void DispatchRowNormTypes(DType dtype, DType io_dtype, const char* kernel, F&& f) {
  if (io_dtype == dtype) {
    DispatchAllFloatingTypes(dtype, kernel, [&](auto tag) { f(tag, tag); });
  } else if (dtype == DType::kFloat32 && io_dtype == DType::kBFloat16) {
    f(DTypeTag<float>{}, DTypeTag<BFloat16>{});
  } else if (dtype == DType::kFloat32 && io_dtype == DType::kFloat16) {
    f(DTypeTag<float>{}, DTypeTag<Half>{});
  } else {
    TANDEM_FAIL(kernel, " takes i/o in its own dtype, or bfloat16 or float16 for float32, but got ",
                DTypeName(io_dtype), " for ", DTypeName(dtype),
                " (Note [Autocast residual norm]); cast the residual to ", DTypeName(dtype));
  }
}

}  // namespace tandem

#endif  // TANDEM_TENSOR_KERNELS_INTERNAL_ROW_NORM_TYPES_H_
