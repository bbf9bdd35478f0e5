#include "tensor/kernels/pooling_kernels.h"

#include "tensor/base/error.h"

namespace tandem {

TANDEM_DEFINE_KERNEL(MaxPool2dKernel);
TANDEM_DEFINE_KERNEL(MaxPool2dBackwardKernel);
TANDEM_DEFINE_KERNEL(AvgPool2dKernel);
TANDEM_DEFINE_KERNEL(AvgPool2dBackwardKernel);
TANDEM_DEFINE_KERNEL(AdaptiveAvgPool2dKernel);
TANDEM_DEFINE_KERNEL(AdaptiveAvgPool2dBackwardKernel);

void RunMaxPool2d(Device device, DType dtype, const Conv2dGeometry& g, const void* input,
                  void* output, int64_t* argmax) {
  CheckConv2dGeometry(device, g, "MaxPool2d");
  TANDEM_CHECK(g.pad_h * 2 <= g.kernel_h && g.pad_w * 2 <= g.kernel_w, "MaxPool2d on ", device,
               ": padding ", g.pad_h, "x", g.pad_w, " must be at most half the kernel ", g.kernel_h,
               "x", g.kernel_w, " (as in PyTorch), so that every window covers part of the image");
  const bool has_output = g.batch * g.channels * g.out_h() * g.out_w() > 0;
  TANDEM_CHECK(!has_output || g.height * g.width > 0, "MaxPool2d on ", device, ": cannot pool ",
               g.height, "x", g.width,
               " images: every window would lie in the padding; give images at least one pixel");
  MaxPool2dKernel(device, dtype, g, input, output, argmax);
}

void RunMaxPool2dBackward(Device device, DType dtype, const Conv2dGeometry& g,
                          const void* grad_output, const int64_t* argmax, void* grad_input) {
  CheckConv2dGeometry(device, g, "MaxPool2dBackward");
  MaxPool2dBackwardKernel(device, dtype, g, grad_output, argmax, grad_input);
}

void RunAvgPool2d(Device device, DType dtype, const Conv2dGeometry& g, bool count_include_pad,
                  const void* input, void* output) {
  CheckConv2dGeometry(device, g, "AvgPool2d");
  AvgPool2dKernel(device, dtype, g, count_include_pad, input, output);
}

void RunAvgPool2dBackward(Device device, DType dtype, const Conv2dGeometry& g,
                          bool count_include_pad, const void* grad_output, void* grad_input) {
  CheckConv2dGeometry(device, g, "AvgPool2dBackward");
  AvgPool2dBackwardKernel(device, dtype, g, count_include_pad, grad_output, grad_input);
}

}  // namespace tandem
