#include "data/dataset.h"

#include <cstring>
#include <exception>
#include <string>

#include "data/internal.h"

namespace tandem {
namespace data {

const Tensor& Batch::field(int64_t f) const {
  TANDEM_CHECK(f >= 0 && f < num_fields(), "Batch has ", num_fields(), " field(s) but field ", f,
               " was asked for",
               f == 1 ? " (target(): this dataset's examples have no target)" : "");
  return fields[f];
}

Tensor& Batch::field(int64_t f) {
  return const_cast<Tensor&>(static_cast<const Batch*>(this)->field(f));
}

namespace {

// Field f of every example, checked against example 0's shape, dtype and device.
void CheckSameLayout(const std::vector<Example>& examples, size_t f) {
  const Tensor& first = examples[0][f];
  TANDEM_CHECK(first.defined(), "Collate: field ", f, " of example 0 is an undefined tensor");
  for (size_t e = 1; e < examples.size(); ++e) {
    const Tensor& t = examples[e][f];
    TANDEM_CHECK(t.defined(), "Collate: field ", f, " of example ", e, " is an undefined tensor");
    TANDEM_CHECK(
        t.shape() == first.shape() && t.dtype() == first.dtype() && t.device() == first.device(),
        "Collate: every example must have the same shape, dtype and device in each "
        "field, but field ",
        f, " of example 0 is ", ShapeToString(first.shape()), " ", first.dtype(), " on ",
        first.device(), " and of example ", e, " is ", ShapeToString(t.shape()), " ", t.dtype(),
        " on ", t.device(), "; resize or convert the examples in get()");
  }
}

}  // namespace

Batch Collate(const std::vector<Example>& examples, const std::vector<int64_t>& indices,
              bool pinned) {
  TANDEM_CHECK(!examples.empty(), "Collate needs at least one example but got none");
  TANDEM_CHECK(indices.empty() || indices.size() == examples.size(), "Collate got ",
               examples.size(), " examples but ", indices.size(),
               " indices; pass one index per example or none");
  const size_t num_fields = examples[0].size();
  TANDEM_CHECK(num_fields > 0,
               "Collate: example 0 has no fields; get() must return at least "
               "one tensor");
  for (size_t e = 1; e < examples.size(); ++e) {
    TANDEM_CHECK(examples[e].size() == num_fields, "Collate: example 0 has ", num_fields,
                 " field(s) but example ", e, " has ", examples[e].size(),
                 "; get() must return the same fields for every index");
  }

  Batch batch;
  if (indices.empty()) {
    batch.indices.resize(examples.size());
    for (size_t e = 0; e < examples.size(); ++e) batch.indices[e] = static_cast<int64_t>(e);
  } else {
    batch.indices = indices;
  }
  const int64_t batch_size = static_cast<int64_t>(examples.size());
  batch.fields.reserve(num_fields);
  for (size_t f = 0; f < num_fields; ++f) {
    CheckSameLayout(examples, f);
    const Tensor& first = examples[0][f];
    if (!first.device().is_cpu()) {
      // Device memory: let the device stack them (one kernel per example at most).
      std::vector<Tensor> parts;
      parts.reserve(examples.size());
      for (const Example& example : examples) parts.push_back(example[f].detach());
      batch.fields.push_back(stack(parts, 0).contiguous());
      continue;
    }
    Shape shape = first.shape();
    shape.insert(shape.begin(), batch_size);
    Tensor out = empty(shape, TensorOptions().dtype(first.dtype()).pinned(pinned));
    const size_t example_bytes = static_cast<size_t>(first.numel()) * ElementSize(first.dtype());
    if (example_bytes > 0) {
      char* dst = static_cast<char*>(out.raw_data());
      for (const Example& example : examples) {
        const Tensor source = example[f].contiguous();
        std::memcpy(dst, source.raw_data(), example_bytes);
        dst += example_bytes;
      }
    }
    batch.fields.push_back(std::move(out));
  }
  return batch;
}

Batch Dataset::get_batch(const std::vector<int64_t>& indices, bool pinned) const {
  TANDEM_CHECK(!indices.empty(), "Dataset::get_batch needs at least one index but got none");
  std::vector<Example> examples;
  examples.reserve(indices.size());
  for (const int64_t index : indices) {
    try {
      examples.push_back(get(index));
    } catch (...) {
      std::throw_with_nested(Error("Dataset::get(" + std::to_string(index) +
                                   ") failed: " + internal::CurrentExceptionMessage()));
    }
  }
  return Collate(examples, indices, pinned);
}

void Dataset::CheckIndex(int64_t index, const char* what) const {
  const int64_t n = size();
  TANDEM_CHECK(index >= 0 && index < n, what, ": index ", index, " is out of range for ", n,
               " examples (valid: 0 to ", n - 1, ")");
}

}  // namespace data
}  // namespace tandem
