// Tests of where, masked_fill, clamp, gather, index_select, topk and matmul's batch
// broadcasting (tensor/ops/ops.h): known values as PyTorch gives them, NaN handling, errors and
// finite-difference gradient checks; on CUDA, the same ops against the CPU.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "tensor/gradcheck.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace tandem {
namespace {

using ::tandem::testing::ErrorOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Inputs = std::vector<Tensor>;

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

Tensor F(const std::vector<float>& values, const Shape& shape, Device device = Device::Cpu(0)) {
  return from_vector(values, shape, device);
}
Tensor I(const std::vector<int64_t>& values, const Shape& shape, Device device = Device::Cpu(0)) {
  return from_vector(values, shape, TensorOptions(kInt64).device(device));
}
// A bool tensor: true where `values` is nonzero.
Tensor B(const std::vector<float>& values, const Shape& shape, Device device = Device::Cpu(0)) {
  return from_vector(values, shape, device).to(kBool);
}
std::vector<float> V(const Tensor& t) {
  return t.to(Device::Cpu()).to(kFloat32).to_vector<float>();
}
std::vector<int64_t> L(const Tensor& t) { return t.to(Device::Cpu()).to_vector<int64_t>(); }
// A float64 leaf, for gradient checks in float64.
Tensor Param(const Shape& shape, uint64_t seed) {
  Generator gen(seed);
  Tensor t = randn(shape, kFloat64, &gen);
  t.set_requires_grad(true);
  return t;
}

TEST(WhereTest, PicksBroadcastsAndIgnoresTheOtherSide) {
  const Tensor cond = B({1, 0, 1, 0}, {4});
  const Tensor a = F({1, 2, 3, 4}, {4});
  const Tensor b = F({kNan, -1, kInf, -3}, {4});
  EXPECT_THAT(V(where(cond, a, b)), ElementsAre(1, -1, 3, -3));
  // A [2, 1] condition broadcasts; converting to bool makes any nonzero value true.
  const Tensor rows = I({0, -2}, {2, 1}).to(kBool);
  EXPECT_THAT(V(where(rows, a, F({0}, {1}))), ElementsAre(0, 0, 0, 0, 1, 2, 3, 4));
  EXPECT_EQ(where(rows, a, F({0}, {1})).shape(), (Shape{2, 4}));
  // int64 stays int64; mixing promotes.
  EXPECT_EQ(where(cond, I({1, 2, 3, 4}, {4}), I({0}, {1})).dtype(), kInt64);
  EXPECT_EQ(where(cond, I({1, 2, 3, 4}, {4}), F({0.5}, {1})).dtype(), kFloat32);
  // bool values are selected as bool; 16-bit floats stay 16-bit.
  EXPECT_THAT(where(cond, B({1, 1, 1, 1}, {4}), B({0}, {1})).to_vector<bool>(),
              ElementsAre(true, false, true, false));
  EXPECT_EQ(where(cond, a.to(kBFloat16), b.to(kBFloat16)).dtype(), kBFloat16);
  EXPECT_THAT(V(where(cond, a.to(kFloat16), b.to(kFloat16)).to(kFloat32)),
              ElementsAre(1, -1, 3, -3));
  EXPECT_THAT(ErrorOf([&] { where(B({1, 0, 1}, {3}), a, b); }), HasSubstr("cannot be broadcast"));
  // PyTorch requires a bool condition.
  EXPECT_THAT(ErrorOf([&] {
                where(F({1, 0, 1, 0}, {4}), a, b);
              }),
              HasSubstr("where: the condition must be a bool tensor (as in PyTorch) but is "
                        "float32"));
}

TEST(WhereTest, GradientsGoToTheChosenSide) {
  const Tensor cond = B({1, 0, 0, 1, 1, 0}, {2, 3});
  EXPECT_GRADIENTS_MATCH([&](const Inputs& in) { return where(cond, in[0], in[1]); },
                         {Param({2, 3}, 1), Param({3}, 2)});
  Tensor a = Param({3}, 3);
  Tensor b = F({kNan, kNan, kNan}, {3});
  b.set_requires_grad(true);
  where(B({1, 1, 0}, {3}), a, b).sum().backward();
  EXPECT_THAT(V(a.grad()), ElementsAre(1, 1, 0));
  EXPECT_THAT(V(b.grad()), ElementsAre(0, 0, 1));
}

TEST(MaskedFillTest, FillsWhereTheMaskIsSet) {
  const Tensor x = F({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_THAT(V(masked_fill(x, B({1, 0, 1}, {3}), -kInf)),
              ElementsAre(-kInf, 2, -kInf, -kInf, 5, -kInf));
  EXPECT_THAT(L(masked_fill(I({1, 2}, {2}), B({0, 1}, {2}), 7)), ElementsAre(1, 7));
  // The value takes input's dtype, as in PyTorch (0.5 truncates to 0 in int64).
  EXPECT_THAT(L(masked_fill(I({1, 2}, {2}), B({0, 1}, {2}), 0.5)), ElementsAre(1, 0));
  EXPECT_EQ(masked_fill(x.to(kBFloat16), B({1, 0, 1}, {3}), 0.5).dtype(), kBFloat16);
  EXPECT_THAT(ErrorOf([&] {
                masked_fill(F({1}, {1}), B({1, 0}, {2}), 0.0);
              }),
              HasSubstr("without enlarging it"));
  EXPECT_THAT(ErrorOf([&] {
                masked_fill(x, F({1, 0, 1}, {3}), 0.0);
              }),
              HasSubstr("masked_fill: the mask must be a bool tensor (as in PyTorch) but is "
                        "float32"));
  EXPECT_GRADIENTS_MATCH(
      [](const Inputs& in) {
        return masked_fill(in[0], B({0, 1, 0, 0, 1, 1}, {2, 3}), 2.5);
      },
      {Param({2, 3}, 4)});
}

TEST(ClampTest, MatchesPyTorch) {
  const Tensor x = F({-2, -0.5, 0.5, 2, kNan, kInf}, {6});
  EXPECT_THAT(V(clamp(x, -1.0, 1.0)), ElementsAre(-1, -0.5, 0.5, 1, ::testing::IsNan(), 1));
  EXPECT_THAT(V(clamp(x, 0.0, std::nullopt)), ElementsAre(0, 0, 0.5, 2, ::testing::IsNan(), kInf));
  EXPECT_THAT(V(clamp(x, std::nullopt, 0.0)), ElementsAre(-2, -0.5, 0, 0, ::testing::IsNan(), 0));
  // min > max: everything is max (torch.clamp(x, 1, -1)).
  EXPECT_THAT(V(clamp(F({-3, 0, 3}, {3}), 1.0, -1.0)), ElementsAre(-1, -1, -1));
  EXPECT_EQ(clamp(I({-3, 5}, {2}), 0.0, 2.0).dtype(), kInt64);
  EXPECT_THAT(L(clamp(I({-3, 5}, {2}), 0.0, 2.0)), ElementsAre(0, 2));
  EXPECT_THAT(ErrorOf([&] { clamp(x, std::nullopt, std::nullopt); }),
              HasSubstr("at least one of min and max"));
  // The gradient passes on the bounds (PyTorch's clamp_backward), not outside them.
  Tensor y = F({-2, -1, 0, 1, 2}, {5});
  y.set_requires_grad(true);
  clamp(y, -1.0, 1.0).sum().backward();
  EXPECT_THAT(V(y.grad()), ElementsAre(0, 1, 1, 1, 0));
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return clamp(in[0], -0.3, 0.4); },
                         {F({-1.0, -0.1, 0.2, 0.9, 0.35, -0.5}, {6}).set_requires_grad(true)});
}

TEST(GatherTest, KnownValuesAlongEachDim) {
  const Tensor x = F({1, 2, 3, 4, 5, 6}, {2, 3});
  // torch.gather(x, 1, [[2, 0], [1, 1]]) = [[3, 1], [5, 5]].
  EXPECT_THAT(V(gather(x, 1, I({2, 0, 1, 1}, {2, 2}))), ElementsAre(3, 1, 5, 5));
  // torch.gather(x, 0, [[1, 0, 1]]) = [[4, 2, 6]]: index smaller than input outside dim.
  const Tensor g = gather(x, 0, I({1, 0, 1}, {1, 3}));
  EXPECT_EQ(g.shape(), (Shape{1, 3}));
  EXPECT_THAT(V(g), ElementsAre(4, 2, 6));
  EXPECT_THAT(V(gather(x.t(), -1, I({1, 0, 0}, {3, 1}))), ElementsAre(4, 2, 3));
  EXPECT_THAT(ErrorOf([&] {
                gather(x, 1, I({3}, {1, 1}));
              }),
              HasSubstr("gather: index values must be in [0, 3) (the size of dimension 1) but "
                        "range over [3, 3]"));
  EXPECT_THAT(ErrorOf([&] {
                gather(x, 1, I({0, 0, 0}, {3, 1}));
              }),
              HasSubstr("sizes no larger than input's"));
  EXPECT_THAT(ErrorOf([&] { gather(x, 1, F({0}, {1, 1})); }), HasSubstr("index must be int64"));
}

TEST(GatherTest, GradientsAccumulateOverRepeatedIndices) {
  const Tensor index = I({0, 0, 2, 1, 3, 3, 1, 0}, {2, 4});
  EXPECT_GRADIENTS_MATCH([&](const Inputs& in) { return gather(in[0], 1, index); },
                         {Param({2, 5}, 5)});
  const Tensor rows = I({1, 0, 1}, {1, 3});
  EXPECT_GRADIENTS_MATCH([&](const Inputs& in) { return gather(in[0], 0, rows); },
                         {Param({3, 4}, 6)});
  Tensor x = F({1, 2, 3}, {3});
  x.set_requires_grad(true);
  gather(x, 0, I({2, 2, 0}, {3})).sum().backward();
  EXPECT_THAT(V(x.grad()), ElementsAre(1, 0, 2));
}

TEST(IndexSelectTest, SelectsAlongADimWithRepeats) {
  const Tensor x = F({1, 2, 3, 4, 5, 6}, {3, 2});
  EXPECT_THAT(V(index_select(x, 0, I({2, 0, 2}, {3}))), ElementsAre(5, 6, 1, 2, 5, 6));
  EXPECT_THAT(V(index_select(x, 1, I({1}, {1}))), ElementsAre(2, 4, 6));
  EXPECT_EQ(index_select(x, 0, I({}, {0})).shape(), (Shape{0, 2}));
  EXPECT_THAT(ErrorOf([&] {
                index_select(x, 0, I({0, 1}, {1, 2}));
              }),
              HasSubstr("index must be 1-D"));
  EXPECT_GRADIENTS_MATCH(
      [](const Inputs& in) {
        return index_select(in[0], 1, I({3, 0, 3}, {3}));
      },
      {Param({2, 4, 2}, 7)});
}

// index_select's gradient reaches the engine as scattered rows, added in place into a
// gradient already waiting for the same input (a tied head's) or made dense when it comes
// first; either order must sum both contributions.
TEST(IndexSelectTest, GradientsOfATiedWeightSumInEitherOrder) {
  const Tensor index = I({2, 5, 2, 0}, {4});
  // The lookup first: its gradient arrives last, into the head's (linear's weight gradient
  // is a fresh buffer, added into in place; matmul's reaches the leaf through a transpose).
  EXPECT_GRADIENTS_MATCH(
      [&](const Inputs& in) { return linear(index_select(in[0], 0, index), in[0], Tensor()); },
      {Param({7, 3}, 10)});
  EXPECT_GRADIENTS_MATCH(
      [&](const Inputs& in) { return matmul(index_select(in[0], 0, index), in[0].t()); },
      {Param({7, 3}, 11)});
  // The lookup last: its gradient arrives first, alone; the dense one is added to it.
  EXPECT_GRADIENTS_MATCH(
      [&](const Inputs& in) {
        return index_select(mul(in[0], in[0]), 0, index) + index_select(in[0], 0, index);
      },
      {Param({7, 3}, 12)});
  // Along a middle dimension, with a second backward adding into .grad.
  Tensor w = Param({2, 5, 3}, 13);
  const auto loss = [&] {
    return (index_select(w, 1, I({4, 4, 1}, {3})) * 3.0).sum() + (w * w).sum();
  };
  loss().backward();
  const std::vector<float> once = V(w.grad());
  loss().backward();
  const std::vector<float> twice = V(w.grad());
  const std::vector<float> values = V(w);
  ASSERT_EQ(once.size(), 30u);
  for (int64_t i = 0; i < 30; ++i) {
    const int64_t column = (i / 3) % 5;  // [2, 5, 3]
    const double expected = 2 * values[i] + (column == 4 ? 6.0 : column == 1 ? 3.0 : 0.0);
    EXPECT_NEAR(once[i], expected, 1e-5) << i;
    EXPECT_NEAR(twice[i], 2 * expected, 1e-5) << i;
  }
}

TEST(TopkTest, LargestSmallestNanAndGradients) {
  const Tensor x = F({1, 5, 3, 5, -kInf, 2, kNan, 0}, {2, 4});
  auto [values, indices] = topk(x, 2);
  EXPECT_THAT(V(values), ElementsAre(5, 5, ::testing::IsNan(), 2));
  EXPECT_THAT(L(indices), ElementsAre(1, 3, 2, 1));
  auto [low, low_at] = topk(x, 3, 1, /*largest=*/false);
  EXPECT_THAT(V(low), ElementsAre(1, 3, 5, -kInf, 0, 2));
  EXPECT_THAT(L(low_at), ElementsAre(0, 2, 1, 0, 3, 1));
  auto [columns, column_at] = topk(x, 1, 0);
  EXPECT_EQ(columns.shape(), (Shape{1, 4}));
  EXPECT_THAT(L(column_at), ElementsAre(0, 0, 1, 0));
  EXPECT_EQ(topk(x, 0).first.shape(), (Shape{2, 0}));
  EXPECT_THAT(ErrorOf([&] { topk(x, 5); }), HasSubstr("topk: k must be in [0, 4]"));
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return topk(in[0], 2, 0).first; },
                         {Param({4, 3}, 8)});
}

