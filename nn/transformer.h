// Transformer layers and stacks, as torch.nn.TransformerEncoderLayer / TransformerDecoderLayer
// / TransformerEncoder / TransformerDecoder: same options and defaults, submodule names
// (self_attn, linear1, norm1, ...; layers.0.self_attn.in_proj_weight, ...), initialisation,
// mask conventions (MultiheadAttention's: a bool mask is true where attending is NOT allowed)
// and printing. Use them for sequence models; for a GPT, a TransformerEncoder with
// is_causal=true (or a causal src mask) is a decoder-only stack.
//
//   nn::TransformerEncoderLayer layer(
//       nn::TransformerEncoderLayerOptions(64, 4).dim_feedforward(256).batch_first(true));
//   nn::TransformerEncoder encoder(layer, /*num_layers=*/6,
//                                  std::make_shared<nn::LayerNorm>(std::vector<int64_t>{64}));
//   Tensor y = encoder.forward(x, Tensor(), Tensor(), /*is_causal=*/true);   // x [B, L, 64]
#ifndef TANDEM_NN_TRANSFORMER_H_
#define TANDEM_NN_TRANSFORMER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nn/attention.h"
#include "nn/layers.h"
#include "nn/module.h"
#include "nn/sequential.h"
#include "tensor/base/arg.h"
#include "tensor/tensor.h"

namespace tandem::nn {

// The arguments of TransformerEncoderLayer and TransformerDecoderLayer, with PyTorch's
// defaults.
struct TransformerLayerOptions {
  TransformerLayerOptions(int64_t d_model, int64_t nhead) : d_model_(d_model), nhead_(nhead) {}

  TANDEM_ARG(int64_t, d_model);
  // Attention heads; d_model must be divisible by it.
  TANDEM_ARG(int64_t, nhead);
  // Width of the feed-forward block's hidden layer.
  TANDEM_ARG(int64_t, dim_feedforward) = 2048;
  // After attention, inside and after the feed-forward block, and on the attention weights.
  TANDEM_ARG(double, dropout) = 0.1;
  // "relu" or "gelu" (exact), the feed-forward block's activation.
  TANDEM_ARG(std::string, activation) = "relu";
  TANDEM_ARG(double, layer_norm_eps) = 1e-5;
  // Inputs and outputs are [batch, seq, feature] instead of [seq, batch, feature].
  TANDEM_ARG(bool, batch_first) = false;
  // Pre-norm (x + f(norm(x))) instead of post-norm (norm(x + f(x))).
  TANDEM_ARG(bool, norm_first) = false;
  // Biases in the Linear and attention layers. false is refused for now: PyTorch then also
  // drops the LayerNorms' biases, which nn::LayerNorm cannot do yet.
  TANDEM_ARG(bool, bias) = true;
};
using TransformerEncoderLayerOptions = TransformerLayerOptions;
using TransformerDecoderLayerOptions = TransformerLayerOptions;

// Self-attention then a feed-forward block, each with dropout, a residual connection and a
// LayerNorm (after the residual, or before the block with norm_first):
//   x = norm1(x + dropout1(self_attn(x, x, x)))
//   x = norm2(x + dropout2(linear2(dropout(activation(linear1(x))))))
// src [S, B, d_model] ([B, S, d_model] with batch_first, or unbatched [S, d_model]);
// src_mask [S, S] or [B * nhead, S, S], src_key_padding_mask [B, S] as MultiheadAttention's.
// is_causal without src_mask applies the causal mask; with one, the mask is used.
class TransformerEncoderLayer : public Cloneable<TransformerEncoderLayer> {
 public:
  explicit TransformerEncoderLayer(const TransformerLayerOptions& options);
  TransformerEncoderLayer(int64_t d_model, int64_t nhead);

  void reset() override;
  Tensor forward(const Tensor& src, const Tensor& src_mask = Tensor(),
                 const Tensor& src_key_padding_mask = Tensor(), bool is_causal = false);

  const TransformerLayerOptions& options() const { return options_; }
  const std::shared_ptr<MultiheadAttention>& self_attn() const { return self_attn_; }
  const std::shared_ptr<Linear>& linear1() const { return linear1_; }
  const std::shared_ptr<Linear>& linear2() const { return linear2_; }
  const std::shared_ptr<LayerNorm>& norm1() const { return norm1_; }
  const std::shared_ptr<LayerNorm>& norm2() const { return norm2_; }

 private:
  Tensor FeedForward(const Tensor& x);

  TransformerLayerOptions options_;
  std::shared_ptr<MultiheadAttention> self_attn_;
  std::shared_ptr<Linear> linear1_;
  std::shared_ptr<Dropout> dropout_;
  std::shared_ptr<Linear> linear2_;
  std::shared_ptr<LayerNorm> norm1_;
  std::shared_ptr<LayerNorm> norm2_;
  std::shared_ptr<Dropout> dropout1_;
  std::shared_ptr<Dropout> dropout2_;
};

// Self-attention over the target, attention over the encoder's output (memory), then a
// feed-forward block, each with dropout, a residual connection and a LayerNorm (norm1..3):
//   x = norm1(x + dropout1(self_attn(x, x, x, tgt_mask, tgt_key_padding_mask)))
//   x = norm2(x + dropout2(multihead_attn(x, memory, memory, memory_mask,
//   memory_key_padding_mask))) x = norm3(x + dropout3(linear2(dropout(activation(linear1(x))))))
// tgt [T, B, d_model], memory [S, B, d_model] (batch first with batch_first); tgt_mask
// [T, T], memory_mask [T, S], key padding masks [B, T] and [B, S].
class TransformerDecoderLayer : public Cloneable<TransformerDecoderLayer> {
 public:
  explicit TransformerDecoderLayer(const TransformerLayerOptions& options);
  TransformerDecoderLayer(int64_t d_model, int64_t nhead);

