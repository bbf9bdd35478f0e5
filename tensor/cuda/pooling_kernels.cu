// Max, average and adaptive average pooling, forward and backward (kernels.h). Average
// pooling runs 16-bit dtypes through float copies (Note [16-bit via float],
// internal/float_copies.cuh).
#include <cuda_runtime.h>

#include <cstdint>

#include "tensor/base/error.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/internal/float_copies.cuh"
#include "tensor/cuda/internal/launch_utils.cuh"
#include "tensor/cuda/kernels.h"
#include "tensor/kernels/internal/pooling_math.h"

namespace tandem {
namespace cuda {
namespace {

template <typename T>
__device__ __forceinline__ bool ReplacesMax(T candidate, T best) {
  if (isnan(candidate)) return !isnan(best);
  return candidate > best;
}

// One thread per output element; the window scan is the CPU's, element for element.
template <typename T>
__global__ void MaxPool2dKernel(Conv2dGeometry g, int64_t out_h, int64_t out_w, const T* input,
                                T* output, int64_t* argmax) {
  const int64_t out_plane = out_h * out_w;
  const int64_t total = g.batch * g.channels * out_plane;
  for (int64_t i = GlobalThread(); i < total; i += GridThreads()) {
    const int64_t plane = i / out_plane;
    const int64_t oy = (i % out_plane) / out_w, ox = i % out_w;
    const T* in = input + plane * g.height * g.width;
    const int64_t y0 = max(oy * g.stride_h - g.pad_h, int64_t{0});
    const int64_t y1 = min(oy * g.stride_h - g.pad_h + g.kernel_h, g.height);
    const int64_t x0 = max(ox * g.stride_w - g.pad_w, int64_t{0});
    const int64_t x1 = min(ox * g.stride_w - g.pad_w + g.kernel_w, g.width);
    int64_t best_at = y0 * g.width + x0;
    OpMath<T> best = static_cast<OpMath<T>>(in[best_at]);
    for (int64_t y = y0; y < y1; ++y) {
      for (int64_t x = x0; x < x1; ++x) {
        const int64_t at = y * g.width + x;
        const OpMath<T> value = static_cast<OpMath<T>>(in[at]);
        if (ReplacesMax(value, best)) {
          best = value;
          best_at = at;
        }
      }
    }
    output[i] = in[best_at];  // the element itself: its bits, NaN payloads included
    argmax[i] = best_at;
  }
}

// One thread per input element, summing the gradients of the outputs whose window covers
// it and chose it. A gather rather than atomicAdd scatters: deterministic, no separate
// zeroing pass, and it adds in the CPU's order (ascending output index), so the result is
// bitwise the CPU's even where windows overlap.
template <typename T>
__global__ void MaxPool2dBackwardKernel(Conv2dGeometry g, int64_t out_h, int64_t out_w,
                                        const T* grad_output, const int64_t* argmax,
                                        T* grad_input) {
  const int64_t plane_size = g.height * g.width;
  const int64_t out_plane = out_h * out_w;
  const int64_t total = g.batch * g.channels * plane_size;
  for (int64_t i = GlobalThread(); i < total; i += GridThreads()) {
    const int64_t plane = i / plane_size;
    const int64_t at = i % plane_size;
    const int64_t y = at / g.width, x = at % g.width;
    // Outputs oy whose window [oy * stride - pad, oy * stride - pad + kernel) holds y.
    const int64_t oy_begin =
        y + g.pad_h < g.kernel_h ? 0 : (y + g.pad_h - g.kernel_h) / g.stride_h + 1;
    const int64_t oy_end = min((y + g.pad_h) / g.stride_h + 1, out_h);
    const int64_t ox_begin =
        x + g.pad_w < g.kernel_w ? 0 : (x + g.pad_w - g.kernel_w) / g.stride_w + 1;
    const int64_t ox_end = min((x + g.pad_w) / g.stride_w + 1, out_w);
    const int64_t* chosen = argmax + plane * out_plane;
    const T* grad = grad_output + plane * out_plane;
    OpMath<T> sum = 0;  // 16-bit: summed in float, rounded once
    for (int64_t oy = oy_begin; oy < oy_end; ++oy) {
      for (int64_t ox = ox_begin; ox < ox_end; ++ox) {
        const int64_t o = oy * out_w + ox;
        if (chosen[o] == at) sum += static_cast<OpMath<T>>(grad[o]);
      }
    }
    grad_input[i] = static_cast<T>(sum);
  }
}

// Average pooling: one thread per output element (forward) or input element (backward, a
// gather), computing exactly what the CPU computes (tensor/kernels/internal/pooling_math.h).
template <typename T>
__global__ void AvgPool2dKernel(Conv2dGeometry g, bool count_include_pad, int64_t out_h,
                                int64_t out_w, const T* input, T* output) {
  const int64_t out_plane = out_h * out_w;
  const int64_t total = g.batch * g.channels * out_plane;
  for (int64_t i = GlobalThread(); i < total; i += GridThreads()) {
    const int64_t plane = i / out_plane;
    const int64_t oy = (i % out_plane) / out_w, ox = i % out_w;
    output[i] = AvgPoolOutput(g, count_include_pad, input + plane * g.height * g.width, oy, ox);
  }
}

template <typename T>
__global__ void AvgPool2dBackwardKernel(Conv2dGeometry g, bool count_include_pad, int64_t out_h,
                                        int64_t out_w, const T* grad_output, T* grad_input) {
  const int64_t plane_size = g.height * g.width;
  const int64_t total = g.batch * g.channels * plane_size;
  for (int64_t i = GlobalThread(); i < total; i += GridThreads()) {
    const int64_t plane = i / plane_size;
    const int64_t y = (i % plane_size) / g.width, x = i % g.width;
    grad_input[i] = AvgPoolInputGrad(g, count_include_pad, out_h, out_w,
                                     grad_output + plane * out_h * out_w, y, x);
  }
}

template <typename T>
__global__ void AdaptiveAvgPool2dKernel(int64_t planes, int64_t height, int64_t width,
                                        int64_t out_h, int64_t out_w, const T* input, T* output) {
  const int64_t out_plane = out_h * out_w;
  const int64_t total = planes * out_plane;
  for (int64_t i = GlobalThread(); i < total; i += GridThreads()) {
    const int64_t plane = i / out_plane;
    const int64_t oy = (i % out_plane) / out_w, ox = i % out_w;
    output[i] =
        AdaptiveAvgPoolOutput(height, width, out_h, out_w, input + plane * height * width, oy, ox);
  }
}

template <typename T>
__global__ void AdaptiveAvgPool2dBackwardKernel(int64_t planes, int64_t height, int64_t width,
                                                int64_t out_h, int64_t out_w, const T* grad_output,
                                                T* grad_input) {
  const int64_t plane_size = height * width;
  const int64_t total = planes * plane_size;
  for (int64_t i = GlobalThread(); i < total; i += GridThreads()) {
    const int64_t plane = i / plane_size;
    const int64_t y = (i % plane_size) / width, x = i % width;
    grad_input[i] = AdaptiveAvgPoolInputGrad(height, width, out_h, out_w,
                                             grad_output + plane * out_h * out_w, y, x);
  }
}

}  // namespace

void LaunchMaxPool2d(const LaunchContext& context, DType dtype, const Conv2dGeometry& g,
                     const void* input, void* output, int64_t* argmax) {
  DispatchAllFloatingTypes(dtype, "CUDA MaxPool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t total = g.batch * g.channels * g.out_h() * g.out_w();
    if (total == 0) return;
    MaxPool2dKernel<T><<<GridFor(context, total), kThreads, 0, context.stream>>>(
        g, g.out_h(), g.out_w(), static_cast<const T*>(input), static_cast<T*>(output), argmax);
    TANDEM_CUDA_CHECK_LAUNCH(context.device);
  });
}

void LaunchMaxPool2dBackward(const LaunchContext& context, DType dtype, const Conv2dGeometry& g,
                             const void* grad_output, const int64_t* argmax, void* grad_input) {
  DispatchAllFloatingTypes(dtype, "CUDA MaxPool2dBackward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t total = g.batch * g.channels * g.height * g.width;
    if (total == 0) return;
    MaxPool2dBackwardKernel<T><<<GridFor(context, total), kThreads, 0, context.stream>>>(
        g, g.out_h(), g.out_w(), static_cast<const T*>(grad_output), argmax,
        static_cast<T*>(grad_input));
    TANDEM_CUDA_CHECK_LAUNCH(context.device);
  });
}

