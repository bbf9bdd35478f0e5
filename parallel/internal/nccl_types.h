// Internal to //parallel and //parallel/distributed: the one mapping from a Tensor's dtype to
// NCCL's ncclDataType_t, used by comm's NCCL backend and by ProcessGroupNccl. It is derived
// from TANDEM_FORALL_DTYPES (through DispatchDType), so a dtype added there without an NCCL
// type here is refused by name instead of being sent as some other type.
//
//   if (!HasNcclType(t.dtype())) return false;   // decline; the caller falls back
//   ncclAllReduce(p, p, t.numel(), NcclType(t.dtype(), "ProcessGroupNccl allreduce"), ...);
#ifndef TANDEM_PARALLEL_INTERNAL_NCCL_TYPES_H_
#define TANDEM_PARALLEL_INTERNAL_NCCL_TYPES_H_

#include <nccl.h>

#include <cstdint>

#include "tensor/base/dtype.h"
#include "tensor/base/error.h"

namespace tandem::parallel::internal {

// NcclTypeOf<T>::value is T's NCCL type; `exists` is false for a C++ type NCCL has none for.
template <typename T>
struct NcclTypeOf {
  static constexpr bool exists = false;
  static constexpr ncclDataType_t value = ncclNumTypes;
};

#define TANDEM_NCCL_TYPE(cpp_type, nccl_type)          \
  template <>                                          \
  struct NcclTypeOf<cpp_type> {                        \
    static constexpr bool exists = true;               \
    static constexpr ncclDataType_t value = nccl_type; \
  };
TANDEM_NCCL_TYPE(float, ncclFloat32)
TANDEM_NCCL_TYPE(double, ncclFloat64)
TANDEM_NCCL_TYPE(Half, ncclFloat16)
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)
TANDEM_NCCL_TYPE(BFloat16, ncclBfloat16)
#endif
TANDEM_NCCL_TYPE(int64_t, ncclInt64)
TANDEM_NCCL_TYPE(int32_t, ncclInt32)
TANDEM_NCCL_TYPE(uint8_t, ncclUint8)
// One byte, 0 or 1, as uint8; sums of bools are not bools (reduce them with ncclMax, an or).
TANDEM_NCCL_TYPE(bool, ncclUint8)
#undef TANDEM_NCCL_TYPE

inline bool HasNcclType(DType dtype) {
  return DispatchDType(dtype, "HasNcclType",
                       [](auto tag) { return NcclTypeOf<typename decltype(tag)::type>::exists; });
}

// `dtype`'s NCCL type; throws, naming `who` and the dtype, when this NCCL has none.
inline ncclDataType_t NcclType(DType dtype, const char* who) {
  TANDEM_CHECK(HasNcclType(dtype), who, ": this NCCL (", NCCL_MAJOR, ".", NCCL_MINOR,
               ") has no type for ", DTypeName(dtype),
               " tensors; convert them with .to(dtype) first (bfloat16 needs NCCL 2.10 or later)");
  return DispatchDType(dtype, who,
                       [](auto tag) { return NcclTypeOf<typename decltype(tag)::type>::value; });
}

}  // namespace tandem::parallel::internal

#endif  // TANDEM_PARALLEL_INTERNAL_NCCL_TYPES_H_
