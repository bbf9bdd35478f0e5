// scaled_dot_product_attention against attention computed on the host in double, with
// causal, bool and additive masks, a custom scale, broadcast heads, float64 gradient checks
// and the errors for bad input; the fused kernels against the composed path in every
// floating dtype, across tile boundaries, forward and backward.
#include "tensor/ops/attention.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "tensor/base/philox.h"
#include "tensor/core/autograd.h"
#include "tensor/gradcheck.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace tandem {
namespace {

using ::tandem::testing::ErrorOf;
using ::testing::HasSubstr;
using Inputs = std::vector<Tensor>;

Tensor Randn(const Shape& shape, uint64_t seed) {
  Generator gen(seed);
  return randn(shape, {}, &gen);
}

Tensor Param64(const Tensor& t) {
  Tensor leaf = t.to(kFloat64).detach();
  leaf.set_requires_grad(true);
  return leaf;
}

// Attention of one [L, E] x [S, E] x [S, Ev] problem on the host; `allowed(i, j)` says whether
// query i may attend key j and `bias(i, j)` is added to its score.
template <typename Allowed, typename Bias>
std::vector<double> HostAttention(const std::vector<float>& q, const std::vector<float>& k,
                                  const std::vector<float>& v, int64_t l, int64_t s, int64_t e,
                                  int64_t ev, double scale, Allowed allowed, Bias bias) {
  std::vector<double> out(static_cast<size_t>(l * ev), 0.0);
  for (int64_t i = 0; i < l; ++i) {
    std::vector<double> score(static_cast<size_t>(s), -std::numeric_limits<double>::infinity());
    double max_score = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < s; ++j) {
      if (!allowed(i, j)) continue;
      double dot = 0.0;
      for (int64_t c = 0; c < e; ++c) dot += double(q[i * e + c]) * double(k[j * e + c]);
      score[j] = dot * scale + bias(i, j);
      max_score = std::max(max_score, score[j]);
    }
    double total = 0.0;
    for (int64_t j = 0; j < s; ++j) total += std::exp(score[j] - max_score);
    for (int64_t j = 0; j < s; ++j) {
      const double w = std::exp(score[j] - max_score) / total;
      for (int64_t c = 0; c < ev; ++c) out[i * ev + c] += w * double(v[j * ev + c]);
    }
  }
  return out;
}

void ExpectNear(const Tensor& actual, const std::vector<double>& expected, double tol) {
  const std::vector<float> got = actual.to(kFloat32).contiguous().to_vector<float>();
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expected[i], tol) << "at " << i;
}

TEST(AttentionTest, MatchesHostAttentionPerHead) {
  const int64_t b = 2, h = 3, l = 5, s = 7, e = 4, ev = 6;
  const Tensor q = Randn({b, h, l, e}, 1), k = Randn({b, h, s, e}, 2), v = Randn({b, h, s, ev}, 3);
  const Tensor y = scaled_dot_product_attention(q, k, v);
  ASSERT_EQ(y.shape(), (Shape{b, h, l, ev}));
  const std::vector<float> qv = q.to_vector<float>(), kv = k.to_vector<float>(),
                           vv = v.to_vector<float>();
  std::vector<double> expected;
  for (int64_t p = 0; p < b * h; ++p) {
    const auto head = HostAttention(
        std::vector<float>(qv.begin() + p * l * e, qv.begin() + (p + 1) * l * e),
        std::vector<float>(kv.begin() + p * s * e, kv.begin() + (p + 1) * s * e),
        std::vector<float>(vv.begin() + p * s * ev, vv.begin() + (p + 1) * s * ev), l, s, e, ev,
        1.0 / std::sqrt(double(e)), [](int64_t, int64_t) { return true; },
        [](int64_t, int64_t) { return 0.0; });
    expected.insert(expected.end(), head.begin(), head.end());
  }
  ExpectNear(y, expected, 1e-5);
}

