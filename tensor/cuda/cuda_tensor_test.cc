// Tensor-level tests on CUDA: ops and autograd on cuda:0, and graphs that cross
// cpu:0 -> cuda:0 -> cpu:0, must give the CPU's outputs and gradients. Skips (with the
// reason) where there is no usable GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tensor/cuda/cuda.h"
#include "tensor/gradcheck.h"
#include "tensor/runtime/allocator.h"
#include "tensor/runtime/devices.h"
#include "tensor/tensor.h"

namespace tandem {
namespace {

constexpr Device kCpu = Device::Cpu(0);
constexpr Device kCuda = Device::Cuda(0);

class CudaTensorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (DeviceCount(DeviceType::kCUDA) == 0) {
      GTEST_SKIP() << "no usable CUDA device: " << cuda::UnavailableReason();
    }
  }
};

// `actual` (any device) is close to `expected` (any device), elementwise.
void ExpectClose(const Tensor& expected, const Tensor& actual, double rtol, double atol,
                 const std::string& what) {
  ASSERT_TRUE(expected.defined()) << what;
  ASSERT_TRUE(actual.defined()) << what;
  ASSERT_EQ(expected.shape(), actual.shape()) << what;
  EXPECT_TRUE(allclose(actual.to(kCpu), expected.to(kCpu), rtol, atol))
      << what << "\nexpected " << expected.to(kCpu) << "\nactual " << actual.to(kCpu);
}

// A leaf copy of `t` on `device` that requires grad.
Tensor Leaf(const Tensor& t, Device device) {
  return t.detach().to(device).set_requires_grad(true);
}

// How close a network's loss and gradients on cuda:0 must be to the CPU's, per dtype.
template <typename T>
struct NetTolerance;

template <>
struct NetTolerance<float> {
  static constexpr DType kDType = kFloat32;
  static constexpr double kLossRtol = 1e-5, kLossAtol = 1e-6, kGradRtol = 1e-4, kGradAtol = 1e-6;
};

template <>
struct NetTolerance<double> {
  static constexpr DType kDType = kFloat64;
  // Both devices compute in double: only the order of sums (GEMM, reductions) differs.
  static constexpr double kLossRtol = 1e-10, kLossAtol = 1e-10, kGradRtol = 1e-10,
                          kGradAtol = 1e-10;
};

// The loss and the parameter gradients of `forward` (inputs on the run's device, parameters)
// on cuda:0 against the CPU, in T. The parameters are drawn in float32 and widened for
// float64, so that both runs start from the same numbers.
template <typename T>
void ExpectNetMatchesTheCpu(
    const std::vector<Tensor>& float_params, const Tensor& inputs, const Tensor& targets,
    const std::function<Tensor(const Tensor&, const std::vector<Tensor>&)>& forward) {
  using Tolerance = NetTolerance<T>;
  const DType dtype = Tolerance::kDType;
  const std::string prefix = std::string(DTypeName(dtype)) + " ";
  std::vector<Tensor> grads[2];
  Tensor losses[2];
  for (int run = 0; run < 2; ++run) {
    const Device device = run == 0 ? kCpu : kCuda;
    std::vector<Tensor> params;
    for (const Tensor& p : float_params) params.push_back(Leaf(p.to(dtype), device));
    losses[run] = cross_entropy(forward(inputs.to(dtype).to(device), params), targets.to(device));
    EXPECT_EQ(losses[run].dtype(), dtype);
    EXPECT_EQ(losses[run].device(), device);
    losses[run].backward();
    for (const Tensor& p : params) grads[run].push_back(p.grad());
  }
  ExpectClose(losses[0], losses[1], Tolerance::kLossRtol, Tolerance::kLossAtol, prefix + "loss");
  for (size_t i = 0; i < grads[0].size(); ++i) {
    EXPECT_EQ(grads[1][i].device(), kCuda);
    EXPECT_EQ(grads[1][i].dtype(), dtype);
    ExpectClose(grads[0][i], grads[1][i], Tolerance::kGradRtol, Tolerance::kGradAtol,
                prefix + "gradient " + std::to_string(i));
  }
}

