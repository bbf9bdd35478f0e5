// Modules in float64: Module::to(kFloat64) converts parameters and buffers, every layer and
// loss computes in float64 with gradients that pass a float64 gradient check, the optimizers
// step float64 parameters as they step float32 ones, and checkpoints keep the dtype.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "nn/nn.h"
#include "nn/test_util.h"
#include "tensor/gradcheck.h"
#include "tensor/tensor.h"

namespace tandem::nn {
namespace {

using ::testing::HasSubstr;

std::shared_ptr<Sequential> SmallCnn() {
  return std::make_shared<Sequential>(Conv2d(1, 2, 3, 1, 1), BatchNorm2d(2), ReLU(), MaxPool2d(2),
                                      Flatten(), Linear(8, 3));
}

TEST(Float64Test, ToDTypeConvertsFloatingParametersAndBuffersOnly) {
  manual_seed(1);
  auto model = SmallCnn();
  const Tensor weight_before = model->parameters()[0].detach().clone();
  model->to(kFloat64);
  for (const Tensor& p : model->parameters()) {
    EXPECT_EQ(p.dtype(), kFloat64);
    EXPECT_TRUE(p.requires_grad());
    EXPECT_TRUE(p.is_leaf());
  }
  for (const auto& [name, buffer] : model->named_buffers()) {
    // BatchNorm's num_batches_tracked stays int64, as in PyTorch.
    EXPECT_EQ(buffer.dtype(),
              name.find("num_batches_tracked") != std::string::npos ? kInt64 : kFloat64)
        << name;
  }
  EXPECT_TRUE(allclose(model->parameters()[0], weight_before.to(kFloat64), 0.0, 0.0));
  EXPECT_THAT(
      testing::ErrorOf([&] { model->to(kInt64); }),
      HasSubstr("the dtype must be floating-point (float32, float64, bfloat16 or float16)"));
  // A float32 input into a float64 model is refused, naming both dtypes.
  EXPECT_THAT(testing::ErrorOf([&] {
                model->forward(randn({1, 1, 4, 4}));
              }),
              HasSubstr("is float32 but weight is float64"));
}

TEST(Float64Test, LayersAndLossesMatchFloat32AndPassFloat64GradientChecks) {
  manual_seed(2);
  auto model32 = SmallCnn();
  auto model64 = std::static_pointer_cast<Sequential>(model32->clone());
  model64->to(kFloat64);
  const Tensor x = randn({4, 1, 4, 4});
  const Tensor labels = from_vector(std::vector<int64_t>{0, 2, 1, 2}, {4}, kInt64);
  CrossEntropyLoss criterion;
  const Tensor loss32 = criterion.forward(model32->forward(x), labels);
  const Tensor loss64 = criterion.forward(model64->forward(x.to(kFloat64)), labels);
  EXPECT_EQ(loss64.dtype(), kFloat64);
  EXPECT_NEAR(loss32.item(), loss64.item(), 1e-5);

  // Parameter gradients agree with float32's within its precision.
  loss32.backward();
  loss64.backward();
  const std::vector<Tensor> p32 = model32->parameters(), p64 = model64->parameters();
  ASSERT_EQ(p32.size(), p64.size());
  for (size_t i = 0; i < p32.size(); ++i) {
    EXPECT_EQ(p64[i].grad().dtype(), kFloat64);
    EXPECT_TRUE(allclose(p32[i].grad().to(kFloat64), p64[i].grad(), 1e-4, 1e-5)) << i;
  }
  // And the whole network's backward passes a float64 gradient check with respect to its
  // input (eval mode: BatchNorm then uses its running statistics, a fixed function).
  model64->eval();
  const Tensor x64 = x.to(kFloat64).set_requires_grad(true);
  EXPECT_GRADIENTS_MATCH(
      [&](const std::vector<Tensor>& in) {
        return criterion.forward(model64->forward(in[0]), labels);
      },
      {x64});
}

TEST(Float64Test, OptimizersStepFloat64ParametersAsFloat32Ones) {
  for (const std::string name : {"sgd", "adam", "adamw", "rmsprop"}) {
    SCOPED_TRACE(name);
    manual_seed(3);
    Linear model32(5, 3);
    auto model64 = std::static_pointer_cast<Linear>(model32.clone());
    model64->to(kFloat64);
    const auto make = [&](std::vector<Tensor> params) -> std::unique_ptr<Optimizer> {
      if (name == "sgd") {
        return std::make_unique<SGD>(params, SGDOptions(0.1).momentum(0.9).weight_decay(0.01));
      }
      if (name == "adam") return std::make_unique<Adam>(params, AdamOptions(0.01));
      if (name == "adamw") return std::make_unique<AdamW>(params, AdamWOptions(0.01));
      return std::make_unique<RMSprop>(params, RMSpropOptions(0.01).momentum(0.5));
    };
    std::unique_ptr<Optimizer> opt32 = make(model32.parameters());
    std::unique_ptr<Optimizer> opt64 = make(model64->parameters());
    const Tensor x = randn({8, 5});
    for (int step = 0; step < 3; ++step) {
      opt32->zero_grad();
      opt64->zero_grad();
      square(model32.forward(x)).mean().backward();
      square(model64->forward(x.to(kFloat64))).mean().backward();
      opt32->step();
      opt64->step();
    }
    EXPECT_EQ(model64->weight().dtype(), kFloat64);
    EXPECT_TRUE(allclose(model32.weight().to(kFloat64), model64->weight(), 1e-4, 1e-5));
    EXPECT_TRUE(allclose(model32.bias().to(kFloat64), model64->bias(), 1e-4, 1e-5));
  }
}

TEST(Float64Test, CheckpointsKeepTheDtypeToTheBit) {
  manual_seed(4);
  auto model = SmallCnn();
  model->to(kFloat64);
  const std::string path =
      (std::filesystem::path(::testing::TempDir()) / "float64_test.ckpt").string();
  SaveCheckpoint(*model, path);
  auto loaded = SmallCnn();
  loaded->to(kFloat64);
  LoadCheckpoint(*loaded, path);
  const std::vector<Tensor> a = model->parameters(), b = loaded->parameters();
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(b[i].dtype(), kFloat64);
    EXPECT_EQ(a[i].to_vector<double>(), b[i].to_vector<double>());
  }
  // A float32 model refuses the float64 file, naming the dtypes.
  auto float32_model = SmallCnn();
  EXPECT_THAT(testing::ErrorOf([&] { LoadCheckpoint(*float32_model, path); }),
              HasSubstr("float64"));
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace tandem::nn
