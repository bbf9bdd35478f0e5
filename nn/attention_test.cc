#include "nn/attention.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "nn/test_util.h"
#include "tensor/core/autograd.h"
#include "tensor/gradcheck.h"
#include "tensor/runtime/devices.h"
#include "tensor/testing.h"

namespace tandem::nn {
namespace {

using testing::ErrorOf;
using ::testing::HasSubstr;

constexpr double kInf = std::numeric_limits<double>::infinity();

class AttentionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetCpuDeviceCount(2);
    manual_seed(0);
  }
};

// Largest |t|.
double MaxAbs(const Tensor& t) { return amax(abs(t.to(kFloat64)).flatten(), 0).item(); }

std::vector<std::string> Names(const std::vector<NamedTensor>& entries) {
  std::vector<std::string> names;
  for (const NamedTensor& e : entries) names.push_back(e.name);
  return names;
}

// What the reference adds to the score of query i, key j in batch b and head h: 0 for
// allowed, -inf for excluded, or any float.
using MaskFn = std::function<double(int64_t b, int64_t h, int64_t i, int64_t j)>;

// MultiheadAttention written out one batch element and one head at a time, with its own
// slicing (not the module's reshapes), in the seq-first layout: query [L, B, E],
// key [S, B, kdim], value [S, B, vdim]. extra_k / extra_v [n, E] are appended to every
// batch element's projected keys and values (bias_k, add_zero_attn's zeros), always allowed.
// Returns the output [L, B, E]; *weights gets [B, H, L, S + n].
Tensor Reference(const MultiheadAttention& m, const Tensor& query, const Tensor& key,
                 const Tensor& value, const MaskFn& mask, Tensor* weights,
                 const Tensor& extra_k = Tensor(), const Tensor& extra_v = Tensor()) {
  const int64_t e = m.embed_dim(), h = m.num_heads(), hd = m.head_dim();
  const int64_t l = query.size(0), b = query.size(1), s = key.size(0);
  Tensor wq, wk, wv;
  if (m.qkv_same_embed_dim()) {
    wq = m.in_proj_weight().narrow(0, 0, e);
    wk = m.in_proj_weight().narrow(0, e, e);
    wv = m.in_proj_weight().narrow(0, 2 * e, e);
  } else {
    wq = m.q_proj_weight();
    wk = m.k_proj_weight();
    wv = m.v_proj_weight();
  }
  const Tensor bias = m.in_proj_bias().defined()
                          ? m.in_proj_bias()
                          : zeros({3 * e}, TensorOptions().dtype(query.dtype()));
  const int64_t extra = extra_k.defined() ? extra_k.size(0) : 0;
  std::vector<Tensor> outputs, batch_weights;
  for (int64_t bi = 0; bi < b; ++bi) {
    Tensor qb = matmul(query.select(1, bi), wq.t()) + bias.narrow(0, 0, e);
    Tensor kb = matmul(key.select(1, bi), wk.t()) + bias.narrow(0, e, e);
    Tensor vb = matmul(value.select(1, bi), wv.t()) + bias.narrow(0, 2 * e, e);
    if (extra > 0) {
      kb = cat({kb, extra_k}, 0);
      vb = cat({vb, extra_v}, 0);
    }
    std::vector<Tensor> heads, head_weights;
    for (int64_t hi = 0; hi < h; ++hi) {
      Tensor qh = qb.narrow(1, hi * hd, hd), kh = kb.narrow(1, hi * hd, hd);
      Tensor vh = vb.narrow(1, hi * hd, hd);
      std::vector<double> added(static_cast<size_t>(l * (s + extra)), 0.0);
      for (int64_t i = 0; i < l; ++i) {
        for (int64_t j = 0; j < s; ++j) added[i * (s + extra) + j] = mask ? mask(bi, hi, i, j) : 0;
      }
      Tensor scores = matmul(qh, kh.t()) / std::sqrt(static_cast<double>(hd)) +
                      from_vector(added, {l, s + extra}, TensorOptions().dtype(query.dtype()));
      Tensor w = softmax(scores, -1);
      heads.push_back(matmul(w, vh));
      head_weights.push_back(w);
    }
    Tensor concat = cat(heads, 1);
    Tensor out = matmul(concat, m.out_proj()->weight().t());
    if (m.out_proj()->bias().defined()) out = out + m.out_proj()->bias();
    outputs.push_back(out);
    batch_weights.push_back(stack(head_weights, 0));
  }
  if (weights != nullptr) *weights = stack(batch_weights, 0);
  return stack(outputs, 1);
}

