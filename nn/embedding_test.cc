// Embedding: lookups, gradients, padding_idx, initialisation, printing and bad indices.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <vector>

#include "nn/layers.h"
#include "nn/layers_test_util.h"

namespace tandem::nn {
namespace {

using testing::ErrorOf;
using testing::ExpectLayerGradients;
using ::testing::HasSubstr;
using testing::LayersTest;

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

}  // namespace
}  // namespace tandem::nn
