// Every op on another device against cpu:0: a second CPU device always, CUDA when there is a GPU
// (skipped otherwise), forward and backward.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "tensor/gradcheck.h"
#include "tensor/ops/ops_testing.h"
#include "tensor/runtime/devices.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace tandem {
namespace ops_testing {
namespace {

TEST_F(OpsTest, GradientsFlowAcrossDevices) {
  const Tensor w = Param64(Randn({3, 4}, 351));
  const Tensor x = Randn({2, 4}, 352).to(kFloat64).to(Device::Cpu(1));
  EXPECT_GRADIENTS_MATCH(
      [x](const Inputs& in) { return tanh(linear(x, in[0].to(Device::Cpu(1)), Tensor())); }, {w});
  const Tensor on_cpu1 = Param64(Randn({3, 4}, 353).to(Device::Cpu(1)));
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return log_softmax(in[0], 1); }, {on_cpu1});
}

// ---- Every op on CUDA against the CPU (skipped without a GPU) -------------------------------

struct DeviceCase {
  std::string name;
  Inputs inputs;  // on the CPU; float inputs get gradients
  std::function<Tensor(const Inputs&)> f;
};

// f's output and the gradients of sum(f * projection) with respect to the float inputs.
std::vector<Tensor> RunOn(const DeviceCase& c, Device device) {
  Inputs inputs;
  for (const Tensor& t : c.inputs) {
    Tensor moved = t.detach().to(device);
    if (moved.dtype() == kFloat32) moved.set_requires_grad(true);
    inputs.push_back(moved);
  }
  const Tensor y = c.f(inputs);
  EXPECT_EQ(y.device(), device);
  std::vector<Tensor> results = {y.to(Device::Cpu(0))};
  if (y.requires_grad()) {
    Generator gen(99);
    y.backward(randn(y.shape(), {}, &gen).to(device));
  }
  for (const Tensor& t : inputs) {
    if (t.dtype() == kFloat32) {
      results.push_back(t.grad().defined() ? t.grad().to(Device::Cpu(0)) : Tensor());
    }
  }
  return results;
}

