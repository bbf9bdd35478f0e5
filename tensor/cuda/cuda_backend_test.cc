// Every CUDA kernel against the CPU backend (the oracle) on fresh random inputs: sizes that
// are not multiples of the block size, empty and one-element tensors, strided and
// misaligned views. Output buffers start poisoned (NaN, or a sentinel for int64) on both
// devices, and whole buffers are compared, so an element the GPU forgot to write, or one
// it wrote outside the view, shows up as a mismatch.
//
// Skips (with the reason) where there is no usable GPU. The random seed is printed; set
// TANDEM_TEST_SEED to replay a run.
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
namespace {

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

void ExpectEqual(const std::vector<int64_t>& expected, const std::vector<int64_t>& actual,
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
  // expf/logf/tanhf/powf of CUDA and glibc differ by a few ulps.
  static constexpr double kUnaryRtol = 4e-6, kUnaryAtol = 1e-30;
  // Both sum in double, in different orders: they agree to float32 rounding.
  static constexpr double kReduceRtol = 1e-6, kReduceAtol = 1e-6;
  static constexpr double kSoftmaxRtol = 1e-5, kSoftmaxAtol = 1e-7;
  // Float32 products summed in different orders: error grows like sqrt(k).
  static constexpr double kGemmRtol = 1e-5, kGemmAtolPerSqrtK = 2e-6;
};

template <>
struct Tolerance<double> {
  // CUDA's double exp/log/tanh/erf/pow and glibc's are both within an ulp or two.
  static constexpr double kUnaryRtol = 1e-14, kUnaryAtol = 1e-300;
  // Double sums in different orders: rounding errors of order n * 1e-16.
  static constexpr double kReduceRtol = 1e-12, kReduceAtol = 1e-12;
  // The sums of exp() add in another order: log_sum differs by an ulp, which log_softmax's
  // (x - max) - log_sum keeps as an absolute error where the two nearly cancel.
  static constexpr double kSoftmaxRtol = 1e-13, kSoftmaxAtol = 1e-14;
  static constexpr double kGemmRtol = 1e-13, kGemmAtolPerSqrtK = 1e-14;
};

// Defined with their tests below.
struct ReduceShape;
struct GemmCase;
struct OptimizerCase;  // the fused optimizer tests' flag combinations

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
  template <typename T>
  void ExpectFusedUpdatesMatch(const std::vector<std::pair<const OptimizerCase*, int64_t>>& items,
                               const std::string& what);
  template <typename T>
  void ExpectEveryOptimizerCaseMatches();

