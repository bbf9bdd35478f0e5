#include "parallel/distributed/sharded_grad_scaler.h"

#include <memory>
#include <utility>

#include "tensor/base/error.h"

namespace tandem::parallel::distributed {

ShardedGradScaler::ShardedGradScaler(std::shared_ptr<ProcessGroup> process_group,
                                     const nn::GradScalerOptions& options)
    : nn::GradScaler(options), group_(std::move(process_group)) {
  TANDEM_CHECK(group_ != nullptr,
               "ShardedGradScaler: expected a process group but got none; pass the group the "
               "gradients are sharded over (the one FullyShardedDataParallel was given)");
}

bool ShardedGradScaler::FoundInfAnywhere(bool found_here) {
  Tensor flag = full({1}, found_here ? 1.0 : 0.0, TensorOptions(kInt64).device(group_->device()));
  group_->allreduce(flag, ReduceOp::kSum)->wait();
  return flag.to(Device::Cpu(0)).item() > 0;
}

}  // namespace tandem::parallel::distributed
