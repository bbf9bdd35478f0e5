#include "tensor/kernels/optimizer_kernels.h"

#include "tensor/base/error.h"

namespace tandem {

TANDEM_DEFINE_KERNEL(FusedSgdKernel);
TANDEM_DEFINE_KERNEL(FusedAdamKernel);
TANDEM_DEFINE_KERNEL(FusedRmspropKernel);

namespace {

// What every optimizer kernel needs of its call and of each tensor, whatever its state.
void CheckDType(const char* kernel, DType dtype) {
  TANDEM_CHECK(IsFloatingPoint(dtype), kernel, ": expected a floating dtype (float32, float64, ",
               "bfloat16, float16) but got ", dtype, "; optimize floating-point parameters only");
}

template <typename Tensor>
bool CheckCommon(const char* kernel, const Tensor& t, size_t k) {
  TANDEM_CHECK(t.numel >= 0, kernel, ": tensor ", k, " has a negative element count ", t.numel);
  if (t.numel == 0) return false;
  TANDEM_CHECK(t.param != nullptr && t.grad != nullptr, kernel, ": tensor ", k, " of ", t.numel,
               " elements has no ", t.param == nullptr ? "param" : "grad");
  return true;
}

void CheckState(const char* kernel, bool wanted, const void* state, const char* name, size_t k,
                const char* why) {
  TANDEM_CHECK(!wanted || state != nullptr, kernel, ": tensor ", k, " needs ", name, " (", why,
               ") but has none");
}

}  // namespace

void RunFusedSgd(Device device, DType dtype, const FusedSgdOptions& options,
                 const std::vector<FusedSgdTensor>& tensors) {
  constexpr const char* kName = "FusedSgdKernel";
  CheckDType(kName, dtype);
  const bool momentum = options.momentum != 0.0;
  for (size_t k = 0; k < tensors.size(); ++k) {
    if (!CheckCommon(kName, tensors[k], k)) continue;
    CheckState(kName, momentum, tensors[k].momentum_buffer, "momentum_buffer", k,
               "momentum is not 0");
  }
  FusedSgdKernel(device, dtype, options, tensors);
}

void RunFusedAdam(Device device, DType dtype, const FusedAdamOptions& options,
                  const std::vector<FusedAdamTensor>& tensors) {
  constexpr const char* kName = "FusedAdamKernel";
  CheckDType(kName, dtype);
  TANDEM_CHECK(options.capturable_state == nullptr || device.is_cuda(), kName, " on ", device,
               ": a capturable step keeps its step count and learning rate in CUDA device memory "
               "for CUDA Graphs; on ",
               device, " run it with capturable off");
  for (size_t k = 0; k < tensors.size(); ++k) {
    const FusedAdamTensor& t = tensors[k];
    if (!CheckCommon(kName, t, k)) continue;
    CheckState(kName, true, t.exp_avg, "exp_avg", k, "every Adam step reads it");
    CheckState(kName, true, t.exp_avg_sq, "exp_avg_sq", k, "every Adam step reads it");
    CheckState(kName, options.amsgrad, t.max_exp_avg_sq, "max_exp_avg_sq", k, "amsgrad is on");
    TANDEM_CHECK(t.step >= 1, kName, ": tensor ", k, " has step ", t.step,
                 "; expected this step's count, 1 for the first");
  }
  FusedAdamKernel(device, dtype, options, tensors);
}

void RunFusedRmsprop(Device device, DType dtype, const FusedRmspropOptions& options,
                     const std::vector<FusedRmspropTensor>& tensors) {
  constexpr const char* kName = "FusedRmspropKernel";
  CheckDType(kName, dtype);
  for (size_t k = 0; k < tensors.size(); ++k) {
    const FusedRmspropTensor& t = tensors[k];
    if (!CheckCommon(kName, t, k)) continue;
    CheckState(kName, true, t.square_avg, "square_avg", k, "every RMSprop step reads it");
    CheckState(kName, options.momentum > 0.0, t.momentum_buffer, "momentum_buffer", k,
               "momentum is > 0");
    CheckState(kName, options.centered, t.grad_avg, "grad_avg", k, "centered is on");
  }
  FusedRmspropKernel(device, dtype, options, tensors);
}

}  // namespace tandem
