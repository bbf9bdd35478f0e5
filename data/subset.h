// Subset: the examples of another dataset at given indices, as torch.utils.data.Subset.
// Use it to train on part of a dataset (the first N images, a validation split) without
// copying it; batches go through the base dataset's get_batch, so its fast path is kept.
//
//   auto train = std::make_shared<tandem::data::FashionMnist>(root, Split::kTrain);
//   tandem::data::Subset first_1000(train, tandem::data::Subset::FirstN(train->size(), 1000));
//   // first_1000.get(i) == train->get(i) for i < 1000
#ifndef TANDEM_DATA_SUBSET_H_
#define TANDEM_DATA_SUBSET_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "data/dataset.h"

namespace tandem {
namespace data {

class Subset : public Dataset {
 public:
  // Example i of the subset is example indices[i] of `base`. Throws unless every index is
  // in [0, base->size()).
  Subset(std::shared_ptr<const Dataset> base, std::vector<int64_t> indices);

  // 0, 1, ..., min(n, size) - 1: the indices of a dataset's first n examples.
  static std::vector<int64_t> FirstN(int64_t size, int64_t n);

  int64_t size() const override { return static_cast<int64_t>(indices_.size()); }
  Example get(int64_t index) const override;
  // The base's batch of the mapped indices, with `indices` (the subset's) recorded in it.
  Batch get_batch(const std::vector<int64_t>& indices, bool pinned = false) const override;

  const std::vector<int64_t>& indices() const { return indices_; }

 private:
  std::shared_ptr<const Dataset> base_;
  std::vector<int64_t> indices_;
};

// `set` itself when `limit` <= 0 or covers it, else a Subset of its first `limit` examples
// (what the trainers' --limit flags do).
std::shared_ptr<const Dataset> FirstExamples(std::shared_ptr<const Dataset> set, int64_t limit);

}  // namespace data
}  // namespace tandem

#endif  // TANDEM_DATA_SUBSET_H_