TEST(AttentionTest, CausalIsTopLeftAlignedAndCustomScaleApplies) {
  const int64_t l = 4, s = 6, e = 3;
  const Tensor q = Randn({l, e}, 4), k = Randn({s, e}, 5), v = Randn({s, e}, 6);
  const Tensor y = scaled_dot_product_attention(q, k, v, Tensor(), 0.0, true, 0.7);
  ExpectNear(y,
             HostAttention(
                 q.to_vector<float>(), k.to_vector<float>(), v.to_vector<float>(), l, s, e, e, 0.7,
                 [](int64_t i, int64_t j) { return j <= i; }, [](int64_t, int64_t) { return 0.0; }),
             1e-5);
}

TEST(AttentionTest, BoolMaskExcludesAndFloatMaskAdds) {
  const int64_t l = 3, s = 5, e = 2;
  const Tensor q = Randn({l, e}, 7), k = Randn({s, e}, 8), v = Randn({s, e}, 9);
  std::vector<bool> keep(l * s);
  std::vector<float> bias(l * s);
  for (int64_t i = 0; i < l * s; ++i) {
    keep[i] = (i * 7) % 3 != 0 || i % s == 0;  // every row keeps key 0
    bias[i] = 0.1f * float(i % 4) - 0.2f;
  }
  const double scale = 1.0 / std::sqrt(double(e));
  const Tensor masked =
      scaled_dot_product_attention(q, k, v, from_vector(keep, {l, s}).unsqueeze(0));
  ExpectNear(masked.view({l, e}),
             HostAttention(
                 q.to_vector<float>(), k.to_vector<float>(), v.to_vector<float>(), l, s, e, e,
                 scale, [&](int64_t i, int64_t j) { return bool(keep[i * s + j]); },
                 [](int64_t, int64_t) { return 0.0; }),
             1e-5);
  const Tensor biased = scaled_dot_product_attention(q, k, v, from_vector(bias, {l, s}));
  ExpectNear(biased,
             HostAttention(
                 q.to_vector<float>(), k.to_vector<float>(), v.to_vector<float>(), l, s, e, e,
                 scale, [](int64_t, int64_t) { return true; },
                 [&](int64_t i, int64_t j) { return double(bias[i * s + j]); }),
             1e-5);
}

TEST(AttentionTest, GradientsMatchFiniteDifferences) {
  const Tensor q = Param64(Randn({2, 3, 4}, 10)), k = Param64(Randn({2, 5, 4}, 11)),
               v = Param64(Randn({2, 5, 3}, 12));
  EXPECT_GRADIENTS_MATCH(
      [](const Inputs& in) { return scaled_dot_product_attention(in[0], in[1], in[2]); },
      {q, k, v});
  EXPECT_GRADIENTS_MATCH(
      [](const Inputs& in) {
        return scaled_dot_product_attention(in[0], in[1], in[2], Tensor(), 0.0, true);
      },
      {q, k, v});
  const Tensor bias = Param64(Randn({3, 5}, 13));
  EXPECT_GRADIENTS_MATCH(
      [](const Inputs& in) { return scaled_dot_product_attention(in[0], in[1], in[2], in[3]); },
      {q, k, v, bias});
}

// ---- The fused kernels against the composed path ----------------------------------------

struct Case {
  Shape q, k, v;
  bool causal = false;
  Shape mask = {};  // empty: no mask
  bool bool_mask = false;
};

// A mask of `shape` whose every row keeps key 0 (so that no query attends nothing).
Tensor MaskOf(const Shape& shape, bool as_bool, uint64_t seed) {
  Generator gen(seed);
  const Tensor r = rand(shape, {}, &gen);
  const int64_t s = shape.back();
  std::vector<float> first(static_cast<size_t>(s), 0.0f);
  first[0] = 1.0f;
  const Tensor key0 = from_vector(first, {s});
  if (as_bool) return logical_or(gt(r, full({}, 0.3)), gt(key0, full({}, 0.5)));
  return add(mul(r, 2.0), -1.0);
}

