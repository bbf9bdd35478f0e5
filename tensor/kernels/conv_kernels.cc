#include "tensor/kernels/conv_kernels.h"

namespace tandem {

TANDEM_DEFINE_KERNEL(Im2ColKernel);
TANDEM_DEFINE_KERNEL(Col2ImKernel);
TANDEM_DEFINE_KERNEL(Conv2dForwardKernel);
TANDEM_DEFINE_KERNEL(Conv2dBackwardDataKernel);
TANDEM_DEFINE_KERNEL(Conv2dBackwardWeightsKernel);

void RunIm2Col(Device device, DType dtype, const Conv2dGeometry& g, const void* image,
               void* columns) {
  CheckConv2dGeometry(device, g, "Im2Col");
  Im2ColKernel(device, dtype, g, image, columns);
}

void RunCol2Im(Device device, DType dtype, const Conv2dGeometry& g, const void* columns,
               void* image) {
  CheckConv2dGeometry(device, g, "Col2Im");
  Col2ImKernel(device, dtype, g, columns, image);
}

}  // namespace tandem
