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
//
// StartBroadcastCoalesced is the same in two halves, to overlap the broadcast with other work:
// it reads the root's tensors and issues the collectives; Wait() blocks until they are done and
// writes the values into a receiver's tensors (do not touch those before).
//   PendingBroadcast incoming = StartBroadcastCoalesced(group, theirs, /*root=*/1);
//   ... compute on other tensors while the group's thread receives ...
//   incoming.Wait();
#ifndef TANDEM_PARALLEL_DISTRIBUTED_BROADCAST_COALESCED_H_
#define TANDEM_PARALLEL_DISTRIBUTED_BROADCAST_COALESCED_H_

#include <memory>
#include <vector>

#include "parallel/distributed/process_group.h"
#include "tensor/tensor.h"

namespace tandem::parallel::distributed {

void BroadcastCoalesced(ProcessGroup& group, const std::vector<Tensor>& tensors, int root = 0);

class PendingBroadcast {
 public:
  // Waits for every collective and, on a receiver, copies the values out. Once.
  void Wait();

 private:
  friend PendingBroadcast StartBroadcastCoalesced(ProcessGroup&, const std::vector<Tensor>&, int);
  struct Flat {
    std::shared_ptr<Work> work;
    Tensor flat;
    std::vector<Tensor> tensors;  // the ones of its dtype
  };
  bool receiver_ = false;
  std::vector<Flat> flats_;
};

PendingBroadcast StartBroadcastCoalesced(ProcessGroup& group, const std::vector<Tensor>& tensors,
                                         int root = 0);

}  // namespace tandem::parallel::distributed

#endif  // TANDEM_PARALLEL_DISTRIBUTED_BROADCAST_COALESCED_H_