// Max |a - b| - rtol * |b| over the elements (<= atol passes).
double Excess(const Tensor& a, const Tensor& b, double rtol) {
  const std::vector<double> x = a.to(kFloat64).contiguous().to_vector<double>();
  const std::vector<double> y = b.to(kFloat64).contiguous().to_vector<double>();
  EXPECT_EQ(x.size(), y.size());
  double worst = 0.0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
    const double d = std::abs(x[i] - y[i]) - rtol * std::abs(y[i]);
    if (!(d <= worst)) worst = d;  // NaN counts as a failure
  }
  return worst;
}

// Output and gradients of q, k, v through `attention`, for a fixed upstream gradient.
template <typename F>
std::vector<Tensor> Run(F attention, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& upstream) {
  Tensor lq = q.detach(), lk = k.detach(), lv = v.detach();
  lq.set_requires_grad(true);
  lk.set_requires_grad(true);
  lv.set_requires_grad(true);
  const Tensor y = attention(lq, lk, lv);
  sum(mul(y, upstream.to(y.dtype()))).backward();
  return {y.detach(), lq.grad(), lk.grad(), lv.grad()};
}

void ExpectFusedMatchesComposed(const Case& c, DType dtype, double atol, double rtol) {
  SCOPED_TRACE("dtype " + std::string(DTypeName(dtype)) + " q " + ShapeToString(c.q) +
               (c.causal ? " causal" : "") + (c.mask.empty() ? "" : " mask") +
               (c.bool_mask ? " (bool)" : ""));
  const Tensor q = Randn(c.q, 21).to(dtype), k = Randn(c.k, 22).to(dtype),
               v = Randn(c.v, 23).to(dtype);
  const Tensor mask = c.mask.empty() ? Tensor() : MaskOf(c.mask, c.bool_mask, 24);
  Shape out_shape = c.q;
  out_shape.back() = c.v.back();
  const Tensor upstream = Randn(out_shape, 25);
  const std::vector<Tensor> fused = Run(
      [&](const Tensor& a, const Tensor& b, const Tensor& d) {
        const Tensor y = scaled_dot_product_attention(a, b, d, mask, 0.0, c.causal);
        EXPECT_EQ(y.grad_fn()->name(), "ScaledDotProductAttentionBackward");
        return y;
      },
      q, k, v, upstream);
  // The reference: the composed path in float64 on the same (rounded) inputs.
  const std::vector<Tensor> reference = Run(
      [&](const Tensor& a, const Tensor& b, const Tensor& d) {
        return internal::ComposedScaledDotProductAttention(
            a.to(kFloat64), b.to(kFloat64), d.to(kFloat64),
            mask.defined() && mask.dtype() != kBool ? mask.to(dtype).to(kFloat64) : mask, 0.0,
            c.causal);
      },
      q, k, v, upstream);
  const char* names[] = {"output", "dq", "dk", "dv"};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(fused[i].dtype(), dtype) << names[i];
    EXPECT_EQ(fused[i].shape(), reference[i].shape()) << names[i];
    EXPECT_LE(Excess(fused[i], reference[i], rtol), atol) << names[i];
  }
}

TEST(FusedAttentionTest, MatchesComposedPathInEveryFloatingType) {
  const std::vector<Case> cases = {
      {{2, 3, 5, 4}, {2, 3, 7, 4}, {2, 3, 7, 6}},
      {{2, 3, 5, 4}, {2, 3, 7, 4}, {2, 3, 7, 6}, true},
      {{3, 9, 4}, {3, 6, 4}, {3, 6, 5}, true},  // L > S: the last rows see every key
      // Past one query block (64) and one key tile (128), with a ragged last tile.
      {{2, 130, 8}, {2, 200, 8}, {2, 200, 8}},
      {{2, 130, 8}, {2, 200, 8}, {2, 200, 8}, true},
      {{2, 2, 70, 8}, {2, 2, 150, 8}, {2, 2, 150, 8}, false, {70, 150}, true},
      {{2, 2, 5, 8}, {2, 2, 9, 8}, {2, 2, 9, 3}, false, {2, 1, 5, 9}, false},
      {{2, 2, 5, 8}, {2, 2, 9, 8}, {2, 2, 9, 3}, false, {2, 1, 1, 9}, true},  // key padding
      {{2, 3, 5, 8}, {2, 3, 9, 8}, {2, 3, 9, 3}, false, {3, 5, 9}, false},
  };
  for (const Case& c : cases) {
    // PyTorch's default tolerances (torch.testing.assert_close) for float32 and float64; the
    // 16-bit outputs are rounded once, so they are within a unit or two of their last place.
    ExpectFusedMatchesComposed(c, kFloat64, 1e-7, 1e-7);
    ExpectFusedMatchesComposed(c, kFloat32, 1e-5, 1.3e-6);
    ExpectFusedMatchesComposed(c, kBFloat16, 1e-2, 1.6e-2);
    ExpectFusedMatchesComposed(c, kFloat16, 1e-3, 1e-3);
  }
}

