// The per-element math of average pooling (avg_pool2d and adaptive_avg_pool2d, forward and
// backward), shared by the CPU and CUDA backends so that both compute exactly the same
// function, in the same order (the CPU is the oracle for the GPU). Each function computes one
// output element (forward) or one input element's gradient (backward, a gather: no atomics),
// reading and writing element type T (float, double, BFloat16 or Half) and summing in
// OpMath<T> (float for the 16-bit types), rounded once when returned.
//
//   float y = tandem::AvgPoolOutput(g, /*count_include_pad=*/true, plane_ptr, oy, ox);
#ifndef TANDEM_TENSOR_KERNELS_INTERNAL_POOLING_MATH_H_
#define TANDEM_TENSOR_KERNELS_INTERNAL_POOLING_MATH_H_

#include <cstdint>

#include "tensor/base/half.h"
#include "tensor/base/philox.h"  // TANDEM_HOST_DEVICE
#include "tensor/kernels/conv_geometry.h"
#include "tensor/runtime/backend.h"

namespace tandem {

// avg_pool2d's window of output `o` along one axis: [*begin, *end) inside the input, and
// the window's size clipped to the padded input (PyTorch's divisor with count_include_pad).
TANDEM_HOST_DEVICE void AvgPoolWindow(int64_t o, int64_t stride, int64_t pad, int64_t kernel,
                                      int64_t in, int64_t* begin, int64_t* end, int64_t* padded) {
  const int64_t start = o * stride - pad;
  const int64_t stop = start + kernel < in + pad ? start + kernel : in + pad;
  *padded = stop - start;
  *begin = start > 0 ? start : 0;
  *end = stop < in ? stop : in;
}

template <typename T>
TANDEM_HOST_DEVICE T AvgPoolDivisor(const Conv2dGeometry& g, bool count_include_pad, int64_t oy,
                                    int64_t ox) {
  int64_t y0, y1, py, x0, x1, px;
  AvgPoolWindow(oy, g.stride_h, g.pad_h, g.kernel_h, g.height, &y0, &y1, &py);
  AvgPoolWindow(ox, g.stride_w, g.pad_w, g.kernel_w, g.width, &x0, &x1, &px);
  return static_cast<T>(count_include_pad ? py * px : (y1 - y0) * (x1 - x0));
}

// Output (oy, ox) of one height x width plane.
template <typename T>
TANDEM_HOST_DEVICE T AvgPoolOutput(const Conv2dGeometry& g, bool count_include_pad, const T* plane,
                                   int64_t oy, int64_t ox) {
  int64_t y0, y1, py, x0, x1, px;
  AvgPoolWindow(oy, g.stride_h, g.pad_h, g.kernel_h, g.height, &y0, &y1, &py);
  AvgPoolWindow(ox, g.stride_w, g.pad_w, g.kernel_w, g.width, &x0, &x1, &px);
  using M = OpMath<T>;
  M sum = M(0);
  for (int64_t y = y0; y < y1; ++y) {
    for (int64_t x = x0; x < x1; ++x) sum += static_cast<M>(plane[y * g.width + x]);
  }
  const int64_t divisor = count_include_pad ? py * px : (y1 - y0) * (x1 - x0);
  return static_cast<T>(sum / static_cast<M>(divisor));
}

// The gradient of input pixel (y, x) from one out_h x out_w plane of output gradients: the
// outputs whose window [o * stride - pad, o * stride - pad + kernel) holds it.
template <typename T>
TANDEM_HOST_DEVICE T AvgPoolInputGrad(const Conv2dGeometry& g, bool count_include_pad,
                                      int64_t out_h, int64_t out_w, const T* grad_plane, int64_t y,
                                      int64_t x) {
  const int64_t oy_begin =
      y + g.pad_h < g.kernel_h ? 0 : (y + g.pad_h - g.kernel_h) / g.stride_h + 1;
  const int64_t oy_stop = (y + g.pad_h) / g.stride_h + 1;
  const int64_t oy_end = oy_stop < out_h ? oy_stop : out_h;
  const int64_t ox_begin =
      x + g.pad_w < g.kernel_w ? 0 : (x + g.pad_w - g.kernel_w) / g.stride_w + 1;
  const int64_t ox_stop = (x + g.pad_w) / g.stride_w + 1;
  const int64_t ox_end = ox_stop < out_w ? ox_stop : out_w;
  using M = OpMath<T>;
  M sum = M(0);
  for (int64_t oy = oy_begin; oy < oy_end; ++oy) {
    for (int64_t ox = ox_begin; ox < ox_end; ++ox) {
      sum += static_cast<M>(grad_plane[oy * out_w + ox]) /
             AvgPoolDivisor<M>(g, count_include_pad, oy, ox);
    }
  }
  return static_cast<T>(sum);
}

// adaptive_avg_pool2d's window of output `o` along one axis: [floor(o * in / out),
// ceil((o + 1) * in / out)).
TANDEM_HOST_DEVICE int64_t AdaptiveStart(int64_t o, int64_t in, int64_t out) {
  return o * in / out;
}
TANDEM_HOST_DEVICE int64_t AdaptiveEnd(int64_t o, int64_t in, int64_t out) {
  return ((o + 1) * in + out - 1) / out;
}

template <typename T>
TANDEM_HOST_DEVICE T AdaptiveAvgPoolOutput(int64_t height, int64_t width, int64_t out_h,
                                           int64_t out_w, const T* plane, int64_t oy, int64_t ox) {
  const int64_t y0 = AdaptiveStart(oy, height, out_h), y1 = AdaptiveEnd(oy, height, out_h);
  const int64_t x0 = AdaptiveStart(ox, width, out_w), x1 = AdaptiveEnd(ox, width, out_w);
  using M = OpMath<T>;
  M sum = M(0);
  for (int64_t y = y0; y < y1; ++y) {
    for (int64_t x = x0; x < x1; ++x) sum += static_cast<M>(plane[y * width + x]);
  }
  return static_cast<T>(sum / static_cast<M>((y1 - y0) * (x1 - x0)));
}

template <typename T>
TANDEM_HOST_DEVICE T AdaptiveAvgPoolInputGrad(int64_t height, int64_t width, int64_t out_h,
                                              int64_t out_w, const T* grad_plane, int64_t y,
                                              int64_t x) {
  using M = OpMath<T>;
  M sum = M(0);
  // Window starts never decrease with o, so the scan stops at the first that lies past y.
  for (int64_t oy = 0; oy < out_h && AdaptiveStart(oy, height, out_h) <= y; ++oy) {
    if (AdaptiveEnd(oy, height, out_h) <= y) continue;
    const M rows =
        static_cast<M>(AdaptiveEnd(oy, height, out_h) - AdaptiveStart(oy, height, out_h));
    for (int64_t ox = 0; ox < out_w && AdaptiveStart(ox, width, out_w) <= x; ++ox) {
      if (AdaptiveEnd(ox, width, out_w) <= x) continue;
      const M cols =
          static_cast<M>(AdaptiveEnd(ox, width, out_w) - AdaptiveStart(ox, width, out_w));
      sum += static_cast<M>(grad_plane[oy * out_w + ox]) / (rows * cols);
    }
  }
  return static_cast<T>(sum);
}

}  // namespace tandem

#endif  // TANDEM_TENSOR_KERNELS_INTERNAL_POOLING_MATH_H_
