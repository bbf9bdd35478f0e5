// The scalar math behind UnaryOp and BinaryOp, shared by the CPU and CUDA backends so that
// both compute exactly the same function (the CPU is the oracle for the GPU).
//
//   float y = tandem::ApplyUnary(tandem::UnaryOp::kRelu, x, 0.0f);   // float or double
//   tandem::BFloat16 h = tandem::ApplyUnary(tandem::UnaryOp::kGelu, b, 0.0f);  // in float
//   bool lt = tandem::ApplyComparison(tandem::BinaryOp::kLt, a, b);   // into a kBool output
#ifndef TANDEM_TENSOR_KERNELS_INTERNAL_ELEMENTWISE_MATH_H_
#define TANDEM_TENSOR_KERNELS_INTERNAL_ELEMENTWISE_MATH_H_

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "tensor/base/half.h"
#include "tensor/base/philox.h"  // TANDEM_HOST_DEVICE
#include "tensor/runtime/op_tables.h"

namespace tandem {

// The C math library's float and double functions under one name each, so that ApplyUnary
// is written once for both (expf for float, exp for double, on the host and in CUDA). Called
// with :: because tandem's own exp/log (of Tensors) would hide them.
namespace math {
#define TANDEM_MATH_FUNCTION(name, float_fn, double_fn)            \
  TANDEM_HOST_DEVICE float name(float x) { return ::float_fn(x); } \
  TANDEM_HOST_DEVICE double name(double x) { return ::double_fn(x); }
TANDEM_MATH_FUNCTION(Exp, expf, exp)
TANDEM_MATH_FUNCTION(Log, logf, log)
TANDEM_MATH_FUNCTION(Sqrt, sqrtf, sqrt)
TANDEM_MATH_FUNCTION(Abs, fabsf, fabs)
TANDEM_MATH_FUNCTION(Tanh, tanhf, tanh)
TANDEM_MATH_FUNCTION(Erf, erff, erf)
#undef TANDEM_MATH_FUNCTION
TANDEM_HOST_DEVICE float Pow(float x, float y) { return ::powf(x, y); }
TANDEM_HOST_DEVICE double Pow(double x, double y) { return ::pow(x, y); }
}  // namespace math

// Note [Adding an elementwise op] (tensor/runtime/op_tables.h): one function per row of the
// op tables. UnaryMath(UnaryTag<op>, x, s) is y = op(x, s) for T float or double (the
// constants are rounded to T, so float keeps float arithmetic) and, for the kOpIntegers rows,
// int64 (s converted to int64). BinaryMath(BinaryTag<op>, a, b) is op(a, b) for every element
// type T (the kOpFloatingOnly rows: float and double only); a comparison row is instead its
// predicate, Compare(BinaryTag<op>, a, b).
template <UnaryOp kOp>
using UnaryTag = std::integral_constant<UnaryOp, kOp>;
template <BinaryOp kOp>
using BinaryTag = std::integral_constant<BinaryOp, kOp>;

namespace math {
TANDEM_HOST_DEVICE int64_t Abs(int64_t x) { return x < 0 ? -x : x; }
}  // namespace math

template <typename T>
TANDEM_HOST_DEVICE T UnaryMath(UnaryTag<UnaryOp::kNeg>, T x, T) {
  return -x;
}
template <typename T>
TANDEM_HOST_DEVICE T UnaryMath(UnaryTag<UnaryOp::kExp>, T x, T) {
  return math::Exp(x);
}
template <typename T>
TANDEM_HOST_DEVICE T UnaryMath(UnaryTag<UnaryOp::kLog>, T x, T) {
  return math::Log(x);
}
// NaN stays NaN, as in PyTorch (a diverging run shows NaN instead of zeros). Written as
// max(0, x) in SSE's operand order (maxss returns the second operand when either is NaN), so
// compilers emit a branchless maxss/maxps instead of a mispredicted branch on every other
// element (5x slower on random data).
template <typename T>
TANDEM_HOST_DEVICE T UnaryMath(UnaryTag<UnaryOp::kRelu>, T x, T) {
  return T(0) > x ? T(0) : x;
}
template <typename T>
TANDEM_HOST_DEVICE T UnaryMath(UnaryTag<UnaryOp::kSqrt>, T x, T) {
  return math::Sqrt(x);
}
template <typename T>
TANDEM_HOST_DEVICE T UnaryMath(UnaryTag<UnaryOp::kAbs>, T x, T) {
  return math::Abs(x);
}
template <typename T>
TANDEM_HOST_DEVICE T UnaryMath(UnaryTag<UnaryOp::kTanh>, T x, T) {
  return math::Tanh(x);
}
template <typename T>
TANDEM_HOST_DEVICE T UnaryMath(UnaryTag<UnaryOp::kSigmoid>, T x, T) {
  return T(1) / (T(1) + math::Exp(-x));
}
template <typename T>
TANDEM_HOST_DEVICE T UnaryMath(UnaryTag<UnaryOp::kSquare>, T x, T) {
  return x * x;
}
template <typename T>
TANDEM_HOST_DEVICE T UnaryMath(UnaryTag<UnaryOp::kAddScalar>, T x, T s) {
  return x + s;
}
template <typename T>
TANDEM_HOST_DEVICE T UnaryMath(UnaryTag<UnaryOp::kMulScalar>, T x, T s) {
  return x * s;
}
template <typename T>
TANDEM_HOST_DEVICE T UnaryMath(UnaryTag<UnaryOp::kPowScalar>, T x, T s) {
  return math::Pow(x, s);
}
template <typename T>
TANDEM_HOST_DEVICE T UnaryMath(UnaryTag<UnaryOp::kGeScalar>, T x, T s) {
  return x >= s ? T(1) : T(0);
}
template <typename T>
TANDEM_HOST_DEVICE T UnaryMath(UnaryTag<UnaryOp::kGelu>, T x, T) {
  return T(0.5) * x * (T(1) + math::Erf(x * T(0.70710678118654752)));
}
// Phi(x) + x * phi(x): the normal distribution's CDF and density.
template <typename T>
TANDEM_HOST_DEVICE T UnaryMath(UnaryTag<UnaryOp::kGeluDerivative>, T x, T) {
  return T(0.5) * (T(1) + math::Erf(x * T(0.70710678118654752))) +
         x * T(0.39894228040143268) * math::Exp(T(-0.5) * x * x);
}
// Note [GELU tanh through exp]: 0.5 (1 + tanh u) = 1 / (1 + e^(-2u)), the same function
// through one exp instead of libm's tanh (several times slower per element on the CPU, where
// these loops are bound by it). u = sqrt(2 / pi) (x + 0.044715 x^3), with x * x * x rather
// than a pow call. As x -> -inf, e^(-2u) overflows to inf and the results go to 0 (NaN at
// -inf itself, as 0.5 x (1 + tanh u) gives).
template <typename T>
TANDEM_HOST_DEVICE T UnaryMath(UnaryTag<UnaryOp::kGeluTanh>, T x, T) {
  const T u = T(0.79788456080286536) * (x + T(0.044715) * x * x * x);
  return x / (T(1) + math::Exp(T(-2) * u));
}
// With s = 0.5 (1 + tanh u): d/dx x s = s + x ds/du du/dx, ds/du = 2 s (1 - s).
template <typename T>
TANDEM_HOST_DEVICE T UnaryMath(UnaryTag<UnaryOp::kGeluTanhDerivative>, T x, T) {
  const T x2 = x * x;
  const T s = T(1) / (T(1) + math::Exp(T(-1.5957691216057307) * (x + T(0.044715) * x2 * x)));
  const T du = T(0.79788456080286536) * (T(1) + T(3 * 0.044715) * x2);
  return s + T(2) * x * s * (T(1) - s) * du;
}
template <typename T>
TANDEM_HOST_DEVICE T UnaryMath(UnaryTag<UnaryOp::kSilu>, T x, T) {
  return x / (T(1) + math::Exp(-x));
}
template <typename T>
TANDEM_HOST_DEVICE T UnaryMath(UnaryTag<UnaryOp::kErf>, T x, T) {
  return math::Erf(x);
}

template <typename T>
TANDEM_HOST_DEVICE T BinaryMath(BinaryTag<BinaryOp::kAdd>, T a, T b) {
  return a + b;
}
template <typename T>
TANDEM_HOST_DEVICE T BinaryMath(BinaryTag<BinaryOp::kSub>, T a, T b) {
  return a - b;
}
template <typename T>
TANDEM_HOST_DEVICE T BinaryMath(BinaryTag<BinaryOp::kMul>, T a, T b) {
  if constexpr (std::is_same_v<T, bool>) {
    return a && b;  // PyTorch's bool multiplication
  } else {
    return a * b;
  }
}
template <typename T>
TANDEM_HOST_DEVICE T BinaryMath(BinaryTag<BinaryOp::kDiv>, T a, T b) {
  return a / b;
}
// NaN in either operand propagates, as in PyTorch (a != a only for NaN).
template <typename T>
TANDEM_HOST_DEVICE T BinaryMath(BinaryTag<BinaryOp::kMaximum>, T a, T b) {
  return (a != a || a > b) ? a : b;
}
template <typename T>
TANDEM_HOST_DEVICE T BinaryMath(BinaryTag<BinaryOp::kMinimum>, T a, T b) {
  return (a != a || a < b) ? a : b;
}
template <typename T>
TANDEM_HOST_DEVICE bool Compare(BinaryTag<BinaryOp::kEq>, T a, T b) {
  return a == b;
}
template <typename T>
TANDEM_HOST_DEVICE bool Compare(BinaryTag<BinaryOp::kNe>, T a, T b) {
  return a != b;
}
template <typename T>
TANDEM_HOST_DEVICE bool Compare(BinaryTag<BinaryOp::kLt>, T a, T b) {
  return a < b;
}
template <typename T>
TANDEM_HOST_DEVICE bool Compare(BinaryTag<BinaryOp::kLe>, T a, T b) {
  return a <= b;
}
template <typename T>
TANDEM_HOST_DEVICE bool Compare(BinaryTag<BinaryOp::kGt>, T a, T b) {
  return a > b;
}
template <typename T>
TANDEM_HOST_DEVICE bool Compare(BinaryTag<BinaryOp::kGe>, T a, T b) {
  return a >= b;
}
// PyTorch's threshold_backward: the gradient passes unless the output is <= 0, so a NaN
// output passes it.
template <typename T>
TANDEM_HOST_DEVICE T BinaryMath(BinaryTag<BinaryOp::kReluBackward>, T a, T b) {
  return b <= T(0) ? T(0) : a;
}
template <typename T>
TANDEM_HOST_DEVICE T BinaryMath(BinaryTag<BinaryOp::kTanhBackward>, T a, T b) {
  return a * (T(1) - b * b);
}
template <typename T>
TANDEM_HOST_DEVICE T BinaryMath(BinaryTag<BinaryOp::kSigmoidBackward>, T a, T b) {
  return a * ((T(1) - b) * b);
}
template <typename T>
TANDEM_HOST_DEVICE T BinaryMath(BinaryTag<BinaryOp::kGeluBackward>, T a, T b) {
  return a * UnaryMath(UnaryTag<UnaryOp::kGeluDerivative>{}, b, T(0));
}
template <typename T>
TANDEM_HOST_DEVICE T BinaryMath(BinaryTag<BinaryOp::kGeluTanhBackward>, T a, T b) {
  return a * UnaryMath(UnaryTag<UnaryOp::kGeluTanhDerivative>{}, b, T(0));
}
template <typename T>
TANDEM_HOST_DEVICE T BinaryMath(BinaryTag<BinaryOp::kSiluBackward>, T a, T b) {
  const T s = T(1) / (T(1) + math::Exp(-b));
  return a * (s * (T(1) + b * (T(1) - s)));
}

// One op for one element type, as the generated switches below call it: the ops a dtype
// lacks (backends reject those calls first) give 0 instead of instantiating their math.
template <UnaryOp kOp, typename I>
TANDEM_HOST_DEVICE I ApplyIntegerUnaryOp(int64_t x, int64_t s) {
  if constexpr (UnarySupportsIntegers(kOp)) {
    return static_cast<I>(UnaryMath(UnaryTag<kOp>{}, x, s));
  } else {
    return I(0);
  }
}
template <BinaryOp kOp, typename T>
TANDEM_HOST_DEVICE T ApplyBinaryOp(T a, T b) {
  if constexpr (IsComparison(kOp)) {
    return Compare(BinaryTag<kOp>{}, a, b) ? T(1) : T(0);
  } else if constexpr (BinaryIsFloatingOnly(kOp) && !std::is_floating_point_v<T>) {
    return T(0);
  } else {
    return BinaryMath(BinaryTag<kOp>{}, a, b);
  }
}
template <BinaryOp kOp, typename T>
TANDEM_HOST_DEVICE bool ApplyComparisonOp(T a, T b) {
  if constexpr (IsComparison(kOp)) {
    return Compare(BinaryTag<kOp>{}, a, b);
  } else {
    return false;
  }
}

// The generated switches: op is a runtime value on the GPU and a constant on the CPU (whose
// loops are compiled per op, so the switch folds away).
#define TANDEM_UNARY_CASE(name, text, flags) \
  case UnaryOp::k##name:                     \
    return UnaryMath(UnaryTag<UnaryOp::k##name>{}, x, s);
// T is float or double.
template <typename T>
TANDEM_HOST_DEVICE T ApplyUnary(UnaryOp op, T x, T s) {
  switch (op) { TANDEM_FORALL_UNARY_OPS(TANDEM_UNARY_CASE) }
  return T(0);
}
#undef TANDEM_UNARY_CASE

// The kOpIntegers rows for any integer type I (int64, int32, uint8, bool); callers reject the
// others (UnarySupportsIntegers) and the kOpRejectsBool rows on bool, as PyTorch does. The
// arithmetic is done in int64 and converted back to I, so uint8 wraps modulo 256 as in
// PyTorch and bool gets "nonzero".
#define TANDEM_UNARY_INTEGER_CASE(name, text, flags) \
  case UnaryOp::k##name:                             \
    return ApplyIntegerUnaryOp<UnaryOp::k##name, I>(v, static_cast<int64_t>(s));
template <typename I, typename S,
          typename = std::enable_if_t<std::is_integral_v<I> && std::is_arithmetic_v<S>>>
TANDEM_HOST_DEVICE I ApplyUnary(UnaryOp op, I x, S s) {
  const int64_t v = static_cast<int64_t>(x);
  switch (op) { TANDEM_FORALL_UNARY_OPS(TANDEM_UNARY_INTEGER_CASE) }
  return I(0);
}
#undef TANDEM_UNARY_INTEGER_CASE

#define TANDEM_BINARY_CASE(name, text, flags) \
  case BinaryOp::k##name:                     \
    return ApplyBinaryOp<BinaryOp::k##name>(a, b);
template <typename T>
TANDEM_HOST_DEVICE T ApplyBinary(BinaryOp op, T a, T b) {
  switch (op) { TANDEM_FORALL_BINARY_OPS(TANDEM_BINARY_CASE) }
  return T(0);
}
#undef TANDEM_BINARY_CASE

// The 16-bit floats: the float function of the values loaded as float, rounded once when
// stored (PyTorch's opmath). Not ApplyUnary<BFloat16>, which would round the constants
// (1/sqrt(2), ...) and every intermediate to 16 bits. Non-templates, so that they win over the
// templates above for BFloat16 and Half arguments.
TANDEM_HOST_DEVICE BFloat16 ApplyUnary(UnaryOp op, BFloat16 x, float s) {
  return BFloat16(ApplyUnary<float>(op, static_cast<float>(x), s));
}
TANDEM_HOST_DEVICE Half ApplyUnary(UnaryOp op, Half x, float s) {
  return Half(ApplyUnary<float>(op, static_cast<float>(x), s));
}
TANDEM_HOST_DEVICE BFloat16 ApplyBinary(BinaryOp op, BFloat16 a, BFloat16 b) {
  return BFloat16(ApplyBinary<float>(op, static_cast<float>(a), static_cast<float>(b)));
}
TANDEM_HOST_DEVICE Half ApplyBinary(BinaryOp op, Half a, Half b) {
  return Half(ApplyBinary<float>(op, static_cast<float>(a), static_cast<float>(b)));
}

// A comparison op (IsComparison) as a bool, for a kBool output. T is any element type; the
// 16-bit floats compare as float (exact). Other ops give false.
#define TANDEM_COMPARISON_CASE(name, text, flags) \
  case BinaryOp::k##name:                         \
    return ApplyComparisonOp<BinaryOp::k##name>(x, y);
template <typename T>
TANDEM_HOST_DEVICE bool ApplyComparison(BinaryOp op, T a, T b) {
  using M = OpMath<T>;
  const M x = static_cast<M>(a), y = static_cast<M>(b);
  switch (op) { TANDEM_FORALL_BINARY_OPS(TANDEM_COMPARISON_CASE) }
  return false;
}
#undef TANDEM_COMPARISON_CASE

}  // namespace tandem

#endif  // TANDEM_TENSOR_KERNELS_INTERNAL_ELEMENTWISE_MATH_H_
