// from_blob (tensors over memory the caller owns) and data_ptr<T>().
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "tensor/core/autograd.h"
#include "tensor/runtime/devices.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace tandem {
namespace {

using ::tandem::testing::ErrorOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class FromBlobTest : public ::testing::Test {
 protected:
  void SetUp() override { SetCpuDeviceCount(2); }
};

// A deleter that counts its calls and remembers what it was given.
struct DeleteCounter {
  int calls = 0;
  void* freed = nullptr;
  std::function<void(void*)> deleter() {
    return [this](void* p) {
      ++calls;
      freed = p;
    };
  }
};

TEST_F(FromBlobTest, WrapsTheCallersMemoryWithoutCopying) {
  float buffer[6] = {1, 2, 3, 4, 5, 6};
  Tensor t = from_blob(buffer, {2, 3});
  EXPECT_EQ(t.shape(), (Shape{2, 3}));
  EXPECT_EQ(t.dtype(), kFloat32);
  EXPECT_EQ(t.device(), Device::Cpu(0));
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_FALSE(t.requires_grad());
  EXPECT_EQ(t.data_ptr<float>(), buffer);
  EXPECT_EQ(t.data_ptr(), static_cast<void*>(buffer));
  EXPECT_THAT(t.to_vector<float>(), ElementsAre(1, 2, 3, 4, 5, 6));
  // The caller's writes show through the tensor, and the tensor's through the memory.
  buffer[4] = 42;
  EXPECT_EQ(t.to_vector<float>()[4], 42.0f);
  t.select(0, 0).fill_(-1.0);
  EXPECT_THAT(std::vector<float>(buffer, buffer + 6), ElementsAre(-1, -1, -1, 4, 42, 6));
  // Ops make new tensors; they do not write into the blob.
  Tensor u = add(t, 1.0);
  EXPECT_FALSE(u.shares_storage_with(t));
  EXPECT_THAT(u.to_vector<float>(), ElementsAre(0, 0, 0, 5, 43, 7));
  EXPECT_EQ(buffer[3], 4.0f);
}

TEST_F(FromBlobTest, DeleterRunsExactlyOnceAfterTheLastViewIsGone) {
  DeleteCounter counter;
  float* buffer = new float[12];
  for (int i = 0; i < 12; ++i) buffer[i] = static_cast<float>(i);
  Tensor t = from_blob(buffer, {4, 3}, counter.deleter());
  Tensor view = t.narrow(0, 1, 2).transpose(0, 1);
  Tensor copy_of_view = view;
  Tensor reshaped = t.view({12});
  t = Tensor();
  EXPECT_EQ(counter.calls, 0);
  EXPECT_THAT(view.contiguous().to_vector<float>(), ElementsAre(3, 6, 4, 7, 5, 8));
  view = Tensor();
  reshaped = Tensor();
  EXPECT_EQ(counter.calls, 0) << "a view is still alive";
  copy_of_view = Tensor();
  EXPECT_EQ(counter.calls, 1);
  EXPECT_EQ(counter.freed, buffer);
  delete[] buffer;
}

TEST_F(FromBlobTest, DeleterWaitsForTensorsThatAutogradSaved) {
  DeleteCounter counter;
  std::vector<float> buffer = {1, 2, 3};
  Tensor w = from_vector(std::vector<float>{0.5f, -1.0f, 2.0f}, {3}).set_requires_grad(true);
  Tensor loss;
  {
    Tensor x = from_blob(buffer.data(), {3}, counter.deleter());
    loss = mul(x, w).sum();  // saves x for the gradient of w
  }
  EXPECT_EQ(counter.calls, 0) << "the graph still holds x";
  loss.backward();
  EXPECT_THAT(w.grad().to_vector<float>(), ElementsAre(1, 2, 3));
  loss = Tensor();
  EXPECT_EQ(counter.calls, 1);
}

TEST_F(FromBlobTest, WithoutADeleterTheMemoryIsLeftAlone) {
  std::vector<float> buffer = {1, 2, 3, 4};
  {
    Tensor t = from_blob(buffer.data(), {2, 2});
    Tensor v = t.t();
    EXPECT_EQ(sum(v).item(), 10.0);
  }
  // Still the caller's, unchanged and usable.
  EXPECT_THAT(buffer, ElementsAre(1, 2, 3, 4));
  Tensor again = from_blob(buffer.data(), {4});
  EXPECT_EQ(again.to_vector<float>(), buffer);
}

TEST_F(FromBlobTest, OpsAndAutogradWorkOnABlob) {
  float a_values[6] = {1, 2, 3, 4, 5, 6};
  float b_values[6] = {1, 0, 0, 1, 1, 1};
  Tensor a = from_blob(a_values, {2, 3}, TensorOptions().requires_grad(true));
  Tensor b = from_blob(b_values, {3, 2});
  EXPECT_TRUE(a.is_leaf());
  EXPECT_TRUE(a.requires_grad());
  Tensor product = matmul(a, b);  // [[1+3, 2+3], [4+6, 5+6]]
  EXPECT_THAT(product.to_vector<float>(), ElementsAre(4, 5, 10, 11));
  product.sum().backward();
  // d sum(A B) / dA = 1 B^T: each row holds the row sums of B.
  EXPECT_THAT(a.grad().to_vector<float>(), ElementsAre(1, 1, 2, 1, 1, 2));
  EXPECT_THAT(std::vector<float>(a_values, a_values + 6), ElementsAre(1, 2, 3, 4, 5, 6));
  // To another device: a copy the blob does not share.
  Tensor moved = a.detach().to(Device::Cpu(1));
  EXPECT_EQ(moved.device(), Device::Cpu(1));
  EXPECT_THAT(moved.to_vector<float>(), ElementsAre(1, 2, 3, 4, 5, 6));
  // A blob on another logical CPU device.
  Tensor on_one = from_blob(b_values, {6}, Device::Cpu(1));
  EXPECT_EQ(on_one.device(), Device::Cpu(1));
  EXPECT_EQ(mul(on_one, on_one).sum().item(), 4.0);
}

TEST_F(FromBlobTest, Int64BlobsHoldLabels) {
  int64_t labels[4] = {2, 0, 1, 2};
  Tensor t = from_blob(labels, {4}, kInt64);
  EXPECT_EQ(t.dtype(), kInt64);
  EXPECT_EQ(t.data_ptr<int64_t>(), labels);
  EXPECT_THAT(t.to_vector<int64_t>(), ElementsAre(2, 0, 1, 2));
  Tensor logits = from_vector(std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7, 8}, {3, 3});
  EXPECT_THAT(gather(logits, 1, t.narrow(0, 0, 3).unsqueeze(1)).to_vector<float>(),
              ElementsAre(2, 3, 7));
}

