// OneDnnGemm against OpenBLAS's float GEMM of the same (rounded) inputs, over transposes,
// padded rows, batches (stride 0 included), alpha/beta and degenerate sizes; bitwise equal
// results whatever the number of threads; concurrent calls; what it declines.
#include "tensor/cpu/internal/onednn_matmul.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/base/half.h"
#include "tensor/runtime/allocator.h"
#include "tensor/runtime/backend.h"
#include "tensor/runtime/devices.h"

namespace tandem {
namespace {

struct Case {
  bool trans_a, trans_b;
  int64_t m, n, k, batch;
  double alpha, beta;
  int64_t pad = 0;        // extra elements at the end of every row of A, B and C
  bool shared_a = false;  // stride_a = 0: one A for every product
};

std::string Describe(const Case& c) {
  return "ta=" + std::to_string(c.trans_a) + " tb=" + std::to_string(c.trans_b) +
         " m=" + std::to_string(c.m) + " n=" + std::to_string(c.n) + " k=" + std::to_string(c.k) +
         " batch=" + std::to_string(c.batch) + " alpha=" + std::to_string(c.alpha) +
         " beta=" + std::to_string(c.beta) + " pad=" + std::to_string(c.pad) +
         " shared_a=" + std::to_string(c.shared_a);
}

// Operands of one case in T, the float copies of exactly those values, and the layout.
template <typename T>
struct Operands {
  int64_t lda, ldb, ldc, stride_a, stride_b, stride_c;
  std::vector<T> a, b, c;
  std::vector<float> af, bf, cf;
};

template <typename T>
Operands<T> MakeOperands(const Case& c, uint32_t seed) {
  Operands<T> o;
  const int64_t a_rows = c.trans_a ? c.k : c.m, a_cols = c.trans_a ? c.m : c.k;
  const int64_t b_rows = c.trans_b ? c.n : c.k, b_cols = c.trans_b ? c.k : c.n;
  // BLAS's rule: a leading dimension is at least 1, even for empty rows.
  o.lda = std::max<int64_t>(a_cols, 1) + c.pad;
  o.ldb = std::max<int64_t>(b_cols, 1) + c.pad;
  o.ldc = std::max<int64_t>(c.n, 1) + c.pad;
  o.stride_a = c.shared_a ? 0 : a_rows * o.lda;
  o.stride_b = b_rows * o.ldb;
  o.stride_c = c.m * o.ldc;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  auto fill = [&](std::vector<T>* x, std::vector<float>* xf, int64_t size) {
    x->resize(std::max<int64_t>(size, 1));
    xf->resize(x->size());
    for (size_t i = 0; i < x->size(); ++i) {
      (*x)[i] = T(uniform(rng));
      (*xf)[i] = static_cast<float>((*x)[i]);
    }
  };
  fill(&o.a, &o.af, c.shared_a ? o.stride_a + a_rows * o.lda : c.batch * a_rows * o.lda);
  fill(&o.b, &o.bf, c.batch * b_rows * o.ldb);
  fill(&o.c, &o.cf, c.batch * c.m * o.ldc);
  return o;
}

// The float copies of `o`'s values, in its layout: what Reference reads.
template <typename T>
Operands<float> FloatCopy(const Operands<T>& o) {
  Operands<float> of;
  of.lda = o.lda, of.ldb = o.ldb, of.ldc = o.ldc;
  of.stride_a = o.stride_a, of.stride_b = o.stride_b, of.stride_c = o.stride_c;
  of.af = o.af, of.bf = o.bf, of.cf = o.cf;
  return of;
}

// The reference: OpenBLAS in float on the same values, and per element the sum of the
// magnitudes of its terms (what float accumulation errors scale with).
void Reference(const Case& c, const Operands<float>& o, std::vector<float>* expected,
               std::vector<float>* magnitude) {
  // One thread, as the backend runs OpenBLAS: its own pool is invisible to ThreadSanitizer
  // (an uninstrumented library), and the reference needs no speed.
  openblas_set_num_threads(1);
  *expected = o.cf;
  magnitude->assign(o.cf.size(), 0.0f);
  for (int64_t p = 0; p < c.batch; ++p) {
    const float* a = o.af.data() + p * o.stride_a;
    const float* b = o.bf.data() + p * o.stride_b;
    float* out = expected->data() + p * o.stride_c;
    if (c.m > 0 && c.n > 0 && c.k > 0) {
      cblas_sgemm(CblasRowMajor, c.trans_a ? CblasTrans : CblasNoTrans,
                  c.trans_b ? CblasTrans : CblasNoTrans, c.m, c.n, c.k, c.alpha, a, o.lda, b, o.ldb,
                  c.beta, out, o.ldc);
    } else {
      for (int64_t i = 0; i < c.m; ++i) {
        for (int64_t j = 0; j < c.n; ++j) {
          float& x = out[i * o.ldc + j];
          x = c.beta == 0 ? 0.0f : static_cast<float>(c.beta) * x;
        }
      }
    }
    for (int64_t i = 0; i < c.m; ++i) {
      for (int64_t j = 0; j < c.n; ++j) {
        double sum = std::abs(c.beta * o.cf[p * o.stride_c + i * o.ldc + j]);
        for (int64_t q = 0; q < c.k; ++q) {
          const float x = c.trans_a ? a[q * o.lda + i] : a[i * o.lda + q];
          const float y = c.trans_b ? b[j * o.ldb + q] : b[q * o.ldb + j];
          sum += std::abs(c.alpha * x * y);
        }
        (*magnitude)[p * o.stride_c + i * o.ldc + j] = static_cast<float>(sum);
      }
    }
  }
}

// PyTorch's tolerances for the type, plus float accumulation error over k terms.
template <typename T>
double RelativeTolerance() {
  return std::is_same<T, BFloat16>::value ? 1.6e-2 : std::is_same<T, Half>::value ? 1e-3 : 1.3e-6;
}

// Runs `c` through `gemm` on T operands and checks every element of C (the padding
// included: it must keep its values) against the float reference.
template <typename T, typename Gemm>
void CheckCase(const Case& c, Gemm gemm) {
  SCOPED_TRACE(Describe(c));
  Operands<T> o = MakeOperands<T>(c, 1234);
  std::vector<float> expected, magnitude;
  Reference(c, FloatCopy(o), &expected, &magnitude);
  ASSERT_TRUE(gemm(c, o));
  const double rtol = RelativeTolerance<T>();
  int reported = 0;
  for (size_t i = 0; i < o.c.size(); ++i) {
    const double got = static_cast<float>(o.c[i]);
    const double want = expected[i];
    const double tolerance = 1e-5 + rtol * std::abs(want) +
                             4 * c.k * std::numeric_limits<float>::epsilon() * magnitude[i];
    if (!(std::abs(got - want) <= tolerance) && reported++ < 5) {
      ADD_FAILURE() << "element " << i << ": got " << got << ", want " << want << " (tolerance "
                    << tolerance << ")";
    }
  }
}

template <typename T>
bool ViaOneDnnGemm(const Case& c, Operands<T>& o) {
  return OneDnnGemm(0, DTypeOf<T>::value, c.trans_a, c.trans_b, c.m, c.n, c.k, c.alpha, o.a.data(),
                    o.lda, o.stride_a, o.b.data(), o.ldb, o.stride_b, c.beta, o.c.data(), o.ldc,
                    o.stride_c, c.batch);
}

template <typename T>
bool ViaBackend(const Case& c, Operands<T>& o) {
  GetBackend(DeviceType::kCPU)
      .Gemm(0, DTypeOf<T>::value, c.trans_a, c.trans_b, c.m, c.n, c.k, c.alpha, o.a.data(), o.lda,
            o.stride_a, o.b.data(), o.ldb, o.stride_b, c.beta, o.c.data(), o.ldc, o.stride_c,
            c.batch);
  return true;
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      cases.push_back({ta, tb, 7, 5, 3, 1, 1.0, 0.0});
      cases.push_back({ta, tb, 33, 17, 65, 1, 0.5, 1.0});
      cases.push_back({ta, tb, 64, 48, 200, 1, -2.0, 0.75, 3});   // padded rows
      cases.push_back({ta, tb, 301, 67, 130, 1, 1.0, 0.5});       // cut along M
      cases.push_back({ta, tb, 21, 403, 97, 1, 2.0, 0.0});        // cut along N
      cases.push_back({ta, tb, 11, 6, 9, 23, 1.0, 0.0});          // many small products
      cases.push_back({ta, tb, 11, 6, 9, 5, 0.5, 1.0, 0, true});  // one A for all
      cases.push_back({ta, tb, 150, 40, 200, 3, 1.0, 0.5, 2});
      // Degenerate: single rows, columns, inner dimension; nothing to multiply.
      cases.push_back({ta, tb, 1, 9, 5, 1, 1.0, 1.0});
      cases.push_back({ta, tb, 9, 1, 5, 2, 1.0, 0.0});
      cases.push_back({ta, tb, 6, 7, 1, 1, 1.0, 0.5});
      cases.push_back({ta, tb, 1, 1, 300, 1, 1.0, 0.0});
      cases.push_back({ta, tb, 5, 4, 0, 2, 1.0, 3.0});  // k = 0: C = beta * C
      cases.push_back({ta, tb, 5, 4, 0, 1, 1.0, 0.0});
      cases.push_back({ta, tb, 3, 3, 3, 1, 0.0, 2.0});  // alpha = 0
      cases.push_back({ta, tb, 0, 4, 3, 1, 1.0, 0.0});
      cases.push_back({ta, tb, 4, 0, 3, 1, 1.0, 0.0});
      cases.push_back({ta, tb, 4, 5, 3, 0, 1.0, 0.0});
    }
  }
  return cases;
}

