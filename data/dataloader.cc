#include "data/dataloader.h"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <iostream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "data/internal.h"
#include "tensor/runtime/devices.h"
#include "tensor/runtime/profiler.h"
#include "tensor/tensor.h"

namespace tandem {
namespace data {

namespace {

// "[3, 17, 42]", or the first few and a count for long lists.
std::string IndicesToString(const std::vector<int64_t>& indices) {
  constexpr size_t kShown = 8;
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < std::min(indices.size(), kShown); ++i) {
    out << (i > 0 ? ", " : "") << indices[i];
  }
  if (indices.size() > kShown) out << ", ... (" << indices.size() << " in all)";
  out << "]";
  return out.str();
}

void WarnPinMemoryWithoutCuda() {
  static std::once_flag once;
  std::call_once(once, [] {
    std::cerr << "tandem::data::DataLoader warning: pin_memory is set but no CUDA device is "
                 "present, so batches will not be pinned\n";
  });
}

}  // namespace

// One epoch: the batches' indices, and with workers the threads and the ring of
// `capacity` slots into which worker results for batch k go (slot k % capacity). A worker
// claims batch k only when k < next_to_consume + capacity, so slot k % capacity is free;
// the consumer takes batches strictly in order, which makes the sequence of batches
// independent of the number of workers and of their timing.
struct DataLoader::Epoch {
  struct Result {
    bool ready = false;
    Batch batch;
    std::exception_ptr error;
    std::string message;  // set with error: what failed, where
  };
  enum class State { kRunning, kFinished, kStopped, kFailed };

  Epoch(std::shared_ptr<const Dataset> dataset, std::vector<std::vector<int64_t>> batches,
        int64_t number, int num_workers, int prefetch_factor, bool pin,
        std::optional<Device> device)
      : dataset(std::move(dataset)),
        batches(std::move(batches)),
        number(number),
        num_workers(num_workers),
        capacity(static_cast<int64_t>(num_workers) * prefetch_factor),
        pin(pin),
        device(device),
        slots(static_cast<size_t>(capacity)) {}

  ~Epoch() { Stop(); }

  void StartWorkers() {
    try {
      workers.reserve(num_workers);
      for (int w = 0; w < num_workers; ++w) workers.emplace_back([this, w] { WorkerLoop(w); });
    } catch (...) {
      Stop();
      throw;
    }
  }

  // Moves to the next batch (the first on the first call): waits for it, or loads it here
  // without workers. Past the last batch the epoch is finished and its workers joined.
  void Advance() {
    TANDEM_CHECK(state != State::kStopped, "DataLoader: epoch ", number,
                 " was ended early, by a new begin() on the same loader or by the loader's "
                 "destruction; finish one loop over a loader before starting the next");
    TANDEM_CHECK(state != State::kFailed, "DataLoader: epoch ", number,
                 " ended with an error that was already reported; call begin() for a new epoch");
    TANDEM_CHECK(state != State::kFinished, "DataLoader: ++ past the end of epoch ", number);
    const int64_t k = position + 1;
    if (k >= static_cast<int64_t>(batches.size())) {
      Stop();
      state = State::kFinished;
      current = Batch();
      position = k;
      return;
    }
    Result result;
    if (num_workers == 0) {
      result = Load(k, -1);
    } else {
      std::unique_lock<std::mutex> lock(mutex);
      Result& slot = slots[k % capacity];
      batch_ready.wait(lock, [&] { return slot.ready; });
      result = std::move(slot);
      slot = Result();
      next_to_consume = k + 1;
      lock.unlock();
      space_free.notify_all();
    }
    if (result.error) {
      Stop();
      state = State::kFailed;
      try {
        std::rethrow_exception(result.error);
      } catch (...) {
        std::throw_with_nested(Error(result.message));
      }
    }
    current = std::move(result.batch);
    position = k;
  }

  // Asks the workers to stop after the batch each is loading and joins them. Idempotent.
  void Stop() noexcept {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stop_requested = true;
    }
    space_free.notify_all();
    for (std::thread& worker : workers) {
      if (worker.joinable()) worker.join();
    }
    workers.clear();
    if (state == State::kRunning) state = State::kStopped;
  }

