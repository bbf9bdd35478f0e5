// Releasing a tensor's memory in place and giving it back, as PyTorch's
// untyped_storage().resize_(0) and resize_(n): every tensor that shares the storage (views,
// tensors saved for backward) keeps its handle, shape and place in the autograd graph while
// the memory is gone, and sees the new memory once it is restored. Fully sharded data
// parallelism (parallel/distributed/fully_sharded_data_parallel.h) frees a unit's gathered
// parameters after its forward so and gathers them back before its backward. Reading a
// released tensor throws (naming what happened), it never reads freed memory.
//
//   Tensor full = empty({1024});
//   Tensor weight = full.narrow(0, 0, 512);      // a view, saved by some backward node
//   ReleaseStorage(full);                        // the 4 KiB go back to the allocator
//   Tensor again = empty({1024});                // ... refilled, e.g. by an all-gather
//   RestoreStorage(full, again);                 // weight reads again's memory now
#ifndef TANDEM_TENSOR_CORE_STORAGE_RESIDENCY_H_
#define TANDEM_TENSOR_CORE_STORAGE_RESIDENCY_H_

#include "tensor/core/tensor.h"

namespace tandem {

// Frees the memory of `tensor`'s storage (shared by all its views); the storage keeps its size,
// and any read of it throws until RestoreStorage. Releasing a released storage does nothing.
void ReleaseStorage(const Tensor& tensor);
// True while `tensor`'s storage is released.
bool IsStorageReleased(const Tensor& tensor);
// Makes `tensor`'s storage use `source`'s memory (shared with source from then on): source must
// be on the same device, own a storage at least as large, and start at its beginning.
void RestoreStorage(const Tensor& tensor, const Tensor& source);

}  // namespace tandem

#endif  // TANDEM_TENSOR_CORE_STORAGE_RESIDENCY_H_
