// Operations on tensors, differentiable where it makes sense. All inputs of one op must be
// on the same device (move them with to() first); the result is on that device.
// Elementwise binary ops broadcast as NumPy and PyTorch do and compute in result_type (int64
// with float32 gives float32, int32 with float16 gives float16, bool with anything gives the
// other). Every floating op takes float32, float64, bfloat16 and float16; 16-bit inputs are
// computed in float and rounded once per result (reductions and products accumulate in float).
//
//   Tensor logits = linear(x, weight, bias);             // x [B, in], weight [out, in]
//   Tensor loss = cross_entropy(logits, labels);         // labels int64 [B]
//   Tensor correct = eq(argmax(logits, 1), labels);      // bool [B]
//   Tensor accuracy = correct.to(kFloat32).mean();       // or sum(correct): int64
//
// Included by tensor/tensor.h; include that instead.
#ifndef TANDEM_TENSOR_OPS_OPS_H_
#define TANDEM_TENSOR_OPS_OPS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tensor/base/dtype.h"

namespace tandem {

class Tensor;
class Generator;

// ---- Elementwise -------------------------------------------------------------------------
// The dtype that a binary op of `a` and `b` computes in, as torch.result_type: the promoted
// dtype (tensor/base/dtype.h's PromoteTypes), except that a zero-dimensional tensor only counts
// when it is floating and the other is not (float32 [3] + float64 [] stays float32).
DType result_type(const Tensor& a, const Tensor& b);
// Binary ops compute in result_type(a, b), with broadcasting. As in PyTorch, sub and neg
// refuse bool tensors, and add/mul of two bool tensors are bool (or, and).
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);  // integral inputs promote to float32
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
// With a scalar: a floating tensor keeps its dtype; an integral one keeps it with a whole
// number and becomes float32 otherwise; bool becomes int64 (float32 for a fraction).
Tensor add(const Tensor& a, double b);
Tensor mul(const Tensor& a, double b);
Tensor pow(const Tensor& a, double exponent);
Tensor neg(const Tensor& a);
Tensor exp(const Tensor& a);
Tensor log(const Tensor& a);
Tensor sqrt(const Tensor& a);
Tensor abs(const Tensor& a);
Tensor tanh(const Tensor& a);
Tensor sigmoid(const Tensor& a);
Tensor square(const Tensor& a);
Tensor relu(const Tensor& a);
// x * Phi(x) (Phi: the standard normal CDF), exactly with erf; approximate = "tanh" gives
// 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), as torch.nn.functional.gelu.
Tensor gelu(const Tensor& a, const std::string& approximate = "none");
// x * sigmoid(x), PyTorch's silu (swish), the gate of SwiGLU feed-forward blocks.
Tensor silu(const Tensor& a);

// Comparisons (not differentiable), computed in result_type(a, b): bool tensors, true where
// the relation holds (NaN compares false except for ne), as PyTorch's.
//   Tensor positive = gt(x, zeros({}));                    // bool
//   Tensor relu_like = mul(x, positive);                   // bool promotes to x's dtype
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);

// Logical ops: any dtype, nonzero is true (NaN too); bool results.
Tensor logical_not(const Tensor& a);
Tensor logical_and(const Tensor& a, const Tensor& b);
Tensor logical_or(const Tensor& a, const Tensor& b);
Tensor logical_xor(const Tensor& a, const Tensor& b);
// Whether any / every element (along `dim`) is nonzero, as a bool tensor; over no elements
// any is false and all is true.
//   if (any(isnan_mask).item<bool>()) ...
Tensor any(const Tensor& a);
Tensor any(const Tensor& a, int64_t dim, bool keepdim = false);
Tensor all(const Tensor& a);
Tensor all(const Tensor& a, int64_t dim, bool keepdim = false);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, double b);
Tensor operator-(const Tensor& a, double b);
Tensor operator*(const Tensor& a, double b);
Tensor operator/(const Tensor& a, double b);
Tensor operator+(double a, const Tensor& b);
Tensor operator-(double a, const Tensor& b);
Tensor operator*(double a, const Tensor& b);
Tensor operator-(const Tensor& a);

