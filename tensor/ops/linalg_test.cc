// Tests of the matrix products (tensor/ops/linalg.cc): matmul in every form and linear.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "tensor/gradcheck.h"
#include "tensor/ops/ops_testing.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace tandem {
namespace ops_testing {
namespace {

struct MatmulCase {
  Shape a, b, out;
};

TEST_F(OpsTest, MatmulAllFormsMatchTheHost) {
  const std::vector<MatmulCase> cases = {{{3, 4}, {4, 5}, {3, 5}},
                                         {{2, 3, 4}, {2, 4, 5}, {2, 3, 5}},
                                         {{2, 3, 4}, {4, 5}, {2, 3, 5}},
                                         {{3, 4}, {2, 4, 5}, {2, 3, 5}},
                                         {{1, 3, 4}, {2, 4, 5}, {2, 3, 5}},
                                         {{2, 3, 4}, {1, 4, 5}, {2, 3, 5}},
                                         {{1, 1}, {1, 1}, {1, 1}},
                                         {{4}, {4, 5}, {5}},
                                         {{3, 4}, {4}, {3}},
                                         {{4}, {4}, {}},
                                         {{2, 3, 4}, {4}, {2, 3}},
                                         {{0, 4}, {4, 5}, {0, 5}},
                                         {{3, 0}, {0, 5}, {3, 5}},
                                         {{3, 4}, {4, 0}, {3, 0}}};
  uint64_t seed = 500;
  for (const MatmulCase& c : cases) {
    SCOPED_TRACE(ShapeToString(c.a) + " x " + ShapeToString(c.b));
    const Tensor a = Randn(c.a, ++seed), b = Randn(c.b, ++seed);
    // Host reference with vectors as 1-row / 1-column matrices.
    const Shape a3 = c.a.size() == 1   ? Shape{1, 1, c.a[0]}
                     : c.a.size() == 2 ? Shape{1, c.a[0], c.a[1]}
                                       : c.a;
    const Shape b3 = c.b.size() == 1   ? Shape{1, c.b[0], 1}
                     : c.b.size() == 2 ? Shape{1, c.b[0], c.b[1]}
                                       : c.b;
    const int64_t batch = std::max(a3[0], b3[0]);
    const std::vector<float> expected =
        HostMatmul(Values(a), Values(b), batch, a3[1], a3[2], b3[2], a3[0] == 1, b3[0] == 1);
    ExpectValues(matmul(a, b), c.out, expected, 1e-5);
    ExpectValues(a.matmul(b), c.out, expected, 1e-5);
  }
}

TEST_F(OpsTest, MatmulReadsTransposedAndStridedOperandsInPlace) {
  const Tensor a = Randn({4, 3}, 21), b = Randn({5, 4}, 22);
  const std::vector<float> at = Values(a.t().contiguous()), bt = Values(b.t().contiguous());
  // a.t() and b.t() are column-major views: Gemm's transpose flags read them directly.
  ExpectValues(matmul(a.t(), b.t()), {3, 5}, HostMatmul(at, bt, 1, 3, 4, 5, true, true), 1e-5);
  // A row stride larger than the row (a narrowed view) and a zero-stride (expanded) operand.
  const Tensor wide = Randn({3, 7}, 23);
  const Tensor narrowed = wide.narrow(1, 2, 4);
  const Tensor bv = Randn({4, 2}, 24);
  ExpectValues(matmul(narrowed, bv), {3, 2},
               HostMatmul(Values(narrowed.contiguous()), Values(bv), 1, 3, 4, 2, true, true), 1e-5);
  const Tensor row = Randn({1, 4}, 25).expand({3, 4});
  ExpectValues(matmul(row, bv), {3, 2},
               HostMatmul(Values(row.contiguous()), Values(bv), 1, 3, 4, 2, true, true), 1e-5);
  // Batched, with transposed matrices inside each batch and a permuted batch dimension.
  const Tensor a3 = Randn({4, 2, 3}, 26).permute({1, 2, 0});  // [2, 3, 4]
  const Tensor b3 = Randn({2, 5, 4}, 27).transpose(1, 2);     // [2, 4, 5]
  ExpectValues(
      matmul(a3, b3), {2, 3, 5},
      HostMatmul(Values(a3.contiguous()), Values(b3.contiguous()), 2, 3, 4, 5, false, false), 1e-5);
}

TEST_F(OpsTest, MatmulErrorsSayWhatToFix) {
  EXPECT_THAT(ErrorOf([] {
                matmul(zeros({2, 3}), zeros({4, 5}));
              }),
              HasSubstr("matmul: a is [2, 3] and b is [4, 5]; a.size(-1) (3) must equal "
                        "b.size(-2) (4)"));
  EXPECT_THAT(ErrorOf([] {
                matmul(zeros({2, 3, 4}), zeros({3, 4, 5}));
              }),
              HasSubstr("the batch sizes (2 and 3) must be equal or one of them 1"));
  EXPECT_THAT(ErrorOf([] {
                matmul(zeros({2, 2, 3, 4}), zeros({3, 5}));
              }),
              HasSubstr("a.size(-1) (4) must equal b.size(-2) (3)"));
  EXPECT_THAT(ErrorOf([] {
                matmul(zeros({}), zeros({4, 5}));
              }),
              HasSubstr("matmul: both operands must have at least one dimension"));
  EXPECT_THAT(ErrorOf([] {
                matmul(zeros({2, 3}), zeros({3, 5}, Device::Cpu(1)));
              }),
              HasSubstr("matmul: a is on cpu:0 and b on cpu:1"));
  EXPECT_THAT(ErrorOf([] {
                matmul(zeros({2, 3}), Tensor());
              }),
              HasSubstr("matmul: b is an undefined Tensor"));
}

TEST_F(OpsTest, LinearMatchesTheHostWithAndWithoutBias) {
  const Tensor w = Randn({5, 4}, 31), bias = Randn({5}, 32);
  const std::vector<float> wt = Values(w.t().contiguous()), bv = Values(bias);
  for (const Shape& shape : {Shape{3, 4}, Shape{2, 3, 4}, Shape{4}, Shape{0, 4}}) {
    SCOPED_TRACE(ShapeToString(shape));
    const Tensor x = Randn(shape, 33);
    const int64_t rows = NumElements(shape) / 4;
    std::vector<float> expected = HostMatmul(Values(x), wt, 1, rows, 4, 5, true, true);
    Shape out_shape(shape.begin(), shape.end() - 1);
    out_shape.push_back(5);
    ExpectValues(linear(x, w, Tensor()), out_shape, expected, 1e-5);
    for (size_t i = 0; i < expected.size(); ++i) expected[i] += bv[i % 5];
    ExpectValues(linear(x, w, bias), out_shape, expected, 1e-5);
  }
  EXPECT_THAT(ErrorOf([&] {
                linear(zeros({2, 3}), w, bias);
              }),
              HasSubstr("linear: x is [2, 3] and weight is [5, 4]; x.size(-1) must equal "
                        "weight.size(1) (in_features = 4)"));
  EXPECT_THAT(ErrorOf([&] {
                linear(zeros({2, 4}), w, zeros({4}));
              }),
              HasSubstr("linear: bias must be [5] (out_features) but is [4]"));
  EXPECT_THAT(ErrorOf([&] {
                linear(zeros({2, 4}), zeros({5, 4, 1}), bias);
              }),
              HasSubstr("linear: weight must be 2-D"));
  EXPECT_THAT(ErrorOf([&] {
                linear(zeros({2, 4}), w, zeros({5}, Device::Cpu(1)));
              }),
              HasSubstr("linear: x is on cpu:0 and bias on cpu:1"));
}

TEST_F(OpsTest, GradientsOfMatmulInAllForms) {
  const std::vector<MatmulCase> cases = {{{3, 4}, {4, 2}, {}},       {{2, 3, 4}, {2, 4, 2}, {}},
                                         {{2, 3, 4}, {4, 2}, {}},    {{3, 4}, {2, 4, 2}, {}},
                                         {{1, 3, 4}, {2, 4, 2}, {}}, {{4}, {4, 2}, {}},
                                         {{3, 4}, {4}, {}},          {{4}, {4}, {}}};
  uint64_t seed = 270;
  for (const MatmulCase& c : cases) {
    SCOPED_TRACE(ShapeToString(c.a) + " x " + ShapeToString(c.b));
    const Tensor a = Param64(Randn(c.a, ++seed)), b = Param64(Randn(c.b, ++seed));
    EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return matmul(in[0], in[1]); }, {a, b},
                           kLinearEps);
  }
  // Transposed operands (Gemm's transpose flags, forward and backward).
  const Tensor a = Param64(Randn({4, 3}, 281)), b = Param64(Randn({2, 4}, 282));
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return matmul(in[0].t(), in[1].t()); }, {a, b},
                         kLinearEps);
  EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return in[0].t().matmul(in[1].t()); }, {a, b},
                         kLinearEps);
}

