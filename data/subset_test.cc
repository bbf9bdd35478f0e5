#include "data/subset.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "data/tensor_dataset.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace tandem::data {
namespace {

using ::tandem::testing::ErrorOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::shared_ptr<const Dataset> Squares() {
  // Example i: input {i}, target {i * i}.
  std::vector<float> x, y;
  for (int i = 0; i < 6; ++i) {
    x.push_back(static_cast<float>(i));
    y.push_back(static_cast<float>(i * i));
  }
  return std::make_shared<TensorDataset>(
      std::vector<Tensor>{from_vector(x, {6, 1}), from_vector(y, {6, 1})});
}

TEST(SubsetTest, MapsIndicesToTheBaseDataset) {
  Subset subset(Squares(), {4, 1, 5});
  EXPECT_EQ(subset.size(), 3);
  EXPECT_THAT(subset.get(0)[1].to_vector<float>(), ElementsAre(16));
  EXPECT_THAT(subset.get(2)[0].to_vector<float>(), ElementsAre(5));
  Batch batch = subset.get_batch({2, 0});
  EXPECT_THAT(batch.data().to_vector<float>(), ElementsAre(5, 4));
  EXPECT_THAT(batch.target().to_vector<float>(), ElementsAre(25, 16));
  EXPECT_THAT(batch.indices, ElementsAre(2, 0)) << "the subset's indices, not the base's";
}

TEST(SubsetTest, FirstExamplesKeepsTheStartOrTheWholeSet) {
  std::shared_ptr<const Dataset> base = Squares();
  std::shared_ptr<const Dataset> first = FirstExamples(base, 4);
  EXPECT_EQ(first->size(), 4);
  EXPECT_THAT(first->get(3)[0].to_vector<float>(), ElementsAre(3));
  EXPECT_EQ(FirstExamples(base, 0), base);
  EXPECT_EQ(FirstExamples(base, 6), base);
  EXPECT_EQ(FirstExamples(base, 100), base);
  EXPECT_THAT(Subset::FirstN(3, 10), ElementsAre(0, 1, 2));
  EXPECT_TRUE(Subset::FirstN(3, -1).empty());
}

TEST(SubsetTest, OutOfRangeIndicesAreClearErrors) {
  EXPECT_THAT(ErrorOf([] {
                Subset(Squares(), {0, 6});
              }),
              HasSubstr("Subset: index 1 is 6 but the base dataset has 6 examples"));
  Subset subset(Squares(), {1, 2});
  EXPECT_THAT(ErrorOf([&] { subset.get(2); }), HasSubstr("the subset"));
  EXPECT_THAT(ErrorOf([&] { subset.get_batch({0, -1}); }), HasSubstr("the subset"));
}

}  // namespace
}  // namespace tandem::data
