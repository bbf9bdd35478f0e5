#include "tensor/kernels/conv_geometry.h"

#include "tensor/base/error.h"

namespace tandem {

void CheckConv2dGeometry(Device device, const Conv2dGeometry& g, const char* kernel) {
  TANDEM_CHECK(g.batch >= 0 && g.channels >= 0 && g.height >= 0 && g.width >= 0, kernel, " on ",
               device, " expects non-negative image sizes but got batch=", g.batch,
               " channels=", g.channels, " height=", g.height, " width=", g.width);
  TANDEM_CHECK(g.kernel_h > 0 && g.kernel_w > 0 && g.stride_h > 0 && g.stride_w > 0 &&
                   g.pad_h >= 0 && g.pad_w >= 0 && g.dilation_h > 0 && g.dilation_w > 0,
               kernel, " on ", device,
               " expects a positive kernel, stride and dilation and non-negative padding but got "
               "kernel ",
               g.kernel_h, "x", g.kernel_w, ", stride ", g.stride_h, "x", g.stride_w, ", padding ",
               g.pad_h, "x", g.pad_w, ", dilation ", g.dilation_h, "x", g.dilation_w);
  TANDEM_CHECK(g.height + 2 * g.pad_h >= g.span_h() && g.width + 2 * g.pad_w >= g.span_w(), kernel,
               " on ", device, ": the ", g.span_h(), "x", g.span_w(),
               " window (with dilation) is larger than the padded ", g.height + 2 * g.pad_h, "x",
               g.width + 2 * g.pad_w, " image; use a smaller kernel or more padding");
}

}  // namespace tandem
