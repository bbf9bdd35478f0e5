// Finite-difference gradient checks for differentiable ops, layers and losses.
//
// CheckGradients compares the gradients that autograd computes for
// L = sum(f(inputs) * R), with R a fixed random projection, against central finite
// differences of L, element by element, for every floating-point input that requires grad.
// Inputs may live on any device: f runs there, the comparison happens on the host.
//
//   Tensor x = randn({3, 4}, kFloat64).set_requires_grad(true);   // a leaf, so this is allowed
//   EXPECT_GRADIENTS_MATCH([](const std::vector<Tensor>& in) { return tanh(in[0]); }, {x});
//
// Check in float64 where you can (as PyTorch's gradcheck asks): it resolves a central
// difference to about 1e-10, so a wrong gradient cannot hide in the noise. Float32 resolves
// one to roughly 1e-4 of the output's magnitude, so keep float32 checks small (tens of
// elements per output), well scaled (values of order 1) and away from kinks (relu at 0, ties
// in max) by more than eps.
//
// CheckGradGradients is PyTorch's gradgradcheck: it checks the second derivatives that
// autograd computes under create_graph, by running CheckGradients on the first-order gradient
// (autograd::grad(f(x), x, v, create_graph)) as a function of x and of a random
// grad_output v. Use float64.
//
//   EXPECT_GRADGRADIENTS_MATCH([](const std::vector<Tensor>& in) { return tanh(in[0]); }, {x});
#ifndef TANDEM_TENSOR_GRADCHECK_H_
#define TANDEM_TENSOR_GRADCHECK_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace tandem {

struct GradCheckResult {
  bool ok = true;
  // Why the check failed: which input and element, the analytic and numeric values.
  std::string message;
  int64_t checked_elements = 0;
  int64_t mismatched_elements = 0;
  double max_abs_error = 0.0;  // largest |analytic - numeric| seen

  explicit operator bool() const { return ok; }
};

using GradCheckFunction = std::function<Tensor(const std::vector<Tensor>&)>;

// Checks autograd's gradients of `f` against central finite differences with step
// eps * max(1, |x|). An element passes when |analytic - numeric| <= atol + rtol * |numeric|.
// A negative eps, atol or rtol takes the default for the checked inputs' dtype: float64
// 1e-6, 1e-5, 1e-3 (PyTorch's), float32 1e-3, 1e-3, 1e-2 (any float32 input counts).
// The caller's tensors are not modified (their .grad included): f receives copies.
GradCheckResult CheckGradients(GradCheckFunction f, std::vector<Tensor> inputs, double eps = -1.0,
                               double atol = -1.0, double rtol = -1.0);

// Checks autograd's second derivatives of `f` (see above); the tolerances are
// CheckGradients', applied to the first-order gradient. A failure names the input of the
// gradient function: 0..n-1 are f's inputs, n is the random grad_output.
GradCheckResult CheckGradGradients(GradCheckFunction f, std::vector<Tensor> inputs,
                                   double eps = -1.0, double atol = -1.0, double rtol = -1.0);

}  // namespace tandem

// gtest helpers: EXPECT_GRADIENTS_MATCH(f, inputs[, eps, atol, rtol]). Include gtest first.
#define TANDEM_GRADIENTS_MATCH_IMPL_(check, ...)                            \
  do {                                                                      \
    const ::tandem::GradCheckResult tandem_gradcheck_result_ =              \
        ::tandem::CheckGradients(__VA_ARGS__);                              \
    check(tandem_gradcheck_result_.ok) << tandem_gradcheck_result_.message; \
  } while (false)
#define EXPECT_GRADIENTS_MATCH(...) TANDEM_GRADIENTS_MATCH_IMPL_(EXPECT_TRUE, __VA_ARGS__)
#define ASSERT_GRADIENTS_MATCH(...) TANDEM_GRADIENTS_MATCH_IMPL_(ASSERT_TRUE, __VA_ARGS__)
// EXPECT_GRADGRADIENTS_MATCH(f, inputs[, eps, atol, rtol]): CheckGradGradients.
#define TANDEM_GRADGRADIENTS_MATCH_IMPL_(check, ...)                        \
  do {                                                                      \
    const ::tandem::GradCheckResult tandem_gradcheck_result_ =              \
        ::tandem::CheckGradGradients(__VA_ARGS__);                          \
    check(tandem_gradcheck_result_.ok) << tandem_gradcheck_result_.message; \
  } while (false)
#define EXPECT_GRADGRADIENTS_MATCH(...) TANDEM_GRADGRADIENTS_MATCH_IMPL_(EXPECT_TRUE, __VA_ARGS__)
#define ASSERT_GRADGRADIENTS_MATCH(...) TANDEM_GRADGRADIENTS_MATCH_IMPL_(ASSERT_TRUE, __VA_ARGS__)

#endif  // TANDEM_TENSOR_GRADCHECK_H_
