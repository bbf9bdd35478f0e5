#include "tensor/gradcheck.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "tensor/base/error.h"
#include "tensor/core/autograd.h"
#include "tensor/tensor.h"

namespace tandem {
namespace {

constexpr int kMaxReportedMismatches = 5;
// Fixed so that a failing check fails the same way every run.
constexpr uint64_t kProjectionSeed = 0x6772616463686bULL;
constexpr uint64_t kGradOutputSeed = 0x67726164677261ULL;

std::vector<double> HostValues(const Tensor& t) {
  return t.detach().to(kFloat64).contiguous().to_vector<double>();
}

// The defaults for the dtype of the checked inputs (see gradcheck.h).
struct Tolerances {
  double eps, atol, rtol;
};
Tolerances DefaultTolerances(DType dtype) {
  if (dtype == kFloat64) return {1e-6, 1e-5, 1e-3};  // PyTorch's gradcheck defaults
  return {1e-3, 1e-3, 1e-2};
}

std::string ElementIndex(int64_t flat, const Shape& shape) {
  std::vector<int64_t> index(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    index[d] = flat % shape[d];
    flat /= shape[d];
  }
  std::ostringstream out;
  out << "(";
  for (size_t d = 0; d < index.size(); ++d) out << (d > 0 ? ", " : "") << index[d];
  out << ")";
  return out.str();
}

// f's output on the host, checked against the shape it had when the gradients were taken.
std::vector<double> Evaluate(const GradCheckFunction& f, const std::vector<Tensor>& inputs,
                             const Shape& expected_shape) {
  const Tensor y = f(inputs);
  TANDEM_CHECK(y.defined() && y.shape() == expected_shape, "CheckGradients: f returned ",
               y.defined() ? ShapeToString(y.shape()) : "undefined", " for perturbed inputs but ",
               ShapeToString(expected_shape),
               " before; f must be a deterministic function of its inputs");
  return HostValues(y);
}

}  // namespace

GradCheckResult CheckGradients(GradCheckFunction f, std::vector<Tensor> inputs, double eps,
                               double atol, double rtol) {
  TANDEM_CHECK(static_cast<bool>(f), "CheckGradients: f is empty");
  // Fresh leaves, so that the caller's tensors and their gradients stay untouched.
  std::vector<Tensor> leaves(inputs.size());
  std::vector<bool> checked(inputs.size(), false);
  bool any_checked = false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    TANDEM_CHECK(inputs[i].defined(), "CheckGradients: input ", i, " is an undefined Tensor");
    checked[i] = IsFloatingPoint(inputs[i].dtype()) && inputs[i].requires_grad();
    any_checked = any_checked || checked[i];
    leaves[i] = inputs[i];
    if (checked[i]) {
      leaves[i] = inputs[i].detach().clone();
      leaves[i].set_requires_grad(true);
    }
  }
  TANDEM_CHECK(any_checked,
               "CheckGradients: no input is a floating-point tensor that requires grad; call "
               "set_requires_grad(true) on the inputs whose gradients should be checked");
  // The coarsest checked dtype sets the defaults: one float32 input limits the precision.
  DType precision = kFloat64;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (checked[i] && inputs[i].dtype() == kFloat32) precision = kFloat32;
  }
  const Tolerances defaults = DefaultTolerances(precision);
  if (eps < 0.0) eps = defaults.eps;
  if (atol < 0.0) atol = defaults.atol;
  if (rtol < 0.0) rtol = defaults.rtol;
  TANDEM_CHECK(eps > 0.0, "CheckGradients: eps must be positive (or negative for the default) ",
               "but is ", eps);

  const Tensor output = f(leaves);
  TANDEM_CHECK(output.defined() && IsFloatingPoint(output.dtype()),
               "CheckGradients: f must return a defined floating-point tensor but returned ",
               output.defined() ? DTypeName(output.dtype()) : "an undefined tensor");
  const Shape output_shape = output.shape();
  Generator generator(kProjectionSeed);
  const Tensor projection =
      randn(output_shape, TensorOptions(output.device()).dtype(output.dtype()), &generator);
  const std::vector<double> weights = HostValues(projection);
  if (output.requires_grad()) sum(mul(output, projection)).backward();

  GradCheckResult result;
  std::ostringstream report;
  NoGradGuard no_grad;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!checked[i]) continue;
    const Shape& shape = inputs[i].shape();
    const Tensor grad = leaves[i].grad();
    if (grad.defined() && grad.shape() != shape) {
      result.ok = false;
      report << "input " << i << " is " << ShapeToString(shape) << " but its gradient is "
             << ShapeToString(grad.shape()) << "\n";
      continue;
    }
    const std::vector<double> analytic =
        grad.defined() ? HostValues(grad) : std::vector<double>(NumElements(shape), 0.0);

    std::vector<Tensor> probe = leaves;
    probe[i] = leaves[i].detach().clone().contiguous();
    const Tensor flat = probe[i].view({-1});
    const std::vector<double> original = HostValues(probe[i]);
    const bool single = probe[i].dtype() == kFloat32;
    // x rounded to the input's dtype, which is what the difference must be divided by.
    const auto in_dtype = [single](double x) {
      return single ? static_cast<double>(static_cast<float>(x)) : x;
    };
    for (int64_t j = 0; j < static_cast<int64_t>(original.size()); ++j) {
      const double x = original[j];
      const double step = in_dtype(eps * std::max(1.0, std::fabs(original[j])));
      const double plus = in_dtype(x + step), minus = in_dtype(x - step);
      Tensor element = flat.narrow(0, j, 1);
      element.fill_(plus);
      const std::vector<double> y_plus = Evaluate(f, probe, output_shape);
      element.fill_(minus);
      const std::vector<double> y_minus = Evaluate(f, probe, output_shape);
      element.fill_(x);
      // Differences first, then the projection: untouched outputs cancel exactly.
      double difference = 0.0;
      for (size_t k = 0; k < weights.size(); ++k) {
        difference += weights[k] * (y_plus[k] - y_minus[k]);
      }
      const double numeric = difference / (plus - minus);
      const double error = std::fabs(analytic[j] - numeric);
      ++result.checked_elements;
      if (!(error <= result.max_abs_error)) result.max_abs_error = error;
      if (!(error <= atol + rtol * std::fabs(numeric))) {
        result.ok = false;
        if (++result.mismatched_elements <= kMaxReportedMismatches) {
          report << "input " << i << " " << ShapeToString(shape) << " element "
                 << ElementIndex(j, shape) << ": analytic " << analytic[j] << ", numeric "
                 << numeric << " (|difference| " << error << " > atol " << atol << " + rtol "
                 << rtol << " * |numeric|)\n";
        }
      }
    }
  }
  if (!result.ok) {
    std::ostringstream message;
    message << "gradient check failed: " << result.mismatched_elements << " of "
            << result.checked_elements << " elements differ from finite differences (eps " << eps
            << ")\n"
            << report.str();
    if (result.mismatched_elements > kMaxReportedMismatches) {
      message << "... and " << result.mismatched_elements - kMaxReportedMismatches << " more\n";
    }
    result.message = message.str();
  }
  return result;
}

