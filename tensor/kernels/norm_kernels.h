// The fused row-norm kernels of layer_norm and rms_norm (KernelStub,
// tensor/runtime/kernel_stub.h), over a contiguous [rows, cols] floating input (float32, float64,
// bfloat16, float16). Each backend registers its kernels beside its code
// (tensor/cpu/row_norm_kernels.cc, tensor/cuda/norm_kernels.cc); tensor/ops/norm.cc calls
// RunRowNorm and RunRowNormBackward, which check the arguments once and dispatch on the device's
// type.
//
//   RunRowNorm(x.device(), x.dtype(), /*io_dtype=*/x.dtype(), /*rms=*/false, rows, cols, 1e-5,
//              x_ptr, /*residual=*/nullptr, weight_ptr, bias_ptr, y_ptr, /*sum=*/nullptr,
//              mean_ptr, rstd_ptr);
//
// Note [Fused row norms]: layer_norm and rms_norm normalise each row of a contiguous
// [rows, cols] input in one pass over it, instead of the mean, subtraction, square, mean,
// add, sqrt, division, product and sum that the formula composes (each a full pass and an
// autograd node). Statistics are computed in OpMath (float for the 16-bit floats, double for
// float64) by two passes over the row (mean, then the centred variance), and saved as
// `mean` and `rstd` (contiguous [rows], OpMath's dtype: float32, or float64 for float64
// inputs) for the backward. LayerNorm: y = (x - mean) * rstd * weight + bias with
// rstd = 1 / sqrt(biased variance + eps); rms (RMSNorm): mean is not subtracted (nor saved:
// `mean` may be null) and rstd = 1 / sqrt(mean(x^2) + eps). `weight` and `bias` ([cols],
// the input's dtype) may each be null (no scale, no shift; RMSNorm has no bias).
//
// Note [Fused residual norm]: with `residual` (contiguous [rows, cols], the input's dtype) the
// kernel first adds it to x, writes the sum (rounded to the dtype) to `sum` and normalises that
// sum, as llm.c's fused_residual_forward: a transformer's residual add and the next block's
// norm in one pass instead of two launches. Its backward takes `grad_sum`, the gradient that
// reached the sum directly (the residual stream), and adds it into grad_x, which is then the
// gradient of both x and residual: the add of the two gradients that autograd would launch.
//
// Note [Autocast residual norm]: `dtype` is that of x, the sum, the parameters and grad_x;
// `io_dtype` that of the tensors a norm exchanges with the lower-precision GEMMs around it under
// autocast: the residual, y, grad_y and grad_residual. It is `dtype` but for one pair: float32
// with bfloat16 or float16 i/o, where a float32 residual stream meets a 16-bit branch. The 16-bit
// values are widened as they are read (exactly) and y is rounded once as it is written, so the
// result has the bits of casting the residual to float32, normalising in float32 and casting y:
// the casts' four passes (two each way) and launches are gone. The backward's `grad_residual`
// (io_dtype, may be null) is grad_x rounded for a 16-bit residual, written beside grad_x.
#ifndef TANDEM_TENSOR_KERNELS_NORM_KERNELS_H_
#define TANDEM_TENSOR_KERNELS_NORM_KERNELS_H_

#include <cstdint>

#include "tensor/base/device.h"
#include "tensor/base/dtype.h"
#include "tensor/runtime/kernel_stub.h"

namespace tandem {

TANDEM_DECLARE_KERNEL(RowNormKernel,
                      void(int index, DType dtype, DType io_dtype, bool rms, int64_t rows,
                           int64_t cols, double eps, const void* x, const void* residual,
                           const void* weight, const void* bias, void* y, void* sum, void* mean,
                           void* rstd));
// The backward of RowNorm from the saved statistics, with xhat = (x - mean) * rstd and
// g = grad_y * weight: grad_x = rstd * (g - mean(g) - xhat * mean(g * xhat)) (rms: without
// the mean(g) term), plus grad_sum where it is not null (Note [Fused residual norm]);
// grad_weight = sum over rows of grad_y * xhat; grad_bias = sum over rows of grad_y. Each
// output may be null (not needed); the row sums accumulate in OpMath. grad_residual: Note
// [Autocast residual norm].
TANDEM_DECLARE_KERNEL(RowNormBackwardKernel,
                      void(int index, DType dtype, DType io_dtype, bool rms, int64_t rows,
                           int64_t cols, const void* grad_y, const void* grad_sum, const void* x,
                           const void* mean, const void* rstd, const void* weight, void* grad_x,
                           void* grad_residual, void* grad_weight, void* grad_bias));

// Check the arguments (a floating dtype, an io_dtype that pairs with it, rows >= 0 and
// cols > 0), throwing tandem::Error naming the kernel and the device, then call the kernel of
// `device`'s type.
void RunRowNorm(Device device, DType dtype, DType io_dtype, bool rms, int64_t rows, int64_t cols,
                double eps, const void* x, const void* residual, const void* weight,
                const void* bias, void* y, void* sum, void* mean, void* rstd);
void RunRowNormBackward(Device device, DType dtype, DType io_dtype, bool rms, int64_t rows,
                        int64_t cols, const void* grad_y, const void* grad_sum, const void* x,
                        const void* mean, const void* rstd, const void* weight, void* grad_x,
                        void* grad_residual, void* grad_weight, void* grad_bias);

// Whether RowNorm takes `io_dtype` beside `dtype` (Note [Autocast residual norm]).
bool RowNormTakesIoDType(DType dtype, DType io_dtype);

}  // namespace tandem

#endif  // TANDEM_TENSOR_KERNELS_NORM_KERNELS_H_
