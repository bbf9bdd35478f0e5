// The CPU's multi-tensor cast (tensor/kernels/cast_kernels.h): each tensor rounded by
// vec::FromFloat, the conversion the CPU backend's Copy runs on contiguous float32 -> 16-bit
// runs (elementwise_kernels.cc's ConvertRun), so a cast here is bitwise Tensor::to's. Large
// tensors split over the device's threads; each element's rounding does not depend on the split.
#include "tensor/kernels/cast_kernels.h"

#include <cstdint>
#include <vector>

#include "tensor/base/device.h"
#include "tensor/base/dtype.h"
#include "tensor/base/half.h"
#include "tensor/kernels/float_conversions.h"
#include "tensor/runtime/threads.h"

namespace tandem {
namespace {

// Enough floats per piece to be worth a thread's wake-up (as the optimizer kernels' pieces).
constexpr int64_t kCastGrain = int64_t{1} << 14;

template <typename T>
void CastAll(int index, const std::vector<ForeachCastTensor>& tensors) {
  for (const ForeachCastTensor& t : tensors) {
    if (t.numel == 0) continue;
    const float* src = static_cast<const float*>(t.src);
    T* dst = static_cast<T*>(t.dst);
    ParallelFor(Device::Cpu(index), t.numel, kCastGrain, [&](int64_t begin, int64_t end) {
      vec::FromFloat(src + begin, dst + begin, end - begin);
    });
  }
}

void CpuForeachCast(int index, DType src_dtype, DType dst_dtype,
                    const std::vector<ForeachCastTensor>& tensors) {
  CheckForeachCastDTypes("CPU ForeachCastKernel", src_dtype, dst_dtype);
  if (dst_dtype == kBFloat16) {
    CastAll<BFloat16>(index, tensors);
  } else {
    CastAll<Half>(index, tensors);
  }
}

}  // namespace

TANDEM_REGISTER_KERNEL(ForeachCastKernel, DeviceType::kCPU, CpuForeachCast);

}  // namespace tandem
