#include "examples/models.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "examples/cli.h"
#include "tensor/runtime/devices.h"
#include "tensor/tensor.h"

namespace tandem::examples {
namespace {

using ::testing::HasSubstr;

class ModelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetCpuDeviceCount(2);
    manual_seed(0);
  }
};

int64_t ParameterCount(const nn::Module& model) {
  int64_t n = 0;
  for (const Tensor& p : model.parameters()) n += p.numel();
  return n;
}

TEST_F(ModelsTest, ResnetHasTheDescribedLayers) {
  std::shared_ptr<nn::Sequential> model = MakeModel("resnet");
  const std::string printed = model->ToString();
  EXPECT_THAT(printed, HasSubstr("(0): Conv2d(1, 16, kernel_size=(3, 3), stride=(1, 1), "
                                 "padding=(1, 1), bias=False)"));
  EXPECT_THAT(printed, HasSubstr("(3): BasicBlock(\n    (conv1): Conv2d(16, 16, kernel_size=(3, "
                                 "3), stride=(1, 1), padding=(1, 1), bias=False)\n"));
  EXPECT_THAT(printed, HasSubstr("Conv2d(16, 32, kernel_size=(3, 3), stride=(2, 2), "
                                 "padding=(1, 1), bias=False)"));
  EXPECT_THAT(printed, HasSubstr("AdaptiveAvgPool2d(output_size=1)"));
  EXPECT_THAT(printed, HasSubstr("Linear(in_features=64, out_features=10, bias=True)"));
  // Convolutions (no bias) and batch norms (weight and bias) by stage, then the classifier.
  int64_t expected = 0, in = 1;
  for (int64_t width : {16, 32, 64}) {
    expected += in * width * 9 + 2 * width;           // stem or down-sampling conv + BN
    expected += 2 * (width * width * 9 + 2 * width);  // the block's two conv + BN
    in = width;
  }
  expected += 64 * 10 + 10;
  EXPECT_EQ(ParameterCount(*model), expected);
  EXPECT_GT(SavedActivationsPerSample("resnet"), 784);
}

TEST_F(ModelsTest, BasicBlockAddsItsInput) {
  BasicBlock block(4);
  block.eval();
  // With conv2's weight at zero the residual branch is zero: the block is relu(x).
  {
    NoGradGuard no_grad;
    Tensor(block.parameter("conv2.weight")).zero_();
  }
  Tensor x = randn({2, 4, 5, 5});
  EXPECT_TRUE(allclose(block.forward(x), relu(x), 1e-6, 1e-6));
  EXPECT_EQ(block.ToString().substr(0, 11), "BasicBlock(");
  EXPECT_EQ(block.parameters().size(), 6u);  // two convolutions (no bias), two batch norms
}

TEST_F(ModelsTest, ResnetTrainsAndClones) {
  std::shared_ptr<nn::Sequential> model = MakeModel("resnet");
  Tensor x = randn({8, 1, 28, 28});
  Tensor y = from_vector(std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}, {8});
  ASSERT_EQ(model->forward(x).shape(), (Shape{8, 10}));
  nn::SGD optimizer(model->parameters(), nn::SGDOptions(0.05).momentum(0.9));
  const double first = cross_entropy(model->forward(x), y).item();
  for (int step = 0; step < 10; ++step) {
    optimizer.zero_grad();
    Tensor loss = cross_entropy(model->forward(x), y);
    loss.backward();
    for (const Tensor& p : model->parameters()) ASSERT_TRUE(p.grad().defined());
    optimizer.step();
  }
  EXPECT_LT(cross_entropy(model->forward(x), y).item(), 0.5 * first);
  // A clone on cpu:1 computes the same function (evaluation mode: running statistics).
  model->eval();
  std::shared_ptr<nn::Module> copy = model->clone(Device::Cpu(1));
  EXPECT_TRUE(allclose(copy->forward_tensors({x.to(Device::Cpu(1))})[0].to(Device::Cpu(0)),
                       model->forward(x), 1e-4, 1e-4));
}

TEST_F(ModelsTest, UnknownKindsAreUsageErrors) {
  try {
    MakeModel("vgg");
    FAIL() << "no error";
  } catch (const UsageError& error) {
    EXPECT_THAT(error.what(), HasSubstr("--model must be 'mlp', 'cnn' or 'resnet' but is 'vgg'"));
  }
}

TEST_F(ModelsTest, OptimizersApplyWeightDecayAndTheirLearningRate) {
  for (const std::string kind : {"sgd", "adam"}) {
    std::shared_ptr<nn::Sequential> model = MakeModel("mlp");
    const Tensor before = model->parameters()[0].clone();
    TrainerOptimizer optimizer = MakeOptimizer(kind, *model, 0.1, 0.5);
    optimizer.set_lr(0.01);
    // A zero loss gradient leaves only the decay: SGD's first step is p - lr * wd * p; Adam's
    // first step is lr * g / (|g| + eps) with g = wd * p.
    for (Tensor& p : model->parameters()) p.set_grad(zeros_like(p));
    optimizer.optimizer->step();
    const Tensor after = model->parameters()[0];
    const Tensor expected = kind == "sgd"
                                ? before * (1.0 - 0.01 * 0.5)
                                : before - 0.01 * (0.5 * before) / (abs(0.5 * before) + 1e-8);
    EXPECT_TRUE(allclose(after, expected, 1e-5, 1e-6)) << kind;
  }
  std::shared_ptr<nn::Sequential> model = MakeModel("mlp");
  EXPECT_THROW(MakeOptimizer("sgd", *model, 0.1, -1e-4), UsageError);
  EXPECT_THROW(MakeOptimizer("lbfgs", *model, 0.1, 0.0), UsageError);
}

TEST_F(ModelsTest, CosineLearningRateFallsFromThePeakOncePerEpoch) {
  EXPECT_DOUBLE_EQ(LearningRate(0.1, "none", 7, 10), 0.1);
  EXPECT_DOUBLE_EQ(LearningRate(0.1, "cosine", 0, 10), 0.1);
  EXPECT_NEAR(LearningRate(0.1, "cosine", 5, 10), 0.05, 1e-12);
  EXPECT_NEAR(LearningRate(0.1, "cosine", 9, 10), 0.1 * 0.5 * (1 + std::cos(M_PI * 0.9)), 1e-12);
}

}  // namespace
}  // namespace tandem::examples