std::vector<DeviceCase> DeviceCases() {
  const Tensor a = Randn({4, 5}, 401), b = Randn({5}, 402), col = Randn({4, 1}, 403);
  const Tensor positive = Uniform({4, 5}, 0.5, 2.0, 404);
  const Tensor nonzero = AwayFromZero({4, 5}, 405), distinct = Distinct({4, 5}, 406);
  const Tensor x3 = Randn({2, 3, 4}, 407);
  const Tensor labels = Labels({1, 0, 4, 2}, {4});
  const Tensor ints = Labels({3, -1, 4, 1, -5, 9}, {2, 3});
  const Tensor image = Randn({2, 3, 7, 6}, 408), kernel = Randn({4, 3, 3, 3}, 409);
  const Tensor conv_bias = Randn({4}, 410), pool_input = Distinct({2, 3, 7, 6}, 411);
  const Tensor w = Randn({3, 5}, 412), bias = Randn({3}, 413);
  std::vector<DeviceCase> cases = {
      {"add broadcast", {a, b}, [](const Inputs& in) { return add(in[0], in[1]); }},
      {"sub broadcast", {a, col}, [](const Inputs& in) { return sub(in[0], in[1]); }},
      {"mul broadcast", {col, b}, [](const Inputs& in) { return mul(in[0], in[1]); }},
      {"div broadcast", {a, positive}, [](const Inputs& in) { return div(in[0], in[1]); }},
      {"maximum", {distinct, b}, [](const Inputs& in) { return maximum(in[0], in[1]); }},
      {"minimum", {distinct, col}, [](const Inputs& in) { return minimum(in[0], in[1]); }},
      {"scalars", {a}, [](const Inputs& in) { return 2.0 - in[0] * 3.0 + 1.0 / 4.0; }},
      {"pow", {positive}, [](const Inputs& in) { return pow(in[0], 2.5); }},
      {"neg exp", {a}, [](const Inputs& in) { return exp(neg(in[0])); }},
      {"log sqrt", {positive}, [](const Inputs& in) { return log(in[0]) + sqrt(in[0]); }},
      {"abs relu", {nonzero}, [](const Inputs& in) { return abs(in[0]) * relu(in[0]); }},
      {"tanh sigmoid square",
       {a},
       [](const Inputs& in) { return tanh(in[0]) + sigmoid(in[0]) * square(in[0]); }},
      {"comparisons",
       {a, b},
       [](const Inputs& in) {
         return eq(in[0], in[0]) + ne(in[0], in[1]) * 2.0 + lt(in[0], in[1]) * 4.0 +
                le(in[0], in[1]) * 8.0 + gt(in[0], in[1]) * 16.0 + ge(in[0], in[1]) * 32.0;
       }},
      {"sum mean",
       {x3},
       [](const Inputs& in) {
         return sum(in[0], {0, 2}) + mean(in[0], {1}).sum();
       }},
      {"sum keepdim", {x3}, [](const Inputs& in) { return sum(in[0], {-1}, true) * mean(in[0]); }},
      {"sum strided", {x3}, [](const Inputs& in) { return sum(in[0].transpose(0, 2), {1}); }},
      {"amax", {distinct}, [](const Inputs& in) { return amax(in[0], 0) + amax(in[0], 1).sum(); }},
      {"argmax argmin",
       {a},
       [](const Inputs& in) {
         return (argmax(in[0], 1, true) + argmin(in[0], 0, true)).to(kFloat32);
       }},
      {"sum_to",
       {x3},
       [](const Inputs& in) {
         return sum_to(in[0], {3, 1});
       }},
      {"softmax", {x3}, [](const Inputs& in) { return softmax(in[0], 1); }},
      {"log_softmax", {x3}, [](const Inputs& in) { return log_softmax(in[0], -1); }},
      {"matmul 2d", {a, Randn({5, 3}, 414)}, [](const Inputs& in) { return matmul(in[0], in[1]); }},
      {"matmul transposed",
       {Randn({5, 4}, 415), Randn({3, 5}, 416)},
       [](const Inputs& in) { return matmul(in[0].t(), in[1].t()); }},
      {"matmul narrowed",
       {Randn({4, 9}, 417), Randn({5, 3}, 418)},
       [](const Inputs& in) { return matmul(in[0].narrow(1, 2, 5), in[1]); }},
      {"matmul batched",
       {x3, Randn({2, 4, 3}, 419)},
       [](const Inputs& in) { return matmul(in[0], in[1]); }},
      {"matmul 3d x 2d",
       {x3, Randn({4, 3}, 420)},
       [](const Inputs& in) { return matmul(in[0], in[1]); }},
      {"matmul 2d x 3d",
       {Randn({3, 3}, 421), x3},
       [](const Inputs& in) { return matmul(in[0], in[1]); }},
      {"matmul permuted",
       {Randn({4, 2, 3}, 422), Randn({2, 5, 4}, 423)},
       [](const Inputs& in) {
         return matmul(in[0].permute({1, 2, 0}), in[1].transpose(1, 2));
       }},
      {"matmul vectors",
       {b, Randn({5}, 424)},
       [](const Inputs& in) { return matmul(in[0], in[1]); }},
      {"linear", {a, w, bias}, [](const Inputs& in) { return linear(in[0], in[1], in[2]); }},
      {"add_layer_norm",
       {x3, Randn({2, 3, 4}, 441), Randn({4}, 442), Randn({4}, 443)},
       [](const Inputs& in) {
         const auto [sum, y] = add_layer_norm(in[0], in[1], {4}, in[2], in[3], 1e-5);
         return sum * 0.5 + y;
       }},
      {"split_heads",
       {Randn({2, 3, 12}, 440)},
       [](const Inputs& in) { return stack(split_heads(in[0], 3, 2)); }},
      {"linear 3d no bias",
       {Randn({2, 3, 5}, 425), w},
       [](const Inputs& in) { return linear(in[0], in[1], Tensor()); }},
      {"nll_loss", {a, labels}, [](const Inputs& in) { return nll_loss(in[0], in[1]); }},
      {"cross_entropy", {a, labels}, [](const Inputs& in) { return cross_entropy(in[0], in[1]); }},
      {"cross_entropy huge",
       {mul(a, 1000.0), labels},
       [](const Inputs& in) { return cross_entropy(in[0], in[1]); }},
      {"mse_loss", {a, positive}, [](const Inputs& in) { return mse_loss(in[0], in[1]); }},
      {"conv2d",
       {image, kernel, conv_bias},
       [](const Inputs& in) { return conv2d(in[0], in[1], in[2]); }},
      {"conv2d stride padding",
       {image, kernel},
       [](const Inputs& in) {
         return conv2d(in[0], in[1], Tensor(), {2, 1}, {1, 2});
       }},
      {"max_pool2d",
       {pool_input},
       [](const Inputs& in) {
         return max_pool2d(in[0], {2, 2});
       }},
      {"max_pool2d padding stride",
       {pool_input},
       [](const Inputs& in) {
         return max_pool2d(in[0], {3, 3}, {2, 1}, {1, 1});
       }},
      {"dropout",
       {a},
       [](const Inputs& in) {
         Generator gen(17);  // the same Philox stream on every device
         return dropout(in[0], 0.3, true, &gen);
       }},
      {"cat",
       {a, col, a},
       [](const Inputs& in) {
         return cat({in[0], in[1], in[2]}, 1);
       }},
      {"stack",
       {a, positive},
       [](const Inputs& in) {
         return stack({in[0], in[1]}, 1);
       }},
      {"int64",
       {ints},
       [](const Inputs& in) {
         const Tensor t = in[0];
         return cat({add(t, t), mul(t, 3.0), maximum(t, neg(t)), relu(t), abs(t), square(t),
                     sum(t, {0}, true), amax(t, 0, true)})
             .to(kFloat32);
       }},
  };
  return cases;
}

