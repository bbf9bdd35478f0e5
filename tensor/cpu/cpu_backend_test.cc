// Tests of the CPU backend's registration, allocators and byte copies, gathers and scatters,
// and random numbers, against naive reference loops through the Backend interface with raw
// buffers (no Tensor). The other kernels' tests are beside it: copy_kernels_test.cc,
// elementwise_kernels_test.cc, reduce_kernels_test.cc, gemm_test.cc, conv_pool_test.cc,
// fused_optimizer_kernels_test.cc.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/base/device.h"
#include "tensor/base/error.h"
#include "tensor/base/half.h"
#include "tensor/base/philox.h"
#include "tensor/cpu/cpu_backend_testing.h"
#include "tensor/kernels/float_conversions.h"
#include "tensor/kernels/index_kernels.h"
#include "tensor/kernels/internal/elementwise_math.h"
#include "tensor/kernels/vectorized.h"
#include "tensor/runtime/backend.h"
#include "tensor/runtime/devices.h"

namespace tandem {
namespace {

using namespace ::tandem::cpu_backend_testing;  // NOLINT(build/namespaces)

TYPED_TEST_SUITE(ReducedFloatTest, ReducedFloatTypes);

// ---- Backend basics ----------------------------------------------------------------------

TEST(CpuBackendTest, IsRegisteredForTheCpu) {
  Backend& backend = Cpu();
  EXPECT_EQ(backend.type(), DeviceType::kCPU);
  EXPECT_EQ(backend.DeviceCount(), CpuDeviceCount());
  EXPECT_EQ(backend.UnavailableReason(), "");
  EXPECT_EQ(backend.AllocatePinnedHost(64), nullptr);
}

TEST(CpuBackendTest, HasOneAllocatorPerLogicalDevice) {
  Allocator& cpu0 = Cpu().GetAllocator(0);
  EXPECT_EQ(&cpu0, &Cpu().GetAllocator(0));
  EXPECT_NE(&cpu0, &Cpu().GetAllocator(1));
  std::shared_ptr<void> block = cpu0.Allocate(100);
  ASSERT_NE(block, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(block.get()) % kHostAlignment, 0u);
  EXPECT_THROW(Cpu().GetAllocator(-1), Error);
}

TEST(CpuBackendTest, CopiesBytes) {
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{1000}, size_t{5} << 20}) {
    std::vector<char> src(bytes), dst(bytes, 0), back(bytes, 0), other(bytes, 0);
    for (size_t i = 0; i < bytes; ++i) src[i] = static_cast<char>(i * 7 + 3);
    Cpu().CopyFromHost(0, dst.data(), src.data(), bytes);
    Cpu().CopyBetweenDevices(1, other.data(), 0, dst.data(), bytes);
    Cpu().CopyToHost(1, back.data(), other.data(), bytes);
    Cpu().Synchronize(0);
    EXPECT_EQ(src, dst);
    EXPECT_EQ(src, back);
  }
}

// ---- Gather / scatter --------------------------------------------------------------------

TEST(CpuBackendTest, GatherAndScatterAddColumns) {
  WithEachThreadCount([] {
    const int64_t rows = 100003, cols = 11;
    std::vector<float> src = RandomFloats(rows * cols, -1, 1, 23);
    std::vector<int64_t> idx = RandomInts(rows, 0, cols - 1, 24);
    std::vector<float> gathered(rows);
    GatherColumnsKernel(Device::Cpu(0), kFloat32, gathered.data(), src.data(), idx.data(), rows,
                        cols, "test");
    for (int64_t r = 0; r < rows; ++r) ASSERT_EQ(gathered[r], src[r * cols + idx[r]]);

    std::vector<float> dst = src, expected = src;
    for (int64_t r = 0; r < rows; ++r) expected[r * cols + idx[r]] += gathered[r];
    ScatterAddColumnsKernel(Device::Cpu(0), kFloat32, dst.data(), gathered.data(), idx.data(), rows,
                            cols);
    ASSERT_EQ(dst, expected);
    GatherColumnsKernel(Device::Cpu(0), kFloat32, nullptr, nullptr, nullptr, 0, cols, "test");
    ScatterAddColumnsKernel(Device::Cpu(0), kFloat32, nullptr, nullptr, nullptr, 0, cols);
  });
}

// ---- Random numbers ----------------------------------------------------------------------

TEST(CpuBackendTest, RandomUniformIsPhiloxAtOffsetPlusIndex) {
  WithEachThreadCount([] {
    const int64_t n = 100001;
    const uint64_t seed = 1234, offset = 7;  // unaligned: starts mid-block
    std::vector<float> out(n);
    Cpu().RandomUniform(0, kFloat32, out.data(), n, seed, offset, -2.0f, 3.0f);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(out[i], -2.0f + 5.0f * philox::Uniform(seed, offset + i)) << "at " << i;
    }
  });
}

