#include "tensor/ops/fused_optimizers.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "tensor/ops/fused_optimizers_testing.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace tandem {
namespace {

using testing::AllOptimizerCases;
using testing::CaseTensors;
using testing::ErrorOf;
using ::testing::HasSubstr;
using testing::MakeCaseTensors;
using testing::OptimizerCase;
using testing::RunCase;

// The values as float (exact for every floating dtype but float64, which the tests compare as
// double).
std::vector<double> Values(const Tensor& t) {
  return t.to(Device::Cpu(0)).to(kFloat64).to_vector<double>();
}

void ExpectSameBits(const std::vector<Tensor>& actual, const std::vector<Tensor>& expected,
                    const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t k = 0; k < actual.size(); ++k) {
    const std::vector<double> a = Values(actual[k]), e = Values(expected[k]);
    ASSERT_EQ(a.size(), e.size()) << what << ", tensor " << k;
    for (size_t j = 0; j < a.size(); ++j) {
      ASSERT_TRUE(a[j] == e[j] || (std::isnan(a[j]) && std::isnan(e[j])))
          << what << ", tensor " << k << " element " << j << ": " << a[j] << " vs " << e[j];
    }
  }
}

// Sizes around the CPU kernels' piece (2^14 elements), odd ones and an empty one.
const std::vector<int64_t> kSizes = {40000, 16384, 3, 0, 1000};

// One step of SGD with momentum by hand (PyTorch's rule, the buffer's first step and a later
// one), of Adam's first step, and of RMSprop's.
TEST(FusedOptimizersTest, StepsFollowPyTorchsRulesByHand) {
  Tensor p = from_vector(std::vector<float>{1.0f, -2.0f}, {2});
  Tensor g = from_vector(std::vector<float>{0.5f, 1.0f}, {2});
  Tensor b = zeros({2});
  FusedSgdOptions sgd;
  sgd.lr = 0.5;
  sgd.momentum = 0.5;
  sgd.weight_decay = 1.0;
  sgd.first_step = true;
  fused_sgd_({p}, {g}, {b}, sgd);  // d = g + p = (1.5, -1); b = d; p -= 0.5 d
  EXPECT_EQ(Values(b), (std::vector<double>{1.5, -1.0}));
  EXPECT_EQ(Values(p), (std::vector<double>{0.25, -1.5}));
  sgd.first_step = false;
  fused_sgd_({p}, {g}, {b}, sgd);  // d = (0.75, -0.5); b = 0.5 b + d = (1.5, -1)
  EXPECT_EQ(Values(b), (std::vector<double>{1.5, -1.0}));
  EXPECT_EQ(Values(p), (std::vector<double>{-0.5, -1.0}));

  // Adam's first step moves each element by lr against the sign of its gradient.
  Tensor q = from_vector(std::vector<double>{1.0, -2.0}, {2});
  Tensor gq = from_vector(std::vector<double>{3.0, -0.25}, {2});
  Tensor m = zeros({2}, TensorOptions().dtype(kFloat64)), v = zeros_like(m);
  FusedAdamOptions adam;
  adam.lr = 0.1;
  adam.eps = 0.0;
  fused_adam_({q}, {gq}, {m}, {v}, {}, {1}, adam);
  EXPECT_NEAR(Values(q)[0], 0.9, 1e-15);
  EXPECT_NEAR(Values(q)[1], -1.9, 1e-15);

  // RMSprop's first step without momentum: v = (1 - alpha) g^2, p -= lr g / sqrt(v).
  Tensor r = from_vector(std::vector<double>{1.0}, {1});
  Tensor gr = from_vector(std::vector<double>{2.0}, {1});
  Tensor sq = zeros({1}, TensorOptions().dtype(kFloat64));
  FusedRmspropOptions rms;
  rms.lr = 0.01;
  rms.alpha = 0.96;
  rms.eps = 0.0;
  fused_rmsprop_({r}, {gr}, {sq}, {}, {}, rms);
  EXPECT_NEAR(Values(sq)[0], 0.16, 1e-15);
  EXPECT_NEAR(Values(r)[0], 1.0 - 0.05, 1e-15);
}

