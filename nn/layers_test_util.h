// What the layer tests (linear_test, conv_layers_test, embedding_test, ...) share: the
// LayersTest fixture (three logical CPU devices, seed 0), a gradient check of a layer with
// respect to its input and parameters, and inputs without ties for max pooling.
//
//   TEST_F(LayersTest, LinearGradients) {
//     Linear layer(4, 3);
//     ExpectLayerGradients(layer, [&](const Tensor& x) { return layer.forward(x); },
//                          randn({5, 4}));
//   }
#ifndef TANDEM_NN_LAYERS_TEST_UTIL_H_
#define TANDEM_NN_LAYERS_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <functional>
#include <vector>

#include "nn/module.h"
#include "nn/test_util.h"
#include "tensor/gradcheck.h"
#include "tensor/runtime/devices.h"
#include "tensor/tensor.h"

namespace tandem::nn::testing {

class LayersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetCpuDeviceCount(3);
    manual_seed(0);
  }
};

// Checks the gradients of layer.forward with respect to its input and to every parameter
// (routed in with replace_parameter, which is also how DataParallel feeds replicas), in
// float64: the layer is converted for the check and back to float32 after (exactly: every
// float32 is a float64).
inline void ExpectLayerGradients(Module& layer, const std::function<Tensor(const Tensor&)>& forward,
                                 const Tensor& input) {
  layer.to(kFloat64);
  const std::vector<NamedTensor> params = layer.named_parameters();
  std::vector<Tensor> inputs = {input.detach().to(kFloat64).clone()};
  for (const NamedTensor& p : params) inputs.push_back(p.value.detach().clone());
  for (Tensor& t : inputs) t.set_requires_grad(true);
  EXPECT_GRADIENTS_MATCH(
      [&](const std::vector<Tensor>& in) {
        for (size_t i = 0; i < params.size(); ++i)
          layer.replace_parameter(params[i].name, in[i + 1]);
        return forward(in[0]);
      },
      inputs);
  for (const NamedTensor& p : params) layer.replace_parameter(p.name, p.value);
  layer.to(kFloat32);
}

// Distinct values (a shuffled ramp), so that no max-pooling window has a tie.
inline Tensor DistinctValues(const Shape& shape) {
  return randperm(NumElements(shape)).to(kFloat32).reshape(shape) * 0.05;
}

}  // namespace tandem::nn::testing

#endif  // TANDEM_NN_LAYERS_TEST_UTIL_H_
