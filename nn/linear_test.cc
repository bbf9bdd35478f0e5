// Linear: PyTorch's initialisation, y = x W^T + b, gradients, errors that name the layer.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "nn/layers.h"
#include "nn/layers_test_util.h"

namespace tandem::nn {
namespace {

using testing::ErrorOf;
using testing::ExpectLayerGradients;
using ::testing::HasSubstr;
using testing::LayersTest;

// ---- Linear ----------------------------------------------------------------------------

TEST_F(LayersTest, LinearInitialisesLikePyTorch) {
  Linear layer(784, 256);
  const double bound = 1.0 / std::sqrt(784.0);
  for (const Tensor& p : {layer.weight(), layer.bias()}) {
    const std::vector<float> values = p.to_vector<float>();
    double low = 1.0, high = -1.0, sum = 0.0;
    for (float v : values) {
      low = std::min<double>(low, v);
      high = std::max<double>(high, v);
      sum += v;
    }
    // Uniform on [-bound, bound]: inside it, reaching near both ends, centred.
    EXPECT_GE(low, -bound);
    EXPECT_LE(high, bound);
    EXPECT_LT(low, -0.9 * bound);
    EXPECT_GT(high, 0.9 * bound);
    EXPECT_NEAR(sum / values.size(), 0.0, 4.0 * bound / std::sqrt(3.0 * values.size()));
  }
  EXPECT_EQ(layer.weight().shape(), (Shape{256, 784}));
  EXPECT_EQ(layer.bias().shape(), (Shape{256}));
  EXPECT_FALSE(Linear(3, 2, /*bias=*/false).bias().defined());
}

TEST_F(LayersTest, LinearComputesXWTransposePlusB) {
  Linear layer(3, 2);
  Tensor x = randn({4, 3});
  Tensor expected = matmul(x, layer.weight().t()) + layer.bias();
  EXPECT_TRUE(allclose(layer.forward(x), expected, 1e-5, 1e-6));
  // Leading dimensions are kept.
  EXPECT_EQ(layer.forward(randn({2, 5, 3})).shape(), (Shape{2, 5, 2}));
  Linear no_bias(3, 2, false);
  EXPECT_TRUE(allclose(no_bias.forward(x), matmul(x, no_bias.weight().t()), 1e-5, 1e-6));
}

TEST_F(LayersTest, LinearGradients) {
  Linear layer(4, 3);
  ExpectLayerGradients(
      layer, [&](const Tensor& x) { return layer.forward(x); }, randn({5, 4}));
  Linear no_bias(4, 3, false);
  ExpectLayerGradients(
      no_bias, [&](const Tensor& x) { return no_bias.forward(x); }, randn({2, 2, 4}));
}

TEST_F(LayersTest, LinearNamesItselfOnBadInput) {
  Linear layer(784, 256);
  EXPECT_THAT(ErrorOf([&] {
                layer.forward(zeros({32, 100}));
              }),
              HasSubstr("Linear(in_features=784, out_features=256): expected input with last "
                        "dimension 784 but got [32, 100]"));
  EXPECT_THAT(ErrorOf([&] { layer.forward(Tensor()); }), HasSubstr("undefined"));
  EXPECT_THAT(ErrorOf([] { Linear(0, 3); }), HasSubstr("must be positive"));
}

}  // namespace
}  // namespace tandem::nn
