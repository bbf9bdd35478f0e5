// Runs as an MPI job (mpi_test.sh, 2 and 3 ranks). The oracle is the wrapped optimizer alone:
// every rank keeps a twin model stepped by a plain optimizer on the same gradients (as
// DistributedDataParallel leaves them: the same on every rank), and the ZeRO model must equal
// it to the bit after every step.
#include "parallel/distributed/zero_redundancy_optimizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nn/nn.h"
#include "parallel/distributed/distributed_data_parallel.h"
#include "parallel/distributed/mpi_testing.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace tandem::parallel::distributed {
namespace {

using testing::ErrorOf;
using ::testing::HasSubstr;
using testing::MaxAbsDiff;

class ZeroRedundancyOptimizerTest : public MpiTest {};

// Parameters of uneven sizes (105, 15, 45, 3, 33, 11 and 9 elements), in two groups.
std::shared_ptr<nn::Sequential> MakeModel() {
  manual_seed(7);
  return std::make_shared<nn::Sequential>(nn::Linear(7, 15), nn::Linear(15, 3), nn::Linear(3, 11),
                                          nn::Linear(11, 9, /*bias=*/false));
}

std::vector<Tensor> Slice(const std::vector<Tensor>& all, size_t begin, size_t end) {
  return std::vector<Tensor>(all.begin() + begin, all.begin() + end);
}

// The same gradients on every rank and for both twins: a function of the step alone.
void SetGradients(const std::vector<Tensor>& params, uint64_t step) {
  Generator gen(1000 + step);
  for (Tensor p : params) p.set_grad(randn(p.shape(), {}, &gen));
}

void ExpectSameParameters(const nn::Module& got, const nn::Module& want, const std::string& what) {
  const std::vector<Tensor> g = got.parameters(), w = want.parameters();
  ASSERT_EQ(g.size(), w.size());
  for (size_t i = 0; i < g.size(); ++i) {
    ASSERT_EQ(g[i].to_vector<float>(), w[i].to_vector<float>())
        << what << ": parameter " << i << " on rank " << TestGroup()->rank();
  }
}

void ExpectSameState(const nn::OptimizerState& got, const nn::OptimizerState& want) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, value] : want) {
    ASSERT_EQ(got.count(name), 1u) << name;
    const Tensor& other = got.at(name);
    ASSERT_EQ(other.shape(), value.shape()) << name;
    ASSERT_EQ(other.dtype(), value.dtype()) << name;
    EXPECT_EQ(MaxAbsDiff(other.to(kFloat64), value.to(kFloat64)), 0.0) << name;
  }
}

struct Case {
  std::string name;
  OptimizerFactory factory;
  std::function<std::unique_ptr<nn::OptimizerOptions>()>
      second_group_options;  // the head's own options
};

std::vector<Case> Cases() {
  return {
      {"SGD nesterov",
       MakeOptimizerFactory<nn::SGD>(
           nn::SGDOptions(0.05).momentum(0.9).nesterov(true).weight_decay(1e-3)),
       [] { return std::make_unique<nn::SGDOptions>(nn::SGDOptions(0.2).momentum(0.5)); }},
      {"AdamW amsgrad",
       MakeOptimizerFactory<nn::AdamW>(nn::AdamWOptions(1e-2).weight_decay(0.1).amsgrad(true)),
       [] { return std::make_unique<nn::AdamWOptions>(3e-2); }},
      {"RMSprop centered",
       MakeOptimizerFactory<nn::RMSprop>(nn::RMSpropOptions(1e-2).centered(true).momentum(0.9)),
       [] { return std::make_unique<nn::RMSpropOptions>(5e-3); }},
  };
}

// Two groups (the head with its own options) over `model`'s parameters.
std::vector<nn::ParamGroup> Groups(nn::Module& model, const Case& c) {
  const std::vector<Tensor> all = model.parameters();
  nn::ParamGroup head(Slice(all, 4, all.size()));
  head.set_options(c.second_group_options());
  return {nn::ParamGroup(Slice(all, 0, 4)), head};
}

TEST_F(ZeroRedundancyOptimizerTest, EqualsTheWrappedOptimizerWithGroupsSchedulerAndClipping) {
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.name);
    auto model = MakeModel(), twin = MakeModel();
    ZeroRedundancyOptimizer zero(Groups(*model, c), TestGroup(), c.factory);
    std::unique_ptr<nn::Optimizer> plain = c.factory(Groups(*twin, c));
    nn::StepLR zero_schedule(zero, 3, 0.5), plain_schedule(*plain, 3, 0.5);
    for (uint64_t step = 0; step < 10; ++step) {
      SetGradients(model->parameters(), step);
      SetGradients(twin->parameters(), step);
      nn::clip_grad_norm_(model->parameters(), 2.0);
      nn::clip_grad_norm_(twin->parameters(), 2.0);
      zero.step();
      plain->step();
      zero_schedule.step();
      plain_schedule.step();
      ExpectSameParameters(*model, *twin, "step " + std::to_string(step));
      if (HasFailure()) return;
    }
    EXPECT_EQ(zero.param_groups()[1].options().get_lr(),
              plain->param_groups()[1].options().get_lr());
  }
}

