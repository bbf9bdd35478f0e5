// Tests of the reductions (tensor/ops/reduce.cc): sum, mean, amax, argmax, argmin and sum_to.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "tensor/gradcheck.h"
#include "tensor/ops/ops_testing.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace tandem {
namespace ops_testing {
namespace {

// ---- Reductions ----------------------------------------------------------------------------

TEST_F(OpsTest, SumAndMeanOverDimsMatchTheHost) {
  const Shape shape = {3, 4, 5};
  const Tensor x = Randn(shape, 7);
  const std::vector<float> xv = Values(x);
  const auto add_fn = [](double acc, double v) { return acc + v; };
  struct Case {
    std::vector<int64_t> dims;        // as passed
    std::vector<int64_t> normalized;  // sorted, non-negative
  };
  for (const Case& c : std::vector<Case>{{{0}, {0}},
                                         {{1}, {1}},
                                         {{-1}, {2}},
                                         {{0, 2}, {0, 2}},
                                         {{2, 0}, {0, 2}},
                                         {{-2, -1}, {1, 2}},
                                         {{0, 1, 2}, {0, 1, 2}},
                                         {{}, {0, 1, 2}}}) {
    SCOPED_TRACE("dims " + ShapeToString(c.dims));
    const std::vector<double> sums = HostReduce(xv, shape, c.normalized, 0.0, add_fn);
    int64_t count = 1;
    for (int64_t d : c.normalized) count *= shape[d];
    std::vector<double> means;
    for (double s : sums) means.push_back(s / count);
    Shape kept = shape, dropped;
    for (int64_t d : c.normalized) kept[d] = 1;
    for (int64_t d = 0; d < 3; ++d) {
      if (!std::count(c.normalized.begin(), c.normalized.end(), d)) dropped.push_back(shape[d]);
    }
    ExpectValues(sum(x, c.dims, true), kept, ToFloat(sums));
    ExpectValues(sum(x, c.dims), dropped, ToFloat(sums));
    ExpectValues(x.sum(c.dims, true), kept, ToFloat(sums));
    ExpectValues(mean(x, c.dims, true), kept, ToFloat(means));
    ExpectValues(x.mean(c.dims), dropped, ToFloat(means));
  }
  const std::vector<double> total = HostReduce(xv, shape, {0, 1, 2}, 0.0, add_fn);
  ExpectValues(sum(x), {}, {static_cast<float>(total[0])});
  ExpectValues(x.sum(), {}, {static_cast<float>(total[0])});
  ExpectValues(mean(x), {}, {static_cast<float>(total[0] / 60)});
  ExpectValues(x.mean(), {}, {static_cast<float>(total[0] / 60)});
  // A non-contiguous input.
  const Tensor xt = x.transpose(0, 2);
  const std::vector<double> by_first = HostReduce(xv, shape, {1, 2}, 0.0, add_fn);
  ExpectValues(sum(xt, {0, 1}), {3}, ToFloat(by_first));
}

TEST_F(OpsTest, ReductionsOfEmptyAndZeroDimensionalTensors) {
  ExpectValues(sum(zeros({0, 3})), {}, {0.0f});
  ExpectValues(sum(zeros({0, 3}), {0}), {3}, {0, 0, 0});
  ExpectValues(sum(zeros({3, 0}), {0}), {0}, {});
  EXPECT_TRUE(std::isnan(mean(zeros({0})).item()));
  ExpectValues(mean(zeros({0, 2}), {0}), {2}, {NAN, NAN});
  const Tensor s = scalar_tensor(2.5);
  ExpectValues(sum(s), {}, {2.5f});
  ExpectValues(sum(s, {0}), {}, {2.5f});
  ExpectValues(sum(s, {-1}, true), {}, {2.5f});
  ExpectValues(amax(s, 0), {}, {2.5f});
  EXPECT_EQ(argmax(s, 0).item<int64_t>(), 0);
  EXPECT_THAT(ErrorOf([] {
                amax(zeros({2, 0}), 1);
              }),
              HasSubstr("amax: cannot reduce over a dimension of size 0"));
  EXPECT_THAT(ErrorOf([] {
                argmax(zeros({0, 2}), 0);
              }),
              HasSubstr("argmax: cannot reduce over a dimension of size 0"));
  ExpectValues(amax(zeros({0, 2}), 1), {0}, {});
}

TEST_F(OpsTest, ReductionErrorsNameTheBadDimension) {
  EXPECT_THAT(ErrorOf([] {
                sum(zeros({2, 3}), {2});
              }),
              HasSubstr("sum: dimension 2 is out of range for a tensor with 2 dimension(s)"));
  EXPECT_THAT(ErrorOf([] { mean(zeros({2, 3}), {-3}); }), HasSubstr("mean: dimension -3"));
  EXPECT_THAT(ErrorOf([] {
                sum(zeros({2, 3}), {1, -1});
              }),
              HasSubstr("sum: dimension 1 appears more than once"));
  EXPECT_THAT(ErrorOf([] { amax(zeros({2, 3}), 5); }), HasSubstr("amax: dimension 5"));
  EXPECT_THAT(ErrorOf([] { argmin(zeros({2}), 1); }), HasSubstr("argmin: dimension 1"));
  EXPECT_THAT(ErrorOf([] { softmax(zeros({2}), -2); }), HasSubstr("softmax: dimension -2"));
}

TEST_F(OpsTest, AmaxArgmaxArgminMatchTheHost) {
  const Shape shape = {4, 6};
  const Tensor x = Randn(shape, 11);
  const std::vector<float> xv = Values(x);
  for (int64_t dim : {0, 1, -1, -2}) {
    SCOPED_TRACE("dim " + std::to_string(dim));
    const int64_t d = dim < 0 ? dim + 2 : dim;
    const int64_t other = 1 - d;
    std::vector<float> maxima;
    std::vector<int64_t> arg_max, arg_min;
    for (int64_t i = 0; i < shape[other]; ++i) {
      float best = -INFINITY, worst = INFINITY;
      int64_t best_j = 0, worst_j = 0;
      for (int64_t j = 0; j < shape[d]; ++j) {
        const float v = d == 1 ? xv[i * 6 + j] : xv[j * 6 + i];
        if (v > best) best = v, best_j = j;
        if (v < worst) worst = v, worst_j = j;
      }
      maxima.push_back(best);
      arg_max.push_back(best_j);
      arg_min.push_back(worst_j);
    }
    ExpectValues(amax(x, dim), {shape[other]}, maxima, 0);
    Shape kept = shape;
    kept[d] = 1;
    ExpectValues(amax(x, dim, true), kept, maxima, 0);
    EXPECT_EQ(argmax(x, dim).to_vector<int64_t>(), arg_max);
    EXPECT_EQ(argmax(x, dim).dtype(), kInt64);
    EXPECT_EQ(x.argmax(dim, true).shape(), kept);
    EXPECT_EQ(argmin(x, dim, true).to_vector<int64_t>(), arg_min);
  }
  // Ties pick the first index, as PyTorch does.
  const Tensor ties = from_vector(std::vector<float>{1, 3, 3, 0, 0, -1}, {2, 3});
  EXPECT_THAT(argmax(ties, 1).to_vector<int64_t>(), ElementsAre(1, 0));
  EXPECT_THAT(argmin(ties, 1).to_vector<int64_t>(), ElementsAre(0, 2));
}

TEST_F(OpsTest, SumToReducesBroadcastDimensions) {
  const Tensor x = Randn({2, 3, 4}, 13);
  const std::vector<float> xv = Values(x);
  const auto add_fn = [](double acc, double v) { return acc + v; };
  ExpectValues(sum_to(x, {3, 1}), {3, 1}, ToFloat(HostReduce(xv, {2, 3, 4}, {0, 2}, 0, add_fn)));
  ExpectValues(sum_to(x, {4}), {4}, ToFloat(HostReduce(xv, {2, 3, 4}, {0, 1}, 0, add_fn)));
  ExpectValues(sum_to(x, {}), {}, ToFloat(HostReduce(xv, {2, 3, 4}, {0, 1, 2}, 0, add_fn)));
  ExpectValues(sum_to(x, {2, 1, 4}), {2, 1, 4}, ToFloat(HostReduce(xv, {2, 3, 4}, {1}, 0, add_fn)));
  ExpectValues(sum_to(x, {2, 3, 4}), {2, 3, 4}, xv);
  ExpectValues(sum_to(ones({1, 3}), {3}), {3}, {1, 1, 1});
  EXPECT_THAT(ErrorOf([&] { sum_to(x, {5}); }),
              HasSubstr("sum_to: cannot sum [2, 3, 4] down to [5]"));
  EXPECT_THAT(ErrorOf([&] { sum_to(x, {1, 2, 3, 4}); }), HasSubstr("sum_to: cannot sum"));
}

TEST_F(OpsTest, AmaxSplitsTheGradientEvenlyAmongTies) {
  Tensor x = Param(from_vector(std::vector<float>{3, 1, 3, 3, 2, 0, 1, 2, 2}, {3, 3}));
  sum(amax(x, 1)).backward();
  ExpectValues(x.grad(), {3, 3}, {0.5f, 0, 0.5f, 1, 0, 0, 0, 0.5f, 0.5f});
}

TEST_F(OpsTest, GradientsOfSumAndMean) {
  const Tensor x = Param64(Randn({2, 3, 4}, 241));
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return sum(in[0]); }, {x}, kLinearEps);
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return in[0].sum(); }, {x}, kLinearEps);
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return mean(in[0]); }, {x}, kLinearEps);
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return in[0].mean(); }, {x}, kLinearEps);
  for (bool keepdim : {false, true}) {
    for (const std::vector<int64_t>& dims :
         std::vector<std::vector<int64_t>>{{0}, {1}, {-1}, {0, 2}, {-1, 1}, {}}) {
      SCOPED_TRACE("dims " + ShapeToString(dims) + (keepdim ? " keepdim" : ""));
      EXPECT_GRADIENTS_MATCH([&](const Inputs& in) { return sum(in[0], dims, keepdim); }, {x},
                             kLinearEps);
      EXPECT_GRADIENTS_MATCH([&](const Inputs& in) { return mean(in[0], dims, keepdim); }, {x},
                             kLinearEps);
    }
  }
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return sum_to(in[0], {3, 1}); }, {x}, kLinearEps);
  // A non-contiguous input.
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return sum(in[0].transpose(0, 2), {1}); }, {x},
                         kLinearEps);
}

TEST_F(OpsTest, GradientsOfAmax) {
  const Tensor x = Param64(Distinct({3, 4}, 251));
  for (int64_t dim : {0, 1, -1}) {
    for (bool keepdim : {false, true}) {
      EXPECT_GRADIENTS_MATCH([&](const Inputs& in) { return amax(in[0], dim, keepdim); }, {x},
                             kLinearEps);
    }
  }
}

}  // namespace
}  // namespace ops_testing
}  // namespace tandem
