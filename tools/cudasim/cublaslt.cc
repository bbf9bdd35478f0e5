// cudasim's cuBLASLt: cublasLtMatmul with its argument checks and column-major semantics, the
// epilogues Tandem uses (bias, GELU with and without its auxiliary output, bias gradient, GELU
// gradient with the bias gradient), on
// the CPU and queued on the call's stream like cuBLASLt's one kernel per matmul.
//
// Note [cudasim cuBLASLt]: the simulator's definition of a matmul, which the backend's tests hold
// the GPU to. A and B are widened to the compute type (float for 32F and 32F_FAST_TF32, whose
// float32 operands are rounded to TF32 first; double for 64F), the product is OpenBLAS's GEMM of
// the widened copies, then per element of D: pre = alpha * (A B) + beta * C + bias[row], stored
// to the epilogue's auxiliary buffer (GELU_AUX_BIAS, in D's type) and D = gelu_tanh(pre) (GELU
// epilogues) or pre, each rounded once to D's type. BGRADB's bias gradient is the sum over k of
// op(B)'s widened (not TF32-rounded) elements, in order, in float. DGELU_BGRAD: D = pre *
// gelu_tanh'(aux) in float (aux the GELU's input that GELU_AUX_BIAS stored, the derivative as
// Tandem's kGeluTanhDerivative), rounded once to D's type, and bias[row] the sum over D's columns
// of those float values, in order. A GPU computes the same values
// in its own order of additions, so the two agree within the type's rounding, not bitwise (as
// Note [cudasim GemmEx]). Stricter than a GPU: an epilogue with 64F compute, an auxiliary
// leading dimension that is not a multiple of 8, and anything not modelled fail with
// CUBLAS_STATUS_NOT_SUPPORTED and say why.
#include <cblas.h>
#include <cublasLt.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "tools/cudasim/counters.h"
#include "tools/cudasim/float16.h"
#include "tools/cudasim/runtime_internal.h"

struct cublasLtContext {
  int device = 0;
  // The stream each workspace served (Note [cudasim cuBLAS workspaces] in cublas.cc); guarded
  // by the handle's users, as cuBLASLt's callers serialise a handle's use.
  std::map<void*, cudaStream_t> workspace_streams;
};

struct cublasLtMatmulDescOpaque_t {
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cudaDataType_t scale = CUDA_R_32F;
  cublasOperation_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  void* bias = nullptr;
  int bias_type = -1;  // -1: D's type, as cuBLASLt's default
  void* aux = nullptr;
  int64_t aux_ld = 0;
  int aux_type = -1;  // -1: D's type
};

struct cublasLtMatrixLayoutOpaque_t {
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
};

