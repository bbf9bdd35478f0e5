#include "tensor/tensor.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <numeric>

#include "tensor/core/autograd.h"
#include "tensor/runtime/devices.h"
#include "tensor/testing.h"

namespace tandem {
namespace {

using ::tandem::testing::ErrorOf;

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

Tensor Iota(const Shape& shape, Device device = Device::Cpu(0)) {
  std::vector<float> values(NumElements(shape));
  std::iota(values.begin(), values.end(), 0.0f);
  return from_vector(values, shape, device);
}

class TensorTest : public ::testing::Test {
 protected:
  void SetUp() override { SetCpuDeviceCount(4); }
};

TEST_F(TensorTest, FactoriesFillShapeDtypeAndDevice) {
  Tensor z = zeros({2, 3});
  EXPECT_EQ(z.shape(), (Shape{2, 3}));
  EXPECT_EQ(z.dtype(), kFloat32);
  EXPECT_EQ(z.device(), Device::Cpu(0));
  EXPECT_THAT(z.to_vector<float>(), ElementsAre(0, 0, 0, 0, 0, 0));
  EXPECT_THAT(full({2}, 2.5, Device::Cpu(1)).to_vector<float>(), ElementsAre(2.5f, 2.5f));
  EXPECT_EQ(full({2}, 2.5, Device::Cpu(1)).device(), Device::Cpu(1));
  EXPECT_THAT(ones({3}, kInt64).to_vector<int64_t>(), ElementsAre(1, 1, 1));
  EXPECT_THAT(arange(4).to_vector<int64_t>(), ElementsAre(0, 1, 2, 3));
  EXPECT_EQ(arange(4).dtype(), kInt64);
  EXPECT_EQ(scalar_tensor(3.0).dim(), 0);
  EXPECT_DOUBLE_EQ(scalar_tensor(3.0).item(), 3.0);
  EXPECT_EQ(zeros({0, 5}).numel(), 0);
  EXPECT_THAT(ErrorOf([] { zeros({2, -1}); }), HasSubstr("sizes must be >= 0"));
  EXPECT_THAT(ErrorOf([] {
                from_vector(std::vector<float>{1, 2, 3}, {2, 2});
              }),
              HasSubstr("3 values cannot fill shape [2, 2]"));
  EXPECT_THAT(ErrorOf([] { zeros({2}, Device::Cpu(9)); }), HasSubstr("cpu:9 does not exist"));
}

// Sizes from a corrupt file or a bad computation: a product past int64 is a clear error, not
// an overflow; a 0 anywhere makes an empty tensor however large the other sizes are
// (found by fuzz/checkpoint_fuzzer: regressions/checkpoint/huge-shape-numel-overflow).
TEST_F(TensorTest, ShapesWhoseElementCountOverflowsAreRefused) {
  const int64_t huge = int64_t{1} << 62;
  EXPECT_EQ(NumElements({huge, 4, 0}), 0);
  const Tensor empty_but_huge = from_vector(std::vector<float>{}, {huge, 4, 0});
  EXPECT_EQ(empty_but_huge.numel(), 0);
  EXPECT_THAT(empty_but_huge.strides(), ElementsAre(4, 1, 1));
  EXPECT_THAT(ErrorOf([&] {
                NumElements({huge, 4});
              }),
              HasSubstr("has more elements than an int64 counts"));
  EXPECT_THAT(ErrorOf([&] { zeros({2, huge, 4, 0}); }), HasSubstr("too large for int64 strides"));
  EXPECT_THAT(ErrorOf([&] { zeros({huge, 4}); }), HasSubstr("more elements than an int64 counts"));
  EXPECT_EQ(NumElements({huge, 1}), huge);
}

TEST_F(TensorTest, ViewAndReshapeShareStorage) {
  Tensor x = Iota({2, 3});
  Tensor v = x.view({3, 2});
  EXPECT_TRUE(v.shares_storage_with(x));
  EXPECT_EQ(x.view({-1}).shape(), (Shape{6}));
  EXPECT_EQ(x.reshape({3, -1}).shape(), (Shape{3, 2}));
  v.fill_(7.0);
  EXPECT_THAT(x.to_vector<float>(), ElementsAre(7, 7, 7, 7, 7, 7));
  EXPECT_THAT(ErrorOf([&] { x.view({4, 2}); }), HasSubstr("has 8 elements"));
  EXPECT_THAT(ErrorOf([&] { x.view({-1, -1}); }), HasSubstr("only one dimension can be -1"));
  // A transposed tensor cannot be viewed, but can be reshaped (by copying).
  Tensor t = Iota({2, 3}).t();
  EXPECT_THAT(ErrorOf([&] { t.view({6}); }), HasSubstr("use reshape()"));
  EXPECT_THAT(t.reshape({6}).to_vector<float>(), ElementsAre(0, 3, 1, 4, 2, 5));
  EXPECT_EQ(Iota({2, 3, 4}).flatten(1).shape(), (Shape{2, 12}));
}

TEST_F(TensorTest, NarrowSelectTransposePermute) {
  Tensor x = Iota({3, 4});
  EXPECT_THAT(x.narrow(1, 1, 2).to_vector<float>(), ElementsAre(1, 2, 5, 6, 9, 10));
  EXPECT_THAT(x.narrow(0, 2, 1).to_vector<float>(), ElementsAre(8, 9, 10, 11));
  EXPECT_THAT(x.select(1, -1).to_vector<float>(), ElementsAre(3, 7, 11));
  EXPECT_THAT(x.t().to_vector<float>(), ElementsAre(0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11));
  EXPECT_FALSE(x.t().is_contiguous());
  EXPECT_TRUE(x.t().contiguous().is_contiguous());
  Tensor y = Iota({2, 3, 4});
  EXPECT_EQ(y.permute({2, 0, 1}).shape(), (Shape{4, 2, 3}));
  EXPECT_FLOAT_EQ(y.permute({2, 0, 1}).contiguous().to_vector<float>()[1], 4.0f);
  EXPECT_EQ(x.unsqueeze(0).shape(), (Shape{1, 3, 4}));
  EXPECT_EQ(x.unsqueeze(-1).shape(), (Shape{3, 4, 1}));
  EXPECT_EQ(x.unsqueeze(0).squeeze(0).shape(), (Shape{3, 4}));
  EXPECT_THAT(ErrorOf([&] { x.narrow(1, 3, 2); }),
              HasSubstr("out of range for dimension 1 of size 4"));
  EXPECT_THAT(ErrorOf([&] { x.narrow(2, 0, 1); }), HasSubstr("dimension 2 is out of range"));
  EXPECT_THAT(ErrorOf([&] { x.permute({0, 0}); }), HasSubstr("appears twice"));
}

TEST_F(TensorTest, ChunkFollowsTorchChunk) {
  // 10 rows into 8 chunks: pieces of ceil(10/8) = 2, so only 5 chunks come back.
  std::vector<Tensor> pieces = Iota({10, 2}).chunk(8);
  ASSERT_EQ(pieces.size(), 5u);
  for (const Tensor& p : pieces) EXPECT_EQ(p.size(0), 2);
  // 7 into 3: 3, 3, 1.
  pieces = Iota({7}).chunk(3);
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[2].size(0), 1);
  EXPECT_THAT(pieces[2].to_vector<float>(), ElementsAre(6));
  // Fewer rows than chunks: one row each.
  EXPECT_EQ(Iota({2, 5}).chunk(8).size(), 2u);
  EXPECT_EQ(Iota({3, 4}).chunk(2, 1)[1].shape(), (Shape{3, 2}));
  EXPECT_THAT(ErrorOf([] { Iota({4}).chunk(0); }), HasSubstr("must be positive"));
  std::vector<Tensor> split = Iota({5}).split(2);
  ASSERT_EQ(split.size(), 3u);
  EXPECT_THAT(split[2].to_vector<float>(), ElementsAre(4));
  EXPECT_THAT(ErrorOf([] { Iota({5}).split_with_sizes({2, 2}); }), HasSubstr("add up to 4"));
}

TEST_F(TensorTest, ExpandBroadcastsWithoutCopying) {
  Tensor x = from_vector(std::vector<float>{1, 2, 3}, {3, 1});
  Tensor e = x.expand({2, 3, 4});
  EXPECT_EQ(e.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(e.strides()[0], 0);
  EXPECT_EQ(e.strides()[2], 0);
  EXPECT_FLOAT_EQ(e.contiguous().to_vector<float>()[23], 3.0f);
  EXPECT_THAT(ErrorOf([&] { x.expand({2, 4}); }), HasSubstr("must be 1 or match"));
}

TEST_F(TensorTest, ToReturnsANewTensorAndLeavesTheSourceAlone) {
  Tensor x = Iota({2, 2});
  Tensor y = x.to(Device::Cpu(1));
  EXPECT_EQ(x.device(), Device::Cpu(0));
  EXPECT_EQ(y.device(), Device::Cpu(1));
  EXPECT_FALSE(y.shares_storage_with(x));
  EXPECT_THAT(y.to_vector<float>(), ElementsAre(0, 1, 2, 3));
  EXPECT_TRUE(x.to(Device::Cpu(0)).shares_storage_with(x));
  // Non-contiguous sources are packed on the way.
  EXPECT_THAT(x.t().to(Device::Cpu(2)).to_vector<float>(), ElementsAre(0, 2, 1, 3));
  EXPECT_THAT(from_vector(std::vector<float>{1.7f, -2.2f}, {2}).to(kInt64).to_vector<int64_t>(),
              ElementsAre(1, -2));
  EXPECT_THAT(arange(3).to(kFloat32).to_vector<float>(), ElementsAre(0, 1, 2));
}

TEST_F(TensorTest, InPlaceOpsBroadcastAndRefuseTrackedTensors) {
  Tensor x = zeros({2, 3});
  x.add_(from_vector(std::vector<float>{1, 2, 3}, {3}));
  x.add_(ones({2, 1}), 10.0);
  EXPECT_THAT(x.to_vector<float>(), ElementsAre(11, 12, 13, 11, 12, 13));
  x.mul_(2.0).add_(-1.0);
  EXPECT_THAT(x.to_vector<float>(), ElementsAre(21, 23, 25, 21, 23, 25));
  x.copy_(from_vector(std::vector<float>{5}, {1}));
  EXPECT_THAT(x.to_vector<float>(), ElementsAre(5, 5, 5, 5, 5, 5));
  Tensor across = zeros({2}, Device::Cpu(1));
  across.copy_(from_vector(std::vector<float>{1, 2}, {2}));  // from cpu:0
  EXPECT_THAT(across.to_vector<float>(), ElementsAre(1, 2));
  EXPECT_THAT(ErrorOf([&] { x.add_(ones({3, 3})); }), HasSubstr("cannot be broadcast"));
  EXPECT_THAT(ErrorOf([&] {
                x.add_(ones({2, 3}, Device::Cpu(1)));
              }),
              HasSubstr("move it with .to("));
  Tensor w = ones({2}, TensorOptions().requires_grad(true));
  EXPECT_THAT(ErrorOf([&] { w.add_(1.0); }), HasSubstr("NoGradGuard"));
  {
    NoGradGuard no_grad;
    w.add_(1.0);
  }
  EXPECT_THAT(w.to_vector<float>(), ElementsAre(2, 2));
}

TEST_F(TensorTest, DataAccessChecksDtypeAndSize) {
  Tensor x = from_vector(std::vector<int64_t>{4, 5}, {2});
  EXPECT_THAT(x.to_vector<int64_t>(), ElementsAre(4, 5));
  EXPECT_THAT(ErrorOf([&] { x.to_vector<float>(); }), HasSubstr("called on a int64 tensor"));
  EXPECT_THAT(ErrorOf([&] { x.item(); }), HasSubstr("exactly one element"));
  EXPECT_EQ(x.narrow(0, 1, 1).item<int64_t>(), 5);
  Tensor undefined;
  EXPECT_THAT(ErrorOf([&] { undefined.shape(); }), HasSubstr("undefined tensor"));
}

TEST_F(TensorTest, PrintsLikePyTorch) {
  EXPECT_EQ(from_vector(std::vector<float>{1, -2.5f, 3}, {3}).ToString(),
            "tensor([ 1.0000, -2.5000,  3.0000])");
  EXPECT_EQ(Iota({2, 2}).ToString(), "tensor([[0.0000, 1.0000],\n        [2.0000, 3.0000]])");
  EXPECT_EQ(Iota({2, 1, 1}).ToString(), "tensor([[[0.0000]],\n\n        [[1.0000]]])");
  // int64 is implied by integers, as in PyTorch.
  EXPECT_EQ(arange(3, Device::Cpu(1)).ToString(), "tensor([0, 1, 2], device='cpu:1')");
  EXPECT_EQ(scalar_tensor(2.0).ToString(), "tensor(2.0000)");
  EXPECT_THAT(ones({2}, TensorOptions().requires_grad(true)).ToString(),
              HasSubstr("requires_grad=True"));
  const std::string big = zeros({2000}).ToString();
  EXPECT_THAT(big, HasSubstr("..."));
  EXPECT_LT(big.size(), 200u);
}

TEST_F(TensorTest, PrintsEveryDtypeLikePyTorch) {
  // 16-bit floats print their exact (widened) value with 4 decimals and name the dtype.
  EXPECT_EQ(from_vector(std::vector<float>{1, 2.5f}, {2}, kBFloat16).ToString(),
            "tensor([1.0000, 2.5000], dtype=bfloat16)");
  EXPECT_EQ(from_vector(std::vector<float>{0.1f}, {1}, kFloat16).ToString(),
            "tensor([0.1000], dtype=float16)");
  EXPECT_EQ(from_vector(std::vector<float>{0.1f}, {1}, kBFloat16).ToString(),
            "tensor([0.1001], dtype=bfloat16)");  // bfloat16(0.1) is 0.10009765625
  EXPECT_EQ(from_vector(std::vector<double>{1.5, 2}, {2}).ToString(),
            "tensor([1.5000, 2.0000], dtype=float64)");
  // bool prints True/False, right-aligned as PyTorch pads them, and needs no dtype.
  EXPECT_EQ(from_vector(std::vector<bool>{true, false, true}, {3}).ToString(),
            "tensor([ True, False,  True])");
  EXPECT_EQ(scalar_tensor(1, kBool).ToString(), "tensor(True)");
  // uint8 prints numbers (not characters), int32 names its dtype.
  EXPECT_EQ(from_vector(std::vector<uint8_t>{0, 255}, {2}).ToString(),
            "tensor([  0, 255], dtype=uint8)");
  EXPECT_EQ(from_vector(std::vector<int32_t>{1, -2}, {2}).ToString(),
            "tensor([ 1, -2], dtype=int32)");
  EXPECT_EQ(ones({2}, TensorOptions(kBFloat16).requires_grad(true)).ToString(),
            "tensor([1.0000, 1.0000], dtype=bfloat16, requires_grad=True)");
}

// Every factory makes every dtype, holding the values the float64 factory holds converted.
TEST_F(TensorTest, FactoriesMakeEveryDtype) {
  const DType all[] = {kFloat32, kInt64, kFloat64, kBFloat16, kFloat16, kBool, kInt32, kUInt8};
  for (const DType dtype : all) {
    SCOPED_TRACE(DTypeName(dtype));
    const auto values = [](const Tensor& t) { return t.to(kFloat64).to_vector<double>(); };
    EXPECT_EQ(empty({2, 3}, dtype).dtype(), dtype);
    EXPECT_EQ(empty({2, 3}, dtype).numel(), 6);
    EXPECT_THAT(values(zeros({2}, dtype)), ElementsAre(0, 0));
    EXPECT_THAT(values(ones({2}, dtype)), ElementsAre(1, 1));
    EXPECT_THAT(values(full({2}, 3, dtype)),
                ElementsAre(dtype == kBool ? 1 : 3, dtype == kBool ? 1 : 3));
    EXPECT_EQ(zeros_like(ones({2}, dtype)).dtype(), dtype);
    EXPECT_EQ(ones_like(zeros({2}, dtype)).dtype(), dtype);
    const Tensor s = scalar_tensor(5, dtype);
    EXPECT_EQ(s.dtype(), dtype);
    EXPECT_EQ(s.dim(), 0);
    EXPECT_DOUBLE_EQ(s.item(), dtype == kBool ? 1.0 : 5.0);
    if (dtype != kBool) {
      EXPECT_EQ(arange(4, dtype).dtype(), dtype);
      EXPECT_THAT(values(arange(4, dtype)), ElementsAre(0, 1, 2, 3));
    }
    // On another logical device too.
    EXPECT_EQ(ones({1}, TensorOptions(dtype).device(Device::Cpu(2))).device(), Device::Cpu(2));
    EXPECT_THAT(values(ones({1}, TensorOptions(dtype).device(Device::Cpu(2))).to(Device::Cpu())),
                ElementsAre(1));
  }
}

TEST_F(TensorTest, FromVectorTakesEveryElementType) {
  const Tensor b = from_vector(std::vector<BFloat16>{BFloat16(1.5f), BFloat16(-2.0f)}, {2});
  EXPECT_EQ(b.dtype(), kBFloat16);
  EXPECT_EQ(static_cast<float>(b.to_vector<BFloat16>()[0]), 1.5f);
  const Tensor h = from_vector(std::vector<Half>{Half(0.25f)}, {1});
  EXPECT_EQ(h.dtype(), kFloat16);
  EXPECT_EQ(h.item<float>(), 0.25f);
  const Tensor i = from_vector(std::vector<int32_t>{-7, 2147483647}, {2});
  EXPECT_EQ(i.dtype(), kInt32);
  EXPECT_THAT(i.to_vector<int32_t>(), ElementsAre(-7, 2147483647));
  const Tensor u = from_vector(std::vector<uint8_t>{0, 128, 255}, {3});
  EXPECT_EQ(u.dtype(), kUInt8);
  EXPECT_THAT(u.to_vector<uint8_t>(), ElementsAre(0, 128, 255));
  const Tensor m = from_vector(std::vector<bool>{true, false, true, true}, {2, 2});
  EXPECT_EQ(m.dtype(), kBool);
  EXPECT_THAT(m.to_vector<bool>(), ElementsAre(true, false, true, true));
  EXPECT_THAT(ErrorOf([] { from_vector(std::vector<bool>{true}, {2}); }),
              HasSubstr("1 values cannot fill shape [2]"));
  // Options convert: float values rounded once to bfloat16, uint8 pixels widened to float.
  const Tensor rounded = from_vector(std::vector<float>{0.1f}, {1}, kBFloat16);
  EXPECT_EQ(rounded.item<float>(), 0.10009765625f);
  EXPECT_THAT(from_vector(std::vector<uint8_t>{3, 250}, {2}, kFloat32).to_vector<float>(),
              ElementsAre(3.0f, 250.0f));
  EXPECT_EQ(from_vector(std::vector<bool>{true}, {1}, TensorOptions(kInt32).device(Device::Cpu(1)))
                .to(Device::Cpu())
                .to_vector<int32_t>(),
            std::vector<int32_t>{1});
}

TEST_F(TensorTest, ItemReadsEveryDtype) {
  EXPECT_EQ(scalar_tensor(2.5, kBFloat16).item(), 2.5);
  EXPECT_EQ(scalar_tensor(2.5, kFloat16).item<float>(), 2.5f);
  EXPECT_EQ(scalar_tensor(-3, kInt32).item<int32_t>(), -3);
  EXPECT_EQ(scalar_tensor(200, kUInt8).item<int>(), 200);
  EXPECT_TRUE(scalar_tensor(1, kBool).item<bool>());
  EXPECT_FALSE(scalar_tensor(0, kBool).item<bool>());
  EXPECT_EQ(scalar_tensor(0.1, kFloat16).item<Half>().bits, Half(0.1f).bits);
  // int64 beyond 2^53 stays exact through item<int64_t>().
  const int64_t big = (int64_t{1} << 60) + 1;
  EXPECT_EQ(from_vector(std::vector<int64_t>{big}, {1}).item<int64_t>(), big);
  EXPECT_THAT(ErrorOf([] { zeros({2}, kBool).item<bool>(); }), HasSubstr("exactly one element"));
}

// to(dtype) between every pair, as PyTorch converts.
TEST_F(TensorTest, ToConvertsBetweenEveryPairOfDtypes) {
  const DType all[] = {kFloat32, kInt64, kFloat64, kBFloat16, kFloat16, kBool, kInt32, kUInt8};
  // Values every dtype holds exactly (bool: 0 stays false, the rest become true).
  const Tensor source = from_vector(std::vector<double>{0, 1, 2, 100}, {4});
  for (const DType from : all) {
    for (const DType to : all) {
      SCOPED_TRACE(std::string(DTypeName(from)) + " -> " + DTypeName(to));
      const Tensor x = source.to(from);
      const Tensor y = x.to(to);
      EXPECT_EQ(y.dtype(), to);
      const std::vector<double> got = y.to(kFloat64).to_vector<double>();
      const bool boolean = from == kBool || to == kBool;
      EXPECT_THAT(got, boolean ? ElementsAre(0, 1, 1, 1) : ElementsAre(0, 1, 2, 100));
      if (from == to) {
        EXPECT_TRUE(y.shares_storage_with(x));
      }
    }
  }
  // Floating to integral truncates toward zero; anything nonzero (NaN too) is true.
  const Tensor f = from_vector(std::vector<float>{2.7f, -2.7f, 0.0f, std::nanf("")}, {4});
  EXPECT_THAT(f.narrow(0, 0, 3).to(kInt32).to_vector<int32_t>(), ElementsAre(2, -2, 0));
  EXPECT_THAT(f.to(kBool).to_vector<bool>(), ElementsAre(true, true, false, true));
  // To 16-bit floats rounds to nearest even.
  EXPECT_EQ(from_vector(std::vector<float>{0.1f}, {1}).to(kFloat16).item<float>(),
            static_cast<float>(Half(0.1f)));
  // Strided sources convert too.
  const Tensor t = arange(6).reshape({2, 3}).transpose(0, 1);
  EXPECT_THAT(t.to(kBFloat16).to(kFloat32).to_vector<float>(), ElementsAre(0, 3, 1, 4, 2, 5));
}

// to(dtype) between floating dtypes is differentiable; the gradient comes back in the
// source's dtype (a float32 master weight used in bfloat16 gets a float32 gradient).
TEST_F(TensorTest, ToDtypeSendsTheGradientBackConverted) {
  for (const DType low : {kBFloat16, kFloat16}) {
    SCOPED_TRACE(DTypeName(low));
    Tensor master = from_vector(std::vector<float>{1.0f, 2.0f, 3.0f}, {3});
    master.set_requires_grad(true);
    Tensor y = master.to(low);
    ASSERT_TRUE(y.requires_grad());
    y.backward(from_vector(std::vector<float>{0.5f, 0.25f, 3.0f}, {3}, low));
    EXPECT_EQ(master.grad().dtype(), kFloat32);
    EXPECT_THAT(master.grad().to_vector<float>(), ElementsAre(0.5f, 0.25f, 3.0f));

    Tensor leaf = ones({2}, TensorOptions(low).requires_grad(true));
    Tensor loss = (leaf.to(kFloat32) * 3.0).sum();
    loss.backward();
    EXPECT_EQ(leaf.grad().dtype(), low);
    EXPECT_THAT(leaf.grad().to(kFloat32).to_vector<float>(), ElementsAre(3.0f, 3.0f));
    // A 16-bit loss seeds its own backward with 16-bit ones.
    Tensor leaf2 = ones({2}, TensorOptions(low).requires_grad(true));
    (leaf2 * 2.0).sum().backward();
    EXPECT_EQ(leaf2.grad().dtype(), low);
  }
  // Mixed operands promote (bfloat16 * float32 is float32), but each input's gradient comes
  // back in its own dtype, as PyTorch's engine converts it.
  Tensor h = ones({2}, TensorOptions(kBFloat16).requires_grad(true));
  Tensor f = full({2}, 3.0, TensorOptions().requires_grad(true));
  Tensor product = h * f;
  EXPECT_EQ(product.dtype(), kFloat32);
  product.sum().backward();
  EXPECT_EQ(h.grad().dtype(), kBFloat16);
  EXPECT_THAT(h.grad().to(kFloat32).to_vector<float>(), ElementsAre(3.0f, 3.0f));
  EXPECT_EQ(f.grad().dtype(), kFloat32);
  EXPECT_THAT(f.grad().to_vector<float>(), ElementsAre(1.0f, 1.0f));
  // To an integral dtype, nothing is recorded (no gradient flows through integers).
  Tensor w = ones({2}, TensorOptions().requires_grad(true));
  EXPECT_FALSE(w.to(kInt32).requires_grad());
  EXPECT_FALSE(w.to(kBool).requires_grad());
}

TEST_F(TensorTest, DetachSharesDataButLeavesTheGraph) {
  Tensor w = ones({2}, TensorOptions().requires_grad(true));
  Tensor d = w.detach();
  EXPECT_FALSE(d.requires_grad());
  EXPECT_TRUE(d.shares_storage_with(w));
  EXPECT_TRUE(w.is_leaf());
  EXPECT_THAT(
      ErrorOf([] { arange(2).set_requires_grad(true); }),
      HasSubstr("only floating-point tensors (float32, float64, bfloat16, float16) can require"));
}

TEST_F(TensorTest, AliasOnCpuDeviceSharesMemoryAndChangesOnlyTheDevice) {
  Tensor x = arange(6).to(kFloat32).reshape({2, 3}).transpose(0, 1);
  Tensor a = alias_on_cpu_device(x, Device::Cpu(1));
  EXPECT_EQ(a.device(), Device::Cpu(1));
  EXPECT_EQ(a.shape(), x.shape());
  EXPECT_EQ(a.strides(), x.strides());
  EXPECT_TRUE(a.shares_storage_with(x));
  EXPECT_EQ(a.contiguous().to_vector<float>(), x.contiguous().to_vector<float>());
  x.fill_(7.0f);
  EXPECT_EQ(a.contiguous().to_vector<float>(), std::vector<float>(6, 7.0f));
  EXPECT_FALSE(alias_on_cpu_device(ones({2}, TensorOptions().requires_grad(true)), Device::Cpu(2))
                   .requires_grad());
  EXPECT_THAT(ErrorOf([] { alias_on_cpu_device(ones({1}), Device::Cuda(0)); }),
              HasSubstr("only logical CPU devices share memory"));
}

}  // namespace
}  // namespace tandem