TEST(FusedAttentionTest, MaskWhoseHeadsDoNotNestIsCopiedAndStillApplies) {
  // Leading dimensions [2, 3, 2] whose first two strides do not nest (transposed): the op
  // copies this mask rather than folding it into the kernel's strides.
  const Tensor q = Randn({2, 3, 2, 5, 4}, 50), k = Randn({2, 3, 2, 6, 4}, 51),
               v = Randn({2, 3, 2, 6, 3}, 52);
  const Tensor mask = MaskOf({3, 2, 2, 5, 6}, false, 53).transpose(0, 1);
  const Tensor y = scaled_dot_product_attention(q, k, v, mask);
  const Tensor expected = internal::ComposedScaledDotProductAttention(
      q.to(kFloat64), k.to(kFloat64), v.to(kFloat64), mask.to(kFloat64));
  EXPECT_LE(Excess(y, expected, 1.3e-6), 1e-5);
}

TEST(FusedAttentionTest, HeadSplitIsReadInPlaceAndTheOutputMergesWithoutACopy) {
  // GPT's head split: one [B, L, 3 * H * E] projection narrowed into q, k, v, each reshaped (a
  // view) to [B, L, H, E] and transposed to [B, H, L, E] (rows 3 * H * E apart, heads E apart).
  // The kernels read them in place; out comes back laid out as [B, L, H, E], so that
  // transposing back and merging the heads is a view; the gradient reaches the projection
  // through the views. Also leading dimensions whose strides do not nest (copied first).
  const int64_t b = 2, l = 7, h = 3, e = 4;
  for (const DType dtype : {kFloat64, kFloat32, kBFloat16, kFloat16}) {
    for (const bool causal : {false, true}) {
      SCOPED_TRACE(std::string(DTypeName(dtype)) + (causal ? " causal" : ""));
      const Tensor qkv = Randn({b, l, 3 * h * e}, 60).to(dtype);
      const Tensor upstream = Randn({b, h, l, e}, 61);
      // Output and the projection's gradient, fused or composed (in float64).
      const auto run = [&](bool fused) {
        Tensor leaf = qkv.detach();
        leaf.set_requires_grad(true);
        const auto split = [&](int64_t part) {
          const Tensor x =
              leaf.narrow(2, part * h * e, h * e).reshape({b, l, h, e}).transpose(1, 2);
          EXPECT_FALSE(x.is_contiguous());
          return fused ? x : x.to(kFloat64);
        };
        const Tensor y = fused ? scaled_dot_product_attention(split(0), split(1), split(2),
                                                              Tensor(), 0.0, causal)
                               : internal::ComposedScaledDotProductAttention(
                                     split(0), split(1), split(2), Tensor(), 0.0, causal);
        sum(mul(y, upstream.to(y.dtype()))).backward();
        return std::vector<Tensor>{y.detach(), leaf.grad()};
      };
      const std::vector<Tensor> fused = run(true), reference = run(false);
      EXPECT_TRUE(fused[0].transpose(1, 2).is_contiguous());
      const double atol = dtype == kBFloat16 ? 1e-2 : (dtype == kFloat16 ? 1e-3 : 1e-5);
      const double rtol = dtype == kBFloat16 ? 1.6e-2 : (dtype == kFloat16 ? 1e-3 : 1.3e-6);
      EXPECT_LE(Excess(fused[0], reference[0], rtol), atol) << "output";
      EXPECT_LE(Excess(fused[1], reference[1], rtol), atol) << "the projection's gradient";
    }
  }
  // [2, 3, 2] leading dimensions whose first two strides do not nest: copied, still right.
  const Tensor q = Randn({3, 2, 2, 5, 4}, 62).transpose(0, 1),
               k = Randn({3, 2, 2, 6, 4}, 63).transpose(0, 1),
               v = Randn({3, 2, 2, 6, 3}, 64).transpose(0, 1);
  const Tensor y = scaled_dot_product_attention(q, k, v, Tensor(), 0.0, true);
  const Tensor expected = internal::ComposedScaledDotProductAttention(
      q.to(kFloat64), k.to(kFloat64), v.to(kFloat64), Tensor(), 0.0, true);
  EXPECT_LE(Excess(y, expected, 1.3e-6), 1e-5);
}

