#include "nn/grad_scaler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "nn/checkpoint.h"
#include "nn/clip_grad.h"
#include "nn/test_util.h"
#include "tensor/ops/ops.h"

namespace tandem::nn {
namespace {

using testing::ErrorOf;
using ::testing::HasSubstr;

// A float32 parameter (on `device`) holding `values`, whose gradient is `grad`.
Tensor ParamWithGrad(const std::vector<float>& values, const std::vector<float>& grad,
                     Device device = Device::Cpu(0)) {
  const int64_t n = static_cast<int64_t>(values.size());
  Tensor p = from_vector(values, {n}).to(device);
  p.set_requires_grad(true);
  p.set_grad(from_vector(grad, {n}).to(device));
  return p;
}

std::vector<float> Values(const Tensor& t) { return t.to(Device::Cpu(0)).to_vector<float>(); }

TEST(GradScalerTest, DefaultsArePyTorchs) {
  GradScaler scaler;
  EXPECT_EQ(scaler.get_scale(), 65536.0);
  EXPECT_EQ(scaler.get_growth_factor(), 2.0);
  EXPECT_EQ(scaler.get_backoff_factor(), 0.5);
  EXPECT_EQ(scaler.get_growth_interval(), 2000);
  EXPECT_EQ(scaler.get_growth_tracker(), 0);
  EXPECT_TRUE(scaler.is_enabled());
}

TEST(GradScalerTest, ScaleMultipliesTheLossAndItsGradients) {
  GradScaler scaler(GradScalerOptions().init_scale(1024.0));
  Tensor w = from_vector(std::vector<float>{1.5f, -2.0f}, {2});
  w.set_requires_grad(true);
  Tensor loss = sum(mul(w, w));  // 6.25; d/dw = 2w
  Tensor scaled = scaler.scale(loss);
  EXPECT_FLOAT_EQ(scaled.item(), 6.25 * 1024);
  scaled.backward();
  EXPECT_EQ(Values(w.grad()), (std::vector<float>{3.0f * 1024, -4.0f * 1024}));
}

TEST(GradScalerTest, ScalesA16BitLossInFloat32) {
  // 2 * 65536 exceeds float16's largest value (65504): the scaled loss is float32.
  GradScaler scaler;
  Tensor loss = scalar_tensor(2.0, kFloat16);
  Tensor scaled = scaler.scale(loss);
  EXPECT_EQ(scaled.dtype(), kFloat32);
  EXPECT_EQ(scaled.item(), 131072.0);
  EXPECT_EQ(scaler.scale(scalar_tensor(3.0, kBFloat16)).item(), 3.0 * 65536);
}

TEST(GradScalerTest, UnscaleDividesGradientsAndStepUsesThem) {
  GradScaler scaler(GradScalerOptions().init_scale(8.0));
  Tensor p = ParamWithGrad({1.0f, 2.0f, 3.0f}, {8.0f, -16.0f, 4.0f});
  Tensor q = ParamWithGrad({0.5f}, {24.0f});
  SGD sgd({p, q}, SGDOptions(0.5));
  scaler.unscale_(sgd);
  EXPECT_EQ(Values(p.grad()), (std::vector<float>{1.0f, -2.0f, 0.5f}));
  EXPECT_EQ(Values(q.grad()), (std::vector<float>{3.0f}));
  EXPECT_TRUE(scaler.step(sgd));  // does not unscale a second time
  EXPECT_EQ(Values(p), (std::vector<float>{0.5f, 3.0f, 2.75f}));
  EXPECT_EQ(Values(q), (std::vector<float>{-1.0f}));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 8.0);
  EXPECT_EQ(scaler.get_growth_tracker(), 1);
}

TEST(GradScalerTest, StepUnscalesWhenUnscaleWasNotCalled) {
  GradScaler scaler(GradScalerOptions().init_scale(4.0));
  Tensor p = ParamWithGrad({1.0f, 1.0f}, {4.0f, 8.0f});
  SGD sgd({p}, SGDOptions(1.0));
  EXPECT_TRUE(scaler.step(sgd));
  EXPECT_EQ(Values(p), (std::vector<float>{0.0f, -1.0f}));
  EXPECT_EQ(Values(p.grad()), (std::vector<float>{1.0f, 2.0f}));
}

TEST(GradScalerTest, InfOrNanGradientSkipsTheStepAndBacksOff) {
  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    SCOPED_TRACE(bad);
    GradScaler scaler(GradScalerOptions().growth_interval(3));
    Tensor p = ParamWithGrad({1.0f, 2.0f}, {1.0f, 1.0f});
    Tensor q = ParamWithGrad({3.0f, 4.0f}, {1.0f, 1.0f});
    SGD sgd({p, q}, SGDOptions(0.1));
    // A clean step first, so that the tracker has something to reset.
    EXPECT_TRUE(scaler.step(sgd));
    scaler.update();
    EXPECT_EQ(scaler.get_growth_tracker(), 1);
    const std::vector<float> p_before = Values(p);
    const std::vector<float> q_before = Values(q);
    p.set_grad(from_vector(std::vector<float>{1.0f, 1.0f}, {2}));
    q.set_grad(from_vector(std::vector<float>{1.0f, bad}, {2}));  // one bad element
    EXPECT_FALSE(scaler.step(sgd));
    EXPECT_EQ(Values(p), p_before);  // skipped: nothing moved
    EXPECT_EQ(Values(q), q_before);
    scaler.update();
    EXPECT_EQ(scaler.get_scale(), 32768.0);
    EXPECT_EQ(scaler.get_growth_tracker(), 0);
  }
}

