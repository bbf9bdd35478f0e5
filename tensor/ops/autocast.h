// Automatic mixed precision, as torch.autocast(device_type, dtype): while an AutocastGuard is
// open, the ops that gain from 16-bit floats run in them and the ops that lose accuracy in them
// run in float32, whatever dtype their inputs come in. Use it around a model's forward (and its
// loss); call backward after the guard closes, or inside it: backward runs in the dtypes the
// forward chose either way.
//
//   {
//     tandem::AutocastGuard autocast(tandem::DeviceType::kCPU);   // bfloat16 on the CPU
//     Tensor logits = model->forward(x);                          // linear: bfloat16
//     Tensor loss = tandem::cross_entropy(logits, labels);        // float32
//   }
//   loss.backward();   // float32 gradients reach the float32 parameters
//
// The policy (PyTorch's CPU and CUDA lists, restricted to the ops Tandem has):
//   lower precision (cast to the guard's dtype): matmul, linear, conv2d;
//   float32: softmax, log_softmax, exp, log, pow, sum (and so mean), nll_loss, cross_entropy,
//     mse_loss, the losses of nn/loss.h, and the norms of nn/layers.h (BatchNorm, LayerNorm);
//   add_layer_norm (Tandem's, not PyTorch's): float32, its normalised output in the guard's
//     dtype for the GEMM after it (ops.h);
//   promote (to the widest floating dtype among the inputs): cat (and so stack);
//   every other op runs in the dtype of its inputs (binary ops promote as always).
// Only floating tensors on the guarded device type are cast; float64 and integer tensors are
// left alone. Casts are differentiable: the gradient flows back converted to the input dtype.
// linear with a float32 weight is one node instead (Note [Autocast linear], tensor/ops/linalg.cc):
// its weight gradient comes out of the 16-bit GEMM in float32, and it keeps no 16-bit copy of
// an input that needs no gradient.
//
// Weights are cast once per guard: a float32 leaf that requires grad (a parameter) cast to the
// lower dtype is cached until the outermost guard on the thread that opened it closes, so a
// weight used twice in a forward is cast once (linear caches its weight's cast only where it
// keeps it for backward anyway, so a first layer's cast is freed after its product). The state,
// cache included, travels with every task posted to a device worker (tensor/runtime/threads.h):
// DataParallel's replicas and the autograd engine's workers see the caller's autocast, unlike
// PyTorch, whose thread-local autocast does not reach DataParallel's replica threads.
#ifndef TANDEM_TENSOR_OPS_AUTOCAST_H_
#define TANDEM_TENSOR_OPS_AUTOCAST_H_

#include <cstddef>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "tensor/base/autocast_mode.h"
#include "tensor/base/device.h"
#include "tensor/base/dtype.h"
#include "tensor/core/tensor.h"

