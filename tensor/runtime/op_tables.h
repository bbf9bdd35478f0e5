// The elementwise and reduction ops of the Backend interface (Backend::Unary, Binary, Reduce),
// each written once as a row of an X-macro table: the enums, their names, their properties,
// the backends' dispatch switches and the tests' op lists all expand these tables, so that no
// list of ops is written twice and no kernel or test can forget an op.
//
// Note [Adding an elementwise op]: a unary op is its row in TANDEM_FORALL_UNARY_OPS (enum
// name, printable name, property flags) and its math, UnaryMath(UnaryTag<UnaryOp::kName>, x,
// s) in tensor/kernels/internal/elementwise_math.h. The CPU and CUDA kernels instantiate that
// function through the generated switch, and the backends' tests check every row against the
// same function in double. A binary op is likewise its row and its BinaryMath (or, for a
// comparison, its Compare). Append new rows: the enums' values follow the rows' order.
//
//   #define MY_NAME(name, text, flags) case UnaryOp::k##name: return text;
//   switch (op) { TANDEM_FORALL_UNARY_OPS(MY_NAME) }
//   #undef MY_NAME
//   if (OpFlags(op) & kOpTranscendental) { ... }  // or the predicates below
#ifndef TANDEM_TENSOR_RUNTIME_OP_TABLES_H_
#define TANDEM_TENSOR_RUNTIME_OP_TABLES_H_

#include <cstdint>
#include <vector>