// Host reference: batched matmul over broadcast batches of row-major tensors.
TEST(MatmulBroadcastTest, AnyNumberOfBatchDimensionsBroadcast) {
  const Tensor a = Param({2, 1, 3, 4}, 9);
  const Tensor b = Param({3, 4, 2}, 10);
  const Tensor c = matmul(a, b);
  ASSERT_EQ(c.shape(), (Shape{2, 3, 3, 2}));
  const std::vector<float> av = V(a), bv = V(b), cv = V(c);
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 3; ++j) {
      for (int r = 0; r < 3; ++r) {
        for (int s = 0; s < 2; ++s) {
          double expected = 0;
          for (int t = 0; t < 4; ++t) expected += av[(i * 3 + r) * 4 + t] * bv[(j * 4 + t) * 2 + s];
          EXPECT_NEAR(cv[((i * 3 + j) * 3 + r) * 2 + s], expected, 1e-5);
        }
      }
    }
  }
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return matmul(in[0], in[1]); }, {a, b});
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return matmul(in[0], in[1]); },
                         {Param({2, 2, 3, 4}, 11), Param({4, 2}, 12)});
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return matmul(in[0], in[1]); },
                         {Param({4}, 13), Param({2, 1, 4, 3}, 14)});
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return matmul(in[0], in[1]); },
                         {Param({3, 4}, 15), Param({2, 2, 4, 3}, 16)});
  EXPECT_EQ(matmul(zeros({2, 2, 3, 4}), zeros({4})).shape(), (Shape{2, 2, 3}));
  EXPECT_EQ(matmul(zeros({4}), zeros({4})).shape(), (Shape{}));
  EXPECT_THAT(ErrorOf([] {
                matmul(zeros({2, 1, 3, 4}), zeros({3, 2, 4, 5}));
              }),
              HasSubstr("their batch dimensions [2, 1] and [3, 2] cannot be broadcast together"));
}

