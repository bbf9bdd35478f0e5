// The CPU backend's convolution helpers (Im2Col, Col2Im: conv2d is im2col + GEMM where oneDNN
// does not take it) and pooling kernels (tensor/kernels/conv_kernels.h, pooling_kernels.h) over
// NCHW images split over cpu:`index`'s pool by planes or rows, registered at static
// initialisation (part of :cpu_backend, which is linked whole). The geometry was checked by the
// stubs' Run* functions. Windows that lie inside the image take
// vectorised loops without bounds checks; the border windows take the general ones. Max
// pooling scans each window in row-major order (NaN wins, ties keep the earlier tap), the same
// scan in every dtype and on every vector unit.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "tensor/base/error.h"
#include "tensor/base/half.h"
#include "tensor/cpu/internal/cpu_loops.h"
#include "tensor/kernels/conv_kernels.h"
#include "tensor/kernels/float_conversions.h"
#include "tensor/kernels/internal/pooling_math.h"
#include "tensor/kernels/pooling_kernels.h"
#include "tensor/kernels/vectorized.h"
#include "tensor/runtime/kernel_stub.h"
#include "tensor/runtime/threads.h"

namespace tandem {
namespace cpu_internal {
namespace {

// The outputs o in [0, count) whose input position o * stride + shift lies in [0, size), as
// [lo, hi) (empty: lo == hi).
std::pair<int64_t, int64_t> InsideRange(int64_t shift, int64_t stride, int64_t size,
                                        int64_t count) {
  // o * stride + shift >= 0  <=>  o >= ceil(-shift / stride); < size  <=>  o < ceil((size -
  // shift) / stride).
  const auto ceil_div = [](int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -(-a / b); };
  const int64_t lo = std::clamp<int64_t>(ceil_div(-shift, stride), 0, count);
  const int64_t hi = std::clamp<int64_t>(ceil_div(size - shift, stride), lo, count);
  return {lo, hi};
}

// out[i] = src[i] for i in [lo, hi), 0 elsewhere in [0, n), reading src[i] for every i (so all
// of [src, src + n) must be readable). One loop with a select rather than a fill, a copy and a
// fill: those become calls to memset and memmove, most of a short row's time.
template <typename T>
TANDEM_VECTORIZE inline void CopyInside(const T* __restrict src, int32_t lo, int32_t hi, int32_t n,
                                        T* __restrict out) {
  for (int32_t i = 0; i < n; ++i) {
    const T v = src[i];
    out[i] = i >= lo && i < hi ? v : T(0);
  }
}

}  // namespace

void Im2Col(int index, DType dtype, const Conv2dGeometry& g, const void* image_data,
            void* columns_data) {
  CheckCpuIndex(index);
  DispatchAllFloatingTypes(dtype, "CPU Im2Col", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* image = static_cast<const T*>(image_data);
    T* columns = static_cast<T*>(columns_data);
    const int64_t out_h = g.out_h(), out_w = g.out_w();
    const int64_t plane = g.height * g.width, out_plane = out_h * out_w;
    const int64_t window = g.kernel_h * g.kernel_w;
    // One column row per (image, channel, kernel_row, kernel_col).
    const int64_t rows = g.batch * g.channels * window;
    if (rows == 0 || out_plane == 0) return;
    const int64_t image_size = g.batch * g.channels * plane;
    ParallelFor(Cpu(index), rows, std::max<int64_t>(1, kElementwiseGrain / out_plane),
                [&](int64_t begin, int64_t end) {
                  vec::Vectorized([&] {
                    for (int64_t row = begin; row < end; ++row) {
                      const int64_t kx = row % g.kernel_w;
                      const int64_t ky = (row / g.kernel_w) % g.kernel_h;
                      const int64_t image_channel = row / window;  // b * channels + c
                      const T* in = image + image_channel * plane;
                      T* out = columns +
                               g.columns_start(image_channel / g.channels,
                                               image_channel % g.channels, out_plane) +
                               (row % window) * g.columns_tap_stride(out_plane);
                      // x = ox * stride - pad + kx * dilation lies inside for ox in [lo, hi).
                      const int64_t shift = kx * g.dilation_w - g.pad_w;
                      const auto [lo, hi] = InsideRange(shift, g.stride_w, g.width, out_w);
                      for (int64_t oy = 0; oy < out_h; ++oy) {
                        const int64_t y = oy * g.stride_h - g.pad_h + ky * g.dilation_h;
                        T* out_row = out + oy * out_w;
                        if (y < 0 || y >= g.height) {
                          std::fill(out_row, out_row + out_w, T(0));
                          continue;
                        }
                        const T* in_row = in + y * g.width;
                        // The padding's reads land in the neighbouring pixels, or outside the image
                        // at its first and last rows (those take the loop below).
                        const int64_t start = image_channel * plane + y * g.width + shift;
                        if (g.stride_w == 1 && start >= 0 && start + out_w <= image_size &&
                            out_w <= std::numeric_limits<int32_t>::max()) {
                          CopyInside(in_row + shift, static_cast<int32_t>(lo),
                                     static_cast<int32_t>(hi), static_cast<int32_t>(out_w),
                                     out_row);
                          continue;
                        }
                        std::fill(out_row, out_row + lo, T(0));
                        if (g.stride_w == 1) {
                          std::copy(in_row + lo + shift, in_row + hi + shift, out_row + lo);
                        } else {
                          for (int64_t ox = lo; ox < hi; ++ox)
                            out_row[ox] = in_row[ox * g.stride_w + shift];
                        }
                        std::fill(out_row + hi, out_row + out_w, T(0));
                      }
                    }
                  });
                });
  });
}

namespace {

// out[i * stride] += in[i] for i < n.
template <typename Acc, typename T>
TANDEM_VECTORIZE inline void AddIntoStrided(Acc* __restrict out, int64_t stride,
                                            const T* __restrict in, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i * stride] += static_cast<Acc>(in[i]);
}

// out[i] += in[i] for i < n, into an accumulator of the same type or, for the 16-bit floats,
// into float.
template <typename Acc, typename T>
inline void AddIntoAccumulator(Acc* __restrict out, const T* __restrict in, int64_t n) {
  if constexpr (std::is_same_v<Acc, T>) {
    vec::AddIntoLoop(out, in, n);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] += vec::conversions_internal::ToFloatElement(in[i]);
  }
}

}  // namespace