struct cublasLtMatmulPreferenceOpaque_t {
  size_t max_workspace_bytes = 0;
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
std::set<cublasLtHandle_t>& Handles() {
  static std::set<cublasLtHandle_t>* handles = new std::set<cublasLtHandle_t>;
  return *handles;
}
bool Live(cublasLtHandle_t handle) {
  std::lock_guard<std::mutex> lock(HandlesMutex());
  return Handles().count(handle) != 0;
}

cublasStatus_t Fail(cublasStatus_t status, const std::string& message) {
  std::fprintf(stderr, "cudasim: cuBLASLt: %s: %s\n",
               status == CUBLAS_STATUS_INVALID_VALUE ? "CUBLAS_STATUS_INVALID_VALUE"
                                                     : "CUBLAS_STATUS_NOT_SUPPORTED",
               message.c_str());
  return status;
}

bool Is16(int type) { return type == CUDA_R_16BF || type == CUDA_R_16F; }
double SizeOf(int type) { return type == CUDA_R_64F ? 8 : type == CUDA_R_32F ? 4 : 2; }

double Load(int type, const void* data, size_t at) {
  switch (type) {
    case CUDA_R_64F:
      return static_cast<const double*>(data)[at];
    case CUDA_R_32F:
      return static_cast<const float*>(data)[at];
    case CUDA_R_16BF:
      return BFloat16ToFloat(static_cast<const uint16_t*>(data)[at]);
    default:
      return HalfToFloat(static_cast<const uint16_t*>(data)[at]);
  }
}

// Rounded once to `type` (a 16-bit type from float, as the epilogue computes in float).
void Store(int type, void* data, size_t at, double value) {
  switch (type) {
    case CUDA_R_64F:
      static_cast<double*>(data)[at] = value;
      break;
    case CUDA_R_32F:
      static_cast<float*>(data)[at] = static_cast<float>(value);
      break;
    case CUDA_R_16BF:
      static_cast<uint16_t*>(data)[at] = FloatToBFloat16(static_cast<float>(value));
      break;
    default:
      static_cast<uint16_t*>(data)[at] = FloatToHalf(static_cast<float>(value));
  }
}

bool HasBias(cublasLtEpilogue_t e) {
  return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_BIAS ||
         e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}
bool IsGelu(cublasLtEpilogue_t e) {
  return e == CUBLASLT_EPILOGUE_GELU_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}
// Epilogues that write a bias gradient to the bias pointer.
bool HasBiasGrad(cublasLtEpilogue_t e) {
  return e == CUBLASLT_EPILOGUE_BGRADB || e == CUBLASLT_EPILOGUE_DGELU_BGRAD;
}
// Epilogues with an auxiliary matrix of D's shape (written by GELU_AUX_BIAS, read by DGELU_BGRAD).
bool HasAux(cublasLtEpilogue_t e) {
  return e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || e == CUBLASLT_EPILOGUE_DGELU_BGRAD;
}

// The problem's sizes, once checked.
struct Problem {
  int64_t m, n, k;
  int bias_type, aux_type;
};

std::string Str(int64_t v) { return std::to_string(v); }

// cuBLASLt's checks of a matmul's descriptor and layouts (those the heuristic and the matmul
// share), or the status and why.
cublasStatus_t Check(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                     cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d, Problem* problem) {
  if (desc == nullptr || a == nullptr || b == nullptr || c == nullptr || d == nullptr) {
    return Fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul: a null descriptor or layout");
  }
  const int ab = a->type, cd = d->type;
  if (b->type != ab || c->type != cd) {
    return Fail(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmul: A and B (types " + Str(ab) + ", " +
                                                 Str(b->type) + ") and C and D (" + Str(c->type) +
                                                 ", " + Str(cd) + ") must each share a type");
  }
  const bool f64 = ab == CUDA_R_64F && cd == CUDA_R_64F && desc->compute == CUBLAS_COMPUTE_64F &&
                   desc->scale == CUDA_R_64F;
  const bool f32 =
      ab == CUDA_R_32F && cd == CUDA_R_32F &&
      (desc->compute == CUBLAS_COMPUTE_32F || desc->compute == CUBLAS_COMPUTE_32F_FAST_TF32) &&
      desc->scale == CUDA_R_32F;
  const bool f16 = Is16(ab) && (cd == ab || cd == CUDA_R_32F) &&
                   desc->compute == CUBLAS_COMPUTE_32F && desc->scale == CUDA_R_32F;
  if (!f64 && !f32 && !f16) {
    return Fail(CUBLAS_STATUS_NOT_SUPPORTED,
                "cublasLtMatmul: A/B type " + Str(ab) + ", C/D type " + Str(cd) +
                    ", compute type " + Str(desc->compute) + ", scale type " + Str(desc->scale) +
                    ": cudasim takes 64F throughout, 32F with COMPUTE_32F or 32F_FAST_TF32, or "
                    "16BF/16F A and B with C and D of that type or 32F and COMPUTE_32F");
  }
  if (c->rows != d->rows || c->cols != d->cols || c->ld != d->ld) {
    return Fail(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmul: C and D must have one layout");
  }
  const int64_t m = static_cast<int64_t>(d->rows), n = static_cast<int64_t>(d->cols);
  const bool ta = desc->trans_a == CUBLAS_OP_T, tb = desc->trans_b == CUBLAS_OP_T;
  const int64_t a_rows = ta ? a->cols : a->rows, k = ta ? a->rows : a->cols;
  const int64_t b_rows = tb ? b->cols : b->rows, b_cols = tb ? b->rows : b->cols;
  if (a_rows != m || b_cols != n || b_rows != k) {
    return Fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul: op(A) is " + Str(a_rows) + "x" +
                                                 Str(k) + ", op(B) " + Str(b_rows) + "x" +
                                                 Str(b_cols) + " and D " + Str(m) + "x" + Str(n) +
                                                 ": expected op(A) m x k, op(B) k x n and D m x n");
  }
  for (const cublasLtMatrixLayout_t layout : {a, b, d}) {
    if (layout->ld < std::max<int64_t>(1, static_cast<int64_t>(layout->rows))) {
      return Fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul: a leading dimension " +
                                                   Str(layout->ld) + " below its " +
                                                   Str(layout->rows) + " rows");
    }
  }
  const cublasLtEpilogue_t e = desc->epilogue;
  if (e != CUBLASLT_EPILOGUE_DEFAULT && !HasBias(e) && !HasBiasGrad(e)) {
    return Fail(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmul: epilogue " + Str(e) +
                                                 ": cudasim models DEFAULT, BIAS, GELU_BIAS, "
                                                 "GELU_AUX_BIAS, BGRADB and DGELU_BGRAD");
  }
  if (e != CUBLASLT_EPILOGUE_DEFAULT && f64) {
    return Fail(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmul: epilogue " + Str(e) +
                                                 " with 64F: cuBLASLt's epilogues are for "
                                                 "float and 16-bit matmuls");
  }
  problem->m = m;
  problem->n = n;
  problem->k = k;
  problem->bias_type = desc->bias_type == -1 ? cd : desc->bias_type;
  problem->aux_type = desc->aux_type == -1 ? cd : desc->aux_type;
  if (HasBias(e) || HasBiasGrad(e)) {
    if (desc->bias == nullptr) {
      return Fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul: epilogue " + Str(e) +
                                                   " without CUBLASLT_MATMUL_DESC_BIAS_POINTER");
    }
    if (problem->bias_type != cd && !(Is16(ab) && problem->bias_type == CUDA_R_32F)) {
      return Fail(CUBLAS_STATUS_NOT_SUPPORTED,
                  "cublasLtMatmul: bias type " + Str(problem->bias_type) +
                      ": expected D's type, or 32F with 16-bit A and B");
    }
  }
  if (HasAux(e)) {
    if (desc->aux == nullptr || desc->aux_ld < m || desc->aux_ld % 8 != 0) {
      return Fail(CUBLAS_STATUS_INVALID_VALUE,
                  "cublasLtMatmul: epilogue " + Str(e) +
                      " needs CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER and an EPILOGUE_AUX_LD of "
                      "at least m = " +
                      Str(m) + " and a multiple of 8, but got ld " + Str(desc->aux_ld));
    }
    if (problem->aux_type != cd) {
      return Fail(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmul: an auxiliary type other than D's");
    }
  }
  return CUBLAS_STATUS_SUCCESS;
}

// A widened copy of a column-major rows x cols operand (ld apart), TF32-rounded when asked.
std::vector<double> Widened(int type, const void* x, int64_t rows, int64_t cols, int64_t ld,
                            bool tf32) {
  std::vector<double> copy(cols == 0 ? 0 : static_cast<size_t>(ld) * (cols - 1) + rows);
  for (int64_t c = 0; c < cols; ++c) {
    for (int64_t r = 0; r < rows; ++r) {
      const size_t at = static_cast<size_t>(c * ld + r);
      const double v = Load(type, x, at);
      copy[at] = tf32 ? RoundToTf32(static_cast<float>(v)) : v;
    }
  }
  return copy;
}

float GeluTanh(float x) {
  const float kSqrt2OverPi = 0.7978845608028654f;
  return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
}

// d gelu_tanh(x) / dx, as Tandem's kGeluTanhDerivative computes it in float (the logistic form of
// 0.5 (1 + tanh u)).
float GeluTanhDerivative(float x) {
  const float x2 = x * x;
  const float s = 1.0f / (1.0f + std::exp(-1.5957691216057307f * (x + 0.044715f * x2 * x)));
  const float du = 0.79788456080286536f * (1.0f + 3.0f * 0.044715f * x2);
  return s + 2.0f * x * s * (1.0f - s) * du;
}

}  // namespace

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  int count = 0;
  if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return CUBLAS_STATUS_NOT_INITIALIZED;
  }
  auto* context = new cublasLtContext;
  context->device = cudasim::internal::CurrentDevice();
  std::lock_guard<std::mutex> lock(HandlesMutex());
  Handles().insert(context);
  *handle = context;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  {
    std::lock_guard<std::mutex> lock(HandlesMutex());
    if (Handles().erase(handle) == 0) return CUBLAS_STATUS_NOT_INITIALIZED;
  }
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale_type) {
  if (desc == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *desc = new cublasLtMatmulDescOpaque_t;
  (*desc)->compute = compute;
  (*desc)->scale = scale_type;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete desc;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attribute,
                                              const void* buffer, size_t bytes) {
  if (desc == nullptr || buffer == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  // Each attribute's value as cuBLASLt types it (enums are int32, pointers void*, the leading
  // dimension int64); a buffer of another size is CUBLAS_STATUS_INVALID_VALUE there too.
  const auto read = [&](auto* value) {
    if (bytes != sizeof(*value)) {
      return Fail(CUBLAS_STATUS_INVALID_VALUE,
                  "cublasLtMatmulDescSetAttribute: attribute " + Str(attribute) + " takes " +
                      Str(sizeof(*value)) + " bytes but got " + Str(bytes));
    }
    std::memcpy(value, buffer, bytes);
    return CUBLAS_STATUS_SUCCESS;
  };
  int32_t value32 = 0;
  cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
  switch (attribute) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
    case CUBLASLT_MATMUL_DESC_TRANSB:
      status = read(&value32);
      if (status != CUBLAS_STATUS_SUCCESS) return status;
      if (value32 != CUBLAS_OP_N && value32 != CUBLAS_OP_T) {
        return Fail(CUBLAS_STATUS_INVALID_VALUE,
                    "cublasLtMatmulDescSetAttribute: a transpose "
                    "other than CUBLAS_OP_N or CUBLAS_OP_T");
      }
      (attribute == CUBLASLT_MATMUL_DESC_TRANSA ? desc->trans_a : desc->trans_b) =
          static_cast<cublasOperation_t>(value32);
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
      status = read(&value32);
      desc->epilogue = static_cast<cublasLtEpilogue_t>(value32);
      return status;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
      return read(&desc->bias);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
      status = read(&value32);
      desc->bias_type = value32;
      return status;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
      return read(&desc->aux);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD:
      return read(&desc->aux_ld);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE:
      status = read(&value32);
      desc->aux_type = value32;
      return status;
    default:
      return Fail(CUBLAS_STATUS_NOT_SUPPORTED,
                  "cublasLtMatmulDescSetAttribute: attribute " + Str(attribute) +
                      " is not modelled (cudasim takes TRANSA, TRANSB, EPILOGUE, BIAS_POINTER, "
                      "BIAS_DATA_TYPE, EPILOGUE_AUX_POINTER, EPILOGUE_AUX_LD, "
                      "EPILOGUE_AUX_DATA_TYPE)");
  }
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  if (layout == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (type != CUDA_R_64F && type != CUDA_R_32F && !Is16(type)) {
    return Fail(CUBLAS_STATUS_NOT_SUPPORTED,
                "cublasLtMatrixLayoutCreate: type " + Str(type) + " is not modelled");
  }
  *layout = new cublasLtMatrixLayoutOpaque_t{type, rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete layout;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* preference) {
  if (preference == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *preference = new cublasLtMatmulPreferenceOpaque_t;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t preference) {
  delete preference;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t preference,
                                                    cublasLtMatmulPreferenceAttributes_t attribute,
                                                    const void* buffer, size_t bytes) {
  if (preference == nullptr || buffer == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (attribute != CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES || bytes != sizeof(uint64_t)) {
    return Fail(CUBLAS_STATUS_NOT_SUPPORTED,
                "cublasLtMatmulPreferenceSetAttribute: cudasim models only "
                "CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES (a uint64_t)");
  }
  uint64_t value;
  std::memcpy(&value, buffer, sizeof(value));
  preference->max_workspace_bytes = value;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a_layout,
    cublasLtMatrixLayout_t b_layout, cublasLtMatrixLayout_t c_layout,
    cublasLtMatrixLayout_t d_layout, cublasLtMatmulPreference_t preference, int requested,
    cublasLtMatmulHeuristicResult_t results[], int* returned) {
  if (!Live(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (preference == nullptr || requested < 1 || results == nullptr || returned == nullptr) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  *returned = 0;
  Problem problem;
  const cublasStatus_t status = Check(desc, a_layout, b_layout, c_layout, d_layout, &problem);
  if (status != CUBLAS_STATUS_SUCCESS) return status;
  // cudasim's one algorithm needs no workspace (it computes on the host); a GPU's may ask for
  // up to the preference's limit, which cublasLtMatmul then gets.
  results[0] = cublasLtMatmulHeuristicResult_t{};
  results[0].algo.data[0] = 1;
  results[0].workspaceSize = 0;
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].wavesCount = 1.0f;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                              const void* alpha_ptr, const void* a, cublasLtMatrixLayout_t a_layout,
                              const void* b, cublasLtMatrixLayout_t b_layout, const void* beta_ptr,
                              const void* c, cublasLtMatrixLayout_t c_layout, void* d,
                              cublasLtMatrixLayout_t d_layout, const cublasLtMatmulAlgo_t* algo,
                              void* workspace, size_t workspace_bytes, cudaStream_t stream_handle) {
  if (!Live(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  Problem p;
  const cublasStatus_t status = Check(desc, a_layout, b_layout, c_layout, d_layout, &p);
  if (status != CUBLAS_STATUS_SUCCESS) return status;
  if (alpha_ptr == nullptr || beta_ptr == nullptr) {
    return Fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul: a null alpha or beta");
  }
  if (algo != nullptr && algo->data[0] != 1) {
    return Fail(CUBLAS_STATUS_INVALID_VALUE,
                "cublasLtMatmul: an algorithm not from cublasLtMatmulAlgoGetHeuristic");
  }
  if (workspace_bytes > 0 &&
      (workspace == nullptr || reinterpret_cast<uintptr_t>(workspace) % 256 != 0)) {
    return Fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul: a workspace of " +
                                                 Str(workspace_bytes) +
                                                 " bytes must be non-null and 256-byte aligned");
  }
  if (workspace_bytes > 0) {
    // Note [cudasim cuBLAS workspaces] (cublas.cc): one workspace serving two streams races.
    auto [it, inserted] = handle->workspace_streams.emplace(workspace, stream_handle);
    if (!inserted && it->second != stream_handle) {
      return Fail(CUBLAS_STATUS_NOT_SUPPORTED,
                  "cublasLtMatmul with a workspace that another stream used: work on two streams "
                  "would race on it; give each stream its own workspace");
    }
  }
  const int previous = cudasim::internal::CurrentDevice();
  cudaSetDevice(handle->device);
  cudasim::internal::Stream* stream = cudasim::internal::ResolveStream(stream_handle);
  cudaSetDevice(previous);
  if (stream == nullptr) return CUBLAS_STATUS_EXECUTION_FAILED;
  if (cudasim::internal::StickyError(stream->device()) != cudaSuccess) {
    return CUBLAS_STATUS_EXECUTION_FAILED;
  }
  if (p.m == 0 || p.n == 0) return CUBLAS_STATUS_SUCCESS;
  const auto count_work = [&] {
    // Its work for the counters (once the launch is counted, below): 2 m n k FLOPs; A and B read,
    // D written (C read where beta != 0), the bias (or its gradient) and the GELU's aux buffer as
    // they are used.
    const double ab = SizeOf(a_layout->type), cd = SizeOf(d_layout->type);
    const bool reads_c =
        (desc->compute == CUBLAS_COMPUTE_64F ? *static_cast<const double*>(beta_ptr)
                                             : *static_cast<const float*>(beta_ptr)) != 0.0;
    double bytes = ab * (p.m * p.k + p.k * p.n) + cd * p.m * p.n * (reads_c ? 2 : 1);
    if (HasBias(desc->epilogue)) bytes += SizeOf(p.bias_type) * p.m;
    if (desc->epilogue == CUBLASLT_EPILOGUE_BGRADB) bytes += SizeOf(p.bias_type) * p.n;
    if (desc->epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD) bytes += SizeOf(p.bias_type) * p.m;
    if (HasAux(desc->epilogue)) bytes += SizeOf(p.aux_type) * p.m * p.n;
    const char* math = desc->compute == CUBLAS_COMPUTE_64F             ? "fp64"
                       : desc->compute == CUBLAS_COMPUTE_32F_FAST_TF32 ? "tf32"
                       : a_layout->type == CUDA_R_16BF                 ? "bf16"
                       : a_layout->type == CUDA_R_16F                  ? "fp16"
                                                                       : "fp32";
    cudasim::internal::CountWork("cublasLtMatmul", 2.0 * p.m * p.n * p.k, bytes, math);
  };
  const bool f64 = desc->compute == CUBLAS_COMPUTE_64F;
  const double alpha =
      f64 ? *static_cast<const double*>(alpha_ptr) : *static_cast<const float*>(alpha_ptr);
  const double beta =
      f64 ? *static_cast<const double*>(beta_ptr) : *static_cast<const float*>(beta_ptr);
  const cublasLtMatmulDescOpaque_t e = *desc;  // the call's attributes, as cuBLASLt reads them
  const cublasLtMatrixLayoutOpaque_t la = *a_layout, lb = *b_layout, ld = *d_layout;
  const bool tf32 = desc->compute == CUBLAS_COMPUTE_32F_FAST_TF32;
  // One kernel per matmul; captured into a CUDA Graph when the stream is capturing.
  const cudaError_t queued = stream->EnqueueLaunch("cublasLtMatmul", 0, 0, [=] {
    const int64_t m = p.m, n = p.n, k = p.k;
    const int64_t ldd = ld.ld;
    std::vector<double> acc(static_cast<size_t>(ldd * (n - 1) + m), 0.0);
    if (k > 0 && alpha != 0.0) {
      const std::vector<double> a64 = Widened(la.type, a, la.rows, la.cols, la.ld, tf32);
      const std::vector<double> b64 = Widened(lb.type, b, lb.rows, lb.cols, lb.ld, tf32);
      const CBLAS_TRANSPOSE ta = e.trans_a == CUBLAS_OP_T ? CblasTrans : CblasNoTrans;
      const CBLAS_TRANSPOSE tb = e.trans_b == CUBLAS_OP_T ? CblasTrans : CblasNoTrans;
      if (f64) {
        cblas_dgemm(CblasColMajor, ta, tb, m, n, k, alpha, a64.data(), la.ld, b64.data(), lb.ld,
                    0.0, acc.data(), ldd);
      } else {
        // Float arithmetic, as the GPU's: the widened copies hold float values exactly.
        const std::vector<float> a32(a64.begin(), a64.end()), b32(b64.begin(), b64.end());
        std::vector<float> acc32(acc.size(), 0.0f);
        cblas_sgemm(CblasColMajor, ta, tb, m, n, k, static_cast<float>(alpha), a32.data(), la.ld,
                    b32.data(), lb.ld, 0.0f, acc32.data(), ldd);
        acc.assign(acc32.begin(), acc32.end());
      }
    }
    const bool dgelu = e.epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD;
    std::vector<float> dgelu_sums(dgelu ? m : 0, 0.0f);
    for (int64_t col = 0; col < n; ++col) {
      for (int64_t row = 0; row < m; ++row) {
        const size_t at = static_cast<size_t>(col * ldd + row);
        double pre = acc[at];
        // BLAS: C is not read when beta == 0 (NaN in it does not survive).
        if (beta != 0.0) pre += beta * Load(ld.type, c, at);
        if (HasBias(e.epilogue)) pre += Load(p.bias_type, e.bias, row);
        if (!f64) pre = static_cast<float>(pre);
        const size_t aux_at = static_cast<size_t>(col * e.aux_ld + row);
        if (e.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) Store(p.aux_type, e.aux, aux_at, pre);
        if (dgelu) {
          const float grad =
              static_cast<float>(pre) *
              GeluTanhDerivative(static_cast<float>(Load(p.aux_type, e.aux, aux_at)));
          dgelu_sums[row] += grad;
          Store(ld.type, d, at, grad);
          continue;
        }
        Store(ld.type, d, at, IsGelu(e.epilogue) ? GeluTanh(static_cast<float>(pre)) : pre);
      }
    }
    for (int64_t row = 0; row < static_cast<int64_t>(dgelu_sums.size()); ++row) {
      Store(p.bias_type, e.bias, static_cast<size_t>(row), dgelu_sums[row]);
    }
    if (e.epilogue == CUBLASLT_EPILOGUE_BGRADB) {
      // The bias gradient of B: op(B)'s columns summed over k, in float.
      const bool tb = e.trans_b == CUBLAS_OP_T;
      for (int64_t col = 0; col < n; ++col) {
        float sum = 0.0f;
        for (int64_t i = 0; i < k; ++i) {
          sum += static_cast<float>(
              Load(lb.type, b, static_cast<size_t>(tb ? i * lb.ld + col : col * lb.ld + i)));
        }
        Store(p.bias_type, e.bias, static_cast<size_t>(col), sum);
      }
    }
  });
  if (queued != cudaSuccess) return CUBLAS_STATUS_EXECUTION_FAILED;  // an invalidated capture
  if (!stream->capturing()) count_work();
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