TEST(FusedAttentionTest, GradientsMatchFiniteDifferencesWithMasks) {
  const Tensor q = Param64(Randn({2, 2, 3, 4}, 30)), k = Param64(Randn({2, 2, 5, 4}, 31)),
               v = Param64(Randn({2, 2, 5, 3}, 32));
  const Tensor keep = MaskOf({2, 1, 3, 5}, true, 33);
  const Tensor bias = MaskOf({3, 5}, false, 34).to(kFloat64);
  for (const Tensor& mask : {keep, bias}) {
    // The masks take the fused path (they do not require grad).
    EXPECT_EQ(scaled_dot_product_attention(q, k, v, mask).grad_fn()->name(),
              "ScaledDotProductAttentionBackward");
    EXPECT_GRADIENTS_MATCH(
        [&](const Inputs& in) { return scaled_dot_product_attention(in[0], in[1], in[2], mask); },
        {q, k, v});
  }
  // Causal with more queries than keys and a custom scale.
  const Tensor q_long = Param64(Randn({2, 7, 4}, 35));
  const Tensor k_short = Param64(Randn({2, 4, 4}, 36)), v_short = Param64(Randn({2, 4, 2}, 37));
  EXPECT_GRADIENTS_MATCH(
      [](const Inputs& in) {
        return scaled_dot_product_attention(in[0], in[1], in[2], Tensor(), 0.0, true, 0.3);
      },
      {q_long, k_short, v_short});
}

TEST(FusedAttentionTest, QueryThatAttendsNothingGivesNaNAsInPyTorch) {
  const Tensor q = Randn({1, 2, 3}, 40), k = Randn({1, 4, 3}, 41), v = Randn({1, 4, 3}, 42);
  std::vector<bool> keep(8, true);
  for (int j = 0; j < 4; ++j) keep[4 + j] = false;  // query 1 attends nothing
  const Tensor y = scaled_dot_product_attention(q, k, v, from_vector(keep, {2, 4}));
  const std::vector<float> out = y.to_vector<float>();
  for (int c = 0; c < 3; ++c) {
    EXPECT_FALSE(std::isnan(out[c])) << c;
    EXPECT_TRUE(std::isnan(out[3 + c])) << c;
  }
}

TEST(FusedAttentionTest, AutocastRunsInTheLowerPrecision) {
  const Tensor q = Randn({2, 5, 4}, 43), k = Randn({2, 6, 4}, 44), v = Randn({2, 6, 4}, 45);
  Tensor y;
  {
    AutocastGuard guard(DeviceType::kCPU);
    y = scaled_dot_product_attention(q, k, v, Tensor(), 0.0, true);
  }
  EXPECT_EQ(y.dtype(), kBFloat16);
  const Tensor expected = scaled_dot_product_attention(q.to(kBFloat16), k.to(kBFloat16),
                                                       v.to(kBFloat16), Tensor(), 0.0, true);
  EXPECT_EQ(Excess(y, expected, 0.0), 0.0);
}