TEST(OneDnnMatmulTest, Float32IsAlwaysSupported) { EXPECT_TRUE(OneDnnSupports(kFloat32)); }

TEST(OneDnnMatmulTest, Float64AndIntegersAreDeclined) {
  EXPECT_FALSE(OneDnnSupports(kFloat64));
  EXPECT_FALSE(OneDnnSupports(kInt32));
  double a = 1, b = 2, c = 0;
  EXPECT_FALSE(
      OneDnnGemm(0, kFloat64, false, false, 1, 1, 1, 1.0, &a, 1, 0, &b, 1, 0, 0.0, &c, 1, 0, 1));
}

TEST(OneDnnMatmulTest, BFloat16MatchesFloatGemmOfTheSameInputs) {
  if (!OneDnnSupports(kBFloat16)) GTEST_SKIP() << "oneDNN has no bfloat16 matmul on this CPU";
  for (const Case& c : Cases()) CheckCase<BFloat16>(c, ViaOneDnnGemm<BFloat16>);
}

TEST(OneDnnMatmulTest, BackendGemmBFloat16MatchesFloatGemm) {
  if (!OneDnnSupports(kBFloat16)) GTEST_SKIP() << "oneDNN has no bfloat16 matmul on this CPU";
  for (const Case& c : Cases()) CheckCase<BFloat16>(c, ViaBackend<BFloat16>);
}