TEST(GradScalerTest, FoundInfOnAnyDeviceSkips) {
  GradScaler scaler;
  Tensor p = ParamWithGrad({1.0f}, {1.0f}, Device::Cpu(0));
  Tensor q = ParamWithGrad({1.0f}, {std::numeric_limits<float>::infinity()}, Device::Cpu(1));
  SGD sgd({p, q}, SGDOptions(0.1));
  EXPECT_FALSE(scaler.step(sgd));
  EXPECT_EQ(Values(p), std::vector<float>{1.0f});
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 32768.0);
  // Clean gradients on both devices: stepped, each unscaled on its device.
  p.set_grad(full({1}, 32768.0));
  q.set_grad(full({1}, 65536.0, TensorOptions().device(Device::Cpu(1))));
  EXPECT_TRUE(scaler.step(sgd));
  EXPECT_EQ(q.grad().device(), Device::Cpu(1));
  EXPECT_FLOAT_EQ(Values(p)[0], 0.9f);
  EXPECT_FLOAT_EQ(Values(q)[0], 0.8f);
}

TEST(GradScalerTest, InfInOneOptimizerBacksOffForAll) {
  GradScaler scaler(GradScalerOptions().init_scale(16.0));
  Tensor p = ParamWithGrad({1.0f}, {16.0f});
  Tensor q = ParamWithGrad({1.0f}, {std::numeric_limits<float>::quiet_NaN()});
  SGD a({p}, SGDOptions(1.0));
  SGD b({q}, SGDOptions(1.0));
  EXPECT_TRUE(scaler.step(a));  // a's gradients are clean: it steps
  EXPECT_FALSE(scaler.step(b));
  EXPECT_EQ(Values(p), std::vector<float>{0.0f});
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 8.0);
}

TEST(GradScalerTest, GrowsAfterGrowthIntervalCleanSteps) {
  GradScaler scaler(GradScalerOptions().init_scale(2.0).growth_interval(3).growth_factor(4.0));
  Tensor p = ParamWithGrad({0.0f}, {0.0f});
  SGD sgd({p}, SGDOptions(0.1));
  const std::vector<double> expected_scale = {2, 2, 8, 8, 8, 32};
  const std::vector<int64_t> expected_tracker = {1, 2, 0, 1, 2, 0};
  for (size_t i = 0; i < expected_scale.size(); ++i) {
    p.set_grad(full({1}, 1.0));
    EXPECT_TRUE(scaler.step(sgd));
    scaler.update();
    EXPECT_EQ(scaler.get_scale(), expected_scale[i]) << "after step " << i + 1;
    EXPECT_EQ(scaler.get_growth_tracker(), expected_tracker[i]) << "after step " << i + 1;
  }
}

