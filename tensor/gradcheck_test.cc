#include "tensor/gradcheck.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest-spi.h"
#include "gtest/gtest.h"
#include "tensor/core/autograd.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

// x * x with a backward chosen by the test: the true 2x, or a deliberately wrong one.
Tensor SquareWithBackward(const Tensor& x, double factor) {
  Tensor out;
  {
    NoGradGuard no_grad;
    out = mul(x, x);
  }
  if (NeedsGrad({x})) {
    RecordOp("TestSquareBackward", {x}, out, [x = x.detach(), factor](const Tensor& grad) {
      return std::vector<Tensor>{mul(grad, mul(x, factor))};
    });
  }
  return out;
}

Tensor Leaf(const Shape& shape, uint64_t seed) {
  Generator gen(seed);
  Tensor t = randn(shape, {}, &gen);
  t.set_requires_grad(true);
  return t;
}

TEST(GradCheckTest, PassesForACorrectBackward) {
  const GradCheckResult result =
      CheckGradients([](const std::vector<Tensor>& in) { return SquareWithBackward(in[0], 2.0); },
                     {Leaf({3, 4}, 1)});
  EXPECT_TRUE(result.ok) << result.message;
  EXPECT_EQ(result.checked_elements, 12);
  EXPECT_EQ(result.mismatched_elements, 0);
  EXPECT_LT(result.max_abs_error, 1e-3);
}

TEST(GradCheckTest, CatchesAWrongBackwardAndSaysWhere) {
  const GradCheckResult result =
      CheckGradients([](const std::vector<Tensor>& in) { return SquareWithBackward(in[0], 2.2); },
                     {Leaf({2, 3}, 2)});
  EXPECT_FALSE(result.ok);
  EXPECT_FALSE(static_cast<bool>(result));
  EXPECT_EQ(result.mismatched_elements, 6);
  EXPECT_THAT(result.message, HasSubstr("6 of 6 elements differ"));
  EXPECT_THAT(result.message, HasSubstr("input 0 [2, 3] element (0, 0): analytic"));
  EXPECT_THAT(result.message, HasSubstr("numeric"));
}

TEST(GradCheckTest, CatchesAGradientThatIsOffForOneElementOnly) {
  const auto f = [](const std::vector<Tensor>& in) {
    Tensor out;
    {
      NoGradGuard no_grad;
      out = mul(in[0], 3.0);
    }
    RecordOp("OneWrongElementBackward", {in[0]}, out, [](const Tensor& grad) {
      std::vector<float> bump(6, 0.0f);
      bump[4] = 0.5f;
      return std::vector<Tensor>{add(mul(grad, 3.0), from_vector(bump, {2, 3}))};
    });
    return out;
  };
  const GradCheckResult result = CheckGradients(f, {Leaf({2, 3}, 3)});
  EXPECT_FALSE(result.ok);
  EXPECT_EQ(result.mismatched_elements, 1);
  EXPECT_THAT(result.message, HasSubstr("element (1, 1)"));
}

TEST(GradCheckTest, ChecksEveryInputThatRequiresGradAndSkipsTheOthers) {
  Tensor a = Leaf({2, 3}, 4);
  Tensor b = Leaf({3}, 5);
  Tensor constant = randn({2, 3});
  Tensor labels = from_vector(std::vector<int64_t>{0, 1}, {2}, kInt64);
  const auto f = [](const std::vector<Tensor>& in) {
    return add(mul(in[0], in[1]), mul(in[2], in[3].to(kFloat32).unsqueeze(1)));
  };
  const GradCheckResult result = CheckGradients(f, {a, b, constant, labels});
  EXPECT_TRUE(result.ok) << result.message;
  EXPECT_EQ(result.checked_elements, 6 + 3);
}