TEST(OneDnnMatmulTest, Float32MatchesOpenBlas) {
  for (const Case& c : Cases()) CheckCase<float>(c, ViaOneDnnGemm<float>);
}

// The float32 products the backend sends to oneDNN (OneDnnPreferredForFloat32: the CNN's wide
// im2col GEMMs) give OpenBLAS's results within float rounding.
TEST(OneDnnMatmulTest, BackendFloat32WideProductsMatchOpenBlas) {
  for (bool ta : {false, true}) {
    const Case c{ta, false, 64, 16384, 40, 1, 1.0, 0.5};
    ASSERT_TRUE(OneDnnPreferredForFloat32(c.trans_a, c.trans_b, c.m, c.n, c.k, c.batch));
    CheckCase<float>(c, ViaBackend<float>);
  }
}

// oneDNN 2.6 has no float16 matmul for CPUs (it needs AVX512-FP16 kernels that came later):
// OneDnnGemm declines without writing, and the backend's fallback computes in float.
TEST(OneDnnMatmulTest, Float16IsComputedOrDeclinedWithoutWriting) {
  if (OneDnnSupports(kFloat16)) {
    for (const Case& c : Cases()) CheckCase<Half>(c, ViaOneDnnGemm<Half>);
    return;
  }
  const Case c{false, false, 8, 8, 8, 1, 1.0, 0.0};
  Operands<Half> o = MakeOperands<Half>(c, 7);
  const std::vector<Half> before = o.c;
  EXPECT_FALSE(ViaOneDnnGemm<Half>(c, o));
  EXPECT_EQ(std::memcmp(before.data(), o.c.data(), before.size() * sizeof(Half)), 0);
}

