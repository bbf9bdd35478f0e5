#include "data/sampler.h"

#include <numeric>
#include <utility>

#include "data/internal.h"
#include "tensor/base/error.h"
#include "tensor/base/philox.h"

namespace tandem {
namespace data {

SequentialSampler::SequentialSampler(int64_t size) : size_(size) {
  TANDEM_CHECK(size >= 0, "SequentialSampler: size must be >= 0 but is ", size);
}

std::vector<int64_t> SequentialSampler::NextEpoch() {
  std::vector<int64_t> order(static_cast<size_t>(size_));
  std::iota(order.begin(), order.end(), int64_t{0});
  return order;
}

RandomSampler::RandomSampler(int64_t size, uint64_t seed) : size_(size), seed_(seed) {
  TANDEM_CHECK(size >= 0, "RandomSampler: size must be >= 0 but is ", size);
}

std::vector<int64_t> RandomSampler::NextEpoch() { return Permutation(epoch_++); }

void RandomSampler::set_epoch(int64_t epoch) {
  TANDEM_CHECK(epoch >= 0, "RandomSampler: epoch must be >= 0 but is ", epoch);
  epoch_ = epoch;
}

std::vector<int64_t> RandomSampler::Permutation(int64_t epoch) const {
  TANDEM_CHECK(epoch >= 0, "RandomSampler: epoch must be >= 0 but is ", epoch);
  std::vector<int64_t> order(static_cast<size_t>(size_));
  std::iota(order.begin(), order.end(), int64_t{0});
  // One Philox key per (seed, epoch); Philox block b gives the 64-bit draws 2b and 2b+1.
  const uint64_t key = internal::Mix64(seed_ ^ internal::Mix64(static_cast<uint64_t>(epoch)));
  philox::Block block{};
  for (int64_t i = size_ - 1, draw = 0; i > 0; --i, ++draw) {
    if (draw % 2 == 0) block = philox::Generate(key, static_cast<uint64_t>(draw / 2));
    const int lane = static_cast<int>(draw % 2) * 2;
    const uint64_t bits = (static_cast<uint64_t>(block.x[lane]) << 32) | block.x[lane + 1];
    // Lemire's multiply-shift maps 64 random bits onto [0, i]; its bias, below
    // (i + 1) / 2^64, is far under anything a test or a training run could see.
    const auto j = static_cast<int64_t>(
        (static_cast<unsigned __int128>(bits) * static_cast<uint64_t>(i + 1)) >> 64);
    std::swap(order[i], order[j]);
  }
  return order;
}

}  // namespace data
}  // namespace tandem