TEST(CpuBackendTest, RandomNormalIsPhiloxAtOffsetPlusIndex) {
  WithEachThreadCount([] {
    const int64_t n = 100001;
    const uint64_t seed = 99, offset = 3;
    std::vector<float> out(n);
    Cpu().RandomNormal(0, kFloat32, out.data(), n, seed, offset, 0.5f, 2.0f);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(out[i], 0.5f + 2.0f * philox::Normal(seed, offset + i)) << "at " << i;
    }
  });
}

TEST(CpuBackendTest, RandomNumbersDoNotDependOnHowTheRequestIsSplit) {
  const int64_t n = 200000;
  const int original = CpuDeviceCount();
  std::vector<float> whole_uniform(n), whole_normal(n);
  SetCpuDeviceCount(1);  // all cores on cpu:0
  Cpu().RandomUniform(0, kFloat32, whole_uniform.data(), n, 5, 11, 0.0f, 1.0f);
  Cpu().RandomNormal(0, kFloat32, whole_normal.data(), n, 5, 11, 0.0f, 1.0f);
  SetCpuDeviceCount(HardwareCores());  // one thread per device
  // The same counters requested in pieces that start and end inside Philox blocks.
  std::vector<float> uniform(n), normal(n);
  const std::vector<int64_t> cuts = {0, 1, 6, 77777, 155557, n};
  for (size_t piece = 0; piece + 1 < cuts.size(); ++piece) {
    const int64_t begin = cuts[piece], size = cuts[piece + 1] - begin;
    Cpu().RandomUniform(0, kFloat32, uniform.data() + begin, size, 5, 11 + begin, 0.0f, 1.0f);
    Cpu().RandomNormal(0, kFloat32, normal.data() + begin, size, 5, 11 + begin, 0.0f, 1.0f);
  }
  SetCpuDeviceCount(original);
  EXPECT_EQ(uniform, whole_uniform);
  EXPECT_EQ(normal, whole_normal);
  // Another seed gives other numbers.
  Cpu().RandomUniform(0, kFloat32, uniform.data(), n, 6, 11, 0.0f, 1.0f);
  EXPECT_NE(uniform, whole_uniform);
}

TEST(CpuBackendTest, RandomDistributionsHaveTheRightMoments) {
  const int64_t n = 1 << 20;
  std::vector<float> u(n), z(n);
  Cpu().RandomUniform(0, kFloat32, u.data(), n, 42, 0, -1.0f, 3.0f);
  Cpu().RandomNormal(0, kFloat32, z.data(), n, 42, 0, 1.5f, 0.5f);
  auto moments = [](const std::vector<float>& v) {
    double sum = 0, sum_sq = 0;
    for (float x : v) sum += x;
    const double mean = sum / v.size();
    for (float x : v) sum_sq += (x - mean) * (x - mean);
    return std::make_pair(mean, sum_sq / (v.size() - 1));
  };
  const auto [u_mean, u_var] = moments(u);
  const auto [z_mean, z_var] = moments(z);
  // Five standard errors: mean error sigma / sqrt(n); variance error ~ sigma^2 sqrt(2 / n)
  // (uniform: sqrt(4/5) instead of sqrt(2)).
  const double u_sigma2 = 16.0 / 12.0;
  EXPECT_NEAR(u_mean, 1.0, 5 * std::sqrt(u_sigma2 / n));
  EXPECT_NEAR(u_var, u_sigma2, 5 * u_sigma2 * std::sqrt(0.8 / n));
  EXPECT_NEAR(z_mean, 1.5, 5 * 0.5 / std::sqrt(n));
  EXPECT_NEAR(z_var, 0.25, 5 * 0.25 * std::sqrt(2.0 / n));
  EXPECT_GE(*std::min_element(u.begin(), u.end()), -1.0f);
  EXPECT_LT(*std::max_element(u.begin(), u.end()), 3.0f);
  // Tails: about 0.27% of a normal lies beyond three standard deviations.
  const double beyond =
      std::count_if(z.begin(), z.end(), [](float x) { return std::abs(x - 1.5f) > 1.5f; }) /
      static_cast<double>(n);
  EXPECT_NEAR(beyond, 0.0027, 0.0005);
}

TEST(CpuBackendTest, RandomUniformStaysBelowHigh) {
  // With high one ulp above low, low + (high - low) * u rounds up to high for about half
  // of the u in [0, 1); the interval is half-open, so every value must be low.
  const float low = 1.0f, high = std::nextafter(1.0f, 2.0f);
  std::vector<float> values(1000);
  Cpu().RandomUniform(0, kFloat32, values.data(), 1000, 8, 0, low, high);
  for (float v : values) ASSERT_EQ(v, low);
}