TEST(OneDnnMatmulTest, BetaZeroOverwritesNaN) {
  if (!OneDnnSupports(kBFloat16)) GTEST_SKIP() << "oneDNN has no bfloat16 matmul on this CPU";
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<BFloat16> a(4, BFloat16(1.0f)), b(4, BFloat16(1.0f)), c(4, BFloat16(nan));
  ASSERT_TRUE(OneDnnGemm(0, kBFloat16, false, false, 2, 2, 2, 1.0, a.data(), 2, 0, b.data(), 2, 0,
                         0.0, c.data(), 2, 0, 1));
  for (BFloat16 x : c) EXPECT_EQ(static_cast<float>(x), 2.0f);
  std::fill(c.begin(), c.end(), BFloat16(nan));  // k = 0 too
  ASSERT_TRUE(OneDnnGemm(0, kBFloat16, false, false, 2, 2, 0, 1.0, a.data(), 1, 0, b.data(), 2, 0,
                         0.0, c.data(), 2, 0, 1));
  for (BFloat16 x : c) EXPECT_EQ(static_cast<float>(x), 0.0f);
}

// Backend::GemmFloatOutput (autocast's weight gradients): bfloat16 A and B into a float32 C,
// checked at float32's tolerance, which a C rounded through bfloat16 (relative error up to
// 2^-9) would miss.
TEST(OneDnnMatmulTest, BFloat16IntoFloatOutputIsNotRoundedTo16Bits) {
  if (!OneDnnSupports(kBFloat16)) GTEST_SKIP() << "oneDNN has no bfloat16 matmul on this CPU";
  for (const Case& shape : Cases()) {
    if (shape.batch != 1 || shape.shared_a || shape.m == 0 || shape.n == 0) continue;
    const Case c{shape.trans_a, shape.trans_b, shape.m, shape.n, shape.k, 1, 1.0, 0.0, shape.pad};
    SCOPED_TRACE(Describe(c));
    Operands<BFloat16> o = MakeOperands<BFloat16>(c, 4321);
    std::vector<float> expected, magnitude;
    Reference(c, FloatCopy(o), &expected, &magnitude);
    std::vector<float> got = o.cf;  // the padding must keep its values
    ASSERT_TRUE(GetBackend(DeviceType::kCPU)
                    .GemmFloatOutput(0, kBFloat16, c.trans_a, c.trans_b, c.m, c.n, c.k, o.a.data(),
                                     o.lda, kBFloat16, o.b.data(), o.ldb, got.data(), o.ldc));
    for (int64_t i = 0; i < c.m; ++i) {
      for (int64_t j = 0; j < o.ldc; ++j) {
        const int64_t at = i * o.ldc + j;
        const double tolerance =
            j < c.n ? 1e-6 + 1.3e-6 * std::abs(expected[at]) +
                          4 * c.k * std::numeric_limits<float>::epsilon() * magnitude[at]
                    : 0.0;
        ASSERT_LE(std::abs(got[at] - expected[at]), tolerance) << "row " << i << ", column " << j;
      }
    }
  }
  // Float16 is declined (oneDNN 2.6) or computed; float32 inputs are not this method's.
  float c = 0;
  const float one = 1.0f;
  EXPECT_FALSE(
      GetBackend(DeviceType::kCPU)
          .GemmFloatOutput(0, kFloat32, false, false, 1, 1, 1, &one, 1, kFloat32, &one, 1, &c, 1));
}