void Col2Im(int index, DType dtype, const Conv2dGeometry& g, const void* columns_data,
            void* image_data) {
  CheckCpuIndex(index);
  DispatchAllFloatingTypes(dtype, "CPU Col2Im", [&](auto tag) {
    using T = typename decltype(tag)::type;
    // The 16-bit floats sum each plane in a float buffer and round it once.
    using Acc = OpMath<T>;
    constexpr bool kScratch = !std::is_same_v<Acc, T>;
    const T* columns = static_cast<const T*>(columns_data);
    T* image = static_cast<T*>(image_data);
    const int64_t out_h = g.out_h(), out_w = g.out_w();
    const int64_t plane = g.height * g.width, out_plane = out_h * out_w;
    const int64_t window = g.kernel_h * g.kernel_w;
    const int64_t planes = g.batch * g.channels;
    if (planes == 0 || plane == 0) return;
    // One image plane per task: the column rows that sum into it belong to it alone. Each pixel
    // sums its taps in the same order whatever the vector unit (Vectorized: the rows' adds are
    // lanes of one vector, not a reordered sum).
    ParallelFor(Cpu(index), planes,
                std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(1, window * out_plane)),
                [&](int64_t begin, int64_t end) {
                  std::vector<Acc> scratch(kScratch ? plane : 0);
                  vec::Vectorized([&] {
                    for (int64_t p = begin; p < end; ++p) {
                      Acc* out;
                      if constexpr (kScratch) {
                        out = scratch.data();
                      } else {
                        out = image + p * plane;
                      }
                      std::fill(out, out + plane, Acc(0));
                      for (int64_t w = 0; w < window; ++w) {
                        const int64_t ky = w / g.kernel_w, kx = w % g.kernel_w;
                        const T* in = columns +
                                      g.columns_start(p / g.channels, p % g.channels, out_plane) +
                                      w * g.columns_tap_stride(out_plane);
                        const int64_t shift = kx * g.dilation_w - g.pad_w;
                        const auto [lo, hi] = InsideRange(shift, g.stride_w, g.width, out_w);
                        for (int64_t oy = 0; oy < out_h; ++oy) {
                          const int64_t y = oy * g.stride_h - g.pad_h + ky * g.dilation_h;
                          if (y < 0 || y >= g.height) continue;
                          Acc* out_row = out + y * g.width;
                          const T* in_row = in + oy * out_w;
                          if (g.stride_w == 1) {
                            AddIntoAccumulator(out_row + shift + lo, in_row + lo, hi - lo);
                          } else {
                            AddIntoStrided(out_row + lo * g.stride_w + shift, g.stride_w,
                                           in_row + lo, hi - lo);
                          }
                        }
                      }
                      if constexpr (kScratch) vec::FromFloatLoop(out, image + p * plane, plane);
                    }
                  });
                });
  });
}

