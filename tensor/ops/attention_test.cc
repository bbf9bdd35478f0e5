// scaled_dot_product_attention against attention computed on the host in double, with
// causal, bool and additive masks, a custom scale, broadcast heads, float64 gradient checks
// and the errors for bad input.
#include "tensor/ops/attention.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

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