void LaunchAvgPool2d(const LaunchContext& context, DType dtype, const Conv2dGeometry& g,
                     bool count_include_pad, const void* input, void* output) {
  DispatchAllFloatingTypes(dtype, "CUDA AvgPool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t total = g.batch * g.channels * g.out_h() * g.out_w();
    if (total == 0) return;
    const int64_t image = g.batch * g.channels * g.height * g.width;
    RunInFloat<T>(context, input, image, output, total, [&](auto in, auto out) {
      AvgPool2dKernel<Element<decltype(out)>>
          <<<GridFor(context, total), kThreads, 0, context.stream>>>(g, count_include_pad,
                                                                     g.out_h(), g.out_w(), in, out);
      TANDEM_CUDA_CHECK_LAUNCH(context.device);
    });
  });
}

void LaunchAvgPool2dBackward(const LaunchContext& context, DType dtype, const Conv2dGeometry& g,
                             bool count_include_pad, const void* grad_output, void* grad_input) {
  DispatchAllFloatingTypes(dtype, "CUDA AvgPool2dBackward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t total = g.batch * g.channels * g.height * g.width;
    if (total == 0) return;
    const int64_t outputs = g.batch * g.channels * g.out_h() * g.out_w();
    RunInFloat<T>(context, grad_output, outputs, grad_input, total, [&](auto in, auto out) {
      AvgPool2dBackwardKernel<Element<decltype(out)>>
          <<<GridFor(context, total), kThreads, 0, context.stream>>>(g, count_include_pad,
                                                                     g.out_h(), g.out_w(), in, out);
      TANDEM_CUDA_CHECK_LAUNCH(context.device);
    });
  });
}