  void ExpectEveryOptimizerCaseMatches();

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

// ---- Copy and Fill --------------------------------------------------------------------------

TEST_F(CudaBackendTest, CopyContiguousStridedAndConverting) {
  for (int64_t rows : {0, 1, 3, 257}) {
    for (int64_t cols : {1, 5, 1029}) {
      const int64_t n = rows * cols;
      Buffer<float> src(Random<float>(n, -100.0f, 100.0f));
      // Contiguous copy.
      Buffer<float> dst(n);
      cpu_.Copy(0, dst.CpuView({rows, cols}), src.CpuView({rows, cols}));
      gpu_.Copy(0, dst.GpuView({rows, cols}), src.GpuView({rows, cols}));
      ExpectBitwiseEqual(dst.Cpu(), dst.Gpu(), Note("contiguous copy"));
      // Transposing copy: dst[c][r] = src[r][c].
      Buffer<float> transposed(n);
      cpu_.Copy(0, transposed.CpuView({rows, cols}, {1, rows}), src.CpuView({rows, cols}));
      gpu_.Copy(0, transposed.GpuView({rows, cols}, {1, rows}), src.GpuView({rows, cols}));
      ExpectBitwiseEqual(transposed.Cpu(), transposed.Gpu(), Note("transposing copy"));
      // float32 -> int64 and back.
      Buffer<int64_t> as_int(n);
      cpu_.Copy(0, as_int.CpuView({rows, cols}), src.CpuView({rows, cols}));
      gpu_.Copy(0, as_int.GpuView({rows, cols}), src.GpuView({rows, cols}));
      ExpectEqual(as_int.Cpu(), as_int.Gpu(), Note("float32 -> int64 copy"));
      Buffer<float> back(n);
      cpu_.Copy(0, back.CpuView({rows, cols}), as_int.CpuView({rows, cols}));
      gpu_.Copy(0, back.GpuView({rows, cols}), as_int.GpuView({rows, cols}));
      ExpectBitwiseEqual(back.Cpu(), back.Gpu(), Note("int64 -> float32 copy"));
    }
  }
}

TEST_F(CudaBackendTest, CopyBroadcastsAndLeavesOtherElementsAlone) {
  // A row broadcast into every other column of a wider buffer: stride-0 source, strided
  // destination; the untouched columns must stay poisoned.
  const int64_t rows = 33, cols = 70;
  Buffer<float> row(Random<float>(cols));
  Buffer<float> dst(rows * cols * 2);
  cpu_.Copy(0, dst.CpuView({rows, cols}, {2 * cols, 2}, 1), row.CpuView({rows, cols}, {0, 1}));
  gpu_.Copy(0, dst.GpuView({rows, cols}, {2 * cols, 2}, 1), row.GpuView({rows, cols}, {0, 1}));
  ExpectBitwiseEqual(dst.Cpu(), dst.Gpu(), Note("broadcasting strided copy"));
}

TEST_F(CudaBackendTest, FillContiguousStridedAndInt64) {
  for (int64_t n : {0, 1, 3, 4, 1000, 100003}) {
    for (double value : {0.0, -0.0, 2.5, -1e30}) {
      for (int64_t offset : {0, 1}) {  // 1: not 16-byte aligned
        Buffer<float> dst(n + 1);
        cpu_.Fill(0, dst.CpuView({n}, {}, offset), value);
        gpu_.Fill(0, dst.GpuView({n}, {}, offset), value);
        ExpectBitwiseEqual(dst.Cpu(), dst.Gpu(), Note("float fill"));
      }
    }
    Buffer<float> every_third(3 * n);
    cpu_.Fill(0, every_third.CpuView({n}, {3}), 7.0);
    gpu_.Fill(0, every_third.GpuView({n}, {3}), 7.0);
    ExpectBitwiseEqual(every_third.Cpu(), every_third.Gpu(), Note("strided fill"));
    Buffer<int64_t> ints(n);
    cpu_.Fill(0, ints.CpuView({n}), -42.0);
    gpu_.Fill(0, ints.GpuView({n}), -42.0);
    ExpectEqual(ints.Cpu(), ints.Gpu(), Note("int64 fill"));
  }
}

// ---- Unary and Binary ---------------------------------------------------------------------------

const std::vector<UnaryOp> kAllUnary = AllUnaryOps();

// Every float op on `sizes` elements at each of `offsets` (0: aligned, the vectorised path;
// 1: misaligned), and through a transposed view into a transposed view (the strided path).
template <typename T>
void CudaBackendTest::ExpectUnaryOpsMatch(const std::vector<int64_t>& sizes,
                                          const std::vector<int64_t>& offsets) {
  const double rtol = Tolerance<T>::kUnaryRtol, atol = Tolerance<T>::kUnaryAtol;
  for (UnaryOp op : kAllUnary) {
    const bool positive_only =
        op == UnaryOp::kLog || op == UnaryOp::kSqrt || op == UnaryOp::kPowScalar;
    for (int64_t n : sizes) {
      const std::string what =
          Note(DTypePrefix<T>() + "unary op " + std::to_string(static_cast<int>(op)) + " on " +
               std::to_string(n) + " elements");
      Buffer<T> src(positive_only ? Random<T>(n + 1, 0.01, 5.0) : Random<T>(n + 1));
      for (int64_t offset : offsets) {
        Buffer<T> dst(n + 1);
        cpu_.Unary(0, op, dst.CpuView({n}, {}, offset), src.CpuView({n}, {}, offset), 1.5);
        gpu_.Unary(0, op, dst.GpuView({n}, {}, offset), src.GpuView({n}, {}, offset), 1.5);
        ExpectNear(dst.Cpu(), dst.Gpu(), rtol, atol, what);
      }
      const int64_t rows = n / 7, cols = 7;
      Buffer<T> dst(n + 1);
      cpu_.Unary(0, op, dst.CpuView({cols, rows}, {1, cols}), src.CpuView({cols, rows}, {1, cols}),
                 -0.5);
      gpu_.Unary(0, op, dst.GpuView({cols, rows}, {1, cols}), src.GpuView({cols, rows}, {1, cols}),
                 -0.5);
      ExpectNear(dst.Cpu(), dst.Gpu(), rtol, atol, what + " (strided)");
    }
  }
}

TEST_F(CudaBackendTest, UnaryFloatOpsMatchTheCpu) {
  ExpectUnaryOpsMatch<float>({0, 1, 7, 1024, 100001}, {0, 1});
  ExpectUnaryOpsMatch<double>({0, 1, 7, 4099}, {1});
  // A scalar that float32 cannot hold: float64 must not round it through float.
  Buffer<double> x(std::vector<double>{1.0, 2.0});
  Buffer<double> y(2);
  gpu_.Unary(0, UnaryOp::kAddScalar, y.GpuView({2}), x.GpuView({2}), 0.1);
  EXPECT_EQ(y.Gpu(), (std::vector<double>{1.0 + 0.1, 2.0 + 0.1}));
}

TEST_F(CudaBackendTest, UnaryInPlaceAndInt64) {
  const int64_t n = 5003;
  Buffer<float> x(Random<float>(n));
  cpu_.Unary(0, UnaryOp::kRelu, x.CpuView({n}), x.CpuView({n}), 0.0);
  gpu_.Unary(0, UnaryOp::kRelu, x.GpuView({n}), x.GpuView({n}), 0.0);
  ExpectBitwiseEqual(x.Cpu(), x.Gpu(), Note("in-place relu"));
  for (UnaryOp op : {UnaryOp::kNeg, UnaryOp::kAbs, UnaryOp::kAddScalar, UnaryOp::kMulScalar}) {
    Buffer<int64_t> src(RandomInts(n, -1000000, 1000000));
    Buffer<int64_t> dst(n);
    cpu_.Unary(0, op, dst.CpuView({n}), src.CpuView({n}), -3.0);
    gpu_.Unary(0, op, dst.GpuView({n}), src.GpuView({n}), -3.0);
    ExpectEqual(dst.Cpu(), dst.Gpu(),
                Note("int64 unary op " + std::to_string(static_cast<int>(op))));
  }
  Buffer<int64_t> ints(4);
  EXPECT_THROW(gpu_.Unary(0, UnaryOp::kExp, ints.GpuView({4}), ints.GpuView({4}), 0.0), Error);
}

const std::vector<BinaryOp> kAllBinary = AllBinaryOps();

// Binary ops through erf or exp, whose float results CUDA and glibc may round differently (on
// a GPU; under cudasim they are bitwise equal).
bool IsTranscendentalOp(BinaryOp op) {
  return op == BinaryOp::kGeluBackward || op == BinaryOp::kGeluTanhBackward ||
         op == BinaryOp::kSiluBackward;
}

// Shapes of b relative to a's [rows, cols] output: full, a row, a column, a scalar.
struct Broadcast {
  const char* name;
  bool row, column;
};
const Broadcast kBroadcasts[] = {
    {"full", false, false}, {"row", true, false}, {"column", false, true}, {"scalar", true, true}};

// Every op with each broadcast of b on [rows, cols] `shapes`, at each of `offsets`, then in
// place into a (dst aliases a exactly). The same expression on both devices: bitwise.
template <typename T>
void CudaBackendTest::ExpectBinaryOpsMatch(const std::vector<std::pair<int64_t, int64_t>>& shapes,
                                           const std::vector<int64_t>& offsets) {
  for (BinaryOp op : kAllBinary) {
    for (const Broadcast& broadcast : kBroadcasts) {
      for (auto [rows, cols] : shapes) {
        const std::string what =
            Note(DTypePrefix<T>() + "binary op " + std::to_string(static_cast<int>(op)) + ", " +
                 broadcast.name + " b, " + std::to_string(rows) + "x" + std::to_string(cols));
        const int64_t n = rows * cols;
        // Integer-valued inputs make comparisons hit equality too.
        Buffer<T> a(RandomIntegers<T>(n + 1, -4, 4));
        Buffer<T> b(op == BinaryOp::kDiv ? Random<T>(n + 1, 0.5, 3.0)
                                         : RandomIntegers<T>(n + 1, -4, 4));
        const std::vector<int64_t> b_strides = {broadcast.column ? 0 : cols, broadcast.row ? 0 : 1};
        for (int64_t offset : offsets) {
          Buffer<T> dst(n + 1);
          cpu_.Binary(0, op, dst.CpuView({rows, cols}, {}, offset),
                      a.CpuView({rows, cols}, {}, offset),
                      b.CpuView({rows, cols}, b_strides, offset));
          gpu_.Binary(0, op, dst.GpuView({rows, cols}, {}, offset),
                      a.GpuView({rows, cols}, {}, offset),
                      b.GpuView({rows, cols}, b_strides, offset));
          if (IsTranscendentalOp(op)) {
            ExpectNear(dst.Cpu(), dst.Gpu(), Tolerance<T>::kUnaryRtol, Tolerance<T>::kUnaryAtol,
                       what);
          } else {
            ExpectBitwiseEqual(dst.Cpu(), dst.Gpu(), what);
          }
        }
        if (IsTranscendentalOp(op)) continue;  // in place, compared bitwise, needs exact inputs
        cpu_.Binary(0, op, a.CpuView({rows, cols}), a.CpuView({rows, cols}),
                    b.CpuView({rows, cols}, b_strides));
        gpu_.Binary(0, op, a.GpuView({rows, cols}), a.GpuView({rows, cols}),
                    b.GpuView({rows, cols}, b_strides));
        ExpectBitwiseEqual(a.Cpu(), a.Gpu(), what + " (in place)");
      }
    }
  }
}

TEST_F(CudaBackendTest, BinaryFloatOpsWithBroadcasting) {
  ExpectBinaryOpsMatch<float>({{0, 3}, {1, 1}, {3, 5}, {129, 257}}, {0, 1});
  ExpectBinaryOpsMatch<double>({{33, 65}}, {0});
}

TEST_F(CudaBackendTest, BinaryInt64OpsAndTransposedOutput) {
  const int64_t rows = 37, cols = 41, n = rows * cols;
  for (BinaryOp op : kAllBinary) {
    if (BinaryIsFloatingOnly(op)) continue;  // refused on integers (ExpectIntegralKernelsMatch)
    Buffer<int64_t> a(RandomInts(n, -50, 50));
    Buffer<int64_t> b(RandomInts(n, 1, 9));  // no division by zero
    Buffer<int64_t> dst(n);
    // The output is written transposed: dst viewed [rows, cols] with strides {1, rows}.
    cpu_.Binary(0, op, dst.CpuView({rows, cols}, {1, rows}), a.CpuView({rows, cols}),
                b.CpuView({rows, cols}));
    gpu_.Binary(0, op, dst.GpuView({rows, cols}, {1, rows}), a.GpuView({rows, cols}),
                b.GpuView({rows, cols}));
    ExpectEqual(dst.Cpu(), dst.Gpu(),
                Note("int64 binary op " + std::to_string(static_cast<int>(op))));
  }
}

TEST_F(CudaBackendTest, ElementwiseOnLargeFourDimensionalViews) {
  // A permuted 4-D view that merges into nothing simpler (the strided path), plus a
  // broadcast over two of its dimensions.
  const std::vector<int64_t> sizes = {3, 17, 5, 129};
  const int64_t n = 3 * 17 * 5 * 129;
  Buffer<float> a(Random<float>(n));
  Buffer<float> b(Random<float>(17 * 129));
  Buffer<float> dst(n);
  const std::vector<int64_t> a_strides = {5 * 129, 3 * 5 * 129, 1, 5};  // a permutation
  const std::vector<int64_t> b_strides = {0, 129, 0, 1};
  cpu_.Binary(0, BinaryOp::kMul, dst.CpuView(sizes), a.CpuView(sizes, a_strides),
              b.CpuView(sizes, b_strides));
  gpu_.Binary(0, BinaryOp::kMul, dst.GpuView(sizes), a.GpuView(sizes, a_strides),
              b.GpuView(sizes, b_strides));
  ExpectBitwiseEqual(dst.Cpu(), dst.Gpu(), Note("4-D strided multiply"));
}

// ---- Reductions
// ----------------------------------------------------------------------------------

struct ReduceShape {
  int64_t outer, reduce, inner;
};

// Every reduction over each [outer, reduce, inner] of `shapes`: sums of continuous values,
// max/min/argmax/argmin of small integers (ties everywhere).
template <typename T>
void CudaBackendTest::ExpectReductionsMatch(const std::vector<ReduceShape>& shapes) {
  for (ReduceKind op : {ReduceKind::kSum, ReduceKind::kMax, ReduceKind::kMin, ReduceKind::kArgMax,
                        ReduceKind::kArgMin}) {
    const bool arg = op == ReduceKind::kArgMax || op == ReduceKind::kArgMin;
    for (const ReduceShape& s : shapes) {
      const std::string what =
          Note(DTypePrefix<T>() + "reduce op " + std::to_string(static_cast<int>(op)) + " over [" +
               std::to_string(s.outer) + ", " + std::to_string(s.reduce) + ", " +
               std::to_string(s.inner) + "]");
      const int64_t n = s.outer * s.reduce * s.inner, outputs = s.outer * s.inner;
      Buffer<T> src(op == ReduceKind::kSum ? Random<T>(n) : RandomIntegers<T>(n, -20, 20));
      const std::vector<int64_t> in_shape = {s.outer, s.reduce, s.inner};
      const std::vector<int64_t> out_shape = {s.outer, s.inner};
      if (arg) {
        Buffer<int64_t> dst(outputs);
        cpu_.Reduce(0, op, dst.CpuView(out_shape), src.CpuView(in_shape), s.outer, s.reduce,
                    s.inner);
        gpu_.Reduce(0, op, dst.GpuView(out_shape), src.GpuView(in_shape), s.outer, s.reduce,
                    s.inner);
        ExpectEqual(dst.Cpu(), dst.Gpu(), what);
      } else {
        Buffer<T> dst(outputs);
        cpu_.Reduce(0, op, dst.CpuView(out_shape), src.CpuView(in_shape), s.outer, s.reduce,
                    s.inner);
        gpu_.Reduce(0, op, dst.GpuView(out_shape), src.GpuView(in_shape), s.outer, s.reduce,
                    s.inner);
        ExpectNear(dst.Cpu(), dst.Gpu(), Tolerance<T>::kReduceRtol, Tolerance<T>::kReduceAtol,
                   what);
      }
    }
  }
}

TEST_F(CudaBackendTest, ReduceFloat) {
  ExpectReductionsMatch<float>({
      {1, 1, 1},
      {1, 7, 1},
      {64, 10, 1},
      {7, 1000, 1},
      {5, 7, 33},
      {2, 3000, 300},
      {1, 3000001, 1},  // one row, split over many blocks
      {3, 50000, 5},    // few columns, split
      {1, 1, 100003},   // nothing to reduce
      {0, 5, 3},        // no output
  });
  ExpectReductionsMatch<double>({{1, 1, 1},
                                 {64, 10, 1},
                                 {7, 1000, 1},
                                 {5, 7, 33},
                                 {2, 300, 30},
                                 {1, 300001, 1},  // one row, split
                                 {3, 5000, 5},
                                 {0, 5, 3}});
}

// NaN wins max and argmax (the first NaN), as on the CPU.
template <typename T>
void CudaBackendTest::ExpectNanWinsMaxAndArgmax() {
  const int64_t rows = 4, cols = 3001;
  std::vector<T> values = Random<T>(rows * cols);
  values[1 * cols + 2000] = NAN;
  values[1 * cols + 2500] = NAN;
  values[3 * cols + 7] = NAN;
  Buffer<T> src(values);
  Buffer<int64_t> argmax(rows);
  Buffer<T> max(rows);
  cpu_.Reduce(0, ReduceKind::kMax, max.CpuView({rows}), src.CpuView({rows, cols}), rows, cols, 1);
  gpu_.Reduce(0, ReduceKind::kMax, max.GpuView({rows}), src.GpuView({rows, cols}), rows, cols, 1);
  ExpectBitwiseEqual(max.Cpu(), max.Gpu(), Note(DTypePrefix<T>() + "max with NaN"));
  cpu_.Reduce(0, ReduceKind::kArgMax, argmax.CpuView({rows}), src.CpuView({rows, cols}), rows, cols,
              1);
  gpu_.Reduce(0, ReduceKind::kArgMax, argmax.GpuView({rows}), src.GpuView({rows, cols}), rows, cols,
              1);
  ExpectEqual(argmax.Cpu(), argmax.Gpu(), Note(DTypePrefix<T>() + "argmax with NaN"));
  EXPECT_EQ(argmax.Gpu()[1], 2000);
}

TEST_F(CudaBackendTest, ReduceNanAndInt64AndEmptySum) {
  ExpectNanWinsMaxAndArgmax<float>();
  ExpectNanWinsMaxAndArgmax<double>();

  for (ReduceKind op : {ReduceKind::kSum, ReduceKind::kMax, ReduceKind::kArgMin}) {
    const int64_t outer = 3, reduce = 20001, inner = 2;
    Buffer<int64_t> ints(RandomInts(outer * reduce * inner, -1000, 1000));
    Buffer<int64_t> dst(outer * inner);
    cpu_.Reduce(0, op, dst.CpuView({outer, inner}), ints.CpuView({outer, reduce, inner}), outer,
                reduce, inner);
    gpu_.Reduce(0, op, dst.GpuView({outer, inner}), ints.GpuView({outer, reduce, inner}), outer,
                reduce, inner);
    ExpectEqual(dst.Cpu(), dst.Gpu(),
                Note("int64 reduce op " + std::to_string(static_cast<int>(op))));
  }

  Buffer<float> empty_sum(6);
  Buffer<float> nothing(1);
  gpu_.Reduce(0, ReduceKind::kSum, empty_sum.GpuView({2, 3}), nothing.GpuView({2, 0, 3}), 2, 0, 3);
  EXPECT_EQ(empty_sum.Gpu(), std::vector<float>(6, 0.0f));
  EXPECT_THROW(gpu_.Reduce(0, ReduceKind::kMax, empty_sum.GpuView({2, 3}),
                           nothing.GpuView({2, 0, 3}), 2, 0, 3),
               Error);
}

// ---- Softmax
// ---------------------------------------------------------------------------------------

template <typename T>
void CudaBackendTest::ExpectSoftmaxMatches(const std::vector<ReduceShape>& shapes) {
  for (bool log : {false, true}) {
    for (const ReduceShape& s : shapes) {
      const std::string what =
          Note(DTypePrefix<T>() + (log ? "log_softmax" : "softmax") + " over [" +
               std::to_string(s.outer) + ", " + std::to_string(s.reduce) + ", " +
               std::to_string(s.inner) + "]");
      const int64_t n = s.outer * s.reduce * s.inner;
      Buffer<T> src(Random<T>(n, -10.0, 10.0));
      Buffer<T> dst(n);
      const DType dtype = DTypeOf<T>::value;
      cpu_.Softmax(0, dtype, log, dst.cpu(), src.cpu(), s.outer, s.reduce, s.inner);
      gpu_.Softmax(0, dtype, log, dst.gpu(), src.gpu(), s.outer, s.reduce, s.inner);
      ExpectNear(dst.Cpu(), dst.Gpu(), Tolerance<T>::kSoftmaxRtol, Tolerance<T>::kSoftmaxAtol,
                 what);
    }
  }
}

TEST_F(CudaBackendTest, SoftmaxAndLogSoftmax) {
  ExpectSoftmaxMatches<float>({{1, 1, 1},
                               {257, 10, 1},
                               {3, 5000, 1},
                               {2, 1025, 1},
                               {4, 7, 9},
                               {2, 300, 65},
                               {0, 3, 1},
                               {3, 0, 2}});
  ExpectSoftmaxMatches<double>(
      {{1, 1, 1}, {257, 10, 1}, {3, 2000, 1}, {4, 7, 9}, {2, 100, 65}, {0, 3, 1}});
  // A row with -inf (a masked logit) and a row with NaN.
  Buffer<float> special(std::vector<float>{-INFINITY, 1.0f, 2.0f, NAN, 0.0f, 1.0f});
  Buffer<float> out(6);
  cpu_.Softmax(0, kFloat32, false, out.cpu(), special.cpu(), 2, 3, 1);
  gpu_.Softmax(0, kFloat32, false, out.gpu(), special.gpu(), 2, 3, 1);
  ExpectNear(out.Cpu(), out.Gpu(), 1e-6, 0.0, Note("softmax of -inf and NaN"));
  Buffer<int64_t> ints(4);
  EXPECT_THROW(gpu_.Softmax(0, kInt64, false, ints.gpu(), ints.gpu(), 1, 4, 1), Error);
}

// ---- GEMM
// ----------------------------------------------------------------------------------------

struct GemmCase {
  int64_t m, n, k, batch;
};

// Each case with A and B transposed or not, A shared by the batch or not, beta 0 and 0.5.
template <typename T>
void CudaBackendTest::ExpectGemmMatches(const std::vector<GemmCase>& cases) {
  const DType dtype = DTypeOf<T>::value;
  for (const GemmCase& g : cases) {
    for (bool trans_a : {false, true}) {
      for (bool trans_b : {false, true}) {
        for (bool shared_a : {false, true}) {  // stride_a = 0: one A for the whole batch
          const std::string what = Note(
              DTypePrefix<T>() + "gemm m=" + std::to_string(g.m) + " n=" + std::to_string(g.n) +
              " k=" + std::to_string(g.k) + " batch=" + std::to_string(g.batch) +
              (trans_a ? " A^T" : "") + (trans_b ? " B^T" : "") + (shared_a ? " shared A" : ""));
          // Leading dimensions wider than the rows, to test strides.
          const int64_t lda = (trans_a ? g.m : g.k) + 3, ldb = (trans_b ? g.k : g.n) + 1,
                        ldc = g.n + 2;
          const int64_t a_rows = trans_a ? g.k : g.m, b_rows = trans_b ? g.n : g.k;
          const int64_t stride_a = shared_a ? 0 : a_rows * lda, stride_b = b_rows * ldb,
                        stride_c = g.m * ldc;
          Buffer<T> a(Random<T>((shared_a ? 1 : g.batch) * a_rows * lda, -1.0, 1.0));
          Buffer<T> b(Random<T>(g.batch * b_rows * ldb, -1.0, 1.0));
          Buffer<T> c(Random<T>(g.batch * stride_c, -1.0, 1.0));
          for (double beta : {0.0, 0.5}) {
            Buffer<T> out(c.Cpu());  // the same initial C on both devices
            cpu_.Gemm(0, dtype, trans_a, trans_b, g.m, g.n, g.k, 1.25, a.cpu(), lda, stride_a,
                      b.cpu(), ldb, stride_b, beta, out.cpu(), ldc, stride_c, g.batch);
            gpu_.Gemm(0, dtype, trans_a, trans_b, g.m, g.n, g.k, 1.25, a.gpu(), lda, stride_a,
                      b.gpu(), ldb, stride_b, beta, out.gpu(), ldc, stride_c, g.batch);
            ExpectNear(out.Cpu(), out.Gpu(), Tolerance<T>::kGemmRtol,
                       Tolerance<T>::kGemmAtolPerSqrtK * std::sqrt(static_cast<double>(g.k)),
                       what + " beta=" + std::to_string(beta));
          }
        }
      }
    }
  }
}

TEST_F(CudaBackendTest, GemmAllTranspositionsAndBatches) {
  ExpectGemmMatches<float>({{1, 1, 1, 1},
                            {33, 17, 65, 1},
                            {128, 256, 64, 1},
                            {5, 300, 2, 1},
                            {7, 9, 11, 4},
                            {64, 10, 784, 3}});
  ExpectGemmMatches<double>({{1, 1, 1, 1}, {33, 17, 65, 1}, {7, 9, 11, 4}, {64, 10, 300, 3}});
}

// k = 0 or alpha = 0: C = beta * C; beta = 0 clears even NaN. m = 0: nothing.
template <typename T>
void CudaBackendTest::ExpectDegenerateGemmMatches() {
  const DType dtype = DTypeOf<T>::value;
  const int64_t m = 3, n = 4;
  std::vector<T> c_values = Random<T>(m * n);
  c_values[5] = NAN;
  for (auto [k, alpha, beta] : {std::tuple<int64_t, double, double>{0, 1.0, 0.0},
                                {0, 1.0, 2.0},
                                {0, 1.0, 0.1},
                                {5, 0.0, 0.0},
                                {5, 0.0, -1.0}}) {
    Buffer<T> a(Random<T>(m * 5));
    Buffer<T> b(Random<T>(5 * n));
    Buffer<T> c(c_values);
    // With k = 0, A and B have no elements: null pointers show that neither backend reads them.
    const bool empty = k == 0;
    const int64_t lda = std::max<int64_t>(k, 1);  // BLAS wants a row stride of at least 1
    cpu_.Gemm(0, dtype, false, false, m, n, k, alpha, empty ? nullptr : a.cpu(), lda, 0,
              empty ? nullptr : b.cpu(), n, 0, beta, c.cpu(), n, 0, 1);
    gpu_.Gemm(0, dtype, false, false, m, n, k, alpha, empty ? nullptr : a.gpu(), lda, 0,
              empty ? nullptr : b.gpu(), n, 0, beta, c.gpu(), n, 0, 1);
    ExpectBitwiseEqual(c.Cpu(), c.Gpu(),
                       Note(DTypePrefix<T>() + "degenerate gemm k=" + std::to_string(k) +
                            " beta=" + std::to_string(beta)));
  }
  Buffer<T> c(c_values);
  gpu_.Gemm(0, dtype, false, false, 0, n, 5, 1.0, nullptr, 5, 0, nullptr, n, 0, 0.0, c.gpu(), n, 0,
            1);
  ExpectBitwiseEqual(c.Cpu(), c.Gpu(), Note(DTypePrefix<T>() + "gemm with m = 0 writes nothing"));
  EXPECT_THROW(gpu_.Gemm(0, dtype, false, false, m, n, 5, 1.0, c.gpu(), 2, 0, c.gpu(), n, 0, 0.0,
                         c.gpu(), n, 0, 1),
               Error);  // lda = 2 < k = 5
}

TEST_F(CudaBackendTest, GemmDegenerateSizes) {
  ExpectDegenerateGemmMatches<float>();
  ExpectDegenerateGemmMatches<double>();
}

TEST_F(CudaBackendTest, GemmTf32SwitchTradesPrecisionForSpeed) {
  const int64_t m = 256, n = 256, k = 1024;
  Buffer<float> a(Random<float>(m * k, -1.0f, 1.0f));
  Buffer<float> b(Random<float>(k * n, -1.0f, 1.0f));
  Buffer<float> c(m * n);
  cpu_.Gemm(0, kFloat32, false, false, m, n, k, 1.0f, a.cpu(), k, 0, b.cpu(), n, 0, 0.0f, c.cpu(),
            n, 0, 1);
  ASSERT_FALSE(cuda::AllowTf32());
  cuda::SetAllowTf32(true);
  gpu_.Gemm(0, kFloat32, false, false, m, n, k, 1.0f, a.gpu(), k, 0, b.gpu(), n, 0, 0.0f, c.gpu(),
            n, 0, 1);
  const std::vector<float> tf32 = c.Gpu();
  cuda::SetAllowTf32(false);
  gpu_.Gemm(0, kFloat32, false, false, m, n, k, 1.0f, a.gpu(), k, 0, b.gpu(), n, 0, 0.0f, c.gpu(),
            n, 0, 1);
  const std::vector<float> fp32 = c.Gpu();
  double tf32_error = 0.0, fp32_error = 0.0;
  for (int64_t i = 0; i < m * n; ++i) {
    tf32_error = std::max(tf32_error, std::fabs(static_cast<double>(tf32[i]) - c.Cpu()[i]));
    fp32_error = std::max(fp32_error, std::fabs(static_cast<double>(fp32[i]) - c.Cpu()[i]));
  }
  // TF32 keeps 10 mantissa bits: errors of order 1e-3 * sqrt(k) here; FP32 about 1e-5.
  EXPECT_LT(fp32_error, 1e-4);
  EXPECT_LT(tf32_error, 0.5);
  EXPECT_GT(tf32_error, fp32_error)
      << "allowing TF32 changed nothing: is NVIDIA_TF32_OVERRIDE=0 set?";
}

// ---- Convolution and pooling --------------------------------------------------------------------

const Conv2dGeometry kGeometries[] = {
    Conv2dGeometry::Make(2, 3, 7, 9, 3, 3, 1, 1, 1, 1),
    Conv2dGeometry::Make(1, 2, 8, 8, 2, 2, 2, 2, 0, 0),
    Conv2dGeometry::Make(2, 1, 5, 6, 3, 2, 2, 1, 1, 0),
    Conv2dGeometry::Make(1, 1, 1, 1, 1, 1, 1, 1, 0, 0),
    Conv2dGeometry::Make(3, 4, 28, 28, 5, 5, 1, 1, 2, 2),
    Conv2dGeometry::Make(2, 5, 13, 11, 3, 3, 2, 2, 1, 1),
    Conv2dGeometry::Make(0, 3, 4, 4, 3, 3, 1, 1, 1, 1),
};

std::string Describe(const Conv2dGeometry& g) {
  std::ostringstream out;
  out << "[" << g.batch << ", " << g.channels << ", " << g.height << ", " << g.width << "] kernel "
      << g.kernel_h << "x" << g.kernel_w << " stride " << g.stride_h << "x" << g.stride_w << " pad "
      << g.pad_h << "x" << g.pad_w;
  return out.str();
}

template <typename T>
void CudaBackendTest::ExpectIm2ColAndCol2ImMatch() {
  const DType dtype = DTypeOf<T>::value;
  for (const Conv2dGeometry& g : kGeometries) {
    const int64_t image_size = g.batch * g.channels * g.height * g.width;
    const int64_t column_size =
        g.batch * g.channels * g.kernel_h * g.kernel_w * g.out_h() * g.out_w();
    Buffer<T> image(Random<T>(image_size));
    Buffer<T> columns(column_size);
    cpu_.Im2Col(0, dtype, g, image.cpu(), columns.cpu());
    gpu_.Im2Col(0, dtype, g, image.gpu(), columns.gpu());
    ExpectBitwiseEqual(columns.Cpu(), columns.Gpu(),
                       Note(DTypePrefix<T>() + "im2col " + Describe(g)));
    // Col2Im adds in the CPU's order: bitwise equal too.
    Buffer<T> grad_columns(Random<T>(column_size));
    Buffer<T> grad_image(image_size);
    cpu_.Col2Im(0, dtype, g, grad_columns.cpu(), grad_image.cpu());
    gpu_.Col2Im(0, dtype, g, grad_columns.gpu(), grad_image.gpu());
    ExpectBitwiseEqual(grad_image.Cpu(), grad_image.Gpu(),
                       Note(DTypePrefix<T>() + "col2im " + Describe(g)));
  }
}

TEST_F(CudaBackendTest, Im2ColAndCol2Im) {
  ExpectIm2ColAndCol2ImMatch<float>();
  ExpectIm2ColAndCol2ImMatch<double>();
}

template <typename T>
void CudaBackendTest::ExpectMaxPoolMatches() {
  const DType dtype = DTypeOf<T>::value;
  for (const Conv2dGeometry& g : kGeometries) {
    if (2 * g.pad_h > g.kernel_h || 2 * g.pad_w > g.kernel_w) continue;
    const int64_t input_size = g.batch * g.channels * g.height * g.width;
    const int64_t output_size = g.batch * g.channels * g.out_h() * g.out_w();
    const std::string what = DTypePrefix<T>() + "max_pool2d " + Describe(g);
    // Few distinct values: many ties, which must resolve to the same (first) element.
    Buffer<T> input(RandomIntegers<T>(input_size, -3, 3));
    Buffer<T> output(output_size);
    Buffer<int64_t> argmax(output_size);
    cpu_.MaxPool2d(0, dtype, g, input.cpu(), output.cpu(), argmax.cpu());
    gpu_.MaxPool2d(0, dtype, g, input.gpu(), output.gpu(), argmax.gpu());
    ExpectBitwiseEqual(output.Cpu(), output.Gpu(), Note(what));
    ExpectEqual(argmax.Cpu(), argmax.Gpu(), Note(what + " argmax"));
    Buffer<T> grad_output(Random<T>(output_size));
    Buffer<T> grad_input(input_size);
    cpu_.MaxPool2dBackward(0, dtype, g, grad_output.cpu(), argmax.cpu(), grad_input.cpu());
    gpu_.MaxPool2dBackward(0, dtype, g, grad_output.gpu(), argmax.gpu(), grad_input.gpu());
    ExpectBitwiseEqual(grad_input.Cpu(), grad_input.Gpu(), Note(what + " backward"));
  }
}

TEST_F(CudaBackendTest, MaxPoolForwardAndBackward) {
  ExpectMaxPoolMatches<float>();
  ExpectMaxPoolMatches<double>();
}

// ---- Gather / scatter
// -----------------------------------------------------------------------------

template <typename T>
void CudaBackendTest::ExpectGatherAndScatterAddColumnsMatch(
    const std::vector<int64_t>& row_counts) {
  const DType dtype = DTypeOf<T>::value;
  for (int64_t rows : row_counts) {
    const int64_t cols = 17;
    Buffer<T> src(Random<T>(rows * cols));
    Buffer<int64_t> idx(RandomInts(rows, 0, cols - 1));
    Buffer<T> gathered(rows);
    cpu_.GatherColumns(0, dtype, gathered.cpu(), src.cpu(), idx.cpu(), rows, cols);
    gpu_.GatherColumns(0, dtype, gathered.gpu(), src.gpu(), idx.gpu(), rows, cols);
    ExpectBitwiseEqual(gathered.Cpu(), gathered.Gpu(),
                       Note(DTypePrefix<T>() + "gather " + std::to_string(rows)));
    Buffer<T> grad(Random<T>(rows));
    cpu_.ScatterAddColumns(0, dtype, src.cpu(), grad.cpu(), idx.cpu(), rows, cols);
    gpu_.ScatterAddColumns(0, dtype, src.gpu(), grad.gpu(), idx.gpu(), rows, cols);
    ExpectBitwiseEqual(src.Cpu(), src.Gpu(),
                       Note(DTypePrefix<T>() + "scatter-add " + std::to_string(rows)));
  }
}

TEST_F(CudaBackendTest, GatherAndScatterAddColumns) {
  ExpectGatherAndScatterAddColumnsMatch<float>({0, 1, 1000, 70001});
  ExpectGatherAndScatterAddColumnsMatch<double>({0, 1, 1001});
}

// ---- Random numbers
// -------------------------------------------------------------------------------

TEST_F(CudaBackendTest, RandomUniformIsBitwiseTheCpus) {
  const uint64_t seed = rng_();
  for (int64_t n : {0, 1, 5, 1000003}) {
    for (uint64_t offset : {0, 1, 2, 3, 7, 1 << 20}) {
      for (auto [low, high] : {std::pair<float, float>{0.0f, 1.0f}, {-3.0f, 5.0f}}) {
        Buffer<float> dst(n);
        cpu_.RandomUniform(0, kFloat32, dst.cpu(), n, seed, offset, low, high);
        gpu_.RandomUniform(0, kFloat32, dst.gpu(), n, seed, offset, low, high);
        ExpectBitwiseEqual(
            dst.Cpu(), dst.Gpu(),
            Note("uniform n=" + std::to_string(n) + " offset=" + std::to_string(offset)));
      }
    }
  }
}

TEST_F(CudaBackendTest, RandomNormalMatchesTheCpuToAFewUlps) {
  const uint64_t seed = rng_();
  for (int64_t n : {0, 1, 5, 1000003}) {
    for (uint64_t offset : {0, 1, 3}) {
      Buffer<float> dst(n);
      cpu_.RandomNormal(0, kFloat32, dst.cpu(), n, seed, offset, 0.5f, 2.0f);
      gpu_.RandomNormal(0, kFloat32, dst.gpu(), n, seed, offset, 0.5f, 2.0f);
      ExpectNear(dst.Cpu(), dst.Gpu(), 2e-6, 2e-6,
                 Note("normal n=" + std::to_string(n) + " offset=" + std::to_string(offset)));
    }
  }
}

// ---- float64 only ---------------------------------------------------------------------------
// The checks float64 has and float32 does not (the shared ones run both dtypes above).
// Kernels whose arithmetic is the same expression on both devices must agree bitwise.

class CudaBackendFloat64Test : public CudaBackendTest {};

TEST_F(CudaBackendFloat64Test, CopyConvertsBetweenEveryPairOfDTypes) {
  const int64_t rows = 37, cols = 129, n = rows * cols;
  // Values with more precision than float32 and a range past int32, so that every
  // conversion rounds or truncates somewhere.
  Buffer<double> doubles(Random<double>(n, -3e9, 3e9));
  Buffer<float> floats(n);
  Buffer<int64_t> ints(n);
  cpu_.Copy(0, floats.CpuView({n}), doubles.CpuView({n}));
  gpu_.Copy(0, floats.GpuView({n}), doubles.GpuView({n}));
  ExpectBitwiseEqual(floats.Cpu(), floats.Gpu(), Note("float64 -> float32"));
  cpu_.Copy(0, ints.CpuView({n}), doubles.CpuView({n}));
  gpu_.Copy(0, ints.GpuView({n}), doubles.GpuView({n}));
  ExpectEqual(ints.Cpu(), ints.Gpu(), Note("float64 -> int64"));
  // Every target from every source, contiguous and transposed (the strided path).
  for (bool transposed : {false, true}) {
    const std::vector<int64_t> shape = {rows, cols};
    const std::vector<int64_t> strides =
        transposed ? std::vector<int64_t>{1, rows} : std::vector<int64_t>{};
    const std::string how = transposed ? " (transposed)" : "";
    Buffer<double> from_float(n), from_int(n), from_double(n);
    cpu_.Copy(0, from_float.CpuView(shape, strides), floats.CpuView(shape));
    gpu_.Copy(0, from_float.GpuView(shape, strides), floats.GpuView(shape));
    ExpectBitwiseEqual(from_float.Cpu(), from_float.Gpu(), Note("float32 -> float64" + how));
    cpu_.Copy(0, from_int.CpuView(shape, strides), ints.CpuView(shape));
    gpu_.Copy(0, from_int.GpuView(shape, strides), ints.GpuView(shape));
    ExpectBitwiseEqual(from_int.Cpu(), from_int.Gpu(), Note("int64 -> float64" + how));
    cpu_.Copy(0, from_double.CpuView(shape, strides), doubles.CpuView(shape));
    gpu_.Copy(0, from_double.GpuView(shape, strides), doubles.GpuView(shape));
    ExpectBitwiseEqual(from_double.Cpu(), from_double.Gpu(), Note("float64 -> float64" + how));
    Buffer<float> to_float(n);
    Buffer<int64_t> to_int(n);
    cpu_.Copy(0, to_float.CpuView(shape, strides), doubles.CpuView(shape));
    gpu_.Copy(0, to_float.GpuView(shape, strides), doubles.GpuView(shape));
    ExpectBitwiseEqual(to_float.Cpu(), to_float.Gpu(), Note("float64 -> float32" + how));
    cpu_.Copy(0, to_int.CpuView(shape, strides), doubles.CpuView(shape));
    gpu_.Copy(0, to_int.GpuView(shape, strides), doubles.GpuView(shape));
    ExpectEqual(to_int.Cpu(), to_int.Gpu(), Note("float64 -> int64" + how));
  }
  for (double value : {0.0, -0.0, 0.1, -1e300}) {
    Buffer<double> filled(n + 1);
    cpu_.Fill(0, filled.CpuView({n}, {}, 1), value);
    gpu_.Fill(0, filled.GpuView({n}, {}, 1), value);
    ExpectBitwiseEqual(filled.Cpu(), filled.Gpu(), Note("float64 fill"));
  }
}

TEST_F(CudaBackendFloat64Test, GemmIgnoresTheTf32Switch) {
  const int64_t m = 31, n = 29, k = 257;
  Buffer<double> a(Random<double>(m * k, -1.0, 1.0));
  Buffer<double> b(Random<double>(k * n, -1.0, 1.0));
  Buffer<double> c(m * n);
  ASSERT_FALSE(cuda::AllowTf32());
  gpu_.Gemm(0, kFloat64, false, false, m, n, k, 1.0, a.gpu(), k, 0, b.gpu(), n, 0, 0.0, c.gpu(), n,
            0, 1);
  const std::vector<double> full = c.Gpu();
  cuda::SetAllowTf32(true);
  gpu_.Gemm(0, kFloat64, false, false, m, n, k, 1.0, a.gpu(), k, 0, b.gpu(), n, 0, 0.0, c.gpu(), n,
            0, 1);
  cuda::SetAllowTf32(false);
  ExpectBitwiseEqual(full, c.Gpu(), Note("float64 gemm with TF32 allowed"));
}

TEST_F(CudaBackendFloat64Test, AvgPoolAndAdaptiveAvgPool) {
  for (const Conv2dGeometry& g : kGeometries) {
    if (2 * g.pad_h > g.kernel_h || 2 * g.pad_w > g.kernel_w) continue;
    const int64_t image_size = g.batch * g.channels * g.height * g.width;
    const int64_t output_size = g.batch * g.channels * g.out_h() * g.out_w();
    Buffer<double> image(Random<double>(image_size));
    Buffer<double> grad_output(Random<double>(output_size));

    for (bool count_include_pad : {false, true}) {
      const std::string how = count_include_pad ? " counting padding" : "";
      Buffer<double> averaged(output_size);
      cpu_.AvgPool2d(0, kFloat64, g, count_include_pad, image.cpu(), averaged.cpu());
      gpu_.AvgPool2d(0, kFloat64, g, count_include_pad, image.gpu(), averaged.gpu());
      ExpectBitwiseEqual(averaged.Cpu(), averaged.Gpu(),
                         Note("float64 avg_pool2d " + Describe(g) + how));
      Buffer<double> avg_grad(image_size);
      cpu_.AvgPool2dBackward(0, kFloat64, g, count_include_pad, grad_output.cpu(), avg_grad.cpu());
      gpu_.AvgPool2dBackward(0, kFloat64, g, count_include_pad, grad_output.gpu(), avg_grad.gpu());
      ExpectBitwiseEqual(avg_grad.Cpu(), avg_grad.Gpu(),
                         Note("float64 avg_pool2d backward " + Describe(g) + how));
    }
  }
  // Adaptive pooling, windows that overlap (7 -> 3) and that do not (8 -> 4), and upsampling.
  for (auto [in, out] : {std::pair<int64_t, int64_t>{7, 3}, {8, 4}, {3, 5}}) {
    const int64_t planes = 6;
    Buffer<double> input(Random<double>(planes * in * in));
    Buffer<double> output(planes * out * out);
    cpu_.AdaptiveAvgPool2d(0, kFloat64, planes, in, in, out, out, input.cpu(), output.cpu());
    gpu_.AdaptiveAvgPool2d(0, kFloat64, planes, in, in, out, out, input.gpu(), output.gpu());
    const std::string what = std::to_string(in) + " -> " + std::to_string(out);
    ExpectBitwiseEqual(output.Cpu(), output.Gpu(), Note("float64 adaptive_avg_pool2d " + what));
    Buffer<double> grad_output(Random<double>(planes * out * out));
    Buffer<double> grad_input(planes * in * in);
    cpu_.AdaptiveAvgPool2dBackward(0, kFloat64, planes, in, in, out, out, grad_output.cpu(),
                                   grad_input.cpu());
    gpu_.AdaptiveAvgPool2dBackward(0, kFloat64, planes, in, in, out, out, grad_output.gpu(),
                                   grad_input.gpu());
    ExpectBitwiseEqual(grad_input.Cpu(), grad_input.Gpu(),
                       Note("float64 adaptive_avg_pool2d backward " + what));
  }
}

TEST_F(CudaBackendFloat64Test, GatherAndScatterAdd) {
  // torch.gather over the middle axis with repeated indices (they accumulate on scatter).
  const int64_t outer = 3, src_dim = 5, idx_dim = 7, inner = 11;
  Buffer<double> src(Random<double>(outer * src_dim * inner));
  Buffer<int64_t> idx(RandomInts(outer * idx_dim * inner, 0, src_dim - 1));
  Buffer<double> gathered(outer * idx_dim * inner);
  cpu_.Gather(0, kFloat64, gathered.cpu(), src.cpu(), idx.cpu(), outer, src_dim, idx_dim, inner);
  gpu_.Gather(0, kFloat64, gathered.gpu(), src.gpu(), idx.gpu(), outer, src_dim, idx_dim, inner);
  ExpectBitwiseEqual(gathered.Cpu(), gathered.Gpu(), Note("float64 gather"));
  Buffer<double> grad(Random<double>(outer * idx_dim * inner));
  cpu_.ScatterAdd(0, kFloat64, src.cpu(), grad.cpu(), idx.cpu(), outer, src_dim, idx_dim, inner);
  gpu_.ScatterAdd(0, kFloat64, src.gpu(), grad.gpu(), idx.gpu(), outer, src_dim, idx_dim, inner);
  ExpectBitwiseEqual(src.Cpu(), src.Gpu(), Note("float64 scatter-add"));
}

// Note [Random float64]: the float32 numbers, widened.
TEST_F(CudaBackendFloat64Test, RandomNumbersAreTheFloat32OnesWidened) {
  const uint64_t seed = rng_();
  for (int64_t n : {0, 1, 5, 10007}) {
    for (uint64_t offset : {0, 1, 3}) {
      const std::string what = " n=" + std::to_string(n) + " offset=" + std::to_string(offset);
      Buffer<float> narrow(n);
      Buffer<double> wide(n);
      gpu_.RandomUniform(0, kFloat32, narrow.gpu(), n, seed, offset, -3.0, 5.0);
      gpu_.RandomUniform(0, kFloat64, wide.gpu(), n, seed, offset, -3.0, 5.0);
      cpu_.RandomUniform(0, kFloat64, wide.cpu(), n, seed, offset, -3.0, 5.0);
      const std::vector<float> narrow_values = narrow.Gpu();
      const std::vector<double> widened(narrow_values.begin(), narrow_values.end());
      ExpectBitwiseEqual(widened, wide.Gpu(), Note("float64 uniform vs float32" + what));
      ExpectBitwiseEqual(wide.Cpu(), wide.Gpu(), Note("float64 uniform vs the cpu" + what));

      gpu_.RandomNormal(0, kFloat32, narrow.gpu(), n, seed, offset, 0.5, 2.0);
      gpu_.RandomNormal(0, kFloat64, wide.gpu(), n, seed, offset, 0.5, 2.0);
      cpu_.RandomNormal(0, kFloat64, wide.cpu(), n, seed, offset, 0.5, 2.0);
      const std::vector<float> normal_values = narrow.Gpu();
      const std::vector<double> widened_normal(normal_values.begin(), normal_values.end());
      ExpectBitwiseEqual(widened_normal, wide.Gpu(), Note("float64 normal vs float32" + what));
      // logf/cosf of CUDA and glibc differ in the last bits of the float32 result.
      ExpectNear(wide.Cpu(), wide.Gpu(), 2e-6, 2e-6, Note("float64 normal vs the cpu" + what));
    }
  }
}

// ---- Fused optimizer updates ---------------------------------------------------------------
// Note [Fused optimizer updates]: both backends run the same element functions
// (optimizer_math.h) in the same order, and optimizer_kernels.cu is compiled without FMA
// contraction, so the GPU must give the CPU's bits for every flag combination the backends
// pick an instantiation for, in float32 and float64.

// One row of the matrix of flags: the hyper-parameters and which states the update has
// (bit s: state s); FusedUpdate's numel and pointers are filled in per tensor.
struct OptimizerCase {
  std::string name;
  FusedUpdate update;
  unsigned states = 0;
};

std::vector<OptimizerCase> AllOptimizerCases() {
  std::vector<OptimizerCase> cases;
  for (double decay : {0.0, 1e-2}) {
    const std::string suffix = decay != 0.0 ? " with weight decay" : "";
    OptimizerCase plain{"sgd" + suffix, {}, 0};
    plain.update.lr = 0.1;
    plain.update.weight_decay = decay;
    cases.push_back(plain);
    // Nesterov and the first step mean nothing without a buffer: both backends must ignore them.
    plain.name += " (nesterov and first set, no buffer)";
    plain.update.nesterov = plain.update.first = true;
    cases.push_back(plain);
    for (bool nesterov : {false, true}) {
      for (bool first : {false, true}) {
        OptimizerCase c{"sgd momentum" + std::string(nesterov ? " nesterov" : "") +
                            (first ? " first step" : "") + suffix,
                        {},
                        1};
        c.update.lr = 0.05;
        c.update.momentum = 0.9;
        c.update.dampening = 0.1;
        c.update.weight_decay = decay;
        c.update.nesterov = nesterov;
        c.update.first = first;
        cases.push_back(c);
      }
    }
  }
  for (int variant = 0; variant < 3; ++variant) {  // Adam, Adam with L2, AdamW
    const double lr = 1e-3, step = 3;
    OptimizerCase c{variant == 0 ? "adam" : variant == 1 ? "adam l2" : "adamw", {}, 3};
    c.update.kind = OptimizerKind::kAdam;
    c.update.beta1 = 0.9;
    c.update.beta2 = 0.999;
    c.update.eps = 1e-8;
    c.update.step_size = lr / (1 - std::pow(0.9, step));
    c.update.inv_bc2_sqrt = 1 / std::sqrt(1 - std::pow(0.999, step));
    c.update.weight_decay = variant == 1 ? 1e-2 : 0.0;
    c.update.l2 = variant == 1;
    c.update.decay_factor = variant == 2 ? 1 - lr * 1e-2 : 1.0;
    cases.push_back(c);
  }
  for (bool momentum : {false, true}) {
    for (bool centered : {false, true}) {
      OptimizerCase c{
          "rmsprop" + std::string(momentum ? " momentum" : "") + (centered ? " centered" : ""),
          {},
          1u | (momentum ? 2u : 0u) | (centered ? 4u : 0u)};
      c.update.kind = OptimizerKind::kRmsprop;
      c.update.lr = 1e-2;
      c.update.alpha = 0.99;
      c.update.eps = 1e-8;
      c.update.momentum = momentum ? 0.9 : 0.0;
      c.update.weight_decay = momentum && centered ? 1e-2 : 0.0;
      cases.push_back(c);
    }
  }
  return cases;
}

// Each state's starting values: Adam's exp_avg_sq and RMSprop's square_avg are non-negative,
// and RMSprop's square_avg exceeds grad_avg squared, as an optimizer's would, so that the
// square roots are of numbers (NaN would match NaN and hide a difference).
std::pair<double, double> StateRange(OptimizerKind kind, int state) {
  if (kind == OptimizerKind::kAdam && state == 1) return {0.0, 1.0};
  if (kind == OptimizerKind::kRmsprop && state == 0) return {0.5, 1.5};
  if (kind == OptimizerKind::kRmsprop && state == 2) return {-0.5, 0.5};
  return {-1.0, 1.0};
}

// One FusedOptimizerUpdate on each device: tensor k is items[k]'s case on items[k].second
// elements, from the same random param, grad and states (an empty tensor has null pointers).
// Every param and state buffer must then be bitwise the CPU's.
template <typename T>
void CudaBackendTest::ExpectFusedUpdatesMatch(
    const std::vector<std::pair<const OptimizerCase*, int64_t>>& items, const std::string& what) {
  struct Tensors {
    std::unique_ptr<Buffer<T>> param, grad, states[3];
  };
  std::vector<Tensors> tensors(items.size());
  std::vector<FusedUpdate> on_cpu, on_gpu;
  for (size_t k = 0; k < items.size(); ++k) {
    const OptimizerCase& c = *items[k].first;
    const int64_t n = items[k].second;
    FusedUpdate cpu_update = c.update, gpu_update = c.update;
    cpu_update.numel = gpu_update.numel = n;
    if (n > 0) {
      Tensors& t = tensors[k];
      t.param = std::make_unique<Buffer<T>>(Random<T>(n, -2.0, 2.0));
      t.grad = std::make_unique<Buffer<T>>(Random<T>(n, -2.0, 2.0));
      cpu_update.param = t.param->cpu();
      gpu_update.param = t.param->gpu();
      cpu_update.grad = t.grad->cpu();
      gpu_update.grad = t.grad->gpu();
      void** cpu_states[3] = {&cpu_update.state0, &cpu_update.state1, &cpu_update.state2};
      void** gpu_states[3] = {&gpu_update.state0, &gpu_update.state1, &gpu_update.state2};
      for (int s = 0; s < 3; ++s) {
        if ((c.states >> s & 1) == 0) continue;
        const auto [low, high] = StateRange(c.update.kind, s);
        t.states[s] = std::make_unique<Buffer<T>>(Random<T>(n, low, high));
        *cpu_states[s] = t.states[s]->cpu();
        *gpu_states[s] = t.states[s]->gpu();
      }
    }
    on_cpu.push_back(cpu_update);
    on_gpu.push_back(gpu_update);
  }
  const DType dtype = DTypeOf<T>::value;
  cpu_.FusedOptimizerUpdate(0, dtype, on_cpu);
  gpu_.FusedOptimizerUpdate(0, dtype, on_gpu);
  for (size_t k = 0; k < items.size(); ++k) {
    if (items[k].second == 0) continue;
    const std::string tensor = what + ", " + items[k].first->name + " on " +
                               std::to_string(items[k].second) + " elements: ";
    const Tensors& t = tensors[k];
    ExpectBitwiseEqual(t.param->Cpu(), t.param->Gpu(), Note(tensor + "param"));
    for (int s = 0; s < 3; ++s) {
      if (t.states[s] == nullptr) continue;
      ExpectBitwiseEqual(t.states[s]->Cpu(), t.states[s]->Gpu(),
                         Note(tensor + "state" + std::to_string(s)));
    }
  }
}

// Each case alone on tensors of several sizes (one past 65536, several not multiples of the
// block, an empty one), then every case in one call, as an optimizer with mixed groups would.
template <typename T>
void CudaBackendTest::ExpectEveryOptimizerCaseMatches() {
  const std::string dtype = DTypeName(DTypeOf<T>::value);
  const std::vector<OptimizerCase> cases = AllOptimizerCases();
  const int64_t sizes[] = {1, 255, 0, 1000, 70001};
  for (const OptimizerCase& c : cases) {
    std::vector<std::pair<const OptimizerCase*, int64_t>> items;
    for (int64_t n : sizes) items.emplace_back(&c, n);
    ExpectFusedUpdatesMatch<T>(items, dtype);
  }
  std::vector<std::pair<const OptimizerCase*, int64_t>> mixed;
  for (size_t k = 0; k < cases.size(); ++k) mixed.emplace_back(&cases[k], 17 + 301 * k);
  ExpectFusedUpdatesMatch<T>(mixed, dtype + " mixed call");
}

TEST_F(CudaBackendTest, FusedOptimizerUpdatesAreBitwiseTheCpus) {
  ExpectEveryOptimizerCaseMatches<float>();
  ExpectEveryOptimizerCaseMatches<double>();
}

TEST_F(CudaBackendTest, FusedOptimizerUpdateEdgeCases) {
  gpu_.FusedOptimizerUpdate(0, kFloat32, {});  // nothing to do
  FusedUpdate empty;                           // numel 0, no tensors: also nothing
  empty.kind = OptimizerKind::kAdam;
  gpu_.FusedOptimizerUpdate(0, kFloat64, {empty});
  // Another dtype throws, naming the kernel, even with nothing to update (as on the CPU).
  for (const std::vector<FusedUpdate>& updates :
       {std::vector<FusedUpdate>{}, std::vector<FusedUpdate>{empty}}) {
    try {
      gpu_.FusedOptimizerUpdate(0, kInt64, updates);
      FAIL() << "int64 must throw";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("CUDA FusedOptimizerUpdate"), std::string::npos)
          << error.what();
    }
  }
  // A missing state is an error on the host, not a fault on the GPU.
  Buffer<float> p(Random<float>(8, -1, 1)), g(Random<float>(8, -1, 1)), m(Random<float>(8, -1, 1));
  FusedUpdate adam;
  adam.kind = OptimizerKind::kAdam;
  adam.numel = 8;
  adam.param = p.gpu();
  adam.grad = g.gpu();
  adam.state0 = m.gpu();
  try {
    gpu_.FusedOptimizerUpdate(0, kFloat32, {adam});
    FAIL() << "Adam without exp_avg_sq must throw";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("exp_avg_sq"), std::string::npos) << error.what();
  }
  EXPECT_EQ(p.Gpu(), p.Cpu());  // nothing ran
}

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

