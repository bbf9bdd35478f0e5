// im2col and col2im for convolution (LaunchIm2Col, LaunchCol2Im of kernels.h).
#include <cuda_runtime.h>

#include <cstdint>

#include "tensor/base/error.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/internal/launch_utils.cuh"
#include "tensor/cuda/kernels.h"

namespace tandem {
namespace cuda {
namespace {

// ---- Convolution and pooling --------------------------------------------------------------

// One thread per (image plane, output position), looping over the kernel window: the
// index arithmetic is paid once per window, and for each (ky, kx) neighbouring threads write
// neighbouring column elements.
template <typename T>
__global__ void Im2ColKernel(Conv2dGeometry g, int64_t out_h, int64_t out_w, const T* image,
                             T* columns) {
  const int64_t out_plane = out_h * out_w;
  const int64_t total = g.batch * g.channels * out_plane;
  for (int64_t i = GlobalThread(); i < total; i += GridThreads()) {
    const int64_t plane = i / out_plane;  // b * channels + c
    const int64_t oy = (i % out_plane) / out_w, ox = i % out_w;
    const T* in = image + plane * g.height * g.width;
    T* out = columns + g.columns_start(plane / g.channels, plane % g.channels, out_plane) +
             oy * out_w + ox;
    const int64_t tap_stride = g.columns_tap_stride(out_plane);
    for (int64_t ky = 0; ky < g.kernel_h; ++ky) {
      const int64_t y = oy * g.stride_h - g.pad_h + ky * g.dilation_h;
      for (int64_t kx = 0; kx < g.kernel_w; ++kx) {
        const int64_t x = ox * g.stride_w - g.pad_w + kx * g.dilation_w;
        const bool inside = y >= 0 && y < g.height && x >= 0 && x < g.width;
        out[(ky * g.kernel_w + kx) * tap_stride] = inside ? in[y * g.width + x] : T(0);
      }
    }
  }
}

// One thread per image element, gathering the column entries that came from it, in the
// order the CPU adds them (ky, then kx): no atomics, and the result is bitwise the CPU's.
template <typename T>
__global__ void Col2ImKernel(Conv2dGeometry g, int64_t out_h, int64_t out_w, const T* columns,
                             T* image) {
  const int64_t plane_size = g.height * g.width;
  const int64_t out_plane = out_h * out_w;
  const int64_t total = g.batch * g.channels * plane_size;
  for (int64_t i = GlobalThread(); i < total; i += GridThreads()) {
    const int64_t plane = i / plane_size;
    const int64_t y = (i % plane_size) / g.width, x = i % g.width;
    const T* in = columns + g.columns_start(plane / g.channels, plane % g.channels, out_plane);
    const int64_t tap_stride = g.columns_tap_stride(out_plane);
    OpMath<T> sum = 0;  // 16-bit: summed in float, rounded once
    for (int64_t ky = 0; ky < g.kernel_h; ++ky) {
      const int64_t oy_scaled = y + g.pad_h - ky * g.dilation_h;  // oy * stride_h when paired
      if (oy_scaled < 0 || oy_scaled % g.stride_h != 0 || oy_scaled / g.stride_h >= out_h) {
        continue;
      }
      const int64_t oy = oy_scaled / g.stride_h;
      for (int64_t kx = 0; kx < g.kernel_w; ++kx) {
        const int64_t ox_scaled = x + g.pad_w - kx * g.dilation_w;
        if (ox_scaled < 0 || ox_scaled % g.stride_w != 0 || ox_scaled / g.stride_w >= out_w) {
          continue;
        }
        const int64_t ox = ox_scaled / g.stride_w;
        sum += static_cast<OpMath<T>>(in[(ky * g.kernel_w + kx) * tap_stride + oy * out_w + ox]);
      }
    }
    image[i] = static_cast<T>(sum);
  }
}

}  // namespace

void LaunchIm2Col(const LaunchContext& context, DType dtype, const Conv2dGeometry& g,
                  const void* image, void* columns) {
  DispatchAllFloatingTypes(dtype, "CUDA Im2Col", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t total = g.batch * g.channels * g.out_h() * g.out_w();
    if (total == 0) return;
    Im2ColKernel<T><<<GridFor(context, total), kThreads, 0, context.stream>>>(
        g, g.out_h(), g.out_w(), static_cast<const T*>(image), static_cast<T*>(columns));
    TANDEM_CUDA_CHECK_LAUNCH(context.device);
  });
}

void LaunchCol2Im(const LaunchContext& context, DType dtype, const Conv2dGeometry& g,
                  const void* columns, void* image) {
  DispatchAllFloatingTypes(dtype, "CUDA Col2Im", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t total = g.batch * g.channels * g.height * g.width;
    if (total == 0) return;
    Col2ImKernel<T><<<GridFor(context, total), kThreads, 0, context.stream>>>(
        g, g.out_h(), g.out_w(), static_cast<const T*>(columns), static_cast<T*>(image));
    TANDEM_CUDA_CHECK_LAUNCH(context.device);
  });
}

}  // namespace cuda
}  // namespace tandem
