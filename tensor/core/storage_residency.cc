#include "tensor/core/storage_residency.h"

#include "tensor/base/error.h"
#include "tensor/core/internal/tensor_impl.h"

namespace tandem {

void ReleaseStorage(const Tensor& tensor) {
  TANDEM_CHECK(tensor.defined(), "ReleaseStorage: the tensor is undefined");
  tensor.impl()->storage->data.reset();
}

bool IsStorageReleased(const Tensor& tensor) {
  TANDEM_CHECK(tensor.defined(), "IsStorageReleased: the tensor is undefined");
  const Storage& storage = *tensor.impl()->storage;
  return storage.data == nullptr && storage.bytes > 0;
}

void RestoreStorage(const Tensor& tensor, const Tensor& source) {
  TANDEM_CHECK(tensor.defined() && source.defined(), "RestoreStorage: a tensor is undefined");
  Storage& storage = *tensor.impl()->storage;
  const Storage& from = *source.impl()->storage;
  TANDEM_CHECK(from.device == storage.device, "RestoreStorage: the memory must be on ",
               storage.device, " but it is on ", from.device);
  TANDEM_CHECK(
      source.impl()->offset == 0 && from.bytes >= storage.bytes,
      "RestoreStorage: the memory must start at its storage's beginning and hold at least ",
      storage.bytes, " bytes, but it is at element ", source.impl()->offset, " of ", from.bytes,
      " bytes");
  storage.data = from.data;
}

}  // namespace tandem