// maximize is the step of the negated gradient, bit for bit, for every case.
TEST(FusedOptimizersTest, MaximizeIsTheStepOfTheNegatedGradient) {
  for (OptimizerCase c : AllOptimizerCases()) {
    if (c.sgd.maximize || c.adam.maximize || c.rmsprop.maximize) continue;
    SCOPED_TRACE(c.name);
    CaseTensors up = MakeCaseTensors(c, kSizes, kFloat32, Device::Cpu(0));
    CaseTensors down = MakeCaseTensors(c, kSizes, kFloat32, Device::Cpu(0));
    for (Tensor& g : down.grads) g = g * -1.0;
    RunCase(c, down);
    c.sgd.maximize = c.adam.maximize = c.rmsprop.maximize = true;
    RunCase(c, up);
    ExpectSameBits(up.Written(), down.Written(), c.name);
  }
}

// bfloat16 and float16 compute in float and round each stored value once: the 16-bit step is
// the float32 step of the widened tensors, rounded.
TEST(FusedOptimizersTest, SixteenBitStepsComputeInFloatAndRoundOnStore) {
  for (DType dtype : {kBFloat16, kFloat16}) {
    for (const OptimizerCase& c : AllOptimizerCases()) {
      SCOPED_TRACE(std::string(DTypeName(dtype)) + " " + c.name);
      CaseTensors narrow = MakeCaseTensors(c, kSizes, dtype, Device::Cpu(0));
      CaseTensors wide = narrow;
      auto widen = [](std::vector<Tensor>& list) {
        for (Tensor& t : list) t = t.to(kFloat32);
      };
      widen(wide.params);
      widen(wide.grads);
      for (auto& list : wide.states) widen(list);
      RunCase(c, narrow);
      RunCase(c, wide);
      std::vector<Tensor> rounded = wide.Written();
      for (Tensor& t : rounded) t = t.to(dtype);
      ExpectSameBits(narrow.Written(), rounded, c.name);
    }
  }
}

// Strided parameters and states are stepped through contiguous copies and written back; a
// call with several dtypes steps each dtype's tensors as a call of their own would.
TEST(FusedOptimizersTest, StridedTensorsAndMixedDtypesGiveTheContiguousBits) {
  for (const OptimizerCase& c : AllOptimizerCases()) {
    SCOPED_TRACE(c.name);
    CaseTensors contiguous = MakeCaseTensors(c, {300, 7}, kFloat32, Device::Cpu(0));
    CaseTensors strided = MakeCaseTensors(c, {300, 7}, kFloat32, Device::Cpu(0));
    auto stride = [](std::vector<Tensor>& list) {
      for (Tensor& t : list) {
        const int64_t n = t.numel();
        t = t.reshape({n, 1}).expand({n, 2}).clone().narrow(1, 0, 1).reshape({n});
      }
    };
    stride(strided.params);
    stride(strided.grads);
    for (auto& list : strided.states) stride(list);
    RunCase(c, contiguous);
    RunCase(c, strided);
    ExpectSameBits(strided.Written(), contiguous.Written(), c.name + " (strided)");

    CaseTensors doubles = MakeCaseTensors(c, {50}, kFloat64, Device::Cpu(0), 3);
    CaseTensors floats = MakeCaseTensors(c, {40}, kFloat32, Device::Cpu(0), 4);
    CaseTensors mixed;
    mixed.params = {doubles.params[0], floats.params[0]};
    mixed.grads = {doubles.grads[0], floats.grads[0]};
    mixed.steps = {2, 3};
    for (size_t s = 0; s < doubles.states.size(); ++s) {
      mixed.states.emplace_back();
      if (doubles.states[s].empty()) continue;
      mixed.states[s] = {doubles.states[s][0].clone(), floats.states[s][0].clone()};
    }
    mixed.params = {mixed.params[0].clone(), mixed.params[1].clone()};
    doubles.steps = {2};
    floats.steps = {3};
    RunCase(c, mixed);
    RunCase(c, doubles);
    RunCase(c, floats);
    std::vector<Tensor> expected = {doubles.params[0], floats.params[0]};
    ExpectSameBits({mixed.params[0], mixed.params[1]}, expected, c.name + " (mixed dtypes)");
  }
}