TEST_F(ZeroRedundancyOptimizerTest, SharesAreBalancedWithinOneParameterAndStateIsSharded) {
  auto model = MakeModel();
  const std::vector<Tensor> params = model->parameters();
  ZeroRedundancyOptimizer zero(params, TestGroup(),
                               MakeOptimizerFactory<nn::Adam>(nn::AdamOptions(1e-3)));
  const int world = TestGroup()->size(), rank = TestGroup()->rank();
  int64_t largest = 0, owned_here = 0, total = 0;
  std::vector<int64_t> counted(static_cast<size_t>(world), 0);
  for (size_t i = 0; i < params.size(); ++i) {
    ASSERT_GE(zero.owner(i), 0);
    ASSERT_LT(zero.owner(i), world);
    counted[static_cast<size_t>(zero.owner(i))] += params[i].numel();
    largest = std::max(largest, params[i].numel());
    total += params[i].numel();
    if (zero.owner(i) == rank) owned_here += params[i].numel();
  }
  EXPECT_EQ(counted, zero.numel_per_rank());
  const auto [least, most] =
      std::minmax_element(zero.numel_per_rank().begin(), zero.numel_per_rank().end());
  EXPECT_LE(*most - *least, largest);
  EXPECT_EQ(zero.local_optimizer().parameters().size(),
            static_cast<size_t>(std::count_if(params.begin(), params.end(), [&](const Tensor& p) {
              return zero.owner(&p - params.data()) == rank;
            })));
  // The state this rank holds: Adam's two moments of its own share only.
  SetGradients(params, 0);
  zero.step();
  int64_t state_numel = 0;
  for (const auto& [name, value] : zero.local_optimizer().state_dict()) {
    if (name.find("exp_avg") != std::string::npos) state_numel += value.numel();
  }
  EXPECT_EQ(state_numel, 2 * owned_here);
  EXPECT_LT(owned_here, total);
}

TEST_F(ZeroRedundancyOptimizerTest, ConsolidatedStateLoadsIntoThePlainOptimizerAndBack) {
  const Case c = Cases()[1];  // AdamW with amsgrad: four state entries a parameter
  auto model = MakeModel(), twin = MakeModel();
  ZeroRedundancyOptimizer zero(Groups(*model, c), TestGroup(), c.factory);
  std::unique_ptr<nn::Optimizer> plain = c.factory(Groups(*twin, c));
  for (uint64_t step = 0; step < 3; ++step) {
    SetGradients(model->parameters(), step);
    SetGradients(twin->parameters(), step);
    zero.step();
    plain->step();
  }
  EXPECT_THAT(ErrorOf([&] { zero.state_dict(); }), HasSubstr("consolidate_state_dict"));
  const int to = TestGroup()->size() - 1;
  zero.consolidate_state_dict(to);
  if (TestGroup()->rank() == to) {
    ExpectSameState(zero.state_dict(), plain->state_dict());
  } else {
    EXPECT_THAT(ErrorOf([&] { zero.state_dict(); }), HasSubstr("holds no consolidated state"));
  }

  // Plain -> ZeRO: a fresh ZeRO over the twin's parameters takes the plain state, and the two
  // step on together; ZeRO -> plain: a fresh plain optimizer takes the consolidated state.
  auto resumed = MakeModel();
  {
    NoGradGuard no_grad;
    for (size_t i = 0; i < resumed->parameters().size(); ++i) {
      Tensor p = resumed->parameters()[i];
      p.copy_(twin->parameters()[i]);
    }
  }
  ZeroRedundancyOptimizer from_plain(Groups(*resumed, c), TestGroup(), c.factory);
  from_plain.load_state_dict(plain->state_dict());
  for (uint64_t step = 3; step < 6; ++step) {
    SetGradients(resumed->parameters(), step);
    SetGradients(twin->parameters(), step);
    from_plain.step();
    plain->step();
    ExpectSameParameters(*resumed, *twin, "plain -> ZeRO, step " + std::to_string(step));
  }
  from_plain.consolidate_state_dict(0);
  if (TestGroup()->rank() == 0) {
    auto back = MakeModel();
    std::unique_ptr<nn::Optimizer> again = c.factory(Groups(*back, c));
    again->load_state_dict(from_plain.state_dict());
    ExpectSameState(again->state_dict(), plain->state_dict());
  }
}