namespace {

// Replaces<true>(v, best): NaN wins, ties keep the earlier (the rule of every max-pooling
// loop here, scalar or in vector lanes).
inline bool Takes(float v, float best) { return (v > best) | ((v != v) & (best == best)); }

// Takes(v, *best) applied without branches: a comparison
// on random data mispredicts half the time, and GCC keeps a branch for a float select, so
// the select is done on the bits.
inline void TakeIfGreater(float v, int64_t at, float* best, int64_t* best_at) {
  const float b = *best;
  const int take = static_cast<int>(Takes(v, b));
  const uint32_t mask = 0u - static_cast<uint32_t>(take);
  uint32_t v_bits, b_bits;
  std::memcpy(&v_bits, &v, sizeof(v));
  std::memcpy(&b_bits, &b, sizeof(b));
  b_bits = (v_bits & mask) | (b_bits & ~mask);
  std::memcpy(best, &b_bits, sizeof(b_bits));
  *best_at += (at - *best_at) & -static_cast<int64_t>(take);
}

// Max pooling of the outputs [0, n) of one output row whose windows lie inside the image
// horizontally: output i's window starts at `first + i * s` and spans `rows` rows of `width`
// and kernel_w columns. Tap by tap across the row, each tap in the same scan order as
// TakeIfGreater's per output, so that the outputs are independent lanes and GCC vectorises
// the loops (Vectorized). The argmax is kept in 32 bits, the lanes of the float comparison:
// with 64-bit lanes the vector loop cost so much more that GCC ran short rows scalar.
// kStride > 0 fixes s at compile time (whole vector loads and shuffles instead of element by
// element).
template <int64_t kStride>
TANDEM_VECTORIZE inline void MaxPoolTaps(const float* __restrict in, int32_t width, int32_t rows,
                                         int32_t kernel_w, int32_t first, int32_t stride, int64_t n,
                                         float* __restrict best, int32_t* __restrict best_at) {
  const int32_t s = kStride > 0 ? kStride : stride;
  for (int64_t i = 0; i < n; ++i) {
    best_at[i] = first + static_cast<int32_t>(i) * s;
    best[i] = in[first + i * s];
  }
  for (int32_t y = 0; y < rows; ++y) {
    for (int32_t kx = y == 0 ? 1 : 0; kx < kernel_w; ++kx) {
      const int32_t tap = first + y * width + kx;
      for (int64_t i = 0; i < n; ++i) {
        const int32_t at = tap + static_cast<int32_t>(i) * s;
        const float v = in[tap + i * s], b = best[i];
        const bool take = Takes(v, b);
        best[i] = take ? v : b;
        best_at[i] = take ? at : best_at[i];
      }
    }
  }
}

// MaxPoolTaps for 2-wide windows 2 apart (2x2 pooling), one window row at a time: the pairs'
// maxima first, both taps in one pass, so that the vector loop loads every float of its span
// (a stride-2 load of one tap alone leaves a gap that makes GCC keep the last output out of
// the vector loop, and so run half of a 7- or 14-output row scalar); then each later row's
// into the running maxima, which hold the earlier taps and so win ties.
TANDEM_VECTORIZE inline void MaxPoolPairs(const float* __restrict in, int32_t first, int64_t n,
                                          float* __restrict best, int32_t* __restrict best_at) {
  for (int64_t i = 0; i < n; ++i) {
    const int32_t at = first + 2 * static_cast<int32_t>(i);
    const float v0 = in[first + 2 * i], v1 = in[first + 2 * i + 1];
    const bool take = Takes(v1, v0);
    best[i] = take ? v1 : v0;
    best_at[i] = take ? at + 1 : at;
  }
}

TANDEM_VECTORIZE inline void MaxPoolMerge(const float* __restrict row_best,
                                          const int32_t* __restrict row_at, int64_t n,
                                          float* __restrict best, int32_t* __restrict best_at) {
  for (int64_t i = 0; i < n; ++i) {
    const bool take = Takes(row_best[i], best[i]);
    best[i] = take ? row_best[i] : best[i];
    best_at[i] = take ? row_at[i] : best_at[i];
  }
}

TANDEM_VECTORIZE inline void Widen(const int32_t* __restrict in, int64_t n,
                                   int64_t* __restrict out) {
  for (int64_t i = 0; i < n; ++i) out[i] = in[i];
}

// Calls f(plane, y, x) for every element of `planes` height x width planes, a few planes per
// task of the device's pool.
template <typename F>
void ForEachPixel(int index, int64_t planes, int64_t height, int64_t width, int64_t cost, F&& f) {
  const int64_t plane = height * width;
  if (planes == 0 || plane == 0) return;
  ParallelFor(Cpu(index), planes,
              std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(1, plane * cost)),
              [&](int64_t begin, int64_t end) {
                for (int64_t p = begin; p < end; ++p) {
                  for (int64_t y = 0; y < height; ++y) {
                    for (int64_t x = 0; x < width; ++x) f(p, y, x);
                  }
                }
              });
}