namespace tandem {

// Turns autocast on (or, with enabled = false, off) for `device_type` on this thread while it
// lives, casting to `dtype` (bfloat16 or float16; default: the enclosing guard's dtype for that
// device type, else kBFloat16 on the CPU and kFloat16 on CUDA). Guards nest and restore the
// previous state when they close; close them on the thread that opened them, innermost first.
// cache_enabled = false turns the weight cache off inside this guard.
class AutocastGuard {
 public:
  explicit AutocastGuard(DeviceType device_type, std::optional<DType> dtype = std::nullopt,
                         bool enabled = true, bool cache_enabled = true);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  AutocastState previous_;
  std::shared_ptr<AutocastCache> owned_cache_;  // set when this guard opened the cache
};

namespace autocast {

enum class CastPolicy {
  kLowerPrecision,  // cast to the autocast dtype of the tensor's device type
  kFloat32,         // cast 16-bit floats up to float32
  kPromote,         // cast to the widest floating dtype among the eligible inputs
};

// Whether autocast may cast `t`: defined, floating but not float64, and on a device type
// autocast is on for.
bool IsEligible(const Tensor& t);

// `t` as an op of the lower-precision list computes with it: cast to the autocast dtype of its
// device type when eligible, from the weight cache when `t` is a parameter; `t` itself when
// nothing applies.
Tensor CastToLowerPrecision(const Tensor& t);
// `weight` cast to the autocast dtype of its device type without a graph (no grad_fn), for an op
// that routes the gradient to the uncast weight itself (linear: Note [Autocast linear] in
// tensor/ops/linalg.cc). A cast the weight cache holds is used; a new one is stored there only when
// `keep` (the op holds it until backward anyway), so a cast that the op drops after its forward
// is freed then rather than when the guard closes. `weight` itself (detached) when nothing
// applies.
Tensor CastWeightOutsideGraph(const Tensor& weight, bool keep);
// `t` as an op of the float32 list computes with it: 16-bit floats cast up when eligible.
Tensor CastToFloat32(const Tensor& t);
// The eligible tensors of `tensors` cast to the widest floating dtype among them.
std::vector<Tensor> Promote(const std::vector<Tensor>& tensors);

// How many casts the weight cache live on this thread holds (0 outside any guard).
size_t CachedCastCount();

namespace internal {
// The weight cache's hooks for autocast::CastWeights (tensor/ops/autocast_weights.h), which casts
// many weights in one launch. The dtype `weight` would be cached as, when the live cache would
// hold its cast and holds none yet (CastWeightOutsideGraph's rule: a float32 leaf that requires
// grad, eligible on its device); else nullopt.
std::optional<DType> UncachedWeightCastDType(const Tensor& weight);
// Caches `cast` as CastWeightOutsideGraph caches one: made without a graph. Does nothing
// without a live cache.
void InsertWeightCastOutsideGraph(const Tensor& weight, DType target, Tensor cast);
}  // namespace internal

// ---- What TANDEM_AUTOCAST (below) expands to ----------------------------------------------

namespace internal {

inline bool NeedsCast(CastPolicy policy, const Tensor& t) {
  if (!IsEligible(t)) return false;
  switch (policy) {
    case CastPolicy::kLowerPrecision:
      return t.dtype() != AutocastMode::GetDType(t.device().type());
    case CastPolicy::kFloat32:
      return t.dtype() != kFloat32;
    case CastPolicy::kPromote:
      return false;  // decided over the whole list
  }
  return false;
}

inline bool NeedsCast(CastPolicy policy, const std::vector<Tensor>& tensors) {
  if (policy != CastPolicy::kPromote) {
    for (const Tensor& t : tensors) {
      if (NeedsCast(policy, t)) return true;
    }
    return false;
  }
  std::optional<DType> seen;
  for (const Tensor& t : tensors) {
    if (!IsEligible(t)) continue;
    if (seen && *seen != t.dtype()) return true;
    seen = t.dtype();
  }
  return false;
}

template <typename T>
bool NeedsCast(CastPolicy, const T&) {
  return false;  // not a tensor
}

inline Tensor Cast(CastPolicy policy, const Tensor& t) {
  return policy == CastPolicy::kLowerPrecision ? CastToLowerPrecision(t)
         : policy == CastPolicy::kFloat32      ? CastToFloat32(t)
                                               : t;
}

inline std::vector<Tensor> Cast(CastPolicy policy, const std::vector<Tensor>& tensors) {
  if (policy == CastPolicy::kPromote) return Promote(tensors);
  std::vector<Tensor> out;
  out.reserve(tensors.size());
  for (const Tensor& t : tensors) out.push_back(Cast(policy, t));
  return out;
}

template <typename T>
const T& Cast(CastPolicy, const T& value) {
  return value;
}

template <typename... Args>
bool AnyNeedsCast(CastPolicy policy, const Args&... args) {
  return (NeedsCast(policy, args) || ...);
}

template <typename F, typename... Args>
auto CallWithCasts(CastPolicy policy, const F& op, const Args&... args) {
  return op(Cast(policy, args)...);
}

}  // namespace internal
}  // namespace autocast
}  // namespace tandem

// The autocast hook of an op on one of the lists: the first line of the op, naming the op
// and passing every argument. When autocast is on and an argument needs a cast, the op is
// called again with the cast arguments (which need none, so that call runs the op itself).
// Works in member functions too (a module's forward: the call goes through `this`).
//   Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
//     TANDEM_AUTOCAST(kLowerPrecision, linear, x, weight, bias);
#define TANDEM_AUTOCAST(policy, op, ...)                                                          \
  do {                                                                                            \
    constexpr auto tandem_autocast_policy = ::tandem::autocast::CastPolicy::policy;               \
    if (::tandem::AutocastMode::IsAnyEnabled() &&                                                 \
        ::tandem::autocast::internal::AnyNeedsCast(tandem_autocast_policy, __VA_ARGS__)) {        \
      return ::tandem::autocast::internal::CallWithCasts(                                         \
          tandem_autocast_policy, [&](const auto&... args) { return op(args...); }, __VA_ARGS__); \
    }                                                                                             \
  } while (false)

#endif  // TANDEM_TENSOR_OPS_AUTOCAST_H_
