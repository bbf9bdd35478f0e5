// Kernels that exercise cudasim's <mma.h> (tools/cudasim/tests/wmma_test.cc): tensor-core GEMM
// tiles in every layout, and kernels that misuse WMMA in the ways the simulator must report.
// Host API only; 16-bit operands are passed as their bits. Every function queues on the default
// stream and returns the launch's cudaGetLastError().
#ifndef TANDEM_TOOLS_CUDASIM_TESTS_WMMA_KERNELS_H_
#define TANDEM_TOOLS_CUDASIM_TESTS_WMMA_KERNELS_H_

#include <cuda_runtime.h>

#include <cstdint>

namespace cudasim_tests {

enum class Wmma16 { kHalf, kBFloat16 };

// d[m x n] = c + a[m x k] b[k x n] (m, n, k multiples of 16; c and d float, row-major, leading
// dimension n), one warp per 16 x 16 tile of d, k in steps of 16. a is row-major (leading
// dimension k) when `a_row_major`, else column-major (leading dimension m); b row-major (n) when
// `b_row_major`, else column-major (k). d is stored column-major through a shared-memory tile
// when `store_col_major` (leading dimension m).
cudaError_t WmmaGemm(Wmma16 type, const uint16_t* a, bool a_row_major, const uint16_t* b,
                     bool b_row_major, const float* c, float* d, int m, int n, int k,
                     bool store_col_major);

// One warp stores a 16 x 16 accumulator of the values 0..255 to shared memory, then each lane
// reads the elements other lanes stored: out[i] = tile[(i + 17) % 256] for i in 0..255. Correct
// with the __syncwarp between the two when `sync`; without it a lane may read elements that
// another lane has not stored yet (poisoned shared memory: NaN), as on a GPU.
cudaError_t WmmaStoreThenRead(float* out, bool sync);

// Misuses that fail the kernel (a sticky cudaErrorLaunchFailure, the reason on stderr):
enum class WmmaMisuse {
  kHalfWarpMma,            // lanes 0..15 call mma_sync, lanes 16..31 return
  kPartialWarp,            // a block of 48 threads: its second warp has 16 lanes
  kLaneDependentPointer,   // lanes 16..31 load from another address than lanes 0..15
  kMisalignedPointer,      // a pointer 2 bytes past a 32-byte boundary
  kLaneDependentFragment,  // lane 0 edits x[0] of its fragment before mma_sync
};
cudaError_t WmmaMisused(WmmaMisuse misuse, const uint16_t* a, float* d);

}  // namespace cudasim_tests

#endif  // TANDEM_TOOLS_CUDASIM_TESTS_WMMA_KERNELS_H_
