#include "nn/attention.h"

#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "tensor/core/autograd.h"
#include "tensor/tensor.h"

namespace tandem::nn {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::string Describe(const MultiheadAttentionOptions& o) {
  return "MultiheadAttention(embed_dim=" + std::to_string(o.embed_dim()) +
         ", num_heads=" + std::to_string(o.num_heads()) + ")";
}

// PyTorch's _canonical_mask: a bool mask (true = excluded) becomes -inf where true and 0
// elsewhere; a floating mask is added as it is. Either way in the scores' dtype, so that
// bool and floating masks combine by addition.
Tensor AdditiveMask(const Tensor& mask, DType dtype, const MultiheadAttentionOptions& o,
                    const char* name) {
  if (mask.dtype() == kBool) {
    return masked_fill(zeros(mask.shape(), TensorOptions().dtype(dtype).device(mask.device())),
                       mask, -kInf);
  }
  TANDEM_CHECK(IsFloatingPoint(mask.dtype()), Describe(o), ": ", name,
               " must be bool (true = not allowed) or floating (added to the scores) but is ",
               mask.dtype(), "; convert it with to(kBool)");
  return mask.to(dtype);
}

// One more key allowed: a 0 column appended to an additive mask.
Tensor AppendKeyColumn(const Tensor& mask) {
  Shape shape = mask.shape();
  shape.back() = 1;
  return cat({mask, zeros(shape, TensorOptions().dtype(mask.dtype()).device(mask.device()))}, -1);
}

// -inf above the diagonal of an L x S matrix (query i attends keys 0..i), in `dtype`.
Tensor CausalAdditiveMask(int64_t l, int64_t s, DType dtype, Device device) {
  std::vector<bool> excluded(static_cast<size_t>(l * s));
  for (int64_t i = 0; i < l; ++i) {
    for (int64_t j = 0; j < s; ++j) excluded[static_cast<size_t>(i * s + j)] = j > i;
  }
  return masked_fill(zeros({l, s}, TensorOptions().dtype(dtype).device(device)),
                     from_vector(excluded, {l, s}).to(device), -kInf);
}

// In place, without recording: torch.nn.init.xavier_uniform_ of a 2-D weight [out, in].
void XavierUniform(const Tensor& weight) {
  const double fan_out = static_cast<double>(weight.size(0));
  const double fan_in = static_cast<double>(weight.size(1));
  const double bound = std::sqrt(6.0 / (fan_in + fan_out));
  Tensor target = weight;
  target.copy_(uniform(weight.shape(), -bound, bound, TensorOptions().device(weight.device())));
}

// xavier_normal_ of a [1, 1, E] bias, whose fans are both E (PyTorch's receptive field is
// the product of the dimensions after the first two).
void XavierNormal(const Tensor& bias) {
  const double fan = static_cast<double>(bias.size(1) * bias.size(2));
  Tensor target = bias;
  target.copy_(randn(bias.shape(), TensorOptions().device(bias.device())) *
               std::sqrt(2.0 / (fan + fan)));
}

}  // namespace

// ---- NonDynamicallyQuantizableLinear ---------------------------------------------------

std::shared_ptr<Module> NonDynamicallyQuantizableLinear::clone(std::optional<Device> device) const {
  NoGradGuard no_grad;
  auto copy = std::make_shared<NonDynamicallyQuantizableLinear>(*this);
  copy->ClearRegistrations();
  {
    CloningScope scope;
    copy->reset();
  }
  copy->CopyStateFrom(*this, device);
  return copy;
}

// ---- MultiheadAttention ----------------------------------------------------------------

