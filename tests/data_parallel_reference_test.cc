// The examples of PyTorch's torch.nn.DataParallel reference page, in C++: a Linear(10, 5)
// over an 8x10 input gives 8x5 (the module's own output), and a module with two inputs,
// fc(x) + y, scatters both. Also the assertions of PyTorch's
// test_data_parallel_buffers_requiring_grad and of libtorch's
// DataParallelPlacesTheOutputOnTheRequestedDevice, on logical CPU devices.
#include <memory>
#include <sstream>
#include <vector>

#include "gtest/gtest.h"
#include "nn/nn.h"
#include "parallel/data_parallel.h"
#include "tensor/gradcheck.h"
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

// PyTorch's TestModule of test_data_parallel_buffers_requiring_grad: x * t_rg + t_not_rg,
// with t_rg a buffer that requires grad.
class BuffersRequiringGrad : public nn::Cloneable<BuffersRequiringGrad> {
 public:
  explicit BuffersRequiringGrad(Tensor t) : t_(std::move(t)) { reset(); }
  void reset() override {
    t_rg_ = register_buffer("t_rg", t_);
    t_not_rg_ = register_buffer("t_not_rg", t_.detach().clone());
  }
  Tensor forward(const Tensor& x) { return x * *t_rg_ + *t_not_rg_; }

 private:
  Tensor t_;
  nn::Buffer t_rg_, t_not_rg_;
};

TEST(DataParallelReferenceBuffersTest, BuffersRequiringGradGetEveryReplicasGradient) {
  SetCpuDeviceCount(2);
  manual_seed(5);
  Tensor t = randn({100});
  t.set_requires_grad(true);
  auto m = std::make_shared<BuffersRequiringGrad>(t);
  ASSERT_TRUE(m->buffer("t_rg").requires_grad());  // self.assertTrue(m.t_rg.requires_grad)
  parallel::DataParallel dpm(m, CpuDevices(2));
  const Tensor inp = randn({2, 100});
  // gradcheck(fn, (m.t_rg,)) with fn(t) = dpm(inp): CheckGradients hands f a copy of t,
  // which becomes the buffer.
  EXPECT_GRADIENTS_MATCH(
      [&](const std::vector<Tensor>& in) {
        m->replace_buffer("t_rg", in[0]);
        return dpm.forward(inp);
      },
      {t});
  m->replace_buffer("t_rg", t);
  // The same in closed form: d sum(x * t_rg + t_not_rg) / d t_rg is the sum of x's rows,
  // one from each replica.
  dpm.forward(inp).sum().backward();
  ASSERT_TRUE(t.grad().defined());
  EXPECT_LE(testing::MaxAbsDiff(t.grad(), inp.sum({0})), 1e-5);
  EXPECT_FALSE(m->buffer("t_not_rg").requires_grad());
}

// libtorch's DataParallelPlacesTheOutputOnTheRequestedDevice, with data_parallel's
// devices and output_device as DataParallel's device_ids and output_device.
TEST(DataParallelReferenceOutputDeviceTest, PlacesTheOutputOnTheRequestedDevice) {
  SetCpuDeviceCount(2);
  auto m = std::make_shared<nn::Linear>(3, 5);
  const Tensor input = ones({10, 3});
  {
    parallel::DataParallel dp(m, CpuDevices(2), Device::Cpu(1));
    const Tensor output = dp.forward(input);
    ASSERT_TRUE(output.defined());
    EXPECT_EQ(output.device(), Device::Cpu(1));
    EXPECT_LE(testing::MaxAbsDiff(output, m->forward(input)), 1e-6);
  }
  {
    // The single-device case (where nothing is scattered or gathered).
    parallel::DataParallel dp(m, {Device::Cpu(0)}, Device::Cpu(1));
    const Tensor output = dp.forward(input);
    ASSERT_TRUE(output.defined());
    EXPECT_EQ(output.device(), Device::Cpu(1));
    EXPECT_LE(testing::MaxAbsDiff(output, m->forward(input)), 1e-6);
  }
}

}  // namespace
}  // namespace tandem
