#include "tensor/ops/autocast_weights.h"

#include <algorithm>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "tensor/base/device.h"
#include "tensor/base/dtype.h"
#include "tensor/base/grad_mode.h"
#include "tensor/core/tensor.h"
#include "tensor/kernels/cast_kernels.h"
#include "tensor/ops/autocast.h"

namespace tandem {
namespace autocast {

void CastWeights(const std::vector<Tensor>& weights) {
  // One ForeachCastKernel call per device and dtype: a call takes one device's pointers.
  struct Group {
    Device device;
    DType target;
    std::vector<Tensor> sources, casts;
    std::vector<ForeachCastTensor> tensors;
  };
  std::vector<Group> groups;
  std::set<const void*> seen;  // a weight listed twice (tied) is cast once
  NoGradGuard no_grad;         // the casts carry no graph, as CastWeightOutsideGraph's
  for (const Tensor& w : weights) {
    if (!w.defined() || !seen.insert(w.impl()).second) continue;
    const std::optional<DType> target = internal::UncachedWeightCastDType(w);
    if (!target) continue;
    if (!w.is_contiguous() || !ForeachCastSupports(w.dtype(), *target)) {
      // A strided view: a cast of its own, as the linear ops would make it.
      internal::InsertWeightCastOutsideGraph(w, *target, w.to(*target));
      continue;
    }
    auto group = std::find_if(groups.begin(), groups.end(), [&](const Group& g) {
      return g.device == w.device() && g.target == *target;
    });
    if (group == groups.end()) {
      groups.push_back(Group{w.device(), *target, {}, {}, {}});
      group = groups.end() - 1;
    }
    Tensor cast = empty(w.shape(), TensorOptions().dtype(*target).device(w.device()));
    group->tensors.push_back({w.numel(), w.data_ptr(), cast.data_ptr()});
    group->sources.push_back(w);
    group->casts.push_back(std::move(cast));
  }
  for (Group& g : groups) {
    RunForeachCast(g.device, kFloat32, g.target, g.tensors);
    for (size_t i = 0; i < g.sources.size(); ++i) {
      internal::InsertWeightCastOutsideGraph(g.sources[i], g.target, std::move(g.casts[i]));
    }
  }
}

}  // namespace autocast
}  // namespace tandem