// Max pooling in any floating type, one window at a time in the vectorised float32 loop's scan
// order (so the same argmax): the float64 path, where speed matters less than in float32.
template <typename T>
void MaxPool2dScalar(int index, const Conv2dGeometry& g, const T* input, T* output,
                     int64_t* argmax) {
  const int64_t out_h = g.out_h(), out_w = g.out_w();
  const int64_t plane = g.height * g.width, out_plane = out_h * out_w;
  ForEachPixel(index, g.batch * g.channels, out_h, out_w, g.kernel_h * g.kernel_w,
               [&](int64_t p, int64_t oy, int64_t ox) {
                 const T* in = input + p * plane;
                 const int64_t y0 = std::max<int64_t>(oy * g.stride_h - g.pad_h, 0);
                 const int64_t y1 = std::min(oy * g.stride_h - g.pad_h + g.kernel_h, g.height);
                 const int64_t x0 = std::max<int64_t>(ox * g.stride_w - g.pad_w, 0);
                 const int64_t x1 = std::min(ox * g.stride_w - g.pad_w + g.kernel_w, g.width);
                 int64_t best_at = y0 * g.width + x0;
                 T best = in[best_at];
                 for (int64_t y = y0; y < y1; ++y) {
                   for (int64_t x = x0; x < x1; ++x) {
                     if (Replaces<true>(in[y * g.width + x], best)) {
                       best = in[y * g.width + x];
                       best_at = y * g.width + x;
                     }
                   }
                 }
                 output[p * out_plane + oy * out_w + ox] = best;
                 argmax[p * out_plane + oy * out_w + ox] = best_at;
               });
}