// Inputs of order 1 in float64 (the module converted to match), so that comparisons are
// exact to rounding.
Tensor Randn64(const Shape& shape) { return randn(shape, TensorOptions().dtype(kFloat64)); }

// Biases start at zero; give them values so that the tests see them.
void RandomiseBiases(MultiheadAttention& m) {
  NoGradGuard no_grad;
  for (const NamedTensor& p : m.named_parameters()) {
    if (p.name.find("bias") != std::string::npos) {
      Tensor t = p.value;
      t.copy_(randn(t.shape(), TensorOptions().dtype(t.dtype())));
    }
  }
}

// ---- Construction, initialisation, printing --------------------------------------------

TEST_F(AttentionTest, ParametersAreNamedShapedAndInitialisedLikePyTorch) {
  MultiheadAttention m(64, 8);
  EXPECT_EQ(Names(m.named_parameters()),
            (std::vector<std::string>{"in_proj_weight", "in_proj_bias", "out_proj.weight",
                                      "out_proj.bias"}));
  EXPECT_EQ(m.in_proj_weight().shape(), (Shape{192, 64}));
  EXPECT_EQ(m.in_proj_bias().shape(), (Shape{192}));
  int64_t count = 0;
  for (const Tensor& p : m.parameters()) count += p.numel();
  EXPECT_EQ(count, 4 * 64 * 64 + 4 * 64);  // PyTorch's sum(p.numel()): 16640
  // xavier_uniform_: bound sqrt(6 / (fan_in + fan_out)) = sqrt(6 / 256); reached and not
  // exceeded. out_proj keeps Linear's bound 1/sqrt(64) = 0.125.
  const double xavier = std::sqrt(6.0 / 256.0);
  EXPECT_LE(MaxAbs(m.in_proj_weight()), xavier);
  EXPECT_GT(MaxAbs(m.in_proj_weight()), 0.95 * xavier);
  EXPECT_LE(MaxAbs(m.out_proj()->weight()), 0.125);
  EXPECT_GT(MaxAbs(m.out_proj()->weight()), 0.95 * 0.125);
  EXPECT_EQ(MaxAbs(m.in_proj_bias()), 0.0);
  EXPECT_EQ(MaxAbs(m.out_proj()->bias()), 0.0);

  MultiheadAttention cross(
      MultiheadAttentionOptions(8, 2).kdim(5).vdim(3).add_bias_kv(true).bias(true));
  EXPECT_EQ(
      Names(cross.named_parameters()),
      (std::vector<std::string>{"q_proj_weight", "k_proj_weight", "v_proj_weight", "in_proj_bias",
                                "bias_k", "bias_v", "out_proj.weight", "out_proj.bias"}));
  EXPECT_FALSE(cross.in_proj_weight().defined());
  EXPECT_EQ(cross.k_proj_weight().shape(), (Shape{8, 5}));
  EXPECT_EQ(cross.v_proj_weight().shape(), (Shape{8, 3}));
  EXPECT_EQ(cross.bias_k().shape(), (Shape{1, 1, 8}));
  EXPECT_LE(MaxAbs(cross.k_proj_weight()), std::sqrt(6.0 / 13.0));
  EXPECT_GT(MaxAbs(cross.bias_k()), 0.0);  // xavier_normal_, not zeros

  MultiheadAttention no_bias(MultiheadAttentionOptions(8, 2).bias(false));
  EXPECT_EQ(Names(no_bias.named_parameters()),
            (std::vector<std::string>{"in_proj_weight", "out_proj.weight"}));
}

TEST_F(AttentionTest, PrintsLikePyTorch) {
  MultiheadAttention m(16, 4);
  EXPECT_EQ(m.ToString(),
            "MultiheadAttention(\n"
            "  (out_proj): NonDynamicallyQuantizableLinear(in_features=16, out_features=16, "
            "bias=True)\n"
            ")");
  EXPECT_EQ(m.clone()->ToString(), m.ToString());
}

