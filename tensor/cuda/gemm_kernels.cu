// The GEMM helper kernel (LaunchScaleMatrices of kernels.h): C = beta * C where cuBLAS
// is not called (k == 0).
#include <cuda_runtime.h>

#include <cstdint>

#include "tensor/base/error.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/internal/launch_utils.cuh"
#include "tensor/cuda/kernels.h"
#include "tools/cuda/device_counters.h"

namespace tandem {
namespace cuda {
namespace {

// ---- GEMM helper --------------------------------------------------------------------------

// C = beta * C over `batch` strided m x n matrices; beta == 0 writes zeros (BLAS semantics:
// C is not read, so NaN in C does not survive).
template <typename T>
__global__ void ScaleMatricesKernel(OpMath<T> beta, T* c, int64_t m, int64_t n, int64_t ldc,
                                    int64_t stride_c, int64_t batch) {
  using M = OpMath<T>;
  for (int64_t i = GlobalThread(); i < batch * m * n; i += GridThreads()) {
    const int64_t column = i % n, row = (i / n) % m, matrix = i / (m * n);
    T& element = c[matrix * stride_c + row * ldc + column];
    element = beta == M(0) ? T(0) : static_cast<T>(static_cast<M>(element) * beta);
  }
}

}  // namespace

void LaunchScaleMatrices(const LaunchContext& context, DType dtype, double beta, void* c, int64_t m,
                         int64_t n, int64_t ldc, int64_t stride_c, int64_t batch) {
  DispatchAllFloatingTypes(dtype, "CUDA Gemm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const OpMath<T> typed_beta = static_cast<OpMath<T>>(beta);
    if (m * n * batch == 0 || typed_beta == OpMath<T>(1)) return;
    ScaleMatricesKernel<T><<<GridFor(context, batch * m * n), kThreads, 0, context.stream>>>(
        typed_beta, static_cast<T*>(c), m, n, ldc, stride_c, batch);
    TANDEM_CUDA_CHECK_LAUNCH(context.device);
    const double elements = static_cast<double>(batch * m * n);
    // C written, and read unless beta == 0.
    DeclareKernelWork(elements, elements * sizeof(T) * (typed_beta == OpMath<T>(0) ? 1 : 2));
  });
}

}  // namespace cuda
}  // namespace tandem
