// BroadcastCoalesced: copies one rank's tensors to every rank of a ProcessGroup in as few
// collectives as their dtypes allow (one flat buffer per dtype), as torch.distributed's
// _broadcast_coalesced. DistributedDataParallel uses it to start every replica from rank 0's
// parameters and buffers; ZeroRedundancyOptimizer to send each rank's updated share to the rest.
//
//   BroadcastCoalesced(*group, module->parameters(), /*root=*/0);  // every rank: rank 0's values
//
// Every rank calls it with tensors of the same shapes and dtypes in the same order (each rank's
// own tensors, on the group's device); on return they hold `root`'s values. Collective: every
// rank of the group must call it.
#ifndef TANDEM_PARALLEL_DISTRIBUTED_BROADCAST_COALESCED_H_
#define TANDEM_PARALLEL_DISTRIBUTED_BROADCAST_COALESCED_H_

#include <vector>

#include "parallel/distributed/process_group.h"
#include "tensor/tensor.h"

namespace tandem::parallel::distributed {

void BroadcastCoalesced(ProcessGroup& group, const std::vector<Tensor>& tensors, int root = 0);

}  // namespace tandem::parallel::distributed

#endif  // TANDEM_PARALLEL_DISTRIBUTED_BROADCAST_COALESCED_H_