// ---- Reductions ----------------------------------------------------------------------
// Sums keep a floating dtype and give int64 for integral and bool inputs (PyTorch's sum).
Tensor sum(const Tensor& a);  // all elements, 0-dim result
Tensor sum(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim = false);
// Floating inputs only (an integral input is an error, as in PyTorch: convert it first).
Tensor mean(const Tensor& a);
Tensor mean(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor amax(const Tensor& a, int64_t dim, bool keepdim = false);    // differentiable
Tensor argmax(const Tensor& a, int64_t dim, bool keepdim = false);  // int64
Tensor argmin(const Tensor& a, int64_t dim, bool keepdim = false);  // int64
// Sums `a` over broadcast dimensions down to `shape` (the adjoint of expand).
Tensor sum_to(const Tensor& a, const std::vector<int64_t>& shape);

// ---- Neural-network functions --------------------------------------------------------
Tensor softmax(const Tensor& a, int64_t dim);
Tensor log_softmax(const Tensor& a, int64_t dim);
// torch.matmul: 1-D x 1-D is a dot product (0-dim), a 1-D operand is a row (left) or a
// column (right) vector whose dimension is dropped afterwards, 2-D x 2-D is a matrix
// product, and beyond that the leading (batch) dimensions broadcast:
//   matmul([j, 1, n, m], [k, m, p]) is [j, k, n, p].
Tensor matmul(const Tensor& a, const Tensor& b);
// x [*, in] · weight[out, in]^T + bias[out].
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias);
// gelu(linear(x, weight, bias), approximate), which a backend may compute in one GEMM: with
// approximate "tanh" and a bias, CUDA fuses the bias and the GELU into cuBLASLt's epilogue
// (Note [cuBLASLt epilogues]) and keeps the pre-activation for the backward, under autocast too
// (float32 parameters, as linear's); elsewhere (the CPU, float64, "none") it is the two ops
// composed. Same values within the GEMM's rounding; differentiable to any order (under
// create_graph the backward recomputes through the composed ops).
Tensor linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias,
                   const std::string& approximate = "none");
// A transformer's MLP, linear(linear_gelu(x, fc_weight, fc_bias, "tanh"), proj_weight,
// proj_bias) (proj_bias may be undefined), as one op so that CUDA computes the gradient through
// proj and the GELU, and fc's bias gradient, in one cuBLASLt GEMM (DGELU_BGRAD; Note [Fused MLP]):
// one pass over the [*, hidden] activations fewer per backward. Same values within the GEMMs'
// rounding, under autocast too; elsewhere (the CPU, float64) the ops composed.
//   Tensor y = linear_gelu_linear(x, fc->weight(), fc->bias(), proj->weight(), proj->bias());
Tensor linear_gelu_linear(const Tensor& x, const Tensor& fc_weight, const Tensor& fc_bias,
                          const Tensor& proj_weight, const Tensor& proj_bias);
// Mean negative log-likelihood of int64 class targets [N] under log-probabilities [N, C].
Tensor nll_loss(const Tensor& log_probs, const Tensor& targets);
// log_softmax + nll_loss, numerically stable.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets);
Tensor mse_loss(const Tensor& input, const Tensor& target);  // mean reduction
// NCHW input, weight [out, in / groups, kh, kw], optional bias [out] (undefined Tensor for
// none). Kernel taps are `dilation` pixels apart. With groups > 1, in and out split into that
// many groups (both must divide), output group g seeing only input group g.
Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias,
              std::vector<int64_t> stride = {1, 1}, std::vector<int64_t> padding = {0, 0},
              std::vector<int64_t> dilation = {1, 1}, int64_t groups = 1);
// Stride defaults to the kernel size, as in PyTorch. ceil_mode rounds the output size up
// (a last, partial window), but a window must start inside the input or its left padding.
Tensor max_pool2d(const Tensor& input, std::vector<int64_t> kernel_size,
                  std::vector<int64_t> stride = {}, std::vector<int64_t> padding = {0, 0},
                  bool ceil_mode = false);
// Mean over each window, as torch.nn.functional.avg_pool2d: padding counts as zeros in the
// divisor when count_include_pad (the window clipped to the padded input), else the divisor
// is the number of pixels of the window inside the input.
Tensor avg_pool2d(const Tensor& input, std::vector<int64_t> kernel_size,
                  std::vector<int64_t> stride = {}, std::vector<int64_t> padding = {0, 0},
                  bool ceil_mode = false, bool count_include_pad = true);
// Mean over the windows that split each H x W image into output_size (h, w) cells:
// cell i covers rows [floor(i * H / h), ceil((i + 1) * H / h)), likewise columns.
Tensor adaptive_avg_pool2d(const Tensor& input, std::vector<int64_t> output_size);
// Zeroes elements with probability p and scales the rest by 1/(1-p) when training;
// the identity otherwise.
Tensor dropout(const Tensor& input, double p, bool training, Generator* gen = nullptr);

// ---- Normalisation and triangles (fused kernels) ----------------------------------------
// torch.nn.functional.layer_norm: normalises over the last dimensions (normalized_shape must
// equal them), y = (x - mean) / sqrt(var + eps) * weight + bias with the biased variance;
// weight and bias (of shape normalized_shape) may be undefined Tensor()s. One kernel forward
// and one backward (statistics in float for the 16-bit floats); float32 under autocast.
//   Tensor y = layer_norm(x, {768}, gamma, beta, 1e-5);   // x [B, T, 768]
Tensor layer_norm(const Tensor& input, const std::vector<int64_t>& normalized_shape,
                  const Tensor& weight, const Tensor& bias, double eps = 1e-5);