// Transcendental ops, whose float results CUDA and glibc may round differently.
bool IsTranscendentalOp(UnaryOp op) {
  return op == UnaryOp::kExp || op == UnaryOp::kLog || op == UnaryOp::kTanh ||
         op == UnaryOp::kSigmoid || op == UnaryOp::kPowScalar || op == UnaryOp::kGelu ||
         op == UnaryOp::kGeluDerivative || op == UnaryOp::kSqrt || op == UnaryOp::kGeluTanh ||
         op == UnaryOp::kGeluTanhDerivative || op == UnaryOp::kSilu;
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
  void ExpectReductionsAndSoftmaxMatch();
  template <typename T>
  void ExpectGemmMatches16();
  template <typename T>
  void ExpectGemmFloatOutputMatches();
  template <typename T>
  void ExpectConvolutionAndPoolingMatch();
  template <typename T>
  void ExpectGathersScattersAndRandomMatch();
  template <typename T>
  void ExpectFusedUpdatesMatch16();
};

template <typename T>
void CudaBackendReducedTest::ExpectElementwiseMatches() {
  const std::string dtype = DTypePrefix<T>();
  for (UnaryOp op : kAllUnary) {
    const bool positive_only =
        op == UnaryOp::kLog || op == UnaryOp::kSqrt || op == UnaryOp::kPowScalar;
    const double rtol = IsTranscendentalOp(op) ? Ulp<T>() : 0.0;
    for (int64_t n : {0, 1, 7, 1029}) {
      const std::string what = Note(dtype + "unary op " + std::to_string(static_cast<int>(op)) +
                                    " on " + std::to_string(n) + " elements");
      Buffer<T> src(positive_only ? RandomReduced<T>(n, 0.01, 5.0) : RandomReduced<T>(n));
      Buffer<float> wide = Wide(src);
      // Contiguous, then a transposed view into a transposed view (the strided path).
      for (bool strided : {false, true}) {
        const int64_t rows = strided ? n / 7 : n, cols = strided ? 7 : 1;
        const std::vector<int64_t> sizes = {cols, rows};
        const std::vector<int64_t> strides = {1, cols};
        Buffer<float> expected(n);
        Buffer<T> dst(n);
        cpu_.Unary(0, op, expected.CpuView(sizes, strides), wide.CpuView(sizes, strides), 1.5);
        gpu_.Unary(0, op, dst.GpuView(sizes, strides), src.GpuView(sizes, strides), 1.5);
        const std::vector<T> rounded = Rounded<T>(expected.Cpu());
        if (rtol == 0.0) {
          ExpectBitwiseEqual(rounded, dst.Gpu(), what);
        } else {
          ExpectNear(rounded, dst.Gpu(), rtol, 1e-30, what);
        }
      }
    }
  }
  // Every binary op with each broadcast of b; comparisons also into a bool output.
  const int64_t rows = 33, cols = 65, n = rows * cols;
  for (BinaryOp op : kAllBinary) {
    for (const Broadcast& broadcast : kBroadcasts) {
      const std::string what = Note(dtype + "binary op " + std::to_string(static_cast<int>(op)) +
                                    ", " + broadcast.name + " b");
      Buffer<T> a(Rounded<T>(Widened(RandomIntegers<float>(n, -4, 4))));
      Buffer<T> b(op == BinaryOp::kDiv ? RandomReduced<T>(n, 0.5, 3.0)
                                       : Rounded<T>(Widened(RandomIntegers<float>(n, -4, 4))));
      // Non-integers too, so that sums and products round.
      if (op != BinaryOp::kDiv) a.Set(RandomReduced<T>(n, -4.0, 4.0));
      Buffer<float> wide_a = Wide(a), wide_b = Wide(b);
      const std::vector<int64_t> shape = {rows, cols};
      const std::vector<int64_t> b_strides = {broadcast.column ? 0 : cols, broadcast.row ? 0 : 1};
      Buffer<float> expected(n);
      Buffer<T> dst(n);
      cpu_.Binary(0, op, expected.CpuView(shape), wide_a.CpuView(shape),
                  wide_b.CpuView(shape, b_strides));
      gpu_.Binary(0, op, dst.GpuView(shape), a.GpuView(shape), b.GpuView(shape, b_strides));
      if (IsTranscendentalOp(op)) {
        ExpectNear(Rounded<T>(expected.Cpu()), dst.Gpu(), Ulp<T>(), 1e-30, what);
      } else {
        ExpectBitwiseEqual(Rounded<T>(expected.Cpu()), dst.Gpu(), what);
      }
      if (op >= BinaryOp::kEq && op <= BinaryOp::kGe) {
        Buffer<uint8_t> mask(n, kBool), expected_mask(n, kBool);
        cpu_.Copy(0, expected_mask.CpuView(shape), expected.CpuView(shape));
        gpu_.Binary(0, op, mask.GpuView(shape), a.GpuView(shape), b.GpuView(shape, b_strides));
        ExpectBitwiseEqual(expected_mask.Cpu(), mask.Gpu(), what + " into bool");
      }
    }
  }
}