TEST(GradScalerTest, GrowthStopsBeforeFloat32Overflows) {
  GradScaler scaler(GradScalerOptions().init_scale(std::ldexp(1.0, 127)).growth_interval(1));
  Tensor p = ParamWithGrad({0.0f}, {0.0f});
  SGD sgd({p}, SGDOptions(0.1));
  EXPECT_TRUE(scaler.step(sgd));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), std::ldexp(1.0, 127));
  EXPECT_EQ(scaler.get_growth_tracker(), 0);
}

TEST(GradScalerTest, UpdateWithANewScale) {
  GradScaler scaler;
  scaler.update(100.0);
  EXPECT_EQ(scaler.get_scale(), 100.0);
  EXPECT_THAT(ErrorOf([&] { scaler.update(-1.0); }), HasSubstr("must be positive"));
}

TEST(GradScalerTest, CallsOutOfOrderErrorClearly) {
  GradScaler scaler;
  Tensor p = ParamWithGrad({1.0f}, {1.0f});
  SGD sgd({p}, SGDOptions(0.1));
  EXPECT_THAT(ErrorOf([&] { scaler.update(); }),
              HasSubstr("no inf checks were recorded prior to update()"));
  scaler.unscale_(sgd);
  EXPECT_THAT(ErrorOf([&] { scaler.unscale_(sgd); }),
              HasSubstr("unscale_() has already been called on this optimizer (SGD) since the "
                        "last update()"));
  EXPECT_TRUE(scaler.step(sgd));
  EXPECT_THAT(ErrorOf([&] { scaler.step(sgd); }),
              HasSubstr("step() has already been called on this optimizer"));
  EXPECT_THAT(ErrorOf([&] { scaler.unscale_(sgd); }), HasSubstr("after step()"));
  scaler.update();
  // A new iteration may unscale again.
  scaler.unscale_(sgd);
}

TEST(GradScalerTest, RefusesFloat16Gradients) {
  GradScaler scaler;
  Tensor p = zeros({2}, kFloat16);
  p.set_requires_grad(true);
  p.set_grad(ones({2}, kFloat16));
  SGD sgd({p}, SGDOptions(0.1));
  EXPECT_THAT(ErrorOf([&] { scaler.unscale_(sgd); }), HasSubstr("float16 gradient"));
}

TEST(GradScalerTest, RejectsInvalidOptions) {
  EXPECT_THAT(ErrorOf([] { GradScaler(GradScalerOptions().growth_factor(1.0)); }),
              HasSubstr("growth_factor must be > 1"));
  EXPECT_THAT(ErrorOf([] { GradScaler(GradScalerOptions().backoff_factor(1.0)); }),
              HasSubstr("backoff_factor must be in (0, 1)"));
  EXPECT_THAT(ErrorOf([] { GradScaler(GradScalerOptions().growth_interval(0)); }),
              HasSubstr("growth_interval must be >= 1"));
  EXPECT_THAT(ErrorOf([] { GradScaler(GradScalerOptions().init_scale(0.0)); }),
              HasSubstr("must be positive"));
}

