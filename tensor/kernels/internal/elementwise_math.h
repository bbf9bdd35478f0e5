// The scalar math behind UnaryOp and BinaryOp, shared by the CPU and CUDA backends so that
// both compute exactly the same function (the CPU is the oracle for the GPU).
//
//   float y = tandem::ApplyUnary(tandem::UnaryOp::kRelu, x, 0.0f);   // float or double
#ifndef TANDEM_TENSOR_KERNELS_INTERNAL_ELEMENTWISE_MATH_H_
#define TANDEM_TENSOR_KERNELS_INTERNAL_ELEMENTWISE_MATH_H_

#include <cmath>
#include <cstdint>

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
  }
  return T(0);
}

// The int64 subset (kNeg, kAbs, kAddScalar, kMulScalar); callers reject the others.
TANDEM_HOST_DEVICE int64_t ApplyUnary(UnaryOp op, int64_t x, double s) {
  switch (op) {
    case UnaryOp::kNeg:
      return -x;
    case UnaryOp::kAbs:
      return x < 0 ? -x : x;
    case UnaryOp::kAddScalar:
      return x + static_cast<int64_t>(s);
    case UnaryOp::kMulScalar:
      return x * static_cast<int64_t>(s);
    default:
      return 0;
  }
}

inline constexpr bool UnarySupportsInt64(UnaryOp op) {
  return op == UnaryOp::kNeg || op == UnaryOp::kAbs || op == UnaryOp::kAddScalar ||
         op == UnaryOp::kMulScalar;
}

template <typename T>
TANDEM_HOST_DEVICE T ApplyBinary(BinaryOp op, T a, T b) {
  switch (op) {
    case BinaryOp::kAdd:
      return a + b;
    case BinaryOp::kSub:
      return a - b;
    case BinaryOp::kMul:
      return a * b;
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
  }
  return T(0);
}

}  // namespace tandem

#endif  // TANDEM_TENSOR_KERNELS_INTERNAL_ELEMENTWISE_MATH_H_