template <typename T>
void CudaBackendReducedTest::ExpectReductionsAndSoftmaxMatch() {
  const std::string dtype = DTypePrefix<T>();
  const ReduceShape shapes[] = {{1, 1, 1},     {64, 10, 1},  {7, 1000, 1}, {5, 7, 33},
                                {1, 30001, 1}, {3, 5000, 5}, {1, 1, 1003}, {0, 5, 3}};
  for (ReduceKind op : {ReduceKind::kSum, ReduceKind::kMax, ReduceKind::kMin, ReduceKind::kArgMax,
                        ReduceKind::kArgMin}) {
    const bool arg = op == ReduceKind::kArgMax || op == ReduceKind::kArgMin;
    for (const ReduceShape& s : shapes) {
      const std::string what =
          Note(dtype + "reduce op " + std::to_string(static_cast<int>(op)) + " over [" +
               std::to_string(s.outer) + ", " + std::to_string(s.reduce) + ", " +
               std::to_string(s.inner) + "]");
      const int64_t n = s.outer * s.reduce * s.inner, outputs = s.outer * s.inner;
      Buffer<T> src(op == ReduceKind::kSum
                        ? RandomReduced<T>(n)
                        : Rounded<T>(Widened(RandomIntegers<float>(n, -20, 20))));
      Buffer<float> wide = Wide(src);
      const std::vector<int64_t> in_shape = {s.outer, s.reduce, s.inner};
      const std::vector<int64_t> out_shape = {s.outer, s.inner};
      if (arg) {
        Buffer<int64_t> dst(outputs);
        cpu_.Reduce(0, op, dst.CpuView(out_shape), wide.CpuView(in_shape), s.outer, s.reduce,
                    s.inner);
        gpu_.Reduce(0, op, dst.GpuView(out_shape), src.GpuView(in_shape), s.outer, s.reduce,
                    s.inner);
        ExpectEqual(dst.Cpu(), dst.Gpu(), what);
        continue;
      }
      Buffer<float> expected(outputs);
      Buffer<T> dst(outputs);
      cpu_.Reduce(0, op, expected.CpuView(out_shape), wide.CpuView(in_shape), s.outer, s.reduce,
                  s.inner);
      gpu_.Reduce(0, op, dst.GpuView(out_shape), src.GpuView(in_shape), s.outer, s.reduce, s.inner);
      if (op == ReduceKind::kSum) {
        // Float accumulation in another order than the CPU's double one: float rounding
        // (relative 6e-8 per addition) of terms up to 2, then one rounding to T either way.
        ExpectNear(Rounded<T>(expected.Cpu()), dst.Gpu(), Ulp<T>(),
                   2e-7 * static_cast<double>(s.reduce), what);
      } else {
        ExpectBitwiseEqual(Rounded<T>(expected.Cpu()), dst.Gpu(), what);
      }
    }
  }
  // Softmax and log_softmax over rows and columns, summing in double on both devices.
  for (bool log : {false, true}) {
    for (const ReduceShape& s : {ReduceShape{257, 10, 1}, ReduceShape{3, 2000, 1},
                                 ReduceShape{4, 7, 9}, ReduceShape{2, 100, 65}}) {
      const std::string what =
          Note(dtype + (log ? "log_softmax" : "softmax") + " over [" + std::to_string(s.outer) +
               ", " + std::to_string(s.reduce) + ", " + std::to_string(s.inner) + "]");
      const int64_t n = s.outer * s.reduce * s.inner;
      Buffer<T> src(RandomReduced<T>(n, -10.0, 10.0));
      Buffer<float> wide = Wide(src), expected(n);
      Buffer<T> dst(n);
      cpu_.Softmax(0, kFloat32, log, expected.cpu(), wide.cpu(), s.outer, s.reduce, s.inner);
      gpu_.Softmax(0, DTypeOf<T>::value, log, dst.gpu(), src.gpu(), s.outer, s.reduce, s.inner);
      ExpectNear(Rounded<T>(expected.Cpu()), dst.Gpu(), Ulp<T>(), 1e-5, what);
    }
  }
}