TEST(GradScalerTest, DisabledIsAPassThrough) {
  GradScaler scaler(GradScalerOptions().enabled(false));
  Tensor loss = scalar_tensor(3.0);
  EXPECT_TRUE(scaler.scale(loss).shares_storage_with(loss));
  EXPECT_FALSE(scaler.scale(loss).requires_grad());
  Tensor p = ParamWithGrad({1.0f}, {std::numeric_limits<float>::infinity()});
  SGD sgd({p}, SGDOptions(1.0));
  scaler.unscale_(sgd);
  scaler.unscale_(sgd);  // no once-per-step rule either
  EXPECT_EQ(Values(p.grad())[0], std::numeric_limits<float>::infinity());
  EXPECT_TRUE(scaler.step(sgd));  // steps whatever the gradients
  EXPECT_EQ(Values(p)[0], -std::numeric_limits<float>::infinity());
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 1.0);
  EXPECT_TRUE(scaler.state_dict().empty());
  scaler.load_state_dict({});
}

TEST(GradScalerTest, StateRoundTrips) {
  GradScaler scaler(GradScalerOptions().init_scale(1024.0).growth_interval(5).growth_factor(3.0));
  Tensor p = ParamWithGrad({0.0f}, {1.0f});
  SGD sgd({p}, SGDOptions(0.1));
  for (int i = 0; i < 2; ++i) {
    p.set_grad(full({1}, 1.0));
    scaler.step(sgd);
    scaler.update();
  }
  p.set_grad(full({1}, std::numeric_limits<double>::quiet_NaN()));
  scaler.step(sgd);
  scaler.update();  // 512, tracker 0
  p.set_grad(full({1}, 1.0));
  scaler.step(sgd);
  scaler.update();  // tracker 1
  const GradScalerState state = scaler.state_dict();
  EXPECT_EQ(state.at("scale").item(), 512.0);
  EXPECT_EQ(state.at("growth_tracker").item<int64_t>(), 1);
  EXPECT_EQ(state.at("growth_interval").item<int64_t>(), 5);
  EXPECT_EQ(state.at("growth_factor").item(), 3.0);
  EXPECT_EQ(state.at("backoff_factor").item(), 0.5);

  // Through a checkpoint file, as a trainer saves it.
  const std::string path = ::testing::TempDir() + "/grad_scaler_state.ckpt";
  std::vector<CheckpointEntry> entries;
  for (const auto& [name, value] : state) entries.push_back({"scaler." + name, true, value});
  WriteCheckpoint(entries, path);
  GradScalerState loaded;
  for (const CheckpointEntry& e : ReadCheckpoint(path)) loaded[e.name.substr(7)] = e.value;
  std::remove(path.c_str());

  GradScaler resumed;
  resumed.load_state_dict(loaded);
  EXPECT_EQ(resumed.get_scale(), 512.0);
  EXPECT_EQ(resumed.get_growth_tracker(), 1);
  EXPECT_EQ(resumed.get_growth_interval(), 5);
  EXPECT_EQ(resumed.get_growth_factor(), 3.0);
  // Both go on alike: four more clean steps grow the scale by 3.
  for (GradScaler* s : {&scaler, &resumed}) {
    for (int i = 0; i < 4; ++i) {
      p.set_grad(full({1}, 1.0));
      s->step(sgd);
      s->update();
    }
    EXPECT_EQ(s->get_scale(), 1536.0);
    EXPECT_EQ(s->get_growth_tracker(), 0);
  }
}

TEST(GradScalerTest, LoadStateChecksFirst) {
  GradScaler scaler;
  GradScalerState state = GradScaler(GradScalerOptions().init_scale(4.0)).state_dict();
  EXPECT_THAT(ErrorOf([&] { scaler.load_state_dict({}); }),
              HasSubstr("saved from a disabled GradScaler"));
  GradScalerState unknown = state;
  unknown["momentum"] = scalar_tensor(1.0);
  EXPECT_THAT(ErrorOf([&] { scaler.load_state_dict(unknown); }), HasSubstr("unknown entry"));
  GradScalerState missing = state;
  missing.erase("growth_tracker");
  EXPECT_THAT(ErrorOf([&] { scaler.load_state_dict(missing); }),
              HasSubstr("no 'growth_tracker' entry"));
  GradScalerState wrong_type = state;
  wrong_type["scale"] = scalar_tensor(4.0, kFloat32);
  EXPECT_THAT(ErrorOf([&] { scaler.load_state_dict(wrong_type); }),
              HasSubstr("entry 'scale' must be one float64 value"));
  GradScalerState bad_tracker = state;
  bad_tracker["growth_tracker"] = scalar_tensor(5000.0, kInt64);
  EXPECT_THAT(ErrorOf([&] { scaler.load_state_dict(bad_tracker); }),
              HasSubstr("growth_tracker must be in [0, growth_interval"));
  EXPECT_EQ(scaler.get_scale(), 65536.0);  // left as it was
}

