// Tests of cat, stack and split_heads (tensor/ops/join.cc).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "tensor/gradcheck.h"
#include "tensor/ops/ops_testing.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace tandem {
namespace ops_testing {
namespace {

// ---- Joining -------------------------------------------------------------------------------

TEST_F(OpsTest, CatJoinsAlongAnyDimension) {
  const Tensor a = Randn({2, 3}, 81), b = Randn({2, 1}, 82), c = Randn({2, 2}, 83);
  const std::vector<float> av = Values(a), bv = Values(b), cv = Values(c);
  std::vector<float> expected;
  for (int r = 0; r < 2; ++r) {
    expected.insert(expected.end(), av.begin() + r * 3, av.begin() + r * 3 + 3);
    expected.push_back(bv[r]);
    expected.insert(expected.end(), cv.begin() + r * 2, cv.begin() + r * 2 + 2);
  }
  ExpectValues(cat({a, b, c}, 1), {2, 6}, expected, 0);
  ExpectValues(cat({a, b, c}, -1), {2, 6}, expected, 0);
  std::vector<float> rows = av;
  rows.insert(rows.end(), av.begin(), av.end());
  ExpectValues(cat({a, a}), {4, 3}, rows, 0);
  ExpectValues(cat({a, zeros({0, 3})}), {2, 3}, av, 0);
  ExpectValues(cat({a.t().contiguous().t(), a}), {4, 3}, rows, 0);  // a strided input
  const Tensor ints = cat({arange(3, kInt64), arange(2, kInt64)});
  EXPECT_EQ(ints.dtype(), kInt64);
  EXPECT_THAT(ints.to_vector<int64_t>(), ElementsAre(0, 1, 2, 0, 1));
  ExpectValues(cat({a}, 0), {2, 3}, av, 0);
  EXPECT_FALSE(cat({a}, 0).shares_storage_with(a));
}

TEST_F(OpsTest, CatAndStackErrorsNameTheOffendingTensor) {
  EXPECT_THAT(ErrorOf([] { cat({}); }), HasSubstr("cat: expected at least one tensor"));
  EXPECT_THAT(ErrorOf([] {
                cat({zeros({2, 3}), zeros({3, 3})}, 1);
              }),
              HasSubstr("cat: tensor 1 is [3, 3] but tensor 0 is [2, 3]; all sizes except "
                        "dimension 1 must match"));
  EXPECT_THAT(ErrorOf([] {
                cat({zeros({2, 3}), zeros({2, 3}), zeros({2})});
              }),
              HasSubstr("cat: tensor 2 is [2] but tensor 0 is [2, 3]"));
  EXPECT_THAT(ErrorOf([] {
                cat({zeros({2}), zeros({2}, Device::Cpu(1))});
              }),
              HasSubstr("cat: tensor 1 is on cpu:1 but tensor 0 is on cpu:0"));
  EXPECT_THAT(ErrorOf([] { cat({zeros({2}), zeros({2})}, 1); }), HasSubstr("cat: dimension 1"));
  EXPECT_THAT(ErrorOf([] { cat({scalar_tensor(1.0)}); }),
              HasSubstr("cat: tensor 0 is zero-dimensional"));
  EXPECT_THAT(ErrorOf([] {
                cat({zeros({2}), Tensor()});
              }),
              HasSubstr("cat: tensor 1 is an undefined Tensor"));
  EXPECT_THAT(ErrorOf([] { stack({}); }), HasSubstr("stack: expected at least one tensor"));
  EXPECT_THAT(ErrorOf([] {
                stack({zeros({2, 3}), zeros({2, 4})});
              }),
              HasSubstr("stack: tensor 1 is [2, 4] but tensor 0 is [2, 3]; all tensors must "
                        "have the same shape"));
  EXPECT_THAT(ErrorOf([] { stack({zeros({2, 3})}, 3); }), HasSubstr("stack: dimension 3"));
}

TEST_F(OpsTest, StackAddsANewDimension) {
  const Tensor a = Randn({2, 3}, 91), b = Randn({2, 3}, 92);
  const std::vector<float> av = Values(a), bv = Values(b);
  std::vector<float> along0 = av;
  along0.insert(along0.end(), bv.begin(), bv.end());
  ExpectValues(stack({a, b}), {2, 2, 3}, along0, 0);
  std::vector<float> along2;
  for (size_t i = 0; i < av.size(); ++i) {
    along2.push_back(av[i]);
    along2.push_back(bv[i]);
  }
  ExpectValues(stack({a, b}, 2), {2, 3, 2}, along2, 0);
  ExpectValues(stack({a, b}, -1), {2, 3, 2}, along2, 0);
  EXPECT_EQ(stack({a, b}, 1).shape(), (Shape{2, 2, 3}));
  ExpectValues(stack({scalar_tensor(1.0), scalar_tensor(2.0)}), {2}, {1, 2}, 0);
}

TEST_F(OpsTest, GradientsOfCatAndStack) {
  const Tensor a = Param64(Randn({2, 3}, 341)), b = Param64(Randn({2, 1}, 342));
  const Tensor c = Param64(Randn({2, 3}, 343));
  EXPECT_GRADIENTS_MATCH(
      [](const Inputs& in) {
        return cat({in[0], in[1], in[2]}, 1);
      },
      {a, b, c}, kLinearEps);
  EXPECT_GRADIENTS_MATCH(
      [](const Inputs& in) {
        return cat({in[0], in[1]}, 0);
      },
      {a, c}, kLinearEps);
  EXPECT_GRADIENTS_MATCH(
      [b](const Inputs& in) {
        return cat({in[0], b.detach(), in[0]}, -1);
      },
      {a}, kLinearEps);
  for (int64_t dim : {0, 1, 2, -1}) {
    EXPECT_GRADIENTS_MATCH(
        [dim](const Inputs& in) {
          return stack({in[0], in[1]}, dim);
        },
        {a, c}, kLinearEps);
  }
}

// split_heads as it is written without it: narrow, reshape, transpose and contiguous per part.
std::vector<Tensor> ComposedSplitHeads(const Tensor& packed, int64_t parts, int64_t n_head) {
  const int64_t b = packed.size(0), t = packed.size(1), width = packed.size(2) / parts;
  std::vector<Tensor> out;
  for (int64_t i = 0; i < parts; ++i) {
    out.push_back(packed.narrow(2, i * width, width)
                      .reshape({b, t, n_head, width / n_head})
                      .transpose(1, 2)
                      .contiguous());
  }
  return out;
}

TEST_F(OpsTest, SplitHeadsEqualsTheComposedSplitInEveryDtype) {
  for (DType dtype : {kFloat32, kFloat64, kBFloat16, kFloat16}) {
    for (const auto& [parts, n_head] : {std::pair<int64_t, int64_t>{3, 2}, {1, 4}, {2, 1}}) {
      SCOPED_TRACE(::testing::Message() << dtype << " parts " << parts << " n_head " << n_head);
      const Tensor source = Randn({2, 5, parts * n_head * 3}, 431).to(dtype);
      const Tensor a = Param(source), b = Param(source);
      const std::vector<Tensor> fused = split_heads(a, parts, n_head);
      const std::vector<Tensor> composed = ComposedSplitHeads(b, parts, n_head);
      ASSERT_EQ(fused.size(), static_cast<size_t>(parts));
      Generator gen(432);
      Tensor loss_a = zeros({}, TensorOptions(dtype)), loss_b = zeros({}, TensorOptions(dtype));
      for (int64_t i = 0; i < parts; ++i) {
        EXPECT_EQ(fused[i].shape(), (Shape{2, n_head, 5, 3}));
        // A [B, H, T, D] view of packed [B, T, parts, H, D].
        EXPECT_EQ(fused[i].strides(),
                  (std::vector<int64_t>{5 * parts * n_head * 3, 3, parts * n_head * 3, 1}));
        EXPECT_EQ(fused[i].dtype(), dtype);
        EXPECT_TRUE(allclose(fused[i], composed[i], 0.0, 0.0));  // copies: exact
        if (i == 1) continue;  // a part without a gradient: zeros in its slot
        const Tensor weight = randn(fused[i].shape(), {}, &gen).to(dtype);
        loss_a = loss_a + (fused[i] * weight).sum();
        loss_b = loss_b + (composed[i] * weight).sum();
      }
      loss_a.backward();
      loss_b.backward();
      EXPECT_TRUE(allclose(a.grad(), b.grad(), 0.0, 0.0));
    }
  }
}

TEST_F(OpsTest, GradientsOfSplitHeads) {
  const Tensor packed = Param64(Randn({2, 3, 12}, 433));
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return stack(split_heads(in[0], 3, 2)); }, {packed},
                         kLinearEps);
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return split_heads(in[0], 2, 3)[1]; }, {packed},
                         kLinearEps);
  EXPECT_GRADGRADIENTS_MATCH(
      [](const Inputs& in) {
        const std::vector<Tensor> p = split_heads(in[0], 3, 2);
        return p[0] * p[2];
      },
      {packed});
}