TEST(GradCheckTest, NamesTheInputWhoseGradientIsWrong) {
  const auto f = [](const std::vector<Tensor>& in) {
    return add(in[0], SquareWithBackward(in[1], 1.0));
  };
  const GradCheckResult result = CheckGradients(f, {Leaf({2}, 6), Leaf({2}, 7)});
  EXPECT_FALSE(result.ok);
  EXPECT_THAT(result.message, HasSubstr("input 1 [2] element (0)"));
  EXPECT_THAT(result.message, ::testing::Not(HasSubstr("input 0")));
}

TEST(GradCheckTest, LeavesTheCallersTensorsAndGradientsAlone) {
  Tensor x = Leaf({4}, 8);
  const std::vector<float> before = x.to_vector<float>();
  EXPECT_GRADIENTS_MATCH([](const std::vector<Tensor>& in) { return tanh(in[0]); }, {x});
  EXPECT_FALSE(x.grad().defined());
  EXPECT_EQ(x.to_vector<float>(), before);
}

TEST(GradCheckTest, AnOutputThatDoesNotDependOnTheInputHasZeroGradient) {
  Tensor x = Leaf({3}, 9);
  Tensor other = randn({3});
  EXPECT_GRADIENTS_MATCH([other](const std::vector<Tensor>&) { return mul(other, 2.0); }, {x});
  const GradCheckResult wrong =
      CheckGradients([](const std::vector<Tensor>& in) { return in[0].detach(); }, {x});
  EXPECT_FALSE(wrong.ok) << "a detached output hides the true gradient of 1";
}

TEST(GradCheckTest, RejectsCallsWithNothingToCheck) {
  try {
    CheckGradients([](const std::vector<Tensor>& in) { return in[0]; }, {randn({2})});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("no input is a floating-point tensor that requires grad"));
  }
}

TEST(GradCheckTest, MacrosReportTheMessage) {
  EXPECT_NONFATAL_FAILURE(
      EXPECT_GRADIENTS_MATCH(
          [](const std::vector<Tensor>& in) { return SquareWithBackward(in[0], 3.0); },
          {Leaf({2}, 10)}),
      "gradient check failed");
}

// ---- CheckGradGradients (gradgradcheck) ----------------------------------------------------

Tensor Leaf64(const Shape& shape, uint64_t seed, double low = -1.0, double high = 1.0) {
  Generator gen(seed);
  Tensor t = add(mul(rand(shape, TensorOptions().dtype(kFloat64), &gen), high - low), low);
  t.set_requires_grad(true);
  return t;
}

// x * x whose backward claims double backward support but saves x detached: its second
// derivative misses d(2 x grad)/dx = 2 grad, a wrong one that CheckGradGradients must catch.
Tensor SquareWithDetachedSave(const Tensor& x) {
  Tensor out;
  {
    NoGradGuard no_grad;
    out = mul(x, x);
  }
  if (NeedsGrad({x})) {
    RecordOp(
        "DetachedSquareBackward", {x}, out,
        [x = x.detach()](const Tensor& grad) {
          return std::vector<Tensor>{mul(grad, mul(x, 2.0))};
        },
        DoubleBackward::kSupported);
  }
  return out;
}

TEST(GradGradCheckTest, CatchesASecondDerivativeThatIsWrong) {
  const Tensor x = Leaf64({3}, 1);
  EXPECT_GRADGRADIENTS_MATCH([](const std::vector<Tensor>& in) { return mul(in[0], in[0]); }, {x});
  const GradCheckResult result = CheckGradGradients(
      [](const std::vector<Tensor>& in) { return SquareWithDetachedSave(in[0]); }, {x});
  EXPECT_FALSE(result.ok);
  EXPECT_THAT(result.message, HasSubstr("input 0 [3]"));
}

struct SecondOrderCase {
  const char* name;
  GradCheckFunction f;
  std::vector<Tensor> inputs;
};

