#include "tensor/kernels/index_kernels.h"

namespace tandem {

TANDEM_DEFINE_KERNEL(GatherColumnsKernel);
TANDEM_DEFINE_KERNEL(ScatterAddColumnsKernel);
TANDEM_DEFINE_KERNEL(GatherKernel);
TANDEM_DEFINE_KERNEL(ScatterAddKernel);

}  // namespace tandem