// GemmEx against the CPU's SGEMM of the widened operands, rounded: both multiply exactly and
// add in float, in different orders (Note [cudasim GemmEx] in tools/cudasim/cublas.cc), so
// they agree to one unit of T plus float rounding growing like sqrt(k).
template <typename T>
void CudaBackendReducedTest::ExpectGemmMatches16() {
  const DType dtype = DTypeOf<T>::value;
  for (const GemmCase& g : {GemmCase{1, 1, 1, 1}, GemmCase{7, 5, 3, 1}, GemmCase{33, 17, 65, 3},
                            GemmCase{64, 48, 256, 1}, GemmCase{5, 6, 0, 2}}) {
    for (bool trans_a : {false, true}) {
      for (bool trans_b : {false, true}) {
        const int64_t lda = (trans_a ? g.m : g.k) + 3, ldb = (trans_b ? g.k : g.n) + 1,
                      ldc = g.n + 2;
        const int64_t a_rows = trans_a ? g.k : g.m, b_rows = trans_b ? g.n : g.k;
        const int64_t stride_a = a_rows * lda, stride_b = b_rows * ldb, stride_c = g.m * ldc;
        Buffer<T> a(RandomReduced<T>(g.batch * stride_a, -1.0, 1.0));
        Buffer<T> b(RandomReduced<T>(g.batch * stride_b, -1.0, 1.0));
        const std::vector<T> c = RandomReduced<T>(g.batch * stride_c, -1.0, 1.0);
        Buffer<float> wide_a = Wide(a), wide_b = Wide(b);
        for (double beta : {0.0, 0.5}) {
          const std::string what = Note(
              DTypePrefix<T>() + "gemm m=" + std::to_string(g.m) + " n=" + std::to_string(g.n) +
              " k=" + std::to_string(g.k) + " batch=" + std::to_string(g.batch) +
              (trans_a ? " A^T" : "") + (trans_b ? " B^T" : "") + " beta=" + std::to_string(beta));
          Buffer<T> out(c);
          Buffer<float> expected(Widened(c));
          cpu_.Gemm(0, kFloat32, trans_a, trans_b, g.m, g.n, g.k, 1.25, wide_a.cpu(), lda, stride_a,
                    wide_b.cpu(), ldb, stride_b, beta, expected.cpu(), ldc, stride_c, g.batch);
          gpu_.Gemm(0, dtype, trans_a, trans_b, g.m, g.n, g.k, 1.25, a.gpu(), lda, stride_a,
                    b.gpu(), ldb, stride_b, beta, out.gpu(), ldc, stride_c, g.batch);
          // Padding between rows of C is not written: it must stay as it was.
          ExpectNear(Rounded<T>(expected.Cpu()), out.Gpu(), Ulp<T>(),
                     Ulp<T>() * std::sqrt(static_cast<double>(g.k)), what);
        }
      }
    }
  }
}

// GemmFloatOutput (16-bit A and B, float32 C) against the CPU's SGEMM of the widened operands:
// both multiply exactly and add in float in their own orders, and neither rounds C to 16 bits,
// so they agree to float32 rounding: per element within k * FLT_EPSILON * sum |a_ip b_pj| (a
// bound on both summation errors together) plus a little. A C rounded to T would miss this by
// orders of magnitude. C starts as NaN: every element must be written, the row padding not.
template <typename T>
void CudaBackendReducedTest::ExpectGemmFloatOutputMatches() {
  const DType dtype = DTypeOf<T>::value;
  const double eps = std::numeric_limits<float>::epsilon();
  for (const GemmCase& g : {GemmCase{1, 1, 1, 1}, GemmCase{7, 5, 3, 1}, GemmCase{33, 17, 65, 1},
                            GemmCase{128, 96, 200, 1}, GemmCase{5, 6, 0, 1}}) {
    for (bool trans_a : {false, true}) {
      for (bool trans_b : {false, true}) {
        for (bool padded : {false, true}) {
          const std::string what =
              Note(DTypePrefix<T>() + "gemm float output m=" + std::to_string(g.m) +
                   " n=" + std::to_string(g.n) + " k=" + std::to_string(g.k) +
                   (trans_a ? " A^T" : "") + (trans_b ? " B^T" : "") + (padded ? " padded" : ""));
          const int64_t a_rows = trans_a ? g.k : g.m, a_cols = trans_a ? g.m : g.k;
          const int64_t b_rows = trans_b ? g.n : g.k, b_cols = trans_b ? g.k : g.n;
          const int64_t lda = std::max<int64_t>(a_cols, 1) + (padded ? 3 : 0),
                        ldb = std::max<int64_t>(b_cols, 1) + (padded ? 1 : 0),
                        ldc = g.n + (padded ? 2 : 0);
          Buffer<T> a(RandomReduced<T>(std::max<int64_t>(a_rows * lda, 1), -1.0, 1.0));
          Buffer<T> b(RandomReduced<T>(std::max<int64_t>(b_rows * ldb, 1), -1.0, 1.0));
          Buffer<float> wide_a = Wide(a), wide_b = Wide(b);
          Buffer<float> expected(g.m * ldc), out(g.m * ldc);  // both NaN
          cpu_.Gemm(0, kFloat32, trans_a, trans_b, g.m, g.n, g.k, 1.0, wide_a.cpu(), lda, 0,
                    wide_b.cpu(), ldb, 0, 0.0, expected.cpu(), ldc, 0, 1);
          ASSERT_TRUE(gpu_.GemmFloatOutput(0, dtype, trans_a, trans_b, g.m, g.n, g.k, a.gpu(), lda,
                                           dtype, b.gpu(), ldb, out.gpu(), ldc))
              << what;
          const std::vector<float> got = out.Gpu();
          int64_t mismatches = 0;
          for (int64_t i = 0; i < g.m; ++i) {
            for (int64_t j = 0; j < ldc; ++j) {
              const float e = expected.Cpu()[i * ldc + j], x = got[i * ldc + j];
              bool ok;
              double bound = 0.0;
              if (j >= g.n) {
                ok = std::isnan(x);  // padding: not written
              } else {
                double abs_sum = 0.0;  // sum over p of |A(i, p) B(p, j)|
                for (int64_t p = 0; p < g.k; ++p) {
                  const float ai = wide_a.Cpu()[trans_a ? p * lda + i : i * lda + p];
                  const float bj = wide_b.Cpu()[trans_b ? j * ldb + p : p * ldb + j];
                  abs_sum += std::fabs(static_cast<double>(ai) * bj);
                }
                // k = 0: exactly zero.
                bound = (g.k == 0 ? 0.0 : 1e-5) + 1.3e-6 * std::fabs(e) + g.k * eps * abs_sum;
                ok = std::fabs(static_cast<double>(x) - e) <= bound;
              }
              if (!ok && mismatches++ < 5) {
                ADD_FAILURE() << what << ": C(" << i << ", " << j << ") is " << x << " on cuda but "
                              << e << " on cpu (bound " << bound << ")";
              }
            }
          }
          EXPECT_EQ(mismatches, 0) << what;
        }
      }
    }
  }
  // m = 0 and n = 0: nothing to do, nothing written.
  Buffer<T> a(RandomReduced<T>(12)), b(RandomReduced<T>(12));
  Buffer<float> c(12);
  EXPECT_TRUE(gpu_.GemmFloatOutput(0, dtype, false, false, 0, 3, 4, a.gpu(), 4, dtype, b.gpu(), 3,
                                   c.gpu(), 3));
  EXPECT_TRUE(gpu_.GemmFloatOutput(0, dtype, false, false, 3, 0, 4, a.gpu(), 4, dtype, b.gpu(), 1,
                                   c.gpu(), 1));
  for (float x : c.Gpu()) EXPECT_TRUE(std::isnan(x)) << DTypePrefix<T>() << "empty C written";
  // A row stride shorter than the row: the CPU's error.
  EXPECT_THROW(gpu_.GemmFloatOutput(0, dtype, false, false, 3, 3, 4, a.gpu(), 2, dtype, b.gpu(), 3,
                                    c.gpu(), 3),
               Error);
}