TEST_F(AttentionTest, RejectsBadOptionsAndShapes) {
  EXPECT_THAT(ErrorOf([] { MultiheadAttention(10, 3); }),
              HasSubstr("embed_dim (10) must be divisible by num_heads (3)"));
  EXPECT_THAT(ErrorOf([] { MultiheadAttention(0, 1); }), HasSubstr("must be positive"));
  EXPECT_THAT(ErrorOf([] { MultiheadAttention(MultiheadAttentionOptions(4, 2).dropout(1.5)); }),
              HasSubstr("dropout must be in [0, 1] but is 1.5"));
  MultiheadAttention m(8, 2);
  const Tensor x = randn({5, 3, 8});  // [L, B, E]
  EXPECT_THAT(ErrorOf([&] {
                m.forward(randn({5, 3, 7}), x, x);
              }),
              HasSubstr("expected features (last dimension) query 8, key 8, value 8"));
  EXPECT_THAT(ErrorOf([&] {
                m.forward(x, randn({4, 2, 8}), randn({4, 2, 8}));
              }),
              HasSubstr("same batch size"));
  EXPECT_THAT(ErrorOf([&] {
                m.forward(x, x, x, Tensor(), true, zeros({5, 4}));
              }),
              HasSubstr("expected attn_mask of shape [5, 5] or [6, 5, 5]"));
  EXPECT_THAT(ErrorOf([&] {
                m.forward(x, x, x, Tensor(), true, zeros({3, 5, 5}));
              }),
              HasSubstr("but got [3, 5, 5]"));
  EXPECT_THAT(ErrorOf([&] {
                m.forward(x, x, x, zeros({5, 3}, TensorOptions().dtype(kBool)));
              }),
              HasSubstr("expected key_padding_mask of shape [3, 5]"));
  EXPECT_THAT(ErrorOf([&] {
                m.forward(x, x, x, Tensor(), true, zeros({5, 5}, TensorOptions().dtype(kInt64)));
              }),
              HasSubstr("attn_mask must be bool (true = not allowed) or floating"));
  EXPECT_THAT(ErrorOf([&] {
                m.forward(randn({2, 3, 4, 8}), x, x);
              }),
              HasSubstr("expected a query of [L, batch, embed_dim]"));
  EXPECT_THAT(ErrorOf([&] { m.forward_tensors({x, x}); }), HasSubstr("was given 2 tensors"));
}

// ---- Values against the reference ------------------------------------------------------

TEST_F(AttentionTest, MatchesTheReferenceWithAndWithoutWeights) {
  MultiheadAttention m(8, 2);
  m.to(kFloat64);
  RandomiseBiases(m);
  const Tensor q = Randn64({4, 3, 8}), k = Randn64({6, 3, 8}), v = Randn64({6, 3, 8});
  Tensor expected_weights;
  const Tensor expected = Reference(m, q, k, v, nullptr, &expected_weights);
  auto [out, weights] = m.forward(q, k, v);
  EXPECT_LT(testing::MaxAbsDiff(out, expected), 1e-12);
  EXPECT_LT(testing::MaxAbsDiff(weights, expected_weights.mean({1})),
            1e-12);  // averaged over heads
  auto [out_heads, per_head] = m.forward(q, k, v, Tensor(), true, Tensor(), false);
  EXPECT_LT(testing::MaxAbsDiff(per_head, expected_weights), 1e-12);  // [B, H, L, S]
  auto [fused, none] = m.forward(q, k, v, Tensor(), /*need_weights=*/false);
  EXPECT_FALSE(none.defined());
  EXPECT_LT(testing::MaxAbsDiff(fused, expected), 1e-12);
  // Self-attention (one tensor for all three) takes the packed projection.
  const std::vector<Tensor> self = m.forward_tensors({q});
  EXPECT_LT(testing::MaxAbsDiff(self[0], Reference(m, q, q, q, nullptr, nullptr)), 1e-12);
}

