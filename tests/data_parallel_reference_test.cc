// The examples of PyTorch's torch.nn.DataParallel reference page, in C++: a Linear(10, 5)
// over an 8x10 input gives 8x5 (the module's own output), and a module with two inputs,
// fc(x) + y, scatters both.
#include <memory>
#include <sstream>
#include <vector>

#include "gtest/gtest.h"
#include "nn/nn.h"
#include "parallel/data_parallel.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace tandem {
namespace {

// The reference page's two-input model: fc(x) + y.
class TwoInputs : public nn::Cloneable<TwoInputs> {
 public:
  TwoInputs() { reset(); }
  void reset() override { fc_ = register_module("fc", nn::Linear(10, 5)); }
  Tensor forward(const Tensor& x, const Tensor& y) { return fc_->forward(x) + y; }

 private:
  std::shared_ptr<nn::Linear> fc_;
};

class DataParallelReferenceTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { SetCpuDeviceCount(8); }
};

// net = torch.nn.DataParallel(model, device_ids=[0, 1, 2]); output = net(input_var)
TEST_P(DataParallelReferenceTest, LinearOverAnEightByTenInputGivesEightByFive) {
  manual_seed(1);
  auto model = std::make_shared<nn::Linear>(10, 5);
  parallel::DataParallel net(model, CpuDevices(GetParam()));
  const Tensor input = randn({8, 10});
  const Tensor output = net.forward(input);
  EXPECT_EQ(output.shape(), (Shape{8, 5}));
  EXPECT_EQ(output.device(), Device::Cpu(0));
  EXPECT_LE(testing::MaxAbsDiff(output, model->forward(input)), 1e-6);
}

TEST_P(DataParallelReferenceTest, TwoInputModuleScattersBoth) {
  manual_seed(2);
  auto model = std::make_shared<TwoInputs>();
  parallel::DataParallel net(model, CpuDevices(GetParam()));
  const Tensor x = randn({8, 10});
  const Tensor y = randn({8, 5});
  const Tensor output = net.forward(x, y);
  EXPECT_EQ(output.shape(), (Shape{8, 5}));
  EXPECT_LE(testing::MaxAbsDiff(output, model->forward(x, y)), 1e-6);
  // Gradients reach the original module as if it had run alone.
  output.sum().backward();
  const Tensor grad = model->parameter("fc.weight").grad();
  ASSERT_TRUE(grad.defined());
  model->zero_grad();
  model->forward(x, y).sum().backward();
  EXPECT_LE(testing::MaxAbsDiff(grad, model->parameter("fc.weight").grad()), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Devices, DataParallelReferenceTest, ::testing::Values(1, 2, 3, 8),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::to_string(info.param) + "Devices";
                         });

TEST(DataParallelReferenceDefaultsTest, DefaultDevicesAndPyTorchsPrintedForm) {
  SetCpuDeviceCount(3);
  auto model = std::make_shared<nn::Linear>(10, 5);
  parallel::DataParallel net(model);  // every device: here the three logical CPU devices
  EXPECT_EQ(net.device_ids(), CpuDevices(3));
  EXPECT_EQ(net.forward(randn({8, 10})).shape(), (Shape{8, 5}));
  EXPECT_EQ(net.last_chunk_sizes(), (std::vector<int64_t>{3, 3, 2}));
  std::ostringstream printed;
  printed << net;
  EXPECT_EQ(printed.str(),
            "DataParallel(\n"
            "  (module): Linear(in_features=10, out_features=5, bias=True)\n"
            ")");
}

}  // namespace
}  // namespace tandem