template <typename T>
void CudaBackendReducedTest::ExpectConvolutionAndPoolingMatch() {
  const DType dtype = DTypeOf<T>::value;
  const std::string prefix = DTypePrefix<T>();
  for (const Conv2dGeometry& g : kGeometries) {
    const int64_t image_size = g.batch * g.channels * g.height * g.width;
    const int64_t output_size = g.batch * g.channels * g.out_h() * g.out_w();
    const int64_t columns_size =
        g.batch * g.channels * g.kernel_h * g.kernel_w * g.out_h() * g.out_w();
    const std::string where = " " + Describe(g);
    Buffer<T> image(RandomReduced<T>(image_size));
    Buffer<float> wide_image = Wide(image);
    // im2col copies; col2im sums in float in the CPU's order: both bitwise.
    Buffer<T> columns(columns_size);
    Buffer<float> expected_columns(columns_size);
    cpu_.Im2Col(0, kFloat32, g, wide_image.cpu(), expected_columns.cpu());
    gpu_.Im2Col(0, dtype, g, image.gpu(), columns.gpu());
    ExpectBitwiseEqual(Rounded<T>(expected_columns.Cpu()), columns.Gpu(),
                       Note(prefix + "im2col" + where));
    Buffer<T> grad_columns(RandomReduced<T>(columns_size));
    Buffer<float> wide_grad_columns = Wide(grad_columns);
    Buffer<T> col2im(image_size);
    Buffer<float> expected_col2im(image_size);
    cpu_.Col2Im(0, kFloat32, g, wide_grad_columns.cpu(), expected_col2im.cpu());
    gpu_.Col2Im(0, dtype, g, grad_columns.gpu(), col2im.gpu());
    ExpectBitwiseEqual(Rounded<T>(expected_col2im.Cpu()), col2im.Gpu(),
                       Note(prefix + "col2im" + where));
    // Max pooling over small integers (ties), forward and backward.
    if (2 * g.pad_h > g.kernel_h || 2 * g.pad_w > g.kernel_w) continue;
    Buffer<T> ties(Rounded<T>(Widened(RandomIntegers<float>(image_size, -3, 3))));
    Buffer<float> wide_ties = Wide(ties);
    Buffer<T> pooled(output_size);
    Buffer<float> expected_pooled(output_size);
    Buffer<int64_t> argmax(output_size);
    Buffer<int64_t> expected_argmax(output_size);
    cpu_.MaxPool2d(0, kFloat32, g, wide_ties.cpu(), expected_pooled.cpu(), expected_argmax.cpu());
    gpu_.MaxPool2d(0, dtype, g, ties.gpu(), pooled.gpu(), argmax.gpu());
    ExpectBitwiseEqual(Rounded<T>(expected_pooled.Cpu()), pooled.Gpu(),
                       Note(prefix + "max_pool2d" + where));
    ExpectEqual(expected_argmax.Cpu(), argmax.Gpu(), Note(prefix + "max_pool2d argmax" + where));
    Buffer<T> grad_output(RandomReduced<T>(output_size));
    Buffer<float> wide_grad_output = Wide(grad_output);
    Buffer<T> grad_input(image_size);
    Buffer<float> expected_grad_input(image_size);
    cpu_.MaxPool2dBackward(0, kFloat32, g, wide_grad_output.cpu(), expected_argmax.cpu(),
                           expected_grad_input.cpu());
    gpu_.MaxPool2dBackward(0, dtype, g, grad_output.gpu(), argmax.gpu(), grad_input.gpu());
    ExpectBitwiseEqual(Rounded<T>(expected_grad_input.Cpu()), grad_input.Gpu(),
                       Note(prefix + "max_pool2d backward" + where));
    for (bool count_include_pad : {false, true}) {
      const std::string how = count_include_pad ? " counting padding" : "";
      Buffer<T> averaged(output_size);
      Buffer<float> expected_averaged(output_size);
      cpu_.AvgPool2d(0, kFloat32, g, count_include_pad, wide_image.cpu(), expected_averaged.cpu());
      gpu_.AvgPool2d(0, dtype, g, count_include_pad, image.gpu(), averaged.gpu());
      ExpectBitwiseEqual(Rounded<T>(expected_averaged.Cpu()), averaged.Gpu(),
                         Note(prefix + "avg_pool2d" + where + how));
      Buffer<T> avg_grad(image_size);
      Buffer<float> expected_avg_grad(image_size);
      cpu_.AvgPool2dBackward(0, kFloat32, g, count_include_pad, wide_grad_output.cpu(),
                             expected_avg_grad.cpu());
      gpu_.AvgPool2dBackward(0, dtype, g, count_include_pad, grad_output.gpu(), avg_grad.gpu());
      ExpectBitwiseEqual(Rounded<T>(expected_avg_grad.Cpu()), avg_grad.Gpu(),
                         Note(prefix + "avg_pool2d backward" + where + how));
    }
  }
  for (auto [in, out] : {std::pair<int64_t, int64_t>{7, 3}, {8, 4}, {3, 5}}) {
    const int64_t planes = 6;
    const std::string what = " " + std::to_string(in) + " -> " + std::to_string(out);
    Buffer<T> input(RandomReduced<T>(planes * in * in));
    Buffer<float> wide_input = Wide(input), expected(planes * out * out);
    Buffer<T> output(planes * out * out);
    cpu_.AdaptiveAvgPool2d(0, kFloat32, planes, in, in, out, out, wide_input.cpu(), expected.cpu());
    gpu_.AdaptiveAvgPool2d(0, dtype, planes, in, in, out, out, input.gpu(), output.gpu());
    ExpectBitwiseEqual(Rounded<T>(expected.Cpu()), output.Gpu(),
                       Note(prefix + "adaptive_avg_pool2d" + what));
    Buffer<T> grad_output(RandomReduced<T>(planes * out * out));
    Buffer<float> wide_grad = Wide(grad_output), expected_grad(planes * in * in);
    Buffer<T> grad_input(planes * in * in);
    cpu_.AdaptiveAvgPool2dBackward(0, kFloat32, planes, in, in, out, out, wide_grad.cpu(),
                                   expected_grad.cpu());
    gpu_.AdaptiveAvgPool2dBackward(0, dtype, planes, in, in, out, out, grad_output.gpu(),
                                   grad_input.gpu());
    ExpectBitwiseEqual(Rounded<T>(expected_grad.Cpu()), grad_input.Gpu(),
                       Note(prefix + "adaptive_avg_pool2d backward" + what));
  }
}

template <typename T>
void CudaBackendReducedTest::ExpectGathersScattersAndRandomMatch() {
  const DType dtype = DTypeOf<T>::value;
  const std::string prefix = DTypePrefix<T>();
  // One column per row (cross-entropy's gather and its gradient).
  const int64_t rows = 1000, cols = 10;
  Buffer<T> matrix(RandomReduced<T>(rows * cols));
  Buffer<float> wide_matrix = Wide(matrix);
  Buffer<int64_t> columns(RandomInts(rows, 0, cols - 1));
  Buffer<T> picked(rows);
  Buffer<float> expected_picked(rows);
  cpu_.GatherColumns(0, kFloat32, expected_picked.cpu(), wide_matrix.cpu(), columns.cpu(), rows,
                     cols);
  gpu_.GatherColumns(0, dtype, picked.gpu(), matrix.gpu(), columns.gpu(), rows, cols);
  ExpectBitwiseEqual(Rounded<T>(expected_picked.Cpu()), picked.Gpu(),
                     Note(prefix + "gather columns"));
  Buffer<T> values(RandomReduced<T>(rows));
  Buffer<float> wide_values = Wide(values);
  cpu_.ScatterAddColumns(0, kFloat32, wide_matrix.cpu(), wide_values.cpu(), columns.cpu(), rows,
                         cols);
  gpu_.ScatterAddColumns(0, dtype, matrix.gpu(), values.gpu(), columns.gpu(), rows, cols);
  ExpectBitwiseEqual(Rounded<T>(wide_matrix.Cpu()), matrix.Gpu(),
                     Note(prefix + "scatter-add columns"));
  // torch.gather over the middle axis, and scatter-add with repeated indices: they add in
  // float, in index order, and round once.
  const int64_t outer = 3, src_dim = 5, idx_dim = 17, inner = 11;
  Buffer<T> src(RandomReduced<T>(outer * src_dim * inner));
  Buffer<float> wide_src = Wide(src);
  Buffer<int64_t> idx(RandomInts(outer * idx_dim * inner, 0, src_dim - 1));
  Buffer<T> gathered(outer * idx_dim * inner);
  Buffer<float> expected_gathered(outer * idx_dim * inner);
  cpu_.Gather(0, kFloat32, expected_gathered.cpu(), wide_src.cpu(), idx.cpu(), outer, src_dim,
              idx_dim, inner);
  gpu_.Gather(0, dtype, gathered.gpu(), src.gpu(), idx.gpu(), outer, src_dim, idx_dim, inner);
  ExpectBitwiseEqual(Rounded<T>(expected_gathered.Cpu()), gathered.Gpu(), Note(prefix + "gather"));
  Buffer<T> grad(RandomReduced<T>(outer * idx_dim * inner));
  Buffer<float> wide_grad = Wide(grad);
  cpu_.ScatterAdd(0, kFloat32, wide_src.cpu(), wide_grad.cpu(), idx.cpu(), outer, src_dim, idx_dim,
                  inner);
  gpu_.ScatterAdd(0, dtype, src.gpu(), grad.gpu(), idx.gpu(), outer, src_dim, idx_dim, inner);
  ExpectBitwiseEqual(Rounded<T>(wide_src.Cpu()), src.Gpu(), Note(prefix + "scatter-add"));
  // Random numbers: the float32 draws, rounded (on one device: bitwise; the CPU's normal
  // draws differ from CUDA's in the last float bits, so within one unit of T).
  const uint64_t seed = rng_();
  for (int64_t n : {0, 1, 5, 10007}) {
    for (uint64_t offset : {0, 3}) {
      const std::string what =
          prefix + "random n=" + std::to_string(n) + " offset=" + std::to_string(offset);
      Buffer<float> narrow(n);
      Buffer<T> reduced(n);
      gpu_.RandomUniform(0, kFloat32, narrow.gpu(), n, seed, offset, -3.0, 5.0);
      gpu_.RandomUniform(0, dtype, reduced.gpu(), n, seed, offset, -3.0, 5.0);
      cpu_.RandomUniform(0, kFloat32, narrow.cpu(), n, seed, offset, -3.0, 5.0);
      ExpectBitwiseEqual(Rounded<T>(narrow.Gpu()), reduced.Gpu(), Note(what + " uniform"));
      ExpectBitwiseEqual(Rounded<T>(narrow.Cpu()), reduced.Gpu(), Note(what + " uniform cpu"));
      gpu_.RandomNormal(0, kFloat32, narrow.gpu(), n, seed, offset, 0.5, 2.0);
      gpu_.RandomNormal(0, dtype, reduced.gpu(), n, seed, offset, 0.5, 2.0);
      cpu_.RandomNormal(0, kFloat32, narrow.cpu(), n, seed, offset, 0.5, 2.0);
      ExpectBitwiseEqual(Rounded<T>(narrow.Gpu()), reduced.Gpu(), Note(what + " normal"));
      ExpectNear(Rounded<T>(narrow.Cpu()), reduced.Gpu(), Ulp<T>(), 1e-5,
                 Note(what + " normal cpu"));
    }
  }
}

// Every optimizer case on 16-bit tensors against the CPU's float32 update of the widened
// tensors, each param and state rounded: bitwise (optimizer_kernels.cu has no FMA contraction).
template <typename T>
void CudaBackendReducedTest::ExpectFusedUpdatesMatch16() {
  const std::vector<OptimizerCase> cases = AllOptimizerCases();
  for (const OptimizerCase& c : cases) {
    for (int64_t n : {1, 255, 1000}) {
      std::unique_ptr<Buffer<T>> tensors[5];  // param, grad, three states
      std::unique_ptr<Buffer<float>> wide[5];
      FusedUpdate on_cpu = c.update, on_gpu = c.update;
      on_cpu.numel = on_gpu.numel = n;
      void** cpu_slots[5] = {&on_cpu.param, const_cast<void**>(&on_cpu.grad), &on_cpu.state0,
                             &on_cpu.state1, &on_cpu.state2};
      void** gpu_slots[5] = {&on_gpu.param, const_cast<void**>(&on_gpu.grad), &on_gpu.state0,
                             &on_gpu.state1, &on_gpu.state2};
      for (int s = 0; s < 5; ++s) {
        if (s >= 2 && (c.states >> (s - 2) & 1) == 0) continue;
        const auto [low, high] =
            s >= 2 ? StateRange(c.update.kind, s - 2) : std::pair<double, double>{-2.0, 2.0};
        tensors[s] = std::make_unique<Buffer<T>>(RandomReduced<T>(n, low, high));
        wide[s] = std::make_unique<Buffer<float>>(Widened(tensors[s]->Cpu()));
        *cpu_slots[s] = wide[s]->cpu();
        *gpu_slots[s] = tensors[s]->gpu();
      }
      cpu_.FusedOptimizerUpdate(0, kFloat32, {on_cpu});
      gpu_.FusedOptimizerUpdate(0, DTypeOf<T>::value, {on_gpu});
      for (int s = 0; s < 5; ++s) {
        if (tensors[s] == nullptr || s == 1) continue;
        ExpectBitwiseEqual(Rounded<T>(wide[s]->Cpu()), tensors[s]->Gpu(),
                           Note(DTypePrefix<T>() + c.name + " on " + std::to_string(n) +
                                " elements: tensor " + std::to_string(s)));
      }
    }
  }
}

TEST_F(CudaBackendReducedTest, ElementwiseBFloat16) { ExpectElementwiseMatches<BFloat16>(); }
TEST_F(CudaBackendReducedTest, ElementwiseFloat16) { ExpectElementwiseMatches<Half>(); }
TEST_F(CudaBackendReducedTest, ReductionsAndSoftmaxBFloat16) {
  ExpectReductionsAndSoftmaxMatch<BFloat16>();
}
TEST_F(CudaBackendReducedTest, ReductionsAndSoftmaxFloat16) {
  ExpectReductionsAndSoftmaxMatch<Half>();
}
TEST_F(CudaBackendReducedTest, GemmExBFloat16) { ExpectGemmMatches16<BFloat16>(); }
TEST_F(CudaBackendReducedTest, GemmExFloat16) { ExpectGemmMatches16<Half>(); }
TEST_F(CudaBackendReducedTest, GemmFloatOutputBFloat16) {
  ExpectGemmFloatOutputMatches<BFloat16>();
}
TEST_F(CudaBackendReducedTest, GemmFloatOutputFloat16) { ExpectGemmFloatOutputMatches<Half>(); }
// Only 16-bit operands have a float32-output GEMM: other dtypes report false and write nothing,
// so the caller takes its fallback.
TEST_F(CudaBackendReducedTest, GemmFloatOutputDeclinesOtherDTypes) {
  Buffer<float> a(std::vector<float>{1.0f, 2.0f}), b(std::vector<float>{3.0f, 4.0f});
  Buffer<float> c(1);
  EXPECT_FALSE(gpu_.GemmFloatOutput(0, kFloat32, false, false, 1, 1, 2, a.gpu(), 2, kFloat32,
                                    b.gpu(), 1, c.gpu(), 1));
  Buffer<double> ad(std::vector<double>{1.0, 2.0}), bd(std::vector<double>{3.0, 4.0});
  EXPECT_FALSE(gpu_.GemmFloatOutput(0, kFloat64, false, false, 1, 1, 2, ad.gpu(), 2, kFloat64,
                                    bd.gpu(), 1, c.gpu(), 1));
  // A float32 B under 16-bit A is the caller's to cast on a GPU.
  Buffer<BFloat16> a16(RandomReduced<BFloat16>(2, -1.0, 1.0));
  EXPECT_FALSE(gpu_.GemmFloatOutput(0, kBFloat16, false, false, 1, 1, 2, a16.gpu(), 2, kFloat32,
                                    b.gpu(), 1, c.gpu(), 1));
  EXPECT_TRUE(std::isnan(c.Gpu()[0])) << "a declined GemmFloatOutput wrote C";
}
TEST_F(CudaBackendReducedTest, ConvolutionAndPoolingBFloat16) {
  ExpectConvolutionAndPoolingMatch<BFloat16>();
}
TEST_F(CudaBackendReducedTest, ConvolutionAndPoolingFloat16) {
  ExpectConvolutionAndPoolingMatch<Half>();
}
TEST_F(CudaBackendReducedTest, GathersScattersAndRandomBFloat16) {
  ExpectGathersScattersAndRandomMatch<BFloat16>();
}
TEST_F(CudaBackendReducedTest, GathersScattersAndRandomFloat16) {
  ExpectGathersScattersAndRandomMatch<Half>();
}
TEST_F(CudaBackendReducedTest, FusedOptimizerUpdatesBFloat16) {
  ExpectFusedUpdatesMatch16<BFloat16>();
}
TEST_F(CudaBackendReducedTest, FusedOptimizerUpdatesFloat16) { ExpectFusedUpdatesMatch16<Half>(); }