  void WorkerLoop(int worker) {
    profiler::SetThreadName("DataLoader worker " + std::to_string(worker));
    std::unique_lock<std::mutex> lock(mutex);
    const auto num_batches = static_cast<int64_t>(batches.size());
    while (true) {
      space_free.wait(lock, [&] {
        return stop_requested || next_to_claim >= num_batches ||
               next_to_claim < next_to_consume + capacity;
      });
      if (stop_requested || next_to_claim >= num_batches) return;
      const int64_t k = next_to_claim++;
      lock.unlock();
      Result result = Load(k, worker);
      lock.lock();
      slots[k % capacity] = std::move(result);
      batch_ready.notify_all();
    }
  }

  // Batch k, pinned and moved as asked; never throws (errors go into the result).
  Result Load(int64_t k, int worker) const noexcept {
    Result result;
    result.ready = true;
    const std::vector<int64_t>& indices = batches[k];
    try {
      TANDEM_PROFILE_SCOPE("data", "batch " + std::to_string(k));
      Batch batch = dataset->get_batch(indices, pin);
      TANDEM_CHECK(!batch.fields.empty() && batch.indices == indices,
                   "get_batch returned a batch with ", batch.fields.size(), " fields and ",
                   batch.indices.size(),
                   " indices; it must return at least one field and the "
                   "indices it was given");
      for (size_t f = 0; f < batch.fields.size(); ++f) {
        Tensor& field = batch.fields[f];
        TANDEM_CHECK(field.defined() && field.dim() >= 1 && field.size(0) == batch.size(),
                     "get_batch returned field ", f, " with shape ",
                     field.defined() ? ShapeToString(field.shape()) : "(undefined)",
                     " for a batch of ", batch.size(), " examples; each field must be [",
                     batch.size(), ", ...]");
        if (pin && field.device().is_cpu() && !field.is_pinned()) field = field.pin_memory();
        if (device && field.device() != *device) field = field.to(*device);
      }
      result.batch = std::move(batch);
    } catch (...) {
      result.error = std::current_exception();
      std::ostringstream message;
      message << "DataLoader: loading batch " << k << " of epoch " << number << " (sample indices "
              << IndicesToString(indices) << ")"
              << (worker >= 0 ? " in worker " + std::to_string(worker) : std::string())
              << " failed: " << internal::CurrentExceptionMessage();
      try {
        result.message = message.str();
      } catch (...) {
        result.message = "DataLoader: loading a batch failed";
      }
    }
    return result;
  }

  const std::shared_ptr<const Dataset> dataset;
  const std::vector<std::vector<int64_t>> batches;
  const int64_t number;
  const int num_workers;
  const int64_t capacity;
  const bool pin;
  const std::optional<Device> device;

  // The consumer's side (only the consuming thread touches these).
  State state = State::kRunning;
  int64_t position = -1;  // the batch in `current`
  Batch current;
  std::vector<std::thread> workers;

  // Shared with the workers, guarded by `mutex`.
  std::mutex mutex;
  std::condition_variable batch_ready;  // a slot was filled
  std::condition_variable space_free;   // a slot was emptied, or stop was requested
  std::vector<Result> slots;
  int64_t next_to_claim = 0;
  int64_t next_to_consume = 0;
  bool stop_requested = false;
};

