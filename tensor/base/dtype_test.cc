// The dtype table, PyTorch's type promotion, and float64 end to end: factories, conversions,
// printing, every floating op against its float32 result, and gradients that flow across
// dtypes.
#include "tensor/base/dtype.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "tensor/gradcheck.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace tandem {
namespace {

using ::tandem::testing::ErrorOf;
using ::testing::HasSubstr;

TEST(DTypeTest, TheTableGivesSizesNamesAndCodes) {
  EXPECT_EQ(ElementSize(kFloat32), 4u);
  EXPECT_EQ(ElementSize(kInt64), 8u);
  EXPECT_EQ(ElementSize(kFloat64), 8u);
  EXPECT_STREQ(DTypeName(kFloat64), "float64");
  EXPECT_EQ(DTypeOf<double>::value, kFloat64);
  // Checkpoints store the enum values: they never change.
  EXPECT_EQ(static_cast<int>(kFloat32), 0);
  EXPECT_EQ(static_cast<int>(kInt64), 1);
  EXPECT_EQ(static_cast<int>(kFloat64), 2);
  EXPECT_EQ(static_cast<int>(kBFloat16), 3);
  EXPECT_EQ(static_cast<int>(kFloat16), 4);
  EXPECT_EQ(static_cast<int>(kBool), 5);
  EXPECT_EQ(static_cast<int>(kInt32), 6);
  EXPECT_EQ(static_cast<int>(kUInt8), 7);
  EXPECT_EQ(ElementSize(kBFloat16), 2u);
  EXPECT_EQ(ElementSize(kFloat16), 2u);
  EXPECT_EQ(ElementSize(kBool), 1u);
  EXPECT_EQ(ElementSize(kInt32), 4u);
  EXPECT_EQ(ElementSize(kUInt8), 1u);
  EXPECT_STREQ(DTypeName(kBFloat16), "bfloat16");
  EXPECT_STREQ(DTypeName(kHalf), "float16");
  EXPECT_TRUE(IsValidDTypeCode(7));
  EXPECT_FALSE(IsValidDTypeCode(8));
  EXPECT_TRUE(IsFloatingPoint(kBFloat16));
  EXPECT_TRUE(IsReducedFloatingPoint(kFloat16));
  EXPECT_FALSE(IsReducedFloatingPoint(kFloat32));
  EXPECT_TRUE(IsIntegral(kUInt8));
  EXPECT_FALSE(IsIntegral(kBool));
  EXPECT_TRUE(IsIntegral(kBool, /*include_bool=*/true));
  EXPECT_FALSE(IsValidDTypeCode(-1));
  EXPECT_TRUE(IsFloatingPoint(kFloat64));
  EXPECT_FALSE(IsFloatingPoint(kInt64));
}

TEST(DTypeTest, DispatchCallsTheBodyWithTheCppTypeOrSaysWhatTheOpTakes) {
  const auto size_of = [](DType t) {
    return DispatchDType(t, "size_of",
                         [](auto tag) { return sizeof(typename decltype(tag)::type); });
  };
  EXPECT_EQ(size_of(kFloat64), sizeof(double));
  EXPECT_EQ(size_of(kInt64), sizeof(int64_t));
  EXPECT_THAT(ErrorOf([] { DispatchFloatingTypes(kInt64, "my_op", [](auto) {}); }),
              HasSubstr("my_op is not defined for int64 tensors (it takes float32 or float64)"));
}

TEST(DTypeTest, PromotionFollowsPyTorch) {
  // torch.promote_types over the lattice bool < uint8 < int32 < int64 < 16-bit floats <
  // float32 < float64.
  EXPECT_EQ(PromoteTypes(kBool, kUInt8), kUInt8);
  EXPECT_EQ(PromoteTypes(kUInt8, kInt32), kInt32);
  EXPECT_EQ(PromoteTypes(kInt32, kInt64), kInt64);
  EXPECT_EQ(PromoteTypes(kInt64, kBFloat16), kBFloat16);
  EXPECT_EQ(PromoteTypes(kFloat16, kUInt8), kFloat16);
  EXPECT_EQ(PromoteTypes(kBFloat16, kFloat16), kFloat32);
  EXPECT_EQ(PromoteTypes(kFloat16, kBFloat16), kFloat32);
  EXPECT_EQ(PromoteTypes(kBFloat16, kFloat32), kFloat32);
  EXPECT_EQ(PromoteTypes(kFloat16, kFloat64), kFloat64);
  EXPECT_EQ(PromoteTypes(kBool, kBool), kBool);
  EXPECT_EQ(PromoteTypes(kInt64, kFloat32), kFloat32);
  EXPECT_EQ(PromoteTypes(kFloat32, kFloat64), kFloat64);
  EXPECT_EQ(PromoteTypes(kInt64, kFloat64), kFloat64);
  EXPECT_EQ(PromoteTypes(kFloat64, kInt64), kFloat64);
  const Tensor f32 = ones({3}), f64 = ones({3}, kFloat64), i64 = ones({3}, kInt64);
  EXPECT_EQ(result_type(f32, f64), kFloat64);
  EXPECT_EQ(result_type(i64, f32), kFloat32);
  // Zero-dimensional tensors count only when of a higher category (torch.result_type).
  EXPECT_EQ(result_type(f32, scalar_tensor(1.0, kFloat64)), kFloat32);
  EXPECT_EQ(result_type(i64, scalar_tensor(1.0, kFloat64)), kFloat64);
  EXPECT_EQ(result_type(scalar_tensor(1.0, kFloat64), scalar_tensor(1.0)), kFloat64);
  EXPECT_EQ(add(f32, f64).dtype(), kFloat64);
  EXPECT_EQ(mul(f32, scalar_tensor(2.0, kFloat64)).dtype(), kFloat32);
  EXPECT_EQ(div(i64, i64).dtype(), kFloat32);
  EXPECT_EQ(div(f64, i64).dtype(), kFloat64);
  EXPECT_EQ((f64 / 2.0).dtype(), kFloat64);
  EXPECT_EQ(exp(i64).dtype(), kFloat32);
  EXPECT_EQ(exp(f64).dtype(), kFloat64);
}

TEST(DTypeTest, Float64FactoriesConversionsAndPrinting) {
  EXPECT_EQ(zeros({2}, kFloat64).dtype(), kFloat64);
  EXPECT_THAT(full({2}, 0.1, kFloat64).to_vector<double>(), ::testing::ElementsAre(0.1, 0.1));
  EXPECT_DOUBLE_EQ(full({}, 1.0 / 3.0, kFloat64).item(), 1.0 / 3.0);
  const std::vector<double> values = {1.0 + 1e-12, -2.5};
  const Tensor x = from_vector(values, {2});
  EXPECT_EQ(x.dtype(), kFloat64);
  EXPECT_EQ(x.to_vector<double>(), values);  // no rounding through float32
  EXPECT_EQ(x.to(kFloat32).to_vector<float>(), (std::vector<float>{1.0f, -2.5f}));
  EXPECT_EQ(x.to(kInt64).to_vector<int64_t>(), (std::vector<int64_t>{1, -2}));
  EXPECT_EQ(arange(3).to(kFloat64).to_vector<double>(), (std::vector<double>{0, 1, 2}));
  EXPECT_EQ(x.data_ptr<double>()[1], -2.5);
  EXPECT_THAT(ErrorOf([&] { x.data_ptr<float>(); }),
              HasSubstr("expects a float32 tensor but this one is float64; ask for "
                        "data_ptr<double>()"));
  EXPECT_EQ(from_vector(std::vector<double>{1.5, 2.0}, {2}).ToString(),
            "tensor([1.5000, 2.0000], dtype=float64)");
  EXPECT_EQ(scalar_tensor(0.25, kFloat64).ToString(), "tensor(0.2500, dtype=float64)");
}

TEST(DTypeTest, Float64RandomNumbersAreTheFloat32NumbersWidened) {
  Generator a(7), b(7);
  const Tensor u64 = rand({100}, kFloat64, &a);
  const Tensor u32 = rand({100}, {}, &b);
  EXPECT_EQ(u64.dtype(), kFloat64);
  EXPECT_TRUE(allclose(u64, u32.to(kFloat64), 0.0, 0.0));
  const Tensor n64 = randn({100}, kFloat64, &a);
  const Tensor n32 = randn({100}, {}, &b);
  EXPECT_TRUE(allclose(n64, n32.to(kFloat64), 0.0, 0.0));
  EXPECT_THAT(ErrorOf([] { rand({2}, kInt64); }),
              HasSubstr("random tensors are floating-point (float32, float64, bfloat16 or "
                        "float16); got dtype int64"));
}

// Every floating op computes in float64 when given float64, with the float32 result within
// float32's precision (so neither path is wrong), and its float64 gradients pass a float64
// gradient check.
TEST(DTypeTest, EveryFloatingOpRunsInFloat64) {
  struct Case {
    std::string name;
    std::function<Tensor(const std::vector<Tensor>&)> f;
    std::vector<Tensor> inputs;  // float32 here; the case runs them in both dtypes
  };
  Generator gen(11);
  const auto r = [&](const Shape& shape) { return randn(shape, {}, &gen); };
  const auto positive = [&](const Shape& shape) { return uniform(shape, 0.5, 2.0, {}, &gen); };
  const Tensor labels = from_vector(std::vector<int64_t>{2, 0, 1}, {3}, kInt64);
  const std::vector<Case> cases = {
      {"add", [](auto& in) { return add(in[0], in[1]); }, {r({2, 3}), r({3})}},
      {"mul", [](auto& in) { return mul(in[0], in[1]); }, {r({2, 3}), r({2, 1})}},
      {"div", [](auto& in) { return div(in[0], in[1]); }, {r({2, 3}), positive({2, 3})}},
      {"exp", [](auto& in) { return exp(in[0]); }, {r({2, 3})}},
      {"log", [](auto& in) { return log(in[0]); }, {positive({2, 3})}},
      {"sqrt", [](auto& in) { return sqrt(in[0]); }, {positive({2, 3})}},
      {"tanh", [](auto& in) { return tanh(in[0]); }, {r({2, 3})}},
      {"sigmoid", [](auto& in) { return sigmoid(in[0]); }, {r({2, 3})}},
      {"gelu", [](auto& in) { return gelu(in[0]); }, {r({2, 3})}},
      {"pow", [](auto& in) { return pow(in[0], 2.5); }, {positive({2, 3})}},
      {"sum", [](auto& in) { return sum(in[0], {1}); }, {r({2, 3})}},
      {"mean", [](auto& in) { return mean(in[0]); }, {r({2, 3})}},
      {"amax", [](auto& in) { return amax(in[0], 1); }, {r({2, 3})}},
      {"softmax", [](auto& in) { return softmax(in[0], 1); }, {r({2, 4})}},
      {"log_softmax", [](auto& in) { return log_softmax(in[0], 0); }, {r({3, 2})}},
      {"matmul", [](auto& in) { return matmul(in[0], in[1]); }, {r({2, 3, 4}), r({4, 5})}},
      {"linear",
       [](auto& in) { return linear(in[0], in[1], in[2]); },
       {r({2, 4}), r({3, 4}), r({3})}},
      {"cross_entropy", [labels](auto& in) { return cross_entropy(in[0], labels); }, {r({3, 4})}},
      {"mse_loss", [](auto& in) { return mse_loss(in[0], in[1]); }, {r({2, 3}), r({2, 3})}},
      {"conv2d",
       [](auto& in) {
         return conv2d(in[0], in[1], in[2], {1, 1}, {1, 1});
       },
       {r({2, 2, 5, 5}), r({3, 2, 3, 3}), r({3})}},
      {"max_pool2d",
       [](auto& in) {
         return max_pool2d(in[0], {2, 2});
       },
       {r({1, 2, 4, 4})}},
      {"avg_pool2d",
       [](auto& in) {
         return avg_pool2d(in[0], {2, 2});
       },
       {r({1, 2, 4, 4})}},
      {"adaptive_avg_pool2d",
       [](auto& in) {
         return adaptive_avg_pool2d(in[0], {2, 3});
       },
       {r({1, 2, 5, 5})}},
      {"gather",
       [](auto& in) {
         return gather(in[0], 1, from_vector(std::vector<int64_t>{0, 2, 1, 1}, {2, 2}, kInt64));
       },
       {r({2, 3})}},
      {"cat",
       [](auto& in) {
         return cat({in[0], in[1]}, 1);
       },
       {r({2, 1}), r({2, 3})}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::vector<Tensor> in64;
    for (const Tensor& t : c.inputs) in64.push_back(t.to(kFloat64).set_requires_grad(true));
    const Tensor y32 = c.f(c.inputs);
    const Tensor y64 = c.f(in64);
    EXPECT_EQ(y64.dtype(), kFloat64);
    EXPECT_TRUE(allclose(y32.to(kFloat64), y64, 1e-5, 1e-5)) << y32 << " vs " << y64;
    EXPECT_GRADIENTS_MATCH(c.f, in64);
  }
}

TEST(DTypeTest, GradientsFlowBackThroughConversions) {
  const Tensor x = full({3}, 0.5).set_requires_grad(true);
  const Tensor y = (x.to(kFloat64) * 3.0).sum();
  EXPECT_EQ(y.dtype(), kFloat64);
  y.backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_EQ(x.grad().dtype(), kFloat32);
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{3, 3, 3}));
}

TEST(DTypeTest, OperandsThatMeetInOneKernelMustShareTheirDtype) {
  const Tensor x = ones({2, 3}), w64 = ones({4, 3}, kFloat64);
  EXPECT_THAT(ErrorOf([&] { linear(x, w64, Tensor()); }),
              HasSubstr("linear: x is float32 but weight is float64; both must have one dtype: "
                        "convert one with .to(float32)"));
  EXPECT_THAT(ErrorOf([&] { matmul(x, w64.t()); }),
              HasSubstr("matmul: a is float32 but b is float64"));
  EXPECT_THAT(ErrorOf([] { ones({2}, kInt64).set_requires_grad(true); }),
              HasSubstr("only floating-point tensors (float32, float64, bfloat16, float16) can "
                        "require gradients"));
}

}  // namespace
}  // namespace tandem
