#include "data/subset.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "tensor/base/error.h"

namespace tandem {
namespace data {

Subset::Subset(std::shared_ptr<const Dataset> base, std::vector<int64_t> indices)
    : base_(std::move(base)), indices_(std::move(indices)) {
  TANDEM_CHECK(base_ != nullptr, "Subset: the base dataset is null; pass a dataset");
  const int64_t n = base_->size();
  for (size_t i = 0; i < indices_.size(); ++i) {
    TANDEM_CHECK(indices_[i] >= 0 && indices_[i] < n, "Subset: index ", i, " is ", indices_[i],
                 " but the base dataset has ", n, " examples (expected 0 to ", n - 1, ")");
  }
}

std::vector<int64_t> Subset::FirstN(int64_t size, int64_t n) {
  std::vector<int64_t> indices(static_cast<size_t>(std::max<int64_t>(0, std::min(size, n))));
  std::iota(indices.begin(), indices.end(), int64_t{0});
  return indices;
}

Example Subset::get(int64_t index) const {
  CheckIndex(index, "the subset");
  return base_->get(indices_[static_cast<size_t>(index)]);
}

Batch Subset::get_batch(const std::vector<int64_t>& indices, bool pinned) const {
  std::vector<int64_t> mapped;
  mapped.reserve(indices.size());
  for (int64_t i : indices) {
    CheckIndex(i, "the subset");
    mapped.push_back(indices_[static_cast<size_t>(i)]);
  }
  Batch batch = base_->get_batch(mapped, pinned);
  batch.indices = indices;
  return batch;
}

std::shared_ptr<const Dataset> FirstExamples(std::shared_ptr<const Dataset> set, int64_t limit) {
  if (limit <= 0 || limit >= set->size()) return set;
  return std::make_shared<Subset>(set, Subset::FirstN(set->size(), limit));
}

}  // namespace data
}  // namespace tandem
