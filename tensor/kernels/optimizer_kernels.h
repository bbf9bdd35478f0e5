// The fused optimizer kernels (KernelStub, tensor/runtime/kernel_stub.h): one pass over each
// parameter that reads its gradient and state and writes both back, instead of the half-dozen
// elementwise ops (and their temporaries) an update rule would take, as PyTorch's
// _fused_sgd_ / _fused_adam_. Each backend registers its kernels beside its code
// (tensor/cpu/optimizer_kernels.cc, tensor/cuda/optimizer_kernels.cc); every kernel runs the
// element functions of tensor/kernels/internal/optimizer_math.h, so the CPU is the oracle for
// the GPU, bit for bit. Users call the ops of tensor/ops/fused_optimizers.h, which check the
// tensors; the Run* functions here check the raw arguments once, then dispatch.
//
//   FusedSgdOptions options;
//   options.lr = 0.1;
//   RunFusedSgd(param.device(), kFloat32, options, {{n, param_ptr, grad_ptr, nullptr}});
//
// Tensors are contiguous, of one floating dtype, on one device; 16-bit ones compute in float
// and round each stored value once. The tensors of one call are distinct.
#ifndef TANDEM_TENSOR_KERNELS_OPTIMIZER_KERNELS_H_
#define TANDEM_TENSOR_KERNELS_OPTIMIZER_KERNELS_H_

#include <cstdint>
#include <vector>

#include "tensor/base/device.h"
#include "tensor/base/dtype.h"
#include "tensor/runtime/kernel_stub.h"

namespace tandem {

// ---- SGD (torch.optim.SGD) -----------------------------------------------------------------

struct FusedSgdOptions {
  double lr = 0, momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false;
  bool maximize = false;
  // The momentum buffers start as this step's gradients (their first step).
  bool first_step = false;
};
struct FusedSgdTensor {
  int64_t numel = 0;
  void* param = nullptr;
  const void* grad = nullptr;
  void* momentum_buffer = nullptr;  // null without momentum
};
TANDEM_DECLARE_KERNEL(FusedSgdKernel, void(int index, DType dtype, const FusedSgdOptions& options,
                                           const std::vector<FusedSgdTensor>& tensors));

// ---- Adam and AdamW (torch.optim.Adam, torch.optim.AdamW) ----------------------------------

struct FusedAdamOptions {
  double lr = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  // AdamW: p is scaled by 1 - lr * weight_decay first; else weight decay is an L2 term.
  bool decoupled_weight_decay = false;
  bool amsgrad = false;
  bool maximize = false;
  // Capturable (torch.optim.Adam's capturable=True, for CUDA Graphs): five float64 values in
  // device memory, {lr, step, and three scratch values}. The kernel then advances `step` by one
  // and reads `lr` there, ignoring `lr` above and each tensor's `step`, so that a replayed
  // graph takes this step's values (Note [Capturable Adam], tensor/cuda/optimizer_kernels.cu).
  // CUDA devices only.
  double* capturable_state = nullptr;
};
struct FusedAdamTensor {
  int64_t numel = 0;
  void* param = nullptr;
  const void* grad = nullptr;
  void* exp_avg = nullptr;
  void* exp_avg_sq = nullptr;
  void* max_exp_avg_sq = nullptr;  // with amsgrad only
  int64_t step = 1;                // this step's count, from 1: the bias corrections' t
};
TANDEM_DECLARE_KERNEL(FusedAdamKernel, void(int index, DType dtype, const FusedAdamOptions& options,
                                            const std::vector<FusedAdamTensor>& tensors));

// ---- RMSprop (torch.optim.RMSprop) ---------------------------------------------------------

struct FusedRmspropOptions {
  double lr = 0, alpha = 0.99, eps = 1e-8, weight_decay = 0, momentum = 0;
  bool centered = false;
  bool maximize = false;
};
struct FusedRmspropTensor {
  int64_t numel = 0;
  void* param = nullptr;
  const void* grad = nullptr;
  void* square_avg = nullptr;
  void* momentum_buffer = nullptr;  // with momentum > 0 only
  void* grad_avg = nullptr;         // when centered only
};
TANDEM_DECLARE_KERNEL(FusedRmspropKernel,
                      void(int index, DType dtype, const FusedRmspropOptions& options,
                           const std::vector<FusedRmspropTensor>& tensors));

// Check the arguments (a floating dtype; for each non-empty tensor the pointers its options
// read), throwing tandem::Error naming the tensor and what is missing, then call the kernel of
// `device`'s type. Nothing runs when a check fails.
void RunFusedSgd(Device device, DType dtype, const FusedSgdOptions& options,
                 const std::vector<FusedSgdTensor>& tensors);
void RunFusedAdam(Device device, DType dtype, const FusedAdamOptions& options,
                  const std::vector<FusedAdamTensor>& tensors);
void RunFusedRmsprop(Device device, DType dtype, const FusedRmspropOptions& options,
                     const std::vector<FusedRmspropTensor>& tensors);

}  // namespace tandem

#endif  // TANDEM_TENSOR_KERNELS_OPTIMIZER_KERNELS_H_
