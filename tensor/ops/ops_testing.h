// Shared helpers of the op tests in tensor/ops (elementwise_test.cc, reduce_test.cc, ...): random
// inputs, float64 leaves for gradient checks, host references (broadcasting, reductions, matrix
// products) and the OpsTest fixture, which gives the CPU two devices. The tests live in
// namespace tandem::ops_testing so that they find these helpers unqualified.
//
//   TEST_F(OpsTest, NegFlipsTheSign) {
//     const Tensor x = Randn({2, 3}, /*seed=*/1);
//     std::vector<float> expected = Values(x);
//     for (float& v : expected) v = -v;
//     ExpectValues(neg(x), {2, 3}, expected);
//   }
#ifndef TANDEM_TENSOR_OPS_OPS_TESTING_H_
#define TANDEM_TENSOR_OPS_OPS_TESTING_H_

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "tensor/runtime/devices.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace tandem {
namespace ops_testing {

using ::tandem::testing::ErrorOf;

using ::testing::ElementsAre;
using ::testing::HasSubstr;

using Inputs = std::vector<Tensor>;

inline std::vector<float> Values(const Tensor& t) { return t.to_vector<float>(); }

// An int64 tensor (class labels, indices) from host values.
inline Tensor Labels(const std::vector<int64_t>& values, const Shape& shape,
                     Device device = Device::Cpu(0)) {
  return from_vector(values, shape, TensorOptions(kInt64).device(device));
}

inline Tensor Randn(const Shape& shape, uint64_t seed) {
  Generator gen(seed);
  return randn(shape, {}, &gen);
}

inline Tensor Uniform(const Shape& shape, double low, double high, uint64_t seed) {
  Generator gen(seed);
  return uniform(shape, low, high, {}, &gen);
}

// A leaf that requires grad.
inline Tensor Param(Tensor t) {
  Tensor leaf = t.detach();
  leaf.set_requires_grad(true);
  return leaf;
}

// A float64 leaf: gradient checks run in float64, where finite differences resolve a wrong
// gradient to about 1e-10 instead of float32's 1e-4.
inline Tensor Param64(const Tensor& t) { return Param(t.to(kFloat64)); }

// Values in [-1.2, -0.2] or [0.2, 1.2]: away from the kinks of relu and abs at 0.
inline Tensor AwayFromZero(const Shape& shape, uint64_t seed) {
  const std::vector<float> u = Values(Uniform(shape, -1.0, 1.0, seed));
  std::vector<float> v(u.size());
  for (size_t i = 0; i < u.size(); ++i) v[i] = u[i] < 0 ? u[i] - 0.2f : u[i] + 0.2f;
  return from_vector(v, shape);
}

// Distinct values spaced `spacing` apart in random order: no ties within a finite step.
inline Tensor Distinct(const Shape& shape, uint64_t seed, float spacing = 0.05f,
                       float shift = 0.0f) {
  Generator gen(seed);
  const std::vector<int64_t> perm = randperm(NumElements(shape), &gen).to_vector<int64_t>();
  std::vector<float> v(perm.size());
  const float center = 0.5f * static_cast<float>(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) v[i] = (perm[i] - center) * spacing + shift;
  return from_vector(v, shape);
}

inline void ExpectValues(const Tensor& actual, const Shape& shape,
                         const std::vector<float>& expected, double tol = 1e-5) {
  ASSERT_TRUE(actual.defined());
  ASSERT_EQ(actual.shape(), shape);
  ASSERT_EQ(actual.dtype(), kFloat32);
  const std::vector<float> got = Values(actual);
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(expected[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << "element " << i << " is " << got[i] << ", not NaN";
      continue;
    }
    if (std::isinf(expected[i])) {
      EXPECT_EQ(got[i], expected[i]) << "element " << i;
      continue;
    }
    EXPECT_NEAR(got[i], expected[i], tol * std::max(1.0f, std::fabs(expected[i])))
        << "element " << i << " of " << ShapeToString(shape);
  }
}

// Flat index into `in` of element `flat` of `out` under NumPy broadcasting.
inline int64_t BroadcastSource(int64_t flat, const Shape& out, const Shape& in) {
  int64_t source = 0, stride = 1;
  const int64_t lead = static_cast<int64_t>(out.size() - in.size());
  for (int64_t d = static_cast<int64_t>(out.size()) - 1; d >= 0; --d) {
    const int64_t coord = flat % out[d];
    flat /= out[d];
    if (d >= lead) {
      if (in[d - lead] != 1) source += coord * stride;
      stride *= in[d - lead];
    }
  }
  return source;
}

inline Shape BroadcastShape(const Shape& a, const Shape& b) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    out[i] = da == 1 ? db : da;
  }
  return out;
}

// Reduces contiguous host values of `shape` over the sorted `dims` (keepdim shape).
inline std::vector<double> HostReduce(const std::vector<float>& values, const Shape& shape,
                                      const std::vector<int64_t>& dims, double init,
                                      const std::function<double(double, double)>& combine) {
  Shape kept = shape;
  for (int64_t d : dims) kept[d] = 1;
  std::vector<double> out(NumElements(kept), init);
  for (int64_t flat = 0; flat < static_cast<int64_t>(values.size()); ++flat) {
    int64_t rest = flat, target = 0, stride = 1;
    for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
      const int64_t coord = rest % shape[d];
      rest /= shape[d];
      if (kept[d] != 1) target += coord * stride;
      stride *= kept[d];
    }
    out[target] = combine(out[target], values[flat]);
  }
  return out;
}

inline std::vector<float> ToFloat(const std::vector<double>& v) {
  return std::vector<float>(v.begin(), v.end());
}

// Host matrix product of [batch, m, k] and [batch, k, n] (batch stride 0 when shared).
inline std::vector<float> HostMatmul(const std::vector<float>& a, const std::vector<float>& b,
                                     int64_t batch, int64_t m, int64_t k, int64_t n, bool a_shared,
                                     bool b_shared) {
  std::vector<float> c(batch * m * n, 0.0f);
  for (int64_t p = 0; p < batch; ++p) {
    const float* ap = a.data() + (a_shared ? 0 : p * m * k);
    const float* bp = b.data() + (b_shared ? 0 : p * k * n);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t q = 0; q < k; ++q) s += static_cast<double>(ap[i * k + q]) * bp[q * n + j];
        c[(p * m + i) * n + j] = static_cast<float>(s);
      }
    }
  }
  return c;
}

class OpsTest : public ::testing::Test {
 protected:
  void SetUp() override { SetCpuDeviceCount(2); }
};

// Linear (or piecewise-linear) functions are exact under central differences, so a larger
// step loses less to float32 rounding.
inline constexpr double kLinearEps = 1e-2;

}  // namespace ops_testing
}  // namespace tandem

#endif  // TANDEM_TENSOR_OPS_OPS_TESTING_H_