// Max pooling in bfloat16: a selection, so each plane is converted to float once (exact), the
// windows are compared there with the float32 loop's rule and scan order (so the same argmax),
// and the winners are converted back (exact again: they are bfloat16 values).
void MaxPool2dBFloat16(int index, const Conv2dGeometry& g, const BFloat16* input, BFloat16* output,
                       int64_t* argmax) {
  const int64_t out_h = g.out_h(), out_w = g.out_w();
  const int64_t plane = g.height * g.width, out_plane = out_h * out_w;
  // The common 2x2 window with stride 2 and no padding, on rows of even width: the pairs of
  // every row are contiguous over the whole plane, so one long vectorised pass takes each
  // pair's maximum (pooling rows are short, 14 and 7 outputs in a small CNN, and a vector
  // loop over one row would run mostly in its scalar tail); then each output row merges its
  // two rows of pair maxima, selecting on the bits (no branch to mispredict).
  const bool pairs = g.kernel_h == 2 && g.kernel_w == 2 && g.stride_h == 2 && g.stride_w == 2 &&
                     g.pad_h == 0 && g.pad_w == 0 && g.width % 2 == 0 &&
                     plane <= std::numeric_limits<int32_t>::max();
  const auto pool = [&](int64_t begin, int64_t end) {
    std::vector<float> image(plane), pair_best(pairs ? plane / 2 : 0), best(out_plane);
    std::vector<int32_t> pair_at(pairs ? plane / 2 : 0), at(out_plane);
    vec::Vectorized([&] {
      for (int64_t p = begin; p < end; ++p) {
        const float* in = image.data();
        vec::ToFloatLoop(input + p * plane, image.data(), plane);
        BFloat16* out = output + p * out_plane;
        int64_t* out_at = argmax + p * out_plane;
        if (pairs) {
          MaxPoolPairs(in, 0, plane / 2, pair_best.data(), pair_at.data());
          for (int64_t oy = 0; oy < out_h; ++oy) {
            // Rows 2 oy and 2 oy + 1 of pair maxima, out_w = width / 2 each.
            const float* upper = pair_best.data() + 2 * oy * out_w;
            const int32_t* upper_at = pair_at.data() + 2 * oy * out_w;
            for (int64_t ox = 0; ox < out_w; ++ox) {
              const float u = upper[ox], l = upper[ox + out_w];
              const uint32_t mask = 0u - static_cast<uint32_t>(Takes(l, u));
              uint32_t u_bits, l_bits;
              std::memcpy(&u_bits, &u, sizeof(u));
              std::memcpy(&l_bits, &l, sizeof(l));
              const uint32_t bits = (l_bits & mask) | (u_bits & ~mask);
              std::memcpy(&best[oy * out_w + ox], &bits, sizeof(bits));
              at[oy * out_w + ox] =
                  static_cast<int32_t>((static_cast<uint32_t>(upper_at[ox + out_w]) & mask) |
                                       (static_cast<uint32_t>(upper_at[ox]) & ~mask));
            }
          }
          Widen(at.data(), out_plane, out_at);
          vec::FromFloatLoop(best.data(), out, out_plane);
          continue;
        }
        for (int64_t oy = 0; oy < out_h; ++oy) {
          const int64_t y0 = std::max<int64_t>(oy * g.stride_h - g.pad_h, 0);
          const int64_t y1 = std::min(oy * g.stride_h - g.pad_h + g.kernel_h, g.height);
          for (int64_t ox = 0; ox < out_w; ++ox) {
            const int64_t x0 = std::max<int64_t>(ox * g.stride_w - g.pad_w, 0);
            const int64_t x1 = std::min(ox * g.stride_w - g.pad_w + g.kernel_w, g.width);
            int64_t best_at = y0 * g.width + x0;
            float value = in[best_at];
            for (int64_t y = y0; y < y1; ++y) {
              for (int64_t x = x0; x < x1; ++x) {
                TakeIfGreater(in[y * g.width + x], y * g.width + x, &value, &best_at);
              }
            }
            out[oy * out_w + ox] = input[p * plane + best_at];
            out_at[oy * out_w + ox] = best_at;
          }
        }
      }
    });
  };
  ParallelFor(Cpu(index), g.batch * g.channels,
              std::max<int64_t>(
                  1, kElementwiseGrain / std::max<int64_t>(1, out_plane * g.kernel_h * g.kernel_w)),
              pool);
}

}  // namespace