TEST(FusedOptimizersTest, RejectsMismatchedListsWithClearErrors) {
  SetCpuDeviceCount(2);
  Tensor p = zeros({3}), g = zeros({3}), b = zeros({3});
  FusedSgdOptions sgd;
  sgd.lr = 0.1;
  sgd.momentum = 0.9;
  EXPECT_THAT(ErrorOf([&] { fused_sgd_({p}, {}, {b}, sgd); }),
              HasSubstr("fused_sgd_: grads has 0 tensors but params has 1"));
  EXPECT_THAT(ErrorOf([&] { fused_sgd_({p}, {g}, {}, sgd); }),
              HasSubstr("momentum_buffers has 0 tensors but params has 1 and momentum is not 0"));
  EXPECT_THAT(ErrorOf([&] { fused_sgd_({p}, {zeros({4})}, {b}, sgd); }),
              HasSubstr("grads[0] is float32 [4] on cpu:0 but params[0] is float32 [3] on cpu:0"));
  EXPECT_THAT(ErrorOf([&] { fused_sgd_({p}, {g}, {b.to(kFloat64)}, sgd); }),
              HasSubstr("momentum_buffers[0] is float64"));
  EXPECT_THAT(ErrorOf([&] { fused_sgd_({p}, {g}, {b.to(Device::Cpu(1))}, sgd); }),
              HasSubstr("on cpu:1 but params[0] is float32 [3] on cpu:0"));
  EXPECT_THAT(ErrorOf([&] { fused_sgd_({p}, {Tensor()}, {b}, sgd); }),
              HasSubstr("grads[0] is undefined"));
  Tensor ints = zeros({3}, TensorOptions().dtype(kInt64));
  EXPECT_THAT(ErrorOf([&] { fused_sgd_({ints}, {ints}, {ints}, sgd); }),
              HasSubstr("params[0] is int64 but only floating-point tensors"));
  FusedAdamOptions adam;
  adam.amsgrad = true;
  EXPECT_THAT(ErrorOf([&] { fused_adam_({p}, {g}, {b}, {b.clone()}, {}, {1}, adam); }),
              HasSubstr("max_exp_avg_sqs has 0 tensors but params has 1 and amsgrad is on"));
  EXPECT_THAT(ErrorOf([&] { fused_adam_({p}, {g}, {b}, {b.clone()}, {b.clone()}, {0}, adam); }),
              HasSubstr("steps[0] is 0"));
  FusedRmspropOptions rms;
  rms.centered = true;
  EXPECT_THAT(ErrorOf([&] { fused_rmsprop_({p}, {g}, {b}, {}, {}, rms); }),
              HasSubstr("grad_avgs has 0 tensors but params has 1 and centered is on"));
  EXPECT_EQ(Values(p), (std::vector<double>{0, 0, 0}));  // nothing ran
  fused_sgd_({}, {}, {}, sgd);                           // nothing to do

  // The kernels check their raw arguments too, once, before dispatching.
  FusedAdamTensor missing;
  missing.numel = 3;
  missing.param = p.data_ptr();
  missing.grad = g.data_ptr();
  missing.exp_avg = b.data_ptr();
  EXPECT_THAT(ErrorOf([&] { RunFusedAdam(Device::Cpu(0), kFloat32, {}, {missing}); }),
              HasSubstr("FusedAdamKernel: tensor 0 needs exp_avg_sq"));
  EXPECT_THAT(ErrorOf([&] { RunFusedSgd(Device::Cpu(0), kInt64, {}, {}); }),
              HasSubstr("FusedSgdKernel: expected a floating dtype"));
}

TEST(FusedOptimizersTest, TheKernelsAreRegisteredForTheCpu) {
  EXPECT_TRUE(FusedSgdKernel.has(DeviceType::kCPU));
  EXPECT_TRUE(FusedAdamKernel.has(DeviceType::kCPU));
  EXPECT_TRUE(FusedRmspropKernel.has(DeviceType::kCPU));
}

}  // namespace
}  // namespace tandem
