#include "examples/gpt.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "tensor/ops/autocast_weights.h"

namespace tandem::examples {
namespace {

constexpr double kInitStd = 0.02;

// Overwrites `weight` with normal(0, std) draws on its device (GPT-2's initialisation).
void FillNormal(const Tensor& weight, double std) {
  NoGradGuard no_grad;
  Tensor target = weight;
  target.copy_(randn(weight.shape(), TensorOptions().device(weight.device())) * std);
}

void CheckConfig(const GptConfig& c) {
  TANDEM_CHECK(c.vocab_size() > 0 && c.block_size() > 0 && c.n_layer() > 0 && c.n_head() > 0 &&
                   c.n_embd() > 0,
               "GptConfig: vocab_size, block_size, n_layer, n_head and n_embd must be positive "
               "but are ",
               c.vocab_size(), ", ", c.block_size(), ", ", c.n_layer(), ", ", c.n_head(), ", ",
               c.n_embd());
  TANDEM_CHECK(c.n_embd() % c.n_head() == 0, "GptConfig: n_embd (", c.n_embd(),
               ") must be divisible by n_head (", c.n_head(),
               "); e.g. n_embd=", c.n_head() * std::max<int64_t>(1, c.n_embd() / c.n_head()));
  TANDEM_CHECK(c.dropout() >= 0.0 && c.dropout() < 1.0, "GptConfig: dropout must be in [0, 1) ",
               "but is ", c.dropout());
  TANDEM_CHECK(c.vocab_multiple() >= 1, "GptConfig: vocab_multiple must be >= 1 (1: no padding) ",
               "but is ", c.vocab_multiple());
}

nn::Linear MakeLinear(int64_t in, int64_t out, bool bias) { return nn::Linear(in, out, bias); }

std::shared_ptr<nn::LayerNorm> MakeLayerNorm(const GptConfig& c) {
  return std::make_shared<nn::LayerNorm>(std::vector<int64_t>{c.n_embd()}, 1e-5,
                                         /*elementwise_affine=*/true);
}

// Mean cross-entropy of logits [B, T, V] against targets [B, T].
Tensor TokenCrossEntropy(const Tensor& logits, const Tensor& targets) {
  TANDEM_CHECK(logits.defined() && targets.defined() && logits.dim() == 3 && targets.dim() == 2 &&
                   logits.size(0) == targets.size(0) && logits.size(1) == targets.size(1),
               "Gpt loss: expected logits [B, T, V] and targets [B, T] but got ",
               logits.defined() ? ShapeToString(logits.shape()) : std::string("undefined"), " and ",
               targets.defined() ? ShapeToString(targets.shape()) : std::string("undefined"));
  return cross_entropy(logits.reshape({-1, logits.size(2)}), targets.reshape({-1}));
}

}  // namespace

GptConfig GptConfig::Gpt2() {
  return GptConfig()
      .vocab_size(50257)
      .block_size(1024)
      .n_layer(12)
      .n_head(12)
      .n_embd(768)
      .dropout(0.0)
      .bias(true);
}

GptConfig GptConfig::Small() {
  return GptConfig().vocab_size(256).block_size(128).n_layer(4).n_head(4).n_embd(128).dropout(0.1);
}

// ---- CausalSelfAttention ---------------------------------------------------------------

CausalSelfAttention::CausalSelfAttention(const GptConfig& config) : config_(config) {
  CheckConfig(config_);
  reset();
}

void CausalSelfAttention::reset() {
  const int64_t c = config_.n_embd();
  c_attn_ = register_module("c_attn", MakeLinear(c, 3 * c, config_.bias()));
  c_proj_ = register_module("c_proj", MakeLinear(c, c, config_.bias()));
  resid_dropout_ = register_module("resid_dropout", nn::Dropout(config_.dropout()));
}

Tensor CausalSelfAttention::forward(const Tensor& x) {
  TANDEM_CHECK(x.defined() && x.dim() == 3 && x.size(2) == config_.n_embd(), ToString(),
               ": expected an input [B, T, ", config_.n_embd(), "] but got ",
               x.defined() ? ShapeToString(x.shape()) : std::string("an undefined tensor"));
  const int64_t b = x.size(0), t = x.size(1), c = config_.n_embd(), h = config_.n_head();
  // [B, T, 3C] -> q, k, v [B, H, T, C / H]: views the attention kernels read in place, and one
  // node whose backward writes the packed gradient (split_heads, ops.h).
  const std::vector<Tensor> qkv = split_heads(c_attn_->forward(x), 3, h);
  const double p = is_training() ? config_.dropout() : 0.0;
  const Tensor y = scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], Tensor(), p,
                                                /*is_causal=*/true);
  return resid_dropout_->forward(c_proj_->forward(y.transpose(1, 2).reshape({b, t, c})));
}

