#include "nn/sequential.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>

#include "nn/layers.h"
#include "nn/loss.h"
#include "nn/test_util.h"
#include "tensor/gradcheck.h"
#include "tensor/runtime.h"

namespace tandem::nn {
namespace {

using testing::ErrorOf;
using ::testing::HasSubstr;

class SequentialTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetCpuDeviceCount(2);
    manual_seed(0);
  }
};

TEST_F(SequentialTest, BuildsFromValuesOrSharedPointersAndPrintsLikePyTorch) {
  auto shared = std::make_shared<Linear>(784, 256);
  Sequential from_pointers({shared, std::make_shared<ReLU>()});
  EXPECT_EQ(from_pointers.ToString(),
            "Sequential(\n"
            "  (0): Linear(in_features=784, out_features=256, bias=True)\n"
            "  (1): ReLU()\n"
            ")");
  EXPECT_EQ(from_pointers[0], shared);  // shared, not copied
  Sequential from_values(Linear(784, 256), ReLU(), shared);
  EXPECT_EQ(from_values.size(), 3u);
  EXPECT_EQ(from_values.named_children()[2].name, "2");
  EXPECT_EQ(from_values.at<Linear>(2), shared);
  EXPECT_EQ(from_values.at<ReLU>(1)->name(), "ReLU");
  EXPECT_THAT(ErrorOf([&] { from_values.at<Conv2d>(1); }),
              HasSubstr("module (1) is a ReLU, not the type asked for"));
  EXPECT_THAT(ErrorOf([&] { from_values[3]; }), HasSubstr("index 3 is out of range for 3"));
  Sequential appended;
  EXPECT_TRUE(appended.empty());
  appended.push_back(Flatten());
  appended.push_back(std::make_shared<Linear>(6, 2));
  EXPECT_EQ(appended.ToString(),
            "Sequential(\n"
            "  (0): Flatten(start_dim=1, end_dim=-1)\n"
            "  (1): Linear(in_features=6, out_features=2, bias=True)\n"
            ")");
}

TEST_F(SequentialTest, ForwardComposesTheModules) {
  Sequential mlp(Linear(5, 4), ReLU(), Linear(4, 3));
  Tensor x = randn({6, 5});
  auto first = mlp.at<Linear>(0), last = mlp.at<Linear>(2);
  Tensor expected = last->forward(relu(first->forward(x)));
  EXPECT_TRUE(allclose(mlp.forward(x), expected));
  EXPECT_EQ(Sequential().forward(x).impl(), x.impl());  // empty: the identity
}

TEST_F(SequentialTest, Gradients) {
  Sequential mlp(Linear(3, 4), ReLU(), Linear(4, 2));
  const std::vector<NamedTensor> params = mlp.named_parameters();
  std::vector<Tensor> inputs = {randn({5, 3})};
  for (const NamedTensor& p : params) inputs.push_back(p.value.detach().clone());
  for (Tensor& t : inputs) t.set_requires_grad(true);
  EXPECT_GRADIENTS_MATCH(
      [&](const std::vector<Tensor>& in) {
        for (size_t i = 0; i < params.size(); ++i) mlp.replace_parameter(params[i].name, in[i + 1]);
        return mlp.forward(in[0]);
      },
      inputs);
}

TEST_F(SequentialTest, PassesSeveralTensorsAlong) {
  // The loss takes two tensors; a Sequential can end in it.
  Sequential scored(std::make_shared<MSELoss>());
  Tensor a = randn({3}), b = randn({3});
  std::vector<Tensor> out = scored.forward_tensors({a, b});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_NEAR(out[0].item(), mse_loss(a, b).item(), 1e-6);
  EXPECT_THAT(ErrorOf([&] { scored.forward(a); }),
              HasSubstr("MSELoss.forward() takes 2 tensors but was given 1"));
}

TEST_F(SequentialTest, CloneCopiesEveryModule) {
  Sequential seq(Linear(3, 4), Dropout(0.5), Linear(4, 2));
  seq.eval();
  std::shared_ptr<Module> copy = seq.clone(Device::Cpu(1));
  EXPECT_EQ(copy->ToString(), seq.ToString());
  EXPECT_FALSE(copy->is_training());
  EXPECT_FALSE(copy->named_children()[1].module->is_training());
  for (size_t i : {0u, 2u}) {
    EXPECT_NE(copy->named_children()[i].module, seq[i]);
  }
  Tensor x = randn({5, 3});
  Tensor expected = seq.forward(x);
  Tensor actual = copy->forward_tensors({x.to(Device::Cpu(1))})[0];
  EXPECT_EQ(actual.device(), Device::Cpu(1));
  EXPECT_TRUE(allclose(actual.to(Device::Cpu(0)), expected));
}

}  // namespace
}  // namespace tandem::nn
