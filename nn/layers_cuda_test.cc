// Every layer on cuda:0 against the same layer on cpu:0: outputs, input and parameter
// gradients, BatchNorm's running statistics, Dropout's masks. Skips without a CUDA device.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "nn/layers.h"
#include "nn/layers_test_util.h"

namespace tandem::nn {
namespace {

using testing::DistinctValues;
using testing::ErrorOf;
using ::testing::HasSubstr;
using testing::LayersTest;
using testing::MaxAbsDiff;

// ---- CUDA against the CPU --------------------------------------------------------------

// Runs `layer` on cpu:0 and a clone on cuda:0 with the same input and output gradient, and
// compares outputs, input gradients and parameter gradients.
void ExpectCudaMatchesCpu(Module& layer, const Tensor& input) {
  std::shared_ptr<Module> gpu = layer.clone(Device::Cuda(0));
  Tensor x_cpu = input.detach().clone();
  x_cpu.set_requires_grad(true);
  Tensor x_gpu = input.to(Device::Cuda(0));
  x_gpu.set_requires_grad(true);
  Tensor y_cpu = layer.forward_tensors({x_cpu})[0];
  Tensor y_gpu = gpu->forward_tensors({x_gpu})[0];
  EXPECT_EQ(y_gpu.device(), Device::Cuda(0));
  EXPECT_LT(MaxAbsDiff(y_cpu, y_gpu), 1e-4);
  Tensor upstream = randn(y_cpu.shape());
  y_cpu.backward(upstream);
  y_gpu.backward(upstream.to(Device::Cuda(0)));
  EXPECT_LT(MaxAbsDiff(x_cpu.grad(), x_gpu.grad()), 1e-4);
  const std::vector<NamedTensor> cpu_params = layer.named_parameters();
  const std::vector<NamedTensor> gpu_params = gpu->named_parameters();
  for (size_t i = 0; i < cpu_params.size(); ++i) {
    SCOPED_TRACE(cpu_params[i].name);
    EXPECT_LT(MaxAbsDiff(cpu_params[i].value.grad(), gpu_params[i].value.grad()), 1e-3);
  }
}

TEST_F(LayersTest, CudaMatchesCpu) {
  TANDEM_SKIP_WITHOUT_CUDA();
  Linear linear(64, 32);
  ExpectCudaMatchesCpu(linear, randn({16, 64}));
  ReLU relu;
  ExpectCudaMatchesCpu(relu, randn({16, 64}));
  Flatten flatten;
  ExpectCudaMatchesCpu(flatten, randn({4, 3, 5, 5}));
  Conv2d conv(3, 8, 3, /*stride=*/2, /*padding=*/1);
  ExpectCudaMatchesCpu(conv, randn({4, 3, 12, 12}));
  MaxPool2d pool(2);
  ExpectCudaMatchesCpu(pool, DistinctValues({4, 3, 8, 8}));
  MaxPool2d ceil_pool(3, 2, 1, /*ceil_mode=*/true);
  ExpectCudaMatchesCpu(ceil_pool, DistinctValues({4, 3, 8, 9}));
  Conv2d grouped(Conv2dOptions(4, 6, 3).stride(2).padding(2).dilation(2).groups(2));
  ExpectCudaMatchesCpu(grouped, randn({3, 4, 11, 10}));
  Conv2d depthwise(Conv2dOptions(8, 8, 3).padding(1).groups(8));
  ExpectCudaMatchesCpu(depthwise, randn({2, 8, 9, 9}));
  Conv2d wide(Conv2dOptions(16, 12, 3).padding(1).groups(2));  // the batched-GEMM layout
  ExpectCudaMatchesCpu(wide, randn({3, 16, 9, 8}));
  for (bool count_include_pad : {true, false}) {
    AvgPool2d avg(3, 2, 1, /*ceil_mode=*/true, count_include_pad);
    ExpectCudaMatchesCpu(avg, randn({4, 3, 8, 9}));
  }
  for (Size2 size : {Size2(1), Size2(3, 4), Size2(9, 11)}) {
    AdaptiveAvgPool2d adaptive(size);
    ExpectCudaMatchesCpu(adaptive, randn({2, 3, 7, 10}));
  }
  for (const char* kind : {"none", "tanh"}) {
    GELU gelu(kind);
    ExpectCudaMatchesCpu(gelu, randn({16, 33}));
  }
  Tanh tanh_layer;
  ExpectCudaMatchesCpu(tanh_layer, randn({16, 33}));
  Sigmoid sigmoid_layer;
  ExpectCudaMatchesCpu(sigmoid_layer, randn({16, 33}));
  LayerNorm norm({5, 6});
  ExpectCudaMatchesCpu(norm, randn({4, 5, 6}));
  RMSNorm rms({6});
  ExpectCudaMatchesCpu(rms, randn({4, 5, 6}));
  {  // Embedding: same rows and weight gradients (the indices are not differentiable).
    Embedding embed(20, 7, /*padding_idx=*/3);
    std::shared_ptr<Module> gpu_embed = embed.clone(Device::Cuda(0));
    Tensor ids = from_vector(std::vector<int64_t>{3, 5, 19, 5, 0, 3}, {2, 3});
    Tensor y_cpu = embed.forward(ids);
    Tensor y_gpu = gpu_embed->forward_tensors({ids.to(Device::Cuda(0))})[0];
    EXPECT_LT(MaxAbsDiff(y_cpu, y_gpu), 1e-6);
    Tensor upstream = randn(y_cpu.shape());
    y_cpu.backward(upstream);
    y_gpu.backward(upstream.to(Device::Cuda(0)));
    EXPECT_LT(MaxAbsDiff(embed.weight().grad(), gpu_embed->parameter("weight").grad()), 1e-5);
    // On the GPU the kernel finds the bad index; the next host read raises it (Note
    // [Device-side index checks], tensor/cuda/kernels.h).
    EXPECT_THAT(
        ErrorOf([&] {
          gpu_embed
              ->forward_tensors({from_vector(std::vector<int64_t>{20}, {1}).to(Device::Cuda(0))})[0]
              .to(Device::Cpu());
        }),
        HasSubstr("index_select: index 20 is out of range; indices must be in [0, 20)"));
  }
  for (int64_t stride : {1, 3}) {  // max_norm's row copies and its pass over the table
    SCOPED_TRACE(stride);
    Embedding embed(
        EmbeddingOptions(80, 4).padding_idx(0).max_norm(1.5).norm_type(3.0).scale_grad_by_freq(
            true));
    std::shared_ptr<Module> gpu_embed = embed.clone(Device::Cuda(0));
    std::vector<int64_t> values;
    for (int64_t i = 0; i < 24; ++i) values.push_back(i * stride % 80);
    values.push_back(stride);  // a repeat
    Tensor ids = from_vector(values, {5, 5});
    Tensor y_cpu = embed.forward(ids);
    Tensor y_gpu = gpu_embed->forward_tensors({ids.to(Device::Cuda(0))})[0];
    EXPECT_LT(MaxAbsDiff(y_cpu, y_gpu), 1e-5);
    EXPECT_LT(MaxAbsDiff(embed.weight(), gpu_embed->parameter("weight")), 1e-5);
    Tensor upstream = randn(y_cpu.shape());
    y_cpu.backward(upstream);
    y_gpu.backward(upstream.to(Device::Cuda(0)));
    EXPECT_LT(MaxAbsDiff(embed.weight().grad(), gpu_embed->parameter("weight").grad()), 1e-5);
  }
  // Dropout draws the same counter-based numbers on every device.
  BatchNorm1d bn1(64);
  ExpectCudaMatchesCpu(bn1, randn({16, 64, 3}));
  BatchNorm2d bn2(3);
  ExpectCudaMatchesCpu(bn2, randn({4, 3, 5, 5}));
  {  // Running statistics are updated alike.
    std::shared_ptr<Module> gpu_bn = bn2.clone(Device::Cuda(0));
    Tensor images = randn({4, 3, 5, 5});
    bn2.forward(images);
    gpu_bn->forward_tensors({images.to(Device::Cuda(0))});
    for (const char* name : {"running_mean", "running_var"}) {
      EXPECT_LT(MaxAbsDiff(bn2.buffer(name), gpu_bn->buffer(name)), 1e-5) << name;
    }
    EXPECT_EQ(gpu_bn->buffer("num_batches_tracked").item<int64_t>(), 2);
  }
  // Dropout draws the same counter-based numbers on cpu:0 and cuda:0 (same device index).
  Dropout dropout(0.5, 11);
  std::shared_ptr<Module> gpu = dropout.clone(Device::Cuda(0));
  Tensor x = randn({32, 32});
  dropout.manual_seed(11);
  Tensor on_cpu = dropout.forward(x);
  dropout.manual_seed(11);
  Tensor on_gpu = gpu->forward_tensors({x.to(Device::Cuda(0))})[0];
  EXPECT_LT(MaxAbsDiff(on_cpu, on_gpu), 1e-6);
  manual_seed(3);
  Tensor default_cpu = Dropout(0.5).forward(x);
  Tensor default_gpu = Dropout(0.5).forward(x.to(Device::Cuda(0)));
  EXPECT_LT(MaxAbsDiff(default_cpu, default_gpu), 1e-6);
}

}  // namespace
}  // namespace tandem::nn
