#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include "tools/cudasim/tests/wmma_kernels.h"

namespace cudasim_tests {
namespace {

using namespace nvcuda;  // NOLINT: wmma's names are long enough

// A 16 x 16 float tile of static shared memory, aligned for WMMA (a struct: the simulator's
// rewrite step finds `__shared__ Type name;` declarations to poison them).
struct alignas(32) Aligned256 {
  float v[256];
};

template <typename T, typename LayoutA, typename LayoutB>
__global__ void WmmaGemmKernel(const T* a, const T* b, const float* c, float* d, int m, int n,
                               int k, bool store_col_major) {
  __shared__ Aligned256 staged;
  constexpr bool kARow = std::is_same<LayoutA, wmma::row_major>::value;
  constexpr bool kBRow = std::is_same<LayoutB, wmma::row_major>::value;
  const int row0 = blockIdx.y * 16, col0 = blockIdx.x * 16;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::load_matrix_sync(acc, c + row0 * n + col0, n, wmma::mem_row_major);
  for (int p = 0; p < k; p += 16) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, LayoutA> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, LayoutB> fb;
    wmma::load_matrix_sync(fa, kARow ? a + row0 * k + p : a + p * m + row0, kARow ? k : m);
    wmma::load_matrix_sync(fb, kBRow ? b + p * n + col0 : b + col0 * k + p, kBRow ? n : k);
    wmma::mma_sync(acc, fa, fb, acc);
  }
  if (!store_col_major) {
    wmma::store_matrix_sync(d + row0 * n + col0, acc, n, wmma::mem_row_major);
    return;
  }
  wmma::store_matrix_sync(staged.v, acc, 16, wmma::mem_col_major);
  __syncwarp();
  for (int x = threadIdx.x; x < 256; x += 32) {
    const int r = x % 16, col = x / 16;
    d[(row0 + r) * n + col0 + col] = staged.v[col * 16 + r];
  }
}

template <typename T>
cudaError_t LaunchGemm(const uint16_t* a, bool a_row_major, const uint16_t* b, bool b_row_major,
                       const float* c, float* d, int m, int n, int k, bool store_col_major) {
  const T* ta = reinterpret_cast<const T*>(a);
  const T* tb = reinterpret_cast<const T*>(b);
  const dim3 grid(n / 16, m / 16);
  if (a_row_major && b_row_major) {
    WmmaGemmKernel<T, wmma::row_major, wmma::row_major>
        <<<grid, 32>>>(ta, tb, c, d, m, n, k, store_col_major);
  } else if (a_row_major) {
    WmmaGemmKernel<T, wmma::row_major, wmma::col_major>
        <<<grid, 32>>>(ta, tb, c, d, m, n, k, store_col_major);
  } else if (b_row_major) {
    WmmaGemmKernel<T, wmma::col_major, wmma::row_major>
        <<<grid, 32>>>(ta, tb, c, d, m, n, k, store_col_major);
  } else {
    WmmaGemmKernel<T, wmma::col_major, wmma::col_major>
        <<<grid, 32>>>(ta, tb, c, d, m, n, k, store_col_major);
  }
  return cudaGetLastError();
}

__global__ void StoreThenReadKernel(float* out, bool sync) {
  __shared__ Aligned256 tile;
  __shared__ Aligned256 values;
  for (int x = threadIdx.x; x < 256; x += 32) values.v[x] = static_cast<float>(x);
  __syncwarp();
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::load_matrix_sync(acc, values.v, 16, wmma::mem_row_major);
  wmma::store_matrix_sync(tile.v, acc, 16, wmma::mem_row_major);
  if (sync) __syncwarp();
  for (int x = threadIdx.x; x < 256; x += 32) out[x] = tile.v[(x + 17) % 256];
}

__global__ void MisuseKernel(WmmaMisuse misuse, const __half* a, float* d) {
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::fill_fragment(acc, 0.0f);
  const int lane = threadIdx.x % 32;
  const __half* from = a;
  if (misuse == WmmaMisuse::kLaneDependentPointer && lane >= 16) from = a + 256;
  if (misuse == WmmaMisuse::kMisalignedPointer) from = a + 1;
  wmma::load_matrix_sync(fa, from, 16);
  wmma::load_matrix_sync(fb, a, 16);
  if (misuse == WmmaMisuse::kLaneDependentFragment && lane == 0) fa.x[0] = __float2half(3.0f);
  if (misuse == WmmaMisuse::kHalfWarpMma && lane >= 16) return;
  wmma::mma_sync(acc, fa, fb, acc);
  wmma::store_matrix_sync(d, acc, 16, wmma::mem_row_major);
}

}  // namespace

cudaError_t WmmaGemm(Wmma16 type, const uint16_t* a, bool a_row_major, const uint16_t* b,
                     bool b_row_major, const float* c, float* d, int m, int n, int k,
                     bool store_col_major) {
  if (type == Wmma16::kHalf) {
    return LaunchGemm<__half>(a, a_row_major, b, b_row_major, c, d, m, n, k, store_col_major);
  }
  return LaunchGemm<__nv_bfloat16>(a, a_row_major, b, b_row_major, c, d, m, n, k, store_col_major);
}

cudaError_t WmmaStoreThenRead(float* out, bool sync) {
  StoreThenReadKernel<<<1, 32>>>(out, sync);
  return cudaGetLastError();
}

cudaError_t WmmaMisused(WmmaMisuse misuse, const uint16_t* a, float* d) {
  const int threads = misuse == WmmaMisuse::kPartialWarp ? 48 : 32;
  MisuseKernel<<<1, threads>>>(misuse, reinterpret_cast<const __half*>(a), d);
  return cudaGetLastError();
}

}  // namespace cudasim_tests