MultiheadAttention::MultiheadAttention(const MultiheadAttentionOptions& options)
    : options_(options) {
  const int64_t e = options_.embed_dim();
  const int64_t h = options_.num_heads();
  TANDEM_CHECK(e > 0 && h > 0, "MultiheadAttention: embed_dim and num_heads must be positive ",
               "but are ", e, " and ", h);
  TANDEM_CHECK(e % h == 0, "MultiheadAttention: embed_dim (", e, ") must be divisible by ",
               "num_heads (", h, "); each head gets embed_dim / num_heads features: pick ",
               "num_heads among the divisors of ", e);
  TANDEM_CHECK(options_.dropout() >= 0.0 && options_.dropout() <= 1.0,
               "MultiheadAttention: dropout must be in [0, 1] but is ", options_.dropout());
  TANDEM_CHECK(kdim() > 0 && vdim() > 0, "MultiheadAttention: kdim and vdim must be positive ",
               "but are ", kdim(), " and ", vdim());
  reset();
}

MultiheadAttention::MultiheadAttention(int64_t embed_dim, int64_t num_heads)
    : MultiheadAttention(MultiheadAttentionOptions(embed_dim, num_heads)) {}

void MultiheadAttention::reset() {
  const int64_t e = embed_dim();
  // Values come from reset_parameters() (or, when cloning, from the original).
  if (qkv_same_embed_dim()) {
    in_proj_weight_ = register_parameter("in_proj_weight", empty({3 * e, e}));
  } else {
    q_proj_weight_ = register_parameter("q_proj_weight", empty({e, e}));
    k_proj_weight_ = register_parameter("k_proj_weight", empty({e, kdim()}));
    v_proj_weight_ = register_parameter("v_proj_weight", empty({e, vdim()}));
  }
  if (options_.bias()) in_proj_bias_ = register_parameter("in_proj_bias", empty({3 * e}));
  out_proj_ = register_module(
      "out_proj", std::make_shared<NonDynamicallyQuantizableLinear>(e, e, options_.bias()));
  if (options_.add_bias_kv()) {
    bias_k_ = register_parameter("bias_k", empty({1, 1, e}));
    bias_v_ = register_parameter("bias_v", empty({1, 1, e}));
  }
  if (!cloning()) reset_parameters();
}

void MultiheadAttention::reset_parameters() {
  NoGradGuard no_grad;
  if (in_proj_weight_) {
    XavierUniform(*in_proj_weight_);
  } else {
    XavierUniform(*q_proj_weight_);
    XavierUniform(*k_proj_weight_);
    XavierUniform(*v_proj_weight_);
  }
  if (in_proj_bias_) {
    Tensor in_bias = *in_proj_bias_;
    in_bias.zero_();
    Tensor out_bias = out_proj_->bias();
    out_bias.zero_();
  }
  if (bias_k_) {
    XavierNormal(*bias_k_);
    XavierNormal(*bias_v_);
  }
}

