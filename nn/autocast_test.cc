// Under autocast (tensor/ops/autocast.h) the layers of nn keep PyTorch's policy: Linear and
// Conv2d compute in the lower precision, the norms (composed from primitives here) and every
// loss in float32, whatever dtype their input comes in.
#include <gtest/gtest.h>

#include <vector>

#include "nn/nn.h"
#include "tensor/testing.h"

namespace tandem::nn {
namespace {

using ::tandem::testing::MaxAbsDiff;

constexpr DeviceType kCPU = DeviceType::kCPU;

TEST(AutocastLayersTest, LinearAndConv2dRunInTheLowerPrecision) {
  manual_seed(1);
  Linear linear(6, 3);
  Conv2d conv(Conv2dOptions(2, 4, 3).padding(1));
  AutocastGuard autocast(kCPU);
  EXPECT_EQ(linear.forward(randn({5, 6})).dtype(), kBFloat16);
  EXPECT_EQ(conv.forward(randn({2, 2, 5, 5})).dtype(), kBFloat16);
  // The parameters themselves stay float32; only their casts are bfloat16.
  for (const Tensor& p : linear.parameters()) EXPECT_EQ(p.dtype(), kFloat32);
}

TEST(AutocastLayersTest, NormsRunInFloat32AndKeepFloat32Statistics) {
  manual_seed(2);
  const Tensor x = randn({6, 3, 4, 4}).to(kBFloat16);
  BatchNorm2d norm(3), reference(3);
  LayerNorm layer_norm({4, 4});
  Tensor out, layer_out;
  {
    AutocastGuard autocast(kCPU);
    out = norm.forward(x);
    layer_out = layer_norm.forward(x);
  }
  EXPECT_EQ(out.dtype(), kFloat32);
  EXPECT_EQ(layer_out.dtype(), kFloat32);
  EXPECT_EQ(norm.running_mean().dtype(), kFloat32);
  // The bfloat16 input is cast up exactly: the same as normalising its float32 copy.
  EXPECT_EQ(MaxAbsDiff(out, reference.forward(x.to(kFloat32))), 0.0);
  EXPECT_EQ(MaxAbsDiff(norm.running_mean(), reference.running_mean()), 0.0);
  EXPECT_EQ(MaxAbsDiff(norm.running_var(), reference.running_var()), 0.0);
  EXPECT_EQ(MaxAbsDiff(layer_out, layer_norm.forward(x.to(kFloat32))), 0.0);
  BatchNorm1d norm1d(3);
  AutocastGuard autocast(kCPU);
  EXPECT_EQ(norm1d.forward(randn({4, 3}).to(kBFloat16)).dtype(), kFloat32);
}

TEST(AutocastLayersTest, NormGradientsReachTheLowerPrecisionInput) {
  manual_seed(3);
  Tensor x = randn({4, 3}).to(kBFloat16);
  x.set_requires_grad(true);
  BatchNorm1d norm(3);
  Tensor loss;
  {
    AutocastGuard autocast(kCPU);
    loss = sum(mul(norm.forward(x), randn({4, 3})));
  }
  loss.backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_EQ(x.grad().dtype(), kBFloat16);  // back through the cast, to the input's dtype
  for (const Tensor& p : norm.parameters()) EXPECT_EQ(p.grad().dtype(), kFloat32);
}

TEST(AutocastLossesTest, EveryLossRunsInFloat32) {
  manual_seed(4);
  const Tensor logits32 = randn({5, 4});
  const Tensor logits = logits32.to(kBFloat16);
  const Tensor labels = from_vector(std::vector<int64_t>{0, 3, 1, 2, 1}, {5});
  const Tensor target32 = rand({5, 4});
  const Tensor target = target32.to(kBFloat16);
  const Tensor class_weight = from_vector(std::vector<float>{1.0f, 2.0f, 0.5f, 1.0f}, {4});
  const Tensor log_probs = log_softmax(logits32, 1).to(kBFloat16);
  struct Case {
    const char* name;
    Tensor autocast, reference;
  };
  std::vector<Case> cases;
  {
    AutocastGuard autocast(kCPU);
    const auto weighted = CrossEntropyLossOptions().weight(class_weight).label_smoothing(0.1);
    cases = {
        {"cross_entropy", functional::cross_entropy(logits, labels),
         functional::cross_entropy(logits.to(kFloat32), labels)},
        {"cross_entropy weighted", functional::cross_entropy(logits, labels, weighted),
         functional::cross_entropy(logits.to(kFloat32), labels, weighted)},
        {"cross_entropy probabilities", functional::cross_entropy(logits, softmax(target32, 1)),
         functional::cross_entropy(logits.to(kFloat32), softmax(target32, 1))},
        {"nll_loss", functional::nll_loss(log_probs, labels),
         functional::nll_loss(log_probs.to(kFloat32), labels)},
        {"bce_with_logits", functional::binary_cross_entropy_with_logits(logits, target),
         functional::binary_cross_entropy_with_logits(logits.to(kFloat32), target.to(kFloat32))},
        {"mse_loss", functional::mse_loss(logits, target),
         functional::mse_loss(logits.to(kFloat32), target.to(kFloat32))},
        {"l1_loss", functional::l1_loss(logits, target32),
         functional::l1_loss(logits.to(kFloat32), target32)},
        {"smooth_l1_loss", functional::smooth_l1_loss(logits, target),
         functional::smooth_l1_loss(logits.to(kFloat32), target.to(kFloat32))},
        {"CrossEntropyLoss parts", CrossEntropyLoss().forward_parts(logits, labels).numerator,
         CrossEntropyLoss().forward_parts(logits.to(kFloat32), labels).numerator},
        {"MSELoss parts", MSELoss().forward_parts(logits, target).numerator,
         MSELoss().forward_parts(logits.to(kFloat32), target.to(kFloat32)).numerator},
    };
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(c.autocast.dtype(), kFloat32);
    EXPECT_EQ(MaxAbsDiff(c.autocast, c.reference), 0.0);
  }
}

}  // namespace
}  // namespace tandem::nn
