// Synchronized batch normalisation across DataParallel's replicas: every BatchNorm1d/2d of a
// module normalises in training with the statistics of the whole batch that DataParallel
// split across its devices, not of each device's chunk, and updates its running statistics
// from them. PyTorch's SyncBatchNorm, which PyTorch offers only under DistributedDataParallel
// (parallel/distributed/sync_batch_norm.h is Tandem's); here also across the devices of one
// process. Use it when a device's share of the batch is too small for good statistics.
//
//   auto model = examples::MakeModel("resnet");
//   parallel::ConvertSyncBatchNorm(*model);                // before or after wrapping
//   parallel::DataParallel dp(model, {Device::Cpu(0), Device::Cpu(1)});
//   Tensor loss = dp.forward_loss(criterion, x, y);        // each BatchNorm sees all of x
//
// How: DataParallel runs each replica inside a ReplicaScope. A synchronized layer's sum meets
// the other replicas' sum of the same call: the replicas run the same code, so the k-th sum
// of every replica belongs to the same layer call. Each replica adds the partial sums in
// replica order on its own device, so every replica gets the same bits. Backward meets again
// and sums the gradients the same way. Chunks may be of unequal sizes (each replica sends its
// count with its sums). Outside DataParallel (one device, one chunk, a direct call) a layer
// sees only its own batch, as BatchNorm does.
//
// A replica that throws before meeting the others releases them with an error naming it; a
// backward pass that fails elsewhere releases a replica waiting in the backward meeting.
#ifndef TANDEM_PARALLEL_SYNC_BATCH_NORM_H_
#define TANDEM_PARALLEL_SYNC_BATCH_NORM_H_

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "nn/module.h"
#include "tensor/tensor.h"

namespace tandem::parallel {

// Makes every BatchNorm1d and BatchNorm2d in `module` (itself included) synchronized across
// the replicas of a DataParallel that runs it; returns how many. Refuses a layer that is
// already synchronized (over a process group: one layer has one way to sum).
int ConvertSyncBatchNorm(nn::Module& module);

// The replicas of one DataParallel forward, as one group that sums tensors across itself.
class ReplicaGroup {
 public:
  explicit ReplicaGroup(size_t replicas);
  size_t size() const { return replicas_; }

  // The sum of every replica's `partial` (same shape and dtype on each), on `partial`'s
  // device, differentiably: the gradient of each replica's partial is the sum of every
  // replica's output gradient. Replica `replica`'s k-th call meets the others' k-th.
  Tensor Sum(size_t replica, const Tensor& partial);

  // Releases every replica waiting in (or later reaching) a meeting with an error: replica
  // `replica` has failed with `why` and will not come.
  void Abort(size_t replica, const std::string& why);
  // Replica `replica` has finished its forward: a replica waiting for a forward sum it never
  // made is released with an error (the replicas' code diverged).
  void Leave(size_t replica);

 private:
  // One meeting point, reusable: a backward pass may run twice over a retained graph.
  struct Meeting {
    std::vector<Tensor> parts;
    size_t arrived = 0;
    uint64_t generation = 0;
    std::shared_ptr<const std::vector<Tensor>> published;  // the last completed round's parts
  };
  // Waits until every replica has brought its part to meeting `key` of `meetings`, and
  // returns their sum on `part`'s device, added in replica order.
  Tensor Meet(std::map<uint64_t, Meeting>& meetings, uint64_t key, size_t replica,
              const Tensor& part, const char* phase);

  const size_t replicas_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<uint64_t> calls_;  // per replica: forward sums so far
  std::vector<bool> left_;       // per replica: its forward has finished
  std::map<uint64_t, Meeting> forward_;
  std::map<uint64_t, Meeting> backward_;
  std::string aborted_;  // why the group cannot meet any more; empty while it can
};

// While alive, this thread runs replica `replica` of `group`: synchronized layers sum over
// it. Scopes nest (the previous one is restored). Its end is the replica's end: it leaves the
// group (ReplicaGroup::Leave), or aborts it when an exception unwinds the scope.
class ReplicaScope {
 public:
  ReplicaScope(std::shared_ptr<ReplicaGroup> group, size_t replica);
  ~ReplicaScope();
  ReplicaScope(const ReplicaScope&) = delete;
  ReplicaScope& operator=(const ReplicaScope&) = delete;

 private:
  std::shared_ptr<ReplicaGroup> group_;
  size_t replica_;
  int uncaught_at_entry_;
  std::shared_ptr<ReplicaGroup> previous_group_;
  size_t previous_replica_;
};

// The sum of `partial` over the replicas of the scope this thread runs in (ReplicaScope);
// `partial` itself outside any scope. What a synchronized layer calls.
Tensor SumOverReplicas(const Tensor& partial);

}  // namespace tandem::parallel

#endif  // TANDEM_PARALLEL_SYNC_BATCH_NORM_H_
