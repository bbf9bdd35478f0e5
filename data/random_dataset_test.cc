#include "data/random_dataset.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tensor/tensor.h"

namespace tandem {
namespace data {
namespace {

TEST(RandomDatasetTest, ShapeAndSize) {
  const RandomDataset dataset(5, 100, 3);
  EXPECT_EQ(dataset.size(), 100);
  EXPECT_EQ(dataset.row_size(), 5);
  const Example example = dataset.get(99);
  ASSERT_EQ(example.size(), 1u);
  EXPECT_EQ(example[0].shape(), (Shape{5}));
  EXPECT_EQ(example[0].dtype(), kFloat32);
}

// Row i is row i of randn({length, size}) from a fresh Generator(seed): the dataset is
// exactly the tutorial's `torch.randn(length, size)`, computed on demand.
TEST(RandomDatasetTest, RowsAreRowsOfRandnFromTheSeed) {
  const RandomDataset dataset(7, 30, 1234);
  Generator generator(1234);
  const std::vector<float> all = randn({30, 7}, {}, &generator).to_vector<float>();
  for (int64_t i = 0; i < 30; ++i) {
    const std::vector<float> row = dataset.get(i)[0].to_vector<float>();
    for (int64_t j = 0; j < 7; ++j) EXPECT_EQ(row[j], all[i * 7 + j]) << i << ", " << j;
  }
}

TEST(RandomDatasetTest, GetBatchMatchesGetInAnyOrder) {
  const RandomDataset dataset(4, 50, 8);
  const std::vector<int64_t> indices = {49, 3, 3, 17};
  const Batch batch = dataset.get_batch(indices);
  EXPECT_EQ(batch.indices, indices);
  ASSERT_EQ(batch.data().shape(), (Shape{4, 4}));
  const std::vector<float> values = batch.data().to_vector<float>();
  for (size_t b = 0; b < indices.size(); ++b) {
    const std::vector<float> row = dataset.get(indices[b])[0].to_vector<float>();
    for (int j = 0; j < 4; ++j) EXPECT_EQ(values[b * 4 + j], row[j]);
  }
  // The per-example path of the base class gives the same batch.
  EXPECT_EQ(dataset.Dataset::get_batch(indices).data().to_vector<float>(), values);
}

TEST(RandomDatasetTest, SeedsDifferAndValuesAreStandardNormal) {
  const RandomDataset a(100, 100, 1), b(100, 100, 2);
  const std::vector<float> va =
      a.get_batch(std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}).data().to_vector<float>();
  const std::vector<float> vb = b.get_batch({0}).data().to_vector<float>();
  EXPECT_NE(std::vector<float>(va.begin(), va.begin() + 100), vb);
  double sum = 0, sum_sq = 0;
  for (const float v : va) {
    sum += v;
    sum_sq += static_cast<double>(v) * v;
  }
  const double mean = sum / va.size();
  const double std = std::sqrt(sum_sq / va.size() - mean * mean);
  // 1000 standard normals: the mean's standard error is 0.032, the std's about 0.022.
  EXPECT_NEAR(mean, 0.0, 0.13);
  EXPECT_NEAR(std, 1.0, 0.09);
}

TEST(RandomDatasetTest, ClearErrors) {
  EXPECT_THROW(RandomDataset(0, 10), Error);
  EXPECT_THROW(RandomDataset(5, -1), Error);
  const RandomDataset dataset(5, 10);
  EXPECT_THROW(dataset.get(10), Error);
  EXPECT_THROW(dataset.get_batch({0, -1}), Error);
  EXPECT_THROW(dataset.get_batch({}), Error);
}

}  // namespace
}  // namespace data
}  // namespace tandem