TEST_F(AttentionTest, BatchFirstAndUnbatchedMatchSeqFirst) {
  MultiheadAttention seq_first(8, 4);
  seq_first.to(kFloat64);
  RandomiseBiases(seq_first);
  MultiheadAttention batch_first(MultiheadAttentionOptions(8, 4).batch_first(true));
  batch_first.to(kFloat64);
  batch_first.load_state_dict(seq_first.state_dict());
  const Tensor q = Randn64({3, 2, 8}), k = Randn64({5, 2, 8});
  const Tensor padding = from_vector(
      std::vector<bool>{false, false, true, false, true, false, true, false, false, false}, {2, 5});
  auto [out, weights] = seq_first.forward(q, k, k, padding);
  auto [out_bf, weights_bf] =
      batch_first.forward(q.transpose(0, 1), k.transpose(0, 1), k.transpose(0, 1), padding);
  EXPECT_EQ(out_bf.shape(), (Shape{2, 3, 8}));
  EXPECT_LT(testing::MaxAbsDiff(out_bf, out.transpose(0, 1)), 1e-12);
  EXPECT_LT(testing::MaxAbsDiff(weights_bf, weights), 1e-12);
  // Unbatched [L, E] is batch element 1 alone, with its [S] padding mask.
  auto [single, single_weights] =
      seq_first.forward(q.select(1, 1), k.select(1, 1), k.select(1, 1), padding.select(0, 1));
  EXPECT_EQ(single.shape(), (Shape{3, 8}));
  EXPECT_LT(testing::MaxAbsDiff(single, out.select(1, 1)), 1e-12);
  EXPECT_LT(testing::MaxAbsDiff(single_weights, weights.select(0, 1)), 1e-12);
}

TEST_F(AttentionTest, SeparateProjectionsForKdimAndVdim) {
  MultiheadAttention m(MultiheadAttentionOptions(6, 3).kdim(4).vdim(5));
  m.to(kFloat64);
  RandomiseBiases(m);
  const Tensor q = Randn64({2, 3, 6}), k = Randn64({7, 3, 4}), v = Randn64({7, 3, 5});
  Tensor expected_weights;
  const Tensor expected = Reference(m, q, k, v, nullptr, &expected_weights);
  auto [out, weights] = m.forward(q, k, v, Tensor(), true, Tensor(), false);
  EXPECT_LT(testing::MaxAbsDiff(out, expected), 1e-12);
  EXPECT_LT(testing::MaxAbsDiff(weights, expected_weights), 1e-12);
  EXPECT_LT(testing::MaxAbsDiff(std::get<0>(m.forward(q, k, v, Tensor(), false)), expected), 1e-12);
}

TEST_F(AttentionTest, BoolMasksAreTrueWhereNotAllowedAndFloatMasksAdd) {
  MultiheadAttention m(8, 2);
  m.to(kFloat64);
  RandomiseBiases(m);
  const int64_t l = 3, s = 4, b = 2, h = 2;
  const Tensor q = Randn64({l, b, 8}), k = Randn64({s, b, 8});
  // attn_mask [L, S]: query i may not see key (i + 1) % S.
  std::vector<bool> blocked(l * s, false);
  for (int64_t i = 0; i < l; ++i) blocked[i * s + (i + 1) % s] = true;
  const Tensor attn_mask = from_vector(blocked, {l, s});
  // key_padding_mask [B, S]: batch 0 ignores key 3, batch 1 key 0.
  const Tensor padding = from_vector(std::vector<bool>{false, false, false, true,  //
                                                       true, false, false, false},
                                     {b, s});
  const auto padded = [&](int64_t bi, int64_t j) {
    return (bi == 0 && j == 3) || (bi == 1 && j == 0);
  };
  const MaskFn both = [&](int64_t bi, int64_t, int64_t i, int64_t j) {
    return blocked[i * s + j] || padded(bi, j) ? -kInf : 0.0;
  };
  Tensor expected_weights;
  const Tensor expected = Reference(m, q, k, k, both, &expected_weights);
  for (bool need_weights : {true, false}) {
    SCOPED_TRACE(need_weights);
    auto [out, weights] = m.forward(q, k, k, padding, need_weights, attn_mask, false);
    EXPECT_LT(testing::MaxAbsDiff(out, expected), 1e-12);
    if (need_weights) {
      EXPECT_LT(testing::MaxAbsDiff(weights, expected_weights), 1e-12);
      EXPECT_EQ(MaxAbs(weights.select(0, 1).select(2, 0)), 0.0);  // padded key
    }
  }
  // A float [B * H, L, S] mask is added, per batch element and head.
  const Tensor added = Randn64({b * h, l, s});
  const std::vector<double> values = added.to_vector<double>();
  const MaskFn additive = [&](int64_t bi, int64_t hi, int64_t i, int64_t j) {
    return values[((bi * h + hi) * l + i) * s + j];
  };
  const Tensor expected_added = Reference(m, q, k, k, additive, nullptr);
  EXPECT_LT(
      testing::MaxAbsDiff(std::get<0>(m.forward(q, k, k, Tensor(), true, added)), expected_added),
      1e-12);
  EXPECT_LT(
      testing::MaxAbsDiff(std::get<0>(m.forward(q, k, k, Tensor(), false, added)), expected_added),
      1e-12);
  // A float key_padding_mask is added too (here: the bool one as -inf / 0 plus the float mask).
  const Tensor float_padding =
      masked_fill(zeros({b, s}, TensorOptions().dtype(kFloat64)), padding, -kInf);
  const MaskFn combined = [&](int64_t bi, int64_t hi, int64_t i, int64_t j) {
    return padded(bi, j) ? -kInf : additive(bi, hi, i, j);
  };
  EXPECT_LT(testing::MaxAbsDiff(std::get<0>(m.forward(q, k, k, float_padding, true, added)),
                                Reference(m, q, k, k, combined, nullptr)),
            1e-12);
}

