// Kernels for tests only (LaunchSpin of kernels.h).
#include <cuda_runtime.h>

#include <cstdint>

#include "tensor/base/error.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/internal/launch_utils.cuh"
#include "tensor/cuda/kernels.h"

namespace tandem {
namespace cuda {
namespace {

// ---- Test only ---------------------------------------------------------------------------

// The one thing here a CPU cannot run: PTX's global timer. Under --config=cudasim
// (TANDEM_CUDASIM) the simulator's clock stands in.
__device__ __forceinline__ uint64_t GlobalTimerNanoseconds() {
#if defined(TANDEM_CUDASIM)
  return ::cudasim::internal::GlobalTimerNanoseconds();
#else
  uint64_t now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  return now;
#endif
}

__global__ void SpinKernel(uint64_t nanoseconds) {
  const uint64_t start = GlobalTimerNanoseconds();
  while (GlobalTimerNanoseconds() - start < nanoseconds) __nanosleep(1000);
}

}  // namespace

void LaunchSpin(const LaunchContext& context, int64_t nanoseconds) {
  SpinKernel<<<1, 1, 0, context.stream>>>(static_cast<uint64_t>(nanoseconds));
  TANDEM_CUDA_CHECK_LAUNCH(context.device);
}

}  // namespace cuda
}  // namespace tandem