namespace tandem {

// The properties a row of a table may carry, or'ed together (0: none).
// Unary and binary ops:
inline constexpr unsigned kOpTranscendental = 1u << 0;  // costly per element (libm calls)
inline constexpr unsigned kOpRejectsBool = 1u << 1;     // PyTorch refuses it on bool tensors
// Unary ops:
inline constexpr unsigned kOpIntegers = 1u << 2;        // also on integer and bool dtypes
inline constexpr unsigned kOpPositiveDomain = 1u << 3;  // real-valued on x > 0 only
// Binary ops:
inline constexpr unsigned kOpComparison = 1u << 4;    // 1 or 0, or true/false into bool
inline constexpr unsigned kOpFloatingOnly = 1u << 5;  // floating dtypes only
// Reductions:
inline constexpr unsigned kOpArg = 1u << 6;  // writes int64 indices instead of values
inline constexpr unsigned kOpMax = 1u << 7;  // keeps the largest (NaN wins)
inline constexpr unsigned kOpMin = 1u << 8;  // keeps the smallest (NaN wins)

// Elementwise functions of one input and an optional scalar parameter `s`.
// Floating types (float32, float64, bfloat16, float16: the 16-bit ones are loaded as float,
// computed in float with `s` as float, and rounded once when stored); the kOpIntegers rows
// also accept int64, int32, uint8 and bool (computed in int64, converted back: uint8 wraps,
// bool is "nonzero"), except the kOpRejectsBool rows on bool, which PyTorch rejects.
// _(enum name, printable name, flags)
#define TANDEM_FORALL_UNARY_OPS(_)                                                       \
  _(Neg, "neg", kOpIntegers | kOpRejectsBool)          /* -x */                          \
  _(Exp, "exp", kOpTranscendental)                     /* e^x */                         \
  _(Log, "log", kOpTranscendental | kOpPositiveDomain) /* ln x */                        \
  _(Relu, "relu", 0)                                   /* max(x, 0) */                   \
  _(Sqrt, "sqrt", kOpTranscendental | kOpPositiveDomain)                                 \
  _(Abs, "abs", kOpIntegers)                                                             \
  _(Tanh, "tanh", kOpTranscendental)                                                     \
  _(Sigmoid, "sigmoid", kOpTranscendental)                          /* 1 / (1 + e^-x) */ \
  _(Square, "square", 0)                                            /* x * x */          \
  _(AddScalar, "add_scalar", kOpIntegers)                           /* x + s */          \
  _(MulScalar, "mul_scalar", kOpIntegers)                           /* x * s */          \
  _(PowScalar, "pow_scalar", kOpTranscendental | kOpPositiveDomain) /* x^s */            \
  _(GeScalar, "ge_scalar", 0)                                       /* x >= s ? 1 : 0 */ \
  /* x * Phi(x) = x / 2 * (1 + erf(x / sqrt 2)), and its derivative */                   \
  _(Gelu, "gelu", kOpTranscendental)                                                     \
  _(GeluDerivative, "gelu_derivative", kOpTranscendental)                                \
  /* GELU's tanh approximation (gelu(x, approximate="tanh")), with */                    \
  /* u = sqrt(2 / pi) * (x + 0.044715 x^3): 0.5 x (1 + tanh u), and its */               \
  /* derivative */                                                                       \
  _(GeluTanh, "gelu_tanh", kOpTranscendental)                                            \
  _(GeluTanhDerivative, "gelu_tanh_derivative", kOpTranscendental)                       \
  /* x * sigmoid(x) = x / (1 + e^-x), one rounding (PyTorch's fused silu) */             \
  _(Silu, "silu", kOpTranscendental)                                                     \
  _(Erf, "erf", kOpTranscendental) /* the error function */

// Elementwise functions of two inputs of the same dtype (any dtype), written to a dst of that
// dtype; the 16-bit floats compute in float and round once. The comparisons give 1 or 0 in
// that dtype, or true/false into a kBool dst. On bool, as in PyTorch: kAdd is or, kMul and,
// kMaximum/kMinimum or/and; the kOpRejectsBool rows are rejected.
// _(enum name, printable name, flags)
#define TANDEM_FORALL_BINARY_OPS(_)                                                               \
  _(Add, "add", 0)                                                                                \
  _(Sub, "sub", kOpRejectsBool)                                                                   \
  _(Mul, "mul", 0)                                                                                \
  _(Div, "div", kOpRejectsBool)                                                                   \
  _(Maximum, "maximum", 0)                                                                        \
  _(Minimum, "minimum", 0)                                                                        \
  _(Eq, "eq", kOpComparison)                                                                      \
  _(Ne, "ne", kOpComparison)                                                                      \
  _(Lt, "lt", kOpComparison)                                                                      \
  _(Le, "le", kOpComparison)                                                                      \
  _(Gt, "gt", kOpComparison)                                                                      \
  _(Ge, "ge", kOpComparison)                                                                      \
  /* 0 if b <= 0 else a (a: incoming gradient, b: relu output; NaN passes) */                     \
  _(ReluBackward, "relu_backward", kOpRejectsBool)                                                \
  /* The other activations' backward, a: incoming gradient. Fused so that a 16-bit */             \
  /* gradient is the float formula rounded once, as PyTorch's *_backward kernels. */              \
  /* a * (1 - b^2), b: tanh output */                                                             \
  _(TanhBackward, "tanh_backward", kOpFloatingOnly | kOpRejectsBool)                              \
  /* a * (1 - b) * b, b: sigmoid output */                                                        \
  _(SigmoidBackward, "sigmoid_backward", kOpFloatingOnly | kOpRejectsBool)                        \
  /* a * gelu'(b), b: gelu input (exact erf form) */                                              \
  _(GeluBackward, "gelu_backward", kOpFloatingOnly | kOpRejectsBool | kOpTranscendental)          \
  /* a * gelu_tanh'(b), b: gelu input (tanh approximation) */                                     \
  _(GeluTanhBackward, "gelu_tanh_backward", kOpFloatingOnly | kOpRejectsBool | kOpTranscendental) \
  /* a * s (1 + b (1 - s)), s = sigmoid(b), b: silu input */                                      \
  _(SiluBackward, "silu_backward", kOpFloatingOnly | kOpRejectsBool | kOpTranscendental)

// Reductions over the middle axis (named Kind, not Op: ReduceOp is the collectives' enum,
// parallel/distributed/process_group.h) of a contiguous [outer, reduce, inner] input into a
// contiguous [outer, inner] output. The kOpArg rows write int64 indices; the others keep the
// input's dtype. Ties in arg reductions pick the first index, as PyTorch does; NaN wins
// max/min/argmax/argmin in every floating type. Sums accumulate in double for every floating
// type (the 16-bit floats round once, from it) and in int64 for the integers and bool, then
// convert to the input's dtype (uint8 wraps, bool is "any"): the ops layer widens integer
// sums to int64 first, as PyTorch's sum does.
// _(enum name, printable name, flags)
#define TANDEM_FORALL_REDUCE_KINDS(_)  \
  _(Sum, "sum", 0)                     \
  _(Max, "max", kOpMax)                \
  _(Min, "min", kOpMin)                \
  _(ArgMax, "argmax", kOpArg | kOpMax) \
  _(ArgMin, "argmin", kOpArg | kOpMin)

#define TANDEM_OP_TABLE_ENUMERATOR(name, text, flags) k##name,
enum class UnaryOp : int8_t { TANDEM_FORALL_UNARY_OPS(TANDEM_OP_TABLE_ENUMERATOR) };
enum class BinaryOp : int8_t { TANDEM_FORALL_BINARY_OPS(TANDEM_OP_TABLE_ENUMERATOR) };
enum class ReduceKind : int8_t { TANDEM_FORALL_REDUCE_KINDS(TANDEM_OP_TABLE_ENUMERATOR) };
#undef TANDEM_OP_TABLE_ENUMERATOR

#define TANDEM_OP_TABLE_COUNT(name, text, flags) +1
inline constexpr int kNumUnaryOps = 0 TANDEM_FORALL_UNARY_OPS(TANDEM_OP_TABLE_COUNT);
inline constexpr int kNumBinaryOps = 0 TANDEM_FORALL_BINARY_OPS(TANDEM_OP_TABLE_COUNT);
inline constexpr int kNumReduceKinds = 0 TANDEM_FORALL_REDUCE_KINDS(TANDEM_OP_TABLE_COUNT);
#undef TANDEM_OP_TABLE_COUNT

// Every op of a table, in its order: for loops over all of them, as the tests do.
inline std::vector<UnaryOp> AllUnaryOps() {
#define TANDEM_OP_TABLE_ENTRY(name, text, flags) UnaryOp::k##name,
  return {TANDEM_FORALL_UNARY_OPS(TANDEM_OP_TABLE_ENTRY)};
#undef TANDEM_OP_TABLE_ENTRY
}
inline std::vector<BinaryOp> AllBinaryOps() {
#define TANDEM_OP_TABLE_ENTRY(name, text, flags) BinaryOp::k##name,
  return {TANDEM_FORALL_BINARY_OPS(TANDEM_OP_TABLE_ENTRY)};
#undef TANDEM_OP_TABLE_ENTRY
}
inline std::vector<ReduceKind> AllReduceKinds() {
#define TANDEM_OP_TABLE_ENTRY(name, text, flags) ReduceKind::k##name,
  return {TANDEM_FORALL_REDUCE_KINDS(TANDEM_OP_TABLE_ENTRY)};
#undef TANDEM_OP_TABLE_ENTRY
}

// The printable name and the flags of a row, for any of the three enums.
#define TANDEM_OP_TABLE_NAME_CASE(Enum, name, text) \
  case Enum::k##name:                               \
    return text;
#define TANDEM_OP_TABLE_FLAGS_CASE(Enum, name, flags) \
  case Enum::k##name:                                 \
    return (flags);
#define TANDEM_UNARY_NAME(name, text, flags) TANDEM_OP_TABLE_NAME_CASE(UnaryOp, name, text)
#define TANDEM_UNARY_FLAGS(name, text, flags) TANDEM_OP_TABLE_FLAGS_CASE(UnaryOp, name, flags)
#define TANDEM_BINARY_NAME(name, text, flags) TANDEM_OP_TABLE_NAME_CASE(BinaryOp, name, text)
#define TANDEM_BINARY_FLAGS(name, text, flags) TANDEM_OP_TABLE_FLAGS_CASE(BinaryOp, name, flags)
#define TANDEM_REDUCE_NAME(name, text, flags) TANDEM_OP_TABLE_NAME_CASE(ReduceKind, name, text)
#define TANDEM_REDUCE_FLAGS(name, text, flags) TANDEM_OP_TABLE_FLAGS_CASE(ReduceKind, name, flags)

inline constexpr const char* OpName(UnaryOp op) {
  switch (op) { TANDEM_FORALL_UNARY_OPS(TANDEM_UNARY_NAME) }
  return "unknown unary op";
}
inline constexpr const char* OpName(BinaryOp op) {
  switch (op) { TANDEM_FORALL_BINARY_OPS(TANDEM_BINARY_NAME) }
  return "unknown binary op";
}
inline constexpr const char* OpName(ReduceKind op) {
  switch (op) { TANDEM_FORALL_REDUCE_KINDS(TANDEM_REDUCE_NAME) }
  return "unknown reduction";
}
inline constexpr unsigned OpFlags(UnaryOp op) {
  switch (op) { TANDEM_FORALL_UNARY_OPS(TANDEM_UNARY_FLAGS) }
  return 0;
}
inline constexpr unsigned OpFlags(BinaryOp op) {
  switch (op) { TANDEM_FORALL_BINARY_OPS(TANDEM_BINARY_FLAGS) }
  return 0;
}
inline constexpr unsigned OpFlags(ReduceKind op) {
  switch (op) { TANDEM_FORALL_REDUCE_KINDS(TANDEM_REDUCE_FLAGS) }
  return 0;
}

#undef TANDEM_UNARY_NAME
#undef TANDEM_UNARY_FLAGS
#undef TANDEM_BINARY_NAME
#undef TANDEM_BINARY_FLAGS
#undef TANDEM_REDUCE_NAME
#undef TANDEM_REDUCE_FLAGS
#undef TANDEM_OP_TABLE_NAME_CASE
#undef TANDEM_OP_TABLE_FLAGS_CASE

// The properties as predicates (constexpr: usable in `if constexpr` on a dispatched op).
inline constexpr bool IsTranscendental(UnaryOp op) { return OpFlags(op) & kOpTranscendental; }
inline constexpr bool IsTranscendental(BinaryOp op) { return OpFlags(op) & kOpTranscendental; }
inline constexpr bool UnarySupportsIntegers(UnaryOp op) { return OpFlags(op) & kOpIntegers; }
// The older name, for int64 (the same subset).
inline constexpr bool UnarySupportsInt64(UnaryOp op) { return UnarySupportsIntegers(op); }
inline constexpr bool HasPositiveDomain(UnaryOp op) { return OpFlags(op) & kOpPositiveDomain; }
// The ops PyTorch refuses on bool tensors: every backend checks these, so that all refuse the
// same calls.
inline constexpr bool RejectsBool(UnaryOp op) { return OpFlags(op) & kOpRejectsBool; }
inline constexpr bool RejectsBool(BinaryOp op) { return OpFlags(op) & kOpRejectsBool; }
inline constexpr bool IsComparison(BinaryOp op) { return OpFlags(op) & kOpComparison; }
inline constexpr bool BinaryIsFloatingOnly(BinaryOp op) { return OpFlags(op) & kOpFloatingOnly; }
inline constexpr bool IsArgReduction(ReduceKind op) { return OpFlags(op) & kOpArg; }

}  // namespace tandem

#endif  // TANDEM_TENSOR_RUNTIME_OP_TABLES_H_
