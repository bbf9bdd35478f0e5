// Scaled dot-product attention, as torch.nn.functional.scaled_dot_product_attention: the
// op every attention module (nn::MultiheadAttention, the transformer layers, GPT's blocks)
// is written from. Use it directly for custom attention; it takes batched heads in any
// leading dimensions.
//
//   // q [B, H, L, E], k [B, H, S, E], v [B, H, S, Ev] -> [B, H, L, Ev]
//   Tensor y = scaled_dot_product_attention(q, k, v, Tensor(), 0.0, /*is_causal=*/true);
//
// Included by tensor/tensor.h; include that instead.
#ifndef TANDEM_TENSOR_OPS_ATTENTION_H_
#define TANDEM_TENSOR_OPS_ATTENTION_H_

#include <optional>

#include "tensor/core/tensor.h"

namespace tandem {

class Generator;

// softmax(q k^T * scale + mask) v over the last two dimensions; leading dimensions
// broadcast as matmul's do. `scale` defaults to 1 / sqrt(E).
// attn_mask (optional, undefined for none) broadcasts to [..., L, S]: a bool mask is true
// where a query may attend (false positions are excluded), a floating mask is added to the
// scores. is_causal lets query i attend keys 0..i only (top-left aligned, as PyTorch's; for
// L != S the mask is the lower triangle of an L x S matrix) and excludes attn_mask. A query
// row that may attend nothing gives NaN, as in PyTorch. dropout_p drops attention weights
// when > 0 (pass 0 when evaluating). Differentiable in q, k, v (and a floating mask).
//
// Note [Fused attention] (tensor/kernels/attention_kernels.h): on CPU and CUDA the op runs fused
// kernels that never hold the L x S scores (tiles of keys, online softmax, float
// accumulation for 16-bit inputs; one autograd node whose backward recomputes the weights
// from the saved log-sum-exp), when q, k and v share their dtype, device and leading
// dimensions (no broadcasting between them). A bool or floating attn_mask is passed to the
// kernel as an additive mask, without a copy per head unless its leading dimensions before the
// last one do not nest into one stride. The composed path (matmul, softmax, matmul: the L x S
// scores in memory) takes the rest: broadcast heads, mixed dtypes, a mask that requires grad, a
// mask with more dimensions than q, and empty keys or features. The fused backward is not
// itself differentiable (no double backward), as PyTorch's flash attention.
//
// Dropout (dropout_p > 0) draws from `gen`, or the query's device's default generator, as
// `dropout` does: both paths reserve batch * L * S Philox counters and drop weight (b, i, j)
// where philox::Uniform(seed, offset + (b * L + i) * S + j) < dropout_p (b the flattened
// leading dimensions), so one generator state gives one mask on every backend and path. The
// fused kernels drop the normalised weights and regenerate the mask in the backward.
Tensor scaled_dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                    const Tensor& attn_mask = Tensor(), double dropout_p = 0.0,
                                    bool is_causal = false,
                                    std::optional<double> scale = std::nullopt,
                                    Generator* gen = nullptr);

namespace internal {
// The composed path alone (see above): the reference the fused kernels are tested and
// benchmarked against.
Tensor ComposedScaledDotProductAttention(const Tensor& query, const Tensor& key,
                                         const Tensor& value, const Tensor& attn_mask = Tensor(),
                                         double dropout_p = 0.0, bool is_causal = false,
                                         std::optional<double> scale = std::nullopt,
                                         Generator* gen = nullptr);
}  // namespace internal

}  // namespace tandem

#endif  // TANDEM_TENSOR_OPS_ATTENTION_H_
