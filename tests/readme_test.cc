// Keeps README.md's "A taste of the API" honest: the same code, compiled and run.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sstream>

#include "nn/nn.h"
#include "tensor/tensor.h"

namespace tandem {
namespace {

TEST(ReadmeTest, TasteOfTheApiRunsAndPrintsLikePyTorch) {
  auto model =
      std::make_shared<nn::Sequential>(nn::Linear(784, 256), nn::ReLU(), nn::Linear(256, 10));
  model->to(Device::Parse("cpu:0"));
  nn::SGD optimizer(model->parameters(), nn::SGDOptions(0.1).momentum(0.9));
  Tensor x = randn({64, 784});
  Tensor y = from_vector(std::vector<int64_t>(64, 3), {64});  // int64 class labels
  Tensor loss = cross_entropy(model->forward(x), y);
  optimizer.zero_grad();
  loss.backward();
  optimizer.step();

  // One step on a single repeated label must lower the loss on the same batch.
  EXPECT_LT(cross_entropy(model->forward(x), y).item(), loss.item());
  std::ostringstream printed;
  printed << *model;
  EXPECT_EQ(printed.str(),
            "Sequential(\n"
            "  (0): Linear(in_features=784, out_features=256, bias=True)\n"
            "  (1): ReLU()\n"
            "  (2): Linear(in_features=256, out_features=10, bias=True)\n"
            ")");
}

}  // namespace
}  // namespace tandem