// Every op whose second derivative is supported (OpsSupportingDoubleBackward), in float64,
// with inputs that need a gradient in every operand and shapes that broadcast.
std::vector<SecondOrderCase> SecondOrderCases() {
  const Tensor a = Leaf64({2, 3}, 11), b = Leaf64({2, 3}, 12), row = Leaf64({3}, 13);
  const Tensor positive = Leaf64({2, 3}, 14, 0.5, 2.0);
  const Tensor m = Leaf64({3, 4}, 15), batch = Leaf64({2, 2, 3}, 16),
               batch2 = Leaf64({2, 3, 4}, 17);
  const Tensor w = Leaf64({4, 3}, 18), bias = Leaf64({4}, 19);
  const Tensor image = Leaf64({2, 2, 5, 6}, 21), kernel = Leaf64({4, 2, 2, 3}, 22);
  const Tensor wide_image = Leaf64({2, 8, 4, 4}, 25);
  const Tensor gather_index = from_vector(std::vector<int64_t>{2, 0, 2, 1, 1, 0}, {2, 3});
  const Tensor rows = from_vector(std::vector<int64_t>{2, 0, 2, 1, 2}, {5});
  const Tensor queries = Leaf64({2, 3, 4}, 28), keys = Leaf64({2, 5, 4}, 29),
               values = Leaf64({2, 5, 3}, 30);
  const Tensor key_mask = from_vector(std::vector<uint8_t>{1, 1, 0, 1, 1}, {5}).to(kBool);
  using In = const std::vector<Tensor>&;
  return {
      {"add (broadcast)", [](In in) { return mul(add(in[0], in[1]), in[0]); }, {a, row}},
      {"sub (broadcast)", [](In in) { return mul(sub(in[0], in[1]), in[1]); }, {a, row}},
      {"mul (broadcast)", [](In in) { return mul(in[0], in[1]); }, {a, row}},
      {"div", [](In in) { return div(in[0], in[1]); }, {a, positive}},
      {"scalar ops", [](In in) { return mul(add(mul(in[0], 3.0), 1.0), in[0]); }, {a}},
      {"neg", [](In in) { return mul(neg(in[0]), in[0]); }, {a}},
      {"pow", [](In in) { return pow(in[0], 3.0); }, {positive}},
      {"exp", [](In in) { return exp(in[0]); }, {a}},
      {"log", [](In in) { return log(in[0]); }, {positive}},
      {"sqrt", [](In in) { return sqrt(in[0]); }, {positive}},
      {"abs", [](In in) { return mul(abs(in[0]), in[0]); }, {positive}},
      {"square", [](In in) { return square(in[0]); }, {a}},
      {"maximum", [](In in) { return mul(maximum(in[0], in[1]), in[0]); }, {a, b}},
      {"where", [](In in) { return mul(where(gt(in[0], in[1]), in[0], in[1]), in[1]); }, {a, b}},
      {"masked_fill",
       [](In in) { return square(masked_fill(in[0], lt(in[0], zeros_like(in[0])), 2.0)); },
       {a}},
      {"clamp", [](In in) { return square(clamp(in[0], -0.5, 0.5)); }, {a}},
      {"dropout",
       [](In in) {
         Generator gen(7);
         return square(dropout(in[0], 0.5, /*training=*/true, &gen));
       },
       {a}},
      {"tril, triu", [](In in) { return square(add(tril(in[0]), triu(in[0], 1))); }, {m}},
      {"tanh", [](In in) { return tanh(in[0]); }, {a}},
      {"sigmoid", [](In in) { return sigmoid(in[0]); }, {a}},
      {"relu", [](In in) { return mul(relu(in[0]), in[0]); }, {a}},
      {"gelu", [](In in) { return gelu(in[0]); }, {a}},
      {"gelu tanh", [](In in) { return gelu(in[0], "tanh"); }, {a}},
      {"silu", [](In in) { return silu(in[0]); }, {a}},
      {"sum", [](In in) { return square(sum(in[0])); }, {a}},
      {"sum dims", [](In in) { return square(sum(in[0], {1}, true)); }, {a}},
      {"mean", [](In in) { return square(mean(in[0], {0})); }, {a}},
      {"amax", [](In in) { return square(amax(in[0], 1)); }, {a}},
      {"softmax", [](In in) { return softmax(in[0], 1); }, {a}},
      {"log_softmax", [](In in) { return log_softmax(in[0], 0); }, {a}},
      {"layer_norm",
       [](In in) { return tanh(layer_norm(in[0], {3}, in[1], in[2], 1e-5)); },
       {batch, row, Leaf64({3}, 20)}},
      {"layer_norm without parameters",
       [](In in) {
         return square(layer_norm(in[0], {2, 3}, Tensor(), Tensor(), 1e-5));
       },
       {batch}},
      {"rms_norm", [](In in) { return tanh(rms_norm(in[0], {3}, in[1], 1e-6)); }, {batch, row}},
      {"cross_entropy",
       [](In in) {
         return cross_entropy(in[0], from_vector(std::vector<int64_t>{2, 0}, {2}));
       },
       {a}},
      {"nll_loss",
       [](In in) {
         return nll_loss(log_softmax(in[0], 1), from_vector(std::vector<int64_t>{2, 0}, {2}));
       },
       {a}},
      {"mse_loss", [](In in) { return mse_loss(in[0], in[1]); }, {a, b}},
      {"matmul", [](In in) { return matmul(in[0], in[1]); }, {a, m}},
      {"matmul batched", [](In in) { return matmul(in[0], in[1]); }, {batch, batch2}},
      {"matmul batched by 2-d", [](In in) { return matmul(in[0], in[1]); }, {batch, m}},
      {"linear", [](In in) { return tanh(linear(in[0], in[1], in[2])); }, {batch, w, bias}},
      {"views",
       [](In in) {
         return square(in[0].reshape({3, 2}).transpose(0, 1).unsqueeze(0).squeeze(0).flatten());
       },
       {a}},
      {"permute, expand, contiguous",
       [](In in) {
         return square(in[0].permute({1, 0}).unsqueeze(2).expand({3, 2, 2}).contiguous());
       },
       {a}},
      {"narrow, select, split",
       [](In in) {
         return mul(in[0].narrow(1, 1, 2), in[0].select(0, 1).split(2, 0)[0].unsqueeze(0));
       },
       {a}},
      {"cat, stack",
       [](In in) {
         return square(cat({stack({in[0], in[1]}), in[0].unsqueeze(0)}, 0));
       },
       {a, b}},
      {"clone", [](In in) { return square(in[0].clone()); }, {a}},
      {"conv2d (stride, padding, dilation)",
       [](In in) {
         return tanh(conv2d(in[0], in[1], in[2], {2, 1}, {1, 1}, {1, 2}, 1));
       },
       {image, kernel, Leaf64({4}, 23)}},
      {"conv2d (groups, no bias)",
       [](In in) { return square(conv2d(in[0], in[1], Tensor(), {1}, {0}, {1}, 2)); },
       {image, Leaf64({4, 1, 2, 2}, 24)}},
      {"conv2d (many rows: one GEMM over the batch)",
       [](In in) { return tanh(conv2d(in[0], in[1], Tensor(), {1}, {1}, {1}, 1)); },
       {wide_image, Leaf64({3, 8, 3, 3}, 26)}},
      {"max_pool2d (overlapping windows)",
       [](In in) {
         return square(max_pool2d(square(in[0]), {3, 3}, {1, 1}, {1, 1}));
       },
       {image}},
      {"avg_pool2d",
       [](In in) {
         return square(avg_pool2d(in[0], {2, 3}, {1, 2}, {1, 1}, true, false));
       },
       {image}},
      {"adaptive_avg_pool2d",
       [](In in) {
         return square(adaptive_avg_pool2d(in[0], {2, 3}));
       },
       {image}},
      {"scaled_dot_product_attention (causal)",
       [](In in) { return scaled_dot_product_attention(in[0], in[1], in[2], Tensor(), 0.0, true); },
       {queries, keys, values}},
      {"scaled_dot_product_attention (mask, dropout, scale)",
       [key_mask](In in) {
         Generator gen(5);
         return scaled_dot_product_attention(in[0], in[1], in[2], key_mask, 0.3, false, 0.7, &gen);
       },
       {queries, keys, values}},
      {"gather", [gather_index](In in) { return square(gather(in[0], 1, gather_index)); }, {a}},
      {"index_select (repeated rows, an embedding's lookup)",
       [rows](In in) { return tanh(mul(index_select(in[0], 0, rows), in[1])); },
       {m, Leaf64({5, 4}, 27)}},
  };
}

