#include "nn/lr_scheduler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "nn/optim.h"
#include "nn/test_util.h"

namespace tandem::nn {
namespace {

using testing::ErrorOf;
using ::testing::HasSubstr;

Tensor Param() {
  Tensor w = zeros({3});
  w.set_requires_grad(true);
  return w;
}

double GroupLr(const Optimizer& optimizer, size_t group = 0) {
  return optimizer.param_groups().at(group).options().get_lr();
}

// The rates a scheduler sets at epochs 0, 1, ..., n - 1 (it sets epoch 0's when built);
// checks that get_last_lr() reports what the optimizer holds.
template <typename Scheduler>
std::vector<double> Rates(Optimizer& optimizer, Scheduler& scheduler, int n) {
  std::vector<double> rates;
  for (int epoch = 0; epoch < n; ++epoch) {
    if (epoch > 0) scheduler.step();
    EXPECT_EQ(scheduler.last_epoch(), epoch);
    EXPECT_EQ(scheduler.get_last_lr().at(0), GroupLr(optimizer));
    rates.push_back(GroupLr(optimizer));
  }
  return rates;
}

void ExpectRates(const std::vector<double>& actual, const std::vector<double>& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_NEAR(actual[i], expected[i], 1e-12 + 1e-9 * std::abs(expected[i])) << "epoch " << i;
  }
}

TEST(LrSchedulerTest, StepLrDividesEveryStepSizeEpochs) {
  // PyTorch's documented example: 0.05 for epochs 0-29, 0.005 for 30-59, 0.0005 for 60-89.
  SGD sgd({Param()}, SGDOptions(0.05));
  StepLR scheduler(sgd, /*step_size=*/30, /*gamma=*/0.1);
  const std::vector<double> rates = Rates(sgd, scheduler, 90);
  for (int epoch = 0; epoch < 90; ++epoch) {
    EXPECT_NEAR(rates[epoch],
                epoch < 30   ? 0.05
                : epoch < 60 ? 0.005
                             : 0.0005,
                1e-15)
        << "epoch " << epoch;
  }
}

TEST(LrSchedulerTest, CosineAnnealingFollowsTheClosedForm) {
  SGD sgd({Param()}, SGDOptions(0.1));
  CosineAnnealingLR scheduler(sgd, /*T_max=*/10, /*eta_min=*/0.001);
  // eta_min + (0.1 - eta_min) (1 + cos(pi e / 10)) / 2; cos(pi / 5) = 0.80901699437494745.
  const std::vector<double> rates = Rates(sgd, scheduler, 21);
  EXPECT_NEAR(rates[0], 0.1, 1e-15);
  EXPECT_NEAR(rates[2], 0.001 + 0.099 * (1.0 + 0.80901699437494745) / 2, 1e-15);
  EXPECT_NEAR(rates[5], (0.1 + 0.001) / 2, 1e-15);
  EXPECT_NEAR(rates[8], 0.001 + 0.099 * (1.0 - 0.80901699437494745) / 2, 1e-15);
  EXPECT_NEAR(rates[10], 0.001, 1e-15);
  EXPECT_NEAR(rates[15], (0.1 + 0.001) / 2, 1e-15);  // periodic past T_max, as PyTorch's
  EXPECT_NEAR(rates[20], 0.1, 1e-15);
}

TEST(LrSchedulerTest, LinearLrWarmsUpThenHolds) {
  // PyTorch's documented example: lr 0.05, start_factor 0.5, total_iters 4.
  SGD sgd({Param()}, SGDOptions(0.05));
  LinearLR scheduler(sgd, /*start_factor=*/0.5, /*end_factor=*/1.0, /*total_iters=*/4);
  ExpectRates(Rates(sgd, scheduler, 7), {0.025, 0.03125, 0.0375, 0.04375, 0.05, 0.05, 0.05});
  // The defaults: a third of the rate, up to the whole over 5 epochs.
  SGD other({Param()}, SGDOptions(0.3));
  LinearLR defaults(other);
  ExpectRates(Rates(other, defaults, 6), {0.1, 0.14, 0.18, 0.22, 0.26, 0.3});
}

TEST(LrSchedulerTest, OneCycleRisesThenAnnealsToItsFloor) {
  SGD sgd({Param()}, SGDOptions(1.0).momentum(0.9));
  OneCycleLR scheduler(sgd, /*max_lr=*/0.1, /*total_steps=*/10);
  // Defaults: start at 0.1 / 25 = 0.004, peak at step 0.3 * 10 - 1 = 2, end at
  // 0.004 / 1e4 = 4e-7 at step 9; both halves cosine.
  const std::vector<double> rates = Rates(sgd, scheduler, 10);
  EXPECT_NEAR(rates[0], 0.004, 1e-15);
  EXPECT_NEAR(rates[1], 0.052, 1e-15);  // half-way up: the mean of 0.004 and 0.1
  EXPECT_NEAR(rates[2], 0.1, 1e-15);
  const double cos_pi_7 = 0.90096886790241915;  // cos(pi / 7): one seventh of the way down
  EXPECT_NEAR(rates[3], 4e-7 + (0.1 - 4e-7) * (1.0 + cos_pi_7) / 2, 1e-15);
  EXPECT_NEAR(rates[9], 4e-7, 1e-15);
  EXPECT_EQ(sgd.param_groups()[0].initial_lr(), 0.004);
  EXPECT_EQ(scheduler.base_lrs(), std::vector<double>{0.004});
  scheduler.step();  // step 10 == total_steps is still allowed, as in PyTorch
  EXPECT_THAT(ErrorOf([&] { scheduler.step(); }),
              HasSubstr("tried to step 11 times but total_steps is 10"));

  SGD other({Param()}, SGDOptions(1.0));
  OneCycleLR custom(other, 1.0, 100, OneCycleOptions().pct_start(0.5).div_factor(10));
  const std::vector<double> custom_rates = Rates(other, custom, 100);
  EXPECT_NEAR(custom_rates[0], 0.1, 1e-15);
  EXPECT_NEAR(custom_rates[49], 1.0, 1e-15);
  EXPECT_NEAR(custom_rates[99], 0.1 / 1e4, 1e-15);
}

TEST(LrSchedulerTest, MultiStepLrFallsAtEachMilestone) {
  // PyTorch's documented example: 0.05 until epoch 30, 0.005 until 80, then 0.0005.
  SGD sgd({Param()}, SGDOptions(0.05));
  MultiStepLR scheduler(sgd, /*milestones=*/{30, 80}, /*gamma=*/0.1);
  const std::vector<double> rates = Rates(sgd, scheduler, 100);
  for (int epoch = 0; epoch < 100; ++epoch) {
    EXPECT_NEAR(rates[epoch],
                epoch < 30   ? 0.05
                : epoch < 80 ? 0.005
                             : 0.0005,
                1e-15)
        << "epoch " << epoch;
  }
  // Milestones in any order; one listed twice falls twice (PyTorch's Counter).
  SGD other({Param()}, SGDOptions(1.0));
  MultiStepLR repeated(other, {5, 2, 5}, 0.5);
  ExpectRates(Rates(other, repeated, 7), {1.0, 1.0, 0.5, 0.5, 0.5, 0.125, 0.125});
}

TEST(LrSchedulerTest, ExponentialLrMultipliesByGammaEachEpoch) {
  SGD sgd({Param()}, SGDOptions(0.1));
  ExponentialLR scheduler(sgd, /*gamma=*/0.9);
  ExpectRates(Rates(sgd, scheduler, 5), {0.1, 0.09, 0.081, 0.0729, 0.06561});
}

// PyTorch's OneCycleLR by hand, total_steps 10, max_lr 0.1 (initial 0.004, floor 4e-7),
// pct_start 0.3: phase ends at steps 2 and 9 (three_phase: 2, 4 and 9).
double CosAnneal(double start, double end, double pct) {
  return end + (start - end) / 2.0 * (std::cos(M_PI * pct) + 1.0);
}
double LinearAnneal(double start, double end, double pct) { return (end - start) * pct + start; }

TEST(LrSchedulerTest, OneCycleCyclesMomentumInverselyToTheRate) {
  SGD sgd({Param()}, SGDOptions(1.0).momentum(0.5));
  OneCycleLR scheduler(sgd, 0.1, 10);  // cycle_momentum is on by default, as in PyTorch
  std::vector<double> momentum;
  for (int step = 0; step < 10; ++step) {
    if (step > 0) scheduler.step();
    momentum.push_back(sgd.options().momentum());
  }
  ExpectRates(momentum,
              {0.95, 0.9, 0.85, CosAnneal(0.85, 0.95, 1.0 / 7), CosAnneal(0.85, 0.95, 2.0 / 7),
               CosAnneal(0.85, 0.95, 3.0 / 7), CosAnneal(0.85, 0.95, 4.0 / 7),
               CosAnneal(0.85, 0.95, 5.0 / 7), CosAnneal(0.85, 0.95, 6.0 / 7), 0.95});
  // Adam's beta1 cycles; beta2 stays.
  Adam adam({Param()}, AdamOptions(1.0).betas(0.5, 0.99));
  OneCycleLR on_adam(adam, 0.1, 10, OneCycleOptions().base_momentum(0.8).max_momentum(0.9));
  EXPECT_NEAR(std::get<0>(adam.options().betas()), 0.9, 1e-15);
  on_adam.step();
  EXPECT_NEAR(std::get<0>(adam.options().betas()), 0.85, 1e-15);
  EXPECT_EQ(std::get<1>(adam.options().betas()), 0.99);
  // Off: the momentum is left alone.
  SGD plain({Param()}, SGDOptions(1.0).momentum(0.5));
  OneCycleLR without(plain, 0.1, 10, OneCycleOptions().cycle_momentum(false));
  without.step();
  EXPECT_EQ(plain.options().momentum(), 0.5);
}

TEST(LrSchedulerTest, OneCycleAnnealsLinearlyAndInThreePhases) {
  using Anneal = OneCycleOptions::Anneal;
  SGD linear_sgd({Param()}, SGDOptions(1.0));
  OneCycleLR linear(linear_sgd, 0.1, 10, OneCycleOptions().anneal_strategy(Anneal::kLinear));
  const std::vector<double> linear_rates = Rates(linear_sgd, linear, 10);
  ExpectRates(linear_rates, {0.004, 0.052, 0.1, LinearAnneal(0.1, 4e-7, 1.0 / 7),
                             LinearAnneal(0.1, 4e-7, 2.0 / 7), LinearAnneal(0.1, 4e-7, 3.0 / 7),
                             LinearAnneal(0.1, 4e-7, 4.0 / 7), LinearAnneal(0.1, 4e-7, 5.0 / 7),
                             LinearAnneal(0.1, 4e-7, 6.0 / 7), 4e-7});

  SGD sgd({Param()}, SGDOptions(1.0).momentum(0.9));
  OneCycleLR three(sgd, 0.1, 10, OneCycleOptions().three_phase(true));
  std::vector<double> momentum;
  std::vector<double> rates;
  for (int step = 0; step < 10; ++step) {
    if (step > 0) three.step();
    rates.push_back(GroupLr(sgd));
    momentum.push_back(sgd.options().momentum());
  }
  ExpectRates(rates, {0.004, 0.052, 0.1, 0.052, 0.004, CosAnneal(0.004, 4e-7, 0.2),
                      CosAnneal(0.004, 4e-7, 0.4), CosAnneal(0.004, 4e-7, 0.6),
                      CosAnneal(0.004, 4e-7, 0.8), 4e-7});
  ExpectRates(momentum, {0.95, 0.9, 0.85, 0.9, 0.95, 0.95, 0.95, 0.95, 0.95, 0.95});

  SGD other({Param()}, SGDOptions(1.0));
  OneCycleLR three_linear(other, 0.1, 10,
                          OneCycleOptions().three_phase(true).anneal_strategy(Anneal::kLinear));
  const std::vector<double> three_linear_rates = Rates(other, three_linear, 10);
  EXPECT_NEAR(three_linear_rates[3], 0.052, 1e-15);
  EXPECT_NEAR(three_linear_rates[6], LinearAnneal(0.004, 4e-7, 0.4), 1e-15);
  EXPECT_THAT(ErrorOf([&] {
                OneCycleLR(other, 0.1, 10, OneCycleOptions().three_phase(true).pct_start(0.6));
              }),
              HasSubstr("pct_start must be <= 0.5"));
}

TEST(LrSchedulerTest, SequentialLrChainsWarmUpAndCosine) {
  SGD sgd({Param()}, SGDOptions(1.0));
  LinearLR warmup(sgd, /*start_factor=*/0.1, /*end_factor=*/1.0, /*total_iters=*/2);
  CosineAnnealingLR cosine(sgd, /*T_max=*/4);
  SequentialLR schedule(sgd, {&warmup, &cosine}, /*milestones=*/{2});
  // The cosine's base is the group's initial rate (1.0), not what the warm-up left.
  EXPECT_EQ(cosine.base_lrs(), std::vector<double>{1.0});
  const double half_sqrt2 = 0.70710678118654752;
  ExpectRates(Rates(sgd, schedule, 7),
              {0.1, 0.55, 1.0, (1 + half_sqrt2) / 2, 0.5, (1 - half_sqrt2) / 2, 0.0});
}

TEST(LrSchedulerTest, EveryParameterGroupIsScheduledFromItsOwnRate) {
  SGD sgd({ParamGroup({Param()}), ParamGroup({Param()}, SGDOptions(0.01))}, SGDOptions(0.1));
  StepLR scheduler(sgd, /*step_size=*/2, /*gamma=*/0.5);
  scheduler.step();
  scheduler.step();
  EXPECT_NEAR(GroupLr(sgd, 0), 0.05, 1e-15);
  EXPECT_NEAR(GroupLr(sgd, 1), 0.005, 1e-15);
  EXPECT_EQ(scheduler.get_last_lr().size(), 2u);
  EXPECT_NEAR(scheduler.get_last_lr()[1], 0.005, 1e-15);
}

TEST(LrSchedulerTest, ResumesFromItsStateDict) {
  SGD sgd({Param()}, SGDOptions(0.2));
  CosineAnnealingLR scheduler(sgd, 20, 0.01);
  for (int i = 0; i < 7; ++i) scheduler.step();
  const SchedulerState state = scheduler.state_dict();

  SGD other({Param()}, SGDOptions(0.2));
  CosineAnnealingLR resumed(other, 20, 0.01);
  resumed.load_state_dict(state);
  EXPECT_EQ(resumed.last_epoch(), 7);
  EXPECT_EQ(GroupLr(other), GroupLr(sgd));  // set again on load, bit for bit
  for (int i = 0; i < 5; ++i) {
    scheduler.step();
    resumed.step();
    EXPECT_EQ(GroupLr(other), GroupLr(sgd));
  }
}

TEST(LrSchedulerTest, RejectsBadArgumentsAndStates) {
  SGD sgd({Param()}, SGDOptions(0.1));
  EXPECT_THAT(ErrorOf([&] { StepLR(sgd, 0); }), HasSubstr("step_size must be >= 1 but is 0"));
  EXPECT_THAT(ErrorOf([&] { CosineAnnealingLR(sgd, 0); }), HasSubstr("T_max must be >= 1"));
  EXPECT_THAT(ErrorOf([&] { LinearLR(sgd, 0.0); }), HasSubstr("start_factor must be in (0, 1]"));
  EXPECT_THAT(ErrorOf([&] { OneCycleLR(sgd, 0.1, 0); }), HasSubstr("total_steps must be >= 1"));
  EXPECT_THAT(ErrorOf([&] { OneCycleLR(sgd, 0.1, 10, OneCycleOptions().pct_start(1.5)); }),
              HasSubstr("pct_start must be in [0, 1]"));
  StepLR step(sgd, 3);
  EXPECT_THAT(ErrorOf([&] { SequentialLR(sgd, {&step}, {2}); }),
              HasSubstr("expected 0 milestones"));
  SGD other({Param()}, SGDOptions(0.1));
  StepLR elsewhere(other, 3);
  EXPECT_THAT(ErrorOf([&] {
                SequentialLR(sgd, {&step, &elsewhere}, {2});
              }),
              HasSubstr("scheduler 1 (StepLR) is over another optimizer"));

  SchedulerState state = step.state_dict();
  state.erase("base_lrs");
  EXPECT_THAT(ErrorOf([&] { step.load_state_dict(state); }), HasSubstr("base_lrs is missing"));
  SGD two_groups({ParamGroup({Param()}), ParamGroup({Param()})}, SGDOptions(0.1));
  StepLR two(two_groups, 3);
  EXPECT_THAT(ErrorOf([&] { two.load_state_dict(step.state_dict()); }),
              HasSubstr("base_lrs must hold 2 int64"));
  EXPECT_EQ(two.last_epoch(), 0);

  sgd.add_param_group(ParamGroup({Param()}));
  EXPECT_THAT(ErrorOf([&] { step.step(); }),
              HasSubstr("has 2 parameter groups but had 1 when the scheduler was built"));
}

}  // namespace
}  // namespace tandem::nn