void LaunchAdaptiveAvgPool2d(const LaunchContext& context, DType dtype, int64_t planes,
                             int64_t height, int64_t width, int64_t out_h, int64_t out_w,
                             const void* input, void* output) {
  DispatchAllFloatingTypes(dtype, "CUDA AdaptiveAvgPool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t total = planes * out_h * out_w;
    if (total == 0) return;
    RunInFloat<T>(context, input, planes * height * width, output, total, [&](auto in, auto out) {
      AdaptiveAvgPool2dKernel<Element<decltype(out)>>
          <<<GridFor(context, total), kThreads, 0, context.stream>>>(planes, height, width, out_h,
                                                                     out_w, in, out);
      TANDEM_CUDA_CHECK_LAUNCH(context.device);
    });
  });
}

void LaunchAdaptiveAvgPool2dBackward(const LaunchContext& context, DType dtype, int64_t planes,
                                     int64_t height, int64_t width, int64_t out_h, int64_t out_w,
                                     const void* grad_output, void* grad_input) {
  DispatchAllFloatingTypes(dtype, "CUDA AdaptiveAvgPool2dBackward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t total = planes * height * width;
    if (total == 0) return;
    RunInFloat<T>(context, grad_output, planes * out_h * out_w, grad_input, total,
                  [&](auto in, auto out) {
                    AdaptiveAvgPool2dBackwardKernel<Element<decltype(out)>>
                        <<<GridFor(context, total), kThreads, 0, context.stream>>>(
                            planes, height, width, out_h, out_w, in, out);
                    TANDEM_CUDA_CHECK_LAUNCH(context.device);
                  });
  });
}

}  // namespace cuda
}  // namespace tandem