// ---- Every dtype: Copy, Fill; integer and bool kernels -------------------------------------

// Values of every dtype from one list of small non-negative numbers (exact in each, so that
// every conversion is defined: uint8 has no negatives), as T.
template <typename T>
std::vector<T> FromDoubles(const std::vector<double>& values) {
  std::vector<T> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    if constexpr (kIsReducedFloat<T>) {
      out[i] = T(static_cast<float>(values[i]));
    } else {
      out[i] = static_cast<T>(values[i]);
    }
  }
  return out;
}

// Calls f(DTypeTag<Storage>{}, dtype) for each of the 8 dtypes, with bool stored as uint8_t.
template <typename F>
void ForEveryDType(F&& f) {
  for (DType dtype : {kFloat32, kInt64, kFloat64, kBFloat16, kFloat16, kBool, kInt32, kUInt8}) {
    DispatchDType(dtype, "test", [&](auto tag) {
      if constexpr (std::is_same_v<typename decltype(tag)::type, bool>) {
        f(DTypeTag<uint8_t>{}, dtype);
      } else {
        f(tag, dtype);
      }
    });
  }
}

TEST_F(CudaBackendTest, CopyBetweenEveryPairOfDTypesAndFillEveryDType) {
  const int64_t rows = 37, cols = 29, n = rows * cols;
  std::vector<double> values(n);
  std::uniform_int_distribution<int> quarters(0, 400);
  for (double& v : values) v = quarters(rng_) / 4.0;  // 0 .. 100, zeros included
  ForEveryDType([&](auto from_tag, DType from) {
    using From = typename decltype(from_tag)::type;
    std::vector<From> from_values = FromDoubles<From>(values);
    if (from == kBool) {
      for (From& v : from_values) v = v != 0;
    }
    Buffer<From> src(from_values, from);
    ForEveryDType([&](auto to_tag, DType to) {
      using To = typename decltype(to_tag)::type;
      const std::string what =
          Note(std::string("copy ") + DTypeName(from) + " -> " + DTypeName(to));
      Buffer<To> dst(n, to);
      // Contiguous (a plain copy when the dtypes match) and transposed (the strided kernel).
      cpu_.Copy(0, dst.CpuView({rows, cols}), src.CpuView({rows, cols}));
      gpu_.Copy(0, dst.GpuView({rows, cols}), src.GpuView({rows, cols}));
      ExpectBitwiseEqual(dst.Cpu(), dst.Gpu(), what);
      Buffer<To> transposed(n, to);
      cpu_.Copy(0, transposed.CpuView({rows, cols}, {1, rows}), src.CpuView({rows, cols}));
      gpu_.Copy(0, transposed.GpuView({rows, cols}, {1, rows}), src.GpuView({rows, cols}));
      ExpectBitwiseEqual(transposed.Cpu(), transposed.Gpu(), what + " (transposing)");
    });
  });
  ForEveryDType([&](auto tag, DType dtype) {
    using T = typename decltype(tag)::type;
    for (double value : {0.0, -0.0, 1.0, 2.5, 100.0}) {
      for (int64_t offset : {0, 1}) {
        Buffer<T> dst(n + 1, dtype);
        cpu_.Fill(0, dst.CpuView({n}, {}, offset), value);
        gpu_.Fill(0, dst.GpuView({n}, {}, offset), value);
        ExpectBitwiseEqual(
            dst.Cpu(), dst.Gpu(),
            Note(std::string("fill ") + DTypeName(dtype) + " with " + std::to_string(value)));
      }
      Buffer<T> every_third(3 * n, dtype);
      cpu_.Fill(0, every_third.CpuView({n}, {3}), value);
      gpu_.Fill(0, every_third.GpuView({n}, {3}), value);
      ExpectBitwiseEqual(every_third.Cpu(), every_third.Gpu(),
                         Note(std::string("strided fill ") + DTypeName(dtype)));
    }
  });
}

// int32, uint8 and bool: the integer Unary ops, every Binary op (comparisons also into bool),
// every reduction, against the CPU on the same inputs. uint8 wraps around as PyTorch's does.
template <typename T>
void ExpectIntegralKernelsMatch(Backend& cpu, Backend& gpu, std::mt19937_64& rng,
                                const std::string& seed_note) {
  const DType dtype = std::is_same_v<T, bool> ? kBool : DTypeOf<T>::value;
  using Storage = std::conditional_t<std::is_same_v<T, bool>, uint8_t, T>;
  const bool is_bool = dtype == kBool;
  const int low = dtype == kInt32 ? -50 : 0, high = is_bool ? 1 : 50;
  std::uniform_int_distribution<int> dist(low, high), positive(1, is_bool ? 1 : 9);
  const int64_t rows = 37, cols = 41, n = rows * cols;
  auto random = [&](bool nonzero) {
    std::vector<Storage> v(n);
    for (Storage& x : v) x = static_cast<Storage>(nonzero ? positive(rng) : dist(rng));
    return v;
  };
  const std::string name = std::string(DTypeName(dtype)) + " ";
  for (UnaryOp op : {UnaryOp::kNeg, UnaryOp::kAbs, UnaryOp::kAddScalar, UnaryOp::kMulScalar}) {
    Buffer<Storage> src(random(false), dtype), dst(n, dtype);
    if (is_bool && RejectsBool(op)) {  // both backends refuse what PyTorch refuses
      EXPECT_THROW(cpu.Unary(0, op, dst.CpuView({rows, cols}), src.CpuView({rows, cols}), 0.0),
                   Error);
      EXPECT_THROW(gpu.Unary(0, op, dst.GpuView({rows, cols}), src.GpuView({rows, cols}), 0.0),
                   Error);
      continue;
    }
    cpu.Unary(0, op, dst.CpuView({rows, cols}), src.CpuView({rows, cols}), -3.0);
    gpu.Unary(0, op, dst.GpuView({rows, cols}), src.GpuView({rows, cols}), -3.0);
    ExpectBitwiseEqual(dst.Cpu(), dst.Gpu(),
                       name + "unary op " + std::to_string(static_cast<int>(op)) + seed_note);
  }
  for (BinaryOp op : kAllBinary) {
    Buffer<Storage> a(random(false), dtype);
    Buffer<Storage> b(random(op == BinaryOp::kDiv), dtype);  // no division by zero
    Buffer<Storage> dst(n, dtype);
    const std::string what = name + "binary op " + std::to_string(static_cast<int>(op)) + seed_note;
    if ((is_bool && RejectsBool(op)) || BinaryIsFloatingOnly(op)) {
      EXPECT_THROW(cpu.Binary(0, op, dst.CpuView({rows, cols}), a.CpuView({rows, cols}),
                              b.CpuView({rows, cols})),
                   Error);
      EXPECT_THROW(gpu.Binary(0, op, dst.GpuView({rows, cols}), a.GpuView({rows, cols}),
                              b.GpuView({rows, cols})),
                   Error);
      continue;
    }
    // The output written transposed.
    cpu.Binary(0, op, dst.CpuView({rows, cols}, {1, rows}), a.CpuView({rows, cols}),
               b.CpuView({rows, cols}));
    gpu.Binary(0, op, dst.GpuView({rows, cols}, {1, rows}), a.GpuView({rows, cols}),
               b.GpuView({rows, cols}));
    ExpectBitwiseEqual(dst.Cpu(), dst.Gpu(), what);
    if (op >= BinaryOp::kEq && op <= BinaryOp::kGe && !is_bool) {
      // Into bool: the CPU's 1 or 0 in T, converted.
      Buffer<uint8_t> mask(n, kBool), expected(n, kBool);
      cpu.Copy(0, expected.CpuView({rows, cols}, {1, rows}), dst.CpuView({rows, cols}, {1, rows}));
      gpu.Binary(0, op, mask.GpuView({rows, cols}, {1, rows}), a.GpuView({rows, cols}),
                 b.GpuView({rows, cols}));
      ExpectBitwiseEqual(expected.Cpu(), mask.Gpu(), what + " into bool");
    }
  }
  for (ReduceKind op : {ReduceKind::kSum, ReduceKind::kMax, ReduceKind::kMin, ReduceKind::kArgMax,
                        ReduceKind::kArgMin}) {
    const bool arg = op == ReduceKind::kArgMax || op == ReduceKind::kArgMin;
    for (const ReduceShape& s : {ReduceShape{7, 3, 59}, ReduceShape{1, n, 1}}) {
      const std::string what = name + "reduce op " + std::to_string(static_cast<int>(op)) +
                               " over " + std::to_string(s.reduce) + seed_note;
      Buffer<Storage> src(random(false), dtype);
      const std::vector<int64_t> in_shape = {s.outer, s.reduce, s.inner};
      const std::vector<int64_t> out_shape = {s.outer, s.inner};
      if (arg) {
        Buffer<int64_t> dst(s.outer * s.inner);
        cpu.Reduce(0, op, dst.CpuView(out_shape), src.CpuView(in_shape), s.outer, s.reduce,
                   s.inner);
        gpu.Reduce(0, op, dst.GpuView(out_shape), src.GpuView(in_shape), s.outer, s.reduce,
                   s.inner);
        ExpectEqual(dst.Cpu(), dst.Gpu(), what);
      } else {
        Buffer<Storage> dst(s.outer * s.inner, dtype);
        cpu.Reduce(0, op, dst.CpuView(out_shape), src.CpuView(in_shape), s.outer, s.reduce,
                   s.inner);
        gpu.Reduce(0, op, dst.GpuView(out_shape), src.GpuView(in_shape), s.outer, s.reduce,
                   s.inner);
        ExpectBitwiseEqual(dst.Cpu(), dst.Gpu(), what);
      }
    }
  }
}

TEST_F(CudaBackendTest, Int32KernelsMatchTheCpu) {
  ExpectIntegralKernelsMatch<int32_t>(cpu_, gpu_, rng_, Note(""));
}
TEST_F(CudaBackendTest, UInt8KernelsMatchTheCpu) {
  ExpectIntegralKernelsMatch<uint8_t>(cpu_, gpu_, rng_, Note(""));
}
TEST_F(CudaBackendTest, BoolKernelsMatchTheCpu) {
  ExpectIntegralKernelsMatch<bool>(cpu_, gpu_, rng_, Note(""));
}

TEST_F(CudaBackendTest, FloatComparisonsIntoBool) {
  const int64_t n = 1001;
  Buffer<float> a(RandomIntegers<float>(n, -3, 3)), b(RandomIntegers<float>(n, -3, 3));
  std::vector<float> with_nan = a.Cpu();
  with_nan[5] = NAN;  // NaN compares unequal to everything, itself included
  a.Set(with_nan);
  for (BinaryOp op :
       {BinaryOp::kEq, BinaryOp::kNe, BinaryOp::kLt, BinaryOp::kLe, BinaryOp::kGt, BinaryOp::kGe}) {
    Buffer<float> as_float(n);
    Buffer<uint8_t> expected(n, kBool), mask(n, kBool);
    cpu_.Binary(0, op, as_float.CpuView({n}), a.CpuView({n}), b.CpuView({n}));
    cpu_.Copy(0, expected.CpuView({n}), as_float.CpuView({n}));
    gpu_.Binary(0, op, mask.GpuView({n}), a.GpuView({n}), b.GpuView({n}));
    ExpectBitwiseEqual(expected.Cpu(), mask.Gpu(),
                       Note("float32 comparison " + std::to_string(static_cast<int>(op))));
  }
  // Only comparisons may write bool.
  Buffer<uint8_t> mask(n, kBool);
  EXPECT_THROW(gpu_.Binary(0, BinaryOp::kAdd, mask.GpuView({n}), a.GpuView({n}), b.GpuView({n})),
               Error);
}

// ---- Errors
// -------------------------------------------------------------------------------------------

TEST_F(CudaBackendTest, BadArgumentsThrowClearErrors) {
  Buffer<float> x(12);
  try {
    gpu_.Unary(0, UnaryOp::kNeg, x.GpuView({3, 4}), x.GpuView({4, 3}), 0.0);
    FAIL() << "a shape mismatch must throw";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("[3, 4]"), std::string::npos) << error.what();
  }
  const int count = DeviceCount(DeviceType::kCUDA);
  try {
    gpu_.Fill(count, x.GpuView({12}), 1.0);
    FAIL() << "a device index past the last device must throw";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("cuda:" + std::to_string(count)), std::string::npos)
        << error.what();
  }
}

// ---- Fused row norms and triangles (Note [Fused row norms])
// ---------------------------------------------------------------------------------------

