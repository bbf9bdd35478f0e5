// Elementwise ops: arithmetic with broadcasting and promotion, unary math and activations,
// comparisons and the arithmetic operators.
#include <cstdint>
#include <string>
#include <vector>

#include "tensor/base/error.h"
#include "tensor/core/autograd.h"
#include "tensor/core/tensor.h"
#include "tensor/ops/autocast.h"
#include "tensor/ops/internal/op_helpers.h"
#include "tensor/ops/ops.h"
#include "tensor/runtime/backend.h"

namespace tandem {

namespace {

// The dtype of `t` op `scalar`, as PyTorch types a tensor with a Python number: a floating
// tensor keeps its dtype (a bfloat16 tensor times 0.5 stays bfloat16), an integral one keeps
// its dtype with an integral scalar and becomes float32 (the default dtype) with a
// fractional one, and bool becomes int64 (or float32) since bool arithmetic has no numbers.
DType ScalarResultType(DType t, double scalar) {
  if (IsFloatingPoint(t)) return t;
  if (!IsWholeNumber(scalar)) return kFloat32;
  return t == kBool ? kInt64 : t;
}

// A floating version of `a`: integral and bool inputs become float32, the default dtype, as
// PyTorch promotes them for exp, log, ...; floating inputs (16-bit ones too) stay as they are.
Tensor FloatInput(const Tensor& a, const char* op) {
  CheckDefined(a, op, "input");
  return IsFloatingPoint(a.dtype()) ? a : CastRaw(a, kFloat32);
}

// Float unary op `op` whose gradient is grad * derivative(input, output). `derivative` is
// written with differentiable ops (on their create_graph path), reading the output through
// SavedOutput: the input is saved with its graph (it is `a` itself, a floating input needs
// no conversion), so the node supports double backward.
template <typename Derivative>
Tensor FloatUnaryOp(const Tensor& a, UnaryOp op, double scalar, const char* name,
                    const char* node_name, Derivative derivative) {
  Tensor x = FloatInput(a, name);
  Tensor out = UnaryRaw(op, x, scalar);
  if (NeedsGrad({a})) {
    Record(
        node_name, {a}, out,
        [saved_in = x, saved_out = out.detach(), derivative](const Tensor& grad) {
          return std::vector<Tensor>{derivative(grad, saved_in, saved_out)};
        },
        DoubleBackward::kSupported);
  }
  return out;
}

// gelu'(x) = Phi(x) + x phi(x) as an op of its own (the fused kernel of grad 1), whose
// derivative phi(x) (2 - x^2) is written with differentiable ops: gelu's backward under
// create_graph, differentiable to any order.
Tensor GeluDerivative(const Tensor& x) {
  Tensor out = BinaryRaw(BinaryOp::kGeluBackward, FilledRaw(x.shape(), x.dtype(), x.device(), 1.0),
                         x, "gelu backward");
  if (NeedsGrad({x})) {
    Record(
        "GeluDerivativeBackward", {x}, out,
        [x](const Tensor& grad) {
          const double inv_sqrt_2pi = 0.3989422804014327;
          const Tensor x2 = square(x);
          const Tensor phi = mul(exp(mul(x2, -0.5)), inv_sqrt_2pi);
          return std::vector<Tensor>{mul(grad, mul(phi, 2.0 - x2))};
        },
        DoubleBackward::kSupported);
  }
  return out;
}

}  // namespace

Tensor sum_to(const Tensor& a, const std::vector<int64_t>& shape) {
  CheckDefined(a, "sum_to", "a");
  const int64_t lead = a.dim() - static_cast<int64_t>(shape.size());
  bool broadcastable = lead >= 0;
  std::vector<int64_t> dims;
  for (int64_t d = 0; broadcastable && d < a.dim(); ++d) {
    if (d < lead) {
      dims.push_back(d);
    } else if (shape[d - lead] != a.shape()[d]) {
      if (shape[d - lead] == 1) {
        dims.push_back(d);
      } else {
        broadcastable = false;
      }
    }
  }
  TANDEM_CHECK(broadcastable, "sum_to: cannot sum ", ShapeToString(a.shape()), " down to ",
               ShapeToString(shape), "; the target must broadcast to the input's shape");
  if (a.shape() == shape) return a;
  Tensor reduced = dims.empty() ? a : sum(a, dims, /*keepdim=*/true);
  return reduced.reshape(shape);
}

Tensor add(const Tensor& a, const Tensor& b) {
  const Promoted p = PromoteBinary(a, b, "add");
  Tensor out = BinaryRaw(BinaryOp::kAdd, p.a, p.b, "add");
  if (NeedsGrad({a, b})) {
    const bool grad_a = NeedsGrad({a}), grad_b = NeedsGrad({b});
    Record(
        "AddBackward", {a, b}, out,
        [grad_a, grad_b, sa = a.shape(), sb = b.shape()](const Tensor& grad) {
          return std::vector<Tensor>{grad_a ? sum_to(grad, sa) : Tensor(),
                                     grad_b ? sum_to(grad, sb) : Tensor()};
        },
        DoubleBackward::kSupported);
  }
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b) {
  const Promoted p = PromoteBinary(a, b, "sub");
  TANDEM_CHECK(p.a.dtype() != kBool,
               "sub: subtracting two bool tensors is not supported (as in PyTorch); use "
               "logical_xor(a, b) or convert them with .to(kInt64) first");
  Tensor out = BinaryRaw(BinaryOp::kSub, p.a, p.b, "sub");
  if (NeedsGrad({a, b})) {
    const bool grad_a = NeedsGrad({a}), grad_b = NeedsGrad({b});
    Record(
        "SubBackward", {a, b}, out,
        [grad_a, grad_b, sa = a.shape(), sb = b.shape()](const Tensor& grad) {
          return std::vector<Tensor>{grad_a ? sum_to(grad, sa) : Tensor(),
                                     grad_b ? neg(sum_to(grad, sb)) : Tensor()};
        },
        DoubleBackward::kSupported);
  }
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  const Promoted p = PromoteBinary(a, b, "mul");
  Tensor out = BinaryRaw(BinaryOp::kMul, p.a, p.b, "mul");
  if (NeedsGrad({a, b})) {
    const bool grad_a = NeedsGrad({a}), grad_b = NeedsGrad({b});
    Record(
        "MulBackward", {a, b}, out,
        [grad_a, grad_b, sa = p.a, sb = p.b](const Tensor& grad) {
          return std::vector<Tensor>{grad_a ? sum_to(mul(grad, sb), sa.shape()) : Tensor(),
                                     grad_b ? sum_to(mul(grad, sa), sb.shape()) : Tensor()};
        },
        SupportedIfSame({{p.a, a}, {p.b, b}}));
  }
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  // True division: int64 operands promote to float32, as in PyTorch.
  Promoted p = PromoteBinary(a, b, "div");
  p.a = FloatInput(p.a, "div");
  p.b = FloatInput(p.b, "div");
  Tensor out = BinaryRaw(BinaryOp::kDiv, p.a, p.b, "div");
  if (NeedsGrad({a, b})) {
    const bool grad_a = NeedsGrad({a}), grad_b = NeedsGrad({b});
    Record(
        "DivBackward", {a, b}, out,
        [grad_a, grad_b, sa = a.shape(), sb = p.b, so = out.detach()](const Tensor& grad) {
          Tensor grad_over_b = div(grad, sb);
          // d(a/b)/db = -(a/b)/b.
          return std::vector<Tensor>{
              grad_a ? sum_to(grad_over_b, sa) : Tensor(),
              grad_b ? neg(sum_to(mul(grad_over_b, SavedOutput(so)), sb.shape())) : Tensor()};
        },
        SupportedIfSame({{p.b, b}}));
  }
  return out;
}

namespace {

// maximum/minimum: the gradient goes to the chosen input and is split evenly on ties, as
// in PyTorch. As there, an input loses its gradient only where it compares strictly worse,
// so where either is NaN (the output is NaN) both inputs receive the full gradient.
Tensor MaxMin(const Tensor& a, const Tensor& b, bool is_max) {
  const char* name = is_max ? "maximum" : "minimum";
  const Promoted p = PromoteBinary(a, b, name);
  Tensor out = BinaryRaw(is_max ? BinaryOp::kMaximum : BinaryOp::kMinimum, p.a, p.b, name);
  if (NeedsGrad({a, b})) {
    const bool grad_a = NeedsGrad({a}), grad_b = NeedsGrad({b});
    Record(
        is_max ? "MaximumBackward" : "MinimumBackward", {a, b}, out,
        [grad_a, grad_b, is_max, sa = p.a.detach(), sb = p.b.detach()](const Tensor& grad) {
          // 1/0 masks in the inputs' dtype (not bool: they are arithmetic here).
          const auto compare = [&](BinaryOp op) { return BinaryRaw(op, sa, sb, "maximum"); };
          const Tensor half_ties = mul(compare(BinaryOp::kEq), 0.5);
          const Tensor a_loses = compare(is_max ? BinaryOp::kLt : BinaryOp::kGt);
          const Tensor b_loses = compare(is_max ? BinaryOp::kGt : BinaryOp::kLt);
          const Tensor a_wins = 1.0 - add(a_loses, half_ties);
          const Tensor b_wins = 1.0 - add(b_loses, half_ties);
          return std::vector<Tensor>{grad_a ? sum_to(mul(grad, a_wins), sa.shape()) : Tensor(),
                                     grad_b ? sum_to(mul(grad, b_wins), sb.shape()) : Tensor()};
        },
        DoubleBackward::kSupported);
  }
  return out;
}

Tensor Compare(const Tensor& a, const Tensor& b, BinaryOp op, const char* name) {
  const Promoted p = PromoteBinary(a, b, name);
  return CompareRaw(op, p.a, p.b, name);
}

// PyTorch's categories for result_type: a zero-dimensional tensor wins only from a higher one.
int Category(DType t) { return t == kBool ? 0 : IsFloatingPoint(t) ? 2 : 1; }

}  // namespace

DType result_type(const Tensor& a, const Tensor& b) {
  CheckDefined(a, "result_type", "a");
  CheckDefined(b, "result_type", "b");
  if (a.dtype() == b.dtype()) return a.dtype();
  // PyTorch's rule: zero-dimensional tensors take part only when they are of a higher category
  // (floating over integral) than the dimensioned ones: float32 [3] with a float64 scalar
  // tensor stays float32, int64 [3] with a float64 scalar tensor becomes float64.
  if ((a.dim() == 0) == (b.dim() == 0)) return PromoteTypes(a.dtype(), b.dtype());
  const DType dimensioned = a.dim() > 0 ? a.dtype() : b.dtype();
  const DType zero_dim = a.dim() > 0 ? b.dtype() : a.dtype();
  if (Category(zero_dim) <= Category(dimensioned)) return dimensioned;
  return PromoteTypes(dimensioned, zero_dim);
}

Tensor maximum(const Tensor& a, const Tensor& b) { return MaxMin(a, b, true); }
Tensor minimum(const Tensor& a, const Tensor& b) { return MaxMin(a, b, false); }

Tensor add(const Tensor& a, double b) {
  CheckDefined(a, "add", "a");
  // An integral tensor keeps its dtype with an integral scalar and promotes otherwise.
  Tensor x = CastRaw(a, ScalarResultType(a.dtype(), b));
  Tensor out = UnaryRaw(UnaryOp::kAddScalar, x, b);
  if (NeedsGrad({a})) {
    Record(
        "AddScalarBackward", {a}, out, [](const Tensor& grad) { return std::vector<Tensor>{grad}; },
        DoubleBackward::kSupported);
  }
  return out;
}

Tensor mul(const Tensor& a, double b) {
  CheckDefined(a, "mul", "a");
  Tensor x = CastRaw(a, ScalarResultType(a.dtype(), b));
  Tensor out = UnaryRaw(UnaryOp::kMulScalar, x, b);
  if (NeedsGrad({a})) {
    Record(
        "MulScalarBackward", {a}, out,
        [b](const Tensor& grad) { return std::vector<Tensor>{mul(grad, b)}; },
        DoubleBackward::kSupported);
  }
  return out;
}

Tensor pow(const Tensor& a, double exponent) {
  TANDEM_AUTOCAST(kFloat32, pow, a, exponent);
  return FloatUnaryOp(a, UnaryOp::kPowScalar, exponent, "pow", "PowBackward",
                      [exponent](const Tensor& grad, const Tensor& x, const Tensor&) {
                        if (exponent == 0.0) return zeros_like(grad);
                        if (exponent == 1.0) return grad;
                        return mul(grad, mul(pow(x, exponent - 1.0), exponent));
                      });
}

Tensor neg(const Tensor& a) {
  CheckDefined(a, "neg", "input");
  TANDEM_CHECK(a.dtype() != kBool,
               "neg: negating a bool tensor is not supported (as in PyTorch); use "
               "logical_not for a bool tensor or convert it with .to(kInt64) first");
  Tensor out = UnaryRaw(UnaryOp::kNeg, a, 0.0);
  if (NeedsGrad({a})) {
    Record(
        "NegBackward", {a}, out, [](const Tensor& grad) { return std::vector<Tensor>{neg(grad)}; },
        DoubleBackward::kSupported);
  }
  return out;
}

Tensor exp(const Tensor& a) {
  TANDEM_AUTOCAST(kFloat32, exp, a);
  return FloatUnaryOp(
      a, UnaryOp::kExp, 0.0, "exp", "ExpBackward",
      [](const Tensor& grad, const Tensor&, const Tensor& y) { return mul(grad, SavedOutput(y)); });
}

Tensor log(const Tensor& a) {
  TANDEM_AUTOCAST(kFloat32, log, a);
  return FloatUnaryOp(
      a, UnaryOp::kLog, 0.0, "log", "LogBackward",
      [](const Tensor& grad, const Tensor& x, const Tensor&) { return div(grad, x); });
}

Tensor sqrt(const Tensor& a) {
  return FloatUnaryOp(a, UnaryOp::kSqrt, 0.0, "sqrt", "SqrtBackward",
                      [](const Tensor& grad, const Tensor&, const Tensor& y) {
                        return mul(div(grad, SavedOutput(y)), 0.5);
                      });
}

Tensor abs(const Tensor& a) {
  CheckDefined(a, "abs", "input");
  Tensor out = UnaryRaw(UnaryOp::kAbs, a, 0.0);
  if (NeedsGrad({a})) {
    Record(
        "AbsBackward", {a}, out,
        [x = a.detach()](const Tensor& grad) {
          // sign(x), with sign(0) = 0 as in PyTorch (1/0 masks in x's dtype).
          const Tensor zero = FilledRaw({}, x.dtype(), x.device(), 0.0);
          const Tensor sign = sub(BinaryRaw(BinaryOp::kGt, x, zero, "abs backward"),
                                  BinaryRaw(BinaryOp::kLt, x, zero, "abs backward"));
          return std::vector<Tensor>{mul(grad, sign)};
        },
        DoubleBackward::kSupported);
  }
  return out;
}

Tensor tanh(const Tensor& a) {
  return FloatUnaryOp(a, UnaryOp::kTanh, 0.0, "tanh", "TanhBackward",
                      [](const Tensor& grad, const Tensor&, const Tensor& y) {
                        if (CreatingGraph()) return mul(grad, 1.0 - square(SavedOutput(y)));
                        return BinaryRaw(BinaryOp::kTanhBackward, grad, y, "tanh backward");
                      });
}

Tensor sigmoid(const Tensor& a) {
  return FloatUnaryOp(a, UnaryOp::kSigmoid, 0.0, "sigmoid", "SigmoidBackward",
                      [](const Tensor& grad, const Tensor&, const Tensor& y) {
                        if (CreatingGraph()) {
                          const Tensor s = SavedOutput(y);
                          return mul(grad, mul(s, 1.0 - s));
                        }
                        return BinaryRaw(BinaryOp::kSigmoidBackward, grad, y, "sigmoid backward");
                      });
}

Tensor gelu(const Tensor& a, const std::string& approximate) {
  TANDEM_CHECK(approximate == "none" || approximate == "tanh",
               "gelu: approximate must be \"none\" (the exact erf form) or \"tanh\" but is \"",
               approximate, "\"");
  if (approximate == "tanh") {
    // One fused elementwise kernel each way (the formula composed is 8 ops with a pow).
    return FloatUnaryOp(a, UnaryOp::kGeluTanh, 0.0, "gelu", "GeluTanhBackward",
                        [](const Tensor& grad, const Tensor& x, const Tensor&) {
                          if (CreatingGraph()) {
                            // 0.5 (1 + t) + 0.5 x (1 - t^2) u', u = c (x + k x^3), t = tanh(u).
                            const double c = 0.7978845608028654, k = 0.044715;
                            const Tensor x2 = square(x);
                            const Tensor t = tanh(mul(add(x, mul(mul(x2, x), k)), c));
                            const Tensor du = mul(add(mul(x2, 3.0 * k), 1.0), c);
                            return mul(grad, add(mul(add(t, 1.0), 0.5),
                                                 mul(mul(x, 1.0 - square(t)), mul(du, 0.5))));
                          }
                          return BinaryRaw(BinaryOp::kGeluTanhBackward, grad, x, "gelu backward");
                        });
  }
  return FloatUnaryOp(a, UnaryOp::kGelu, 0.0, "gelu", "GeluBackward",
                      [](const Tensor& grad, const Tensor& x, const Tensor&) {
                        if (CreatingGraph()) return mul(grad, GeluDerivative(x));
                        return BinaryRaw(BinaryOp::kGeluBackward, grad, x, "gelu backward");
                      });
}

Tensor silu(const Tensor& a) {
  // One fused kernel each way, as PyTorch's: in 16 bits, x * sigmoid(x) as two ops would round
  // sigmoid(x) first, and its backward through mul and sigmoid three times more.
  return FloatUnaryOp(a, UnaryOp::kSilu, 0.0, "silu", "SiluBackward",
                      [](const Tensor& grad, const Tensor& x, const Tensor&) {
                        if (CreatingGraph()) {
                          // silu'(x) = s (1 + x (1 - s)), s = sigmoid(x).
                          const Tensor s = sigmoid(x);
                          return mul(grad, mul(s, add(mul(x, 1.0 - s), 1.0)));
                        }
                        return BinaryRaw(BinaryOp::kSiluBackward, grad, x, "silu backward");
                      });
}

Tensor square(const Tensor& a) {
  CheckDefined(a, "square", "input");
  // Integers square exactly by multiplication; bool squares to int64, as in PyTorch.
  const Tensor x = a.dtype() == kBool ? CastRaw(a, kInt64) : a;
  Tensor out = IsIntegral(x.dtype()) ? BinaryRaw(BinaryOp::kMul, x, x, "square")
                                     : UnaryRaw(UnaryOp::kSquare, x, 0.0);
  if (NeedsGrad({a})) {
    Record(
        "SquareBackward", {a}, out,
        [x = a](const Tensor& grad) { return std::vector<Tensor>{mul(grad, mul(x, 2.0))}; },
        DoubleBackward::kSupported);
  }
  return out;
}

Tensor relu(const Tensor& a) {
  CheckDefined(a, "relu", "input");
  TANDEM_CHECK(a.dtype() != kBool, "relu: not defined for bool tensors (as in PyTorch); ",
               "convert the input with .to(kFloat32) first");
  if (IsIntegral(a.dtype())) {
    return BinaryRaw(BinaryOp::kMaximum, a, FilledRaw({}, a.dtype(), a.device(), 0.0), "relu");
  }
  Tensor out = UnaryRaw(UnaryOp::kRelu, a, 0.0);
  if (NeedsGrad({a})) {
    Record(
        "ReluBackward", {a}, out,
        [y = out.detach()](const Tensor& grad) {
          // relu's output is positive exactly where its input is.
          if (CreatingGraph()) {
            // The mask is constant almost everywhere: the gradient is linear in grad.
            const Tensor zero = FilledRaw({}, y.dtype(), y.device(), 0.0);
            return std::vector<Tensor>{mul(grad, BinaryRaw(BinaryOp::kGt, y, zero, "relu"))};
          }
          return std::vector<Tensor>{BinaryRaw(BinaryOp::kReluBackward, grad, y, "relu backward")};
        },
        DoubleBackward::kSupported);
  }
  return out;
}

Tensor eq(const Tensor& a, const Tensor& b) { return Compare(a, b, BinaryOp::kEq, "eq"); }
Tensor ne(const Tensor& a, const Tensor& b) { return Compare(a, b, BinaryOp::kNe, "ne"); }
Tensor lt(const Tensor& a, const Tensor& b) { return Compare(a, b, BinaryOp::kLt, "lt"); }
Tensor le(const Tensor& a, const Tensor& b) { return Compare(a, b, BinaryOp::kLe, "le"); }
Tensor gt(const Tensor& a, const Tensor& b) { return Compare(a, b, BinaryOp::kGt, "gt"); }
Tensor ge(const Tensor& a, const Tensor& b) { return Compare(a, b, BinaryOp::kGe, "ge"); }

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator+(const Tensor& a, double b) { return add(a, b); }
Tensor operator-(const Tensor& a, double b) { return add(a, -b); }
Tensor operator*(const Tensor& a, double b) { return mul(a, b); }
// Multiplies by the reciprocal (exact for powers of two, within an ulp otherwise); an
// int64 tensor promotes to float32 unless 1/b is integral.
Tensor operator/(const Tensor& a, double b) {
  CheckDefined(a, "div", "a");
  return mul(FloatInput(a, "div"), 1.0 / b);
}
Tensor operator+(double a, const Tensor& b) { return add(b, a); }
Tensor operator-(double a, const Tensor& b) { return add(neg(b), a); }
Tensor operator*(double a, const Tensor& b) { return mul(b, a); }
Tensor operator-(const Tensor& a) { return neg(a); }

}  // namespace tandem