// {input + residual, layer_norm(input + residual, ...)}: a transformer's residual add and the
// next norm in one kernel forward (it writes the sum and normalises it, as llm.c's
// fused_residual_forward) and one backward (the gradient reaching the sum added into the
// norm's input gradient, which autograd would add in a kernel of its own): Note [Fused residual
// norm], tensor/kernels/norm_kernels.h. input and residual of one shape (else composed: add,
// then layer_norm). Differentiable (twice). Under autocast it computes in float32 as layer_norm
// does, returns the sum in float32 and y in the autocast dtype, for the GEMM that reads it, and
// reads a residual in that dtype without casting it: the bits of casting the residual up, norming
// in float32 and casting y down, with none of the casts' launches (Note [Autocast residual norm]).
//   auto [stream, h] = add_layer_norm(x, attn_out, {768}, gamma, beta);   // x + attn_out, ln
std::pair<Tensor, Tensor> add_layer_norm(const Tensor& input, const Tensor& residual,
                                         const std::vector<int64_t>& normalized_shape,
                                         const Tensor& weight, const Tensor& bias,
                                         double eps = 1e-5);
// torch.nn.functional.rms_norm: y = x / sqrt(mean(x^2) + eps) * weight over the last
// dimensions; eps defaults, as PyTorch's, to the machine epsilon of the type it computes in:
// float64's for float64, float32's otherwise (the 16-bit floats compute in float).
//   Tensor y = rms_norm(x, {768}, gamma);
Tensor rms_norm(const Tensor& input, const std::vector<int64_t>& normalized_shape,
                const Tensor& weight, std::optional<double> eps = std::nullopt);
// torch.tril / torch.triu over the last two dimensions (any dtype): element (i, j) is kept
// where j - i <= diagonal (tril) or j - i >= diagonal (triu), zero elsewhere. The gradient is
// tril/triu of the gradient.
//   Tensor causal = tril(ones({T, T}, kBool));
Tensor tril(const Tensor& input, int64_t diagonal = 0);
Tensor triu(const Tensor& input, int64_t diagonal = 0);

// ---- Selection and indexing ------------------------------------------------------------
// `condition` (bool, as PyTorch requires: comparisons give it) is true where `a` is taken
// and false where `b` is. All three broadcast together; a and b promote as binary ops do. The
// unselected side never leaks in (a NaN or inf there does not matter). Differentiable in
// a and b.
//   Tensor y = where(gt(x, zeros({})), x, mul(x, 0.01));   // leaky relu
Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b);
// `input` with `value` (converted to input's dtype) wherever the bool `mask` (broadcast to
// input's shape) is true.
Tensor masked_fill(const Tensor& input, const Tensor& mask, double value);
// Limits every element to [min, max] (either bound optional; min > max gives max
// everywhere, as PyTorch). NaN stays NaN. The gradient passes where min <= x <= max.
Tensor clamp(const Tensor& input, std::optional<double> min, std::optional<double> max);
// torch.gather: out[i][j][k] = input[index[i][j][k]][j][k] for dim 0 (likewise for other
// dims). index is int64 with input's number of dimensions and, outside `dim`, sizes no
// larger than input's; the result has index's shape. Float32 input; differentiable.
Tensor gather(const Tensor& input, int64_t dim, const Tensor& index);
// The entries of `input` at the int64 positions `index` (1-D) along `dim`, in that order
// (repeats allowed): the result's size along dim is index.numel(). Differentiable.
Tensor index_select(const Tensor& input, int64_t dim, const Tensor& index);
// The k largest (or smallest) entries along `dim` and their int64 indices, largest first
// (smallest first when largest is false). NaN counts as larger than any number, as in
// PyTorch; among equal values the lower index comes first. Values are differentiable.
// The positions are chosen on the host (device tensors are copied there once).
//   auto [values, indices] = topk(logits, 5);
std::pair<Tensor, Tensor> topk(const Tensor& input, int64_t k, int64_t dim = -1,
                               bool largest = true, bool sorted = true);

// ---- Joining -------------------------------------------------------------------------
// Concatenates along an existing dimension; all on one device; mixed dtypes promote (as
// PyTorch's cat) and each input's gradient comes back in its own dtype. Differentiable.
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
// Joins along a new dimension. Differentiable.
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);
// The heads of `parts` projections packed side by side in the last dimension of `packed`
// [B, T, parts * n_head * D] (a fused QKV projection's output), each as a [B, n_head, T, D]
// view of `packed`, no copy (scaled_dot_product_attention reads such views in place and lays its
// output out as they are, so that the head merge after it is a view too). Equal to narrow(2,
// i * n_head * D, n_head * D), reshape to [B, T, n_head, D] and transpose(1, 2) per part, but
// one node for all the parts, whose backward writes the packed gradient in `parts` copies where
// the narrows' fill zeros, copy and add up their parts. Differentiable (twice).
//   const std::vector<Tensor> qkv = split_heads(c_attn(x), /*parts=*/3, n_head);  // q, k, v
std::vector<Tensor> split_heads(const Tensor& packed, int64_t parts, int64_t n_head);

// True when both have the same shape and |a - b| <= atol + rtol * |b| everywhere.
bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8);

}  // namespace tandem

#endif  // TANDEM_TENSOR_OPS_OPS_H_