// A two-layer MLP from `seed`, every row of the batch labelled `target`; `activation` maps
// the first layer's output to the second's input.
template <typename T>
void ExpectMlpMatchesTheCpu(uint64_t seed, int64_t target,
                            const std::function<Tensor(const Tensor&)>& activation) {
  Generator gen(seed);
  const Tensor x = randn({37, 20}, {}, &gen);
  const Tensor targets = from_vector(std::vector<int64_t>(37, target), {37}, kInt64);
  const Tensor w1 = randn({16, 20}, {}, &gen) * 0.3, b1 = randn({16}, {}, &gen) * 0.1;
  const Tensor w2 = randn({5, 16}, {}, &gen) * 0.3, b2 = randn({5}, {}, &gen) * 0.1;
  ExpectNetMatchesTheCpu<T>({w1, b1, w2, b2}, x, targets,
                            [&](const Tensor& in, const std::vector<Tensor>& p) {
                              const Tensor hidden = activation(linear(in, p[0], p[1]));
                              return linear(hidden, p[2], p[3]);
                            });
}

TEST_F(CudaTensorTest, MlpForwardAndBackwardMatchTheCpu) {
  ExpectMlpMatchesTheCpu<float>(11, 3, [](const Tensor& h) { return relu(h); });
  ExpectMlpMatchesTheCpu<double>(17, 2, [](const Tensor& h) {
    const Tensor t = tanh(h);
    return relu(t) + sigmoid(t);
  });
}

// A convolution, ReLU and `pool` (to `features` values per image), then a linear layer, on
// three 2x12x12 images from `seed`.
template <typename T>
void ExpectConvNetMatchesTheCpu(uint64_t seed, const std::vector<int64_t>& labels, int64_t features,
                                const std::function<Tensor(const Tensor&)>& pool) {
  Generator gen(seed);
  const Tensor images = randn({3, 2, 12, 12}, {}, &gen);
  const Tensor targets = from_vector(labels, {3}, kInt64);
  const Tensor conv_w = randn({4, 2, 3, 3}, {}, &gen) * 0.3, conv_b = randn({4}, {}, &gen) * 0.1;
  const Tensor fc_w = randn({5, features}, {}, &gen) * 0.1, fc_b = randn({5}, {}, &gen) * 0.1;
  ExpectNetMatchesTheCpu<T>({conv_w, conv_b, fc_w, fc_b}, images, targets,
                            [&](const Tensor& in, const std::vector<Tensor>& p) {
                              const Tensor conv = relu(conv2d(in, p[0], p[1], {1, 1}, {1, 1}));
                              return linear(pool(conv).flatten(1), p[2], p[3]);
                            });
}

TEST_F(CudaTensorTest, ConvNetForwardAndBackwardMatchTheCpu) {
  ExpectConvNetMatchesTheCpu<float>(5, {0, 4, 2}, 4 * 6 * 6, [](const Tensor& conv) {
    return max_pool2d(conv, {2, 2});
  });
  ExpectConvNetMatchesTheCpu<double>(23, {1, 4, 0}, 4 * 3 * 3, [](const Tensor& conv) {
    return adaptive_avg_pool2d(max_pool2d(conv, {2, 2}), {3, 3});
  });
}

TEST_F(CudaTensorTest, GradientsFlowBackAcrossDevices) {
  // cpu:0 -> cuda:0 -> cpu:0: the gradient of the CPU leaf goes through both copies.
  Generator gen(3);
  const Tensor values = randn({6, 7}, {}, &gen);
  const Tensor weights = randn({7, 4}, {}, &gen);

  const Tensor x_cpu = Leaf(values, kCpu);
  const Tensor reference = sum(tanh(matmul(x_cpu, weights)) * 2.0);
  reference.backward();

  const Tensor x = Leaf(values, kCpu);
  const Tensor on_gpu = tanh(matmul(x.to(kCuda), weights.to(kCuda)));
  const Tensor back = on_gpu.to(kCpu) * 2.0;
  EXPECT_EQ(back.device(), kCpu);
  const Tensor loss = sum(back);
  loss.backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_EQ(x.grad().device(), kCpu);
  ExpectClose(reference, loss, 1e-5, 1e-6, "loss");
  ExpectClose(x_cpu.grad(), x.grad(), 1e-5, 1e-6, "gradient of the cpu leaf");
}