TEST_F(AttentionTest, IsCausalWithoutAMaskAppliesTheCausalMask) {
  MultiheadAttention m(MultiheadAttentionOptions(8, 2).batch_first(true));
  m.to(kFloat64);
  RandomiseBiases(m);
  const Tensor x = Randn64({2, 5, 8});
  const MaskFn causal = [](int64_t, int64_t, int64_t i, int64_t j) { return j > i ? -kInf : 0.0; };
  const Tensor expected =
      Reference(m, x.transpose(0, 1), x.transpose(0, 1), x.transpose(0, 1), causal, nullptr)
          .transpose(0, 1);
  // Both the fused path (no weights, no padding) and the explicit one.
  EXPECT_LT(testing::MaxAbsDiff(
                std::get<0>(m.forward(x, x, x, Tensor(), false, Tensor(), true, true)), expected),
            1e-12);
  auto [out, weights] = m.forward(x, x, x, Tensor(), true, Tensor(), true, true);
  EXPECT_LT(testing::MaxAbsDiff(out, expected), 1e-12);
  EXPECT_EQ(MaxAbs(weights.select(1, 0).select(1, 1)), 0.0);  // query 0 never sees key 1
  // With padding the causal mask is merged into it.
  const Tensor padding = from_vector(std::vector<bool>(10, false), {2, 5});
  EXPECT_LT(testing::MaxAbsDiff(
                std::get<0>(m.forward(x, x, x, padding, false, Tensor(), true, true)), expected),
            1e-12);
}

TEST_F(AttentionTest, AddBiasKvAndAddZeroAttnAppendKeys) {
  MultiheadAttention m(MultiheadAttentionOptions(8, 2).add_bias_kv(true).add_zero_attn(true));
  m.to(kFloat64);
  RandomiseBiases(m);
  const Tensor q = Randn64({3, 2, 8}), k = Randn64({4, 2, 8});
  const Tensor zero = zeros({1, 8}, TensorOptions().dtype(kFloat64));
  const Tensor extra_k = cat({m.bias_k().reshape({1, 8}), zero}, 0);
  const Tensor extra_v = cat({m.bias_v().reshape({1, 8}), zero}, 0);
  const MaskFn padded = [](int64_t bi, int64_t, int64_t, int64_t j) {
    return bi == 1 && j == 2 ? -kInf : 0.0;
  };
  Tensor expected_weights;
  const Tensor expected = Reference(m, q, k, k, padded, &expected_weights, extra_k, extra_v);
  const Tensor padding =
      from_vector(std::vector<bool>{false, false, false, false, false, false, true, false}, {2, 4});
  auto [out, weights] =
      m.forward(q, k, k, padding, true, zeros({3, 4}, TensorOptions().dtype(kBool)), false);
  EXPECT_EQ(weights.shape(), (Shape{2, 2, 3, 6}));
  EXPECT_LT(testing::MaxAbsDiff(out, expected), 1e-12);
  EXPECT_LT(testing::MaxAbsDiff(weights, expected_weights), 1e-12);
  EXPECT_LT(testing::MaxAbsDiff(std::get<0>(m.forward(q, k, k, padding, false)), expected), 1e-12);
  // batch_first appends the extra keys along its own sequence dimension.
  MultiheadAttention bf(
      MultiheadAttentionOptions(8, 2).add_bias_kv(true).add_zero_attn(true).batch_first(true));
  bf.to(kFloat64);
  bf.load_state_dict(m.state_dict());
  auto [out_bf, weights_bf] = bf.forward(q.transpose(0, 1), k.transpose(0, 1), k.transpose(0, 1),
                                         padding, true, Tensor(), false);
  EXPECT_LT(testing::MaxAbsDiff(out_bf, expected.transpose(0, 1)), 1e-12);
  EXPECT_LT(testing::MaxAbsDiff(weights_bf, expected_weights), 1e-12);
}

