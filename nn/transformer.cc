#include "nn/transformer.h"

#include <string>
#include <tuple>
#include <utility>

#include "tensor/tensor.h"

namespace tandem::nn {
namespace {

void CheckLayerOptions(const TransformerLayerOptions& o, const char* layer) {
  TANDEM_CHECK(o.d_model() > 0 && o.nhead() > 0 && o.dim_feedforward() > 0, layer,
               ": d_model, nhead and dim_feedforward must be positive but are ", o.d_model(), ", ",
               o.nhead(), " and ", o.dim_feedforward());
  TANDEM_CHECK(o.d_model() % o.nhead() == 0, layer, ": d_model (", o.d_model(),
               ") must be divisible by nhead (", o.nhead(), "); pick nhead among the divisors of ",
               o.d_model());
  TANDEM_CHECK(o.activation() == "relu" || o.activation() == "gelu", layer,
               ": activation must be \"relu\" or \"gelu\" but is \"", o.activation(), "\"");
  TANDEM_CHECK(o.bias(), layer, ": bias=false is not supported yet: PyTorch then builds its ",
               "LayerNorms without a bias, which nn::LayerNorm cannot do; use bias=true");
  TANDEM_CHECK(o.dropout() >= 0.0 && o.dropout() <= 1.0, layer,
               ": dropout must be in [0, 1] but is ", o.dropout());
}

MultiheadAttentionOptions AttentionOptions(const TransformerLayerOptions& o) {
  return MultiheadAttentionOptions(o.d_model(), o.nhead())
      .dropout(o.dropout())
      .bias(o.bias())
      .batch_first(o.batch_first());
}

Tensor Activate(const Tensor& x, const std::string& activation) {
  return activation == "gelu" ? gelu(x) : relu(x);
}

// Self-attention's output (PyTorch's layers never ask for the weights).
Tensor Attend(MultiheadAttention& attention, const Tensor& query, const Tensor& key_value,
              const Tensor& mask, const Tensor& key_padding_mask, bool is_causal) {
  return std::get<0>(attention.forward(query, key_value, key_value, key_padding_mask,
                                       /*need_weights=*/false, mask,
                                       /*average_attn_weights=*/true, is_causal));
}

}  // namespace

// ---- TransformerEncoderLayer -----------------------------------------------------------

TransformerEncoderLayer::TransformerEncoderLayer(const TransformerLayerOptions& options)
    : options_(options) {
  CheckLayerOptions(options_, "TransformerEncoderLayer");
  reset();
}

TransformerEncoderLayer::TransformerEncoderLayer(int64_t d_model, int64_t nhead)
    : TransformerEncoderLayer(TransformerLayerOptions(d_model, nhead)) {}

void TransformerEncoderLayer::reset() {
  const TransformerLayerOptions& o = options_;
  self_attn_ = register_module("self_attn", MultiheadAttention(AttentionOptions(o)));
  linear1_ = register_module("linear1", Linear(o.d_model(), o.dim_feedforward(), o.bias()));
  dropout_ = register_module("dropout", Dropout(o.dropout()));
  linear2_ = register_module("linear2", Linear(o.dim_feedforward(), o.d_model(), o.bias()));
  norm1_ = register_module("norm1", LayerNorm({o.d_model()}, o.layer_norm_eps()));
  norm2_ = register_module("norm2", LayerNorm({o.d_model()}, o.layer_norm_eps()));
  dropout1_ = register_module("dropout1", Dropout(o.dropout()));
  dropout2_ = register_module("dropout2", Dropout(o.dropout()));
}

Tensor TransformerEncoderLayer::FeedForward(const Tensor& x) {
  return dropout2_->forward(
      linear2_->forward(dropout_->forward(Activate(linear1_->forward(x), options_.activation()))));
}

Tensor TransformerEncoderLayer::forward(const Tensor& src, const Tensor& src_mask,
                                        const Tensor& src_key_padding_mask, bool is_causal) {
  const auto self_attention = [&](const Tensor& x) {
    return dropout1_->forward(Attend(*self_attn_, x, x, src_mask, src_key_padding_mask, is_causal));
  };
  Tensor x = src;
  if (options_.norm_first()) {
    x = x + self_attention(norm1_->forward(x));
    x = x + FeedForward(norm2_->forward(x));
  } else {
    x = norm1_->forward(x + self_attention(x));
    x = norm2_->forward(x + FeedForward(x));
  }
  return x;
}

// ---- TransformerDecoderLayer -----------------------------------------------------------

TransformerDecoderLayer::TransformerDecoderLayer(const TransformerLayerOptions& options)
    : options_(options) {
  CheckLayerOptions(options_, "TransformerDecoderLayer");
  reset();
}

TransformerDecoderLayer::TransformerDecoderLayer(int64_t d_model, int64_t nhead)
    : TransformerDecoderLayer(TransformerLayerOptions(d_model, nhead)) {}

void TransformerDecoderLayer::reset() {
  const TransformerLayerOptions& o = options_;
  self_attn_ = register_module("self_attn", MultiheadAttention(AttentionOptions(o)));
  multihead_attn_ = register_module("multihead_attn", MultiheadAttention(AttentionOptions(o)));
  linear1_ = register_module("linear1", Linear(o.d_model(), o.dim_feedforward(), o.bias()));
  dropout_ = register_module("dropout", Dropout(o.dropout()));
  linear2_ = register_module("linear2", Linear(o.dim_feedforward(), o.d_model(), o.bias()));
  norm1_ = register_module("norm1", LayerNorm({o.d_model()}, o.layer_norm_eps()));
  norm2_ = register_module("norm2", LayerNorm({o.d_model()}, o.layer_norm_eps()));
  norm3_ = register_module("norm3", LayerNorm({o.d_model()}, o.layer_norm_eps()));
  dropout1_ = register_module("dropout1", Dropout(o.dropout()));
  dropout2_ = register_module("dropout2", Dropout(o.dropout()));
  dropout3_ = register_module("dropout3", Dropout(o.dropout()));
}

Tensor TransformerDecoderLayer::FeedForward(const Tensor& x) {
  return dropout3_->forward(
      linear2_->forward(dropout_->forward(Activate(linear1_->forward(x), options_.activation()))));
}

Tensor TransformerDecoderLayer::forward(const Tensor& tgt, const Tensor& memory,
                                        const Tensor& tgt_mask, const Tensor& memory_mask,
                                        const Tensor& tgt_key_padding_mask,
                                        const Tensor& memory_key_padding_mask, bool tgt_is_causal,
                                        bool memory_is_causal) {
  TANDEM_CHECK(memory.defined(), "TransformerDecoderLayer: memory (the encoder's output) is ",
               "undefined; pass the tensor the decoder attends to");
  const auto self_attention = [&](const Tensor& x) {
    return dropout1_->forward(
        Attend(*self_attn_, x, x, tgt_mask, tgt_key_padding_mask, tgt_is_causal));
  };
  const auto cross_attention = [&](const Tensor& x) {
    return dropout2_->forward(Attend(*multihead_attn_, x, memory, memory_mask,
                                     memory_key_padding_mask, memory_is_causal));
  };
  Tensor x = tgt;
  if (options_.norm_first()) {
    x = x + self_attention(norm1_->forward(x));
    x = x + cross_attention(norm2_->forward(x));
    x = x + FeedForward(norm3_->forward(x));
  } else {
    x = norm1_->forward(x + self_attention(x));
    x = norm2_->forward(x + cross_attention(x));
    x = norm3_->forward(x + FeedForward(x));
  }
  return x;
}

// ---- Stacks ----------------------------------------------------------------------------

namespace {

template <typename Config>
std::optional<Config> NormConfigOf(const std::shared_ptr<LayerNorm>& norm) {
  if (!norm) return std::nullopt;
  return Config{norm->normalized_shape(), norm->eps(), norm->weight().defined()};
}

void CheckNumLayers(int64_t num_layers, const char* stack) {
  TANDEM_CHECK(num_layers > 0, stack, ": num_layers must be positive but is ", num_layers);
}

}  // namespace

TransformerEncoder::TransformerEncoder(const TransformerEncoderLayer& encoder_layer,
                                       int64_t num_layers, std::shared_ptr<LayerNorm> norm)
    : layer_options_(encoder_layer.options()),
      num_layers_(num_layers),
      norm_config_(NormConfigOf<NormConfig>(norm)) {
  CheckNumLayers(num_layers, "TransformerEncoder");
  // Deep copies of the given layer (its values, device and mode), not fresh layers: PyTorch
  // starts every layer of the stack identical.
  layers_ = register_module("layers", ModuleList());
  for (int64_t i = 0; i < num_layers_; ++i) layers_->push_back(encoder_layer.clone());
  if (norm) norm_ = register_module("norm", std::move(norm));
}

void TransformerEncoder::reset() {
  layers_ = register_module("layers", ModuleList());
  for (int64_t i = 0; i < num_layers_; ++i) {
    layers_->push_back(TransformerEncoderLayer(layer_options_));
  }
  if (norm_config_) {
    norm_ = register_module("norm", LayerNorm(norm_config_->normalized_shape, norm_config_->eps,
                                              norm_config_->elementwise_affine));
  }
}

std::shared_ptr<TransformerEncoderLayer> TransformerEncoder::layer(size_t index) const {
  return layers_->at<TransformerEncoderLayer>(index);
}

Tensor TransformerEncoder::forward(const Tensor& src, const Tensor& mask,
                                   const Tensor& src_key_padding_mask, bool is_causal) {
  Tensor x = src;
  for (size_t i = 0; i < layers_->size(); ++i) {
    x = layer(i)->forward(x, mask, src_key_padding_mask, is_causal);
  }
  return norm_ ? norm_->forward(x) : x;
}

TransformerDecoder::TransformerDecoder(const TransformerDecoderLayer& decoder_layer,
                                       int64_t num_layers, std::shared_ptr<LayerNorm> norm)
    : layer_options_(decoder_layer.options()),
      num_layers_(num_layers),
      norm_config_(NormConfigOf<NormConfig>(norm)) {
  CheckNumLayers(num_layers, "TransformerDecoder");
  layers_ = register_module("layers", ModuleList());
  for (int64_t i = 0; i < num_layers_; ++i) layers_->push_back(decoder_layer.clone());
  if (norm) norm_ = register_module("norm", std::move(norm));
}

void TransformerDecoder::reset() {
  layers_ = register_module("layers", ModuleList());
  for (int64_t i = 0; i < num_layers_; ++i) {
    layers_->push_back(TransformerDecoderLayer(layer_options_));
  }
  if (norm_config_) {
    norm_ = register_module("norm", LayerNorm(norm_config_->normalized_shape, norm_config_->eps,
                                              norm_config_->elementwise_affine));
  }
}

std::shared_ptr<TransformerDecoderLayer> TransformerDecoder::layer(size_t index) const {
  return layers_->at<TransformerDecoderLayer>(index);
}

Tensor TransformerDecoder::forward(const Tensor& tgt, const Tensor& memory, const Tensor& tgt_mask,
                                   const Tensor& memory_mask, const Tensor& tgt_key_padding_mask,
                                   const Tensor& memory_key_padding_mask, bool tgt_is_causal,
                                   bool memory_is_causal) {
  Tensor x = tgt;
  for (size_t i = 0; i < layers_->size(); ++i) {
    x = layer(i)->forward(x, memory, tgt_mask, memory_mask, tgt_key_padding_mask,
                          memory_key_padding_mask, tgt_is_causal, memory_is_causal);
  }
  return norm_ ? norm_->forward(x) : x;
}

}  // namespace tandem::nn