TEST(IndexingOnCudaTest, MatchesTheCpu) {
  if (DeviceCount(DeviceType::kCUDA) == 0) GTEST_SKIP() << "no CUDA device in this process";
  const Device cuda = Device::Cuda(0);
  const Tensor x = Param({3, 5, 4}, 17);
  const Tensor index = I({0, 4, 4, 2, 1, 3, 0, 0, 1, 2, 3, 4}, {3, 1, 4});
  const auto run = [&](Device device) {
    Tensor leaf = x.detach().to(device);
    leaf.set_requires_grad(true);
    Tensor y = gather(leaf, 1, index.to(device));
    Tensor z = index_select(leaf, 2, I({3, 3, 0}, {3}, device));
    Tensor w = where(gt(leaf, zeros({}, device)), leaf, clamp(leaf, -0.5, 0.5));
    (y.sum() + z.sum() + mul(w, w).sum() + topk(leaf, 2, 1).first.sum()).backward();
    return std::vector<std::vector<float>>{V(y), V(z), V(w), V(leaf.grad())};
  };
  const auto cpu = run(Device::Cpu(0)), gpu = run(cuda);
  for (size_t i = 0; i < cpu.size(); ++i) {
    ASSERT_EQ(cpu[i].size(), gpu[i].size());
    for (size_t j = 0; j < cpu[i].size(); ++j) EXPECT_NEAR(cpu[i][j], gpu[i][j], 1e-5);
  }
}

}  // namespace
}  // namespace tandem
