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
#include "tensor/runtime/backend.h"

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

// T is float or double; the constants are rounded to T, so float keeps float arithmetic.
template <typename T>
TANDEM_HOST_DEVICE T ApplyUnary(UnaryOp op, T x, T s) {
  switch (op) {
    case UnaryOp::kNeg:
      return -x;
    case UnaryOp::kExp:
      return math::Exp(x);
    case UnaryOp::kLog:
      return math::Log(x);
    case UnaryOp::kRelu:
      // NaN stays NaN, as in PyTorch (a diverging run shows NaN instead of zeros). Written
      // as max(0, x) in SSE's operand order (maxss returns the second operand when either
      // is NaN), so compilers emit a branchless maxss/maxps instead of a mispredicted branch
      // on every other element (5x slower on random data).
      return T(0) > x ? T(0) : x;
    case UnaryOp::kSqrt:
      return math::Sqrt(x);
    case UnaryOp::kAbs:
      return math::Abs(x);
    case UnaryOp::kTanh:
      return math::Tanh(x);
    case UnaryOp::kSigmoid:
      return T(1) / (T(1) + math::Exp(-x));
    case UnaryOp::kSquare:
      return x * x;
    case UnaryOp::kAddScalar:
      return x + s;
    case UnaryOp::kMulScalar:
      return x * s;
    case UnaryOp::kPowScalar:
      return math::Pow(x, s);
    case UnaryOp::kGeScalar:
      return x >= s ? T(1) : T(0);
    case UnaryOp::kGelu:
      return T(0.5) * x * (T(1) + math::Erf(x * T(0.70710678118654752)));
    case UnaryOp::kGeluDerivative:
      // Phi(x) + x * phi(x): the normal distribution's CDF and density.
      return T(0.5) * (T(1) + math::Erf(x * T(0.70710678118654752))) +
             x * T(0.39894228040143268) * math::Exp(T(-0.5) * x * x);
    // Note [GELU tanh through exp]: 0.5 (1 + tanh u) = 1 / (1 + e^(-2u)), the same function
    // through one exp instead of libm's tanh (several times slower per element on the CPU,
    // where these loops are bound by it). u = sqrt(2 / pi) (x + 0.044715 x^3), with x * x * x
    // rather than a pow call. As x -> -inf, e^(-2u) overflows to inf and the results go to
    // 0 (NaN at -inf itself, as 0.5 x (1 + tanh u) gives).
    case UnaryOp::kGeluTanh: {
      const T u = T(0.79788456080286536) * (x + T(0.044715) * x * x * x);
      return x / (T(1) + math::Exp(T(-2) * u));
    }
    case UnaryOp::kGeluTanhDerivative: {
      // With s = 0.5 (1 + tanh u): d/dx x s = s + x ds/du du/dx, ds/du = 2 s (1 - s).
      const T x2 = x * x;
      const T s = T(1) / (T(1) + math::Exp(T(-1.5957691216057307) * (x + T(0.044715) * x2 * x)));
      const T du = T(0.79788456080286536) * (T(1) + T(3 * 0.044715) * x2);
      return s + T(2) * x * s * (T(1) - s) * du;
    }
    case UnaryOp::kSilu:
      return x / (T(1) + math::Exp(-x));
  }
  return T(0);
}

// The integer subset (kNeg, kAbs, kAddScalar, kMulScalar) for any integer type I (int64,
// int32, uint8, bool); callers reject the others (UnarySupportsIntegers) and reject kNeg on
// bool, as PyTorch does. The arithmetic is done in int64 and converted back to I, so uint8
// wraps modulo 256 as in PyTorch and bool gets "nonzero".
template <typename I, typename S,
          typename = std::enable_if_t<std::is_integral_v<I> && std::is_arithmetic_v<S>>>
TANDEM_HOST_DEVICE I ApplyUnary(UnaryOp op, I x, S s) {
  const int64_t v = static_cast<int64_t>(x);
  switch (op) {
    case UnaryOp::kNeg:
      return static_cast<I>(-v);
    case UnaryOp::kAbs:
      return static_cast<I>(v < 0 ? -v : v);
    case UnaryOp::kAddScalar:
      return static_cast<I>(v + static_cast<int64_t>(s));
    case UnaryOp::kMulScalar:
      return static_cast<I>(v * static_cast<int64_t>(s));
    default:
      return I(0);
  }
}

inline constexpr bool UnarySupportsIntegers(UnaryOp op) {
  return op == UnaryOp::kNeg || op == UnaryOp::kAbs || op == UnaryOp::kAddScalar ||
         op == UnaryOp::kMulScalar;
}
// The older name, for int64 (the same subset).
inline constexpr bool UnarySupportsInt64(UnaryOp op) { return UnarySupportsIntegers(op); }

