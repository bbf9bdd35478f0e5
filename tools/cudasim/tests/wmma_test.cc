// cudasim's <mma.h>: WMMA tiles multiply as the header documents (16-bit products exact, float
// sums in k order, so bitwise equal to the host loop below) in every layout and both 16-bit
// types, and the misuses a GPU would fault on or leave undefined fail the kernel.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <vector>

#include "tools/cudasim/float16.h"
#include "tools/cudasim/tests/wmma_kernels.h"

namespace cudasim_tests {
namespace {

using cudasim::internal::BFloat16ToFloat;
using cudasim::internal::FloatToBFloat16;
using cudasim::internal::FloatToHalf;
using cudasim::internal::HalfToFloat;

template <typename T>
T* DeviceCopy(const std::vector<T>& host) {
  T* device = nullptr;
  EXPECT_EQ(cudaMalloc(&device, host.size() * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
            cudaSuccess);
  return device;
}

template <typename T>
std::vector<T> HostCopy(const T* device, size_t n) {
  std::vector<T> host(n);
  EXPECT_EQ(cudaMemcpy(host.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

TEST(WmmaTest, GemmTilesMatchTheHostInEveryLayout) {
  const int m = 32, n = 48, k = 64;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
  for (const Wmma16 type : {Wmma16::kHalf, Wmma16::kBFloat16}) {
    const auto round = [type](float x) {
      return type == Wmma16::kHalf ? FloatToHalf(x) : FloatToBFloat16(x);
    };
    const auto widen = [type](uint16_t x) {
      return type == Wmma16::kHalf ? HalfToFloat(x) : BFloat16ToFloat(x);
    };
    // Logical a[i][p], b[p][j] as bits; c as floats.
    std::vector<uint16_t> a(m * k), b(k * n);
    std::vector<float> c(m * n);
    for (uint16_t& x : a) x = round(dist(rng));
    for (uint16_t& x : b) x = round(dist(rng));
    for (float& x : c) x = dist(rng);
    std::vector<float> expected(m * n);
    for (int i = 0; i < m; ++i) {
      for (int j = 0; j < n; ++j) {
        float sum = c[i * n + j];
        for (int p = 0; p < k; ++p) sum += widen(a[i * k + p]) * widen(b[p * n + j]);
        expected[i * n + j] = sum;
      }
    }
    for (const bool a_row : {true, false}) {
      for (const bool b_row : {true, false}) {
        std::vector<uint16_t> a_memory(m * k), b_memory(k * n);
        for (int i = 0; i < m; ++i) {
          for (int p = 0; p < k; ++p) a_memory[a_row ? i * k + p : p * m + i] = a[i * k + p];
        }
        for (int p = 0; p < k; ++p) {
          for (int j = 0; j < n; ++j) b_memory[b_row ? p * n + j : j * k + p] = b[p * n + j];
        }
        for (const bool col_store : {false, true}) {
          uint16_t* da = DeviceCopy(a_memory);
          uint16_t* db = DeviceCopy(b_memory);
          float* dc = DeviceCopy(c);
          float* dd = nullptr;
          ASSERT_EQ(cudaMalloc(&dd, m * n * sizeof(float)), cudaSuccess);
          ASSERT_EQ(WmmaGemm(type, da, a_row, db, b_row, dc, dd, m, n, k, col_store), cudaSuccess);
          EXPECT_EQ(HostCopy(dd, m * n), expected)
              << (type == Wmma16::kHalf ? "half" : "bfloat16") << " a " << (a_row ? "row" : "col")
              << "-major, b " << (b_row ? "row" : "col") << "-major, stored "
              << (col_store ? "column" : "row") << "-major";
          cudaFree(da);
          cudaFree(db);
          cudaFree(dc);
          cudaFree(dd);
        }
      }
    }
  }
}

// Without a __syncwarp after store_matrix_sync a lane reads elements that other lanes store,
// perhaps before they did: the simulator shares the stores out between the lanes, so the bug
// shows as NaN (poisoned shared memory) instead of passing by luck.
TEST(WmmaTest, ReadingAStoredTileNeedsASyncwarp) {
  float* out = nullptr;
  ASSERT_EQ(cudaMalloc(&out, 256 * sizeof(float)), cudaSuccess);
  ASSERT_EQ(WmmaStoreThenRead(out, /*sync=*/true), cudaSuccess);
  std::vector<float> expected(256);
  for (int i = 0; i < 256; ++i) expected[i] = static_cast<float>((i + 17) % 256);
  EXPECT_EQ(HostCopy(out, 256), expected);
  ASSERT_EQ(WmmaStoreThenRead(out, /*sync=*/false), cudaSuccess);
  int stale = 0;
  for (float x : HostCopy(out, 256)) stale += std::isnan(x);
  EXPECT_GT(stale, 0) << "every lane saw every other lane's stores without a __syncwarp";
  cudaFree(out);
}

// A kernel failure is sticky (as on a GPU), so each misuse runs in a child process.
void ExpectMisuseFails(WmmaMisuse misuse, const char* message) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        std::vector<uint16_t> a(512, FloatToHalf(1.0f));
        uint16_t* da = DeviceCopy(a);
        float* dd = nullptr;
        cudaMalloc(&dd, 256 * sizeof(float));
        WmmaMisused(misuse, da, dd);
        std::exit(cudaDeviceSynchronize() == cudaErrorLaunchFailure ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), message);
}

TEST(WmmaDeathTest, HalfAWarpAtMmaSyncFails) {
  ExpectMisuseFails(WmmaMisuse::kHalfWarpMma,
                    "returned from the kernel while lanes 0x0000.... of its warp "
                    "wait for it in wmma::mma_sync");
}

TEST(WmmaDeathTest, AWarpOfFewerThan32ThreadsFails) {
  ExpectMisuseFails(WmmaMisuse::kPartialWarp,
                    "wmma::load_matrix_sync: mask 0xffffffff names lanes that warp 1 does not "
                    "have");
}

TEST(WmmaDeathTest, LanesPassingDifferentPointersFail) {
  ExpectMisuseFails(WmmaMisuse::kLaneDependentPointer,
                    "wmma::load_matrix_sync: lane .* passed different pointers");
}

TEST(WmmaDeathTest, AMisalignedPointerFails) {
  ExpectMisuseFails(WmmaMisuse::kMisalignedPointer,
                    "wmma::load_matrix_sync: the pointer must be 32-byte");
}

TEST(WmmaDeathTest, ALaneDependentFragmentEditFails) {
  ExpectMisuseFails(WmmaMisuse::kLaneDependentFragment,
                    "wmma::mma_sync: lane .* passed different fragments");
}

}  // namespace
}  // namespace cudasim_tests
