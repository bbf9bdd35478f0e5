// Test only: the fixtures and helpers of the CUDA kernel tests (cuda_*_test.cc), which check
// every CUDA kernel against the CPU backend (the oracle) on fresh random inputs: sizes that
// are not multiples of the block size, empty and one-element tensors, strided and
// misaligned views. Output buffers start poisoned (NaN, or a sentinel for int64) on both
// devices, and whole buffers are compared, so an element the GPU forgot to write, or one
// it wrote outside the view, shows up as a mismatch.
//
// Skips (with the reason) where there is no usable GPU. The random seed is printed; set
// TANDEM_TEST_SEED to replay a run.
//
// Provides Buffer<T> (one logical buffer on the CPU and on cuda:0, both poisoned), ExpectNear /
// ExpectBitwiseEqual, per-dtype Tolerance, and the fixtures CudaBackendTest,
// CudaBackendFloat64Test and CudaBackendReducedTest (bfloat16/float16). For example:
//   TEST_F(CudaBackendTest, Relu) {
//     Buffer<float> x(Random<float>(100)), y(100);
//     cpu_.Unary(0, UnaryOp::kRelu, y.CpuView({100}), x.CpuView({100}), 0.0);
//     gpu_.Unary(0, UnaryOp::kRelu, y.GpuView({100}), x.GpuView({100}), 0.0);
//     ExpectBitwiseEqual(y.Cpu(), y.Gpu(), Note("relu"));
//   }
#ifndef TANDEM_TENSOR_CUDA_CUDA_BACKEND_TESTING_H_
#define TANDEM_TENSOR_CUDA_CUDA_BACKEND_TESTING_H_

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "tensor/base/device.h"
#include "tensor/base/error.h"
#include "tensor/cuda/cuda.h"
#include "tensor/kernels/internal/elementwise_math.h"
#include "tensor/runtime/allocator.h"
#include "tensor/runtime/backend.h"
#include "tensor/runtime/devices.h"

namespace tandem {
// Named, not unnamed, so that each test file can define the members its tests use.
namespace cuda_test {

constexpr int64_t kPoisonInt = -7777777777;

// NaN for the floating types; for the integral ones a sentinel (its low bits for int32 and
// uint8: 0x8f, neither 0 nor 1, so a kBool view of a uint8 buffer is poisoned too).
template <typename T>
T Poison() {
  if constexpr (std::is_floating_point_v<T> || kIsReducedFloat<T>) {
    return T(std::numeric_limits<float>::quiet_NaN());
  } else {
    return static_cast<T>(kPoisonInt);
  }
}

template <typename T>
double AsDouble(T x) {
  return static_cast<double>(static_cast<OpMath<T>>(x));
}

// The same logical buffer on the CPU (a host vector) and on cuda:`device` (0 unless given),
// both poisoned. `dtype` is T's, or kBool for a Buffer<uint8_t> that holds bools
// (std::vector<bool> has no data()).
template <typename T>
class Buffer {
 public:
  explicit Buffer(size_t n, DType dtype = DTypeOf<T>::value, int device = 0)
      : host_(n, Poison<T>()), dtype_(dtype), device_index_(device) {
    device_ = GetAllocator(Device::Cuda(device)).Allocate(n * sizeof(T));
    Upload();
  }
  explicit Buffer(const std::vector<T>& values, DType dtype = DTypeOf<T>::value, int device = 0)
      : Buffer(values.size(), dtype, device) {
    Set(values);
  }

  void Set(const std::vector<T>& values) {
    host_ = values;
    Upload();
  }
  // What the GPU holds now (waits for it).
  std::vector<T> Gpu() const {
    std::vector<T> out(host_.size());
    GetBackend(DeviceType::kCUDA).CopyToHost(device_index_, out.data(), device_.get(), Bytes());
    return out;
  }
  const std::vector<T>& Cpu() const { return host_; }
  T* cpu() { return host_.data(); }
  T* gpu() { return static_cast<T*>(device_.get()); }
  size_t size() const { return host_.size(); }

