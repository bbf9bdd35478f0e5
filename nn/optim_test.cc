#include "nn/optim.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "nn/layers.h"
#include "nn/test_util.h"
#include "tensor/kernels/vectorized.h"
#include "tensor/runtime/devices.h"
#include "tensor/runtime/profiler.h"

namespace tandem::nn {
namespace {

using testing::ErrorOf;
using ::testing::HasSubstr;

// The problem: L(w) = sum_i 0.5 * c_i * (w_i - t_i)^2, so dL/dw_i = c_i * (w_i - t_i).
const std::vector<double> kStart = {1.0, -2.0, 0.5, 3.0};
const std::vector<double> kCurvature = {1.0, 0.5, 2.0, 0.25};
const std::vector<double> kTarget = {0.0, 1.0, -1.0, 2.0};

Tensor AsTensor(const std::vector<double>& values, Device device = Device::Cpu(0)) {
  return from_vector(std::vector<float>(values.begin(), values.end()),
                     {static_cast<int64_t>(values.size())}, device);
}

Tensor Loss(const Tensor& w) {
  const Device d = w.device();
  return (0.5 * AsTensor(kCurvature, d) * square(w - AsTensor(kTarget, d))).sum();
}

std::vector<double> Gradient(const std::vector<double>& w) {
  std::vector<double> g(w.size());
  for (size_t i = 0; i < w.size(); ++i) g[i] = kCurvature[i] * (w[i] - kTarget[i]);
  return g;
}

// PyTorch's SGD, element by element, in double precision.
struct ReferenceSgd {
  SGDOptions o;
  std::vector<double> buffer;
  void Step(std::vector<double>& w) {
    std::vector<double> g = Gradient(w);
    for (size_t i = 0; i < w.size(); ++i) {
      if (o.maximize()) g[i] = -g[i];
      g[i] += o.weight_decay() * w[i];
      if (o.momentum() != 0.0) {
        if (buffer.size() < w.size()) buffer.resize(w.size(), NAN);
        buffer[i] =
            std::isnan(buffer[i]) ? g[i] : o.momentum() * buffer[i] + (1.0 - o.dampening()) * g[i];
        g[i] = o.nesterov() ? g[i] + o.momentum() * buffer[i] : buffer[i];
      }
      w[i] -= o.lr() * g[i];
    }
  }
};

// PyTorch's Adam, element by element, in double precision.
struct ReferenceAdam {
  AdamOptions o;
  std::vector<double> m = std::vector<double>(kStart.size(), 0.0);
  std::vector<double> v = std::vector<double>(kStart.size(), 0.0);
  std::vector<double> v_max = std::vector<double>(kStart.size(), 0.0);
  int t = 0;
  void Step(std::vector<double>& w) {
    std::vector<double> g = Gradient(w);
    ++t;
    for (size_t i = 0; i < w.size(); ++i) {
      if (o.maximize()) g[i] = -g[i];
      g[i] += o.weight_decay() * w[i];
      m[i] = std::get<0>(o.betas()) * m[i] + (1.0 - std::get<0>(o.betas())) * g[i];
      v[i] = std::get<1>(o.betas()) * v[i] + (1.0 - std::get<1>(o.betas())) * g[i] * g[i];
      v_max[i] = std::max(v_max[i], v[i]);
      const double m_hat = m[i] / (1.0 - std::pow(std::get<0>(o.betas()), t));
      const double v_hat =
          (o.amsgrad() ? v_max[i] : v[i]) / (1.0 - std::pow(std::get<1>(o.betas()), t));
      w[i] -= o.lr() * m_hat / (std::sqrt(v_hat) + o.eps());
    }
  }
};

// PyTorch's AdamW, element by element, in double precision.
struct ReferenceAdamW {
  AdamWOptions o;
  std::vector<double> m = std::vector<double>(kStart.size(), 0.0);
  std::vector<double> v = std::vector<double>(kStart.size(), 0.0);
  std::vector<double> v_max = std::vector<double>(kStart.size(), 0.0);
  int t = 0;
  void Step(std::vector<double>& w) {
    std::vector<double> g = Gradient(w);
    ++t;
    for (size_t i = 0; i < w.size(); ++i) {
      if (o.maximize()) g[i] = -g[i];
      w[i] *= 1.0 - o.lr() * o.weight_decay();
      m[i] = std::get<0>(o.betas()) * m[i] + (1.0 - std::get<0>(o.betas())) * g[i];
      v[i] = std::get<1>(o.betas()) * v[i] + (1.0 - std::get<1>(o.betas())) * g[i] * g[i];
      v_max[i] = std::max(v_max[i], v[i]);
      const double m_hat = m[i] / (1.0 - std::pow(std::get<0>(o.betas()), t));
      const double v_hat =
          (o.amsgrad() ? v_max[i] : v[i]) / (1.0 - std::pow(std::get<1>(o.betas()), t));
      w[i] -= o.lr() * m_hat / (std::sqrt(v_hat) + o.eps());
    }
  }
};

// PyTorch's RMSprop, element by element, in double precision.
struct ReferenceRmsprop {
  RMSpropOptions o;
  std::vector<double> v = std::vector<double>(kStart.size(), 0.0);
  std::vector<double> a = std::vector<double>(kStart.size(), 0.0);
  std::vector<double> b = std::vector<double>(kStart.size(), 0.0);
  void Step(std::vector<double>& w) {
    std::vector<double> g = Gradient(w);
    for (size_t i = 0; i < w.size(); ++i) {
      if (o.maximize()) g[i] = -g[i];
      g[i] += o.weight_decay() * w[i];
      v[i] = o.alpha() * v[i] + (1.0 - o.alpha()) * g[i] * g[i];
      double avg;
      if (o.centered()) {
        a[i] = o.alpha() * a[i] + (1.0 - o.alpha()) * g[i];
        avg = std::sqrt(v[i] - a[i] * a[i]) + o.eps();
      } else {
        avg = std::sqrt(v[i]) + o.eps();
      }
      if (o.momentum() > 0.0) {
        b[i] = o.momentum() * b[i] + g[i] / avg;
        w[i] -= o.lr() * b[i];
      } else {
        w[i] -= o.lr() * g[i] / avg;
      }
    }
  }
};

// Runs `steps` steps of `optimizer` on the problem and of `reference` on a double copy,
// comparing after every step.
template <typename Reference>
void ExpectSameTrajectory(Optimizer& optimizer, Reference reference, int steps,
                          double tolerance = 2e-5) {
  Tensor w = optimizer.parameters()[0];
  std::vector<double> expected = kStart;
  for (int step = 1; step <= steps; ++step) {
    optimizer.zero_grad();
    Loss(w).backward();
    optimizer.step();
    reference.Step(expected);
    const std::vector<float> actual = w.to(Device::Cpu(0)).to_vector<float>();
    for (size_t i = 0; i < expected.size(); ++i) {
      ASSERT_NEAR(actual[i], expected[i], tolerance * (1.0 + std::abs(expected[i])))
          << "step " << step << ", element " << i;
    }
  }
}

Tensor StartingPoint(Device device = Device::Cpu(0)) {
  Tensor w = AsTensor(kStart, device);
  w.set_requires_grad(true);
  return w;
}

class OptimTest : public ::testing::Test {
 protected:
  void SetUp() override { SetCpuDeviceCount(2); }
};

TEST_F(OptimTest, PlainSgdFollowsTheClosedForm) {
  // With g = c (w - t), one step maps w - t to (1 - lr c)(w - t).
  const double lr = 0.1;
  Tensor w = StartingPoint();
  SGD sgd({w}, SGDOptions(lr));
  const int steps = 5;
  for (int k = 0; k < steps; ++k) {
    sgd.zero_grad();
    Loss(w).backward();
    sgd.step();
  }
  const std::vector<float> actual = w.to_vector<float>();
  for (size_t i = 0; i < kStart.size(); ++i) {
    const double expected =
        kTarget[i] + std::pow(1.0 - lr * kCurvature[i], steps) * (kStart[i] - kTarget[i]);
    EXPECT_NEAR(actual[i], expected, 1e-5);
  }
}

TEST_F(OptimTest, SgdVariantsMatchPyTorchsRule) {
  for (const SGDOptions& options :
       {SGDOptions(0.1), SGDOptions(0.05).momentum(0.9),
        SGDOptions(0.05).momentum(0.8).dampening(0.5),
        SGDOptions(0.05).momentum(0.9).nesterov(true), SGDOptions(0.1).weight_decay(0.1),
        SGDOptions(0.05).momentum(0.9).weight_decay(0.01)}) {
    SCOPED_TRACE(::testing::Message() << "momentum " << options.momentum() << " dampening "
                                      << options.dampening() << " nesterov " << options.nesterov()
                                      << " weight_decay " << options.weight_decay());
    SGD sgd({StartingPoint()}, options);
    ExpectSameTrajectory(sgd, ReferenceSgd{options, {}}, 6);
  }
}

TEST_F(OptimTest, AdamFirstStepMovesEachParameterByTheLearningRate) {
  // m_hat = g and v_hat = g^2 after one step, so the step is lr * g / (|g| + eps).
  const double lr = 0.01;
  Tensor w = StartingPoint();
  Adam adam({w}, AdamOptions(lr));
  Loss(w).backward();
  adam.step();
  const std::vector<float> actual = w.to_vector<float>();
  const std::vector<double> g = Gradient(kStart);
  for (size_t i = 0; i < kStart.size(); ++i) {
    EXPECT_NEAR(actual[i], kStart[i] - lr * (g[i] > 0 ? 1.0 : -1.0), 1e-6);
  }
  EXPECT_EQ(adam.step_count(0), 1);
}

TEST_F(OptimTest, AdamMatchesPyTorchsRule) {
  for (const AdamOptions& options :
       {AdamOptions(0.1), AdamOptions(0.05).betas(0.8, 0.99), AdamOptions(0.05).eps(1e-3),
        AdamOptions(0.1).weight_decay(0.1)}) {
    SCOPED_TRACE(::testing::Message()
                 << "betas " << std::get<0>(options.betas()) << ", " << std::get<1>(options.betas())
                 << " eps " << options.eps() << " weight_decay " << options.weight_decay());
    Adam adam({StartingPoint()}, options);
    ExpectSameTrajectory(adam, ReferenceAdam{options}, 8);
  }
}

TEST_F(OptimTest, ParametersWithoutGradientsAreLeftAlone) {
  Tensor used = StartingPoint(), unused = ones({2}, TensorOptions().requires_grad(true));
  Adam adam({used, unused}, AdamOptions(0.1));
  SGD sgd({used, unused}, SGDOptions(0.1).momentum(0.9));
  Loss(used).backward();
  adam.step();
  sgd.step();
  EXPECT_EQ(unused.to_vector<float>(), std::vector<float>(2, 1.0f));
  EXPECT_EQ(adam.step_count(1), 0);
  EXPECT_FALSE(sgd.momentum_buffer(1).defined());
  EXPECT_TRUE(sgd.momentum_buffer(0).defined());
}

TEST_F(OptimTest, ZeroGradClearsOrZeroes) {
  Tensor w = StartingPoint();
  SGD sgd({w}, SGDOptions(0.1));
  Loss(w).backward();
  sgd.zero_grad(/*set_to_none=*/false);
  EXPECT_EQ(w.grad().to_vector<float>(), std::vector<float>(4, 0.0f));
  sgd.zero_grad();
  EXPECT_FALSE(w.grad().defined());
}

TEST_F(OptimTest, WorksOnAnotherDevice) {
  SGD sgd({StartingPoint(Device::Cpu(1))}, SGDOptions(0.05).momentum(0.9));
  ExpectSameTrajectory(sgd, ReferenceSgd{SGDOptions(0.05).momentum(0.9), {}}, 3);
  EXPECT_EQ(sgd.parameters()[0].device(), Device::Cpu(1));
}

TEST_F(OptimTest, CudaMatchesTheReference) {
  TANDEM_SKIP_WITHOUT_CUDA();
  SGD sgd({StartingPoint(Device::Cuda(0))}, SGDOptions(0.05).momentum(0.9).nesterov(true));
  ExpectSameTrajectory(sgd, ReferenceSgd{SGDOptions(0.05).momentum(0.9).nesterov(true), {}}, 4);
  Adam adam({StartingPoint(Device::Cuda(0))}, AdamOptions(0.1).weight_decay(0.01));
  ExpectSameTrajectory(adam, ReferenceAdam{AdamOptions(0.1).weight_decay(0.01)}, 4);
}

TEST_F(OptimTest, RejectsBadParametersAndOptions) {
  EXPECT_THAT(ErrorOf([] { SGD(std::vector<Tensor>{}, SGDOptions(0.1)); }),
              HasSubstr("empty parameter list"));
  Tensor leaf = StartingPoint();
  EXPECT_THAT(ErrorOf([&] { SGD({leaf * 2.0}, SGDOptions(0.1)); }),
              HasSubstr("parameter 0 ([4]) is not a leaf"));
  EXPECT_THAT(ErrorOf([&] { SGD({leaf}, SGDOptions(0.1).nesterov(true)); }),
              HasSubstr("Nesterov momentum needs momentum > 0 and dampening 0"));
  EXPECT_THAT(ErrorOf([&] { SGD({leaf}, SGDOptions(-1.0)); }),
              HasSubstr("learning rate must be >= 0"));
  EXPECT_THAT(ErrorOf([&] { Adam({leaf}, AdamOptions().betas(0.9, 1.0)); }),
              HasSubstr("betas must be in [0, 1)"));
  EXPECT_THAT(ErrorOf([&] { Adam({zeros({2}, kInt64)}); }),
              HasSubstr("only floating-point tensors (float32, float64) can be optimized"));
}

TEST_F(OptimTest, TrainsAModulesParameters) {
  // One step of SGD on a Linear layer moves its weight by -lr * dL/dW.
  manual_seed(1);
  Linear layer(3, 2);
  const Tensor before = layer.weight().clone();
  SGD sgd(layer.parameters(), SGDOptions(0.5));
  Tensor x = randn({4, 3});
  layer.forward(x).sum().backward();
  const Tensor grad = layer.weight().grad().clone();
  sgd.step();
  EXPECT_TRUE(allclose(layer.weight(), before - grad * 0.5, 1e-5, 1e-6));
}

// Steps `optimizer` (over one parameter, w) `steps` times on the problem.
void Steps(Optimizer& optimizer, int steps) {
  for (int step = 0; step < steps; ++step) {
    optimizer.zero_grad();
    Loss(optimizer.parameters()[0]).backward();
    optimizer.step();
  }
}

std::vector<float> Values(const Tensor& t) { return t.to(Device::Cpu(0)).to_vector<float>(); }
std::vector<int64_t> Int64Values(const Tensor& t) {
  return t.to(Device::Cpu(0)).reshape({t.numel()}).to_vector<int64_t>();
}

// An optimizer restored from another's state_dict (over a copy of its parameter) continues
// bit for bit as the original does.
template <typename Make>
void ExpectResumesExactly(Make make, const std::vector<std::string>& expected_names) {
  Tensor w = StartingPoint();
  auto original = make(w);
  Steps(*original, 3);
  const OptimizerState state = original->state_dict();
  std::vector<std::string> names;
  for (const auto& entry : state) names.push_back(entry.first);
  EXPECT_EQ(names, expected_names);

  Tensor copy = w.detach().clone();
  copy.set_requires_grad(true);
  auto resumed = make(copy);
  resumed->load_state_dict(state);
  Steps(*original, 4);  // the state taken before is a copy: it does not move with these
  Steps(*resumed, 4);
  EXPECT_EQ(Values(w), Values(copy));
  const OptimizerState expected = original->state_dict();
  for (const auto& [name, value] : resumed->state_dict()) {
    const Tensor& other = expected.at(name);
    if (value.dtype() == kInt64) {
      EXPECT_EQ(Int64Values(value), Int64Values(other)) << name;
    } else {
      EXPECT_EQ(Values(value), Values(other)) << name;
    }
  }
}

TEST_F(OptimTest, SgdResumesExactlyFromItsStateDict) {
  ExpectResumesExactly(
      [](Tensor w) {
        return std::make_unique<SGD>(std::vector<Tensor>{w}, SGDOptions(0.1).momentum(0.9));
      },
      {"state.0.momentum_buffer"});
}

TEST_F(OptimTest, AdamResumesExactlyFromItsStateDict) {
  ExpectResumesExactly(
      [](Tensor w) { return std::make_unique<Adam>(std::vector<Tensor>{w}, AdamOptions(0.1)); },
      {"state.0.exp_avg", "state.0.exp_avg_sq", "state.0.step"});
}

TEST_F(OptimTest, StateDictIsEmptyBeforeTheFirstStepAndLoadsOntoTheParametersDevice) {
  Tensor w = StartingPoint();
  SGD sgd({w}, SGDOptions(0.1).momentum(0.9));
  EXPECT_TRUE(sgd.state_dict().empty());
  Steps(sgd, 1);
  Tensor other = StartingPoint(Device::Cpu(1));
  SGD on_cpu1({other}, SGDOptions(0.1).momentum(0.9));
  on_cpu1.load_state_dict(sgd.state_dict());
  EXPECT_EQ(on_cpu1.momentum_buffer(0).device(), Device::Cpu(1));
  EXPECT_EQ(Values(on_cpu1.momentum_buffer(0)), Values(sgd.momentum_buffer(0)));
}

TEST_F(OptimTest, LoadStateDictRejectsMismatchesAndChangesNothing) {
  Tensor w = StartingPoint();
  SGD sgd({w}, SGDOptions(0.1).momentum(0.9));
  Adam adam({StartingPoint()}, AdamOptions(0.1));
  Steps(sgd, 1);
  Steps(adam, 1);
  const std::vector<float> buffer = Values(sgd.momentum_buffer(0));

  EXPECT_THAT(ErrorOf([&] { sgd.load_state_dict(adam.state_dict()); }),
              HasSubstr("unknown entry 'state.0.exp_avg'"));
  EXPECT_THAT(ErrorOf([&] { adam.load_state_dict(sgd.state_dict()); }),
              HasSubstr("another kind of optimizer"));
  EXPECT_THAT(ErrorOf([&] {
                sgd.load_state_dict({{"state.1.momentum_buffer", zeros({4})}});
              }),
              HasSubstr("is for parameter 1 but this optimizer has 1 parameters"));
  EXPECT_THAT(
      ErrorOf([&] {
        sgd.load_state_dict({{"state.0.momentum_buffer", zeros({5})}});
      }),
      HasSubstr("must be float32 of shape [4] (parameter 0's) but is float32 of shape [5]"));
  EXPECT_THAT(ErrorOf([&] {
                sgd.load_state_dict({{"state.x.momentum_buffer", zeros({4})}});
              }),
              HasSubstr("malformed entry"));
  EXPECT_THAT(ErrorOf([&] {
                sgd.load_state_dict({{"momentum", zeros({4})}});
              }),
              HasSubstr("expected \"state.<parameter index>.<field>\""));
  OptimizerState partial = adam.state_dict();
  partial.erase("state.0.step");
  EXPECT_THAT(ErrorOf([&] { adam.load_state_dict(partial); }),
              HasSubstr("only some of exp_avg, exp_avg_sq and step"));
  EXPECT_EQ(Values(sgd.momentum_buffer(0)), buffer);
  EXPECT_EQ(adam.step_count(0), 1);
}

TEST_F(OptimTest, AdamWDecouplesWeightDecay) {
  EXPECT_EQ(AdamWOptions().weight_decay(), 1e-2);  // PyTorch's default
  for (const AdamWOptions& options :
       {AdamWOptions(0.1), AdamWOptions(0.05).weight_decay(0.1).betas(0.8, 0.99),
        AdamWOptions(0.05).eps(1e-3).weight_decay(0.0)}) {
    SCOPED_TRACE(::testing::Message() << "weight_decay " << options.weight_decay());
    AdamW adamw({StartingPoint()}, options);
    ExpectSameTrajectory(adamw, ReferenceAdamW{options}, 8);
  }
  // With a zero gradient only the decay moves a parameter: p * (1 - lr * weight_decay).
  Tensor w = StartingPoint();
  AdamW adamw({w}, AdamWOptions(0.1).weight_decay(0.5));
  (w * 0.0).sum().backward();
  adamw.step();
  const std::vector<float> actual = w.to_vector<float>();
  for (size_t i = 0; i < kStart.size(); ++i) EXPECT_NEAR(actual[i], kStart[i] * 0.95, 1e-6);
}

TEST_F(OptimTest, RmspropMatchesPyTorchsRule) {
  EXPECT_EQ(RMSpropOptions().lr(), 1e-2);  // PyTorch's defaults
  EXPECT_EQ(RMSpropOptions().alpha(), 0.99);
  for (const RMSpropOptions& options :
       {RMSpropOptions(0.01), RMSpropOptions(0.01).alpha(0.9).eps(1e-4),
        RMSpropOptions(0.01).momentum(0.9), RMSpropOptions(0.01).centered(true),
        RMSpropOptions(0.005).centered(true).momentum(0.5).weight_decay(0.1)}) {
    SCOPED_TRACE(::testing::Message() << "alpha " << options.alpha() << " momentum "
                                      << options.momentum() << " centered " << options.centered()
                                      << " weight_decay " << options.weight_decay());
    RMSprop rmsprop({StartingPoint()}, options);
    ExpectSameTrajectory(rmsprop, ReferenceRmsprop{options}, 8, 5e-5);
  }
  // First step without momentum: v = (1 - alpha) g^2, so p moves by lr / sqrt(1 - alpha).
  Tensor w = StartingPoint();
  RMSprop rmsprop({w}, RMSpropOptions(0.01).alpha(0.96).eps(0.0));
  Loss(w).backward();
  rmsprop.step();
  const std::vector<double> g = Gradient(kStart);
  const std::vector<float> actual = w.to_vector<float>();
  for (size_t i = 0; i < kStart.size(); ++i) {
    EXPECT_NEAR(actual[i], kStart[i] - 0.05 * (g[i] > 0 ? 1.0 : -1.0), 1e-6);
  }
}

TEST_F(OptimTest, ParameterGroupsHaveTheirOwnOptions) {
  Tensor a = StartingPoint(), b = StartingPoint();
  const SGDOptions defaults = SGDOptions(0.1).momentum(0.9);
  const SGDOptions own = SGDOptions(0.02).weight_decay(0.1);
  SGD sgd({ParamGroup({a}), ParamGroup({b}, own)}, defaults);
  ASSERT_EQ(sgd.param_groups().size(), 2u);
  EXPECT_EQ(sgd.param_groups()[0].options().get_lr(), 0.1);
  EXPECT_EQ(sgd.param_groups()[1].options().get_lr(), 0.02);
  EXPECT_EQ(sgd.parameters().size(), 2u);
  ReferenceSgd ref_a{defaults, {}}, ref_b{own, {}};
  std::vector<double> expected_a = kStart, expected_b = kStart;
  for (int step = 0; step < 4; ++step) {
    sgd.zero_grad();
    (Loss(a) + Loss(b)).backward();
    sgd.step();
    ref_a.Step(expected_a);
    ref_b.Step(expected_b);
  }
  for (size_t i = 0; i < kStart.size(); ++i) {
    EXPECT_NEAR(a.to_vector<float>()[i], expected_a[i], 1e-5);
    EXPECT_NEAR(b.to_vector<float>()[i], expected_b[i], 1e-5);
  }
  // Writing a group's learning rate changes that group's next step only.
  sgd.param_groups()[1].options().set_lr(0.0);
  const std::vector<float> b_before = b.to_vector<float>(), a_before = a.to_vector<float>();
  sgd.zero_grad();
  (Loss(a) + Loss(b)).backward();
  sgd.step();
  EXPECT_EQ(b.to_vector<float>(), b_before);
  EXPECT_NE(a.to_vector<float>(), a_before);
}

TEST_F(OptimTest, AddParamGroupTakesTheDefaultsAndNumbersItsParametersAfterTheOthers) {
  Tensor a = StartingPoint(), b = StartingPoint();
  Adam adam({a}, AdamOptions(0.1).betas(0.8, 0.9));
  adam.add_param_group(ParamGroup({b}));
  ASSERT_EQ(adam.param_groups().size(), 2u);
  const auto& options = static_cast<const AdamOptions&>(adam.param_groups()[1].options());
  EXPECT_EQ(options.lr(), 0.1);
  EXPECT_EQ(std::get<0>(options.betas()), 0.8);
  adam.param_groups()[0].options().set_lr(0.5);  // groups own their options
  EXPECT_EQ(adam.param_groups()[1].options().get_lr(), 0.1);
  EXPECT_EQ(adam.defaults().get_lr(), 0.1);
  Loss(b).backward();
  adam.step();
  EXPECT_EQ(adam.step_count(1), 1);
  EXPECT_EQ(adam.step_count(0), 0);
  std::vector<std::string> names;
  for (const auto& entry : adam.state_dict()) names.push_back(entry.first);
  EXPECT_EQ(names,
            (std::vector<std::string>{"state.1.exp_avg", "state.1.exp_avg_sq", "state.1.step"}));
}

TEST_F(OptimTest, ParameterGroupsRejectDuplicatesAndOptionsOfAnotherKind) {
  Tensor a = StartingPoint(), b = StartingPoint();
  SGD sgd({a}, SGDOptions(0.1));
  EXPECT_THAT(ErrorOf([&] {
                sgd.add_param_group(ParamGroup({b, a}));
              }),
              HasSubstr("parameter 2 ([4]) of group 1 appears more than once"));
  EXPECT_EQ(sgd.param_groups().size(), 1u);  // nothing added
  EXPECT_EQ(sgd.parameters().size(), 1u);
  EXPECT_THAT(ErrorOf([&] { sgd.add_param_group(ParamGroup({b}, AdamOptions(0.1))); }),
              HasSubstr("options must be nn::SGDOptions"));
  EXPECT_THAT(ErrorOf([&] { sgd.add_param_group(ParamGroup({b}, SGDOptions(-0.1))); }),
              HasSubstr("learning rate must be >= 0"));
  EXPECT_THAT(ErrorOf([&] { AdamW({ParamGroup({a}, AdamOptions())}, AdamWOptions()); }),
              HasSubstr("options must be nn::AdamWOptions"));
  EXPECT_THAT(ErrorOf([&] { RMSprop({a}, RMSpropOptions().alpha(-1)); }),
              HasSubstr("alpha must be >= 0"));
  EXPECT_THAT(ErrorOf([&] { SGD(std::vector<ParamGroup>{}, SGDOptions(0.1)); }),
              HasSubstr("no parameter groups"));
  EXPECT_THAT(ErrorOf([&] { ParamGroup({a}).options(); }), HasSubstr("no options of its own"));
}

// A large parameter set on the CPU takes the fused update split over the CPU devices' workers;
// it must give PyTorch's result, and the same bits whatever the number of devices and whether
// the AVX2 or the baseline build of the loops runs. A strided (non-contiguous) parameter takes
// the tensor-op path and must agree too.
template <typename Make>
void ExpectFusedUpdatesMatchAndDoNotDependOnTheSplit(Make make) {
  std::vector<std::vector<float>> results;
  for (int run = 0; run < 4; ++run) {
    const int devices = run < 3 ? run + 1 : 2;
    const ::tandem::vec::BaselineVectorsForTesting vectors(run == 3);
    SetCpuDeviceCount(devices);
    manual_seed(7);
    // Sizes around the piece size (2^14) and odd ones, so pieces split parameters unevenly.
    std::vector<Tensor> params, coefs;
    for (int64_t n : {int64_t{40000}, int64_t{16384}, int64_t{3}, int64_t{20001}}) {
      Tensor p = randn({n});
      p.set_requires_grad(true);
      params.push_back(p);
      coefs.push_back(rand({n}) + 0.5);  // no cancellation in g + wd p
    }
    auto optimizer = make(params);
    for (int step = 0; step < 3; ++step) {
      optimizer->zero_grad();
      Tensor loss = zeros({});
      for (size_t k = 0; k < params.size(); ++k) {
        loss = loss + (coefs[k] * square(params[k])).sum();  // g = 2 c p
      }
      loss.backward();
      optimizer->step();
    }
    std::vector<float> all;
    for (const Tensor& p : params) {
      const std::vector<float> v = p.to_vector<float>();
      all.insert(all.end(), v.begin(), v.end());
    }
    results.push_back(all);

    // The same updates on strided copies (the tensor-op path).
    manual_seed(7);
    std::vector<Tensor> strided;
    std::vector<Tensor> strided_coefs;
    for (int64_t n : {int64_t{40000}, int64_t{16384}, int64_t{3}, int64_t{20001}}) {
      Tensor p = randn({n}).reshape({n, 1}).expand({n, 2}).detach().clone();
      Tensor column = p.narrow(1, 0, 1).detach();
      column.set_requires_grad(true);
      ASSERT_FALSE(column.is_contiguous());
      strided.push_back(column);
      strided_coefs.push_back((rand({n}) + 0.5).reshape({n, 1}));
    }
    auto reference = make(strided);
    for (int step = 0; step < 3; ++step) {
      reference->zero_grad();
      Tensor loss = zeros({});
      for (size_t k = 0; k < strided.size(); ++k) {
        loss = loss + (strided_coefs[k] * square(strided[k])).sum();
      }
      loss.backward();
      reference->step();
    }
    size_t offset = 0;
    for (const Tensor& p : strided) {
      const std::vector<float> v = p.contiguous().reshape({-1}).to_vector<float>();
      for (size_t j = 0; j < v.size(); ++j) {
        ASSERT_NEAR(all[offset + j], v[j], 1e-5 * (1.0 + std::abs(v[j])))
            << devices << " CPU devices, element " << offset + j;
      }
      offset += v.size();
    }
  }
  SetCpuDeviceCount(2);
  EXPECT_EQ(results[0], results[1]);
  EXPECT_EQ(results[0], results[2]);
  EXPECT_EQ(results[0], results[3]) << "the baseline loops give other bits than the AVX2 ones";
}

TEST_F(OptimTest, AnUpdateNarrowedToOneDeviceRunsOnTheCallingThreadAlone) {
  SetCpuDeviceCount(2);
  Tensor p = randn({100000});
  p.set_requires_grad(true);
  (p * p).sum().backward();
  SGD sgd({p}, SGDOptions(0.01).momentum(0.9));
  sgd.step();  // the momentum buffer exists from here on
  profiler::Start();
  {
    CpuWorkDevicesScope one_device({Device::Cpu(0)});
    EXPECT_EQ(CpuWorkDevices(), std::vector<Device>{Device::Cpu(0)});
    sgd.step();
  }
  const profiler::Trace trace = profiler::Stop();
  EXPECT_EQ(CpuWorkDevices(), CpuDevices(2));
  ASSERT_FALSE(trace.events.empty());
  for (const profiler::Event& e : trace.events) {
    EXPECT_EQ(trace.thread_names.at(e.thread), "main") << e.name << " ran on another thread";
  }
  EXPECT_THAT(testing::ErrorOf([] { CpuWorkDevicesScope none({}); }),
              HasSubstr("expected at least one CPU device"));
  EXPECT_THAT(testing::ErrorOf([] { CpuWorkDevicesScope gpu({Device::Cuda(0)}); }),
              HasSubstr("expected CPU devices but got cuda:0"));
}

TEST_F(OptimTest, FusedSgdSplitsAcrossDevicesWithTheSameResult) {
  ExpectFusedUpdatesMatchAndDoNotDependOnTheSplit([](std::vector<Tensor> params) {
    return std::make_unique<SGD>(std::move(params), SGDOptions(0.01).momentum(0.9));
  });
  ExpectFusedUpdatesMatchAndDoNotDependOnTheSplit([](std::vector<Tensor> params) {
    return std::make_unique<SGD>(std::move(params),
                                 SGDOptions(0.01).momentum(0.9).nesterov(true).weight_decay(0.1));
  });
  ExpectFusedUpdatesMatchAndDoNotDependOnTheSplit([](std::vector<Tensor> params) {
    return std::make_unique<SGD>(std::move(params), SGDOptions(0.01).momentum(0.5).dampening(0.3));
  });
}

TEST_F(OptimTest, FusedAdamAdamWAndRmspropSplitAcrossDevicesWithTheSameResult) {
  ExpectFusedUpdatesMatchAndDoNotDependOnTheSplit([](std::vector<Tensor> params) {
    return std::make_unique<Adam>(std::move(params), AdamOptions(0.01).weight_decay(0.1));
  });
  ExpectFusedUpdatesMatchAndDoNotDependOnTheSplit([](std::vector<Tensor> params) {
    return std::make_unique<AdamW>(std::move(params), AdamWOptions(0.01));
  });
  ExpectFusedUpdatesMatchAndDoNotDependOnTheSplit([](std::vector<Tensor> params) {
    return std::make_unique<RMSprop>(
        std::move(params), RMSpropOptions(0.001).momentum(0.9).centered(true).weight_decay(0.1));
  });
  ExpectFusedUpdatesMatchAndDoNotDependOnTheSplit([](std::vector<Tensor> params) {
    return std::make_unique<RMSprop>(std::move(params), RMSpropOptions(0.001));
  });
}

// maximize follows -g: on L it climbs, so it is PyTorch's rule with the gradient negated.
TEST_F(OptimTest, MaximizeAscendsWithEveryOptimizer) {
  for (const SGDOptions& options :
       {SGDOptions(0.05).maximize(true), SGDOptions(0.05).momentum(0.9).maximize(true),
        SGDOptions(0.05).momentum(0.9).nesterov(true).weight_decay(0.1).maximize(true)}) {
    SGD sgd({StartingPoint()}, options);
    ExpectSameTrajectory(sgd, ReferenceSgd{options, {}}, 6);
  }
  for (const AdamOptions& options :
       {AdamOptions(0.05).maximize(true), AdamOptions(0.05).weight_decay(0.1).maximize(true),
        AdamOptions(0.05).amsgrad(true).maximize(true)}) {
    Adam adam({StartingPoint()}, options);
    ExpectSameTrajectory(adam, ReferenceAdam{options}, 8);
  }
  const AdamWOptions adamw_options = AdamWOptions(0.05).weight_decay(0.1).maximize(true);
  AdamW adamw({StartingPoint()}, adamw_options);
  ExpectSameTrajectory(adamw, ReferenceAdamW{adamw_options}, 8);
  for (const RMSpropOptions& options :
       {RMSpropOptions(0.01).maximize(true),
        RMSpropOptions(0.005).centered(true).momentum(0.5).weight_decay(0.1).maximize(true)}) {
    RMSprop rmsprop({StartingPoint()}, options);
    ExpectSameTrajectory(rmsprop, ReferenceRmsprop{options}, 8, 5e-5);
  }
  // Maximizing L is minimizing -L, bit for bit (negation is exact).
  Tensor up = StartingPoint(), down = StartingPoint();
  SGD ascend({up}, SGDOptions(0.1).momentum(0.9).maximize(true));
  SGD descend({down}, SGDOptions(0.1).momentum(0.9));
  Loss(up).backward();
  (-1.0 * Loss(down)).backward();
  ascend.step();
  descend.step();
  EXPECT_EQ(up.to_vector<float>(), down.to_vector<float>());
}

// AMSGrad keeps the largest second moment: with a gradient that shrinks, the steps shrink
// faster than Adam's (whose v forgets the large gradients).
TEST_F(OptimTest, AmsgradMatchesPyTorchsRuleAndKeepsTheLargestSecondMoment) {
  for (const AdamOptions& options :
       {AdamOptions(0.1).amsgrad(true), AdamOptions(0.05).betas(0.8, 0.9).amsgrad(true),
        AdamOptions(0.05).weight_decay(0.1).amsgrad(true)}) {
    Adam adam({StartingPoint()}, options);
    ExpectSameTrajectory(adam, ReferenceAdam{options}, 10);
  }
  for (const AdamWOptions& options :
       {AdamWOptions(0.1).amsgrad(true), AdamWOptions(0.05).betas(0.8, 0.9).amsgrad(true)}) {
    AdamW adamw({StartingPoint()}, options);
    ExpectSameTrajectory(adamw, ReferenceAdamW{options}, 10);
  }
  // By hand, one element, lr 0.1, betas (0.9, 0.5), eps 0; g = 2 then 0. Step 1: m = 0.2,
  // v = v_max = 2, and the step is Adam's first, lr * sign(g). Step 2: m = 0.18, v = 1 but
  // v_max stays 2; bias corrections 1 - 0.9^2 = 0.19 and 1 - 0.5^2 = 0.75, so the step is
  // lr * (0.18 / 0.19) / sqrt(2 / 0.75) (Adam's would divide by sqrt(1 / 0.75)).
  Tensor w = from_vector(std::vector<float>{0.0f}, {1});
  w.set_requires_grad(true);
  Adam adam({w}, AdamOptions(0.1).betas(0.9, 0.5).eps(0.0).amsgrad(true));
  (2.0 * w).sum().backward();
  adam.step();
  const float after_one = w.to_vector<float>()[0];
  EXPECT_NEAR(after_one, -0.1, 1e-6);
  adam.zero_grad();
  (0.0 * w).sum().backward();
  adam.step();
  EXPECT_NEAR(w.to_vector<float>()[0], after_one - 0.1 * (0.18 / 0.19) / std::sqrt(2.0 / 0.75),
              1e-6);
  EXPECT_NEAR(adam.max_exp_avg_sq(0).to_vector<float>()[0], 2.0, 1e-6);
  EXPECT_NEAR(adam.exp_avg_sq(0).to_vector<float>()[0], 1.0, 1e-6);
}

TEST_F(OptimTest, AmsgradResumesExactlyFromItsStateDict) {
  ExpectResumesExactly(
      [](Tensor w) {
        return std::make_unique<Adam>(std::vector<Tensor>{w}, AdamOptions(0.1).amsgrad(true));
      },
      {"state.0.exp_avg", "state.0.exp_avg_sq", "state.0.max_exp_avg_sq", "state.0.step"});
  Tensor w = StartingPoint();
  AdamW adamw({w}, AdamWOptions(0.1).amsgrad(true));
  Steps(adamw, 1);
  EXPECT_THAT(ErrorOf([&] {
                adamw.load_state_dict(
                    {{"state.0.max_exp_avg_sq", adamw.state_dict().at("state.0.max_exp_avg_sq")}});
              }),
              HasSubstr("has only some of exp_avg, exp_avg_sq and step"));
}

TEST_F(OptimTest, AdamWAndRmspropResumeExactlyFromTheirStateDicts) {
  ExpectResumesExactly(
      [](Tensor w) { return std::make_unique<AdamW>(std::vector<Tensor>{w}, AdamWOptions(0.1)); },
      {"state.0.exp_avg", "state.0.exp_avg_sq", "state.0.step"});
  ExpectResumesExactly(
      [](Tensor w) {
        return std::make_unique<RMSprop>(std::vector<Tensor>{w},
                                         RMSpropOptions(0.01).momentum(0.9).centered(true));
      },
      {"state.0.grad_avg", "state.0.momentum_buffer", "state.0.square_avg", "state.0.step"});
  Tensor w = StartingPoint();
  RMSprop rmsprop({w}, RMSpropOptions(0.01));
  Steps(rmsprop, 1);
  EXPECT_THAT(
      ErrorOf([&] {
        rmsprop.load_state_dict({{"state.0.step", rmsprop.state_dict().at("state.0.step")}});
      }),
      HasSubstr("lacks square_avg or step"));
  EXPECT_EQ(rmsprop.step_count(0), 1);
}

}  // namespace
}  // namespace tandem::nn
