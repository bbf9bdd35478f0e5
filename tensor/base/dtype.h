// DType: the element types a Tensor can hold, with their sizes, names, PyTorch's type
// promotion, and the one place where a runtime DType becomes a C++ type (DispatchDType).
//
//   tandem::Tensor labels = tandem::zeros({256}, tandem::TensorOptions().dtype(tandem::kInt64));
//   tandem::DType t = tandem::PromoteTypes(tandem::kInt64, tandem::kFloat32);   // kFloat32
//   tandem::DispatchFloatingTypes(x.dtype(), "my_op", [&](auto tag) {
//     using T = typename decltype(tag)::type;   // float or double
//     T* p = x.data_ptr<T>();
//   });
//
// Note [Adding a dtype]: a dtype is one row of TANDEM_FORALL_DTYPES below (C++ type, enum
// name, PyTorch's name), its enum value (never renumber: checkpoints store it), its rank in
// PromoteTypes, and a kernel specialisation only where a kernel cannot be written once for
// every T (BLAS calls, vectorised loops). Everything else (ElementSize, DTypeName, the
// dispatchers, checkpoints, printing, to(dtype)) follows from the table.
#ifndef TANDEM_TENSOR_BASE_DTYPE_H_
#define TANDEM_TENSOR_BASE_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <ostream>

#include "tensor/base/error.h"

namespace tandem {

// _(C++ type, enum name without the k, PyTorch's name); a dtype's enum value is fixed below.
#define TANDEM_FORALL_DTYPES(_) \
  _(float, Float32, "float32")  \
  _(int64_t, Int64, "int64")    \
  _(double, Float64, "float64")

enum class DType : int8_t { kFloat32 = 0, kInt64 = 1, kFloat64 = 2 };

inline constexpr DType kFloat32 = DType::kFloat32;
inline constexpr DType kInt64 = DType::kInt64;
inline constexpr DType kFloat64 = DType::kFloat64;
inline constexpr int kNumDTypes = 3;  // enum values are 0 .. kNumDTypes - 1

// Whether `code` is the enum value of a dtype (for readers of stored dtypes).
inline constexpr bool IsValidDTypeCode(int code) { return code >= 0 && code < kNumDTypes; }

inline constexpr size_t ElementSize(DType dtype) {
  switch (dtype) {
#define TANDEM_DTYPE_SIZE(type, name, text) \
  case DType::k##name:                      \
    return sizeof(type);
    TANDEM_FORALL_DTYPES(TANDEM_DTYPE_SIZE)
#undef TANDEM_DTYPE_SIZE
  }
  return 0;
}

inline constexpr const char* DTypeName(DType dtype) {
  switch (dtype) {
#define TANDEM_DTYPE_NAME(type, name, text) \
  case DType::k##name:                      \
    return text;
    TANDEM_FORALL_DTYPES(TANDEM_DTYPE_NAME)
#undef TANDEM_DTYPE_NAME
  }
  return "unknown dtype";
}

inline std::ostream& operator<<(std::ostream& out, DType dtype) { return out << DTypeName(dtype); }

inline constexpr bool IsFloatingPoint(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat64;
}

// PyTorch's promote_types for two tensors' dtypes: a floating type wins over an integral
// one, and a wider type over a narrower one of the same kind (int64 + float32 -> float32,
// float32 + float64 -> float64).
inline constexpr DType PromoteTypes(DType a, DType b) {
  if (a == b) return a;
  // The rank of each dtype in the lattice: integral < float32 < float64.
  auto rank = [](DType t) { return t == DType::kInt64 ? 0 : t == DType::kFloat32 ? 1 : 2; };
  return rank(a) >= rank(b) ? a : b;
}

// The C++ type for a DType, and back.
template <typename T>
struct DTypeOf;
#define TANDEM_DTYPE_OF(type, name, text)          \
  template <>                                      \
  struct DTypeOf<type> {                           \
    static constexpr DType value = DType::k##name; \
  };
TANDEM_FORALL_DTYPES(TANDEM_DTYPE_OF)
#undef TANDEM_DTYPE_OF

// What a dispatcher hands its callable: `typename decltype(tag)::type` is the C++ type.
template <typename T>
struct DTypeTag {
  using type = T;
};

namespace dtype_internal {
[[noreturn]] inline void Unsupported(DType dtype, const char* op, const char* supported) {
  TANDEM_FAIL(op, " is not defined for ", DTypeName(dtype), " tensors (it takes ", supported,
              "); convert the input with .to(dtype) first");
}
}  // namespace dtype_internal

// Note [DType dispatch]: the runtime dtype becomes a C++ type here and nowhere else, as
// PyTorch's AT_DISPATCH_* macros do. `f` is called with DTypeTag<T>{} for the tensor's T;
// a dtype the op does not take throws, naming the op and the dtypes it takes. Generic
// lambdas keep one kernel body for every type.
template <typename F>
decltype(auto) DispatchDType(DType dtype, const char* op, F&& f) {
  switch (dtype) {
#define TANDEM_DTYPE_CASE(type, name, text) \
  case DType::k##name:                      \
    return f(DTypeTag<type>{});
    TANDEM_FORALL_DTYPES(TANDEM_DTYPE_CASE)
#undef TANDEM_DTYPE_CASE
  }
  dtype_internal::Unsupported(dtype, op, "a known dtype");
}

// float32 and float64 only.
template <typename F>
decltype(auto) DispatchFloatingTypes(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::kFloat32:
      return f(DTypeTag<float>{});
    case DType::kFloat64:
      return f(DTypeTag<double>{});
    default:
      dtype_internal::Unsupported(dtype, op, "float32 or float64");
  }
}

}  // namespace tandem

#endif  // TANDEM_TENSOR_BASE_DTYPE_H_
