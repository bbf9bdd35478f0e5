// A GPT language model with GPT-2's architecture (as nanoGPT writes it): token embedding wte
// and learned positions wpe, dropout, n_layer pre-norm blocks (LayerNorm, causal
// self-attention with one fused qkv projection, LayerNorm, MLP with tanh GELU), a final
// LayerNorm and a head tied to wte (the logits are x wte^T; the head has no weight of its
// own, so wte's gradient receives both the embedding's rows and the head's full product).
// The vocabulary is padded to a multiple of 64 (GptConfig::vocab_multiple) as GPT-2
// implementations pad 50257 to 50304: wte has padded_vocab_size() rows and the logits as many
// columns, the padded ones -inf (Note [Padded vocabulary], gpt.cc).
// GPT-2's initialisation: weights normal(0, 0.02), the residual projections normal(0,
// 0.02 / sqrt(2 n_layer)), biases zero, LayerNorms ones and zeros.
//
// Use it for next-token prediction on int64 token ids; GptConfig::Gpt2() is the 124M model,
// GptConfig::Small() a byte-level model that learns on two CPU cores in minutes.
//
//   auto model = std::make_shared<examples::Gpt>(examples::GptConfig::Small());
//   Tensor logits = model->forward(tokens);            // int64 [B, T] -> [B, T, vocab]
//   Tensor loss = model->loss(logits, next_tokens);    // mean cross-entropy over B * T
//   Generator gen(7);
//   model->eval();
//   Tensor text = model->Generate(prompt, 200, /*temperature=*/0.8, /*top_k=*/40, &gen);
#ifndef TANDEM_EXAMPLES_GPT_H_
#define TANDEM_EXAMPLES_GPT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "nn/nn.h"

namespace tandem::examples {

// The sizes of a GPT. block_size is the context: the most tokens forward() takes.
struct GptConfig {
  // GPT-2 small (124M parameters): vocabulary 50257, context 1024, 12 layers, 12 heads,
  // 768 channels, no dropout, biases.
  static GptConfig Gpt2();
  // A byte-level model (vocabulary 256, context 128, 4 layers, 4 heads, 128 channels,
  // dropout 0.1; about 0.8M parameters) that learns visibly on two CPU cores in minutes.
  static GptConfig Small();

  TANDEM_ARG(int64_t, vocab_size) = 256;
  TANDEM_ARG(int64_t, block_size) = 128;
  TANDEM_ARG(int64_t, n_layer) = 4;
  TANDEM_ARG(int64_t, n_head) = 4;
  TANDEM_ARG(int64_t, n_embd) = 128;  // divisible by n_head
  TANDEM_ARG(double, dropout) = 0.0;  // on embeddings, attention weights and residuals
  TANDEM_ARG(bool, bias) = true;      // in the Linear layers and LayerNorms
  // Runs each block through nn::checkpoint (nn/activation_checkpoint.h): backward recomputes
  // a block's activations instead of keeping them, for about a third more time per step and
  // a fraction of the memory (keeps one [B, T, C] input per block). Same gradients.
  TANDEM_ARG(bool, checkpoint_activations) = false;
  // The embedding's rows and the logits' columns are padded to a multiple of this (GPT-2:
  // 50257 -> 50304, nanoGPT's and llm.c's figure): the head's GEMM and the loss's rows then
  // have a leading dimension a multiple of 64 (aligned, whole tensor-core tiles). The padded
  // logits are -inf: never sampled, probability exactly 0 in the loss, zero gradient. 1 keeps
  // the unpadded layout that models saved before the padding have (load_state_dict refuses a
  // wte of another row count, naming it).
  TANDEM_ARG(int64_t, vocab_multiple) = 64;

 public:
  // vocab_size rounded up to a multiple of vocab_multiple.
  int64_t padded_vocab_size() const {
    return (vocab_size() + vocab_multiple() - 1) / vocab_multiple() * vocab_multiple();
  }
};

// Multi-head causal self-attention: c_attn Linear(C, 3C) gives q, k, v in one product; the
// heads attend through scaled_dot_product_attention(is_causal) and c_proj Linear(C, C) mixes
// them back.
class CausalSelfAttention : public nn::Cloneable<CausalSelfAttention> {
 public:
  explicit CausalSelfAttention(const GptConfig& config);
  void reset() override;
  Tensor forward(const Tensor& x);  // [B, T, C] -> [B, T, C]
  void pretty_print(std::ostream& out) const override;

 private:
  GptConfig config_;
  std::shared_ptr<nn::Linear> c_attn_, c_proj_;
  std::shared_ptr<nn::Dropout> resid_dropout_;
};

// Linear(C, 4C), gelu(tanh), Linear(4C, C), dropout.
class GptMlp : public nn::Cloneable<GptMlp> {
 public:
  explicit GptMlp(const GptConfig& config);
  void reset() override;
  Tensor forward(const Tensor& x);