  // The same view of both buffers (offset, sizes and strides in elements).
  KernelTensor CpuView(const std::vector<int64_t>& sizes, std::vector<int64_t> strides = {},
                       int64_t offset = 0) {
    return View(cpu() + offset, sizes, strides, dtype_);
  }
  KernelTensor GpuView(const std::vector<int64_t>& sizes, std::vector<int64_t> strides = {},
                       int64_t offset = 0) {
    return View(gpu() + offset, sizes, strides, dtype_);
  }

 private:
  size_t Bytes() const { return host_.size() * sizeof(T); }
  void Upload() {
    GetBackend(DeviceType::kCUDA).CopyFromHost(device_index_, device_.get(), host_.data(), Bytes());
  }
  static KernelTensor View(T* data, const std::vector<int64_t>& sizes, std::vector<int64_t> strides,
                           DType dtype) {
    KernelTensor t;
    t.data = data;
    t.dtype = dtype;
    t.ndim = static_cast<int>(sizes.size());
    if (strides.empty()) {
      strides.assign(sizes.size(), 1);
      for (int d = t.ndim - 2; d >= 0; --d) strides[d] = strides[d + 1] * sizes[d + 1];
    }
    for (int d = 0; d < t.ndim; ++d) {
      t.sizes[d] = sizes[d];
      t.strides[d] = strides[d];
    }
    return t;
  }

  std::vector<T> host_;
  DType dtype_;
  int device_index_;
  std::shared_ptr<void> device_;
};

// Elementwise comparison; NaN matches NaN (so poison left alone on both sides matches).
template <typename T>
void ExpectNear(const std::vector<T>& expected, const std::vector<T>& actual, double rtol,
                double atol, const std::string& what) {
  ASSERT_EQ(expected.size(), actual.size()) << what;
  int reported = 0;
  int64_t mismatches = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const double e = AsDouble(expected[i]), a = AsDouble(actual[i]);
    bool ok;
    if (std::isnan(e) || std::isnan(a)) {
      ok = std::isnan(e) && std::isnan(a);
    } else if (std::isinf(e) || std::isinf(a)) {
      ok = e == a;
    } else {
      ok = std::fabs(static_cast<double>(a) - e) <= atol + rtol * std::fabs(e);
    }
    if (!ok) {
      ++mismatches;
      if (reported++ < 5) {
        ADD_FAILURE() << what << ": element " << i << " is " << a << " on cuda but " << e
                      << " on cpu";
      }
    }
  }
  EXPECT_EQ(mismatches, 0) << what << ": " << mismatches << " of " << expected.size()
                           << " elements differ";
}

template <typename T>
void ExpectBitwiseEqual(const std::vector<T>& expected, const std::vector<T>& actual,
                        const std::string& what) {
  ASSERT_EQ(expected.size(), actual.size()) << what;
  int64_t mismatches = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    if (std::memcmp(&expected[i], &actual[i], sizeof(T)) != 0 &&
        !(std::isnan(AsDouble(expected[i])) && std::isnan(AsDouble(actual[i])))) {
      if (mismatches++ < 5) {
        ADD_FAILURE() << what << ": element " << i << " is " << AsDouble(actual[i])
                      << " on cuda but " << AsDouble(expected[i])
                      << " on cpu (bitwise equality expected)";
      }
    }
  }
  EXPECT_EQ(mismatches, 0) << what;
}

inline void ExpectEqual(const std::vector<int64_t>& expected, const std::vector<int64_t>& actual,
                        const std::string& what) {
  ASSERT_EQ(expected.size(), actual.size()) << what;
  int64_t mismatches = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    if (expected[i] != actual[i] && mismatches++ < 5) {
      ADD_FAILURE() << what << ": element " << i << " is " << actual[i] << " on cuda but "
                    << expected[i] << " on cpu";
    }
  }
  EXPECT_EQ(mismatches, 0) << what;
}

