// Partial overlap between what an in-place op writes and what it reads is refused, as PyTorch
// refuses it, on every device (on a GPU it would hand cudaMemcpyAsync overlapping ranges or race
// between a grid's threads); full aliases and disjoint views of one storage still work.
#include "tensor/core/mem_overlap.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace tandem {
namespace {

using ::tandem::testing::ErrorOf;
using ::testing::HasSubstr;

std::vector<Device> Devices() {
  std::vector<Device> devices = {Device::Cpu(0)};
  if (::tandem::testing::HasCuda()) devices.push_back(Device::Cuda(0));
  return devices;
}

Tensor Arange(int64_t n, Device device) {
  return arange(n, TensorOptions().dtype(kFloat32)).to(device);
}

TEST(MemOverlapTest, TellsFullPartialAndNoOverlap) {
  const Tensor x = Arange(12, Device::Cpu(0)).reshape({3, 4});
  EXPECT_EQ(OverlapOf(x, x), MemOverlap::kFull);
  EXPECT_EQ(OverlapOf(x, x.detach()), MemOverlap::kFull);
  EXPECT_EQ(OverlapOf(x.narrow(0, 0, 1), x.narrow(0, 1, 2)), MemOverlap::kNo);
  EXPECT_EQ(OverlapOf(x.narrow(0, 0, 2), x.narrow(0, 1, 2)), MemOverlap::kPartial);
  EXPECT_EQ(OverlapOf(x, x.clone()), MemOverlap::kNo);
  // Columns of a row-major matrix interleave: no dense span to compare.
  EXPECT_EQ(OverlapOf(x.narrow(1, 0, 2), x.narrow(1, 1, 2)), MemOverlap::kTooHard);
  // The same span in another order: a square matrix and its transpose.
  const Tensor square = Arange(9, Device::Cpu(0)).reshape({3, 3});
  EXPECT_EQ(OverlapOf(square, square.t()), MemOverlap::kPartial);
}

TEST(MemOverlapTest, PartialOverlapIsRefusedOnEveryDevice) {
  for (Device device : Devices()) {
    SCOPED_TRACE(device.ToString());
    Tensor x = Arange(8, device);
    const std::vector<float> before = x.to(Device::Cpu(0)).to_vector<float>();
    Tensor dst = x.narrow(0, 1, 4);
    const Tensor src = x.narrow(0, 0, 4);
    EXPECT_THAT(ErrorOf([&] { dst.copy_(src); }),
                HasSubstr("copy_: unsupported operation: some elements of the input tensor and "
                          "the written-to tensor refer to a single memory location"));
    EXPECT_THAT(ErrorOf([&] { dst.add_(src); }), HasSubstr("add_: unsupported operation"));
    EXPECT_THAT(ErrorOf([&] { dst.mul_(src); }), HasSubstr("mul_: unsupported operation"));
    EXPECT_THAT(ErrorOf([&] { dst.div_(src); }), HasSubstr("div_: unsupported operation"));
    EXPECT_THAT(ErrorOf([&] { dst.add_(src, 2.0); }), HasSubstr("add_: unsupported operation"));
    Tensor square = Arange(9, device).reshape({3, 3});
    EXPECT_THAT(ErrorOf([&] { square.copy_(square.t()); }), HasSubstr("copy_: unsupported"));
    // Nothing was written.
    EXPECT_EQ(x.to(Device::Cpu(0)).to_vector<float>(), before);
    // The fix the message gives works.
    dst.copy_(src.clone());
    EXPECT_EQ(x.to(Device::Cpu(0)).to_vector<float>(),
              (std::vector<float>{0, 0, 1, 2, 3, 5, 6, 7}));
  }
}

TEST(MemOverlapTest, FullAliasesAndDisjointViewsStillWork) {
  for (Device device : Devices()) {
    SCOPED_TRACE(device.ToString());
    Tensor x = Arange(6, device);
    x.add_(x);
    x.mul_(x);
    x.copy_(x);
    EXPECT_EQ(x.to(Device::Cpu(0)).to_vector<float>(), (std::vector<float>{0, 4, 16, 36, 64, 100}));
    Tensor y = Arange(6, device);
    y.narrow(0, 3, 3).copy_(y.narrow(0, 0, 3));
    y.narrow(0, 0, 3).add_(y.narrow(0, 3, 3));
    EXPECT_EQ(y.to(Device::Cpu(0)).to_vector<float>(), (std::vector<float>{0, 2, 4, 0, 1, 2}));
  }
}

TEST(MemOverlapTest, WritingAnExpandedTensorIsRefused) {
  for (Device device : Devices()) {
    SCOPED_TRACE(device.ToString());
    Tensor row = Arange(3, device);
    Tensor expanded = row.reshape({1, 3}).expand({4, 3});
    EXPECT_THAT(ErrorOf([&] {
                  expanded.copy_(Arange(12, device).reshape({4, 3}));
                }),
                HasSubstr("more than one element of the written-to tensor refers to a single "
                          "memory location"));
    EXPECT_THAT(ErrorOf([&] { expanded.mul_(2.0); }), HasSubstr("mul_: unsupported operation"));
    EXPECT_THAT(ErrorOf([&] {
                  expanded.add_(ones({4, 3}).to(device));
                }),
                HasSubstr("add_: unsupported operation"));
    EXPECT_EQ(row.to(Device::Cpu(0)).to_vector<float>(), (std::vector<float>{0, 1, 2}));
  }
}

}  // namespace
}  // namespace tandem