void MaxPool2d(int index, DType dtype, const Conv2dGeometry& g, const void* input_data,
               void* output_data, int64_t* argmax) {
  CheckCpuIndex(index);
  const int64_t out_h = g.out_h(), out_w = g.out_w();
  const int64_t plane = g.height * g.width, out_plane = out_h * out_w;
  const int64_t planes = g.batch * g.channels;
  if (planes == 0 || out_plane == 0) return;
  // Outputs whose window lies inside horizontally, [lo, hi), take the vectorised row loop.
  const int64_t lo = std::min(out_w, (g.pad_w + g.stride_w - 1) / g.stride_w);
  const int64_t room = g.width + g.pad_w - g.kernel_w;
  int64_t hi = room < 0 ? lo : std::clamp(room / g.stride_w + 1, lo, out_w);
  // The vectorised loop counts in 32 bits; larger planes take pool_one everywhere.
  if (plane > std::numeric_limits<int32_t>::max()) hi = lo;
  if (dtype == kBFloat16) {
    return MaxPool2dBFloat16(index, g, static_cast<const BFloat16*>(input_data),
                             static_cast<BFloat16*>(output_data), argmax);
  }
  if (dtype != kFloat32) {
    return DispatchAllFloatingTypes(dtype, "CPU MaxPool2d", [&](auto tag) {
      using T = typename decltype(tag)::type;
      MaxPool2dScalar(index, g, static_cast<const T*>(input_data), static_cast<T*>(output_data),
                      argmax);
    });
  }
  const float* input = static_cast<const float*>(input_data);
  float* output = static_cast<float*>(output_data);
  ParallelFor(
      Cpu(index), planes,
      std::max<int64_t>(
          1, kElementwiseGrain / std::max<int64_t>(1, out_plane * g.kernel_h * g.kernel_w)),
      [&](int64_t begin, int64_t end) {
        vec::Vectorized([&] {
          for (int64_t p = begin; p < end; ++p) {
            const float* in = input + p * plane;
            for (int64_t oy = 0; oy < out_h; ++oy) {
              const int64_t y0 = std::max<int64_t>(oy * g.stride_h - g.pad_h, 0);
              const int64_t y1 = std::min(oy * g.stride_h - g.pad_h + g.kernel_h, g.height);
              float* best = output + p * out_plane + oy * out_w;
              int64_t* best_at = argmax + p * out_plane + oy * out_w;
              // One output: its window's part inside the image, scanned row by row
              // (never empty: pad <= kernel / 2; padding is -inf).
              const auto pool_one = [&](int64_t ox) {
                const int64_t x0 = std::max<int64_t>(ox * g.stride_w - g.pad_w, 0);
                const int64_t x1 = std::min(ox * g.stride_w - g.pad_w + g.kernel_w, g.width);
                best_at[ox] = y0 * g.width + x0;
                best[ox] = in[best_at[ox]];
                for (int64_t y = y0; y < y1; ++y) {
                  for (int64_t x = x0; x < x1; ++x) {
                    TakeIfGreater(in[y * g.width + x], y * g.width + x, &best[ox], &best_at[ox]);
                  }
                }
              };
              for (int64_t ox = 0; ox < lo; ++ox) pool_one(ox);
              // Pooling rows are short (14 and 7 outputs in a small CNN), so the vector loop
              // would spend most of its time in its scalar tail: it runs to a whole number of
              // vectors instead where the extra windows still lie in the input and their
              // outputs in this task's part of the output, which pool_one below and the next
              // rows overwrite.
              const int64_t first = y0 * g.width - g.pad_w + lo * g.stride_w;
              constexpr int64_t kLanes = 8;  // floats in an AVX2 vector
              int64_t n = (hi - lo + kLanes - 1) / kLanes * kLanes;
              const int64_t last_read =
                  first + (n - 1) * g.stride_w + (y1 - y0 - 1) * g.width + g.kernel_w - 1;
              if (last_read >= (planes - p) * plane ||
                  n > (end - p) * out_plane - oy * out_w - lo) {
                n = hi - lo;
              }
              const auto inside = [&](auto stride) {
                constexpr int64_t kChunk = 256;  // outputs, a multiple of kLanes
                int32_t chunk_at[kChunk], row_at[kChunk];
                float row_best[kChunk];
                for (int64_t c = 0; c < n; c += kChunk) {
                  const int64_t m = std::min(kChunk, n - c);
                  if (decltype(stride)::value == 2 && g.kernel_w == 2) {
                    const int32_t row_first = static_cast<int32_t>(first + c * 2);
                    MaxPoolPairs(in, row_first, m, best + lo + c, chunk_at);
                    for (int64_t y = 1; y < y1 - y0; ++y) {
                      MaxPoolPairs(in, static_cast<int32_t>(row_first + y * g.width), m, row_best,
                                   row_at);
                      MaxPoolMerge(row_best, row_at, m, best + lo + c, chunk_at);
                    }
                  } else {
                    MaxPoolTaps<decltype(stride)::value>(in, g.width, y1 - y0, g.kernel_w,
                                                         first + c * g.stride_w, g.stride_w, m,
                                                         best + lo + c, chunk_at);
                  }
                  Widen(chunk_at, m, best_at + lo + c);
                }
              };
              if (g.stride_w == 1) {
                inside(std::integral_constant<int64_t, 1>());
              } else if (g.stride_w == 2) {
                inside(std::integral_constant<int64_t, 2>());
              } else {
                inside(std::integral_constant<int64_t, 0>());
              }
              for (int64_t ox = hi; ox < out_w; ++ox) pool_one(ox);
            }
          }
        });
      });
}