TEST(GradScalerTest, UnscaleBeforeClippingClipsTrueGradients) {
  GradScaler scaler(GradScalerOptions().init_scale(1024.0));
  Tensor p = ParamWithGrad({0.0f, 0.0f}, {3.0f * 1024, 4.0f * 1024});
  SGD sgd({p}, SGDOptions(1.0));
  scaler.unscale_(sgd);
  EXPECT_NEAR(clip_grad_norm_({p}, 1.0), 5.0, 1e-5);  // the unscaled norm
  EXPECT_TRUE(scaler.step(sgd));
  EXPECT_NEAR(Values(p)[0], -0.6f, 1e-5);
  EXPECT_NEAR(Values(p)[1], -0.8f, 1e-5);
}

// float32 parameters, float16 activations (the forward casts the weights to float16 as
// autocast would; the gradients flow back to float32). A linear model whose products are
// float16, written with elementwise ops (float16 GEMM and reductions are being written by
// others): the gradient of each product is float16 and overflows with too large a scale. An initial
// scale of 2^24 overflows float16's gradients (max 65504): the scaler skips those steps and backs
// off until the gradients fit, then training proceeds and the loss falls.
TEST(GradScalerTest, Float16TrainingBacksOffThenLearns) {
  Generator gen(7);
  Tensor x = randn({64, 8}, {}, &gen);
  Tensor true_w = randn({8, 1}, {}, &gen);
  Tensor y = matmul(x, true_w).reshape({64});
  Tensor w = zeros({1, 8});
  w.set_requires_grad(true);
  SGD sgd({w}, SGDOptions(0.3));
  GradScaler scaler(GradScalerOptions().init_scale(std::ldexp(1.0, 24)).growth_interval(1000));
  const Tensor x16 = x.to(kFloat16);
  auto forward = [&] {
    Tensor rows = mul(w, ones({64, 1})).to(kFloat16);  // w on each row, cast as autocast would
    Tensor products = mul(x16, rows);
    EXPECT_EQ(products.dtype(), kFloat16);
    return sum(products.to(kFloat32), {1});
  };
  auto loss_now = [&] {
    NoGradGuard no_grad;
    return mse_loss(forward(), y).item();
  };
  const double initial_loss = loss_now();
  int skipped = 0;
  int stepped = 0;
  for (int i = 0; i < 150; ++i) {
    sgd.zero_grad();
    Tensor loss = mse_loss(forward(), y);
    scaler.scale(loss).backward();
    ASSERT_EQ(w.grad().dtype(), kFloat32);
    if (scaler.step(sgd)) {
      ++stepped;
    } else {
      ++skipped;
    }
    scaler.update();
  }
  // 2^24 * dL/dproducts (2/64 * the error, about 0.1 at first) overflows float16 (65504)
  // until a few halvings have brought the scale down.
  EXPECT_GE(skipped, 3);
  EXPECT_LE(skipped, 12);
  EXPECT_EQ(skipped + stepped, 150);
  EXPECT_LT(scaler.get_scale(), std::ldexp(1.0, 24));
  EXPECT_EQ(scaler.get_scale(), std::ldexp(1.0, 24 - skipped));
  const double final_loss = loss_now();
  EXPECT_TRUE(std::isfinite(final_loss));
  EXPECT_LT(final_loss, initial_loss * 0.01)
      << "initial " << initial_loss << ", " << skipped << " skipped";
}

}  // namespace
}  // namespace tandem::nn
