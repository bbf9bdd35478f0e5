// oneDNN matrix products for the CPU backend: bfloat16 (and float16 where the CPU has it) GEMM
// with float accumulation, and float32 for the shapes where oneDNN beats OpenBLAS. Debian's
// OpenBLAS has no bfloat16 GEMM; oneDNN's runs the AVX512-BF16 dot-product instructions, about
// twice float32's speed per core. CpuBackend::Gemm calls OneDnnGemm first and falls back to
// its own path when it returns false (no oneDNN kernel for this dtype, CPU or layout).
//
//   if (!OneDnnGemm(index, kBFloat16, false, true, m, n, k, 1.0, a, k, 0, b, k, 0, 0.0, c, n,
//                   0, 1)) {
//     ...  // convert to float and use OpenBLAS
//   }
//
// Threads: oneDNN never starts threads of its own here; a GEMM is cut into blocks that depend
// only on its shape, and the device's pool (ParallelFor) runs one single-threaded oneDNN call
// per block, so results are bitwise the same whatever the number of threads.
#ifndef TANDEM_TENSOR_CPU_INTERNAL_ONEDNN_MATMUL_H_
#define TANDEM_TENSOR_CPU_INTERNAL_ONEDNN_MATMUL_H_

#include <cstdint>
#include <string>

#include "tensor/base/dtype.h"
#include "tensor/runtime/allocator.h"

namespace tandem {

// Whether oneDNN has a matmul kernel for `dtype` on this CPU that is not its slow reference
// code (checked once per dtype with a small product): float32 always; bfloat16 on CPUs with
// AVX512 (native with AVX512-BF16 or AMX, emulated on plain AVX512); float16 not in oneDNN
// 2.6 (it has no float16 matmul on CPUs), so callers convert to float.
bool OneDnnSupports(DType dtype);

// Backend::Gemm's contract (tensor/runtime/backend.h) for float32, bfloat16 and float16:
//   C_b = alpha * op(A_b) * op(B_b) + beta * C_b, row-major, b in [0, batch),
// accumulating in float and rounding C once. Splits the work over cpu:`index`'s pool in
// blocks that depend only on (m, n, k, batch). Returns false, having written nothing, where
// oneDNN cannot do it (dtype or CPU unsupported, a layout oneDNN only has reference code
// for) and for arguments the caller must reject (negative sizes, overlapping rows,
// several products into one C): the caller's own path then computes or reports the error.
bool OneDnnGemm(int index, DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                double alpha, const void* a, int64_t lda, int64_t stride_a, const void* b,
                int64_t ldb, int64_t stride_b, double beta, void* c, int64_t ldc, int64_t stride_c,
                int64_t batch);

// C = op(A) * op(B) for 16-bit A (`dtype` bfloat16 or float16) and B into a float32 C, one
// product, split over cpu:`index`'s pool as OneDnnGemm: the dot products accumulate in float and
// C is never rounded to 16 bits. B is stored as `b_dtype`: `dtype`, or float32, which each block
// of C rounds to `dtype` (exactly as a cast) into a buffer from `allocator` for its own columns
// of op(B) just before its product: the buffers in use at once hold the pool's blocks, not a
// whole 16-bit copy of B. Returns false, having written nothing, where oneDNN has no kernel for
// it (float16 in oneDNN 2.6), for a float32 B where C is cut into blocks of rows (every block
// would need all of B: the caller's own cast does better), and for arguments the caller must
// reject.
bool OneDnnGemmFloatOutput(int index, DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n,
                           int64_t k, const void* a, int64_t lda, DType b_dtype, const void* b,
                           int64_t ldb, float* c, int64_t ldc, Allocator& allocator);

// One product on the calling thread, unsplit: C = alpha * op(A) * op(B) + beta * C with
// m, n, k >= 1 and valid leading dimensions (at least the row length). Returns false where
// oneDNN has no non-reference kernel. For tests and benchmarks that choose their own split.
bool OneDnnMatmul(DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                  float alpha, const void* a, int64_t lda, const void* b, int64_t ldb, float beta,
                  void* c, int64_t ldc);

// The oneDNN implementation OneDnnMatmul would use for that product ("brg:avx512_core_bf16",
// "gemm:jit", ...), or "" where it has none that is not reference code. For benchmarks.
std::string OneDnnMatmulImplementation(DType dtype, bool trans_a, bool trans_b, int64_t m,
                                       int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc);

// Which float32 GEMMs CpuBackend::Gemm sends to oneDNN rather than OpenBLAS. kMeasured (the
// default) is the choice made from onednn_benchmark's figures (see onednn_matmul.cc);
// kNever and kAlways let a benchmark time both paths through the backend.
enum class OneDnnFloat32Policy { kMeasured, kNever, kAlways };
void SetOneDnnFloat32Policy(OneDnnFloat32Policy policy);
// Whether CpuBackend::Gemm should try oneDNN for this float32 product.
bool OneDnnPreferredForFloat32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                               int64_t batch);

}  // namespace tandem

#endif  // TANDEM_TENSOR_CPU_INTERNAL_ONEDNN_MATMUL_H_
