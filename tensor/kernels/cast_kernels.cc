#include "tensor/kernels/cast_kernels.h"

#include "tensor/base/error.h"

namespace tandem {

TANDEM_DEFINE_KERNEL(ForeachCastKernel);

bool ForeachCastSupports(DType src, DType dst) {
  return src == kFloat32 && (dst == kBFloat16 || dst == kFloat16);
}

void CheckForeachCastDTypes(const char* kernel, DType src, DType dst) {
  TANDEM_CHECK(ForeachCastSupports(src, dst), kernel, ": casts float32 to bfloat16 or float16 ",
               "only but got ", src, " to ", dst, "; cast other dtypes one by one with Tensor::to");
}

void RunForeachCast(Device device, DType src_dtype, DType dst_dtype,
                    const std::vector<ForeachCastTensor>& tensors) {
  constexpr const char* kName = "ForeachCastKernel";
  CheckForeachCastDTypes(kName, src_dtype, dst_dtype);
  for (size_t k = 0; k < tensors.size(); ++k) {
    const ForeachCastTensor& t = tensors[k];
    TANDEM_CHECK(t.numel >= 0, kName, ": tensor ", k, " has a negative element count ", t.numel);
    if (t.numel == 0) continue;
    TANDEM_CHECK(t.src != nullptr && t.dst != nullptr, kName, ": tensor ", k, " of ", t.numel,
                 " elements has no ", t.src == nullptr ? "source" : "destination",
                 " pointer; pass both, or numel 0 to skip it");
  }
  ForeachCastKernel(device, src_dtype, dst_dtype, tensors);
}

}  // namespace tandem