  void reset() override;
  Tensor forward(const Tensor& tgt, const Tensor& memory, const Tensor& tgt_mask = Tensor(),
                 const Tensor& memory_mask = Tensor(),
                 const Tensor& tgt_key_padding_mask = Tensor(),
                 const Tensor& memory_key_padding_mask = Tensor(), bool tgt_is_causal = false,
                 bool memory_is_causal = false);

  const TransformerLayerOptions& options() const { return options_; }
  const std::shared_ptr<MultiheadAttention>& self_attn() const { return self_attn_; }
  const std::shared_ptr<MultiheadAttention>& multihead_attn() const { return multihead_attn_; }
  const std::shared_ptr<Linear>& linear1() const { return linear1_; }
  const std::shared_ptr<Linear>& linear2() const { return linear2_; }

 private:
  Tensor FeedForward(const Tensor& x);

  TransformerLayerOptions options_;
  std::shared_ptr<MultiheadAttention> self_attn_;
  std::shared_ptr<MultiheadAttention> multihead_attn_;
  std::shared_ptr<Linear> linear1_;
  std::shared_ptr<Dropout> dropout_;
  std::shared_ptr<Linear> linear2_;
  std::shared_ptr<LayerNorm> norm1_;
  std::shared_ptr<LayerNorm> norm2_;
  std::shared_ptr<LayerNorm> norm3_;
  std::shared_ptr<Dropout> dropout1_;
  std::shared_ptr<Dropout> dropout2_;
  std::shared_ptr<Dropout> dropout3_;
};

// num_layers deep copies of encoder_layer (all starting with its values, as PyTorch's
// copy.deepcopy), in a ModuleList named "layers", run in turn with the same masks, then the
// optional final `norm` (registered as "norm", shared with the caller as in PyTorch).
class TransformerEncoder : public Cloneable<TransformerEncoder> {
 public:
  TransformerEncoder(const TransformerEncoderLayer& encoder_layer, int64_t num_layers,
                     std::shared_ptr<LayerNorm> norm = nullptr);

  // Rebuilds the layers with fresh initialisation (independent values, unlike the
  // constructor's copies); clone() uses it for the structure.
  void reset() override;
  Tensor forward(const Tensor& src, const Tensor& mask = Tensor(),
                 const Tensor& src_key_padding_mask = Tensor(), bool is_causal = false);

  int64_t num_layers() const { return num_layers_; }
  const std::shared_ptr<ModuleList>& layers() const { return layers_; }
  std::shared_ptr<TransformerEncoderLayer> layer(size_t index) const;
  const std::shared_ptr<LayerNorm>& norm() const { return norm_; }  // null without one

 private:
  struct NormConfig {
    std::vector<int64_t> normalized_shape;
    double eps;
    bool elementwise_affine;
  };

  TransformerLayerOptions layer_options_;
  int64_t num_layers_;
  std::optional<NormConfig> norm_config_;
  std::shared_ptr<ModuleList> layers_;
  std::shared_ptr<LayerNorm> norm_;
};

// num_layers deep copies of decoder_layer, each attending to the same memory, then the
// optional final norm; as TransformerEncoder.
class TransformerDecoder : public Cloneable<TransformerDecoder> {
 public:
  TransformerDecoder(const TransformerDecoderLayer& decoder_layer, int64_t num_layers,
                     std::shared_ptr<LayerNorm> norm = nullptr);

  void reset() override;
  Tensor forward(const Tensor& tgt, const Tensor& memory, const Tensor& tgt_mask = Tensor(),
                 const Tensor& memory_mask = Tensor(),
                 const Tensor& tgt_key_padding_mask = Tensor(),
                 const Tensor& memory_key_padding_mask = Tensor(), bool tgt_is_causal = false,
                 bool memory_is_causal = false);

  int64_t num_layers() const { return num_layers_; }
  const std::shared_ptr<ModuleList>& layers() const { return layers_; }
  std::shared_ptr<TransformerDecoderLayer> layer(size_t index) const;
  const std::shared_ptr<LayerNorm>& norm() const { return norm_; }

 private:
  struct NormConfig {
    std::vector<int64_t> normalized_shape;
    double eps;
    bool elementwise_affine;
  };

  TransformerLayerOptions layer_options_;
  int64_t num_layers_;
  std::optional<NormConfig> norm_config_;
  std::shared_ptr<ModuleList> layers_;
  std::shared_ptr<LayerNorm> norm_;
};

}  // namespace tandem::nn

#endif  // TANDEM_NN_TRANSFORMER_H_