TEST_F(CudaTensorTest, FiniteDifferenceGradientsOnCuda) {
  Generator gen(8);
  const Tensor a = Leaf(randn({3, 5}, {}, &gen), kCuda);
  const Tensor b = Leaf(randn({5, 4}, {}, &gen), kCuda);
  EXPECT_GRADIENTS_MATCH([](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); },
                         {a, b});
  EXPECT_GRADIENTS_MATCH([](const std::vector<Tensor>& in) { return log_softmax(in[0], 1); }, {a});
  EXPECT_GRADIENTS_MATCH(
      [](const std::vector<Tensor>& in) { return sigmoid(in[0]) * exp(in[0] * 0.5); }, {a});
}

TEST_F(CudaTensorTest, SeededRandomNumbersAreTheSameOnEveryDevice) {
  Generator cpu_gen(1234), gpu_gen(1234);
  const Tensor on_cpu = rand({1001}, kCpu, &cpu_gen);
  const Tensor on_gpu = rand({1001}, kCuda, &gpu_gen);
  EXPECT_EQ(on_gpu.device(), kCuda);
  EXPECT_EQ(on_cpu.to_vector<float>(), on_gpu.to_vector<float>());  // bitwise
  const Tensor normal_cpu = randn({999}, kCpu, &cpu_gen);
  const Tensor normal_gpu = randn({999}, kCuda, &gpu_gen);
  ExpectClose(normal_cpu, normal_gpu, 1e-5, 1e-6, "normal");
}

TEST_F(CudaTensorTest, PinnedTensorsCopyToTheDevice) {
  const Tensor host = arange(100000).to(kFloat32).pin_memory();
  EXPECT_TRUE(host.is_pinned());
  const Tensor device = host.to(kCuda);
  EXPECT_EQ(device.to_vector<float>(), host.to_vector<float>());
}

TEST_F(CudaTensorTest, ReductionsAndArgmaxOnCuda) {
  Generator gen(2);
  const Tensor x = randn({8, 300, 5}, {}, &gen);
  const Tensor y = x.to(kCuda);
  for (int64_t dim : {0, 1, 2}) {
    ExpectClose(sum(x, {dim}), sum(y, {dim}), 1e-5, 1e-5, "sum over " + std::to_string(dim));
    ExpectClose(amax(x, dim), amax(y, dim), 0.0, 0.0, "amax over " + std::to_string(dim));
    EXPECT_EQ(argmax(x, dim).to_vector<int64_t>(), argmax(y, dim).to_vector<int64_t>());
  }
  ExpectClose(mean(x), mean(y), 1e-5, 1e-6, "mean");
}

TEST_F(CudaTensorTest, MemoryStatisticsFollowTensors) {
  const int64_t before = GetMemoryStats(kCuda).in_use_bytes;
  {
    const Tensor big = zeros({1024, 1024}, kCuda);
    EXPECT_EQ(GetMemoryStats(kCuda).in_use_bytes, before + 4 * 1024 * 1024);
  }
  EXPECT_EQ(GetMemoryStats(kCuda).in_use_bytes, before);
}

// ---- float64 ------------------------------------------------------------------------------------

TEST_F(CudaTensorTest, Float64RandomNumbersAreTheFloat32OnesWidened) {
  Generator float_gen(99), double_gen(99);
  const Tensor narrow = rand({1001}, kCuda, &float_gen);
  const Tensor wide = rand({1001}, TensorOptions(kFloat64).device(kCuda), &double_gen);
  EXPECT_EQ(wide.dtype(), kFloat64);
  EXPECT_EQ(narrow.to(kFloat64).to_vector<double>(), wide.to_vector<double>());  // bitwise
}

}  // namespace
}  // namespace tandem