// The ops PyTorch refuses on bool tensors (negation, subtraction, division; relu's backward has
// no bool meaning): every backend checks these, so that both refuse the same calls.
inline constexpr bool RejectsBool(UnaryOp op) { return op == UnaryOp::kNeg; }
// The activations' backward ops other than relu's are defined on floating dtypes only.
inline constexpr bool BinaryIsFloatingOnly(BinaryOp op) {
  return op == BinaryOp::kTanhBackward || op == BinaryOp::kSigmoidBackward ||
         op == BinaryOp::kGeluBackward || op == BinaryOp::kGeluTanhBackward ||
         op == BinaryOp::kSiluBackward;
}
inline constexpr bool RejectsBool(BinaryOp op) {
  return op == BinaryOp::kSub || op == BinaryOp::kDiv || op == BinaryOp::kReluBackward ||
         BinaryIsFloatingOnly(op);
}

template <typename T>
TANDEM_HOST_DEVICE T ApplyBinary(BinaryOp op, T a, T b) {
  switch (op) {
    case BinaryOp::kAdd:
      return a + b;
    case BinaryOp::kSub:
      return a - b;
    case BinaryOp::kMul:
      if constexpr (std::is_same_v<T, bool>) {
        return a && b;  // PyTorch's bool multiplication
      } else {
        return a * b;
      }
    case BinaryOp::kDiv:
      return a / b;
    // NaN in either operand propagates, as in PyTorch (a != a only for NaN).
    case BinaryOp::kMaximum:
      return (a != a || a > b) ? a : b;
    case BinaryOp::kMinimum:
      return (a != a || a < b) ? a : b;
    case BinaryOp::kEq:
      return a == b ? T(1) : T(0);
    case BinaryOp::kNe:
      return a != b ? T(1) : T(0);
    case BinaryOp::kLt:
      return a < b ? T(1) : T(0);
    case BinaryOp::kLe:
      return a <= b ? T(1) : T(0);
    case BinaryOp::kGt:
      return a > b ? T(1) : T(0);
    case BinaryOp::kGe:
      return a >= b ? T(1) : T(0);
    case BinaryOp::kReluBackward:
      // PyTorch's threshold_backward: the gradient passes unless the output is <= 0, so a
      // NaN output passes it.
      return b <= T(0) ? T(0) : a;
    case BinaryOp::kTanhBackward:
    case BinaryOp::kSigmoidBackward:
    case BinaryOp::kGeluBackward:
    case BinaryOp::kGeluTanhBackward:
    case BinaryOp::kSiluBackward:
      // Backends refuse these on integers and bool (BinaryIsFloatingOnly).
      if constexpr (std::is_floating_point_v<T>) {
        if (op == BinaryOp::kTanhBackward) return a * (T(1) - b * b);
        if (op == BinaryOp::kSigmoidBackward) return a * ((T(1) - b) * b);
        if (op == BinaryOp::kSiluBackward) {
          const T s = T(1) / (T(1) + math::Exp(-b));
          return a * (s * (T(1) + b * (T(1) - s)));
        }
        return a * ApplyUnary<T>(op == BinaryOp::kGeluBackward ? UnaryOp::kGeluDerivative
                                                               : UnaryOp::kGeluTanhDerivative,
                                 b, T(0));
      }
      break;
  }
  return T(0);
}

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

inline constexpr bool IsComparison(BinaryOp op) {
  return op == BinaryOp::kEq || op == BinaryOp::kNe || op == BinaryOp::kLt || op == BinaryOp::kLe ||
         op == BinaryOp::kGt || op == BinaryOp::kGe;
}

// A comparison op (IsComparison) as a bool, for a kBool output. T is any element type; the
// 16-bit floats compare as float (exact). Other ops give false.
template <typename T>
TANDEM_HOST_DEVICE bool ApplyComparison(BinaryOp op, T a, T b) {
  using M = OpMath<T>;
  const M x = static_cast<M>(a), y = static_cast<M>(b);
  switch (op) {
    case BinaryOp::kEq:
      return x == y;
    case BinaryOp::kNe:
      return x != y;
    case BinaryOp::kLt:
      return x < y;
    case BinaryOp::kLe:
      return x <= y;
    case BinaryOp::kGt:
      return x > y;
    case BinaryOp::kGe:
      return x >= y;
    default:
      return false;
  }
}

}  // namespace tandem

#endif  // TANDEM_TENSOR_KERNELS_INTERNAL_ELEMENTWISE_MATH_H_