// "float32 " or "float64 ": names the dtype in a failure message.
template <typename T>
std::string DTypePrefix() {
  return std::string(DTypeName(DTypeOf<T>::value)) + " ";
}

// How far the GPU may be from the CPU, per dtype, where the two may round differently (the
// bitwise checks need none).
template <typename T>
struct Tolerance;

template <>
struct Tolerance<float> {
  // expf/logf/tanhf/powf/erff of CUDA and glibc differ by a few ulps of their results; where a
  // formula then cancels (gelu' near its zero at x = -0.75, 1 + erf(x) for x < -2) that ulp
  // of an O(1) term is what is left: 1e-6 absolute covers it (seen on an H200: 3e-8;
  // PyTorch's own float32 atol is 1e-5).
  static constexpr double kUnaryRtol = 4e-6, kUnaryAtol = 1e-6;
  // Both sum in double, in different orders: they agree to float32 rounding.
  static constexpr double kReduceRtol = 1e-6, kReduceAtol = 1e-6;
  static constexpr double kSoftmaxRtol = 1e-5, kSoftmaxAtol = 1e-7;
  // Float32 products summed in different orders: error grows like sqrt(k).
  static constexpr double kGemmRtol = 1e-5, kGemmAtolPerSqrtK = 2e-6;
};

template <>
struct Tolerance<double> {
  // CUDA's double exp/log/tanh/erf/pow and glibc's are both within an ulp or two (and where
  // a formula cancels, an ulp of an O(1) term: as float's above).
  static constexpr double kUnaryRtol = 1e-14, kUnaryAtol = 1e-15;
  // Double sums in different orders: rounding errors of order n * 1e-16.
  static constexpr double kReduceRtol = 1e-12, kReduceAtol = 1e-12;
  // The sums of exp() add in another order: log_sum differs by an ulp, which log_softmax's
  // (x - max) - log_sum keeps as an absolute error where the two nearly cancel.
  static constexpr double kSoftmaxRtol = 1e-13, kSoftmaxAtol = 1e-14;
  static constexpr double kGemmRtol = 1e-13, kGemmAtolPerSqrtK = 1e-14;
};

// Defined with their tests below.

struct ReduceShape {
  int64_t outer, reduce, inner;
};

struct GemmCase;

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (DeviceCount(DeviceType::kCUDA) == 0) {
      GTEST_SKIP() << "no usable CUDA device: " << cuda::UnavailableReason();
    }
    const char* seed_text = std::getenv("TANDEM_TEST_SEED");
    seed_ = seed_text != nullptr ? std::strtoull(seed_text, nullptr, 10) : std::random_device{}();
    std::cout << "TANDEM_TEST_SEED=" << seed_ << "\n";
    rng_.seed(seed_);
  }

  // Uniform values of T in [low, high).
  template <typename T>
  std::vector<T> Random(size_t n, double low = -2.0, double high = 2.0) {
    std::uniform_real_distribution<T> dist(static_cast<T>(low), static_cast<T>(high));
    std::vector<T> values(n);
    for (T& v : values) v = dist(rng_);
    return values;
  }
  // Small integers as T: plenty of exact ties for max/argmax.
  template <typename T>
  std::vector<T> RandomIntegers(size_t n, int low, int high) {
    std::uniform_int_distribution<int> dist(low, high);
    std::vector<T> values(n);
    for (T& v : values) v = static_cast<T>(dist(rng_));
    return values;
  }
  std::vector<int64_t> RandomInts(size_t n, int64_t low, int64_t high) {
    std::uniform_int_distribution<int64_t> dist(low, high);
    std::vector<int64_t> values(n);
    for (int64_t& v : values) v = dist(rng_);
    return values;
  }

  // The checks that float32 and float64 share, one body for both dtypes; each test calls them
  // with its dtype's own sizes. Defined with their tests below.
  template <typename T>
  void ExpectUnaryOpsMatch(const std::vector<int64_t>& sizes, const std::vector<int64_t>& offsets);
  template <typename T>
  void ExpectBinaryOpsMatch(const std::vector<std::pair<int64_t, int64_t>>& shapes,
                            const std::vector<int64_t>& offsets);
  template <typename T>
  void ExpectReductionsMatch(const std::vector<ReduceShape>& shapes);
  template <typename T>
  void ExpectNanWinsMaxAndArgmax();
  template <typename T>
  void ExpectSoftmaxMatches(const std::vector<ReduceShape>& shapes);
  template <typename T>
  void ExpectGemmMatches(const std::vector<GemmCase>& cases);
  template <typename T>
  void ExpectDegenerateGemmMatches();
  template <typename T>
  void ExpectIm2ColAndCol2ImMatch();
  template <typename T>
  void ExpectMaxPoolMatches();
  template <typename T>
  void ExpectGatherAndScatterAddColumnsMatch(const std::vector<int64_t>& row_counts);

  std::string Note(const std::string& what) const {
    std::ostringstream out;
    out << what << " (TANDEM_TEST_SEED=" << seed_ << ")";
    return out.str();
  }

  Backend& cpu_ = GetBackend(DeviceType::kCPU);
  Backend& gpu_ = GetBackend(DeviceType::kCUDA);
  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
};