GradCheckResult CheckGradGradients(GradCheckFunction f, std::vector<Tensor> inputs, double eps,
                                   double atol, double rtol) {
  TANDEM_CHECK(static_cast<bool>(f), "CheckGradGradients: f is empty");
  std::vector<bool> checked(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    TANDEM_CHECK(inputs[i].defined(), "CheckGradGradients: input ", i, " is an undefined Tensor");
    checked[i] = IsFloatingPoint(inputs[i].dtype()) && inputs[i].requires_grad();
  }
  Tensor output;
  {
    NoGradGuard no_grad;
    output = f(inputs);
  }
  TANDEM_CHECK(output.defined() && IsFloatingPoint(output.dtype()),
               "CheckGradGradients: f must return a defined floating-point tensor");
  Generator generator(kGradOutputSeed);
  Tensor grad_output =
      randn(output.shape(), TensorOptions(output.device()).dtype(output.dtype()), &generator);
  grad_output.set_requires_grad(true);
  const size_t n = inputs.size();
  // The first-order gradients of f's checked inputs, flattened into one tensor. CheckGradients
  // calls this with leaves (their graph is what it differentiates) and, for finite
  // differences, with plain copies under no_grad: those become leaves here.
  GradCheckFunction first_order = [f, n, checked](const std::vector<Tensor>& in) {
    AutoGradMode grad_mode(true);
    std::vector<Tensor> x(in.begin(), in.begin() + static_cast<int64_t>(n));
    std::vector<Tensor> wrt;
    for (size_t i = 0; i < n; ++i) {
      if (!checked[i]) continue;
      if (!x[i].requires_grad()) {
        x[i] = x[i].detach();
        x[i].set_requires_grad(true);
      }
      wrt.push_back(x[i]);
    }
    const Tensor y = f(x);
    std::vector<Tensor> pieces;
    if (!y.requires_grad()) {  // f ignores its inputs: every gradient is zero
      for (const Tensor& t : wrt)
        pieces.push_back(zeros({t.numel()}, TensorOptions(t.device()).dtype(t.dtype())));
      return cat(pieces);
    }
    const std::vector<Tensor> grads = autograd::grad({y}, wrt, {in[n]}, /*create_graph=*/true,
                                                     /*retain_graph=*/true, /*allow_unused=*/true);
    for (size_t i = 0; i < grads.size(); ++i) {
      pieces.push_back(
          grads[i].defined()
              ? grads[i].reshape({-1})
              : zeros({wrt[i].numel()}, TensorOptions(wrt[i].device()).dtype(wrt[i].dtype())));
    }
    return cat(pieces);
  };
  inputs.push_back(grad_output);
  return CheckGradients(first_order, std::move(inputs), eps, atol, rtol);
}

}  // namespace tandem
