// Embedding: lookups, gradients, padding_idx, initialisation, printing and bad indices; the
// max_norm, norm_type and scale_grad_by_freq options against torch.nn.functional.embedding's
// semantics worked by hand, and clones that keep them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nn/layers.h"
#include "nn/layers_test_util.h"

namespace tandem::nn {
namespace {

using testing::ErrorOf;
using testing::ExpectLayerGradients;
using ::testing::HasSubstr;
using testing::LayersTest;
using testing::MaxAbsDiff;

// ---- Embedding -----------------------------------------------------------------------------

TEST_F(LayersTest, EmbeddingLooksUpRows) {
  Embedding embed(10, 3);
  EXPECT_EQ(embed.weight().shape(), (Shape{10, 3}));
  Tensor ids = from_vector(std::vector<int64_t>{4, 0, 9, 4, 2, 7}, {2, 3});
  Tensor y = embed.forward(ids);
  ASSERT_EQ(y.shape(), (Shape{2, 3, 3}));
  const std::vector<float> w = embed.weight().to_vector<float>(), out = y.to_vector<float>();
  const std::vector<int64_t> flat = ids.to_vector<int64_t>();
  for (size_t i = 0; i < flat.size(); ++i)
    for (int64_t d = 0; d < 3; ++d) EXPECT_EQ(out[i * 3 + d], w[flat[i] * 3 + d]);
  // A 0-D index gives one row.
  EXPECT_EQ(embed.forward(full({}, 3, TensorOptions(kInt64))).shape(), (Shape{3}));
  // Gradient: each row gets the sum of the gradients of its occurrences.
  Tensor upstream = randn({2, 3, 3});
  y.backward(upstream);
  const std::vector<float> g = embed.weight().grad().to_vector<float>();
  const std::vector<float> u = upstream.to_vector<float>();
  for (int64_t d = 0; d < 3; ++d) {
    EXPECT_NEAR(g[4 * 3 + d], u[0 * 3 + d] + u[3 * 3 + d], 1e-6);
    EXPECT_NEAR(g[9 * 3 + d], u[2 * 3 + d], 1e-6);
    EXPECT_EQ(g[1 * 3 + d], 0.0f);
  }
  // Against finite differences.
  Tensor weight = embed.weight().detach().clone();
  weight.set_requires_grad(true);
  EXPECT_GRADIENTS_MATCH(
      [&](const std::vector<Tensor>& in) {
        embed.replace_parameter("weight", in[0]);
        return embed.forward(ids);
      },
      {weight});
}

TEST_F(LayersTest, EmbeddingInitialisesNormalAndHonoursPaddingIdx) {
  // weight ~ N(0, 1), as PyTorch.
  const std::vector<float> values = Embedding(1000, 50).weight().to_vector<float>();
  double sum = 0, squares = 0;
  for (float v : values) {
    sum += v;
    squares += double(v) * v;
  }
  const double n = values.size();
  EXPECT_NEAR(sum / n, 0.0, 0.02);
  EXPECT_NEAR(squares / n, 1.0, 0.03);
  // padding_idx: zeros at first, and no gradient.
  Embedding embed(6, 4, /*padding_idx=*/-2);  // row 4
  ASSERT_EQ(embed.padding_idx(), std::optional<int64_t>(4));
  EXPECT_EQ(embed.weight().narrow(0, 4, 1).to_vector<float>(), std::vector<float>(4, 0.0f));
  Tensor ids = from_vector(std::vector<int64_t>{4, 1, 4}, {3});
  Tensor y = embed.forward(ids);
  EXPECT_EQ(y.narrow(0, 0, 1).to_vector<float>(), std::vector<float>(4, 0.0f));
  y.backward(ones({3, 4}));
  const std::vector<float> g = embed.weight().grad().to_vector<float>();
  for (int64_t d = 0; d < 4; ++d) {
    EXPECT_EQ(g[4 * 4 + d], 0.0f);
    EXPECT_EQ(g[1 * 4 + d], 1.0f);
  }
  // Cloning keeps the configuration and values.
  std::shared_ptr<Module> copy = embed.clone(Device::Cpu(1));
  EXPECT_EQ(copy->ToString(), "Embedding(6, 4, padding_idx=4)");
  EXPECT_TRUE(allclose(copy->parameter("weight").to(Device::Cpu(0)), embed.weight(), 0.0, 0.0));
}

TEST_F(LayersTest, EmbeddingPrintsAndNamesBadIndices) {
  EXPECT_EQ(Embedding(10, 3).ToString(), "Embedding(10, 3)");
  EXPECT_EQ(Embedding(10, 3, 0).ToString(), "Embedding(10, 3, padding_idx=0)");
  Embedding embed(10, 3);
  EXPECT_THAT(ErrorOf([&] {
                embed.forward(from_vector(std::vector<int64_t>{1, 12, 3}, {3}));
              }),
              HasSubstr("Embedding(10, 3): index 12 (element 1 of the [3] input) is out of range; "
                        "indices must be in [0, 10) (num_embeddings)"));
  EXPECT_THAT(ErrorOf([&] { embed.forward(from_vector(std::vector<int64_t>{-1}, {1})); }),
              HasSubstr("index -1 (element 0"));
  EXPECT_THAT(ErrorOf([&] { embed.forward(zeros({3})); }),
              HasSubstr("Embedding(10, 3): expected int64 indices but got float32"));
  EXPECT_THAT(ErrorOf([] { Embedding(10, 3, 10); }),
              HasSubstr("padding_idx must be within num_embeddings: in [-10, 10) but is 10"));
  EXPECT_THAT(ErrorOf([] { Embedding(0, 3); }),
              HasSubstr("num_embeddings and embedding_dim must be positive"));
}

// ---- max_norm, norm_type, scale_grad_by_freq ------------------------------------------------

// An [rows.size() / dim, dim] float32 weight with these values, in place.
void SetWeight(Embedding& embed, const std::vector<float>& values) {
  NoGradGuard no_grad;
  embed.weight().copy_(from_vector(values, embed.weight().shape()));
}

// The p-norm of a row, in double.
double Norm(const std::vector<float>& row, double p) {
  double acc = 0;
  if (std::isinf(p)) {
    for (float v : row) acc = std::max(acc, std::abs(double(v)));
    return acc;
  }
  for (float v : row) acc += std::pow(std::abs(double(v)), p);
  return std::pow(acc, 1.0 / p);
}

// torch.embedding_renorm_ on the host: the rows at `ids` whose p-norm exceeds max_norm,
// scaled by max_norm / (norm + 1e-7), the others as they are.
std::vector<float> Renormed(std::vector<float> table, int64_t dim, const std::vector<int64_t>& ids,
                            double max_norm, double p) {
  std::vector<bool> done(table.size() / dim, false);
  for (int64_t id : ids) {
    if (done[id]) continue;
    done[id] = true;
    const std::vector<float> row(table.begin() + id * dim, table.begin() + (id + 1) * dim);
    const double norm = Norm(row, p);
    if (norm <= max_norm) continue;
    const float scale = static_cast<float>(max_norm / (norm + 1e-7));
    for (int64_t d = 0; d < dim; ++d) table[id * dim + d] *= scale;
  }
  return table;
}

TEST_F(LayersTest, EmbeddingOptionsPrintAsPyTorchAndBadOnesAreErrors) {
  Embedding embed(
      EmbeddingOptions(10, 3).padding_idx(-1).max_norm(1.0).norm_type(1.0).scale_grad_by_freq(
          true));
  EXPECT_EQ(embed.ToString(),
            "Embedding(10, 3, padding_idx=9, max_norm=1.0, norm_type=1.0, "
            "scale_grad_by_freq=True)");
  EXPECT_EQ(embed.options().padding_idx(), std::optional<int64_t>(9));
  EXPECT_EQ(embed.options().max_norm(), std::optional<double>(1.0));
  EXPECT_EQ(embed.options().norm_type(), 1.0);
  EXPECT_TRUE(embed.options().scale_grad_by_freq());
  // PyTorch's defaults, left out of the printed form as PyTorch leaves them.
  const EmbeddingOptions defaults(10, 3);
  EXPECT_EQ(defaults.padding_idx(), std::nullopt);
  EXPECT_EQ(defaults.max_norm(), std::nullopt);
  EXPECT_EQ(defaults.norm_type(), 2.0);
  EXPECT_FALSE(defaults.scale_grad_by_freq());
  EXPECT_EQ(Embedding(defaults).ToString(), "Embedding(10, 3)");
  EXPECT_EQ(Embedding(EmbeddingOptions(10, 3).max_norm(0.5)).ToString(),
            "Embedding(10, 3, max_norm=0.5)");
  EXPECT_EQ(Embedding(EmbeddingOptions(10, 3).norm_type(INFINITY)).ToString(),
            "Embedding(10, 3, norm_type=inf)");
  // max_norm 0 is allowed (every looked-up row with a nonzero norm becomes zeros).
  EXPECT_NO_THROW(Embedding(EmbeddingOptions(10, 3).max_norm(0.0)));
  EXPECT_THAT(ErrorOf([] { Embedding(EmbeddingOptions(10, 3).max_norm(-1.0)); }),
              HasSubstr("Embedding: max_norm (the largest norm a looked-up row may keep) must be "
                        ">= 0 but is -1; pass a non-negative bound, or leave max_norm unset"));
  EXPECT_THAT(ErrorOf([] { Embedding(EmbeddingOptions(10, 3).max_norm(std::nan(""))); }),
              HasSubstr("max_norm (the largest norm a looked-up row may keep) must be >= 0 but is "
                        "nan"));
  for (double p : {0.0, -2.0, std::nan("")}) {
    SCOPED_TRACE(p);
    EXPECT_THAT(ErrorOf([p] { Embedding(EmbeddingOptions(10, 3).max_norm(1.0).norm_type(p)); }),
                HasSubstr("Embedding: norm_type (the p of the p-norm that max_norm bounds) must "
                          "be positive but is "));
  }
}

TEST_F(LayersTest, EmbeddingMaxNormRenormalisesTheLookedUpRowsInPlace) {
  // Rows of norms (2-norm) 5, 0.5, 10, 1, 2.
  const std::vector<float> table = {3, 4, 0.3f, 0.4f, 6, 8, 1, 0, 0, -2};
  const std::vector<int64_t> ids = {0, 1, 0, 4};
  for (double p : {2.0, 1.0, 3.0, double(INFINITY)}) {
    SCOPED_TRACE(p);
    Embedding embed(EmbeddingOptions(5, 2).max_norm(1.0).norm_type(p));
    SetWeight(embed, table);
    const Tensor handle = embed.weight();
    Tensor y = embed.forward(from_vector(ids, {2, 2}));
    const std::vector<float> expected = Renormed(table, 2, ids, 1.0, p);
    const std::vector<float> weight = embed.weight().to_vector<float>();
    EXPECT_TRUE(embed.weight().shares_storage_with(handle));  // in place
    for (size_t i = 0; i < table.size(); ++i) EXPECT_NEAR(weight[i], expected[i], 1e-6) << i;
    // Rows not looked up (2, 3) and rows within max_norm (1) are exactly as they were.
    for (int i : {2, 3, 4, 5, 6, 7}) EXPECT_EQ(weight[i], table[i]) << i;
    // Looked-up rows end within max_norm; the output holds the renormalised rows.
    EXPECT_LE(Norm({weight[0], weight[1]}, p), 1.0 + 1e-6);
    std::vector<float> rows;
    for (int64_t id : ids) rows.insert(rows.end(), {weight[id * 2], weight[id * 2 + 1]});
    EXPECT_EQ(y.to_vector<float>(), rows);
    // The weight stays a leaf, and its gradient is the plain lookup's (the renormalisation is
    // not differentiated, as in PyTorch): row 0 looked up twice, 1 and 4 once.
    EXPECT_TRUE(embed.weight().is_leaf());
    y.backward(ones({2, 2, 2}));
    EXPECT_EQ(embed.weight().grad().to_vector<float>(),
              (std::vector<float>{2, 2, 1, 1, 0, 0, 0, 0, 1, 1}));
  }
  // Worked out: [3, 4] / (5 + 1e-7) and [0, -2] / (2 + 1e-7) for max_norm 1.
  Embedding embed(EmbeddingOptions(5, 2).max_norm(1.0));
  SetWeight(embed, table);
  embed.forward(from_vector(ids, {4}));
  const std::vector<float> w = embed.weight().to_vector<float>();
  EXPECT_FLOAT_EQ(w[0], 0.6f);
  EXPECT_FLOAT_EQ(w[1], 0.8f);
  EXPECT_FLOAT_EQ(w[9], -1.0f);
  // max_norm 0: looked-up rows become zeros; a zero row stays (0 does not exceed 0).
  Embedding zero(EmbeddingOptions(3, 2).max_norm(0.0));
  SetWeight(zero, {1, 2, 0, 0, 5, 5});
  zero.forward(from_vector(std::vector<int64_t>{0, 1}, {2}));
  EXPECT_EQ(zero.weight().to_vector<float>(), (std::vector<float>{0, 0, 0, 0, 5, 5}));
}

TEST_F(LayersTest, EmbeddingMaxNormWritesFewRunsByRowsAndManyByOnePass) {
  // One run of 40 consecutive rows, and 40 separate rows (beyond the row copies' limit):
  // both match the definition, and rows not looked up are untouched, bit for bit.
  const int64_t n = 90, dim = 5;
  for (int64_t stride : {1, 2}) {
    SCOPED_TRACE(stride);
    Embedding embed(EmbeddingOptions(n, dim).max_norm(1.5));
    const std::vector<float> table = (embed.weight() * 3.0).to_vector<float>();
    SetWeight(embed, table);
    std::vector<int64_t> ids;
    for (int64_t i = 0; i < 40; ++i) ids.push_back(3 + i * stride);
    ids.push_back(3);  // a repeat
    embed.forward(from_vector(ids, {static_cast<int64_t>(ids.size())}));
    const std::vector<float> expected = Renormed(table, dim, ids, 1.5, 2.0);
    const std::vector<float> weight = embed.weight().to_vector<float>();
    int renormed = 0;
    for (int64_t i = 0; i < n * dim; ++i) {
      EXPECT_NEAR(weight[i], expected[i], 1e-6) << i;
      if (expected[i] == table[i]) {
        EXPECT_EQ(weight[i], table[i]) << i;
      }
      renormed += expected[i] != table[i];
    }
    EXPECT_GT(renormed, 30 * dim);  // most of the 40 rows (norms ~ 3 sqrt(5)) were scaled
  }
}

TEST_F(LayersTest, EmbeddingScaleGradByFreqDividesEachRowsGradientByItsCount) {
  // Index 4 occurs 3 times, 0 twice, 2 once.
  const std::vector<int64_t> ids = {4, 0, 4, 4, 2, 0};
  Embedding embed(EmbeddingOptions(6, 3).scale_grad_by_freq(true));
  Tensor upstream = randn({2, 3, 3});
  Tensor y = embed.forward(from_vector(ids, {2, 3}));
  // The values are the plain lookup's.
  EXPECT_EQ(y.to_vector<float>(),
            index_select(embed.weight(), 0, from_vector(ids, {6})).to_vector<float>());
  y.backward(upstream);
  const std::vector<float> g = embed.weight().grad().to_vector<float>();
  const std::vector<float> u = upstream.to_vector<float>();
  for (int64_t d = 0; d < 3; ++d) {
    EXPECT_NEAR(g[4 * 3 + d], (u[0 * 3 + d] + u[2 * 3 + d] + u[3 * 3 + d]) / 3, 1e-6);
    EXPECT_NEAR(g[0 * 3 + d], (u[1 * 3 + d] + u[5 * 3 + d]) / 2, 1e-6);
    EXPECT_NEAR(g[2 * 3 + d], u[4 * 3 + d], 1e-6);
    for (int64_t row : {1, 3, 5}) EXPECT_EQ(g[row * 3 + d], 0.0f);
  }
  // With padding_idx: its row gets nothing; the counts of the others are as before.
  Embedding padded(EmbeddingOptions(6, 3).padding_idx(0).scale_grad_by_freq(true));
  padded.forward(from_vector(ids, {2, 3})).backward(upstream);
  const std::vector<float> gp = padded.weight().grad().to_vector<float>();
  for (int64_t d = 0; d < 3; ++d) {
    EXPECT_EQ(gp[d], 0.0f);
    EXPECT_NEAR(gp[4 * 3 + d], g[4 * 3 + d], 1e-6);
  }
  // The same as the plain lookup's gradient for an upstream divided by the counts.
  Embedding plain(6, 3);
  SetWeight(plain, embed.weight().to_vector<float>());
  const Tensor inverse_counts =
      from_vector(std::vector<float>{1.0f / 3, 0.5f, 1.0f / 3, 1.0f / 3, 1.0f, 0.5f}, {2, 3, 1});
  plain.forward(from_vector(ids, {2, 3})).backward(upstream * inverse_counts);
  EXPECT_LT(MaxAbsDiff(plain.weight().grad(), embed.weight().grad()), 1e-6);
}

TEST_F(LayersTest, EmbeddingWithOptionsPassesTheGradientCheck) {
  // Distinct indices (counts of 1) and rows within max_norm: the lookup is then exactly
  // differentiable, so finite differences hold with every option on.
  Embedding embed(EmbeddingOptions(8, 3).max_norm(100.0).norm_type(3.0).scale_grad_by_freq(true));
  const Tensor ids = from_vector(std::vector<int64_t>{5, 1, 7, 2}, {2, 2});
  ExpectLayerGradients(
      embed, [&](const Tensor& x) { return embed.forward(ids) * x; }, randn({2, 2, 3}));
  // Repeated indices with max_norm: the gradient is the lookup's (renormalisation is not
  // differentiated) while the looked-up rows stay within the bound.
  Embedding bounded(EmbeddingOptions(8, 3).max_norm(100.0));
  const Tensor repeated = from_vector(std::vector<int64_t>{5, 1, 5, 5}, {4});
  ExpectLayerGradients(
      bounded, [&](const Tensor& x) { return bounded.forward(repeated) * x; }, randn({4, 3}));
}

TEST_F(LayersTest, EmbeddingClonesKeepTheOptions) {
  Embedding embed(
      EmbeddingOptions(6, 2).padding_idx(5).max_norm(1.0).norm_type(1.0).scale_grad_by_freq(true));
  SetWeight(embed, {3, 4, 0.1f, 0.2f, 6, 8, 1, 0, 0, -2, 0, 0});
  for (const Device device : {Device::Cpu(0), Device::Cpu(1)}) {
    SCOPED_TRACE(device);
    std::shared_ptr<Module> module = embed.clone(device);
    auto copy = std::dynamic_pointer_cast<Embedding>(module);
    ASSERT_NE(copy, nullptr);
    EXPECT_EQ(copy->ToString(), embed.ToString());
    EXPECT_EQ(copy->options().padding_idx(), std::optional<int64_t>(5));
    EXPECT_EQ(copy->options().max_norm(), std::optional<double>(1.0));
    EXPECT_EQ(copy->options().norm_type(), 1.0);
    EXPECT_TRUE(copy->options().scale_grad_by_freq());
    // The copy renormalises its own weight (L1 norm here) and scales its own gradients; the
    // original's weight is untouched.
    const std::vector<int64_t> ids = {0, 0, 4, 5};
    Tensor y = copy->forward(from_vector(ids, {4}, device));
    EXPECT_EQ(copy->weight().device(), device);
    const std::vector<float> expected =
        Renormed({3, 4, 0.1f, 0.2f, 6, 8, 1, 0, 0, -2, 0, 0}, 2, ids, 1.0, 1.0);
    EXPECT_LT(MaxAbsDiff(copy->weight().to(Device::Cpu(0)), from_vector(expected, {6, 2})), 1e-6);
    EXPECT_EQ(embed.weight().to_vector<float>()[0], 3.0f);
    y.backward(ones({4, 2}, device));
    EXPECT_EQ(copy->weight().grad().to_vector<float>(),
              (std::vector<float>{1, 1, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0}));  // 2 / 2, 1, padding 0
  }
}

}  // namespace
}  // namespace tandem::nn