// ---- Gradients -------------------------------------------------------------------------

// Checks the gradients of `forward` with respect to the inputs and every parameter (routed in
// with replace_parameter, as DataParallel feeds replicas), in float64.
void ExpectModuleGradients(Module& module,
                           const std::function<Tensor(const std::vector<Tensor>&)>& forward,
                           std::vector<Tensor> inputs) {
  module.to(kFloat64);
  const std::vector<NamedTensor> params = module.named_parameters();
  const size_t n = inputs.size();
  for (const NamedTensor& p : params) inputs.push_back(p.value.detach().clone());
  for (Tensor& t : inputs) t.set_requires_grad(true);
  EXPECT_GRADIENTS_MATCH(
      [&](const std::vector<Tensor>& in) {
        for (size_t i = 0; i < params.size(); ++i)
          module.replace_parameter(params[i].name, in[n + i]);
        return forward(std::vector<Tensor>(in.begin(), in.begin() + n));
      },
      inputs);
  for (const NamedTensor& p : params) module.replace_parameter(p.name, p.value);
}

TEST_F(AttentionTest, GradientsMatchFiniteDifferences) {
  MultiheadAttention m(MultiheadAttentionOptions(4, 2).add_bias_kv(true));
  m.to(kFloat64);
  RandomiseBiases(m);
  const Tensor padding =
      from_vector(std::vector<bool>{false, true, false, false, false, false}, {2, 3});
  const Tensor float_mask = Randn64({2, 3});
  // Output and weights, through the explicit path (float mask + bool padding)...
  ExpectModuleGradients(m,
                        [&](const std::vector<Tensor>& in) {
                          auto [out, weights] =
                              m.forward(in[0], in[1], in[2], padding, true, float_mask);
                          return cat({out.flatten(), weights.flatten()}, 0);
                        },
                        {Randn64({2, 2, 4}), Randn64({3, 2, 4}), Randn64({3, 2, 4})});
  // ...and through scaled_dot_product_attention, causal.
  MultiheadAttention cross(MultiheadAttentionOptions(4, 2).kdim(3).vdim(2).batch_first(true));
  RandomiseBiases(cross);
  ExpectModuleGradients(
      cross,
      [&](const std::vector<Tensor>& in) {
        return std::get<0>(cross.forward(in[0], in[1], in[2], Tensor(), false, Tensor(), true,
                                         /*is_causal=*/true));
      },
      {Randn64({2, 3, 4}), Randn64({2, 3, 3}), Randn64({2, 3, 2})});
}

TEST_F(AttentionTest, RunsUnderAutocastInBFloat16) {
  MultiheadAttention m(MultiheadAttentionOptions(16, 4).batch_first(true));
  RandomiseBiases(m);
  const Tensor x = randn({2, 6, 16});
  const Tensor padding = from_vector(std::vector<bool>{false, false, false, false, false, true,
                                                       false, false, true, false, false, false},
                                     {2, 6});
  for (bool need_weights : {true, false}) {
    SCOPED_TRACE(need_weights);
    const Tensor expected = std::get<0>(m.forward(x, x, x, padding, need_weights));
    Tensor out;
    {
      AutocastGuard autocast(DeviceType::kCPU);
      out = std::get<0>(m.forward(x, x, x, padding, need_weights, Tensor(), true, true));
    }
    EXPECT_EQ(out.dtype(), kBFloat16);
    // bfloat16 keeps 8 bits: a few parts in a hundred of values of order 1.
    const Tensor causal_expected =
        std::get<0>(m.forward(x, x, x, padding, need_weights, Tensor(), true, true));
    EXPECT_LT(testing::MaxAbsDiff(out, causal_expected), 0.1);
    EXPECT_GT(testing::MaxAbsDiff(out, expected),
              0.1);  // the causal mask was applied under autocast too
    out.to(kFloat32).sum().backward();
    for (const Tensor& p : m.parameters()) EXPECT_EQ(p.grad().dtype(), kFloat32);
    m.zero_grad();
  }
}