TEST_F(OpsTest, GradientsOfLinear) {
  const Tensor w = Param64(Randn({3, 4}, 291)), b = Param64(Randn({3}, 292));
  for (const Shape& shape : {Shape{2, 4}, Shape{2, 2, 4}, Shape{4}}) {
    SCOPED_TRACE(ShapeToString(shape));
    const Tensor x = Param64(Randn(shape, 293));
    EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return linear(in[0], in[1], in[2]); }, {x, w, b},
                           kLinearEps);
    EXPECT_GRADIENTS_MATCH([](const Inputs& in) { return linear(in[0], in[1], Tensor()); }, {x, w},
                           kLinearEps);
  }
  // Only the weight needs a gradient (the first layer of a network).
  const Tensor x = Randn({2, 4}, 294).to(kFloat64);
  EXPECT_GRADIENTS_MATCH([x](const Inputs& in) { return linear(x, in[0], in[1]); }, {w, b},
                         kLinearEps);
}

// linear_gelu is gelu(linear(...)) wherever it is not fused (the CPU; CUDA's fused form is
// checked against this in tensor/cuda/cuda_gemm_test.cc): the same values bit for bit and the
// same gradients, for both GELU forms, with and without a bias.
TEST_F(OpsTest, LinearGeluIsGeluOfLinear) {
  const Tensor w = Param64(Randn({3, 4}, 295)), b = Param64(Randn({3}, 296));
  const Tensor x = Param64(Randn({2, 2, 4}, 297));
  for (const char* approximate : {"none", "tanh"}) {
    SCOPED_TRACE(approximate);
    const Tensor fused = linear_gelu(x.to(kFloat32), w.to(kFloat32), b.to(kFloat32), approximate);
    const Tensor composed =
        gelu(linear(x.to(kFloat32), w.to(kFloat32), b.to(kFloat32)), approximate);
    EXPECT_EQ(fused.to_vector<float>(), composed.to_vector<float>());
    EXPECT_GRADIENTS_MATCH(
        [approximate](const Inputs& in) { return linear_gelu(in[0], in[1], in[2], approximate); },
        {x, w, b}, kLinearEps);
    EXPECT_GRADIENTS_MATCH(
        [approximate](const Inputs& in) {
          return linear_gelu(in[0], in[1], Tensor(), approximate);
        },
        {x, w}, kLinearEps);
  }
  EXPECT_THAT(ErrorOf([&] { linear_gelu(x, w, b, "fast"); }),
              ::testing::HasSubstr("linear_gelu: approximate must be \"none\""));
}

