#include "nn/sequential.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "nn/layers.h"
#include "nn/loss.h"
#include "nn/test_util.h"
#include "tensor/gradcheck.h"
#include "tensor/runtime/devices.h"

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
  mlp.to(kFloat64);  // a float64 gradient check
  const std::vector<NamedTensor> params = mlp.named_parameters();
  std::vector<Tensor> inputs = {randn({5, 3}, kFloat64)};
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

// ---- ModuleList ----------------------------------------------------------------------------

// A residual tower that keeps its blocks in a ModuleList.
class Tower : public Cloneable<Tower> {
 public:
  explicit Tower(int64_t depth) : depth_(depth) { reset(); }
  void reset() override {
    blocks_ = register_module("blocks", ModuleList());
    for (int64_t i = 0; i < depth_; ++i) blocks_->push_back(Linear(4, 4));
  }
  Tensor forward(Tensor x) {
    for (const std::shared_ptr<Module>& block : *blocks_) x = x + block->forward_tensors({x})[0];
    return x;
  }
  const ModuleList& blocks() const { return *blocks_; }

 private:
  int64_t depth_;
  std::shared_ptr<ModuleList> blocks_;
};

TEST_F(SequentialTest, ModuleListHoldsNamedChildren) {
  auto shared = std::make_shared<Linear>(3, 2);
  ModuleList list(Linear(4, 3), ReLU(), shared);
  ASSERT_EQ(list.size(), 3u);
  EXPECT_FALSE(list.empty());
  EXPECT_EQ(list[2], shared);  // shared, not copied
  EXPECT_EQ(list.at<ReLU>(1)->name(), "ReLU");
  EXPECT_THAT(ErrorOf([&] { list.at<Linear>(1); }),
              HasSubstr("ModuleList: module (1) is a ReLU, not the type asked for"));
  EXPECT_THAT(ErrorOf([&] { list[3]; }),
              HasSubstr("ModuleList: index 3 is out of range for 3 modules"));
  // Iteration visits them in order; the children are named by position.
  std::vector<std::string> names;
  for (const std::shared_ptr<Module>& module : list) names.push_back(module->name());
  EXPECT_EQ(names, (std::vector<std::string>{"Linear", "ReLU", "Linear"}));
  ASSERT_EQ(list.named_children().size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(list.named_children()[i].name, std::to_string(i));
    EXPECT_EQ(list.named_children()[i].module, list[i]);
  }
  EXPECT_EQ(list.ToString(),
            "ModuleList(\n"
            "  (0): Linear(in_features=4, out_features=3, bias=True)\n"
            "  (1): ReLU()\n"
            "  (2): Linear(in_features=3, out_features=2, bias=True)\n"
            ")");
  ModuleList empty;
  EXPECT_TRUE(empty.empty());
  EXPECT_THAT(ErrorOf([&] { empty.push_back(std::shared_ptr<Module>()); }),
              HasSubstr("ModuleList: cannot append a null module (position 0)"));
  // No forward: it says so.
  EXPECT_THAT(ErrorOf([&] { list.forward_tensors({zeros({1, 4})}); }), HasSubstr("ModuleList"));
}

TEST_F(SequentialTest, ModuleListStateDictCloneAndToSeeItsModules) {
  Tower tower(3);
  std::vector<std::string> names;
  for (const NamedTensor& entry : tower.state_dict()) names.push_back(entry.name);
  EXPECT_EQ(names, (std::vector<std::string>{"blocks.0.weight", "blocks.0.bias", "blocks.1.weight",
                                             "blocks.1.bias", "blocks.2.weight", "blocks.2.bias"}));
  EXPECT_EQ(tower.parameters().size(), 6u);
  // A clone on another device computes the same function with its own tensors.
  std::shared_ptr<Module> copy = tower.clone(Device::Cpu(1));
  for (const Tensor& p : copy->parameters()) EXPECT_EQ(p.device(), Device::Cpu(1));
  Tensor x = randn({5, 4});
  Tensor expected = tower.forward(x);
  EXPECT_TRUE(allclose(copy->forward_tensors({x.to(Device::Cpu(1))})[0].to(Device::Cpu(0)),
                       expected, 1e-6, 1e-6));
  auto typed = std::dynamic_pointer_cast<Tower>(copy);
  ASSERT_NE(typed, nullptr);
  EXPECT_EQ(typed->blocks().size(), 3u);
  EXPECT_NE(typed->blocks()[0], tower.blocks()[0]);
  // A ModuleList cloned by itself copies its modules too.
  ModuleList list(Linear(2, 2), Linear(2, 2));
  std::shared_ptr<Module> list_copy = list.clone();
  auto typed_list = std::dynamic_pointer_cast<ModuleList>(list_copy);
  ASSERT_NE(typed_list, nullptr);
  ASSERT_EQ(typed_list->size(), 2u);
  EXPECT_NE(typed_list->at<Linear>(0), list.at<Linear>(0));
  EXPECT_TRUE(
      allclose(typed_list->at<Linear>(1)->weight(), list.at<Linear>(1)->weight(), 0.0, 0.0));
  // to() moves every module; load_state_dict reaches them by name.
  tower.to(Device::Cpu(1));
  for (const Tensor& p : tower.parameters()) EXPECT_EQ(p.device(), Device::Cpu(1));
  Tower other(3);
  other.load_state_dict(tower.state_dict());
  EXPECT_TRUE(allclose(other.forward(x), expected, 1e-6, 1e-6));
  // Gradients flow through the listed modules.
  Tensor input = randn({2, 4});
  input.set_requires_grad(true);
  EXPECT_GRADIENTS_MATCH([&](const std::vector<Tensor>& in) { return other.forward(in[0]); },
                         {input});
}

}  // namespace
}  // namespace tandem::nn
