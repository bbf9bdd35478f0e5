#include "tensor/ops/autocast.h"

#include <map>
#include <mutex>
#include <optional>
#include <utility>

#include "tensor/base/error.h"
#include "tensor/base/grad_mode.h"

namespace tandem {
namespace {

// The weight cache of one outermost guard. Shared by every thread that inherited the guard's
// state (DataParallel's replicas run on device workers at the same time), hence the mutex.
class WeightCastCache final : public AutocastCache {
 public:
  // The cached cast of `weight` to `dtype`, or an undefined Tensor. A cast made with grad mode
  // off carries no graph, so it does not serve a caller that records one.
  // `outside_graph`: the caller detaches the cast, so a recorded one serves it as well.
  Tensor Find(const Tensor& weight, DType dtype, bool outside_graph = false) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = entries_.find(Key{weight.impl(), dtype});
    if (it == entries_.end()) return Tensor();
    if (!outside_graph && GradMode::IsEnabled() && !it->second.recorded) return Tensor();
    return it->second.cast;
  }

  // Stores `cast` unless another thread stored a usable cast of `weight` first; returns the
  // one to use, so that every thread computes with one cast.
  Tensor Insert(const Tensor& weight, DType dtype, Tensor cast) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return cast;  // the guard has closed; a task that outlived it casts uncached
    const bool recorded = GradMode::IsEnabled();
    Entry& entry = entries_[Key{weight.impl(), dtype}];
    if (entry.cast.defined() && (entry.recorded || !recorded)) return entry.cast;
    // The source is held so that its address is not reused by another tensor while cached.
    entry = Entry{weight, std::move(cast), recorded};
    return entry.cast;
  }

  // Drops every cast and refuses new ones: called when the guard that opened the cache closes.
  void Close() {
    std::map<Key, Entry> dropped;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      closed_ = true;
      dropped.swap(entries_);
    }
  }

  size_t size() {
    std::lock_guard<std::mutex> lock(mutex_);
    return entries_.size();
  }

 private:
  using Key = std::pair<const void*, DType>;
  struct Entry {
    Tensor source;
    Tensor cast;
    bool recorded = false;  // made with grad mode on: the cast is in the graph
  };

  std::mutex mutex_;
  bool closed_ = false;
  std::map<Key, Entry> entries_;
};

WeightCastCache* LiveCache() {
  return dynamic_cast<WeightCastCache*>(AutocastMode::GetState().cache.get());
}

// The live cache where `t` may be cached, else null. PyTorch's rule: only float32 parameters
// (leaves that require grad) are cached; an activation is cast where it is used and is not kept
// alive past its use.
WeightCastCache* CacheFor(const Tensor& t) {
  return t.dtype() == kFloat32 && t.is_leaf() && t.requires_grad() ? LiveCache() : nullptr;
}

}  // namespace

AutocastGuard::AutocastGuard(DeviceType device_type, std::optional<DType> dtype, bool enabled,
                             bool cache_enabled)
    : previous_(AutocastMode::GetState()) {
  AutocastState state = previous_;
  const int type = static_cast<int>(device_type);
  if (dtype) {
    TANDEM_CHECK(IsReducedFloatingPoint(*dtype), "AutocastGuard(", DeviceTypeName(device_type),
                 "): expected a 16-bit floating dtype (bfloat16 or float16) to autocast to but "
                 "got ",
                 *dtype, "; pass kBFloat16 or kFloat16, or enabled = false to turn autocast off");
    state.dtypes[type] = *dtype;
  }
  if (enabled) {
    state.enabled_mask = static_cast<uint8_t>(state.enabled_mask | (1u << type));
  } else {
    state.enabled_mask = static_cast<uint8_t>(state.enabled_mask & ~(1u << type));
  }
  if (!cache_enabled) {
    state.cache = nullptr;
  } else if (enabled && state.cache == nullptr) {
    owned_cache_ = std::make_shared<WeightCastCache>();
    state.cache = owned_cache_;
  }
  AutocastMode::SetState(std::move(state));
}

AutocastGuard::~AutocastGuard() {
  AutocastMode::SetState(std::move(previous_));
  if (owned_cache_) static_cast<WeightCastCache*>(owned_cache_.get())->Close();
}

namespace autocast {

bool IsEligible(const Tensor& t) {
  return t.defined() && AutocastMode::IsEnabled(t.device().type()) && IsFloatingPoint(t.dtype()) &&
         t.dtype() != kFloat64;
}

Tensor CastToLowerPrecision(const Tensor& t) {
  if (!IsEligible(t)) return t;
  const DType target = AutocastMode::GetDType(t.device().type());
  if (t.dtype() == target) return t;
  WeightCastCache* cache = CacheFor(t);
  if (cache == nullptr) return t.to(target);
  Tensor cached = cache->Find(t, target);
  if (cached.defined()) return cached;
  return cache->Insert(t, target, t.to(target));
}

Tensor CastWeightOutsideGraph(const Tensor& weight, bool keep) {
  const DType target = AutocastMode::GetDType(weight.device().type());
  if (!IsEligible(weight) || weight.dtype() == target) return weight.detach();
  WeightCastCache* cache = CacheFor(weight);
  if (cache != nullptr) {
    Tensor cached = cache->Find(weight, target, /*outside_graph=*/true);
    if (cached.defined()) return cached.detach();
  }
  NoGradGuard no_grad;  // made, and cached, as a cast without a graph
  Tensor cast = weight.to(target);
  if (keep && cache != nullptr) cast = cache->Insert(weight, target, std::move(cast));
  return cast.detach();
}

namespace internal {

std::optional<DType> UncachedWeightCastDType(const Tensor& weight) {
  if (!IsEligible(weight)) return std::nullopt;
  const DType target = AutocastMode::GetDType(weight.device().type());
  WeightCastCache* cache = CacheFor(weight);
  if (cache == nullptr || weight.dtype() == target) return std::nullopt;
  if (cache->Find(weight, target, /*outside_graph=*/true).defined()) return std::nullopt;
  return target;
}

void InsertWeightCastOutsideGraph(const Tensor& weight, DType target, Tensor cast) {
  WeightCastCache* cache = LiveCache();
  if (cache == nullptr) return;
  NoGradGuard no_grad;
  cache->Insert(weight, target, std::move(cast));
}

}  // namespace internal

Tensor CastToFloat32(const Tensor& t) {
  return IsEligible(t) && t.dtype() != kFloat32 ? t.to(kFloat32) : t;
}

std::vector<Tensor> Promote(const std::vector<Tensor>& tensors) {
  std::optional<DType> widest;
  for (const Tensor& t : tensors) {
    if (IsEligible(t)) widest = widest ? PromoteTypes(*widest, t.dtype()) : t.dtype();
  }
  std::vector<Tensor> out;
  out.reserve(tensors.size());
  for (const Tensor& t : tensors) {
    out.push_back(IsEligible(t) && t.dtype() != *widest ? t.to(*widest) : t);
  }
  return out;
}

size_t CachedCastCount() {
  WeightCastCache* cache = LiveCache();
  return cache == nullptr ? 0 : cache->size();
}

}  // namespace autocast
}  // namespace tandem
