#include "tensor/core/storage_residency.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace tandem {
namespace {

using testing::ErrorOf;
using ::testing::HasSubstr;

TEST(StorageResidencyTest, ViewsSeeTheRestoredMemory) {
  Tensor base = arange(6, TensorOptions().dtype(kFloat32));
  Tensor tail = base.narrow(0, 3, 3);
  EXPECT_FALSE(IsStorageReleased(tail));
  ReleaseStorage(base);
  EXPECT_TRUE(IsStorageReleased(tail));
  EXPECT_EQ(tail.shape(), (Shape{3}));  // the geometry stays
  EXPECT_THAT(ErrorOf([&] { (void)tail.to_vector<float>(); }),
              HasSubstr("[3] float32 tensor's memory was released"));
  EXPECT_THAT(ErrorOf([&] { (void)(tail + 1.0); }), HasSubstr("memory was released"));
  ReleaseStorage(base);  // again: nothing happens

  RestoreStorage(base, full({6}, 7.0));
  EXPECT_FALSE(IsStorageReleased(base));
  EXPECT_EQ(tail.to_vector<float>(), (std::vector<float>{7, 7, 7}));
}

TEST(StorageResidencyTest, SavedTensorsOfABackwardSeeTheRestoredMemory) {
  Tensor flat = full({4}, 2.0);
  Tensor w = flat.narrow(0, 0, 2).detach();
  w.set_requires_grad(true);
  Tensor loss = (w * w).sum();  // saves w
  ReleaseStorage(flat);
  EXPECT_THAT(ErrorOf([&] { loss.backward(); }), HasSubstr("memory was released"));
  RestoreStorage(flat, full({4}, 3.0));
  Tensor loss2 = (w * w).sum();
  loss2.backward();
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{6, 6}));
}

TEST(StorageResidencyTest, RefusesMemoryTooSmallOrElsewhere) {
  Tensor full = zeros({4});
  ReleaseStorage(full);
  EXPECT_THAT(ErrorOf([&] { RestoreStorage(full, zeros({3})); }),
              HasSubstr("hold at least 16 bytes, but it is at element 0 of 12 bytes"));
  EXPECT_THAT(ErrorOf([&] { RestoreStorage(full, zeros({8}).narrow(0, 1, 4)); }),
              HasSubstr("at element 1"));
  EXPECT_TRUE(IsStorageReleased(full));
}

}  // namespace
}  // namespace tandem
