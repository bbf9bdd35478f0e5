#include "tensor/kernels/softmax_kernels.h"

#include "tensor/base/error.h"

namespace tandem {

TANDEM_DEFINE_KERNEL(SoftmaxKernel);
TANDEM_DEFINE_KERNEL(CrossEntropyForwardKernel);
TANDEM_DEFINE_KERNEL(CrossEntropyBackwardKernel);

void RunSoftmax(Device device, DType dtype, bool log, void* dst, const void* src, int64_t outer,
                int64_t dim, int64_t inner) {
  TANDEM_CHECK(outer >= 0 && dim >= 0 && inner >= 0, "Softmax on ", device,
               " expects non-negative [outer, dim, inner] but got [", outer, ", ", dim, ", ", inner,
               "]");
  SoftmaxKernel(device, dtype, log, dst, src, outer, dim, inner);
}

}  // namespace tandem
