// The layers without parameters: ReLU, GELU, Tanh, Sigmoid, Identity and Flatten: values
// against their formulas, gradients, printing and errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
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

// Values at least `gap` from zero, so that relu's kink is not inside a finite difference.
Tensor AwayFromZero(const Shape& shape, double gap = 0.1) {
  Tensor x = randn(shape);
  return x + (gt(x, zeros_like(x)).to(x.dtype()) * 2.0 - 1.0) * gap;
}

// ---- ReLU, Flatten ---------------------------------------------------------------------

TEST_F(LayersTest, ReLU) {
  ReLU layer;
  Tensor x = from_vector(std::vector<float>{-2, -0.5, 0, 0.5, 3}, {5});
  EXPECT_EQ(layer.forward(x).to_vector<float>(), (std::vector<float>{0, 0, 0, 0.5, 3}));
  ExpectLayerGradients(
      layer, [&](const Tensor& t) { return layer.forward(t); }, AwayFromZero({3, 4}));
}

TEST_F(LayersTest, Flatten) {
  Flatten flatten;
  EXPECT_EQ(flatten.forward(zeros({2, 3, 4, 5})).shape(), (Shape{2, 60}));
  EXPECT_EQ(Flatten(0, 1).forward(zeros({2, 3, 4})).shape(), (Shape{6, 4}));
  EXPECT_EQ(Flatten(-2).forward(zeros({2, 3, 4})).shape(), (Shape{2, 12}));
  EXPECT_EQ(flatten.ToString(), "Flatten(start_dim=1, end_dim=-1)");
  EXPECT_THAT(ErrorOf([&] { flatten.forward(zeros({5})); }),
              HasSubstr("Flatten(start_dim=1, end_dim=-1): cannot flatten dimensions 1..-1 of an "
                        "input of shape [5]"));
  ExpectLayerGradients(
      flatten, [&](const Tensor& t) { return flatten.forward(t); }, randn({2, 3, 2}));
}

// ---- Activations, Identity ---------------------------------------------------------------

TEST_F(LayersTest, ActivationsMatchTheirFormulas) {
  const std::vector<float> values = {-3.0f, -1.0f, -0.25f, 0.0f, 0.5f, 1.0f, 2.5f};
  Tensor x = from_vector(values, {7});
  const std::vector<float> exact = GELU().forward(x).to_vector<float>();
  const std::vector<float> approx = GELU("tanh").forward(x).to_vector<float>();
  const std::vector<float> th = Tanh().forward(x).to_vector<float>();
  const std::vector<float> sg = Sigmoid().forward(x).to_vector<float>();
  for (size_t i = 0; i < values.size(); ++i) {
    const double v = values[i];
    EXPECT_NEAR(exact[i], 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0))), 1e-6) << v;
    const double inner = std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v);
    EXPECT_NEAR(approx[i], 0.5 * v * (1.0 + std::tanh(inner)), 1e-6) << v;
    EXPECT_NEAR(th[i], std::tanh(v), 1e-6) << v;
    EXPECT_NEAR(sg[i], 1.0 / (1.0 + std::exp(-v)), 1e-6) << v;
  }
  // PyTorch's values: gelu(1) = 0.8413447, gelu(1, approximate='tanh') = 0.8411920.
  EXPECT_NEAR(exact[5], 0.8413447460685429, 1e-6);
  EXPECT_NEAR(approx[5], 0.8411919906082768, 1e-6);
  // Identity hands back its input, autograd included.
  Tensor y = randn({3, 4});
  EXPECT_TRUE(allclose(Identity().forward(y), y, 0.0, 0.0));
  for (const char* kind : {"none", "tanh"}) {
    GELU gelu(kind);
    ExpectLayerGradients(
        gelu, [&](const Tensor& input) { return gelu.forward(input); }, randn({3, 5}) * 2.0);
  }
  Tanh tanh_layer;
  ExpectLayerGradients(
      tanh_layer, [&](const Tensor& input) { return tanh_layer.forward(input); }, randn({3, 5}));
  Sigmoid sigmoid_layer;
  ExpectLayerGradients(
      sigmoid_layer, [&](const Tensor& input) { return sigmoid_layer.forward(input); },
      randn({3, 5}));
  Identity identity;
  ExpectLayerGradients(
      identity, [&](const Tensor& input) { return identity.forward(input) * 2.0; }, randn({3, 5}));
}

TEST_F(LayersTest, ActivationsPrintLikePyTorch) {
  EXPECT_EQ(GELU().ToString(), "GELU(approximate='none')");
  EXPECT_EQ(GELU("tanh").ToString(), "GELU(approximate='tanh')");
  EXPECT_EQ(Tanh().ToString(), "Tanh()");
  EXPECT_EQ(Sigmoid().ToString(), "Sigmoid()");
  EXPECT_EQ(Identity().ToString(), "Identity()");
  EXPECT_THAT(ErrorOf([] { GELU("fast"); }),
              HasSubstr("GELU: approximate must be 'none' (the exact erf form) or 'tanh' but is "
                        "'fast'"));
  EXPECT_THAT(ErrorOf([] { Tanh().forward(Tensor()); }), HasSubstr("Tanh(): the input tensor is "
                                                                   "undefined"));
}

}  // namespace
}  // namespace tandem::nn
