#include "tensor/kernels/triangle_kernels.h"

#include "tensor/base/error.h"

namespace tandem {

TANDEM_DEFINE_KERNEL(TriangleKernel);

void RunTriangle(Device device, DType dtype, bool lower, int64_t diagonal, int64_t batch,
                 int64_t rows, int64_t cols, const void* src, void* dst) {
  TANDEM_CHECK(batch >= 0 && rows >= 0 && cols >= 0, "Triangle on ", device,
               " expects non-negative [batch, rows, cols] but got [", batch, ", ", rows, ", ", cols,
               "]");
  TriangleKernel(device, dtype, lower, diagonal, batch, rows, cols, src, dst);
}

}  // namespace tandem
