#include "data/dataset.h"

#include <gtest/gtest.h>

#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace tandem {
namespace data {
namespace {

using ::tandem::testing::ErrorOf;

// Example i: {[2, 3] float32 filled with i, int64 scalar 10 * i}.
class Counting : public Dataset {
 public:
  explicit Counting(int64_t size, int64_t failing_index = -1)
      : size_(size), failing_index_(failing_index) {}
  int64_t size() const override { return size_; }
  Example get(int64_t index) const override {
    CheckIndex(index, "Counting::get");
    if (index == failing_index_) throw std::out_of_range("no example here");
    return {full({2, 3}, static_cast<double>(index)),
            scalar_tensor(static_cast<double>(10 * index), kInt64)};
  }

 private:
  int64_t size_;
  int64_t failing_index_;
};

TEST(CollateTest, StacksEachFieldIntoOneContiguousTensor) {
  const Counting dataset(10);
  const Batch batch = Collate({dataset.get(4), dataset.get(7), dataset.get(1)}, {4, 7, 1});
  ASSERT_EQ(batch.num_fields(), 2);
  EXPECT_EQ(batch.size(), 3);
  EXPECT_EQ(batch.indices, (std::vector<int64_t>{4, 7, 1}));
  EXPECT_EQ(batch.data().shape(), (Shape{3, 2, 3}));
  EXPECT_EQ(batch.data().dtype(), kFloat32);
  EXPECT_TRUE(batch.data().is_contiguous());
  EXPECT_EQ(batch.target().shape(), (Shape{3}));
  EXPECT_EQ(batch.target().dtype(), kInt64);
  EXPECT_EQ(batch.target().to_vector<int64_t>(), (std::vector<int64_t>{40, 70, 10}));
  const std::vector<float> data = batch.data().to_vector<float>();
  for (int b = 0; b < 3; ++b) {
    for (int e = 0; e < 6; ++e) EXPECT_EQ(data[b * 6 + e], (std::vector<float>{4, 7, 1})[b]);
  }
}

TEST(CollateTest, DefaultIndicesAndNonContiguousFields) {
  const Tensor matrix = from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor transposed = matrix.t();  // [3, 2], not contiguous
  ASSERT_FALSE(transposed.is_contiguous());
  const Batch batch = Collate({{transposed}, {transposed}});
  EXPECT_EQ(batch.indices, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(batch.data().shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(batch.data().to_vector<float>(),
            (std::vector<float>{1, 4, 2, 5, 3, 6, 1, 4, 2, 5, 3, 6}));
}

TEST(CollateTest, ClearErrorsForMismatchedExamples) {
  const Tensor a = zeros({2, 3});
  const Tensor b = zeros({3, 2});
  std::string message = ErrorOf([&] { Collate({{a}, {b}}); });
  EXPECT_NE(message.find("[2, 3]"), std::string::npos) << message;
  EXPECT_NE(message.find("[3, 2]"), std::string::npos) << message;
  message = ErrorOf([&] { Collate({{a}, {a.to(kInt64)}}); });
  EXPECT_NE(message.find("int64"), std::string::npos) << message;
  message = ErrorOf([&] { Collate({{a, a}, {a}}); });
  EXPECT_NE(message.find("example 1 has 1"), std::string::npos) << message;
  EXPECT_NE(ErrorOf([&] { Collate({}); }), "");
  EXPECT_NE(ErrorOf([&] { Collate({{}}); }), "");
  EXPECT_NE(ErrorOf([&] { Collate({{a}, {a}}, {1}); }).find("indices"), std::string::npos);
  EXPECT_NE(ErrorOf([&] { Collate({{Tensor()}}); }).find("undefined"), std::string::npos);
}

TEST(DatasetTest, DefaultGetBatchCollatesGet) {
  const Counting dataset(10);
  const Batch batch = dataset.get_batch({9, 0});
  EXPECT_EQ(batch.indices, (std::vector<int64_t>{9, 0}));
  EXPECT_EQ(batch.target().to_vector<int64_t>(), (std::vector<int64_t>{90, 0}));
  EXPECT_EQ(batch.data().shape(), (Shape{2, 2, 3}));
}

TEST(DatasetTest, DefaultGetBatchNamesTheFailingIndexAndNestsTheOriginal) {
  const Counting dataset(10, /*failing_index=*/6);
  try {
    dataset.get_batch({2, 6, 8});
    FAIL() << "get_batch should have thrown";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("get(6)"), std::string::npos) << message;
    EXPECT_NE(message.find("no example here"), std::string::npos) << message;
    EXPECT_THROW(std::rethrow_if_nested(e), std::out_of_range);
  }
}

TEST(DatasetTest, OutOfRangeIndexIsAClearError) {
  const Counting dataset(5);
  const std::string message = ErrorOf([&] { dataset.get_batch({1, 5}); });
  EXPECT_NE(message.find("index 5 is out of range for 5 examples"), std::string::npos) << message;
  EXPECT_NE(ErrorOf([&] { dataset.get(-1); }), "");
  EXPECT_NE(ErrorOf([&] { dataset.get_batch({}); }), "");
}

TEST(BatchTest, TargetOfASingleFieldBatchIsAClearError) {
  const Batch batch = Collate({{zeros({2})}});
  const std::string message = ErrorOf([&] { batch.target(); });
  EXPECT_NE(message.find("no target"), std::string::npos) << message;
}

}  // namespace
}  // namespace data
}  // namespace tandem