TYPED_TEST(ReducedFloatTest, GathersAndScatterAdds) {
  using T = TypeParam;
  const DType dtype = DTypeOf<T>::value;
  const int64_t outer = 7, dim = 13, idx_dim = 40, inner = 5;
  std::vector<T> src = Rounded<T>(RandomFloats(outer * dim * inner, -1, 1, 91));
  const std::vector<float> src32 = Widened(src);
  std::vector<int64_t> idx = RandomInts(outer * idx_dim * inner, 0, dim - 1, 92);
  std::vector<T> gathered(idx.size());
  GatherKernel(Device::Cpu(0), dtype, gathered.data(), src.data(), idx.data(), outer, dim, idx_dim,
               inner, "test");
  for (size_t e = 0; e < idx.size(); ++e) {
    const int64_t o = e / (idx_dim * inner), i = e % inner;
    ASSERT_EQ(gathered[e].bits, src[(o * dim + idx[e]) * inner + i].bits);
  }
  // ScatterAdd with repeated indices: PyTorch rounds after each add, so the result is within
  // the tolerance of the float32 sums, scaled by the adds per element (idx_dim / dim ~ 3).
  std::vector<T> dst = src;
  std::vector<float> dst32 = src32;
  const std::vector<float> gathered32 = Widened(gathered);
  ScatterAddKernel(Device::Cpu(0), kFloat32, dst32.data(), gathered32.data(), idx.data(), outer,
                   dim, idx_dim, inner);
  ScatterAddKernel(Device::Cpu(0), dtype, dst.data(), gathered.data(), idx.data(), outer, dim,
                   idx_dim, inner);
  for (size_t i = 0; i < dst.size(); ++i) ASSERT_TRUE(CloseFor<T>(dst32[i], dst[i], 8.0f)) << i;
  // Columns: one add per element, rounded once.
  const int64_t rows = 1000, cols = 9;
  std::vector<T> table = Rounded<T>(RandomFloats(rows * cols, -1, 1, 93));
  std::vector<float> table32 = Widened(table);
  std::vector<int64_t> column = RandomInts(rows, 0, cols - 1, 94);
  std::vector<T> picked(rows);
  GatherColumnsKernel(Device::Cpu(0), dtype, picked.data(), table.data(), column.data(), rows, cols,
                      "test");
  for (int64_t r = 0; r < rows; ++r) ASSERT_EQ(picked[r].bits, table[r * cols + column[r]].bits);
  const std::vector<float> picked32 = Widened(picked);
  ScatterAddColumnsKernel(Device::Cpu(0), kFloat32, table32.data(), picked32.data(), column.data(),
                          rows, cols);
  ScatterAddColumnsKernel(Device::Cpu(0), dtype, table.data(), picked.data(), column.data(), rows,
                          cols);
  for (size_t i = 0; i < table.size(); ++i) ASSERT_TRUE(IsRounded(table32[i], table[i]));
}

TYPED_TEST(ReducedFloatTest, RandomDrawsAreTheFloat32DrawsRounded) {
  using T = TypeParam;
  const DType dtype = DTypeOf<T>::value;
  const int64_t n = 100001;
  std::vector<float> uniform32(n), normal32(n);
  std::vector<T> uniform(n), normal(n);
  // [0, 1): many float32 draws round up to 1 in 16 bits; they take the value below 1.
  Cpu().RandomUniform(0, kFloat32, uniform32.data(), n, 5, 3, 0.0, 1.0);
  Cpu().RandomUniform(0, dtype, uniform.data(), n, 5, 3, 0.0, 1.0);
  const float below_one = std::is_same_v<T, BFloat16> ? 1.0f - 1.0f / 256 : 1.0f - 1.0f / 2048;
  int64_t clamped = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (static_cast<float>(T(uniform32[i])) >= 1.0f) {
      ++clamped;
      ASSERT_EQ(static_cast<float>(uniform[i]), below_one);
    } else {
      ASSERT_TRUE(IsRounded(uniform32[i], uniform[i])) << i;
    }
  }
  EXPECT_GT(clamped, 0);
  Cpu().RandomNormal(0, kFloat32, normal32.data(), n, 5, 3, 1.0, 2.0);
  Cpu().RandomNormal(0, dtype, normal.data(), n, 5, 3, 1.0, 2.0);
  for (int64_t i = 0; i < n; ++i) ASSERT_TRUE(IsRounded(normal32[i], normal[i])) << i;
}

}  // namespace
}  // namespace tandem
