// ShardedGradScaler: float16 loss scaling when the gradients are sharded across ranks
// (FullyShardedDataParallel, whose optimizer steps each rank's shard), as PyTorch's
// torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler. Each rank unscales its own
// shard and checks it for inf/NaN; one all-reduce of that flag per optimizer step then makes
// every rank skip the same steps and keep the same scale. (A plain nn::GradScaler would let
// the rank whose shard overflowed skip a step the others take, and the model would diverge.)
//
//   FullyShardedDataParallel fsdp(model, group);
//   nn::AdamW optimizer(fsdp.parameters(), nn::AdamWOptions(3e-4));   // the local shards
//   ShardedGradScaler scaler(group);
//   for (...) {
//     AutocastGuard autocast(kFloat16);   // float16 activations, float32 shards
//     Tensor loss = criterion.forward(fsdp.forward(x), y);
//     scaler.scale(loss).backward();
//     scaler.step(optimizer);             // collective: every rank steps or none
//     scaler.update();
//   }
//
// Everything else is nn::GradScaler's (options, state_dict, unscale_ before clipping with
// fsdp.clip_grad_norm_). step() is a collective: every rank calls it for the same optimizers
// in the same order.
#ifndef TANDEM_PARALLEL_DISTRIBUTED_SHARDED_GRAD_SCALER_H_
#define TANDEM_PARALLEL_DISTRIBUTED_SHARDED_GRAD_SCALER_H_

#include <memory>

#include "nn/grad_scaler.h"
#include "parallel/distributed/process_group.h"

namespace tandem::parallel::distributed {

class ShardedGradScaler : public nn::GradScaler {
 public:
  explicit ShardedGradScaler(std::shared_ptr<ProcessGroup> process_group,
                             const nn::GradScalerOptions& options = nn::GradScalerOptions());

  const std::shared_ptr<ProcessGroup>& process_group() const { return group_; }

 protected:
  // Every rank's finding, all-reduced.
  bool FoundInfAnywhere(bool found_here) override;

 private:
  std::shared_ptr<ProcessGroup> group_;
};

}  // namespace tandem::parallel::distributed

#endif  // TANDEM_PARALLEL_DISTRIBUTED_SHARDED_GRAD_SCALER_H_