// ---- Modes, devices, replicas ----------------------------------------------------------

TEST_F(AttentionTest, DropoutActsOnlyInTraining) {
  MultiheadAttention m(MultiheadAttentionOptions(8, 2).dropout(0.5));
  const Tensor x = randn({6, 2, 8});
  auto [train_out, train_weights] = m.forward(x, x, x, Tensor(), true, Tensor(), false);
  // Dropped weights are exactly zero; the rest scaled by 2.
  EXPECT_GT(eq(train_weights, zeros_like(train_weights)).to(kFloat32).sum().item(), 0.0);
  const Tensor again = std::get<0>(m.forward(x, x, x, Tensor(), false));
  m.eval();
  auto [eval_out, eval_weights] = m.forward(x, x, x, Tensor(), true, Tensor(), false);
  EXPECT_GT(testing::MaxAbsDiff(train_out, eval_out), 1e-3);
  EXPECT_GT(testing::MaxAbsDiff(again, eval_out), 1e-3);
  // Without weights the output comes from the fused kernel, with them from the composed
  // product: the same up to float rounding.
  EXPECT_LT(testing::MaxAbsDiff(std::get<0>(m.forward(x, x, x, Tensor(), false)), eval_out), 1e-6);
  EXPECT_LT(testing::MaxAbsDiff(eval_weights.sum({-1}), ones({2, 2, 6})), 1e-6);
}

TEST_F(AttentionTest, ClonesOntoAnotherDeviceAndReplicatesForDataParallel) {
  MultiheadAttention m(MultiheadAttentionOptions(8, 2).kdim(4).add_bias_kv(true));
  RandomiseBiases(m);
  const Tensor q = randn({3, 2, 8}), k = randn({5, 2, 4}), v = randn({5, 2, 8});
  const Tensor expected = std::get<0>(m.forward(q, k, v));
  std::shared_ptr<Module> copy = m.clone(Device::Cpu(1));
  auto typed = std::dynamic_pointer_cast<MultiheadAttention>(copy);
  ASSERT_NE(typed, nullptr);
  EXPECT_EQ(copy->ToString(), m.ToString());
  EXPECT_EQ(Names(copy->named_parameters()), Names(m.named_parameters()));
  for (const Tensor& p : copy->parameters()) EXPECT_EQ(p.device(), Device::Cpu(1));
  EXPECT_FALSE(typed->k_proj_weight().shares_storage_with(m.k_proj_weight()));
  const Tensor on_1 =
      std::get<0>(typed->forward(q.to(Device::Cpu(1)), k.to(Device::Cpu(1)), v.to(Device::Cpu(1))));
  EXPECT_EQ(on_1.device(), Device::Cpu(1));
  EXPECT_LT(testing::MaxAbsDiff(on_1.to(Device::Cpu(0)), expected), 1e-6);
  EXPECT_THAT(ErrorOf([&] { typed->forward(q, k, v); }), HasSubstr("the parameters are on cpu:1"));

  // What DataParallel's replicate does: the structure cloned, every parameter bound to its
  // broadcast copy on cpu:1; gradients flow back to the originals through the copies.
  Module::TensorBindings bindings;
  for (const Tensor& p : m.parameters()) bindings.emplace(p.impl(), p.to(Device::Cpu(1)));
  std::shared_ptr<Module> replica = m.replicate_structure(bindings);
  const std::vector<Tensor> out =
      replica->forward_tensors({q.to(Device::Cpu(1)), k.to(Device::Cpu(1)), v.to(Device::Cpu(1))});
  EXPECT_LT(testing::MaxAbsDiff(out[0].to(Device::Cpu(0)), expected), 1e-6);
  out[0].sum().backward();
  for (const NamedTensor& p : m.named_parameters()) {
    SCOPED_TRACE(p.name);
    ASSERT_TRUE(p.value.grad().defined());
    EXPECT_EQ(p.value.grad().device(), Device::Cpu(0));
  }
}

}  // namespace
}  // namespace tandem::nn
