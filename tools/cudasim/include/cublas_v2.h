// cudasim's stand-in for cuBLAS: the calls Tandem makes (handles, streams, math modes, SGEMM and
// DGEMM, plain and strided batched, and GemmEx / GemmStridedBatchedEx on bfloat16 or float16
// with float compute), with cuBLAS's column-major semantics, computed by OpenBLAS on the
// handle's stream (tools/cudasim/cublas.cc). Under --config=cudasim, `@local_cuda//:cublas`
// resolves to //tools/cudasim:cublas.
//
//   cublasHandle_t handle;
//   cublasCreate(&handle);
//   cublasSetStream(handle, stream);
//   cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, a, m, b, k, &beta, c, m);
#ifndef TANDEM_TOOLS_CUDASIM_INCLUDE_CUBLAS_V2_H_
#define TANDEM_TOOLS_CUDASIM_INCLUDE_CUBLAS_V2_H_

#include <cuda_runtime.h>

#include <cstdint>

#define CUBLAS_VER_MAJOR 13
#define CUBLAS_VER_MINOR 0
#define CUBLAS_VERSION 130000

struct cublasContext;
typedef cublasContext* cublasHandle_t;

enum cublasStatus_t {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_ALLOC_FAILED = 3,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_ARCH_MISMATCH = 8,
  CUBLAS_STATUS_MAPPING_ERROR = 11,
  CUBLAS_STATUS_EXECUTION_FAILED = 13,
  CUBLAS_STATUS_INTERNAL_ERROR = 14,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
};

enum cublasOperation_t {
  CUBLAS_OP_N = 0,
  CUBLAS_OP_T = 1,
  CUBLAS_OP_C = 2,
};

enum cublasMath_t {
  CUBLAS_DEFAULT_MATH = 0,
  CUBLAS_TENSOR_OP_MATH = 1,
  CUBLAS_PEDANTIC_MATH = 2,
  CUBLAS_TF32_TENSOR_OP_MATH = 3,
  // A flag ORed into one of the modes above: split-K reductions of 16-bit GEMMs stay in the
  // compute type (float) instead of the output type.
  CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION = 16,
};

// library_types.h's element types (the real values), those cudasim's GemmEx takes and more.
typedef enum cudaDataType_t {
  CUDA_R_16F = 2,
  CUDA_R_16BF = 14,
  CUDA_R_32F = 0,
  CUDA_R_64F = 1,
} cudaDataType;

typedef enum {
  CUBLAS_COMPUTE_16F = 64,
  CUBLAS_COMPUTE_32F = 68,
  CUBLAS_COMPUTE_32F_PEDANTIC = 69,
  CUBLAS_COMPUTE_32F_FAST_TF32 = 77,  // float32 operands rounded to TF32 (cuBLASLt)
  CUBLAS_COMPUTE_64F = 70,
} cublasComputeType_t;

typedef enum {
  CUBLAS_GEMM_DEFAULT = -1,
  CUBLAS_GEMM_DEFAULT_TENSOR_OP = 99,
} cublasGemmAlgo_t;

extern "C" {
cublasStatus_t cublasCreate(cublasHandle_t* handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
cublasStatus_t cublasGetVersion(cublasHandle_t handle, int* version);
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream);
cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t* stream);
// The handle's workspace on its current stream until the next cublasSetStream (which goes back
// to the default pool); see Note [cudasim cuBLAS workspaces] in cublas.cc.
cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void* workspace, size_t bytes);
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode);
cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t* mode);
const char* cublasGetStatusName(cublasStatus_t status);
const char* cublasGetStatusString(cublasStatus_t status);
cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa,
                           cublasOperation_t transb, int m, int n, int k, const float* alpha,
                           const float* a, int lda, const float* b, int ldb, const float* beta,
                           float* c, int ldc);
cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa,
                                         cublasOperation_t transb, int m, int n, int k,
                                         const float* alpha, const float* a, int lda,
                                         long long stride_a, const float* b, int ldb,
                                         long long stride_b, const float* beta, float* c, int ldc,
                                         long long stride_c, int batch_count);
cublasStatus_t cublasDgemm(cublasHandle_t handle, cublasOperation_t transa,
                           cublasOperation_t transb, int m, int n, int k, const double* alpha,
                           const double* a, int lda, const double* b, int ldb, const double* beta,
                           double* c, int ldc);
cublasStatus_t cublasDgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa,
                                         cublasOperation_t transb, int m, int n, int k,
                                         const double* alpha, const double* a, int lda,
                                         long long stride_a, const double* b, int ldb,
                                         long long stride_b, const double* beta, double* c, int ldc,
                                         long long stride_c, int batch_count);
// Only A, B and C of one type, CUDA_R_16BF or CUDA_R_16F, with CUBLAS_COMPUTE_32F (or its
// _PEDANTIC form) and float alpha and beta; anything else is CUBLAS_STATUS_NOT_SUPPORTED.
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* a, cudaDataType a_type, int lda, const void* b,
                            cudaDataType b_type, int ldb, const void* beta, void* c,
                            cudaDataType c_type, int ldc, cublasComputeType_t compute_type,
                            cublasGemmAlgo_t algo);
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa,
                                          cublasOperation_t transb, int m, int n, int k,
                                          const void* alpha, const void* a, cudaDataType a_type,
                                          int lda, long long stride_a, const void* b,
                                          cudaDataType b_type, int ldb, long long stride_b,
                                          const void* beta, void* c, cudaDataType c_type, int ldc,
                                          long long stride_c, int batch_count,
                                          cublasComputeType_t compute_type, cublasGemmAlgo_t algo);
}  // extern "C"

#endif  // TANDEM_TOOLS_CUDASIM_INCLUDE_CUBLAS_V2_H_
