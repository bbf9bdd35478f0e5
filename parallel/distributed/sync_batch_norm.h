// Synchronized batch normalisation across the ranks of a process group, as PyTorch's
// SyncBatchNorm: every BatchNorm1d/2d of a model normalises in training with the mean and
// variance of all ranks' batches together (and updates its running statistics from them),
// so that small per-rank batches train as the global batch does. Use it with
// DistributedDataParallel when each rank's batch is too small for good statistics.
//
//   auto model = examples::MakeModel("resnet");
//   ConvertSyncBatchNorm(*model, group);        // before wrapping, on every rank
//   DistributedDataParallel ddp(model, group);  // train as usual
//
// Ranks may have batches of different sizes. Each synchronized layer runs two all-reduces in
// forward (channel sums with the ranks' counts, then squared deviations from the common mean)
// and two in backward (their gradients), in the same order on every rank, on the group's
// device (a CUDA tensor reduced by an MPI group goes through the CPU). Evaluation mode uses the
// running statistics, with no communication.
#ifndef TANDEM_PARALLEL_DISTRIBUTED_SYNC_BATCH_NORM_H_
#define TANDEM_PARALLEL_DISTRIBUTED_SYNC_BATCH_NORM_H_

#include <memory>

#include "nn/module.h"
#include "parallel/distributed/process_group.h"
#include "tensor/tensor.h"

namespace tandem::parallel::distributed {

// The sum of `input` over every rank of `group`, on every rank, differentiably: the gradient of
// each rank's input is the sum of every rank's output gradient. A collective: every rank calls
// it (and runs its backward) in the same order.
Tensor AllReduceSum(const Tensor& input, const std::shared_ptr<ProcessGroup>& group);

// Makes every BatchNorm1d and BatchNorm2d in `module` (itself included) synchronized over
// `group`; returns how many. nn::BatchNormBase::set_cross_replica_sum(nullptr) undoes one.
int ConvertSyncBatchNorm(nn::Module& module, const std::shared_ptr<ProcessGroup>& group);

}  // namespace tandem::parallel::distributed

#endif  // TANDEM_PARALLEL_DISTRIBUTED_SYNC_BATCH_NORM_H_
