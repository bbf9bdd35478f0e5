#include "parallel/distributed/sync_batch_norm.h"

#include <memory>
#include <vector>

#include "nn/layers.h"
#include "tensor/core/autograd.h"

namespace tandem::parallel::distributed {
namespace {

// The all-reduced sum of a tensor that needs no gradient, back on its own device.
Tensor SummedOverRanks(const Tensor& t, ProcessGroup& group) {
  Tensor buffer = t.detach().to(group.device()).contiguous().clone();
  group.allreduce(buffer, ReduceOp::kSum)->wait();
  return buffer.to(t.device());
}

template <typename Norm>
bool Synchronize(nn::Module* module, const std::shared_ptr<ProcessGroup>& group) {
  auto* norm = dynamic_cast<Norm*>(module);
  if (norm == nullptr) return false;
  norm->set_cross_replica_sum([group](const Tensor& t) { return AllReduceSum(t, group); });
  return true;
}

}  // namespace

Tensor AllReduceSum(const Tensor& input, const std::shared_ptr<ProcessGroup>& group) {
  TANDEM_CHECK(group != nullptr, "AllReduceSum: expected a process group but got none");
  Tensor out = SummedOverRanks(input, *group);
  if (NeedsGrad({input})) {
    RecordOp("AllReduceSumBackward", {input}, out, [group](const Tensor& grad) {
      return std::vector<Tensor>{SummedOverRanks(grad, *group)};
    });
  }
  return out;
}

int ConvertSyncBatchNorm(nn::Module& module, const std::shared_ptr<ProcessGroup>& group) {
  TANDEM_CHECK(group != nullptr, "ConvertSyncBatchNorm: expected a process group but got none");
  int converted = 0;
  for (nn::Module* m : module.modules()) {
    if (Synchronize<nn::BatchNorm2d>(m, group) || Synchronize<nn::BatchNorm1d>(m, group)) {
      ++converted;
    }
  }
  return converted;
}

}  // namespace tandem::parallel::distributed
