// MultiheadAttention: torch.nn.MultiheadAttention (same options, parameters, initialisation,
// mask conventions and printing), written from scaled_dot_product_attention
// (tensor/ops/attention.h). Use it for self- or cross-attention in a model; the transformer
// layers (nn/transformer.h) are built from it.
//
//   nn::MultiheadAttention attn(nn::MultiheadAttentionOptions(64, 8).batch_first(true));
//   auto [out, weights] = attn.forward(x, x, x);   // x [B, L, 64]: out [B, L, 64],
//                                                  // weights [B, L, L] (averaged over heads)
//
// Masks follow PyTorch's MultiheadAttention, which is the opposite of
// scaled_dot_product_attention's for bool masks: a bool attn_mask or key_padding_mask is
// true where attending is NOT allowed; a floating mask is added to the scores.
#ifndef TANDEM_NN_ATTENTION_H_
#define TANDEM_NN_ATTENTION_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <tuple>
#include <vector>

#include "nn/layers.h"
#include "nn/module.h"
#include "tensor/base/arg.h"
#include "tensor/tensor.h"

namespace tandem::nn {

// A Linear by another name, as PyTorch's MultiheadAttention.out_proj is (the name only
// matters to PyTorch's quantisation; here it keeps printing identical to PyTorch's).
class NonDynamicallyQuantizableLinear : public Linear {
 public:
  using Linear::Linear;
  // Keeps the type (Linear's clone would make a Linear).
  std::shared_ptr<Module> clone(std::optional<Device> device = std::nullopt) const override;
};

// The arguments of MultiheadAttention, with PyTorch's defaults.
struct MultiheadAttentionOptions {
  MultiheadAttentionOptions(int64_t embed_dim, int64_t num_heads)
      : embed_dim_(embed_dim), num_heads_(num_heads) {}

  TANDEM_ARG(int64_t, embed_dim);
  // embed_dim must be divisible by it; each head sees embed_dim / num_heads features.
  TANDEM_ARG(int64_t, num_heads);
  // Dropout probability on the attention weights (training mode only).
  TANDEM_ARG(double, dropout) = 0.0;
  // Biases on the input and output projections.
  TANDEM_ARG(bool, bias) = true;
  // Appends learned bias_k / bias_v [1, 1, embed_dim] to the keys and values (one more key).
  TANDEM_ARG(bool, add_bias_kv) = false;
  // Appends a zero key and value per head (one more key).
  TANDEM_ARG(bool, add_zero_attn) = false;
  // Features of key and value (default embed_dim). When either differs from embed_dim the
  // projections are separate q_proj_weight, k_proj_weight, v_proj_weight instead of the packed
  // in_proj_weight.
  TANDEM_ARG(std::optional<int64_t>, kdim) = std::nullopt;
  TANDEM_ARG(std::optional<int64_t>, vdim) = std::nullopt;
  // Inputs and outputs are [batch, seq, feature] instead of [seq, batch, feature].
  TANDEM_ARG(bool, batch_first) = false;
};

// Attention of L queries over S keys in num_heads heads:
//   q = query W_q^T + b_q, k = key W_k^T + b_k, v = value W_v^T + b_v (split into heads),
//   out = concat_h(softmax(q_h k_h^T / sqrt(head_dim) + mask) v_h) W_o^T + b_o.
// Shapes (batch_first=false; with batch_first the first two dimensions swap; an unbatched
// [L, E] query with [S, kdim] key and [S, vdim] value works too):
//   query [L, B, E], key [S, B, kdim], value [S, B, vdim] -> output [L, B, E]
//   key_padding_mask [B, S]: bool (true = ignore that key) or floating (added)
//   attn_mask [L, S] or [B * num_heads, L, S]: bool (true = not allowed) or floating (added)
//   weights (need_weights): [B, L, S] averaged over heads, or [B, num_heads, L, S]
// is_causal makes query i attend keys 0..i; with an attn_mask given it is only a hint (the
// mask is used, as in PyTorch), without one the causal mask is built (PyTorch requires it).
// Parameters (PyTorch's names and initialisation): in_proj_weight [3E, E] (xavier_uniform),
// or q_proj_weight [E, E], k_proj_weight [E, kdim], v_proj_weight [E, vdim] (each
// xavier_uniform) when kdim or vdim differs from E; in_proj_bias [3E] (zeros); bias_k, bias_v
// [1, 1, E] (xavier_normal) with add_bias_kv; out_proj, a Linear(E, E) whose bias starts at 0.
class MultiheadAttention : public Cloneable<MultiheadAttention> {
 public:
  explicit MultiheadAttention(const MultiheadAttentionOptions& options);
  MultiheadAttention(int64_t embed_dim, int64_t num_heads);

  void reset() override;
  // Draws the projection weights again and zeroes the biases, as PyTorch's _reset_parameters.
  void reset_parameters();

  // (output, weights); weights is undefined unless need_weights. With need_weights the
  // weights are computed explicitly (as PyTorch does); without, the fused attention path runs.
  std::tuple<Tensor, Tensor> forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                     const Tensor& key_padding_mask = Tensor(),
                                     bool need_weights = true, const Tensor& attn_mask = Tensor(),
                                     bool average_attn_weights = true, bool is_causal = false);
  // For DataParallel and Sequential: {x} (self-attention), {query, key, value},
  // {query, key, value, key_padding_mask} or {..., key_padding_mask, attn_mask} (an undefined
  // tensor for none) give {output}, without weights.
  std::vector<Tensor> forward_tensors(const std::vector<Tensor>& inputs) override;

  const MultiheadAttentionOptions& options() const { return options_; }
  int64_t embed_dim() const { return options_.embed_dim(); }
  int64_t num_heads() const { return options_.num_heads(); }
  int64_t head_dim() const { return options_.embed_dim() / options_.num_heads(); }
  int64_t kdim() const { return options_.kdim().value_or(options_.embed_dim()); }
  int64_t vdim() const { return options_.vdim().value_or(options_.embed_dim()); }
  bool batch_first() const { return options_.batch_first(); }
  // True when the projections are packed into in_proj_weight (kdim == vdim == embed_dim).
  bool qkv_same_embed_dim() const { return kdim() == embed_dim() && vdim() == embed_dim(); }

  // Undefined when the module does not have them (see above).
  Tensor in_proj_weight() const { return in_proj_weight_ ? *in_proj_weight_ : Tensor(); }
  Tensor q_proj_weight() const { return q_proj_weight_ ? *q_proj_weight_ : Tensor(); }
  Tensor k_proj_weight() const { return k_proj_weight_ ? *k_proj_weight_ : Tensor(); }
  Tensor v_proj_weight() const { return v_proj_weight_ ? *v_proj_weight_ : Tensor(); }
  Tensor in_proj_bias() const { return in_proj_bias_ ? *in_proj_bias_ : Tensor(); }
  Tensor bias_k() const { return bias_k_ ? *bias_k_ : Tensor(); }
  Tensor bias_v() const { return bias_v_ ? *bias_v_ : Tensor(); }
  const std::shared_ptr<NonDynamicallyQuantizableLinear>& out_proj() const { return out_proj_; }

 private:
  MultiheadAttentionOptions options_;
  Parameter in_proj_weight_;
  Parameter q_proj_weight_;
  Parameter k_proj_weight_;
  Parameter v_proj_weight_;
  Parameter in_proj_bias_;
  Parameter bias_k_;
  Parameter bias_v_;
  std::shared_ptr<NonDynamicallyQuantizableLinear> out_proj_;
};

}  // namespace tandem::nn

#endif  // TANDEM_NN_ATTENTION_H_
