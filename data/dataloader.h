// DataLoader: iterates over a Dataset in batches, one epoch per range-for loop, as
// torch.utils.data.DataLoader does. Options: batch_size, shuffle (a seeded RandomSampler,
// reshuffled each epoch), drop_last, num_workers (threads that load batches ahead of the
// consumer, at most prefetch_factor per worker), pin_memory and device.
//
// Batch k of an epoch is always dataset.get_batch(indices of batch k): the batches and
// their order are the same whatever num_workers is. A dataset's exception reaches the loop
// as a tandem::Error naming the batch and sample index (the original is nested inside it);
// the epoch then ends and the next begin() starts a fresh one. Leaving a loop early, or
// destroying the loader, stops and joins the workers (after the batches they are loading).
//
//   auto train = std::make_shared<tandem::data::FashionMnist>();
//   tandem::data::DataLoader loader(train, tandem::data::DataLoaderOptions()
//                                              .batch_size(256).shuffle(true).num_workers(2));
//   for (int epoch = 0; epoch < 10; ++epoch) {
//     for (tandem::data::Batch& batch : loader) {   // each loop is a new epoch
//       Train(batch.data(), batch.target());         // [256, 1, 28, 28] float32, [256] int64
//     }
//   }
//
// The Batch& a loop gets stays valid until the next step (move from it to keep it). A
// DataLoader is used by one thread at a time; only its workers run concurrently.
#ifndef TANDEM_DATA_DATALOADER_H_
#define TANDEM_DATA_DATALOADER_H_

#include <cstdint>
#include <iterator>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

#include "data/dataset.h"
#include "data/sampler.h"
#include "tensor/base/arg.h"
#include "tensor/base/device.h"

namespace tandem {
namespace data {

struct DataLoaderOptions {
  TANDEM_ARG(int64_t, batch_size) = 1;
  TANDEM_ARG(bool, shuffle) = false;
  // The shuffle seed. Unset: drawn from tandem::default_generator() when the loader is
  // made, so tandem::manual_seed() makes it reproducible.
  TANDEM_ARG(std::optional<uint64_t>, seed);
  TANDEM_ARG(bool, drop_last) = false;   // drop the last batch if it is smaller than batch_size
  TANDEM_ARG(int, num_workers) = 0;      // 0: load in the consuming thread, when asked for
  TANDEM_ARG(int, prefetch_factor) = 2;  // batches loaded ahead per worker
  // Batches in page-locked host memory, for faster and asynchronous copies to a GPU. On a
  // machine without CUDA this warns once and is ignored, as in PyTorch.
  TANDEM_ARG(bool, pin_memory) = false;
  // Where batches end up (copied there by the workers); unset: where the dataset made them.
  TANDEM_ARG(std::optional<Device>, device);
};

class DataLoader {
  struct Epoch;   // one pass: its batches, workers and prefetch slots (dataloader.cc)
  struct Cursor;  // shared by an iterator and its copies; ends the epoch when released

 public:
  // Uses a SequentialSampler, or a RandomSampler when options.shuffle() is set. Throws for
  // a null or empty dataset, batch_size < 1, num_workers < 0, prefetch_factor < 1 or an
  // unavailable device. With drop_last and fewer examples than one batch, the loader has
  // size() 0 and loops over nothing, as in PyTorch (with a warning on stderr).
  DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options = {});
  // Visits the dataset in the sampler's order; options.shuffle() must then be false.
  DataLoader(std::shared_ptr<const Dataset> dataset, std::unique_ptr<Sampler> sampler,
             DataLoaderOptions options = {});
  // Take a dataset by value: DataLoader(TensorDataset({x, y}), options).
  template <typename D, typename = std::enable_if_t<std::is_base_of_v<Dataset, std::decay_t<D>>>>
  explicit DataLoader(D&& dataset, DataLoaderOptions options = {})
      : DataLoader(std::make_shared<std::decay_t<D>>(std::forward<D>(dataset)),
                   std::move(options)) {}
  template <typename D, typename = std::enable_if_t<std::is_base_of_v<Dataset, std::decay_t<D>>>>
  DataLoader(D&& dataset, std::unique_ptr<Sampler> sampler, DataLoaderOptions options = {})
      : DataLoader(std::make_shared<std::decay_t<D>>(std::forward<D>(dataset)), std::move(sampler),
                   std::move(options)) {}

  // Stops the current epoch and joins its workers.
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  class Iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;
    using pointer = Batch*;
    using reference = Batch&;

    Iterator() = default;  // the end
    Batch& operator*() const;
    Batch* operator->() const { return &**this; }
    // Moves to the next batch; may rethrow a dataset's error (see above).
    Iterator& operator++();
    // Both at the end of their epoch, or the same position of the same epoch.
    friend bool operator==(const Iterator& a, const Iterator& b) {
      return a.at_end() == b.at_end() && (a.at_end() || a.cursor_ == b.cursor_);
    }
    friend bool operator!=(const Iterator& a, const Iterator& b) { return !(a == b); }

   private:
    friend class DataLoader;
    explicit Iterator(std::shared_ptr<Cursor> cursor) : cursor_(std::move(cursor)) {}
    bool at_end() const;
    std::shared_ptr<Cursor> cursor_;
  };

  // Starts a new epoch (stopping an unfinished one) and waits for its first batch.
  Iterator begin();
  Iterator end() { return Iterator(); }

  // Batches per epoch: ceil(examples / batch_size), or floor with drop_last.
  int64_t size() const;
  const Dataset& dataset() const { return *dataset_; }
  const DataLoaderOptions& options() const { return options_; }
  // Epochs started so far.
  int64_t epochs_started() const { return epochs_started_; }

 private:
  std::shared_ptr<const Dataset> dataset_;
  std::unique_ptr<Sampler> sampler_;
  DataLoaderOptions options_;
  bool pin_ = false;  // pin_memory requested and possible here
  int64_t epochs_started_ = 0;
  std::shared_ptr<Epoch> epoch_;
};

}  // namespace data
}  // namespace tandem

#endif  // TANDEM_DATA_DATALOADER_H_
