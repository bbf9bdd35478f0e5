// Logical ops (logical_not/and/or/xor, any, all) and allclose.
#include <cmath>
#include <cstdint>
#include <vector>

#include "tensor/core/tensor.h"
#include "tensor/ops/internal/op_helpers.h"
#include "tensor/ops/ops.h"
#include "tensor/runtime/backend.h"

namespace tandem {

Tensor logical_not(const Tensor& a) {
  CheckDefined(a, "logical_not", "input");
  return CompareRaw(BinaryOp::kEq, a, FilledRaw({}, a.dtype(), a.device(), 0.0), "logical_not");
}

namespace {

// a and b as bool (nonzero is true), then combined as uint8 0/1 by `op` (kMinimum: and,
// kMaximum: or, kNe: xor).
Tensor LogicalBinary(const Tensor& a, const Tensor& b, BinaryOp op, const char* name) {
  CheckDefined(a, name, "a");
  CheckDefined(b, name, "b");
  CheckSameDevice(a, "a", b, "b", name);
  const Tensor x = CastRaw(CastRaw(a, kBool), kUInt8);
  const Tensor y = CastRaw(CastRaw(b, kBool), kUInt8);
  return CastRaw(BinaryRaw(op, x, y, name), kBool);
}

// Whether any element along `dims` is nonzero: the count of nonzero elements (int64, so it
// cannot wrap) compared with zero. Empty reductions give false, as in PyTorch.
Tensor AnyRaw(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim, const char* name) {
  const std::vector<int64_t> reduced = NormalizeDims(dims, a.dim(), name);
  const Tensor count =
      ReduceRaw(CastRaw(CastRaw(a, kBool), kInt64), reduced, ReduceKind::kSum, name);
  const Tensor kept = keepdim ? count : ViewRaw(count, ReducedShape(a.shape(), reduced, false));
  return CompareRaw(BinaryOp::kNe, kept, FilledRaw({}, kInt64, a.device(), 0.0), name);
}

}  // namespace

Tensor logical_and(const Tensor& a, const Tensor& b) {
  return LogicalBinary(a, b, BinaryOp::kMinimum, "logical_and");
}
Tensor logical_or(const Tensor& a, const Tensor& b) {
  return LogicalBinary(a, b, BinaryOp::kMaximum, "logical_or");
}
Tensor logical_xor(const Tensor& a, const Tensor& b) {
  return LogicalBinary(a, b, BinaryOp::kNe, "logical_xor");
}

Tensor any(const Tensor& a) {
  CheckDefined(a, "any", "input");
  return ViewRaw(AnyRaw(a, {}, false, "any"), {});
}
Tensor any(const Tensor& a, int64_t dim, bool keepdim) {
  CheckDefined(a, "any", "input");
  return AnyRaw(a, {dim}, keepdim, "any");
}
// all(a) = not any(not a).
Tensor all(const Tensor& a) {
  CheckDefined(a, "all", "input");
  return logical_not(any(logical_not(a)));
}
Tensor all(const Tensor& a, int64_t dim, bool keepdim) {
  CheckDefined(a, "all", "input");
  return logical_not(any(logical_not(a), dim, keepdim));
}

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol) {
  CheckDefined(a, "allclose", "a");
  CheckDefined(b, "allclose", "b");
  if (a.shape() != b.shape()) return false;
  const auto host_values = [](const Tensor& t) {
    return t.detach().to(Device::Cpu()).to(kFloat64).contiguous().to_vector<double>();
  };
  const std::vector<double> x = host_values(a), y = host_values(b);
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i] == y[i]) continue;  // equal infinities included
    if (!std::isfinite(x[i]) || !std::isfinite(y[i])) return false;
    if (!(std::fabs(x[i] - y[i]) <= atol + rtol * std::fabs(y[i]))) return false;
  }
  return true;
}

}  // namespace tandem