// A float32 B rounded block by block (the first layer's weight gradient under autocast) gives
// C bit for bit as B cast to bfloat16 first; where C is cut into blocks of rows (every block
// would need all of B), the caller's cast is left to it, with nothing written.
TEST(OneDnnMatmulTest, FloatBRoundedPerBlockEqualsBCastFirst) {
  if (!OneDnnSupports(kBFloat16)) GTEST_SKIP() << "oneDNN has no bfloat16 matmul on this CPU";
  Backend& cpu = GetBackend(DeviceType::kCPU);
  std::vector<Case> cases = Cases();
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) cases.push_back({ta, tb, 256, 784, 256, 1, 1.0, 0.0, 1});
  }
  int rounded_here = 0;
  for (const Case& shape : cases) {
    if (shape.batch != 1 || shape.shared_a || shape.m == 0 || shape.n == 0) continue;
    const Case c{shape.trans_a, shape.trans_b, shape.m, shape.n, shape.k, 1, 1.0, 0.0, shape.pad};
    SCOPED_TRACE(Describe(c));
    Operands<BFloat16> o = MakeOperands<BFloat16>(c, 977);
    // B's float32 values lie between bfloat16 numbers, so rounding matters.
    std::vector<float> b_float(o.b.size());
    std::mt19937 rng(31);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    for (size_t i = 0; i < b_float.size(); ++i) {
      b_float[i] = uniform(rng);
      o.b[i] = BFloat16(b_float[i]);
    }
    std::vector<float> expected = o.cf, got = o.cf;
    ASSERT_TRUE(cpu.GemmFloatOutput(0, kBFloat16, c.trans_a, c.trans_b, c.m, c.n, c.k, o.a.data(),
                                    o.lda, kBFloat16, o.b.data(), o.ldb, expected.data(), o.ldc));
    if (cpu.GemmFloatOutput(0, kBFloat16, c.trans_a, c.trans_b, c.m, c.n, c.k, o.a.data(), o.lda,
                            kFloat32, b_float.data(), o.ldb, got.data(), o.ldc)) {
      ++rounded_here;
      ASSERT_EQ(0, std::memcmp(got.data(), expected.data(), got.size() * sizeof(float)));
    } else {
      EXPECT_GE(c.m, c.n) << "declined a product cut into blocks of columns";
      ASSERT_EQ(0, std::memcmp(got.data(), o.cf.data(), got.size() * sizeof(float)))
          << "a declined product wrote C";
    }
  }
  EXPECT_GT(rounded_here, 8);
}

// The rounding buffers come from the device's allocator (counted in its statistics) and only
// the blocks running at once hold one: with 2 threads, about half of a whole 16-bit copy of B.
TEST(OneDnnMatmulTest, FloatBRoundedPerBlockHoldsLessThanACopy) {
  if (!OneDnnSupports(kBFloat16)) GTEST_SKIP() << "oneDNN has no bfloat16 matmul on this CPU";
  SetCpuThreadsPerDevice(2);
  struct AutomaticThreads {  // back to the automatic share, however the test ends
    ~AutomaticThreads() { SetCpuThreadsPerDevice(0); }
  } automatic_threads;
  const int64_t m = 256, n = 784, k = 256;  // the MLP's first weight gradient: grad^T x
  std::vector<BFloat16> a(k * m, BFloat16(0.5f));
  std::vector<float> b(k * n, 0.25f), c(m * n, -1.0f);
  const Device cpu0 = Device::Cpu(0);
  const int64_t before = GetMemoryStats(cpu0).in_use_bytes;
  ResetPeakMemory(cpu0);
  ASSERT_TRUE(GetBackend(DeviceType::kCPU)
                  .GemmFloatOutput(0, kBFloat16, true, false, m, n, k, a.data(), m, kFloat32,
                                   b.data(), n, c.data(), n));
  const int64_t held = GetMemoryStats(cpu0).peak_bytes - before;
  const int64_t copy = k * n * static_cast<int64_t>(sizeof(BFloat16));
  EXPECT_GT(held, 0) << "the rounded blocks bypassed the device's allocator";
  EXPECT_LE(held, copy * 6 / 10) << "a whole copy of B is " << copy << " bytes";
  EXPECT_EQ(GetMemoryStats(cpu0).in_use_bytes, before) << "a rounding buffer was kept";
  for (float x : c) ASSERT_EQ(x, 0.5f * 0.25f * k);
}

// What the caller must reject goes back to it, with nothing written.
TEST(OneDnnMatmulTest, DeclinesInvalidArguments) {
  std::vector<float> a(16, 1.0f), b(16, 1.0f), c(16, 5.0f);
  EXPECT_FALSE(OneDnnGemm(0, kFloat32, false, false, -1, 2, 2, 1.0, a.data(), 2, 0, b.data(), 2, 0,
                          0.0, c.data(), 2, 0, 1));
  // Rows of A overlap (lda below the row length).
  EXPECT_FALSE(OneDnnGemm(0, kFloat32, false, false, 2, 2, 2, 1.0, a.data(), 1, 0, b.data(), 2, 0,
                          0.0, c.data(), 2, 0, 1));
  // Several products into one C.
  EXPECT_FALSE(OneDnnGemm(0, kFloat32, false, false, 2, 2, 2, 1.0, a.data(), 2, 4, b.data(), 2, 4,
                          0.0, c.data(), 2, 0, 3));
  EXPECT_EQ(c, std::vector<float>(16, 5.0f));
}