void CausalSelfAttention::pretty_print(std::ostream& out) const {
  out << "n_head=" << config_.n_head() << ", n_embd=" << config_.n_embd()
      << ", dropout=" << config_.dropout() << ", is_causal=True";
}

// ---- GptMlp ------------------------------------------------------------------------------

GptMlp::GptMlp(const GptConfig& config) : config_(config) {
  CheckConfig(config_);
  reset();
}

void GptMlp::reset() {
  const int64_t c = config_.n_embd();
  c_fc_ = register_module("c_fc", MakeLinear(c, 4 * c, config_.bias()));
  c_proj_ = register_module("c_proj", MakeLinear(4 * c, c, config_.bias()));
  dropout_ = register_module("dropout", nn::Dropout(config_.dropout()));
}

Tensor GptMlp::forward(const Tensor& x) {
  // c_fc, the GELU and c_proj as one op: where the backend fuses, one GEMM for c_fc with its bias
  // and the GELU, and in backward one for the gradient through c_proj and the GELU with c_fc's
  // bias gradient (Note [Fused MLP], tensor/ops/linalg.cc); composed otherwise.
  return dropout_->forward(
      linear_gelu_linear(x, c_fc_->weight(), c_fc_->bias(), c_proj_->weight(), c_proj_->bias()));
}

// ---- GptBlock ----------------------------------------------------------------------------

GptBlock::GptBlock(const GptConfig& config) : config_(config) {
  CheckConfig(config_);
  reset();
}

void GptBlock::reset() {
  ln_1_ = register_module("ln_1", MakeLayerNorm(config_));
  attn_ = register_module("attn", CausalSelfAttention(config_));
  ln_2_ = register_module("ln_2", MakeLayerNorm(config_));
  mlp_ = register_module("mlp", GptMlp(config_));
}

Tensor GptBlock::forward(const Tensor& x) {
  const auto [stream, mlp] = forward_pending(x, Tensor());
  return stream + mlp;
}

std::pair<Tensor, Tensor> GptBlock::forward_pending(const Tensor& x, const Tensor& pending) {
  // Each residual add in the kernel of the norm after it (add_layer_norm, ops.h); under autocast
  // that kernel reads the 16-bit branch and writes the next GEMM's 16-bit input, with no cast
  // between them (Note [Autocast residual norm]).
  Tensor stream = x, h;
  if (pending.defined()) {
    std::tie(stream, h) = ln_1_->forward_with_residual(x, pending);
  } else {
    h = ln_1_->forward(x);
  }
  const auto [y, h2] = ln_2_->forward_with_residual(stream, attn_->forward(h));
  return {y, mlp_->forward(h2)};
}

// ---- Gpt ---------------------------------------------------------------------------------

Gpt::Gpt(const GptConfig& config) : config_(config) {
  CheckConfig(config_);
  reset();
}

void Gpt::reset() {
  const bool fresh = !cloning();
  {
    // The submodules skip their own (PyTorch-default) random draws, as in a clone:
    // reset_parameters() below overwrites every weight with GPT-2's initialisation.
    CloningScope skip_default_init;
    const int64_t c = config_.n_embd();
    wte_ = register_module("wte", nn::Embedding(config_.padded_vocab_size(), c));
    wpe_ = register_module("wpe", nn::Embedding(config_.block_size(), c));
    drop_ = register_module("drop", nn::Dropout(config_.dropout()));
    h_ = register_module("h", nn::ModuleList());
    blocks_.clear();
    for (int64_t i = 0; i < config_.n_layer(); ++i) {
      blocks_.push_back(std::make_shared<GptBlock>(config_));
      h_->push_back(blocks_.back());
    }
    ln_f_ = register_module("ln_f", MakeLayerNorm(config_));
  }
  if (fresh) reset_parameters();
}