// Attention writes the gradients of q, k and v as views of one block laid out as the packed
// tensor, and split_heads's backward takes that block as the packed gradient without a copy:
// the result must still be the gradient, with and without the causal mask.
TEST_F(OpsTest, GradientsOfSplitHeadsThroughAttention) {
  const Tensor packed = Param64(Randn({2, 5, 24}, 434));
  for (bool causal : {false, true}) {
    EXPECT_GRADIENTS_MATCH(
        [causal](const Inputs& in) {
          const std::vector<Tensor> p = split_heads(in[0], 3, 2);
          return scaled_dot_product_attention(p[0], p[1], p[2], Tensor(), 0.0, causal);
        },
        {packed}, kLinearEps);
  }
}

TEST_F(OpsTest, SplitHeadsRejectsShapesThatDoNotSplit) {
  EXPECT_THAT(ErrorOf([] {
                split_heads(zeros({2, 12}), 3, 2);
              }),
              HasSubstr("expected packed [B, T, parts * n_head * D]"));
  EXPECT_THAT(ErrorOf([] {
                split_heads(zeros({1, 2, 10}), 3, 2);
              }),
              HasSubstr("must be a multiple of parts * n_head = 6"));
  EXPECT_THAT(ErrorOf([] {
                split_heads(zeros({1, 2, 6}), 0, 2);
              }),
              HasSubstr("parts and n_head must be >= 1"));
  EXPECT_THAT(ErrorOf([] { split_heads(Tensor(), 3, 2); }), HasSubstr("split_heads"));
}

}  // namespace
}  // namespace ops_testing
}  // namespace tandem