// linear_gelu_linear is linear(linear_gelu(..., "tanh"), ...) wherever it is not fused (the CPU;
// CUDA's fused form is checked against this in tensor/cuda/cuda_gemm_test.cc): the same values bit
// for bit, the same gradients with and without proj's bias, and linear's messages for bad shapes.
TEST_F(OpsTest, LinearGeluLinearIsTheComposedMlp) {
  const Tensor w1 = Param64(Randn({6, 4}, 301)), b1 = Param64(Randn({6}, 302));
  const Tensor w2 = Param64(Randn({3, 6}, 303)), b2 = Param64(Randn({3}, 304));
  const Tensor x = Param64(Randn({2, 2, 4}, 305));
  const auto f32 = [](const Tensor& t) { return t.to(kFloat32); };
  const Tensor fused = linear_gelu_linear(f32(x), f32(w1), f32(b1), f32(w2), f32(b2));
  const Tensor composed = linear(gelu(linear(f32(x), f32(w1), f32(b1)), "tanh"), f32(w2), f32(b2));
  EXPECT_EQ(fused.shape(), (Shape{2, 2, 3}));
  EXPECT_EQ(fused.to_vector<float>(), composed.to_vector<float>());
  EXPECT_GRADIENTS_MATCH(
      [](const Inputs& in) { return linear_gelu_linear(in[0], in[1], in[2], in[3], in[4]); },
      {x, w1, b1, w2, b2}, 1e-4);
  EXPECT_GRADIENTS_MATCH(
      [](const Inputs& in) { return linear_gelu_linear(in[0], in[1], in[2], in[3], Tensor()); },
      {x, w1, b1, w2}, 1e-4);
  EXPECT_THAT(ErrorOf([&] { linear_gelu_linear(x, w1, b1, w1, b2); }),
              ::testing::HasSubstr("linear: x is [2, 2, 6] and weight is [6, 4]"));
}

}  // namespace
}  // namespace ops_testing
}  // namespace tandem