void Gpt::reset_parameters() {
  // Everything a Linear or Embedding holds: normal(0, 0.02) and zero biases; the projections
  // that add into the residual stream (attn.c_proj, mlp.c_proj) get a std shrunk by
  // sqrt(2 n_layer), since 2 n_layer of them add up along the stream.
  const double residual_std = kInitStd / std::sqrt(2.0 * static_cast<double>(config_.n_layer()));
  for (const auto& [name, param] : named_parameters()) {
    const bool is_bias = name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    const bool in_norm = name.find("ln_") != std::string::npos;
    if (is_bias) {
      NoGradGuard no_grad;
      Tensor(param).zero_();
    } else if (in_norm) {
      NoGradGuard no_grad;
      Tensor(param).fill_(1.0);
    } else if (name.find("c_proj.weight") != std::string::npos) {
      FillNormal(param, residual_std);
    } else {
      FillNormal(param, kInitStd);
    }
  }
  // The padded rows of wte are zeros (as llm.c pads GPT-2's): never looked up, and their
  // logits are masked, so they stay what they are but for weight decay.
  const int64_t vocab = config_.vocab_size(), padding = config_.padded_vocab_size() - vocab;
  if (padding > 0) {
    NoGradGuard no_grad;
    wte_->weight().narrow(0, vocab, padding).zero_();
  }
}

std::vector<Tensor> Gpt::GemmWeights() const {
  // Read by name, without the parameters' read hooks: a sharded wrapper's hook would gather
  // every unit at once (FullyShardedDataParallel's parameters are views with a graph or
  // detached ones, which CastWeights skips either way).
  std::vector<Tensor> weights;
  const bool bias = config_.bias();
  for (int64_t i = 0; i < config_.n_layer(); ++i) {
    const std::string block = "h." + std::to_string(i) + ".";
    for (const char* linear : {"attn.c_attn.", "attn.c_proj.", "mlp.c_fc.", "mlp.c_proj."}) {
      weights.push_back(parameter(block + linear + "weight"));
      if (bias) weights.push_back(parameter(block + linear + "bias"));
    }
  }
  weights.push_back(parameter("wte.weight"));  // the tied head's weight
  return weights;
}

Tensor Gpt::forward(const Tensor& tokens) {
  TANDEM_CHECK(tokens.defined(), "Gpt: the tokens tensor is undefined");
  TANDEM_CHECK(tokens.dim() == 2 && tokens.dtype() == kInt64,
               "Gpt: expected int64 tokens [B, T] but got ", ShapeToString(tokens.shape()), " ",
               tokens.dtype(),
               "; add a batch dimension with unsqueeze(0) or convert with "
               ".to(kInt64)");
  const int64_t t = tokens.size(1);
  TANDEM_CHECK(t >= 1 && t <= config_.block_size(), "Gpt: a sequence of ", t,
               " tokens does not fit the context of ", config_.block_size(),
               " (block_size); pass at most block_size tokens (crop the oldest) or build the "
               "model with a larger block_size");
  if (config_.padded_vocab_size() > config_.vocab_size() && tokens.device().is_cpu()) {
    // wte has rows past the vocabulary (the padding), which its own range check accepts. On a
    // GPU the tokens stay there (no host sync in a step): a token in the padding reads a zero
    // row there, and as a target its -inf logit makes the loss inf.
    const std::vector<int64_t> values = tokens.contiguous().to_vector<int64_t>();
    for (int64_t v : values) {
      TANDEM_CHECK(v >= 0 && v < config_.vocab_size(), "Gpt: token ", v,
                   " is out of range for the vocabulary of ", config_.vocab_size(),
                   " (vocab_size); tokens must be in [0, vocab_size)");
    }
  }
  if (AutocastMode::IsEnabled(tokens.device().type())) {
    // Under autocast every GEMM casts its float32 weight and bias to the 16-bit dtype: 8 casts
    // a block and wte's for the head, each its own launch. One multi-tensor launch casts them
    // all into the guard's weight cache, where the linears find them (autocast_weights.h).
    autocast::CastWeights(GemmWeights());
  }
  const Tensor positions = arange(t, TensorOptions(kInt64).device(tokens.device()));
  Tensor x = drop_->forward(wte_->forward(tokens) + wpe_->forward(positions));
  // Without checkpoints each block's last residual add is left pending and fused into the next
  // norm (GptBlock::forward_pending); a checkpointed block keeps the one tensor between blocks
  // that checkpoint saves.
  Tensor pending;
  for (const auto& block : blocks_) {
    // The closure holds the block itself: a DataParallel replica is gone when backward
    // recomputes it.
    if (config_.checkpoint_activations()) {
      x = nn::checkpoint([block](const Tensor& h) { return block->forward(h); }, x);
    } else {
      std::tie(x, pending) = block->forward_pending(x, pending);
    }
  }
  // The tied head: logits = x wte^T, one product into [B * T, V] whose weight gradient
  // adds into wte's; the padding's mask is its bias (Note [Padded vocabulary]).
  const int64_t vocab = config_.vocab_size(), padded = config_.padded_vocab_size();
  const Tensor weight = wte_->weight();
  if (padded > vocab && (!head_mask_.defined() || head_mask_.device() != weight.device() ||
                         head_mask_.dtype() != weight.dtype())) {
    NoGradGuard no_grad;
    head_mask_ = full({padded}, -std::numeric_limits<double>::infinity(),
                      TensorOptions(weight.dtype()).device(weight.device()));
    head_mask_.narrow(0, 0, vocab).zero_();
  }
  const Tensor h =
      pending.defined() ? ln_f_->forward_with_residual(x, pending).second : ln_f_->forward(x);
  return linear(h, weight, padded > vocab ? head_mask_ : Tensor());
}

