// Shared helpers of the CPU backend's tests (tensor/cpu/*_test.cc): raw-buffer views, random
// inputs, exact and tolerant float comparisons, and a runner over thread counts. Tests call
// the kernels through the Backend interface with these views, no Tensor:
//
//   std::vector<float> x = RandomFloats(100, -1, 1, /*seed=*/1), y(100);
//   Cpu().Unary(0, UnaryOp::kExp, View(y.data(), {100}), View(x.data(), {100}), 0.0);
#ifndef TANDEM_TENSOR_CPU_CPU_BACKEND_TESTING_H_
#define TANDEM_TENSOR_CPU_CPU_BACKEND_TESTING_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/base/dtype.h"
#include "tensor/base/half.h"
#include "tensor/runtime/backend.h"
#include "tensor/runtime/devices.h"

namespace tandem {
namespace cpu_backend_testing {

inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
inline constexpr float kInf = std::numeric_limits<float>::infinity();

inline Backend& Cpu() { return GetBackend(DeviceType::kCPU); }

// A view of `data` with the given sizes and strides (contiguous strides when omitted).
template <typename T>
KernelTensor View(T* data, std::vector<int64_t> sizes, std::vector<int64_t> strides = {}) {
  KernelTensor t;
  t.data = const_cast<std::remove_const_t<T>*>(data);  // kernels only read inputs
  t.dtype = DTypeOf<std::remove_const_t<T>>::value;
  t.ndim = static_cast<int>(sizes.size());
  if (strides.empty()) {
    strides.resize(sizes.size());
    int64_t stride = 1;
    for (int d = t.ndim - 1; d >= 0; --d) {
      strides[d] = stride;
      stride *= sizes[d];
    }
  }
  for (int d = 0; d < t.ndim; ++d) {
    t.sizes[d] = sizes[d];
    t.strides[d] = strides[d];
  }
  return t;
}

// Element offset of the i-th element (row-major order) of a view.
inline int64_t OffsetOf(const KernelTensor& t, int64_t i) {
  int64_t offset = 0;
  for (int d = t.ndim - 1; d >= 0; --d) {
    offset += (i % t.sizes[d]) * t.strides[d];
    i /= t.sizes[d];
  }
  return offset;
}

inline std::vector<float> RandomFloats(int64_t n, float low, float high, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(low, high);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

inline std::vector<int64_t> RandomInts(int64_t n, int64_t low, int64_t high, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> dist(low, high);
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t& x : v) x = dist(rng);
  return v;
}

// Bitwise equality that treats NaN == NaN, for kernels that must match a reference exactly.
inline ::testing::AssertionResult SameFloat(float expected, float actual) {
  if (std::isnan(expected) && std::isnan(actual)) return ::testing::AssertionSuccess();
  if (expected == actual) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "expected " << expected << " but got " << actual;
}

// Runs `body` once with each logical CPU device on one thread and once with one device on
// all cores, so that kernels are exercised both inline and split over threads.
template <typename Body>
void WithEachThreadCount(Body body) {
  const int original = CpuDeviceCount();
  for (int devices : {HardwareCores(), 1}) {
    SetCpuDeviceCount(devices);
    SCOPED_TRACE("threads per device: " + std::to_string(CpuThreadsPerDevice()));
    body();
  }
  SetCpuDeviceCount(original);
}

// ---- 16-bit floats ----
// Each kernel in BFloat16 and Half against the float32 kernel run on the same (rounded)
// inputs: where the 16-bit kernel computes exactly the float32 function and rounds once, the
// results must be the float32 results rounded, bit for bit; elsewhere (accumulations whose
// order or precision differ) within PyTorch's tolerance. Each test file instantiates
// TYPED_TEST_SUITE(ReducedFloatTest, ReducedFloatTypes) itself.
using ReducedFloatTypes = ::testing::Types<BFloat16, Half>;
template <typename T>
class ReducedFloatTest : public ::testing::Test {};

template <typename T>
std::vector<T> Rounded(const std::vector<float>& values) {
  std::vector<T> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = T(values[i]);
  return out;
}

template <typename T>
std::vector<float> Widened(const std::vector<T>& values) {
  return std::vector<float>(values.begin(), values.end());
}

// PyTorch's tolerance for T (torch.testing.assert_close), rtol scaled by `scale` for long
// accumulations.
template <typename T>
::testing::AssertionResult CloseFor(float expected, float actual, float scale = 1.0f) {
  const float rtol = (std::is_same_v<T, BFloat16> ? 1.6e-2f : 1e-3f) * scale;
  const float atol = 1e-5f * scale;
  if (std::isnan(expected) && std::isnan(actual)) return ::testing::AssertionSuccess();
  if (std::fabs(expected - actual) <= atol + rtol * std::fabs(expected)) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "expected " << expected << " but got " << actual;
}

// Whether the 16-bit value `actual` has the bits of `expected` rounded to T.
template <typename T>
::testing::AssertionResult IsRounded(float expected, T actual) {
  const T want(expected);
  if (want.bits == actual.bits) return ::testing::AssertionSuccess();
  // NaN payloads may differ only where the float NaNs did.
  if (std::isnan(expected) && std::isnan(static_cast<float>(actual))) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "expected " << expected << " rounded (" << static_cast<float>(want) << ", bits "
         << want.bits << ") but got " << static_cast<float>(actual) << " (bits " << actual.bits
         << ")";
}

// ---- Every dtype, against the double-precision math ----
// The oracle of the op tables' tests: an element's expected value is its op's math
// (tensor/kernels/internal/elementwise_math.h) in double on the inputs widened to double, so
// every row of the tables is tested in every dtype without a test row of its own.

// Calls f(DTypeTag<T>) for every dtype of TANDEM_FORALL_DTYPES, with the dtype's name traced.
template <typename F>
void ForEachDType(F&& f) {
  for (int code = 0; code < kNumDTypes; ++code) {
    const DType dtype = static_cast<DType>(code);
    SCOPED_TRACE(std::string("dtype ") + DTypeName(dtype));
    DispatchDType(dtype, "ForEachDType", [&](auto tag) { f(tag); });
  }
}

// A T from a double (the 16-bit floats through float), and back.
template <typename T>
T FromDouble(double v) {
  if constexpr (kIsReducedFloat<T>) {
    return T(static_cast<float>(v));
  } else {
    return static_cast<T>(v);
  }
}
template <typename T>
double ToDouble(T v) {
  return static_cast<double>(static_cast<OpMath<T>>(v));
}

// The double result y stored as T, where T is an integer type or bool: through int64, as the
// kernels compute them (uint8 wraps, bool is "nonzero"); floating types keep y.
template <typename T>
double StoredAs(double y) {
  if constexpr (std::is_floating_point_v<OpMath<T>>) {
    return y;
  } else {
    return ToDouble(static_cast<T>(static_cast<int64_t>(y)));
  }
}

// Whether a kernel's T result is the double math's `expected`: within a few units of float's
// or double's libm error, or of the 16-bit result's rounding (plus the float error before it);
// exactly for the integers and bool. NaN matches NaN.
template <typename T>
::testing::AssertionResult NearOracle(double expected, T result) {
  const double actual = ToDouble(result);
  if ((std::isnan(expected) && std::isnan(actual)) || expected == actual) {
    return ::testing::AssertionSuccess();
  }
  double rtol = 0, atol = 0;
  if constexpr (std::is_same_v<T, float>) {
    rtol = atol = 1e-5;
  } else if constexpr (std::is_same_v<T, double>) {
    rtol = atol = 1e-13;
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    rtol = 0x1p-8;
    atol = 1e-5;
  } else if constexpr (std::is_same_v<T, Half>) {
    rtol = 0x1p-10;
    atol = 1e-5;
  }
  if (std::fabs(expected - actual) <= atol + rtol * std::fabs(expected)) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "expected " << expected << " but got " << actual;
}

// Random inputs of T for the oracle tests: floats in [low, high] (rounded to T); integers in
// [low, high] clipped to what T holds without wrapping (uint8 from 0, bool 0 or 1).
template <typename T>
std::unique_ptr<T[]> RandomOf(int64_t n, double low, double high, uint32_t seed) {
  auto out = std::make_unique<T[]>(n);
  if constexpr (std::is_floating_point_v<OpMath<T>>) {
    const std::vector<float> v =
        RandomFloats(n, static_cast<float>(low), static_cast<float>(high), seed);
    for (int64_t i = 0; i < n; ++i) out[i] = FromDouble<T>(v[i]);
  } else {
    const int64_t lo = std::is_signed_v<T> ? static_cast<int64_t>(low) : 0;
    const int64_t hi = std::is_same_v<T, bool> ? 1 : static_cast<int64_t>(high);
    const std::vector<int64_t> v = RandomInts(n, std::min(lo, hi), hi, seed);
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(v[i]);
  }
  return out;
}

}  // namespace cpu_backend_testing
}  // namespace tandem

#endif  // TANDEM_TENSOR_CPU_CPU_BACKEND_TESTING_H_