TEST(FusedAttentionTest, BroadcastHeadsTakeTheComposedPathAndDropoutTheFusedOne) {
  const Tensor q = Randn({2, 3, 5, 4}, 46), k = Randn({3, 7, 4}, 47), v = Randn({3, 7, 4}, 48);
  const Tensor y = scaled_dot_product_attention(q, k, v);
  const Tensor expected = scaled_dot_product_attention(q, k.unsqueeze(0).expand({2, 3, 7, 4}),
                                                       v.unsqueeze(0).expand({2, 3, 7, 4}));
  EXPECT_LE(Excess(y, expected, 1.3e-6), 1e-5);
  Generator gen(49);
  Tensor lq = q.detach();
  lq.set_requires_grad(true);
  EXPECT_NE(scaled_dot_product_attention(lq, k, v, Tensor(), 0.5, false, std::nullopt, &gen)
                .grad_fn()
                ->name(),
            "ScaledDotProductAttentionBackward");
  EXPECT_EQ(scaled_dot_product_attention(lq, k.expand({2, 3, 7, 4}), v.expand({2, 3, 7, 4}),
                                         Tensor(), 0.5, false, std::nullopt, &gen)
                .grad_fn()
                ->name(),
            "ScaledDotProductAttentionBackward");
}

// ---- Dropout inside the fused kernels -----------------------------------------------------

// The keep mask as Geometry's dropout_* define it, recomputed on the host: weight (b, i, j) of
// the flattened [batch, L, S] weights is kept where its Philox uniform is at least p.
bool HostKeeps(uint64_t seed, uint64_t offset, int64_t index, double p) {
  return static_cast<double>(philox::Uniform(seed, offset + static_cast<uint64_t>(index))) >= p;
}

struct HostDropoutResult {
  std::vector<double> out, dq, dk, dv;
};

// Attention with dropout on the weights, forward and backward, in double on the host, written
// from the definition out = (P * Z) v with Z = keep / (1 - p) (no log-sum-exp tricks).
HostDropoutResult HostDropoutAttention(const std::vector<double>& q, const std::vector<double>& k,
                                       const std::vector<double>& v,
                                       const std::vector<double>& dout, int64_t batch, int64_t l,
                                       int64_t s, int64_t e, int64_t ev, bool causal, double p,
                                       uint64_t seed, uint64_t offset) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(e));
  HostDropoutResult r;
  r.out.assign(static_cast<size_t>(batch * l * ev), 0.0);
  r.dq.assign(static_cast<size_t>(batch * l * e), 0.0);
  r.dk.assign(static_cast<size_t>(batch * s * e), 0.0);
  r.dv.assign(static_cast<size_t>(batch * s * ev), 0.0);
  std::vector<double> w(static_cast<size_t>(s)), z(static_cast<size_t>(s)),
      dw(static_cast<size_t>(s));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < l; ++i) {
      const double* qi = &q[(b * l + i) * e];
      const double* doi = &dout[(b * l + i) * ev];
      double max_score = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < s; ++j) {
        w[j] = -std::numeric_limits<double>::infinity();
        if (causal && j > i) continue;
        double dot = 0.0;
        for (int64_t c = 0; c < e; ++c) dot += qi[c] * k[(b * s + j) * e + c];
        w[j] = dot * scale;
        max_score = std::max(max_score, w[j]);
      }
      double total = 0.0;
      for (int64_t j = 0; j < s; ++j) total += std::exp(w[j] - max_score);
      for (int64_t j = 0; j < s; ++j) {
        w[j] = std::exp(w[j] - max_score) / total;
        z[j] = HostKeeps(seed, offset, (b * l + i) * s + j, p) ? 1.0 / (1.0 - p) : 0.0;
      }
      // out_i = sum_j w z v_j; d(w z)_j = dout_i . v_j; dw_j = z_j dout_i . v_j.
      double wdw = 0.0;
      for (int64_t j = 0; j < s; ++j) {
        double dot = 0.0;
        for (int64_t c = 0; c < ev; ++c) {
          r.out[(b * l + i) * ev + c] += w[j] * z[j] * v[(b * s + j) * ev + c];
          r.dv[(b * s + j) * ev + c] += w[j] * z[j] * doi[c];
          dot += doi[c] * v[(b * s + j) * ev + c];
        }
        dw[j] = z[j] * dot;
        wdw += w[j] * dw[j];
      }
      for (int64_t j = 0; j < s; ++j) {
        const double ds = w[j] * (dw[j] - wdw) * scale;  // softmax's backward, then the scale
        for (int64_t c = 0; c < e; ++c) {
          r.dq[(b * l + i) * e + c] += ds * k[(b * s + j) * e + c];
          r.dk[(b * s + j) * e + c] += ds * qi[c];
        }
      }
    }
  }
  return r;
}