// Runs every case on cpu:0 and on `device`; outputs and gradients must agree and every
// result must come back from `device` (checked by RunOn's to()).
void ExpectEveryOpMatchesCpu0On(Device device) {
  for (const DeviceCase& c : DeviceCases()) {
    SCOPED_TRACE(c.name + " on " + device.ToString());
    const std::vector<Tensor> reference = RunOn(c, Device::Cpu(0));
    const std::vector<Tensor> other = RunOn(c, device);
    ASSERT_EQ(reference.size(), other.size());
    for (size_t i = 0; i < reference.size(); ++i) {
      ASSERT_EQ(reference[i].defined(), other[i].defined()) << "result " << i;
      if (!reference[i].defined()) continue;
      ASSERT_EQ(reference[i].shape(), other[i].shape()) << "result " << i;
      EXPECT_TRUE(allclose(other[i], reference[i], 1e-4, 1e-4))
          << "result " << i << " (0: output, then gradients)\ncpu:0 " << reference[i] << "\n"
          << device << " " << other[i];
    }
  }
}

TEST_F(OpsTest, EveryOpGivesTheSameResultsOnAnotherCpuDevice) {
  ExpectEveryOpMatchesCpu0On(Device::Cpu(1));
}

TEST(OpsOnCudaTest, EveryOpMatchesTheCpuForwardAndBackward) {
  if (DeviceCount(DeviceType::kCUDA) == 0) GTEST_SKIP() << "no CUDA device in this process";
  ExpectEveryOpMatchesCpu0On(Device::Cuda(0));
}

TEST(OpsOnCudaTest, FiniteDifferencesAndErrorsOnCuda) {
  if (DeviceCount(DeviceType::kCUDA) == 0) GTEST_SKIP() << "no CUDA device in this process";
  const Device cuda = Device::Cuda(0);
  const Tensor logits = Param(Randn({3, 4}, 431).to(cuda));
  const Tensor targets = Labels({0, 3, 1}, {3}, cuda);
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return cross_entropy(in[0], in[1]); },
                         {logits, targets});
  const Tensor x = Param(Randn({2, 2, 5, 5}, 432).to(cuda));
  const Tensor k = Param(Randn({3, 2, 3, 3}, 433).to(cuda));
  EXPECT_GRADIENTS_MATCH(
      [](const Inputs& in) {
        return conv2d(in[0], in[1], Tensor(), {1, 1}, {1, 1});
      },
      {x, k}, kLinearEps);
  // Targets on the GPU are validated there, by the kernel, and a bad one is raised at the next
  // host read (Note [Device-side index checks], tensor/cuda/kernels.h).
  EXPECT_THAT(ErrorOf([&] {
                cross_entropy(logits, Labels({0, 4, 1}, {3}, cuda)).item();
              }),
              HasSubstr("cross_entropy: index 4 is out of range; indices must be in [0, 4)"));
  EXPECT_THAT(ErrorOf([&] {
                add(logits, zeros({3, 4}));
              }),
              HasSubstr("add: a is on cuda:0 and b on cpu:0"));
}

}  // namespace
}  // namespace ops_testing
}  // namespace tandem