// ---- float64 only ---------------------------------------------------------------------------
// The checks float64 has and float32 does not (the shared ones run both dtypes above).
// Kernels whose arithmetic is the same expression on both devices must agree bitwise.

class CudaBackendFloat64Test : public CudaBackendTest {};

// ---- bfloat16 and float16 ----------------------------------------------------------------
// Note [16-bit oracle]: the contract of a 16-bit kernel is the float32 kernel on the widened
// inputs, each output rounded once (16-bit values load as float, compute in float and round
// on store). So the expected result is the CPU backend's float32 kernel on the widened values,
// rounded to T: bitwise where the GPU computes the same float expression in the same order
// (and under cudasim, where expf and friends are glibc's, everywhere but the sums that add in
// another order), within one unit in the last place of T where CUDA's expf/logf/tanhf may
// differ from glibc's in the last float bits, and within a tolerance for sums and GEMMs.

template <typename T>
std::vector<float> Widened(const std::vector<T>& values) {
  return std::vector<float>(values.begin(), values.end());
}
template <typename T>
std::vector<T> Rounded(const std::vector<float>& values) {
  std::vector<T> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = T(values[i]);
  return out;
}

// One unit in the last place, relative: T's epsilon (2^-7 for bfloat16, 2^-10 for float16).
template <typename T>
double Ulp() {
  return static_cast<double>(static_cast<float>(std::numeric_limits<T>::epsilon()));
}

class CudaBackendReducedTest : public CudaBackendTest {
 protected:
  // Uniform values in [low, high), rounded to T.
  template <typename T>
  std::vector<T> RandomReduced(size_t n, double low = -2.0, double high = 2.0) {
    return Rounded<T>(Random<float>(n, low, high));
  }
  // The oracle's inputs: a float32 buffer holding `values` widened.
  template <typename T>
  static Buffer<float> Wide(const Buffer<T>& values) {
    return Buffer<float>(Widened(values.Cpu()));
  }
  template <typename T>
  void ExpectElementwiseMatches();
  template <typename T>
  void ExpectPackedMatchesScalar();
  template <typename T>
  void ExpectReductionsAndSoftmaxMatch();
  template <typename T>
  void ExpectGemmMatches16();
  template <typename T>
  void ExpectGemmFloatOutputMatches();
  template <typename T>
  void ExpectConvolutionAndPoolingMatch();
  template <typename T>
  void ExpectGathersScattersAndRandomMatch();
};

}  // namespace cuda_test
}  // namespace tandem

#endif  // TANDEM_TENSOR_CUDA_CUDA_BACKEND_TESTING_H_
