#include "data/tensor_dataset.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace tandem {
namespace data {
namespace {

TEST(TensorDatasetTest, RowsOfEachTensor) {
  const Tensor x = arange(12, kFloat32).reshape({4, 3});
  const Tensor y = arange(4, kInt64);
  const TensorDataset dataset({x, y});
  EXPECT_EQ(dataset.size(), 4);
  const Example example = dataset.get(2);
  ASSERT_EQ(example.size(), 2u);
  EXPECT_EQ(example[0].shape(), (Shape{3}));
  EXPECT_EQ(example[0].to_vector<float>(), (std::vector<float>{6, 7, 8}));
  EXPECT_EQ(example[1].shape(), (Shape{}));
  EXPECT_EQ(example[1].item<int64_t>(), 2);
}

TEST(TensorDatasetTest, GetBatchGathersRows) {
  const Tensor x = arange(12, kFloat32).reshape({4, 3});
  const Tensor y = arange(4, kInt64);
  const TensorDataset dataset({x, y});
  const Batch batch = dataset.get_batch({3, 0, 3});
  EXPECT_EQ(batch.data().shape(), (Shape{3, 3}));
  EXPECT_EQ(batch.data().to_vector<float>(), (std::vector<float>{9, 10, 11, 0, 1, 2, 9, 10, 11}));
  EXPECT_EQ(batch.target().to_vector<int64_t>(), (std::vector<int64_t>{3, 0, 3}));
  const Batch by_example = dataset.Dataset::get_batch({3, 0, 3});
  EXPECT_EQ(by_example.data().to_vector<float>(), batch.data().to_vector<float>());
  EXPECT_EQ(by_example.target().to_vector<int64_t>(), batch.target().to_vector<int64_t>());
}

TEST(TensorDatasetTest, NonContiguousInputAndDetachedRows) {
  const Tensor x = arange(6, kFloat32).reshape({2, 3}).t();  // [3, 2]: rows {0, 3}, {1, 4}, {2, 5}
  const Tensor w = ones({3, 2}, TensorOptions().requires_grad(true));
  const TensorDataset dataset({x, w});
  EXPECT_EQ(dataset.get_batch({1, 2}).data().to_vector<float>(), (std::vector<float>{1, 4, 2, 5}));
  EXPECT_EQ(dataset.get(2)[0].to_vector<float>(), (std::vector<float>{2, 5}));
  EXPECT_FALSE(dataset.get(0)[1].requires_grad());
}

TEST(TensorDatasetTest, ClearErrors) {
  try {
    TensorDataset({zeros({4, 2}), zeros({5})});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("[4, 2]"), std::string::npos) << message;
    EXPECT_NE(message.find("[5]"), std::string::npos) << message;
  }
  EXPECT_THROW(TensorDataset({}), Error);
  EXPECT_THROW(TensorDataset({scalar_tensor(1.0)}), Error);
  EXPECT_THROW(TensorDataset({Tensor()}), Error);
  const TensorDataset dataset({zeros({3, 1})});
  EXPECT_THROW(dataset.get(3), Error);
  EXPECT_THROW(dataset.get_batch({0, 3}), Error);
}

}  // namespace
}  // namespace data
}  // namespace tandem
