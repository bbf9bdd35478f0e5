// Printing tensors as PyTorch does: Tensor::ToString and operator<<.
#include <algorithm>
#include <cstdint>
#include <iomanip>
#include <ostream>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "tensor/core/autograd.h"
#include "tensor/core/tensor.h"

namespace tandem {

namespace {

constexpr int64_t kSummaryThreshold = 1000;
constexpr int64_t kEdgeItems = 3;

// One element as PyTorch prints it: floating types with 4 decimals (16-bit floats by their
// exact value, widened to float), bool as True/False, integers as they are (uint8 as a
// number, not a character).
void FormatElement(std::ostream& out, const Tensor& host, int64_t at) {
  DispatchDType(host.dtype(), "print", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T value = host.data<T>()[at];
    if constexpr (std::is_same_v<T, bool>) {
      out << (value ? "True" : "False");
    } else if constexpr (std::is_floating_point_v<T> || kIsReducedFloat<T>) {
      out << std::fixed << std::setprecision(4) << static_cast<OpMath<T>>(value);
    } else {
      out << static_cast<int64_t>(value);
    }
  });
}

void FormatRecursive(std::ostringstream& out, const Tensor& t, int64_t d, int64_t offset,
                     const std::vector<int64_t>& strides, int indent, int width, bool summarise) {
  const int64_t n = t.shape()[d];
  out << "[";
  const bool last = d == t.dim() - 1;
  for (int64_t i = 0; i < n; ++i) {
    if (summarise && n > 2 * kEdgeItems && i == kEdgeItems) {
      out << (last ? "..., " : "...,\n" + std::string(indent + 1, ' '));
      i = n - kEdgeItems - 1;
      continue;
    }
    const int64_t at = offset + i * strides[d];
    if (last) {
      out << std::setw(width);
      FormatElement(out, t, at);
    } else {
      FormatRecursive(out, t, d + 1, at, strides, indent + 1, width, summarise);
    }
    if (i + 1 < n) {
      // PyTorch separates rows by a newline and deeper blocks by one more blank line.
      const int blank_lines = static_cast<int>(t.dim() - d - 2);
      out << (last ? ", " : ",\n" + std::string(blank_lines, '\n') + std::string(indent + 1, ' '));
    }
  }
  out << "]";
}

std::string FormatElements(const Tensor& host) {
  std::ostringstream out;
  if (host.dim() == 0) {
    FormatElement(out, host, 0);
    return out.str();
  }
  if (host.numel() == 0) return "[]";
  int width = 1;
  for (int64_t i = 0; i < host.numel(); ++i) {
    std::ostringstream cell;
    FormatElement(cell, host, i);
    width = std::max<int>(width, static_cast<int>(cell.str().size()));
  }
  FormatRecursive(out, host, 0, 0, host.strides(), /*indent=*/7, width,
                  host.numel() > kSummaryThreshold);
  return out.str();
}

}  // namespace

std::string Tensor::ToString() const {
  if (!defined()) return "tensor(undefined)";
  Tensor host = detach().to(Device::Cpu(0)).contiguous();
  std::string text = "tensor(" + FormatElements(host);
  if (device() != Device::Cpu(0)) text += ", device='" + device().ToString() + "'";
  // PyTorch names the dtype unless the printed values imply it: float32 (the default),
  // int64 (integers) and bool (True/False).
  if (dtype() != kFloat32 && dtype() != kInt64 && dtype() != kBool) {
    text += std::string(", dtype=") + DTypeName(dtype());
  }
  if (grad_fn()) {
    text += ", grad_fn=<" + grad_fn()->name() + ">";
  } else if (requires_grad()) {
    text += ", requires_grad=True";
  }
  return text + ")";
}

std::ostream& operator<<(std::ostream& out, const Tensor& tensor) {
  return out << tensor.ToString();
}

}  // namespace tandem