 private:
  GptConfig config_;
  std::shared_ptr<nn::Linear> c_fc_, c_proj_;
  std::shared_ptr<nn::Dropout> dropout_;
};

// x + attn(ln_1(x)), then x + mlp(ln_2(x)).
class GptBlock : public nn::Cloneable<GptBlock> {
 public:
  explicit GptBlock(const GptConfig& config);
  void reset() override;
  Tensor forward(const Tensor& x);
  // forward(x + pending) as {stream, mlp}, their sum the block's output, so that the next
  // block's ln_1 (or the head's ln_f) adds them in its own kernel (add_layer_norm): the residual
  // adds of a chain of blocks fused into the norms after them. pending may be undefined (none).
  //   auto [stream, pending] = block->forward_pending(x, Tensor());
  std::pair<Tensor, Tensor> forward_pending(const Tensor& x, const Tensor& pending);

 private:
  GptConfig config_;
  std::shared_ptr<nn::LayerNorm> ln_1_, ln_2_;
  std::shared_ptr<CausalSelfAttention> attn_;
  std::shared_ptr<GptMlp> mlp_;
};

class Gpt : public nn::Cloneable<Gpt> {
 public:
  explicit Gpt(const GptConfig& config = GptConfig());
  void reset() override;
  // Draws every weight again from GPT-2's initialisation (on the parameters' device).
  void reset_parameters();

  // int64 tokens [B, T] with 1 <= T <= block_size, each in [0, vocab_size): logits
  // [B, T, padded_vocab_size] predicting the token after each position (the columns from
  // vocab_size on are -inf).
  Tensor forward(const Tensor& tokens);
  // Mean cross-entropy of logits [B, T, V] (V padded or not) against int64 targets [B, T].
  Tensor loss(const Tensor& logits, const Tensor& targets) const;
  // Appends max_new_tokens sampled tokens to `prompt` (int64 [B, T0] or [T0], T0 >= 1) and
  // returns the whole sequence (same rank). Each step reads at most the last block_size
  // tokens, divides the last logits by temperature (> 0), keeps only the top_k most likely
  // tokens when given, and samples from the softmax with uniform draws from `gen` (the
  // default CPU generator when null). Runs without gradients and in evaluation mode (the
  // training mode is restored after). `forward`, when given, computes the logits instead of
  // this model's forward(): a wrapper's (FullyShardedDataParallel's, run on every rank with
  // the same prompt and generator state, gathers one unit at a time).
  Tensor Generate(const Tensor& prompt, int64_t max_new_tokens, double temperature = 1.0,
                  std::optional<int64_t> top_k = std::nullopt, Generator* gen = nullptr,
                  const std::function<Tensor(const Tensor&)>& forward = nullptr);

  // Parameters counted once each (the tied head adds none); GPT-2: 124,475,904 (124,439,808
  // and wte's padded rows; 124,439,808 with vocab_multiple(1)).
  int64_t num_parameters() const;
  const GptConfig& config() const { return config_; }
  Tensor wte_weight() const { return wte_->weight(); }
  // Where its parameters are, read without reading them (a sharded wrapper's read hook would
  // gather them).
  Device device() const { return parameter("wte.weight").device(); }

 private:
  GptConfig config_;
  std::shared_ptr<nn::Embedding> wte_, wpe_;
  std::shared_ptr<nn::Dropout> drop_;
  std::shared_ptr<nn::ModuleList> h_;
  std::vector<std::shared_ptr<GptBlock>> blocks_;
  std::shared_ptr<nn::LayerNorm> ln_f_;
  // The tensors the GEMMs of forward() cast under autocast: each block's c_attn, attn.c_proj,
  // c_fc and mlp.c_proj weights and biases, and wte's (the tied head); not the norms' or wpe's.
  std::vector<Tensor> GemmWeights() const;

  // The head's bias: 0 for the vocabulary, -inf for the padding; made on the device on first
  // use (not a parameter or buffer, so state dictionaries keep their entries). Undefined
  // without padding.
  Tensor head_mask_;
};

// Mean cross-entropy of logits [B, T, V] against int64 targets [B, T] (Gpt::loss), as a
// module for DataParallel::forward_loss: each replica's chunk holds whole sequences, so the
// chunks' means weighted by their rows are the whole batch's mean.
//   Tensor loss = dp->forward_loss(criterion, tokens, next_tokens);   // examples::GptLoss
class GptLoss : public nn::Cloneable<GptLoss> {
 public:
  void reset() override {}
  Tensor forward(const Tensor& logits, const Tensor& targets);
  void pretty_print(std::ostream& out) const override { out << "GptLoss()"; }
};

// Floats a training step of `config` at batch [batch, tokens] must keep from forward for
// backward, at least (what PyTorch's autograd saves for these layers, with attention that
// keeps q, k, v, its output and log-sum-exp, as a fused kernel does): per block and token
// the two LayerNorms' inputs and outputs and statistics, q k v, the attention's output and
// log-sum-exp per head, the GELU's input and output (16 C + 4 + n_head floats); then the
// final LayerNorm's input and output and the logits' softmax (2 C + padded_vocab_size).
int64_t GptSavedActivations(const GptConfig& config, int64_t batch, int64_t tokens);

// A synthetic batch for timing a GPT without a corpus: `batch` rows of `tokens` ids from a fixed
// pseudo-random sequence of `seed` (the same on every machine), and as targets the next ids.
struct TokenBatch {
  Tensor x, y;  // int64 [batch, tokens]
};
TokenBatch SyntheticTokenBatch(const GptConfig& config, int64_t batch, int64_t tokens,
                               uint64_t seed, Device device = Device::Cpu(0));

}  // namespace tandem::examples

#endif  // TANDEM_EXAMPLES_GPT_H_