TEST_F(FromBlobTest, StridesDescribeOtherLayouts) {
  // A column-major 2 x 3 matrix: element (i, j) at i + 2 j.
  float column_major[6] = {1, 4, 2, 5, 3, 6};
  Tensor t = from_blob(column_major, {2, 3}, {1, 2});
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_EQ(t.strides(), (std::vector<int64_t>{1, 2}));
  EXPECT_THAT(t.contiguous().to_vector<float>(), ElementsAre(1, 2, 3, 4, 5, 6));
  // Every other element of a buffer, with a deleter.
  DeleteCounter counter;
  float spaced[5] = {10, -1, 20, -1, 30};
  {
    Tensor every_other = from_blob(spaced, {3}, {2}, counter.deleter());
    EXPECT_THAT(every_other.to_vector<float>(), ElementsAre(10, 20, 30));
  }
  EXPECT_EQ(counter.calls, 1);
  // Stride 0 repeats one element.
  float one = 7;
  EXPECT_THAT(from_blob(&one, {3}, std::vector<int64_t>{0}).to_vector<float>(),
              ElementsAre(7, 7, 7));
}

TEST_F(FromBlobTest, EmptyAndZeroDimensionalBlobs) {
  float value = 3.5f;
  Tensor scalar = from_blob(&value, {});
  EXPECT_EQ(scalar.dim(), 0);
  EXPECT_EQ(scalar.item(), 3.5);
  Tensor empty_blob = from_blob(nullptr, {0, 4});
  EXPECT_EQ(empty_blob.numel(), 0);
  EXPECT_EQ(empty_blob.sum().item(), 0.0);
}

