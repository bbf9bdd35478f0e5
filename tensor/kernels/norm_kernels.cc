#include "tensor/kernels/norm_kernels.h"

#include "tensor/base/error.h"

namespace tandem {

TANDEM_DEFINE_KERNEL(RowNormKernel);
TANDEM_DEFINE_KERNEL(RowNormBackwardKernel);

namespace {

void CheckRowNorm(const char* kernel, Device device, DType dtype, DType io_dtype, int64_t rows,
                  int64_t cols) {
  TANDEM_CHECK(IsFloatingPoint(dtype), kernel, " on ", device,
               " expects a floating dtype (float32, float64, bfloat16 or float16) but got ", dtype,
               "; convert the input with .to(kFloat32)");
  TANDEM_CHECK(RowNormTakesIoDType(dtype, io_dtype), kernel, " on ", device,
               " expects an io_dtype equal to the dtype (", dtype,
               ") or, for float32, bfloat16 or float16 (Note [Autocast residual norm]) but got ",
               io_dtype, "; cast the residual to ", dtype);
  TANDEM_CHECK(rows >= 0 && cols > 0, kernel, " on ", device,
               " expects rows >= 0 and cols > 0 but got [", rows, ", ", cols,
               "]; a norm needs at least one element per row");
}

}  // namespace

bool RowNormTakesIoDType(DType dtype, DType io_dtype) {
  return io_dtype == dtype ||
         (dtype == kFloat32 && (io_dtype == kBFloat16 || io_dtype == kFloat16));
}

void RunRowNorm(Device device, DType dtype, DType io_dtype, bool rms, int64_t rows, int64_t cols,
                double eps, const void* x, const void* residual, const void* weight,
                const void* bias, void* y, void* sum, void* mean, void* rstd) {
  CheckRowNorm("RowNorm", device, dtype, io_dtype, rows, cols);
  TANDEM_CHECK((residual == nullptr) == (sum == nullptr), "RowNorm on ", device,
               " expects a residual and a sum output together (Note [Fused residual norm]) but "
               "got ",
               residual == nullptr ? "only a sum" : "only a residual");
  RowNormKernel(device, dtype, io_dtype, rms, rows, cols, eps, x, residual, weight, bias, y, sum,
                mean, rstd);
}

void RunRowNormBackward(Device device, DType dtype, DType io_dtype, bool rms, int64_t rows,
                        int64_t cols, const void* grad_y, const void* grad_sum, const void* x,
                        const void* mean, const void* rstd, const void* weight, void* grad_x,
                        void* grad_residual, void* grad_weight, void* grad_bias) {
  CheckRowNorm("RowNormBackward", device, dtype, io_dtype, rows, cols);
  TANDEM_CHECK(grad_sum == nullptr || grad_x != nullptr, "RowNormBackward on ", device,
               " got grad_sum without grad_x to add it into; pass grad_x");
  TANDEM_CHECK(grad_residual == nullptr || grad_x != nullptr, "RowNormBackward on ", device,
               " got grad_residual without grad_x, which it is the rounding of; pass grad_x");
  RowNormBackwardKernel(device, dtype, io_dtype, rms, rows, cols, grad_y, grad_sum, x, mean, rstd,
                        weight, grad_x, grad_residual, grad_weight, grad_bias);
}

}  // namespace tandem