TEST(GradGradCheckTest, EverySupportedOpHasCorrectSecondDerivatives) {
  for (const SecondOrderCase& c : SecondOrderCases()) {
    SCOPED_TRACE(c.name);
    EXPECT_GRADGRADIENTS_MATCH(c.f, c.inputs);
  }
}

// An op whose backward is not differentiable again (raw, as a fused kernel's would be).
Tensor SquareWithoutDoubleBackward(const Tensor& x) {
  Tensor out;
  {
    NoGradGuard no_grad;
    out = mul(x, x);
  }
  if (NeedsGrad({x})) {
    RecordOp("FusedSquareBackward", {x}, out, [x = x.detach()](const Tensor& grad) {
      return std::vector<Tensor>{mul(grad, mul(x, 2.0))};
    });
  }
  return out;
}

TEST(GradGradCheckTest, UnsupportedOpsRefuseASecondBackwardByName) {
  const Tensor x = Leaf64({3, 2}, 21);
  const auto loss_of = [&] { return square(SquareWithoutDoubleBackward(x)).sum(); };
  const Tensor g = autograd::grad({loss_of()}, {x}, {}, /*create_graph=*/true)[0];
  EXPECT_TRUE(g.requires_grad());
  try {
    square(g).sum().backward();
    FAIL() << "a second backward through FusedSquareBackward did not throw";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("second derivative of FusedSquareBackward is not supported"));
    EXPECT_THAT(e.what(), HasSubstr("Ops supported twice: add, sub"));
  }
  // First-order gradients under create_graph are still right.
  const Tensor reference = autograd::grad({loss_of()}, {x})[0];
  EXPECT_EQ(testing::MaxAbsDiff(g, reference), 0.0);
}