TEST_F(ZeroRedundancyOptimizerTest, AddParamGroupPlacesTheNewParameters) {
  const Case c = Cases()[0];
  auto model = MakeModel(), twin = MakeModel();
  const std::vector<Tensor> all = model->parameters(), twin_all = twin->parameters();
  ZeroRedundancyOptimizer zero(Slice(all, 0, 2), TestGroup(), c.factory);
  std::unique_ptr<nn::Optimizer> plain = c.factory({nn::ParamGroup(Slice(twin_all, 0, 2))});
  for (uint64_t step = 0; step < 4; ++step) {
    if (step == 2) {
      nn::ParamGroup head(Slice(all, 2, all.size()), nn::SGDOptions(0.1));
      zero.add_param_group(head);
      plain->add_param_group(
          nn::ParamGroup(Slice(twin_all, 2, twin_all.size()), nn::SGDOptions(0.1)));
    }
    SetGradients(all, step);
    SetGradients(twin_all, step);
    zero.step();
    plain->step();
    ExpectSameParameters(*model, *twin, "step " + std::to_string(step));
  }
  EXPECT_EQ(zero.param_groups().size(), 2u);
  int64_t total = 0;
  for (int64_t n : zero.numel_per_rank()) total += n;
  EXPECT_EQ(total, 105 + 15 + 45 + 3 + 33 + 11 + 99);
}

// The real use: under DistributedDataParallel, each rank with its own batch, ZeRO-1 trains as
// DDP with the plain optimizer does, to the bit.
TEST_F(ZeroRedundancyOptimizerTest, UnderDistributedDataParallelTrainsAsThePlainOptimizer) {
  const Case c = Cases()[1];
  auto model = MakeModel(), twin = MakeModel();
  DistributedDataParallel ddp(model, TestGroup()), twin_ddp(twin, TestGroup());
  ZeroRedundancyOptimizer zero(model->parameters(), TestGroup(), c.factory);
  std::unique_ptr<nn::Optimizer> plain = c.factory({nn::ParamGroup(twin->parameters())});
  for (uint64_t step = 0; step < 5; ++step) {
    Generator gen(50 + step * 10 + static_cast<uint64_t>(TestGroup()->rank()));
    const Tensor x = randn({4, 7}, {}, &gen);
    square(ddp.forward(x)).mean().backward();
    square(twin_ddp.forward(x)).mean().backward();
    zero.step();
    plain->step();
    zero.zero_grad();
    plain->zero_grad();
    ExpectSameParameters(*model, *twin, "step " + std::to_string(step));
  }
}

TEST_F(ZeroRedundancyOptimizerTest, BadArgumentsSayWhatIsExpected) {
  auto model = MakeModel();
  const OptimizerFactory sgd = MakeOptimizerFactory<nn::SGD>(nn::SGDOptions(0.1));
  EXPECT_THAT(ErrorOf([&] { ZeroRedundancyOptimizer(model->parameters(), nullptr, sgd); }),
              HasSubstr("null process group"));
  EXPECT_THAT(ErrorOf([&] {
                ZeroRedundancyOptimizer(model->parameters(), TestGroup(), OptimizerFactory());
              }),
              HasSubstr("MakeOptimizerFactory"));
  EXPECT_THAT(ErrorOf([&] { ZeroRedundancyOptimizer(std::vector<Tensor>{}, TestGroup(), sgd); }),
              HasSubstr("empty parameter list"));
  // Options of another optimizer's kind are refused by the wrapped optimizer's own check.
  ZeroRedundancyOptimizer zero(model->parameters(), TestGroup(), sgd);
  EXPECT_THAT(ErrorOf([&] {
                zero.add_param_group(
                    nn::ParamGroup({randn({2}).set_requires_grad(true)}, nn::AdamOptions(1e-3)));
              }),
              HasSubstr("SGDOptions"));
  EXPECT_THAT(ErrorOf([&] {
                zero.load_state_dict({{"state.99.momentum_buffer", zeros({2})}});
              }),
              HasSubstr("has 7 parameters"));
  EXPECT_THAT(ErrorOf([&] {
                zero.load_state_dict({{"momentum", zeros({2})}});
              }),
              HasSubstr("state.<parameter index>.<field>"));
  EXPECT_THAT(ErrorOf([&] { zero.consolidate_state_dict(TestGroup()->size()); }),
              HasSubstr("names no rank"));
}

}  // namespace
}  // namespace tandem::parallel::distributed