TEST_F(FromBlobTest, MistakesAreClearErrorsAndLeaveTheMemoryToTheCaller) {
  DeleteCounter counter;
  float buffer[4] = {1, 2, 3, 4};
  EXPECT_THAT(ErrorOf([&] {
                from_blob(nullptr, {2, 2}, counter.deleter());
              }),
              HasSubstr("from_blob: data is null but shape [2, 2] has 4 elements"));
  EXPECT_THAT(ErrorOf([&] {
                from_blob(buffer, {2, 2}, {1}, counter.deleter());
              }),
              HasSubstr("from_blob: shape [2, 2] has 2 dimensions but strides [1] has 1"));
  EXPECT_THAT(ErrorOf([&] {
                from_blob(buffer, {2, 2}, {-1, 1});
              }),
              HasSubstr("strides must be >= 0 but are [-1, 1]"));
  EXPECT_THAT(ErrorOf([&] {
                from_blob(buffer, {-2, 2});
              }),
              HasSubstr("sizes must be >= 0 but shape is [-2, 2]"));
  EXPECT_THAT(ErrorOf([&] { from_blob(buffer, {4}, TensorOptions().pinned(true)); }),
              HasSubstr("from_blob: the memory is the caller's, so Tandem cannot pin it"));
  EXPECT_THAT(ErrorOf([&] { from_blob(buffer, {4}, Device::Cpu(7)); }), HasSubstr("cpu:7"));
  EXPECT_EQ(counter.calls, 0) << "from_blob threw: the memory stays the caller's";
}

TEST_F(FromBlobTest, DataPtrChecksTheDtypeAndIncludesTheOffset) {
  float buffer[6] = {0, 1, 2, 3, 4, 5};
  Tensor t = from_blob(buffer, {2, 3});
  EXPECT_EQ(t.narrow(0, 1, 1).data_ptr<float>(), buffer + 3);
  EXPECT_EQ(t.select(1, 2).data_ptr<float>(), buffer + 2);
  EXPECT_EQ(t.data<float>(), t.data_ptr<float>());
  EXPECT_THAT(ErrorOf([&] { t.data_ptr<int64_t>(); }),
              HasSubstr("data_ptr<int64_t>() expects a int64 tensor but this one is float32; "
                        "ask for data_ptr<float>() or convert it first with .to(int64)"));
  Tensor labels = zeros({2}, kInt64);
  EXPECT_THAT(ErrorOf([&] { labels.data_ptr<float>(); }),
              HasSubstr("data_ptr<float>() expects a float32 tensor but this one is int64"));
  EXPECT_THAT(ErrorOf([&] { labels.data<float>(); }),
              HasSubstr("data<float>() expects a float32 tensor but this one is int64"));
  EXPECT_THAT(ErrorOf([&] { Tensor().data_ptr<float>(); }),
              HasSubstr("data_ptr() called on an undefined tensor"));
}

TEST_F(FromBlobTest, CudaBlobsWrapDeviceMemory) {
  if (!testing::HasCuda()) GTEST_SKIP() << testing::NoCudaReason();
  const Device gpu = Device::Cuda(0);
  Tensor owner = from_vector(std::vector<float>{1, 2, 3, 4}, {2, 2}, gpu);
  DeleteCounter counter;
  {
    Tensor blob = from_blob(owner.data_ptr(), {2, 2}, counter.deleter(), gpu);
    EXPECT_EQ(blob.device(), gpu);
    EXPECT_TRUE(blob.shares_storage_with(owner));
    EXPECT_THAT(blob.t().contiguous().to_vector<float>(), ElementsAre(1, 3, 2, 4));
    blob.fill_(5.0);
  }
  EXPECT_EQ(counter.calls, 1);
  EXPECT_THAT(owner.to_vector<float>(), ElementsAre(5, 5, 5, 5));
}

}  // namespace
}  // namespace tandem