class CudaFusedNormTest : public CudaBackendReducedTest {
 protected:
  // RowNorm and RowNormBackward of every flavour (layer/RMS norm; no affine, weight only,
  // weight and bias) on the CPU and the GPU, the same T on both: outputs, saved statistics and
  // gradients within `rtol`/`atol` (both sum in OpMath, in different orders).
  template <typename T>
  void ExpectRowNormsMatch(double rtol, double atol) {
    using M = OpMath<T>;
    const DType dtype = DTypeOf<T>::value;
    const std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 1},    {3, 7},   {70, 768},
                                                             {5, 1500}, {33, 40}, {0, 4}};
    for (const auto& [rows, cols] : shapes) {
      for (bool rms : {false, true}) {
        for (int affine = 0; affine < 3; ++affine) {
          if (rms && affine == 2) continue;  // RMSNorm has no bias
          const std::string what =
              Note(DTypePrefix<T>() + (rms ? "rms" : "layer") + " norm [" + std::to_string(rows) +
                   ", " + std::to_string(cols) + "] affine " + std::to_string(affine));
          const size_t n = static_cast<size_t>(rows * cols), c = static_cast<size_t>(cols);
          // Off-centre rows: the variance must be taken about the mean.
          Buffer<T> x(RandomReduced<T>(n, 1.0, 5.0)), weight(RandomReduced<T>(c)),
              bias(RandomReduced<T>(c)), dy(RandomReduced<T>(n));
          Buffer<T> y(n), dx(n), dw(c), db(c);
          Buffer<M> mean(static_cast<size_t>(rows)), rstd(static_cast<size_t>(rows));
          const bool has_w = affine >= 1, has_b = affine == 2;
          for (bool gpu : {false, true}) {
            Backend& backend = gpu ? gpu_ : cpu_;
            auto at = [&](auto& buffer, bool present) -> decltype(buffer.cpu()) {
              return present ? (gpu ? buffer.gpu() : buffer.cpu()) : nullptr;
            };
            backend.RowNorm(0, dtype, rms, rows, cols, 1e-5, at(x, true), at(weight, has_w),
                            at(bias, has_b), at(y, true), at(mean, !rms), at(rstd, true));
            backend.RowNormBackward(0, dtype, rms, rows, cols, at(dy, true), at(x, true),
                                    at(mean, !rms), at(rstd, true), at(weight, has_w), at(dx, true),
                                    at(dw, has_w), at(db, has_b));
          }
          ExpectNear(y.Cpu(), y.Gpu(), rtol, atol, what + ": y");
          ExpectNear(rstd.Cpu(), rstd.Gpu(), rtol, atol, what + ": rstd");
          if (!rms) ExpectNear(mean.Cpu(), mean.Gpu(), rtol, atol, what + ": mean");
          ExpectNear(dx.Cpu(), dx.Gpu(), rtol, atol, what + ": grad_x");
          // Sums over the rows: their rounding grows with the row count.
          const double sum_atol = atol * std::sqrt(static_cast<double>(rows) + 1.0);
          if (has_w) ExpectNear(dw.Cpu(), dw.Gpu(), rtol, sum_atol, what + ": grad_weight");
          if (has_b) ExpectNear(db.Cpu(), db.Gpu(), rtol, sum_atol, what + ": grad_bias");
        }
      }
    }
  }

  // Triangle moves bits: exactly the CPU's, in place too, for each element size.
  template <typename T>
  void ExpectTrianglesMatch(DType dtype) {
    const int64_t batch = 3, rows = 5, cols = 7;
    const size_t n = static_cast<size_t>(batch * rows * cols);
    for (bool lower : {true, false}) {
      for (int64_t diagonal : {-7, -2, 0, 1, 3, 8}) {
        const std::string what = Note(std::string(DTypeName(dtype)) +
                                      (lower ? " tril " : " triu ") + std::to_string(diagonal));
        std::vector<T> values(n);
        for (size_t i = 0; i < n; ++i) values[i] = static_cast<T>(static_cast<float>(1 + i % 100));
        Buffer<T> src(values, dtype), dst(n, dtype);
        cpu_.Triangle(0, dtype, lower, diagonal, batch, rows, cols, src.cpu(), dst.cpu());
        gpu_.Triangle(0, dtype, lower, diagonal, batch, rows, cols, src.gpu(), dst.gpu());
        ExpectBitwiseEqual(dst.Cpu(), dst.Gpu(), what);
        gpu_.Triangle(0, dtype, lower, diagonal, batch, rows, cols, src.gpu(), src.gpu());
        ExpectBitwiseEqual(dst.Cpu(), src.Gpu(), what + " in place");
      }
    }
  }
};

TEST_F(CudaFusedNormTest, RowNormsFloat32) { ExpectRowNormsMatch<float>(1e-4, 1e-5); }
TEST_F(CudaFusedNormTest, RowNormsFloat64) { ExpectRowNormsMatch<double>(1e-10, 1e-12); }
// The 16-bit outputs may round to neighbouring values: two units in the last place.
TEST_F(CudaFusedNormTest, RowNormsBFloat16) {
  ExpectRowNormsMatch<BFloat16>(2 * Ulp<BFloat16>(), 1e-3);
}
TEST_F(CudaFusedNormTest, RowNormsFloat16) { ExpectRowNormsMatch<Half>(2 * Ulp<Half>(), 1e-4); }

TEST_F(CudaFusedNormTest, TrianglesOfEveryElementSize) {
  ExpectTrianglesMatch<uint8_t>(kBool);
  ExpectTrianglesMatch<uint8_t>(kUInt8);
  ExpectTrianglesMatch<Half>(kFloat16);
  ExpectTrianglesMatch<float>(kFloat32);
  ExpectTrianglesMatch<int64_t>(kInt64);
}

TEST_F(CudaFusedNormTest, BadShapesThrow) {
  Buffer<float> x(4), rstd(1);
  EXPECT_THROW(gpu_.RowNorm(0, kFloat32, false, 1, 0, 1e-5, x.gpu(), nullptr, nullptr, x.gpu(),
                            nullptr, rstd.gpu()),
               Error);
  Buffer<int64_t> ints(4);
  EXPECT_THROW(gpu_.RowNorm(0, kInt64, true, 1, 4, 1e-5, ints.gpu(), nullptr, nullptr, ints.gpu(),
                            nullptr, rstd.gpu()),
               Error);
}

// ---- Fused attention (Note [Fused attention])
// ---------------------------------------------------------------------------------------------

struct AttentionCase {
  int64_t batch, l, s, e, ev;
  bool causal;
  bool mask;               // an additive [batch / mask_heads, l, s] mask with -inf entries
  int64_t mask_heads = 1;  // consecutive heads that share one mask
  double dropout_p = 0.0;  // with Philox seed 1234 and offset 40 (not a block's first counter)
};

// Forward (out, logsumexp) and backward (dq, dk, dv) of the CUDA kernels on cuda:`device`
// against the CPU's, in T; `rtol`/`atol` cover float accumulation in another order (and, for
// the 16-bit types, a last-place difference of the rounded results).
template <typename T>
void ExpectAttentionMatches(Backend& cpu, Backend& gpu, std::mt19937_64& rng,
                            const AttentionCase& c, double rtol, double atol,
                            const std::string& note, int device = 0) {
  using M = OpMath<T>;
  const DType dtype = DTypeOf<T>::value;
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  const auto random = [&](int64_t n) {
    std::vector<T> values(static_cast<size_t>(n));
    for (T& v : values) v = static_cast<T>(dist(rng));
    return values;
  };
  AttentionGeometry g;
  g.batch = c.batch;
  g.query_len = c.l;
  g.key_len = c.s;
  g.head_dim = c.e;
  g.value_dim = c.ev;
  g.scale = 1.0 / std::sqrt(static_cast<double>(c.e));
  g.causal = c.causal;
  g.mask_heads = c.mask_heads;
  g.mask_batch_stride = c.l * c.s;
  g.mask_head_stride = 0;
  g.mask_row_stride = c.s;
  g.dropout_p = c.dropout_p;
  g.dropout_seed = 1234;
  g.dropout_offset = 40 + 1;
  const std::string what =
      note + " " + DTypePrefix<T>() + "attention batch=" + std::to_string(c.batch) +
      " L=" + std::to_string(c.l) + " S=" + std::to_string(c.s) + " E=" + std::to_string(c.e) +
      " Ev=" + std::to_string(c.ev) + (c.causal ? " causal" : "") + (c.mask ? " mask" : "") +
      (c.dropout_p > 0 ? " dropout=" + std::to_string(c.dropout_p) : "");
  Buffer<T> q(random(c.batch * c.l * c.e), dtype, device),
      k(random(c.batch * c.s * c.e), dtype, device), v(random(c.batch * c.s * c.ev), dtype, device),
      dout(random(c.batch * c.l * c.ev), dtype, device);
  const int64_t mask_size = c.batch / c.mask_heads * c.l * c.s;
  std::vector<T> mask_values = random(mask_size);
  for (int64_t i = 0; i < mask_size; ++i) {
    // Every row keeps key 0; a third of the others are excluded.
    if (i % c.s != 0 && i % 3 == 1) mask_values[i] = static_cast<T>(-INFINITY);
  }
  Buffer<T> mask(mask_values, dtype, device);
  Buffer<T> out(c.batch * c.l * c.ev, dtype, device);
  Buffer<M> lse(c.batch * c.l, DTypeOf<M>::value, device);
  Buffer<T> dq(c.batch * c.l * c.e, dtype, device), dk(c.batch * c.s * c.e, dtype, device),
      dv(c.batch * c.s * c.ev, dtype, device);
  cpu.AttentionForward(0, dtype, g, q.cpu(), k.cpu(), v.cpu(), c.mask ? mask.cpu() : nullptr,
                       out.cpu(), lse.cpu());
  gpu.AttentionForward(device, dtype, g, q.gpu(), k.gpu(), v.gpu(), c.mask ? mask.gpu() : nullptr,
                       out.gpu(), lse.gpu());
  ExpectNear(out.Cpu(), out.Gpu(), rtol, atol, what + " out");
  ExpectNear(lse.Cpu(), lse.Gpu(), rtol, atol, what + " logsumexp");
  // The backward of each device from its own forward: both read out and logsumexp.
  cpu.AttentionBackward(0, dtype, g, q.cpu(), k.cpu(), v.cpu(), c.mask ? mask.cpu() : nullptr,
                        out.cpu(), dout.cpu(), lse.cpu(), dq.cpu(), dk.cpu(), dv.cpu());
  gpu.AttentionBackward(device, dtype, g, q.gpu(), k.gpu(), v.gpu(), c.mask ? mask.gpu() : nullptr,
                        out.gpu(), dout.gpu(), lse.gpu(), dq.gpu(), dk.gpu(), dv.gpu());
  ExpectNear(dq.Cpu(), dq.Gpu(), rtol, atol, what + " dq");
  ExpectNear(dk.Cpu(), dk.Gpu(), rtol, atol, what + " dk");
  ExpectNear(dv.Cpu(), dv.Gpu(), rtol, atol, what + " dv");
}

TEST_F(CudaBackendTest, FusedAttentionMatchesCpu) {
  // Sizes past a block of rows (64), ragged key tiles (16), L > S and L < S under the causal
  // mask, value and head sizes that differ, and a mask with excluded keys.
  const std::vector<AttentionCase> cases = {
      {2, 5, 7, 4, 3, false, false},    {3, 70, 40, 8, 8, true, false},
      {2, 9, 20, 5, 6, false, true},    {2, 20, 9, 4, 4, true, false},
      {1, 66, 66, 16, 16, true, true},  {2, 1, 33, 3, 5, false, false},
      {6, 9, 20, 5, 6, false, true, 3},
  };
  for (const AttentionCase& c : cases) {
    ExpectAttentionMatches<float>(cpu_, gpu_, rng_, c, 1e-5, 1e-5, Note(""));
    ExpectAttentionMatches<double>(cpu_, gpu_, rng_, c, 1e-12, 1e-12, Note(""));
    ExpectAttentionMatches<BFloat16>(cpu_, gpu_, rng_, c, 1.6e-2, 1e-2, Note(""));
    ExpectAttentionMatches<Half>(cpu_, gpu_, rng_, c, 2e-3, 2e-3, Note(""));
  }
  Buffer<int64_t> ints(4);
  AttentionGeometry g;
  g.batch = g.query_len = g.key_len = g.head_dim = g.value_dim = 1;
  EXPECT_THROW(gpu_.AttentionForward(0, kInt64, g, ints.gpu(), ints.gpu(), ints.gpu(), nullptr,
                                     ints.gpu(), ints.gpu()),
               Error);
}

TEST_F(CudaBackendTest, FusedAttentionLargeHeadsMatchesCpu) {
  // Head sizes of real models (64; 128, Llama's; 256) and an odd pair (80 with values of 96):
  // a block of their rows needs more than the 48 KiB of shared memory every kernel gets, so
  // each kernel must opt in to more (the simulator, like an sm_90 GPU, refuses a launch that
  // did not). 70 queries and 66 keys span two blocks or more in every pass and end on ragged
  // tiles.
  std::vector<AttentionCase> cases;
  for (const auto& [e, ev] :
       std::vector<std::pair<int64_t, int64_t>>{{64, 64}, {128, 128}, {256, 256}, {80, 96}}) {
    for (const bool causal : {false, true}) cases.push_back({1, 70, 66, e, ev, causal, false});
  }
  for (const AttentionCase& c : cases) {
    ExpectAttentionMatches<float>(cpu_, gpu_, rng_, c, 1e-5, 1e-5, Note(""));
    ExpectAttentionMatches<double>(cpu_, gpu_, rng_, c, 1e-12, 1e-12, Note(""));
    ExpectAttentionMatches<BFloat16>(cpu_, gpu_, rng_, c, 1.6e-2, 1e-2, Note(""));
    ExpectAttentionMatches<Half>(cpu_, gpu_, rng_, c, 2e-3, 2e-3, Note(""));
  }
}

TEST_F(CudaBackendTest, FusedAttentionWithoutSharedMemoryOptInTilesOrSaysWhy) {
  // A device that gives a block no shared memory past the default 48 KiB: BUILD's
  // TANDEM_CUDASIM_SHARED_OPTIN_BYTES makes the simulated cuda:1 one (GPUs since Volta allow
  // more; smaller ones run out the same way at larger heads).
  int optin = 0;
  if (DeviceCount(DeviceType::kCUDA) < 2 ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 1) != cudaSuccess ||
      optin != 48 * 1024) {
    GTEST_SKIP() << "needs a cuda:1 without shared memory past 48 KiB (cudasim's "
                    "TANDEM_CUDASIM_SHARED_OPTIN_BYTES); its opt-in limit is "
                 << optin;
  }
  // Fewer rows per block: float32 head size 128 fits 8 rows in the dk/dv pass, float64 128 two.
  const AttentionCase head128{1, 20, 18, 128, 128, true, false};
  ExpectAttentionMatches<float>(cpu_, gpu_, rng_, head128, 1e-5, 1e-5, Note("cuda:1"), 1);
  ExpectAttentionMatches<double>(cpu_, gpu_, rng_, head128, 1e-12, 1e-12, Note("cuda:1"), 1);
  ExpectAttentionMatches<Half>(cpu_, gpu_, rng_, head128, 2e-3, 2e-3, Note("cuda:1"), 1);
  // float64 head size 256: one row and a tile of 16 keys take 69,632 bytes.
  AttentionGeometry g;
  g.batch = g.query_len = g.key_len = 1;
  g.head_dim = g.value_dim = 256;
  g.scale = 1.0 / 16;
  Buffer<double> x(256, kFloat64, 1), lse(1, kFloat64, 1);
  try {
    gpu_.AttentionForward(1, kFloat64, g, x.gpu(), x.gpu(), x.gpu(), nullptr, x.gpu(), lse.gpu());
    ADD_FAILURE() << "float64 head size 256 ran in 48 KiB of shared memory";
  } catch (const Error& error) {
    const std::string message = error.what();
    for (const char* part : {"head size 256", "float64", "69632 bytes", "at most 49152"}) {
      EXPECT_NE(message.find(part), std::string::npos) << part << " not in: " << message;
    }
  }
}

TEST_F(CudaBackendTest, FusedAttentionWithDropoutMatchesCpu) {
  // The same Philox mask on both devices: a dropped weight that one kept would move out and
  // the gradients by far more than the tolerances.
  const std::vector<AttentionCase> cases = {
      {2, 5, 7, 4, 3, false, false, 1, 0.3},
      {3, 70, 40, 8, 8, true, false, 1, 0.5},
      {2, 9, 20, 5, 6, false, true, 1, 0.1},
      {1, 66, 66, 16, 16, true, true, 1, 0.2},
  };
  for (const AttentionCase& c : cases) {
    ExpectAttentionMatches<float>(cpu_, gpu_, rng_, c, 1e-5, 1e-5, Note(""));
    ExpectAttentionMatches<double>(cpu_, gpu_, rng_, c, 1e-12, 1e-12, Note(""));
    ExpectAttentionMatches<BFloat16>(cpu_, gpu_, rng_, c, 1.6e-2, 1e-2, Note(""));
  }
}

}  // namespace
}  // namespace tandem
