// The CPU backend's elementwise kernels (tensor/cpu/internal/elementwise_kernels.h). Each op
// is compiled as its own loop (DispatchUnary/DispatchBinary turn the runtime op into a
// constant, so ApplyUnary's switch folds away); the unit-stride and broadcast cases get loops
// the compiler vectorises, and the 16-bit floats go through float chunks.
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "tensor/base/error.h"
#include "tensor/base/half.h"
#include "tensor/cpu/internal/cpu_loops.h"
#include "tensor/cpu/internal/elementwise_kernels.h"
#include "tensor/kernels/float_conversions.h"
#include "tensor/kernels/internal/elementwise_math.h"
#include "tensor/kernels/internal/strided_layout.h"
#include "tensor/kernels/vectorized.h"
#include "tensor/runtime/backend.h"
#include "tensor/runtime/threads.h"

namespace tandem {
namespace cpu_internal {
namespace {

// Calls f(std::integral_constant<Enum, value>) for the runtime `op`, so that the switch
// inside ApplyUnary/ApplyBinary folds away and each loop is compiled for one function.
#define TANDEM_UNARY_CASE(name, text, flags) \
  case UnaryOp::k##name:                     \
    return f(UnaryTag<UnaryOp::k##name>{});
#define TANDEM_BINARY_CASE(name, text, flags) \
  case BinaryOp::k##name:                     \
    return f(BinaryTag<BinaryOp::k##name>{});
template <typename F>
void DispatchUnary(UnaryOp op, F&& f) {
  switch (op) { TANDEM_FORALL_UNARY_OPS(TANDEM_UNARY_CASE) }
  TANDEM_FAIL("unknown UnaryOp ", static_cast<int>(op));
}

template <typename F>
void DispatchBinary(BinaryOp op, F&& f) {
  switch (op) { TANDEM_FORALL_BINARY_OPS(TANDEM_BINARY_CASE) }
  TANDEM_FAIL("unknown BinaryOp ", static_cast<int>(op));
}
#undef TANDEM_UNARY_CASE
#undef TANDEM_BINARY_CASE

// ---- Elementwise inner loops ----------------------------------------------------------
// The unit-stride and broadcast-scalar cases get their own loops so that the compiler
// vectorises them; anything else takes the general strided loop.

// GCC (12, at -O2 and -O3) compiles relu's `0 > x ? 0 : x` and its backward's select into a
// compare and a branch per element, mispredicted on every other element of real activations
// (about 30x slower than SSE on random signs). These loops spell out the same selects, NaN
// included: maxps(0, x) returns x when x is NaN; cmpnle(b, 0) is true when b > 0 or NaN.
// Both return how many leading elements they did; the caller finishes the rest.
int64_t ReluUnitStride(float* dst, const float* src, int64_t n) {
  int64_t i = 0;
#if defined(__SSE2__)
  const __m128 zero = _mm_setzero_ps();
  for (; i + 4 <= n; i += 4) _mm_storeu_ps(dst + i, _mm_max_ps(zero, _mm_loadu_ps(src + i)));
#endif
  return i;
}

int64_t ReluBackwardUnitStride(float* dst, const float* grad, const float* out, int64_t n) {
  int64_t i = 0;
#if defined(__SSE2__)
  const __m128 zero = _mm_setzero_ps();
  for (; i + 4 <= n; i += 4) {
    const __m128 pass = _mm_cmpnle_ps(_mm_loadu_ps(out + i), zero);
    _mm_storeu_ps(dst + i, _mm_and_ps(pass, _mm_loadu_ps(grad + i)));
  }
#endif
  return i;
}

template <UnaryOp kOp, typename T, typename S>
void UnaryRun(T* dst, const T* src, int64_t n, int64_t dst_stride, int64_t src_stride, S s) {
  if (dst_stride == 1 && src_stride == 1) {
    int64_t i = 0;
    if constexpr (kOp == UnaryOp::kRelu && std::is_same_v<T, float>) {
      i = ReluUnitStride(dst, src, n);
    }
    for (; i < n; ++i) dst[i] = ApplyUnary(kOp, src[i], s);
  } else if (dst_stride == 1 && src_stride == 0) {
    const T value = ApplyUnary(kOp, *src, s);
    std::fill(dst, dst + n, value);
  } else {
    for (int64_t i = 0; i < n; ++i) {
      dst[i * dst_stride] = ApplyUnary(kOp, src[i * src_stride], s);
    }
  }
}

template <BinaryOp kOp, typename T>
void BinaryRun(T* dst, const T* a, const T* b, int64_t n, const int64_t* strides) {
  const int64_t sd = strides[0], sa = strides[1], sb = strides[2];
  if (sd == 1 && sa == 1 && sb == 1) {
    int64_t i = 0;
    if constexpr (kOp == BinaryOp::kReluBackward && std::is_same_v<T, float>) {
      i = ReluBackwardUnitStride(dst, a, b, n);
    }
    for (; i < n; ++i) dst[i] = ApplyBinary(kOp, a[i], b[i]);
  } else if (sd == 1 && sa == 1 && sb == 0) {
    const T bv = *b;
    for (int64_t i = 0; i < n; ++i) dst[i] = ApplyBinary(kOp, a[i], bv);
  } else if (sd == 1 && sa == 0 && sb == 1) {
    const T av = *a;
    for (int64_t i = 0; i < n; ++i) dst[i] = ApplyBinary(kOp, av, b[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) {
      dst[i * sd] = ApplyBinary(kOp, a[i * sa], b[i * sb]);
    }
  }
}

// ---- 16-bit floats ----------------------------------------------------------------------
// Elementwise kernels on BFloat16/Half work through float chunks: load a chunk as float
// (vectorised conversion), run the float loop, round the chunk into the output. Each element
// is still the float function of its inputs, rounded once (ApplyUnary's BFloat16 overload).

template <UnaryOp kOp>
TANDEM_VECTORIZE inline void UnaryFloatLoop(float* __restrict out, const float* __restrict in,
                                            int64_t n, float s) {
  for (int64_t i = 0; i < n; ++i) out[i] = ApplyUnary(kOp, in[i], s);
}

template <BinaryOp kOp>
TANDEM_VECTORIZE inline void BinaryFloatLoop(float* __restrict out, const float* __restrict a,
                                             int64_t sa, const float* __restrict b, int64_t sb,
                                             int64_t n) {
  if (sa == 1 && sb == 1) {
    for (int64_t i = 0; i < n; ++i) out[i] = ApplyBinary(kOp, a[i], b[i]);
  } else if (sa == 1) {
    const float bv = *b;
    for (int64_t i = 0; i < n; ++i) out[i] = ApplyBinary(kOp, a[i], bv);
  } else if (sb == 1) {
    const float av = *a;
    for (int64_t i = 0; i < n; ++i) out[i] = ApplyBinary(kOp, av, b[i]);
  } else {
    const float value = ApplyBinary(kOp, *a, *b);
    for (int64_t i = 0; i < n; ++i) out[i] = value;
  }
}

// ReLU and its backward select a value or zero, so in bfloat16 they work on the bits: no
// float chunks, the same results (ApplyUnary's `0 > x ? 0 : x` and ApplyBinary's
// `b <= 0 ? 0 : a`). A bfloat16 is below zero when its bits lie in (0x8000, 0xFF80] (above
// -0, up to -inf; higher patterns are NaNs), at most zero when also 0 or 0x8000.
// Branch-free (a compare per element on random signs mispredicts half the time), in 16-bit
// lanes so that GCC vectorises: y - 0x8000 wraps [0x8000, 0xFF80] onto [0, 0x7F80].
TANDEM_VECTORIZE inline void ReluBFloat16Bits(uint16_t* __restrict dst,
                                              const uint16_t* __restrict src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t v = src[i];
    const uint16_t below_zero = static_cast<uint16_t>(static_cast<uint16_t>(v - 0x8001) <= 0x7F7F);
    dst[i] = static_cast<uint16_t>(v & static_cast<uint16_t>(below_zero - 1));
  }
}

TANDEM_VECTORIZE inline void ReluBackwardBFloat16Bits(uint16_t* __restrict dst,
                                                      const uint16_t* __restrict grad,
                                                      const uint16_t* __restrict out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t y = out[i];
    const uint16_t at_most_zero =
        static_cast<uint16_t>((static_cast<uint16_t>(y - 0x8000) <= 0x7F80) | (y == 0));
    dst[i] = static_cast<uint16_t>(grad[i] & static_cast<uint16_t>(at_most_zero - 1));
  }
}

template <UnaryOp kOp, typename T>
void UnaryRunReduced(T* dst, const T* src, int64_t n, int64_t dst_stride, int64_t src_stride,
                     float s) {
  if constexpr (kOp == UnaryOp::kRelu && std::is_same_v<T, BFloat16>) {
    if (dst_stride == 1 && src_stride == 1) {
      return vec::Vectorized([&] {
        ReluBFloat16Bits(reinterpret_cast<uint16_t*>(dst), reinterpret_cast<const uint16_t*>(src),
                         n);
      });
    }
  }
  float in[kFloatChunk], out[kFloatChunk];
  for (int64_t c = 0; c < n; c += kFloatChunk) {
    const int64_t m = std::min(kFloatChunk, n - c);
    vec::Vectorized([&] {
      if (src_stride == 0) {  // a broadcast input: one value
        std::fill(out, out + m, ApplyUnary(kOp, static_cast<float>(*src), s));
      } else {
        LoadAsFloat(src + c * src_stride, src_stride, m, in);
        UnaryFloatLoop<kOp>(out, in, m, s);
      }
      StoreRounded(out, m, dst + c * dst_stride, dst_stride);
    });
  }
}

template <BinaryOp kOp, typename T>
void BinaryRunReduced(T* dst, const T* a, const T* b, int64_t n, const int64_t* strides) {
  const int64_t sd = strides[0], sa = strides[1], sb = strides[2];
  if constexpr (kOp == BinaryOp::kReluBackward && std::is_same_v<T, BFloat16>) {
    if (sd == 1 && sa == 1 && sb == 1) {
      return vec::Vectorized([&] {
        ReluBackwardBFloat16Bits(reinterpret_cast<uint16_t*>(dst),
                                 reinterpret_cast<const uint16_t*>(a),
                                 reinterpret_cast<const uint16_t*>(b), n);
      });
    }
  }
  float fa[kFloatChunk], fb[kFloatChunk], out[kFloatChunk];
  // A broadcast operand (stride 0) is loaded once, as a single float.
  if (sa == 0) fa[0] = static_cast<float>(*a);
  if (sb == 0) fb[0] = static_cast<float>(*b);
  for (int64_t c = 0; c < n; c += kFloatChunk) {
    const int64_t m = std::min(kFloatChunk, n - c);
    vec::Vectorized([&] {
      if (sa != 0) LoadAsFloat(a + c * sa, sa, m, fa);
      if (sb != 0) LoadAsFloat(b + c * sb, sb, m, fb);
      BinaryFloatLoop<kOp>(out, fa, sa == 0 ? 0 : 1, fb, sb == 0 ? 0 : 1, m);
      StoreRounded(out, m, dst + c * sd, sd);
    });
  }
}

// dst[i] = op(a[i], b[i]) as a bool, for the comparisons into a kBool output.
template <BinaryOp kOp, typename T>
void CompareRun(bool* dst, const T* a, const T* b, int64_t n, const int64_t* strides) {
  const int64_t sd = strides[0], sa = strides[1], sb = strides[2];
  if (sd == 1 && sa == 1 && sb == 1) {
    for (int64_t i = 0; i < n; ++i) dst[i] = ApplyComparison(kOp, a[i], b[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i * sd] = ApplyComparison(kOp, a[i * sa], b[i * sb]);
  }
}

// One element converted as Copy converts: bool is "nonzero" (NaN included); a floating value
// goes to uint8 through int64, so that negative values wrap as they do in PyTorch on x86
// (a direct float-to-uint8 conversion of them is undefined in C++).
template <typename To, typename From>
inline To ConvertElement(From x) {
  if constexpr (std::is_same_v<To, From>) {
    return x;
  } else if constexpr (std::is_same_v<To, bool>) {
    return static_cast<OpMath<From>>(x) != OpMath<From>(0);
  } else if constexpr (std::is_same_v<To, uint8_t> && !std::is_integral_v<From>) {
    return static_cast<uint8_t>(static_cast<int64_t>(static_cast<OpMath<From>>(x)));
  } else if constexpr (kIsReducedFloat<To>) {
    return To(static_cast<float>(static_cast<OpMath<From>>(x)));
  } else {
    return static_cast<To>(static_cast<OpMath<From>>(x));
  }
}

template <typename T>
TANDEM_VECTORIZE inline void FillLoop(T* __restrict dst, int64_t n, T value) {
  for (int64_t i = 0; i < n; ++i) dst[i] = value;
}

template <typename To, typename From>
void ConvertRun(To* dst, const From* src, int64_t n, int64_t dst_stride, int64_t src_stride) {
  if (dst_stride == 1 && src_stride == 0) {
    // A broadcast (conv2d's bias over each output plane): GCC's -O2 leaves a plain fill of a
    // non-zero value scalar.
    const To value = ConvertElement<To>(*src);
    vec::Vectorized([&] { FillLoop(dst, n, value); });
  } else if (dst_stride == 1 && src_stride == 1) {
    // float <-> 16-bit float: the vectorised conversions (autocast and mixed-precision
    // training convert whole tensors every step).
    if constexpr (std::is_same_v<To, float> && kIsReducedFloat<From>) {
      vec::ToFloat(src, dst, n);
    } else if constexpr (kIsReducedFloat<To> && std::is_same_v<From, float>) {
      vec::FromFloat(src, dst, n);
    } else {
      for (int64_t i = 0; i < n; ++i) dst[i] = ConvertElement<To>(src[i]);
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      dst[i * dst_stride] = ConvertElement<To>(src[i * src_stride]);
    }
  }
}

template <typename T>
void FillRun(T* dst, int64_t n, int64_t stride, T value) {
  if (stride == 1) {
    std::fill(dst, dst + n, value);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i * stride] = value;
  }
}

}  // namespace

void Copy(int index, const KernelTensor& dst, const KernelTensor& src) {
  CheckLayout(dst, "Copy");
  CheckLayout(src, "Copy");
  CheckSameShape(dst, src, "Copy", "a source");
  const int64_t n = dst.numel();
  if (n == 0) return;
  const KernelTensor* operands[2] = {&dst, &src};
  const StridedLayout<2> layout = MakeStridedLayout(operands);
  if (dst.dtype == src.dtype && dst.data == src.data) {
    bool same_strides = true;
    for (int d = 0; d < layout.ndim; ++d)
      same_strides &= layout.strides[0][d] == layout.strides[1][d];
    if (same_strides) return;  // copying a view onto itself
  }
  if (dst.dtype == src.dtype && layout.IsContiguous()) {
    const size_t element = ElementSize(dst.dtype);
    CopyBytes(index, dst.data, src.data, static_cast<size_t>(n) * element);
    return;
  }
  auto run = [&](auto* out, const auto* in) {
    ParallelFor(Cpu(index), n, kElementwiseGrain, [&](int64_t begin, int64_t end) {
      ForEachRun(layout, begin, end, [&](const int64_t* offsets, int64_t count, const int64_t* s) {
        ConvertRun(out + offsets[0], in + offsets[1], count, s[0], s[1]);
      });
    });
  };
  DispatchDType(dst.dtype, "CPU Copy", [&](auto to) {
    DispatchDType(src.dtype, "CPU Copy", [&](auto from) {
      run(dst.ptr<typename decltype(to)::type>(), src.ptr<const typename decltype(from)::type>());
    });
  });
}

void Fill(int index, const KernelTensor& dst, double value) {
  CheckLayout(dst, "Fill");
  const int64_t n = dst.numel();
  if (n == 0) return;
  const KernelTensor* operands[1] = {&dst};
  const StridedLayout<1> layout = MakeStridedLayout(operands);
  auto run = [&](auto* out, auto typed_value) {
    ParallelFor(Cpu(index), n, kElementwiseGrain, [&](int64_t begin, int64_t end) {
      ForEachRun(layout, begin, end, [&](const int64_t* offsets, int64_t count, const int64_t* s) {
        FillRun(out + offsets[0], count, s[0], typed_value);
      });
    });
  };
  DispatchDType(dst.dtype, "CPU Fill", [&](auto tag) {
    using T = typename decltype(tag)::type;
    run(dst.ptr<T>(), ConvertElement<T>(value));
  });
}

void Unary(int index, UnaryOp op, const KernelTensor& dst, const KernelTensor& src, double scalar) {
  CheckLayout(dst, "Unary");
  CheckLayout(src, "Unary");
  CheckSameShape(dst, src, "Unary", "an input");
  TANDEM_CHECK(dst.dtype == src.dtype, "CPU Unary expects the output's dtype (", dst.dtype,
               ") to match the input's (", src.dtype, "); convert with Copy first");
  TANDEM_CHECK(IsFloatingPoint(src.dtype) || UnarySupportsIntegers(op), "CPU Unary: ", OpName(op),
               " is defined for floating types only (integer and bool tensors take neg, abs, "
               "add and mul by a scalar) but got ",
               src.dtype, "; convert the tensor to a floating dtype first");
  TANDEM_CHECK(!(src.dtype == kBool && RejectsBool(op)),
               "CPU Unary: negation of a bool tensor is not supported (as in PyTorch); use "
               "logical not (x == false) or convert to an integer dtype first");
  const int64_t n = dst.numel();
  if (n == 0) return;
  const KernelTensor* operands[2] = {&dst, &src};
  const StridedLayout<2> layout = MakeStridedLayout(operands);
  const int64_t grain = IsTranscendental(op) ? kTranscendentalGrain : kElementwiseGrain;
  auto run = [&](auto* out, const auto* in, auto typed_scalar) {
    DispatchUnary(op, [&](auto op_constant) {
      constexpr UnaryOp kOp = decltype(op_constant)::value;
      ParallelFor(Cpu(index), n, grain, [&](int64_t begin, int64_t end) {
        if (layout.IsContiguous()) {
          UnaryRun<kOp>(out + begin, in + begin, end - begin, 1, 1, typed_scalar);
          return;
        }
        ForEachRun(
            layout, begin, end, [&](const int64_t* offsets, int64_t count, const int64_t* s) {
              UnaryRun<kOp>(out + offsets[0], in + offsets[1], count, s[0], s[1], typed_scalar);
            });
      });
    });
  };
  DispatchDType(src.dtype, "CPU Unary", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (kIsReducedFloat<T>) {
      // In float, a chunk at a time (UnaryRunReduced), the scalar as float.
      T* out = dst.ptr<T>();
      const T* in = src.ptr<const T>();
      const float s = static_cast<float>(scalar);
      DispatchUnary(op, [&](auto op_constant) {
        constexpr UnaryOp kOp = decltype(op_constant)::value;
        ParallelFor(Cpu(index), n, grain, [&](int64_t begin, int64_t end) {
          ForEachRun(layout, begin, end,
                     [&](const int64_t* offsets, int64_t count, const int64_t* strides) {
                       UnaryRunReduced<kOp>(out + offsets[0], in + offsets[1], count, strides[0],
                                            strides[1], s);
                     });
        });
      });
    } else {
      // Integral types take the scalar as a double (ApplyUnary's integer overload).
      using Scalar = std::conditional_t<std::is_floating_point_v<T>, T, double>;
      run(dst.ptr<T>(), src.ptr<const T>(), static_cast<Scalar>(scalar));
    }
  });
}

void Binary(int index, BinaryOp op, const KernelTensor& dst, const KernelTensor& a,
            const KernelTensor& b) {
  CheckLayout(dst, "Binary");
  CheckLayout(a, "Binary");
  CheckLayout(b, "Binary");
  CheckSameShape(dst, a, "Binary", "a first input (already broadcast)");
  CheckSameShape(dst, b, "Binary", "a second input (already broadcast)");
  const bool to_bool = IsComparison(op) && dst.dtype == kBool;
  TANDEM_CHECK(a.dtype == b.dtype && (dst.dtype == a.dtype || to_bool),
               "CPU Binary expects inputs and output of one dtype (comparisons may also write "
               "bool) but got ",
               a.dtype, " and ", b.dtype, " into ", dst.dtype,
               "; convert them to a common dtype first");
  TANDEM_CHECK(!BinaryIsFloatingOnly(op) || IsFloatingPoint(a.dtype), "CPU Binary: ", OpName(op),
               " (an activation's backward) is defined for floating dtypes "
               "only but got ",
               a.dtype, "; convert the tensors to a floating dtype first");
  if (a.dtype == kBool && !to_bool) {
    TANDEM_CHECK(op != BinaryOp::kSub,
                 "CPU Binary: subtraction of bool tensors is not supported (as in PyTorch); use "
                 "logical xor (a != b) instead");
    TANDEM_CHECK(!RejectsBool(op), "CPU Binary: ", OpName(op),
                 " is not defined for bool tensors; convert them to a floating dtype first");
  }
  const int64_t n = dst.numel();
  if (n == 0) return;
  const KernelTensor* operands[3] = {&dst, &a, &b};
  const StridedLayout<3> layout = MakeStridedLayout(operands);
  // Runs `body(out + offsets[0], x + offsets[1], y + offsets[2], count, strides)` over the
  // elements, split over the device's threads.
  auto for_each_run = [&](auto* out, const auto* x, const auto* y, auto&& body) {
    ParallelFor(Cpu(index), n, kElementwiseGrain, [&](int64_t begin, int64_t end) {
      ForEachRun(layout, begin, end, [&](const int64_t* offsets, int64_t count, const int64_t* s) {
        body(out + offsets[0], x + offsets[1], y + offsets[2], count, s);
      });
    });
  };
  if (to_bool) {
    return DispatchDType(a.dtype, "CPU Binary", [&](auto tag) {
      using T = typename decltype(tag)::type;
      DispatchBinary(op, [&](auto op_constant) {
        constexpr BinaryOp kOp = decltype(op_constant)::value;
        if constexpr (IsComparison(kOp)) {
          for_each_run(dst.ptr<bool>(), a.ptr<const T>(), b.ptr<const T>(),
                       [&](bool* out, const T* x, const T* y, int64_t count, const int64_t* s) {
                         CompareRun<kOp>(out, x, y, count, s);
                       });
        }
      });
    });
  }
  auto run = [&](auto* out, const auto* x, const auto* y) {
    DispatchBinary(op, [&](auto op_constant) {
      constexpr BinaryOp kOp = decltype(op_constant)::value;
      ParallelFor(Cpu(index), n, kElementwiseGrain, [&](int64_t begin, int64_t end) {
        if (layout.IsContiguous()) {
          const int64_t unit[3] = {1, 1, 1};
          BinaryRun<kOp>(out + begin, x + begin, y + begin, end - begin, unit);
          return;
        }
        ForEachRun(layout, begin, end,
                   [&](const int64_t* offsets, int64_t count, const int64_t* s) {
                     BinaryRun<kOp>(out + offsets[0], x + offsets[1], y + offsets[2], count, s);
                   });
      });
    });
  };
  DispatchDType(dst.dtype, "CPU Binary", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (kIsReducedFloat<T>) {
      DispatchBinary(op, [&](auto op_constant) {
        constexpr BinaryOp kOp = decltype(op_constant)::value;
        for_each_run(dst.ptr<T>(), a.ptr<const T>(), b.ptr<const T>(),
                     [&](T* out, const T* x, const T* y, int64_t count, const int64_t* s) {
                       BinaryRunReduced<kOp>(out, x, y, count, s);
                     });
      });
    } else {
      run(dst.ptr<T>(), a.ptr<const T>(), b.ptr<const T>());
    }
  });
}

}  // namespace cpu_internal
}  // namespace tandem
