// cudasim's cuBLAS: SGEMM and DGEMM on OpenBLAS, queued on the handle's stream like cuBLAS's
// kernels; GemmEx on bfloat16/float16 as OpenBLAS's SGEMM of the widened operands, rounded once
// (a float C, not at all).
#include <cblas.h>
#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "tools/cudasim/counters.h"
#include "tools/cudasim/float16.h"
#include "tools/cudasim/runtime_internal.h"

struct cublasContext {
  int device = 0;
  cudaStream_t stream = nullptr;
  cublasMath_t mode = CUBLAS_DEFAULT_MATH;
  // cublasSetWorkspace's buffer for the current stream; null: cuBLAS's default pool (which
  // cublasSetStream restores, as on a GPU).
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // Note [cudasim cuBLAS workspaces]: the streams that ran GEMMs on the default pool, and the
  // stream each user workspace served. Guarded by the handle's users (cuBLAS handles are not
  // thread-safe; Tandem locks each).
  std::set<cudaStream_t> default_pool_streams;
  std::map<void*, cudaStream_t> workspace_streams;
};

namespace {

using cudasim::internal::BFloat16ToFloat;
using cudasim::internal::FloatToBFloat16;
using cudasim::internal::FloatToHalf;
using cudasim::internal::HalfToFloat;
using cudasim::internal::RoundToTf32;

std::mutex& HandlesMutex() {
  static std::mutex* mutex = new std::mutex;
  return *mutex;
}
std::set<cublasHandle_t>& Handles() {
  static std::set<cublasHandle_t>* handles = new std::set<cublasHandle_t>;
  return *handles;
}

bool Live(cublasHandle_t handle) {
  std::lock_guard<std::mutex> lock(HandlesMutex());
  return Handles().count(handle) != 0;
}

cublasStatus_t Invalid(const std::string& message) {
  std::fprintf(stderr, "cudasim: cuBLAS: CUBLAS_STATUS_INVALID_VALUE: %s\n", message.c_str());
  return CUBLAS_STATUS_INVALID_VALUE;
}

// Note [cudasim cuBLAS workspaces]: cuBLAS runs a handle on any stream, but with its default
// workspace pool on more than one stream its results are not guaranteed repeatable, and CUDA
// Graph capture needs each stream's workspace to be its own (cuBLAS documentation,
// "Results reproducibility", "CUDA Graphs support"). A GPU runs such code and is silently
// nondeterministic; cudasim refuses it, so that the mistake shows in CI: a GEMM on a second
// stream through the default pool, or through a workspace another stream used, fails with
// CUBLAS_STATUS_NOT_SUPPORTED and says why.
cublasStatus_t CheckWorkspace(const char* call, cublasHandle_t handle) {
  const cudaStream_t stream = handle->stream;
  if (handle->workspace == nullptr) {
    handle->default_pool_streams.insert(stream);
    if (handle->default_pool_streams.size() > 1) {
      std::fprintf(stderr,
                   "cudasim: cuBLAS: CUBLAS_STATUS_NOT_SUPPORTED: %s on a second stream with the "
                   "handle's default workspace pool: results across streams are not repeatable "
                   "and CUDA Graph capture is unsafe; give each stream its own workspace with "
                   "cublasSetWorkspace after cublasSetStream\n",
                   call);
      return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    return CUBLAS_STATUS_SUCCESS;
  }
  auto [it, inserted] = handle->workspace_streams.emplace(handle->workspace, stream);
  if (!inserted && it->second != stream) {
    std::fprintf(stderr,
                 "cudasim: cuBLAS: CUBLAS_STATUS_NOT_SUPPORTED: %s with a workspace that another "
                 "stream used: work on two streams would race on it; give each stream its own "
                 "workspace\n",
                 call);
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  return CUBLAS_STATUS_SUCCESS;
}

// cuBLAS's argument checks for C = alpha op(A) op(B) + beta C (column-major).
cublasStatus_t CheckGemm(const char* call, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                         int k, int lda, int ldb, int ldc) {
  if (ta == CUBLAS_OP_C || tb == CUBLAS_OP_C) {
    return Invalid(std::string(call) +
                   ": CUBLAS_OP_C is the same as CUBLAS_OP_T for real "
                   "data; cudasim takes only N and T");
  }
  if (m < 0 || n < 0 || k < 0) {
    return Invalid(std::string(call) + ": m, n, k = " + std::to_string(m) + ", " +
                   std::to_string(n) + ", " + std::to_string(k) + ": expected sizes >= 0");
  }
  const int a_rows = ta == CUBLAS_OP_N ? m : k;
  const int b_rows = tb == CUBLAS_OP_N ? k : n;
  if (lda < std::max(1, a_rows) || ldb < std::max(1, b_rows) || ldc < std::max(1, m)) {
    return Invalid(std::string(call) +
                   ": leading dimensions lda, ldb, ldc = " + std::to_string(lda) + ", " +
                   std::to_string(ldb) + ", " + std::to_string(ldc) + " for op(A) " +
                   std::to_string(m) + "x" + std::to_string(k) + " and op(B) " + std::to_string(k) +
                   "x" + std::to_string(n) + ": expected at least " + std::to_string(a_rows) +
                   ", " + std::to_string(b_rows) + ", " + std::to_string(m));
  }
  return CUBLAS_STATUS_SUCCESS;
}

// A rounded copy of a column-major rows x cols operand with leading dimension ld.
std::vector<float> Tf32Copy(const float* x, int rows, int cols, int ld) {
  std::vector<float> copy(cols == 0 ? 0 : static_cast<size_t>(ld) * (cols - 1) + rows);
  for (int c = 0; c < cols; ++c) {
    for (int r = 0; r < rows; ++r) {
      const size_t at = static_cast<size_t>(c) * ld + r;
      copy[at] = RoundToTf32(x[at]);
    }
  }
  return copy;
}

// A GEMM's work for the counters (counters.h): 2 m n k FLOPs per product, and its operands
// read once and C written (and read where beta != 0), as a roofline counts a GEMM.
double GemmFlops(long long m, long long n, long long k, long long batch) {
  return 2.0 * m * n * k * batch;
}
double GemmBytes(long long m, long long n, long long k, long long batch, size_t ab_size,
                 size_t c_size, bool reads_c) {
  return static_cast<double>(batch) * (static_cast<double>(ab_size) * (m * k + k * n) +
                                       static_cast<double>(c_size) * m * n * (reads_c ? 2 : 1));
}

CBLAS_TRANSPOSE Trans(cublasOperation_t op) {
  return op == CUBLAS_OP_N ? CblasNoTrans : CblasTrans;
}

// OpenBLAS's GEMM for T.
void ColumnMajorGemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha,
                     const float* a, int lda, const float* b, int ldb, float beta, float* c,
                     int ldc) {
  cblas_sgemm(CblasColMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
void ColumnMajorGemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, double alpha,
                     const double* a, int lda, const double* b, int ldb, double beta, double* c,
                     int ldc) {
  cblas_dgemm(CblasColMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// T is float (SGEMM) or double (DGEMM).
template <typename T>
cublasStatus_t Queue(const char* name, cublasHandle_t handle, cublasOperation_t ta,
                     cublasOperation_t tb, int m, int n, int k, T alpha, const T* a, int lda,
                     long long stride_a, const T* b, int ldb, long long stride_b, T beta, T* c,
                     int ldc, long long stride_c, int batch) {
  const int previous = cudasim::internal::CurrentDevice();
  cudaSetDevice(handle->device);
  cudasim::internal::Stream* stream = cudasim::internal::ResolveStream(handle->stream);
  cudaSetDevice(previous);
  if (stream == nullptr) return CUBLAS_STATUS_EXECUTION_FAILED;
  if (cudasim::internal::StickyError(stream->device()) != cudaSuccess) {
    return CUBLAS_STATUS_EXECUTION_FAILED;
  }
  if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;
  // The TF32 mode changes single-precision GEMMs only; DGEMM ignores it, as on a GPU.
  const bool tf32 = std::is_same_v<T, float> &&
                    (handle->mode & ~CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION) ==
                        CUBLAS_TF32_TENSOR_OP_MATH;
  // cuBLAS launches one kernel per GEMM call.
  const cudaError_t queued = stream->EnqueueLaunch(name, 0, 0, [=] {
    for (int i = 0; i < batch; ++i) {
      T* ci = c + i * stride_c;
      if (k == 0 || alpha == T(0)) {
        // BLAS: C = beta C, and with beta == 0 C is not read (NaN in it does not survive).
        for (int col = 0; col < n; ++col) {
          for (int row = 0; row < m; ++row) {
            T& x = ci[static_cast<long long>(col) * ldc + row];
            x = beta == T(0) ? T(0) : beta * x;
          }
        }
        continue;
      }
      const T* ai = a + i * stride_a;
      const T* bi = b + i * stride_b;
      std::vector<float> a32, b32;  // TF32-rounded operands (float only)
      if constexpr (std::is_same_v<T, float>) {
        if (tf32) {
          a32 = Tf32Copy(ai, ta == CUBLAS_OP_N ? m : k, ta == CUBLAS_OP_N ? k : m, lda);
          b32 = Tf32Copy(bi, tb == CUBLAS_OP_N ? k : n, tb == CUBLAS_OP_N ? n : k, ldb);
          ai = a32.data();
          bi = b32.data();
        }
      }
      ColumnMajorGemm(Trans(ta), Trans(tb), m, n, k, alpha, ai, lda, bi, ldb, beta, ci, ldc);
    }
  });
  if (queued == cudaSuccess && !stream->capturing()) {
    cudasim::internal::CountWork(name, GemmFlops(m, n, k, batch),
                                 GemmBytes(m, n, k, batch, sizeof(T), sizeof(T), beta != T(0)),
                                 std::is_same_v<T, double> ? "fp64"
                                 : tf32                    ? "tf32"
                                                           : "fp32");
  }
  // A GEMM captured into an invalidated stream capture fails as cuBLAS's kernel launch would.
  return queued == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

// The four GEMM entry points: cuBLAS's argument checks (the handle, then the sizes and leading
// dimensions, then the batch count), then Queue.
template <typename T>
cublasStatus_t CheckedGemm(const char* name, cublasHandle_t handle, cublasOperation_t ta,
                           cublasOperation_t tb, int m, int n, int k, const T* alpha, const T* a,
                           int lda, long long stride_a, const T* b, int ldb, long long stride_b,
                           const T* beta, T* c, int ldc, long long stride_c, int batch) {
  if (!Live(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (const cublasStatus_t workspace = CheckWorkspace(name, handle);
      workspace != CUBLAS_STATUS_SUCCESS) {
    return workspace;
  }
  const cublasStatus_t status = CheckGemm(name, ta, tb, m, n, k, lda, ldb, ldc);
  if (status != CUBLAS_STATUS_SUCCESS) return status;
  if (batch < 0) return Invalid(std::string(name) + ": batch_count < 0");
  return Queue(name, handle, ta, tb, m, n, k, *alpha, a, lda, stride_a, b, ldb, stride_b, *beta, c,
               ldc, stride_c, batch);
}

// ---- GemmEx: 16-bit operands, float compute ----
// Note [cudasim GemmEx]: the simulator's definition of a 16-bit GEMM, which the backend's tests
// hold the GPU to: A and B widened to float (exact), OpenBLAS's SGEMM with float alpha and beta
// on them and on C widened (every product of two bfloat16 or float16 values is exact in float,
// so only the float additions round), and each element of C rounded to its 16-bit type once,
// to nearest even; a float32 C (CUDA_R_32F) is stored as computed. Tensor cores also multiply
// exactly and accumulate in float, but in their own order (tiles, split-K) and with their own
// internal alignment of the addends, so a GPU's result may differ from this one by a few float
// roundings: within a 16-bit ulp or so for a 16-bit C, within float32 summation error for a
// float32 C, and a tolerance, never bitwise, compares them.

float Widen(cudaDataType type, const void* data, size_t at) {
  const uint16_t bits = static_cast<const uint16_t*>(data)[at];
  return type == CUDA_R_16BF ? BFloat16ToFloat(bits) : HalfToFloat(bits);
}

// A widened copy of a column-major rows x cols 16-bit operand with leading dimension ld.
std::vector<float> WidenCopy(cudaDataType type, const void* x, int rows, int cols, int ld) {
  std::vector<float> copy(cols == 0 ? 0 : static_cast<size_t>(ld) * (cols - 1) + rows);
  for (int c = 0; c < cols; ++c) {
    for (int r = 0; r < rows; ++r) {
      const size_t at = static_cast<size_t>(c) * ld + r;
      copy[at] = Widen(type, x, at);
    }
  }
  return copy;
}

cublasStatus_t NotSupported(const std::string& message) {
  std::fprintf(stderr, "cudasim: cuBLAS: CUBLAS_STATUS_NOT_SUPPORTED: %s\n", message.c_str());
  return CUBLAS_STATUS_NOT_SUPPORTED;
}

cublasStatus_t CheckedGemmEx(const char* name, cublasHandle_t handle, cublasOperation_t ta,
                             cublasOperation_t tb, int m, int n, int k, const void* alpha_ptr,
                             const void* a, cudaDataType a_type, int lda, long long stride_a,
                             const void* b, cudaDataType b_type, int ldb, long long stride_b,
                             const void* beta_ptr, void* c, cudaDataType c_type, int ldc,
                             long long stride_c, int batch, cublasComputeType_t compute) {
  if (!Live(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (const cublasStatus_t workspace = CheckWorkspace(name, handle);
      workspace != CUBLAS_STATUS_SUCCESS) {
    return workspace;
  }
  const cublasStatus_t status = CheckGemm(name, ta, tb, m, n, k, lda, ldb, ldc);
  if (status != CUBLAS_STATUS_SUCCESS) return status;
  if (batch < 0) return Invalid(std::string(name) + ": batch_count < 0");
  // The 16-bit rows of cuBLAS's table for CUBLAS_COMPUTE_32F: A and B of one 16-bit type, C of
  // that type or float (a float C is never rounded to 16 bits).
  if (a_type != b_type || (a_type != CUDA_R_16BF && a_type != CUDA_R_16F) ||
      (c_type != a_type && c_type != CUDA_R_32F)) {
    return NotSupported(std::string(name) + ": A, B, C types " + std::to_string(a_type) + ", " +
                        std::to_string(b_type) + ", " + std::to_string(c_type) +
                        ": cudasim takes A and B both CUDA_R_16BF (14) or both CUDA_R_16F (2), "
                        "with C of the same type or CUDA_R_32F (0); use cublasSgemm/cublasDgemm "
                        "for float and double operands");
  }
  if (compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_PEDANTIC) {
    return NotSupported(std::string(name) + ": compute type " + std::to_string(compute) +
                        ": cudasim takes CUBLAS_COMPUTE_32F (68) with 16-bit operands");
  }
  const float alpha = *static_cast<const float*>(alpha_ptr);
  const float beta = *static_cast<const float*>(beta_ptr);
  const int previous = cudasim::internal::CurrentDevice();
  cudaSetDevice(handle->device);
  cudasim::internal::Stream* stream = cudasim::internal::ResolveStream(handle->stream);
  cudaSetDevice(previous);
  if (stream == nullptr) return CUBLAS_STATUS_EXECUTION_FAILED;
  if (cudasim::internal::StickyError(stream->device()) != cudaSuccess) {
    return CUBLAS_STATUS_EXECUTION_FAILED;
  }
  if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;
  const cudaDataType type = a_type;
  const bool float_c = c_type == CUDA_R_32F;
  // cuBLAS launches one kernel per GEMM call.
  const cudaError_t queued = stream->EnqueueLaunch(name, 0, 0, [=] {
    const uint16_t* a16 = static_cast<const uint16_t*>(a);
    const uint16_t* b16 = static_cast<const uint16_t*>(b);
    for (int i = 0; i < batch; ++i) {
      uint16_t* ci = float_c ? nullptr : static_cast<uint16_t*>(c) + i * stride_c;
      float* cf = float_c ? static_cast<float*>(c) + i * stride_c : nullptr;
      // C widened (read only where beta != 0: BLAS does not read C then, so NaN in it does not
      // survive), the product added in float, then each element rounded once (a float C: not
      // at all).
      std::vector<float> c32(static_cast<size_t>(ldc) * (n - 1) + m, 0.0f);
      if (beta != 0.0f) {
        for (int col = 0; col < n; ++col) {
          for (int row = 0; row < m; ++row) {
            const size_t at = static_cast<size_t>(col) * ldc + row;
            c32[at] = float_c ? cf[at] : Widen(type, ci, at);
          }
        }
      }
      if (k > 0 && alpha != 0.0f) {
        const std::vector<float> a32 = WidenCopy(
            type, a16 + i * stride_a, ta == CUBLAS_OP_N ? m : k, ta == CUBLAS_OP_N ? k : m, lda);
        const std::vector<float> b32 = WidenCopy(
            type, b16 + i * stride_b, tb == CUBLAS_OP_N ? k : n, tb == CUBLAS_OP_N ? n : k, ldb);
        cblas_sgemm(CblasColMajor, Trans(ta), Trans(tb), m, n, k, alpha, a32.data(), lda,
                    b32.data(), ldb, beta, c32.data(), ldc);
      } else {
        for (float& x : c32) x *= beta;  // C = beta C (zeros when beta == 0: C was not read)
      }
      for (int col = 0; col < n; ++col) {
        for (int row = 0; row < m; ++row) {
          const size_t at = static_cast<size_t>(col) * ldc + row;
          if (float_c) {
            cf[at] = c32[at];
          } else {
            ci[at] = type == CUDA_R_16BF ? FloatToBFloat16(c32[at]) : FloatToHalf(c32[at]);
          }
        }
      }
    }
  });
  if (queued == cudaSuccess && !stream->capturing()) {
    cudasim::internal::CountWork(name, GemmFlops(m, n, k, batch),
                                 GemmBytes(m, n, k, batch, 2, float_c ? 4 : 2, beta != 0.0f),
                                 type == CUDA_R_16BF ? "bf16" : "fp16");
  }
  // A GEMM captured into an invalidated stream capture fails as cuBLAS's kernel launch would.
  return queued == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

}  // namespace

extern "C" {

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return CUBLAS_STATUS_NOT_INITIALIZED;
  }
  auto* context = new cublasContext;
  context->device = cudasim::internal::CurrentDevice();
  std::lock_guard<std::mutex> lock(HandlesMutex());
  Handles().insert(context);
  *handle = context;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  {
    std::lock_guard<std::mutex> lock(HandlesMutex());
    if (Handles().erase(handle) == 0) return CUBLAS_STATUS_NOT_INITIALIZED;
  }
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetVersion(cublasHandle_t handle, int* version) {
  if (!Live(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  *version = CUBLAS_VERSION;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
  if (!Live(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  // As cuBLAS does: setting the stream puts the handle back on its default workspace pool.
  handle->workspace = nullptr;
  handle->workspace_bytes = 0;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void* workspace, size_t bytes) {
  if (!Live(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (bytes > 0 && workspace == nullptr) {
    return Invalid("cublasSetWorkspace: a null workspace of " + std::to_string(bytes) + " bytes");
  }
  // cuBLAS requires 256-byte alignment (cudaMalloc's is more).
  if (reinterpret_cast<uintptr_t>(workspace) % 256 != 0) {
    return Invalid("cublasSetWorkspace: the workspace is not 256-byte aligned");
  }
  handle->workspace = bytes == 0 ? nullptr : workspace;
  handle->workspace_bytes = bytes;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t* stream) {
  if (!Live(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  *stream = handle->stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  if (!Live(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  const int base = mode & ~CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
  if (base != CUBLAS_DEFAULT_MATH && base != CUBLAS_TENSOR_OP_MATH &&
      base != CUBLAS_PEDANTIC_MATH && base != CUBLAS_TF32_TENSOR_OP_MATH) {
    return Invalid("cublasSetMathMode: unknown mode " + std::to_string(mode));
  }
  handle->mode = mode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t* mode) {
  if (!Live(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  *mode = handle->mode;
  return CUBLAS_STATUS_SUCCESS;
}

const char* cublasGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

const char* cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "the library was not initialized";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "the GPU program failed to execute";
    default:
      return "cuBLAS error";
  }
}

cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa,
                           cublasOperation_t transb, int m, int n, int k, const float* alpha,
                           const float* a, int lda, const float* b, int ldb, const float* beta,
                           float* c, int ldc) {
  return CheckedGemm("cublasSgemm", handle, transa, transb, m, n, k, alpha, a, lda, 0, b, ldb, 0,
                     beta, c, ldc, 0, 1);
}

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa,
                                         cublasOperation_t transb, int m, int n, int k,
                                         const float* alpha, const float* a, int lda,
                                         long long stride_a, const float* b, int ldb,
                                         long long stride_b, const float* beta, float* c, int ldc,
                                         long long stride_c, int batch_count) {
  return CheckedGemm("cublasSgemmStridedBatched", handle, transa, transb, m, n, k, alpha, a, lda,
                     stride_a, b, ldb, stride_b, beta, c, ldc, stride_c, batch_count);
}

cublasStatus_t cublasDgemm(cublasHandle_t handle, cublasOperation_t transa,
                           cublasOperation_t transb, int m, int n, int k, const double* alpha,
                           const double* a, int lda, const double* b, int ldb, const double* beta,
                           double* c, int ldc) {
  return CheckedGemm("cublasDgemm", handle, transa, transb, m, n, k, alpha, a, lda, 0, b, ldb, 0,
                     beta, c, ldc, 0, 1);
}

cublasStatus_t cublasDgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa,
                                         cublasOperation_t transb, int m, int n, int k,
                                         const double* alpha, const double* a, int lda,
                                         long long stride_a, const double* b, int ldb,
                                         long long stride_b, const double* beta, double* c, int ldc,
                                         long long stride_c, int batch_count) {
  return CheckedGemm("cublasDgemmStridedBatched", handle, transa, transb, m, n, k, alpha, a, lda,
                     stride_a, b, ldb, stride_b, beta, c, ldc, stride_c, batch_count);
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* a, cudaDataType a_type, int lda, const void* b,
                            cudaDataType b_type, int ldb, const void* beta, void* c,
                            cudaDataType c_type, int ldc, cublasComputeType_t compute_type,
                            cublasGemmAlgo_t algo) {
  return CheckedGemmEx("cublasGemmEx", handle, transa, transb, m, n, k, alpha, a, a_type, lda, 0, b,
                       b_type, ldb, 0, beta, c, c_type, ldc, 0, 1, compute_type);
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa,
                                          cublasOperation_t transb, int m, int n, int k,
                                          const void* alpha, const void* a, cudaDataType a_type,
                                          int lda, long long stride_a, const void* b,
                                          cudaDataType b_type, int ldb, long long stride_b,
                                          const void* beta, void* c, cudaDataType c_type, int ldc,
                                          long long stride_c, int batch_count,
                                          cublasComputeType_t compute_type, cublasGemmAlgo_t algo) {
  return CheckedGemmEx("cublasGemmStridedBatchedEx", handle, transa, transb, m, n, k, alpha, a,
                       a_type, lda, stride_a, b, b_type, ldb, stride_b, beta, c, c_type, ldc,
                       stride_c, batch_count, compute_type);
}

}  // extern "C"