void MaxPool2dBackward(int index, DType dtype, const Conv2dGeometry& g,
                       const void* grad_output_data, const int64_t* argmax, void* grad_input_data) {
  CheckCpuIndex(index);
  DispatchAllFloatingTypes(dtype, "CPU MaxPool2dBackward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* grad_output = static_cast<const T*>(grad_output_data);
    T* grad_input = static_cast<T*>(grad_input_data);
    const int64_t plane = g.height * g.width, out_plane = g.out_h() * g.out_w();
    const int64_t planes = g.batch * g.channels;
    if (planes == 0 || plane == 0) return;
    // One plane per task: an output's argmax lies in its own plane, so tasks never collide.
    ParallelFor(Cpu(index), planes,
                std::max<int64_t>(1, kElementwiseGrain / std::max(plane, out_plane)),
                [&](int64_t begin, int64_t end) {
                  // The 16-bit floats sum overlapping windows' gradients in float.
                  using Acc = OpMath<T>;
                  constexpr bool kScratch = !std::is_same_v<Acc, T>;
                  std::vector<Acc> scratch(kScratch ? plane : 0);
                  for (int64_t p = begin; p < end; ++p) {
                    Acc* out;
                    if constexpr (kScratch) {
                      out = scratch.data();
                    } else {
                      out = grad_input + p * plane;
                    }
                    std::fill(out, out + plane, Acc(0));
                    const T* grad = grad_output + p * out_plane;
                    const int64_t* at = argmax + p * out_plane;
                    for (int64_t o = 0; o < out_plane; ++o) out[at[o]] += static_cast<Acc>(grad[o]);
                    if constexpr (kScratch) {
                      vec::FromFloat(out, grad_input + p * plane, plane);
                    }
                  }
                });
  });
}

void AvgPool2d(int index, DType dtype, const Conv2dGeometry& g, bool count_include_pad,
               const void* input_data, void* output_data) {
  CheckCpuIndex(index);
  DispatchAllFloatingTypes(dtype, "CPU AvgPool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* input = static_cast<const T*>(input_data);
    T* output = static_cast<T*>(output_data);
    const int64_t out_h = g.out_h(), out_w = g.out_w(), plane = g.height * g.width;
    ForEachPixel(index, g.batch * g.channels, out_h, out_w, g.kernel_h * g.kernel_w,
                 [&](int64_t p, int64_t oy, int64_t ox) {
                   output[(p * out_h + oy) * out_w + ox] =
                       AvgPoolOutput(g, count_include_pad, input + p * plane, oy, ox);
                 });
  });
}