// Shared by an iterator and its copies; when the last of them goes (the loop ended or was
// left), the epoch's workers are stopped and joined.
struct DataLoader::Cursor {
  explicit Cursor(std::shared_ptr<Epoch> epoch) : epoch(std::move(epoch)) {}
  ~Cursor() { epoch->Stop(); }
  std::shared_ptr<Epoch> epoch;
};

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options)
    : DataLoader(dataset, nullptr, std::move(options)) {}

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, std::unique_ptr<Sampler> sampler,
                       DataLoaderOptions options)
    : dataset_(std::move(dataset)), sampler_(std::move(sampler)), options_(std::move(options)) {
  TANDEM_CHECK(dataset_ != nullptr, "DataLoader needs a dataset but got a null pointer");
  const int64_t examples = dataset_->size();
  TANDEM_CHECK(examples > 0, "DataLoader: the dataset is empty (size() is ", examples,
               "); there is nothing to load");
  TANDEM_CHECK(options_.batch_size() >= 1, "DataLoader: batch_size must be at least 1 but is ",
               options_.batch_size());
  TANDEM_CHECK(options_.num_workers() >= 0,
               "DataLoader: num_workers must be >= 0 (0 loads in the calling thread) but is ",
               options_.num_workers());
  TANDEM_CHECK(options_.prefetch_factor() >= 1,
               "DataLoader: prefetch_factor (batches loaded ahead per worker) must be at least 1 "
               "but is ",
               options_.prefetch_factor());
  if (options_.device()) CheckAvailable(*options_.device());

  if (sampler_ != nullptr) {
    TANDEM_CHECK(!options_.shuffle(),
                 "DataLoader: shuffle and a sampler exclude each other (the sampler decides the "
                 "order); pass a RandomSampler, or shuffle without a sampler");
  } else if (options_.shuffle()) {
    if (!options_.seed()) {
      Generator& generator = default_generator();
      const uint64_t counter = generator.Reserve(1);
      options_.seed(internal::Mix64(generator.seed() ^ internal::Mix64(counter)));
    }
    sampler_ = std::make_unique<RandomSampler>(examples, *options_.seed());
  } else {
    sampler_ = std::make_unique<SequentialSampler>(examples);
  }
  TANDEM_CHECK(sampler_->size() > 0, "DataLoader: the sampler yields no indices");
  if (options_.drop_last() && sampler_->size() < options_.batch_size()) {
    // PyTorch's behaviour: a loader of length 0 whose loop does nothing (e.g. a rank of a
    // distributed run whose share is small). Legal, but rarely what was meant: say so.
    std::cerr << "tandem::data::DataLoader warning: with drop_last, " << sampler_->size()
              << " examples and batch_size " << options_.batch_size()
              << " give no batch at all (the loader's length is 0 and its loop does nothing); "
                 "lower batch_size or turn drop_last off if you expected batches\n";
  }

  if (options_.pin_memory()) {
    pin_ = DeviceCount(DeviceType::kCUDA) > 0;
    if (!pin_) WarnPinMemoryWithoutCuda();
  }
}

DataLoader::~DataLoader() {
  if (epoch_) epoch_->Stop();
}

int64_t DataLoader::size() const {
  const int64_t n = sampler_->size();
  const int64_t b = options_.batch_size();
  return options_.drop_last() ? n / b : (n + b - 1) / b;
}

DataLoader::Iterator DataLoader::begin() {
  if (epoch_) {
    epoch_->Stop();
    epoch_.reset();
  }
  std::vector<int64_t> order = sampler_->NextEpoch();
  TANDEM_CHECK(!order.empty(), "DataLoader: the sampler returned no indices for epoch ",
               epochs_started_);
  const auto n = static_cast<int64_t>(order.size());
  const int64_t b = options_.batch_size();
  const int64_t num_batches = options_.drop_last() ? n / b : (n + b - 1) / b;
  std::vector<std::vector<int64_t>> batches(static_cast<size_t>(num_batches));
  for (int64_t k = 0; k < num_batches; ++k) {
    const auto first = order.begin() + k * b;
    batches[k].assign(first, first + std::min(b, n - k * b));
  }
  epoch_ = std::make_shared<Epoch>(dataset_, std::move(batches), epochs_started_++,
                                   options_.num_workers(), options_.prefetch_factor(), pin_,
                                   options_.device());
  auto cursor = std::make_shared<Cursor>(epoch_);
  epoch_->StartWorkers();
  epoch_->Advance();
  return Iterator(std::move(cursor));
}

bool DataLoader::Iterator::at_end() const {
  if (cursor_ == nullptr) return true;
  const Epoch::State state = cursor_->epoch->state;
  return state == Epoch::State::kFinished || state == Epoch::State::kFailed;
}

Batch& DataLoader::Iterator::operator*() const {
  TANDEM_CHECK(cursor_ != nullptr, "DataLoader: dereferencing the end iterator");
  Epoch& epoch = *cursor_->epoch;
  TANDEM_CHECK(epoch.state == Epoch::State::kRunning,
               "DataLoader: dereferencing an iterator of "
               "epoch ",
               epoch.number, ", which has ",
               epoch.state == Epoch::State::kFinished ? "finished" : "been ended");
  return epoch.current;
}

DataLoader::Iterator& DataLoader::Iterator::operator++() {
  TANDEM_CHECK(cursor_ != nullptr, "DataLoader: incrementing the end iterator");
  cursor_->epoch->Advance();
  return *this;
}

}  // namespace data
}  // namespace tandem