// Note [Padded vocabulary]: GPT-2's 50257 tokens make the head's GEMM [B T, 50257] and every
// row of the logits an odd length; padded to 50304 (a multiple of 64) the GEMM's tiles and each
// row's loads are aligned. The padded columns are masked rather than cut off: a narrow view
// [.., :vocab] would cost a copy of the whole logits for the loss (its rows no longer
// contiguous), where a bias of -inf is free in the GEMM's epilogue (Note [cuBLASLt epilogues]).
// With -inf logits the padding has probability exactly 0: softmax's sum, the log-sum-exp of the
// loss and the sampling in Generate never see it, and its logits' gradient, softmax - onehot,
// is exactly 0, so wte's padded rows get no gradient from the head either.

Tensor Gpt::loss(const Tensor& logits, const Tensor& targets) const {
  return TokenCrossEntropy(logits, targets);
}

Tensor GptLoss::forward(const Tensor& logits, const Tensor& targets) {
  return TokenCrossEntropy(logits, targets);
}

Tensor Gpt::Generate(const Tensor& prompt, int64_t max_new_tokens, double temperature,
                     std::optional<int64_t> top_k, Generator* gen,
                     const std::function<Tensor(const Tensor&)>& forward) {
  TANDEM_CHECK(prompt.defined() && (prompt.dim() == 1 || prompt.dim() == 2) &&
                   prompt.dtype() == kInt64 && prompt.size(-1) >= 1,
               "Gpt::Generate: expected a non-empty int64 prompt [T] or [B, T] but got ",
               prompt.defined() ? ShapeToString(prompt.shape()) : std::string("undefined"));
  TANDEM_CHECK(max_new_tokens >= 0, "Gpt::Generate: max_new_tokens must be >= 0 but is ",
               max_new_tokens);
  TANDEM_CHECK(temperature > 0.0 && std::isfinite(temperature),
               "Gpt::Generate: temperature must be a finite number > 0 but is ", temperature,
               "; use a small value such as 1e-3 for nearly greedy sampling");
  const int64_t vocab = config_.vocab_size();
  if (top_k) {
    TANDEM_CHECK(*top_k >= 1, "Gpt::Generate: top_k must be >= 1 but is ", *top_k,
                 "; omit it to sample from the whole vocabulary");
  }
  const int64_t k = top_k ? std::min(*top_k, vocab) : vocab;
  // Evaluation mode (no dropout) while sampling; the caller's mode comes back on any exit.
  struct ModeRestorer {
    Gpt* model;
    bool training;
    ~ModeRestorer() { model->train(training); }
  } restore{this, is_training()};
  eval();
  NoGradGuard no_grad;
  const Device device = this->device();
  const Tensor prompt2 = prompt.dim() == 1 ? prompt.unsqueeze(0) : prompt;
  const int64_t batch = prompt2.size(0);
  std::vector<std::vector<int64_t>> sequences(batch);
  {
    const std::vector<int64_t> values = prompt2.contiguous().to_vector<int64_t>();
    const int64_t t0 = prompt2.size(1);
    for (int64_t i = 0; i < batch; ++i) {
      sequences[i].assign(values.begin() + i * t0, values.begin() + (i + 1) * t0);
    }
  }
  Generator& source = gen != nullptr ? *gen : default_generator();
  for (int64_t step = 0; step < max_new_tokens; ++step) {
    const int64_t length = static_cast<int64_t>(sequences[0].size());
    const int64_t window = std::min(length, config_.block_size());
    std::vector<int64_t> context;
    context.reserve(batch * window);
    for (const auto& sequence : sequences) {
      context.insert(context.end(), sequence.end() - window, sequence.end());
    }
    const Tensor tokens = from_vector(context, {batch, window}).to(device);
    const Tensor logits = forward ? forward(tokens) : this->forward(tokens);
    Tensor last = logits.select(1, window - 1).to(kFloat32) / temperature;  // [B, V]
    if (k < vocab) {
      // Everything below the k-th largest logit is excluded (ties with it stay).
      const Tensor kth = topk(last, k, -1).first.narrow(1, k - 1, 1);
      last = masked_fill(last, lt(last, kth), -std::numeric_limits<double>::infinity());
    }
    const std::vector<float> probs = softmax(last, -1).to(Device::Cpu(0)).to_vector<float>();
    const std::vector<float> draws = rand({batch}, TensorOptions(), &source).to_vector<float>();
    for (int64_t i = 0; i < batch; ++i) {
      // Inverse CDF; the last token with non-zero probability absorbs rounding.
      const float* p = probs.data() + i * config_.padded_vocab_size();
      double cumulative = 0.0;
      int64_t chosen = -1;
      for (int64_t v = 0; v < vocab; ++v) {
        if (p[v] <= 0.0f) continue;
        chosen = v;
        cumulative += p[v];
        if (draws[i] < cumulative) break;
      }
      TANDEM_CHECK(chosen >= 0, "Gpt::Generate: the next-token distribution is empty (NaN ",
                   "logits?); check the model's weights");
      sequences[i].push_back(chosen);
    }
  }
  std::vector<int64_t> flat;
  for (const auto& sequence : sequences) flat.insert(flat.end(), sequence.begin(), sequence.end());
  const int64_t total = static_cast<int64_t>(sequences[0].size());
  Tensor out = from_vector(flat, {batch, total}).to(device);
  return prompt.dim() == 1 ? out.reshape({total}) : out;
}

int64_t Gpt::num_parameters() const {
  int64_t total = 0;
  for (const Tensor& p : parameters()) total += p.numel();
  return total;
}

TokenBatch SyntheticTokenBatch(const GptConfig& config, int64_t batch, int64_t tokens,
                               uint64_t seed, Device device) {
  std::vector<int64_t> ids(static_cast<size_t>(batch * (tokens + 1)));
  uint64_t state = seed;
  for (int64_t& id : ids) {  // a 64-bit linear congruential generator's high bits
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    id = static_cast<int64_t>((state >> 33) % static_cast<uint64_t>(config.vocab_size()));
  }
  const Tensor all = from_vector(ids, {batch, tokens + 1}, TensorOptions().device(device));
  return {all.narrow(1, 0, tokens).contiguous(), all.narrow(1, 1, tokens).contiguous()};
}

int64_t GptSavedActivations(const GptConfig& config, int64_t batch, int64_t tokens) {
  const int64_t n = batch * tokens, c = config.n_embd();
  const int64_t per_block = n * (16 * c + 4 + config.n_head());
  return config.n_layer() * per_block + n * (2 * c + config.padded_vocab_size());
}

}  // namespace tandem::examples