std::vector<double> AsDoubles(const Tensor& t) {
  return t.to(kFloat64).contiguous().to_vector<double>();
}

void ExpectAllNear(const Tensor& actual, const std::vector<double>& expected, double tol,
                   const char* what) {
  const std::vector<double> got = AsDoubles(actual);
  ASSERT_EQ(got.size(), expected.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size() && bad < 5; ++i) {
    if (!(std::abs(got[i] - expected[i]) <= tol)) {
      ++bad;
      ADD_FAILURE() << what << " at " << i << ": " << got[i] << " vs " << expected[i];
    }
  }
}

TEST(FusedAttentionDropoutTest, MatchesHostOracleWithTheSameMask) {
  // L and S past a query block (64) and a key tile (128) with ragged ends.
  const int64_t b = 2, h = 3, l = 70, s = 150, e = 8, ev = 5;
  const double p = 0.3;
  for (DType dtype : {kFloat32, kFloat64}) {
    for (bool causal : {false, true}) {
      SCOPED_TRACE(::testing::Message() << dtype << (causal ? " causal" : ""));
      Tensor q = Randn({b, h, l, e}, 60).to(dtype), k = Randn({b, h, s, e}, 61).to(dtype),
             v = Randn({b, h, s, ev}, 62).to(dtype);
      const Tensor dout = Randn({b, h, l, ev}, 63).to(dtype);
      for (Tensor* t : {&q, &k, &v}) t->set_requires_grad(true);
      Generator gen(64);
      const GeneratorState before = gen.state();
      const Tensor y =
          scaled_dot_product_attention(q, k, v, Tensor(), p, causal, std::nullopt, &gen);
      ASSERT_EQ(y.grad_fn()->name(), "ScaledDotProductAttentionBackward");
      EXPECT_GE(gen.state().offset - before.offset, static_cast<uint64_t>(b * h * l * s));
      y.backward(dout);
      const HostDropoutResult expected =
          HostDropoutAttention(AsDoubles(q), AsDoubles(k), AsDoubles(v), AsDoubles(dout), b * h, l,
                               s, e, ev, causal, p, before.seed, before.offset);
      const double tol = dtype == kFloat64 ? 1e-12 : 2e-5;
      ExpectAllNear(y, expected.out, tol, "out");
      ExpectAllNear(q.grad(), expected.dq, tol, "dq");
      ExpectAllNear(k.grad(), expected.dk, tol, "dk");
      ExpectAllNear(v.grad(), expected.dv, tol, "dv");
    }
  }
}

TEST(FusedAttentionDropoutTest, DrawsTheComposedPathsMaskFromTheSameGeneratorState) {
  const Tensor q = Randn({2, 2, 9, 4}, 70).to(kFloat64), k = Randn({2, 2, 11, 4}, 71).to(kFloat64),
               v = Randn({2, 2, 11, 3}, 72).to(kFloat64);
  Generator fused_gen(73), composed_gen(73);
  const Tensor fused =
      scaled_dot_product_attention(q, k, v, Tensor(), 0.4, true, std::nullopt, &fused_gen);
  const Tensor composed = internal::ComposedScaledDotProductAttention(q, k, v, Tensor(), 0.4, true,
                                                                      std::nullopt, &composed_gen);
  ExpectAllNear(fused, AsDoubles(composed), 1e-12, "out");
  EXPECT_EQ(fused_gen.state(), composed_gen.state());
  // The next call draws the next mask.
  const Tensor again =
      scaled_dot_product_attention(q, k, v, Tensor(), 0.4, true, std::nullopt, &fused_gen);
  EXPECT_GT(amax(abs(sub(again, fused)).reshape({-1}), 0).item<double>(), 1e-3);
}

