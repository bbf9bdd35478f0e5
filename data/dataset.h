// Dataset: the interface every data source implements for the DataLoader, plus the
// Example and Batch types and Collate(), which stacks examples into one batch.
//
// A dataset has a size and returns example `index` as a list of tensors, one per field
// (for instance an image and its label). get() must be safe to call from several threads
// at once: DataLoader workers call it concurrently. A dataset that can assemble a batch
// faster than one example at a time (from one big buffer, say) overrides get_batch().
//
//   class Squares : public tandem::data::Dataset {
//    public:
//     int64_t size() const override { return 10; }
//     tandem::data::Example get(int64_t i) const override {
//       return {tandem::full({1}, double(i)), tandem::full({1}, double(i * i))};
//     }
//   };
//   tandem::data::Batch batch = Squares().get_batch({3, 4});  // fields [2, 1] and [2, 1]
#ifndef TANDEM_DATA_DATASET_H_
#define TANDEM_DATA_DATASET_H_

#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace tandem {
namespace data {

// One example: its fields in a fixed order, e.g. {image, label}.
using Example = std::vector<Tensor>;

// Examples stacked along a new first dimension: field f of example b is fields[f][b].
struct Batch {
  std::vector<Tensor> fields;    // one contiguous tensor per field, each [size(), ...]
  std::vector<int64_t> indices;  // the dataset index of each example, in batch order

  // Number of examples.
  int64_t size() const { return static_cast<int64_t>(indices.size()); }
  int64_t num_fields() const { return static_cast<int64_t>(fields.size()); }
  // The first field (inputs) and the second (targets, for datasets that have one).
  const Tensor& data() const { return field(0); }
  const Tensor& target() const { return field(1); }
  const Tensor& field(int64_t f) const;
  Tensor& field(int64_t f);
};

// Stacks examples into a batch: every example must have the same number of fields and,
// field by field, the same shape, dtype and device. Each field becomes one new contiguous
// tensor [examples.size(), ...]; on the CPU it is written straight into pinned memory
// when `pinned` is true (which needs a CUDA build with a GPU). `indices` are recorded in
// the batch; pass the dataset indices of the examples, or leave empty for 0, 1, ...
Batch Collate(const std::vector<Example>& examples, const std::vector<int64_t>& indices = {},
              bool pinned = false);

class Dataset {
 public:
  virtual ~Dataset() = default;

  // Number of examples; get() accepts 0 <= index < size().
  virtual int64_t size() const = 0;
  // Example `index`. Thread-safe: may be called from several threads at once.
  virtual Example get(int64_t index) const = 0;
  // The examples at `indices`, collated (see Collate). The default calls get() for each
  // index, naming the index in any error it throws, and stacks the results. Overrides
  // must return the same tensors as the default and honour `pinned` (or leave pinning to
  // the caller by returning unpinned tensors). Thread-safe like get().
  virtual Batch get_batch(const std::vector<int64_t>& indices, bool pinned = false) const;

 protected:
  // Throws a clear tandem::Error unless 0 <= index < size(); `what` names the dataset.
  void CheckIndex(int64_t index, const char* what) const;
};

}  // namespace data
}  // namespace tandem

#endif  // TANDEM_DATA_DATASET_H_