// Tandem promises the same bits whatever the number of threads: OneDnnGemm's cut depends on
// the shape only.
TEST(OneDnnMatmulTest, ResultsAreBitwiseTheSameForAnyThreadCount) {
  if (!OneDnnSupports(kBFloat16)) GTEST_SKIP() << "oneDNN has no bfloat16 matmul on this CPU";
  const std::vector<Case> cases = {
      {false, true, 512, 384, 256, 1, 1.0, 0.0},  {true, false, 301, 67, 130, 1, 1.0, 0.5},
      {false, false, 21, 1403, 97, 1, 2.0, 0.0},  {true, true, 150, 240, 200, 3, 1.0, 0.5, 2},
      {false, false, 64, 4000, 288, 1, 1.0, 0.0},
  };
  const int original = CpuDeviceCount();
  SetCpuDeviceCount(1);
  for (const Case& c : cases) {
    SCOPED_TRACE(Describe(c));
    std::vector<uint16_t> first;
    for (int threads : {1, 2, 3, 4}) {
      SetCpuThreadsPerDevice(threads);
      Operands<BFloat16> o = MakeOperands<BFloat16>(c, 99);
      ASSERT_TRUE(ViaOneDnnGemm<BFloat16>(c, o));
      std::vector<uint16_t> bits(o.c.size());
      std::memcpy(bits.data(), o.c.data(), bits.size() * sizeof(uint16_t));
      if (first.empty()) {
        first = bits;
      } else {
        EXPECT_EQ(bits, first) << threads << " threads differ from 1";
      }
    }
  }
  SetCpuThreadsPerDevice(0);
  SetCpuDeviceCount(original);
}

// Primitives are shared between threads (one cache): concurrent products of one shape and of
// different shapes each get their own, correct, result.
TEST(OneDnnMatmulTest, ConcurrentCallsAreIndependent) {
  const DType dtype = OneDnnSupports(kBFloat16) ? kBFloat16 : kFloat32;
  constexpr int kThreads = 4;
  std::vector<std::vector<float>> results(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const int64_t m = 40 + 8 * (t % 2), n = 24, k = 100;
      std::vector<BFloat16> a16(m * k), b16(k * n), c16(m * n);
      std::vector<float> a32(m * k), b32(k * n), c32(m * n);
      for (int64_t i = 0; i < m * k; ++i) a16[i] = a32[i] = static_cast<float>((i + t) % 7) - 3;
      for (int64_t i = 0; i < k * n; ++i) b16[i] = b32[i] = static_cast<float>(i % 5) - 2;
      for (int round = 0; round < 20; ++round) {
        const bool bf16 = dtype == kBFloat16;
        ASSERT_TRUE(OneDnnMatmul(dtype, false, false, m, n, k, 1.0f,
                                 bf16 ? static_cast<void*>(a16.data()) : a32.data(), k,
                                 bf16 ? static_cast<void*>(b16.data()) : b32.data(), n, 0.0f,
                                 bf16 ? static_cast<void*>(c16.data()) : c32.data(), n));
        if (bf16) std::copy(c16.begin(), c16.end(), c32.begin());
      }
      results[t] = c32;
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) {
    const int64_t m = 40 + 8 * (t % 2), n = 24, k = 100;
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        // Small integers: every sum is exact in float, and in bfloat16 below 256.
        double want = 0;
        for (int64_t q = 0; q < k; ++q) {
          want += (static_cast<float>((i * k + q + t) % 7) - 3) *
                  (static_cast<float>((q * n + j) % 5) - 2);
        }
        const float rounded = static_cast<float>(BFloat16(static_cast<float>(want)));
        EXPECT_EQ(results[t][i * n + j], dtype == kBFloat16 ? rounded : want)
            << "thread " << t << " (" << i << ", " << j << ")";
      }
    }
  }
}

}  // namespace
}  // namespace tandem