TEST(FusedAttentionDropoutTest, GradientsMatchFiniteDifferences) {
  const Tensor q = Param64(Randn({2, 2, 5, 4}, 80)), k = Param64(Randn({2, 2, 7, 4}, 81)),
               v = Param64(Randn({2, 2, 7, 3}, 82));
  for (bool causal : {false, true}) {
    // A fresh generator per evaluation: every one drops the same weights.
    EXPECT_GRADIENTS_MATCH(
        [causal](const Inputs& in) {
          Generator gen(83);
          return scaled_dot_product_attention(in[0], in[1], in[2], Tensor(), 0.35, causal,
                                              std::nullopt, &gen);
        },
        {q, k, v});
  }
  const Tensor bias = Randn({7}, 84).to(kFloat64);
  EXPECT_GRADIENTS_MATCH(
      [bias](const Inputs& in) {
        Generator gen(85);
        return scaled_dot_product_attention(in[0], in[1], in[2], bias, 0.2, false, std::nullopt,
                                            &gen);
      },
      {q, k, v});
}

TEST(FusedAttentionDropoutTest, DropsAboutAFractionPOfTheWeights) {
  // With v the identity, out[i, j] is weight (i, j) after dropout: zero exactly where dropped.
  const int64_t batch = 4, n = 128;
  const Tensor q = Randn({batch, n, 16}, 90), k = Randn({batch, n, 16}, 91);
  std::vector<float> identity(static_cast<size_t>(n * n), 0.0f);
  for (int64_t j = 0; j < n; ++j) identity[static_cast<size_t>(j * n + j)] = 1.0f;
  const Tensor v = from_vector(identity, {n, n}).unsqueeze(0).expand({batch, n, n}).contiguous();
  for (double p : {0.1, 0.5}) {
    Generator gen(92);
    const Tensor y = scaled_dot_product_attention(q, k, v, Tensor(), p, false, std::nullopt, &gen);
    const double dropped = mean(eq(y, zeros_like(y)).to(kFloat64)).item<double>();
    // 65536 weights: the standard deviation of the fraction is at most 0.002.
    EXPECT_NEAR(dropped, p, 0.01);
    // The kept weights are scaled so that each row's expected sum stays 1.
    EXPECT_NEAR(mean(sum(y, {-1})).item<double>(), 1.0, 0.02);
  }
}

TEST(AttentionTest, BadInputSaysWhatWasExpected) {
  const Tensor q = Randn({2, 3, 4}, 14), k = Randn({2, 5, 4}, 15), v = Randn({2, 5, 3}, 16);
  EXPECT_THAT(ErrorOf([&] {
                scaled_dot_product_attention(q, Randn({2, 5, 3}, 1), v);
              }),
              HasSubstr("same number of features"));
  EXPECT_THAT(ErrorOf([&] {
                scaled_dot_product_attention(q, k, Randn({2, 4, 3}, 1));
              }),
              HasSubstr("same length"));
  EXPECT_THAT(ErrorOf([&] {
                scaled_dot_product_attention(q, k, v, ones({3, 5}).to(kBool), 0.0, true);
              }),
              HasSubstr("not both"));
  EXPECT_THAT(ErrorOf([&] { scaled_dot_product_attention(q, k, v, Tensor(), 1.0); }),
              HasSubstr("dropout_p"));
  EXPECT_THAT(ErrorOf([&] { scaled_dot_product_attention(q.to(kInt64), k, v); }),
              HasSubstr("floating point"));
  EXPECT_THAT(ErrorOf([&] { scaled_dot_product_attention(Randn({4}, 1), k, v); }),
              HasSubstr("at least 2 dimensions"));
}

}  // namespace
}  // namespace tandem
