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
#include "tensor/base/half.h"

namespace tandem {

// _(C++ type, enum name without the k, PyTorch's name); a dtype's enum value is fixed below.
#define TANDEM_FORALL_DTYPES(_)     \
  _(float, Float32, "float32")      \
  _(int64_t, Int64, "int64")        \
  _(double, Float64, "float64")     \
  _(BFloat16, BFloat16, "bfloat16") \
  _(Half, Float16, "float16")       \
  _(bool, Bool, "bool")             \
  _(int32_t, Int32, "int32")        \
  _(uint8_t, UInt8, "uint8")

enum class DType : int8_t {
  kFloat32 = 0,
  kInt64 = 1,
  kFloat64 = 2,
  kBFloat16 = 3,
  kFloat16 = 4,
  kBool = 5,
  kInt32 = 6,
  kUInt8 = 7,
};

inline constexpr DType kFloat32 = DType::kFloat32;
inline constexpr DType kInt64 = DType::kInt64;
inline constexpr DType kFloat64 = DType::kFloat64;
inline constexpr DType kBFloat16 = DType::kBFloat16;
inline constexpr DType kFloat16 = DType::kFloat16;
inline constexpr DType kHalf = DType::kFloat16;  // PyTorch's other name for float16
inline constexpr DType kBool = DType::kBool;
inline constexpr DType kInt32 = DType::kInt32;
inline constexpr DType kUInt8 = DType::kUInt8;
inline constexpr int kNumDTypes = 8;  // enum values are 0 .. kNumDTypes - 1

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
  return dtype == DType::kFloat32 || dtype == DType::kFloat64 || dtype == DType::kBFloat16 ||
         dtype == DType::kFloat16;
}

// The 16-bit floats, which kernels load as float and compute in float (Note [Reduced
// precision conversions], tensor/base/half.h).
inline constexpr bool IsReducedFloatingPoint(DType dtype) {
  return dtype == DType::kBFloat16 || dtype == DType::kFloat16;
}

// Integers, and bool when `include_bool` (PyTorch's is_integral(include_bool)).
inline constexpr bool IsIntegral(DType dtype, bool include_bool = false) {
  return dtype == DType::kInt64 || dtype == DType::kInt32 || dtype == DType::kUInt8 ||
         (include_bool && dtype == DType::kBool);
}

// PyTorch's promote_types for two tensors' dtypes: bool < integers < floating types; within
// a kind the wider type wins (uint8 < int32 < int64; float16 and bfloat16 < float32 <
// float64), and float16 with bfloat16 gives float32 (neither holds the other's values).
inline constexpr DType PromoteTypes(DType a, DType b) {
  if (a == b) return a;
  if (IsReducedFloatingPoint(a) && IsReducedFloatingPoint(b)) return DType::kFloat32;
  auto rank = [](DType t) {
    switch (t) {
      case DType::kBool:
        return 0;
      case DType::kUInt8:
        return 1;
      case DType::kInt32:
        return 2;
      case DType::kInt64:
        return 3;
      case DType::kBFloat16:
      case DType::kFloat16:
        return 4;
      case DType::kFloat32:
        return 5;
      case DType::kFloat64:
        return 6;
    }
    return 0;
  };
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

// float32 and float64 only: for kernels that compute in T itself (BLAS calls).
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

// Every floating type: float32, float64, bfloat16, float16. Kernels compute in OpMath<T>
// (float for the 16-bit types) and round once per stored element.
template <typename F>
decltype(auto) DispatchAllFloatingTypes(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::kFloat32:
      return f(DTypeTag<float>{});
    case DType::kFloat64:
      return f(DTypeTag<double>{});
    case DType::kBFloat16:
      return f(DTypeTag<BFloat16>{});
    case DType::kFloat16:
      return f(DTypeTag<Half>{});
    default:
      dtype_internal::Unsupported(dtype, op,
                                  "a floating-point dtype: float32, float64, bfloat16 or float16");
  }
}

}  // namespace tandem

#endif  // TANDEM_TENSOR_BASE_DTYPE_H_
