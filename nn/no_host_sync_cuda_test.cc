// The pieces of a training step on cuda:0 run without the host waiting for the GPU
// (cuda::SetSyncDebugError makes any wait throw): out-of-range embedding indices and loss
// targets are reported at the next synchronization, naming the op, and the device stays
// usable; clip_grad_norm_'s device pair equals the CPU's. Skips without a CUDA device.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "nn/clip_grad.h"
#include "nn/layers.h"
#include "nn/test_util.h"
#include "tensor/cuda/cuda.h"

namespace tandem::nn {
namespace {

using testing::ErrorOf;
using ::testing::HasSubstr;
using testing::MaxAbsDiff;

const Device kGpu = Device::Cuda(0);

// Forbids host waits while in scope (and restores the default even when a check throws).
class NoHostSync {
 public:
  NoHostSync() { cuda::SetSyncDebugError(true); }
  ~NoHostSync() { cuda::SetSyncDebugError(false); }
};

Tensor Indices(const std::vector<int64_t>& values, Device device) {
  return from_vector(values, {static_cast<int64_t>(values.size())},
                     TensorOptions(kInt64).device(device));
}

TEST(NoHostSyncTest, TheDebugModeCatchesAHostRead) {
  TANDEM_SKIP_WITHOUT_CUDA();
  const Tensor x = ones({3}, TensorOptions().device(kGpu));
  NoHostSync guard;
  EXPECT_THAT(ErrorOf([&] { sum(x).item(); }), HasSubstr("would make the host wait for cuda:0"));
}

TEST(NoHostSyncTest, BadEmbeddingIndexIsRaisedAtTheNextSyncAndTheDeviceRecovers) {
  TANDEM_SKIP_WITHOUT_CUDA();
  Embedding cpu(EmbeddingOptions(10, 4));
  std::shared_ptr<Module> gpu = cpu.clone(kGpu);
  const Tensor bad = Indices({1, 12, 3}, kGpu);
  Tensor rows;
  {
    NoHostSync guard;  // the forward queues its gather without reading the indices
    rows = gpu->forward_tensors({bad})[0];
  }
  EXPECT_THAT(ErrorOf([&] { rows.to(Device::Cpu()); }),
              HasSubstr("index_select: index 12 is out of range; indices must be in [0, 10)"));
  // Raised once, then cleared: the next step on the device works and matches the CPU.
  const Tensor good = Indices({1, 9, 3}, kGpu);
  const Tensor out = gpu->forward_tensors({good})[0];
  EXPECT_EQ(MaxAbsDiff(out, cpu.forward(Indices({1, 9, 3}, Device::Cpu()))), 0.0);
  // The CPU still refuses at once, naming the element.
  EXPECT_THAT(ErrorOf([&] {
                cpu.forward(Indices({1, 12}, Device::Cpu()));
              }),
              HasSubstr("index 12 (element 1"));
}

TEST(NoHostSyncTest, BadCrossEntropyTargetIsRaisedAtSynchronize) {
  TANDEM_SKIP_WITHOUT_CUDA();
  Tensor logits = randn({3, 5}).to(kGpu);
  logits.set_requires_grad(true);
  const Tensor targets = Indices({0, 5, -1}, kGpu);
  {
    NoHostSync guard;  // forward and backward queue without reading the targets
    cross_entropy(logits, targets).backward();
  }
  const std::string error = ErrorOf([&] { cuda::Synchronize(0); });
  EXPECT_THAT(error, HasSubstr("cross_entropy: index "));
  EXPECT_THAT(error, HasSubstr("must be in [0, 5)"));
  cuda::Synchronize(0);  // cleared
  const Tensor ok = Indices({0, 4, 2}, kGpu);
  const double got = cross_entropy(logits.detach(), ok).item();
  const double want = cross_entropy(logits.detach().to(Device::Cpu()), ok.to(Device::Cpu())).item();
  EXPECT_NEAR(got, want, 1e-6);
  // The CPU still refuses at once.
  EXPECT_THAT(ErrorOf([&] {
                cross_entropy(randn({3, 5}), Indices({0, 5, 1}, Device::Cpu()));
              }),
              HasSubstr("targets must be class indices in [0, C) = [0, 5)"));
}

// Parameters with the gradients `grads` on `device`.
std::vector<Tensor> WithGradients(const std::vector<Tensor>& grads, Device device) {
  std::vector<Tensor> params;
  for (const Tensor& g : grads) {
    Tensor p = zeros(g.shape(), TensorOptions(g.dtype()).device(device));
    p.set_requires_grad(true);
    (p * g.to(device)).sum().backward();
    params.push_back(p);
  }
  return params;
}

TEST(NoHostSyncTest, ClipGradNormOnTheDeviceEqualsTheCpuWithoutAHostRead) {
  TANDEM_SKIP_WITHOUT_CUDA();
  const std::vector<Tensor> grads = {randn({7, 5}), randn({13}), randn({2, 3, 4})};
  const double inf = std::numeric_limits<double>::infinity();
  for (const double norm_type : {2.0, 1.0, 3.0, inf}) {
    for (const double max_norm : {0.5, 1e6}) {  // clipping, and a coefficient of 1
      SCOPED_TRACE(::testing::Message() << "norm_type " << norm_type << " max_norm " << max_norm);
      const std::vector<Tensor> cpu = WithGradients(grads, Device::Cpu());
      const std::vector<Tensor> gpu = WithGradients(grads, kGpu);
      const double want = clip_grad_norm_(cpu, max_norm, norm_type);
      Tensor norm;
      {
        NoHostSync guard;
        std::vector<Tensor> gpu_grads;
        for (const Tensor& p : gpu) gpu_grads.push_back(p.grad());
        norm = get_total_norm(gpu_grads, norm_type);
        clip_grads_with_norm_(gpu, max_norm, norm);
      }
      EXPECT_EQ(norm.device(), kGpu);
      EXPECT_NEAR(norm.item(), want, 1e-12 * want);
      for (size_t i = 0; i < cpu.size(); ++i) {
        EXPECT_LE(MaxAbsDiff(cpu[i].grad(), gpu[i].grad()), 1e-6);
      }
      // The double-valued form on the device: one read, the same result.
      const std::vector<Tensor> again = WithGradients(grads, kGpu);
      EXPECT_NEAR(clip_grad_norm_(again, max_norm, norm_type), want, 1e-12 * want);
    }
  }
}

TEST(NoHostSyncTest, ClipGradNormOfBfloat16GradientsOnTheDevice) {
  TANDEM_SKIP_WITHOUT_CUDA();
  const std::vector<Tensor> grads = {randn({9, 4}).to(kBFloat16), randn({6}).to(kBFloat16)};
  const std::vector<Tensor> cpu = WithGradients(grads, Device::Cpu());
  const std::vector<Tensor> gpu = WithGradients(grads, kGpu);
  const double want = clip_grad_norm_(cpu, 0.25);
  EXPECT_NEAR(clip_grad_norm_(gpu, 0.25), want, 1e-6 * want);
  for (size_t i = 0; i < cpu.size(); ++i) {
    EXPECT_EQ(gpu[i].grad().dtype(), kBFloat16);
    EXPECT_LE(MaxAbsDiff(cpu[i].grad().to(kFloat32), gpu[i].grad().to(kFloat32)), 1e-2);
  }
}

TEST(NoHostSyncTest, ClipGradNormErrorIfNonfiniteOnTheDevice) {
  TANDEM_SKIP_WITHOUT_CUDA();
  const std::vector<Tensor> params =
      WithGradients({full({2}, std::numeric_limits<double>::quiet_NaN())}, kGpu);
  EXPECT_THAT(ErrorOf([&] { clip_grad_norm_(params, 1.0, 2.0, /*error_if_nonfinite=*/true); }),
              HasSubstr("the total norm of order 2 of the gradients is nan"));
  // Without the check, the gradients become NaN, as on the CPU.
  EXPECT_TRUE(std::isnan(clip_grad_norm_(params, 1.0)));
  EXPECT_TRUE(std::isnan(params[0].grad().to(Device::Cpu()).to_vector<float>()[0]));
}

}  // namespace
}  // namespace tandem::nn
