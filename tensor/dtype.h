// DType: the element types a Tensor can hold (float32 for values, int64 for labels and
// indices), with their sizes and names.
//
//   tandem::Tensor labels = tandem::zeros({256}, tandem::TensorOptions().dtype(tandem::kInt64));
#ifndef TANDEM_TENSOR_DTYPE_H_
#define TANDEM_TENSOR_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <ostream>

namespace tandem {

enum class DType : int8_t { kFloat32 = 0, kInt64 = 1 };

inline constexpr DType kFloat32 = DType::kFloat32;
inline constexpr DType kInt64 = DType::kInt64;

inline constexpr size_t ElementSize(DType dtype) {
  return dtype == DType::kFloat32 ? sizeof(float) : sizeof(int64_t);
}

inline constexpr const char* DTypeName(DType dtype) {
  return dtype == DType::kFloat32 ? "float32" : "int64";
}

inline std::ostream& operator<<(std::ostream& out, DType dtype) { return out << DTypeName(dtype); }

// The C++ type for a DType, and back.
template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::kFloat32;
};
template <>
struct DTypeOf<int64_t> {
  static constexpr DType value = DType::kInt64;
};

}  // namespace tandem

#endif  // TANDEM_TENSOR_DTYPE_H_
