// Casting a model's weights for autocast in one launch: autocast::CastWeights rounds every
// float32 parameter of a list to the guard's lower dtype with one multi-tensor kernel call per
// device (ForeachCastKernel, tensor/kernels/cast_kernels.h) and puts the casts in the guard's
// weight cache, where linear and matmul find them instead of casting each weight with a launch
// of its own. Call it once at the start of a forward under autocast, with the weights its
// GEMMs will cast: a GPT-2 layer's 4 linears take 8 cast launches a layer without it, one a
// step (for every layer together) with it.
//
//   tandem::AutocastGuard autocast(tandem::DeviceType::kCUDA, tandem::kBFloat16);
//   tandem::autocast::CastWeights({fc1.weight, fc1.bias, fc2.weight, fc2.bias});
//   Tensor y = tandem::linear(tandem::linear(x, fc1.weight, fc1.bias).relu(), fc2.weight,
//                             fc2.bias);  // both linears read the cached bfloat16 casts
//
// The casts are the ones Tensor::to makes, bit for bit, and they live until the outermost
// guard closes (as every cached weight cast does).
#ifndef TANDEM_TENSOR_OPS_AUTOCAST_WEIGHTS_H_
#define TANDEM_TENSOR_OPS_AUTOCAST_WEIGHTS_H_

#include <vector>

#include "tensor/core/tensor.h"

namespace tandem {
namespace autocast {

// Inside a live autocast guard with its weight cache on, casts each weight the cache would hold
// (a float32 leaf that requires grad, on a device type autocast is on for, whose cast is not
// cached yet) to the guard's lower dtype for its device type and caches it as a cast without a
// graph, as the autocast linear ops cache their weights' casts (CastWeightOutsideGraph).
// Contiguous weights of one device go into one ForeachCastKernel call; a strided one is cast on
// its own. Any other tensor is skipped, and so is a weight listed twice after its first time.
// Outside a guard, or with the cache off, does nothing.
void CastWeights(const std::vector<Tensor>& weights);

}  // namespace autocast
}  // namespace tandem

#endif  // TANDEM_TENSOR_OPS_AUTOCAST_WEIGHTS_H_