void AvgPool2dBackward(int index, DType dtype, const Conv2dGeometry& g, bool count_include_pad,
                       const void* grad_output_data, void* grad_input_data) {
  CheckCpuIndex(index);
  DispatchAllFloatingTypes(dtype, "CPU AvgPool2dBackward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* grad_output = static_cast<const T*>(grad_output_data);
    T* grad_input = static_cast<T*>(grad_input_data);
    const int64_t out_h = g.out_h(), out_w = g.out_w(), out_plane = out_h * out_w;
    const int64_t cost = (g.kernel_h / g.stride_h + 1) * (g.kernel_w / g.stride_w + 1);
    ForEachPixel(index, g.batch * g.channels, g.height, g.width, cost,
                 [&](int64_t p, int64_t y, int64_t x) {
                   grad_input[(p * g.height + y) * g.width + x] = AvgPoolInputGrad(
                       g, count_include_pad, out_h, out_w, grad_output + p * out_plane, y, x);
                 });
  });
}

void AdaptiveAvgPool2d(int index, DType dtype, int64_t planes, int64_t height, int64_t width,
                       int64_t out_h, int64_t out_w, const void* input_data, void* output_data) {
  CheckCpuIndex(index);
  DispatchAllFloatingTypes(dtype, "CPU AdaptiveAvgPool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* input = static_cast<const T*>(input_data);
    T* output = static_cast<T*>(output_data);
    const int64_t cost =
        (height / std::max<int64_t>(out_h, 1) + 1) * (width / std::max<int64_t>(out_w, 1) + 1);
    ForEachPixel(index, planes, out_h, out_w, cost, [&](int64_t p, int64_t oy, int64_t ox) {
      output[(p * out_h + oy) * out_w + ox] =
          AdaptiveAvgPoolOutput(height, width, out_h, out_w, input + p * height * width, oy, ox);
    });
  });
}

void AdaptiveAvgPool2dBackward(int index, DType dtype, int64_t planes, int64_t height,
                               int64_t width, int64_t out_h, int64_t out_w,
                               const void* grad_output_data, void* grad_input_data) {
  CheckCpuIndex(index);
  DispatchAllFloatingTypes(dtype, "CPU AdaptiveAvgPool2dBackward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* grad_output = static_cast<const T*>(grad_output_data);
    T* grad_input = static_cast<T*>(grad_input_data);
    ForEachPixel(index, planes, height, width, out_h + out_w, [&](int64_t p, int64_t y, int64_t x) {
      grad_input[(p * height + y) * width + x] = AdaptiveAvgPoolInputGrad(
          height, width, out_h, out_w, grad_output + p * out_h * out_w, y, x);
    });
  });
}

TANDEM_REGISTER_KERNEL(Im2ColKernel, DeviceType::kCPU, Im2Col);
TANDEM_REGISTER_KERNEL(Col2ImKernel, DeviceType::kCPU, Col2Im);
TANDEM_REGISTER_KERNEL(MaxPool2dKernel, DeviceType::kCPU, MaxPool2d);
TANDEM_REGISTER_KERNEL(MaxPool2dBackwardKernel, DeviceType::kCPU, MaxPool2dBackward);
TANDEM_REGISTER_KERNEL(AvgPool2dKernel, DeviceType::kCPU, AvgPool2d);
TANDEM_REGISTER_KERNEL(AvgPool2dBackwardKernel, DeviceType::kCPU, AvgPool2dBackward);
TANDEM_REGISTER_KERNEL(AdaptiveAvgPool2dKernel, DeviceType::kCPU, AdaptiveAvgPool2d);
TANDEM_REGISTER_KERNEL(AdaptiveAvgPool2dBackwardKernel, DeviceType::kCPU,
                       AdaptiveAvgPool2dBackward);

}  // namespace cpu_internal
}  // namespace tandem