std::tuple<Tensor, Tensor> MultiheadAttention::forward(const Tensor& query, const Tensor& key,
                                                       const Tensor& value,
                                                       const Tensor& key_padding_mask,
                                                       bool need_weights, const Tensor& attn_mask,
                                                       bool average_attn_weights, bool is_causal) {
  const int64_t e = embed_dim();
  const int64_t h = num_heads();
  const int64_t hd = head_dim();
  const bool bf = batch_first();
  TANDEM_CHECK(query.defined() && key.defined() && value.defined(), Describe(options_),
               ": query, key and value must all be defined tensors");
  TANDEM_CHECK(query.dim() == 2 || query.dim() == 3, Describe(options_), ": expected a query of ",
               bf ? "[batch, L, embed_dim]" : "[L, batch, embed_dim]",
               " (or unbatched [L, embed_dim]) but got ", ShapeToString(query.shape()));
  TANDEM_CHECK(key.dim() == query.dim() && value.dim() == query.dim(), Describe(options_),
               ": query, key and value must have the same number of dimensions but have shapes ",
               ShapeToString(query.shape()), ", ", ShapeToString(key.shape()), " and ",
               ShapeToString(value.shape()));
  const bool batched = query.dim() == 3;
  // Inputs stay in their layout, [length, batch, E] or [batch, length, E] (an unbatched
  // input gets a batch dimension of 1): no transposed copies on either side.
  const bool batch_major = batched && bf;
  const int64_t seq_dim = batch_major ? 1 : 0;
  const int64_t batch_dim = batch_major ? 0 : 1;
  Tensor q = query, k = key, v = value;
  if (!batched) {
    q = q.unsqueeze(1);
    k = k.unsqueeze(1);
    v = v.unsqueeze(1);
  }
  const int64_t l = q.size(seq_dim);
  const int64_t b = q.size(batch_dim);
  int64_t s = k.size(seq_dim);
  const auto shapes = [&] {
    return "query " + ShapeToString(query.shape()) + ", key " + ShapeToString(key.shape()) +
           ", value " + ShapeToString(value.shape()) + (bf ? " (batch_first)" : "");
  };
  TANDEM_CHECK(q.size(2) == e && k.size(2) == kdim() && v.size(2) == vdim(), Describe(options_),
               ": expected features (last dimension) query ", e, ", key ", kdim(), ", value ",
               vdim(), " but got ", shapes());
  TANDEM_CHECK(k.size(batch_dim) == b && v.size(batch_dim) == b && v.size(seq_dim) == s,
               Describe(options_),
               ": query, key and value must have the same batch size and key and value the ",
               "same length but got ", shapes());
  const Tensor& any_weight = in_proj_weight_ ? *in_proj_weight_ : *q_proj_weight_;
  TANDEM_CHECK(query.device() == any_weight.device() && key.device() == any_weight.device() &&
                   value.device() == any_weight.device(),
               Describe(options_), ": the inputs are on ", query.device(), ", ", key.device(),
               " and ", value.device(), " but the parameters are on ", any_weight.device(),
               "; move them to one device");
  if (key_padding_mask.defined()) {
    const Shape expected = batched ? Shape{b, s} : Shape{s};
    TANDEM_CHECK(key_padding_mask.shape() == expected, Describe(options_),
                 ": expected key_padding_mask of shape ", ShapeToString(expected),
                 " ([batch, S], S the key length) but got ",
                 ShapeToString(key_padding_mask.shape()));
  }
  if (attn_mask.defined()) {
    TANDEM_CHECK((attn_mask.dim() == 2 && attn_mask.shape() == Shape{l, s}) ||
                     (attn_mask.dim() == 3 && attn_mask.shape() == Shape{b * h, l, s}),
                 Describe(options_), ": expected attn_mask of shape ", ShapeToString(Shape{l, s}),
                 " or ", ShapeToString(Shape{b * h, l, s}),
                 " ([L, S] or [batch * num_heads, L, S]) but got ",
                 ShapeToString(attn_mask.shape()));
  }

  // Input projections; self-attention runs one GEMM over the packed weight, as PyTorch does.
  Tensor qp, kp, vp;
  const Tensor bias = in_proj_bias();
  const auto bias_part = [&](int64_t i) {
    return bias.defined() ? bias.narrow(0, i * e, e) : bias;
  };
  if (in_proj_weight_) {
    const Tensor& w = *in_proj_weight_;
    if (query.impl() == key.impl() && key.impl() == value.impl()) {
      std::vector<Tensor> qkv = linear(q, w, bias).chunk(3, -1);
      qp = qkv[0];
      kp = qkv[1];
      vp = qkv[2];
    } else {
      qp = linear(q, w.narrow(0, 0, e), bias_part(0));
      kp = linear(k, w.narrow(0, e, e), bias_part(1));
      vp = linear(v, w.narrow(0, 2 * e, e), bias_part(2));
    }
  } else {
    qp = linear(q, *q_proj_weight_, bias_part(0));
    kp = linear(k, *k_proj_weight_, bias_part(1));
    vp = linear(v, *v_proj_weight_, bias_part(2));
  }
  const DType dtype = qp.dtype();

  // One additive mask broadcasting to [batch, heads, L, S], or none.
  Tensor mask;
  bool causal_hint = false;  // let scaled_dot_product_attention apply the causal mask
  if (attn_mask.defined()) {
    mask = AdditiveMask(attn_mask, dtype, options_, "attn_mask");
    if (mask.dim() == 3) mask = mask.reshape({b, h, l, s});
  } else if (is_causal) {
    if (!key_padding_mask.defined() && !need_weights && !options_.add_bias_kv() &&
        !options_.add_zero_attn()) {
      causal_hint = true;
    } else {
      mask = CausalAdditiveMask(l, s, dtype, qp.device());
    }
  }
  if (key_padding_mask.defined()) {
    Tensor padding =
        AdditiveMask(key_padding_mask, dtype, options_, "key_padding_mask").reshape({b, 1, 1, s});
    mask = mask.defined() ? mask + padding : padding;
  }
  if (options_.add_bias_kv()) {
    const Shape one_key = batch_major ? Shape{b, 1, e} : Shape{1, b, e};
    kp = cat({kp, bias_k().to(dtype).expand(one_key)}, seq_dim);
    vp = cat({vp, bias_v().to(dtype).expand(one_key)}, seq_dim);
    if (mask.defined()) mask = AppendKeyColumn(mask);
    ++s;
  }
  // -> [batch, heads, length, head_dim].
  const auto to_heads = [&](const Tensor& t, int64_t length) {
    return batch_major ? t.reshape({b, length, h, hd}).permute({0, 2, 1, 3})
                       : t.reshape({length, b, h, hd}).permute({1, 2, 0, 3});
  };
  Tensor qh = to_heads(qp, l);
  Tensor kh = to_heads(kp, s);
  Tensor vh = to_heads(vp, s);
  if (options_.add_zero_attn()) {
    const Tensor zero = zeros({b, h, 1, hd}, TensorOptions().dtype(dtype).device(qh.device()));
    kh = cat({kh, zero}, 2);
    vh = cat({vh, zero}, 2);
    if (mask.defined()) mask = AppendKeyColumn(mask);
    ++s;
  }

  const double p = is_training() ? options_.dropout() : 0.0;
  Tensor attended, weights;
  if (!need_weights) {
    attended = scaled_dot_product_attention(qh, kh, vh, mask, p, causal_hint);
  } else {
    // PyTorch's explicit path: the weights are returned, after dropout as PyTorch's are.
    Tensor scores = matmul(qh * (1.0 / std::sqrt(static_cast<double>(hd))), kh.transpose(-2, -1));
    if (mask.defined()) scores = scores + mask;
    weights = dropout(softmax(scores, -1), p, /*training=*/p > 0.0);
    attended = matmul(weights, vh);
  }
  Tensor out = out_proj_->forward(batch_major ? attended.permute({0, 2, 1, 3}).reshape({b, l, e})
                                              : attended.permute({2, 0, 1, 3}).reshape({l, b, e}));
  if (!batched) out = out.squeeze(1);
  if (need_weights) {
    if (average_attn_weights) weights = weights.mean({1});
    if (!batched) weights = weights.squeeze(0);
  }
  return {out, weights};
}

std::vector<Tensor> MultiheadAttention::forward_tensors(const std::vector<Tensor>& inputs) {
  const Tensor none;
  switch (inputs.size()) {
    case 1:
      return {std::get<0>(forward(inputs[0], inputs[0], inputs[0], none, false))};
    case 3:
      return {std::get<0>(forward(inputs[0], inputs[1], inputs[2], none, false))};
    case 4:
      return {std::get<0>(forward(inputs[0], inputs[1], inputs[2], inputs[3], false))};
    case 5:
      return {std::get<0>(forward(inputs[0], inputs[1], inputs[2], inputs[3], false, inputs[4]))};
    default:
      TANDEM_FAIL(Describe(options_), ": forward_tensors takes {x} (self-attention), {query, ",
                  "key, value}, {query, key, value, key_padding_mask} or {query, key, value, ",
                  "key_padding_mask, attn_mask} but was given ", inputs.size(), " tensors");
  }
}

}  // namespace tandem::nn
