// Conv2dGeometry: the shape of a 2-D convolution or pooling window over NCHW images, shared by
// the convolution and pooling kernels (tensor/kernels/conv_kernels.h, pooling_kernels.h), their
// backends and the ops; CheckConv2dGeometry is the one check of it that those kernels' Run*
// functions make before dispatching.
//
//   Conv2dGeometry g = Conv2dGeometry::Make(batch, channels, 28, 28, 3, 3, 1, 1, 1, 1);
//   CheckConv2dGeometry(device, g, "Im2Col");  // throws tandem::Error if it makes no sense
//   const int64_t out_h = g.out_h(), out_w = g.out_w();
#ifndef TANDEM_TENSOR_KERNELS_CONV_GEOMETRY_H_
#define TANDEM_TENSOR_KERNELS_CONV_GEOMETRY_H_

#include <cstdint>

#include "tensor/base/device.h"

namespace tandem {

// Describes a 2-D convolution or pooling window over NCHW images. A window's taps are
// `dilation` apart (it spans dilation * (kernel - 1) + 1 pixels). With ceil_mode the output
// size rounds up, as PyTorch's pooling does, but the last window must start inside the input
// or its left padding.
struct Conv2dGeometry {
  int64_t batch = 0, channels = 0, height = 0, width = 0;
  int64_t kernel_h = 0, kernel_w = 0;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  int64_t dilation_h = 1, dilation_w = 1;
  bool ceil_mode = false;
  // Im2Col/Col2Im's column layout: false: [batch, channels*kh*kw, out_h*out_w] (one matrix
  // per image); true: [channels*kh*kw, batch, out_h*out_w] (one matrix with every image's
  // columns side by side, for a single large GEMM over the batch).
  bool batch_in_columns = false;
  constexpr int64_t span_h() const { return dilation_h * (kernel_h - 1) + 1; }
  constexpr int64_t span_w() const { return dilation_w * (kernel_w - 1) + 1; }
  int64_t out_h() const { return OutSize(height, span_h(), stride_h, pad_h, ceil_mode); }
  int64_t out_w() const { return OutSize(width, span_w(), stride_w, pad_w, ceil_mode); }

  // Im2Col's columns: where the row of image b, channel c, tap 0 starts, and the distance
  // between the rows of consecutive taps (ky * kernel_w + kx) of that image and channel.
  // constexpr so that CUDA kernels can call them too.
  constexpr int64_t columns_start(int64_t b, int64_t c, int64_t out_plane) const {
    const int64_t window = kernel_h * kernel_w;
    return (batch_in_columns ? c * window * batch + b : (b * channels + c) * window) * out_plane;
  }
  constexpr int64_t columns_tap_stride(int64_t out_plane) const {
    return batch_in_columns ? batch * out_plane : out_plane;
  }

  // PyTorch's pooling_output_shape (the padded input must hold one window).
  static int64_t OutSize(int64_t in, int64_t span, int64_t stride, int64_t pad, bool ceil) {
    const int64_t room = in + 2 * pad - span;
    int64_t out = (ceil ? room + stride - 1 : room) / stride + 1;
    if (ceil && (out - 1) * stride >= in + pad) --out;
    return out;
  }

  static Conv2dGeometry Make(int64_t batch, int64_t channels, int64_t height, int64_t width,
                             int64_t kernel_h, int64_t kernel_w, int64_t stride_h, int64_t stride_w,
                             int64_t pad_h, int64_t pad_w) {
    Conv2dGeometry g;
    g.batch = batch;
    g.channels = channels;
    g.height = height;
    g.width = width;
    g.kernel_h = kernel_h;
    g.kernel_w = kernel_w;
    g.stride_h = stride_h;
    g.stride_w = stride_w;
    g.pad_h = pad_h;
    g.pad_w = pad_w;
    return g;
  }
};

// Throws tandem::Error, naming `kernel` and `device`, unless the image sizes are non-negative,
// the kernel, stride and dilation positive, the padding non-negative and the padded image holds
// one window.
void CheckConv2dGeometry(Device device, const Conv2dGeometry& g, const char* kernel);

}  // namespace tandem

#endif  // TANDEM_TENSOR_KERNELS_CONV_GEOMETRY_H_