// Third order through the ops whose gradients are their adjoints' adjoints (conv2d's input and
// weight gradients, pooling's, gather's scatter): d^3/dx^3 of sum(conv(x, w)^3) by hand would
// be long; instead the second derivative itself is gradchecked.
TEST(GradGradCheckTest, ConvolutionAndGatherDifferentiateAThirdTime) {
  const Tensor image = Leaf64({1, 2, 4, 4}, 31), kernel = Leaf64({2, 2, 3, 3}, 32);
  const Tensor v = Leaf64({1, 2, 4, 4}, 33);
  // The Hessian-vector product of a conv net's loss, as a function of (x, w): its gradient
  // is a third derivative of the loss.
  const GradCheckFunction hvp = [v](const std::vector<Tensor>& in) {
    // The numerical passes call this with grad mode off and plain inputs: it differentiates
    // with respect to a leaf of its own then.
    AutoGradMode grad_mode(true);
    Tensor x = in[0];
    if (!x.requires_grad()) {
      x = in[0].detach();
      x.set_requires_grad(true);
    }
    const Tensor y = max_pool2d(tanh(conv2d(x, in[1], Tensor(), {1}, {1}, {1}, 1)), {2, 2});
    const Tensor g = autograd::grad({square(y).sum()}, {x}, {}, /*create_graph=*/true)[0];
    return autograd::grad({mul(g, v).sum()}, {x}, {}, /*create_graph=*/true)[0];
  };
  EXPECT_GRADIENTS_MATCH(hvp, {image, kernel});
}
}  // namespace
}  // namespace tandem
