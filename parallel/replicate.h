// Replicate: copies of a module on several devices whose parameters are differentiable
// broadcasts of the original's, so that backward reduce-adds every replica's gradients into
// the original parameters' .grad (PyTorch's torch.nn.parallel.replicate).
//
// The broadcast is split into buckets of parameters in reverse registration order (the
// order backward produces their gradients), each bucket one autograd node: a bucket's
// reduce-add starts as soon as every replica has produced its gradients, while the rest of
// backward is still running. Buffers that require grad are broadcast the same way, so their
// .grad is the sum over the replicas; the others without gradient, and replica 0 (on the
// module's own device) shares the original's, so that its in-place updates (BatchNorm's
// running statistics) reach the original, as in PyTorch.
//
// Between logical CPU devices the copies are copy-on-write aliases of the original's memory
// (Note [Copy-on-write aliases] in tensor/core/tensor.cc): an in-place write inside replica 1,
// 2, ... stays its own, as in PyTorch, where those replicas hold copies. With
// `defer_source_writes` (DataParallel) replica 0 is such an alias too, so that nothing writes
// the memory the other replicas read while they run, and CommitSourceWrites() afterwards hands
// its writes to the original, where PyTorch's replica 0 would have made them.
//
// Every call clones the module's structure afresh (Module::replicate_structure: no tensor
// is copied, each is bound to its broadcast copy), as PyTorch's replicate does: a replica
// is never stale, whatever changed in the module since the last call (its submodules, its
// plain C++ members, its modes). The clone of a small module tree costs microseconds; the
// step pays for one coalesced broadcast.
//
//   parallel::Replicator replicator(model, {Device::Cpu(0), Device::Cpu(1)});
//   std::vector<std::shared_ptr<nn::Module>> replicas = replicator.Replicate();
//   // or, once: auto replicas = parallel::replicate(*model, devices);
#ifndef TANDEM_PARALLEL_REPLICATE_H_
#define TANDEM_PARALLEL_REPLICATE_H_

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "nn/module.h"
#include "tensor/tensor.h"

namespace tandem::parallel {

// Parameters per gradient-reduction bucket (bytes); the last bucket may be smaller.
inline constexpr size_t kDefaultBucketBytes = size_t{1} << 20;

// The differentiable broadcast of `tensors` (all on one device) to `devices`: result[d][i].
// Backward sums the copies' gradients onto the source device (reduce_add_coalesced), one
// autograd node per bucket of `bucket_bytes`, filled in reverse order of `tensors`. With
// `alias_source`, result[0] is a copy-on-write alias of `tensors` (alias_on_cpu_device) where
// every device is a CPU device, instead of `tensors`' own memory.
std::vector<std::vector<Tensor>> Broadcast(const std::vector<Tensor>& tensors,
                                           const std::vector<Device>& devices,
                                           size_t bucket_bytes = kDefaultBucketBytes,
                                           bool alias_source = false);

class Replicator {
 public:
  // `module`'s parameters and buffers must all be on devices[0].
  Replicator(std::shared_ptr<nn::Module> module, std::vector<Device> devices,
             size_t bucket_bytes = kDefaultBucketBytes);

  // One replica per device, for the first `count` devices (all when -1). With `detach` (or
  // under NoGradGuard) no graph is built: the replicas' parameters are plain copies. Each
  // call makes new replicas of the module as it is now.
  // With `defer_source_writes`, replica 0's parameters between CPU devices are copy-on-write
  // aliases whose writes reach the module at CommitSourceWrites(), which the caller must call
  // once the replicas ran (DataParallel does, even when a replica threw).
  std::vector<std::shared_ptr<nn::Module>> Replicate(int count = -1, bool detach = false,
                                                     bool defer_source_writes = false);
  void CommitSourceWrites();

  const std::vector<Device>& devices() const { return devices_; }

 private:
  std::shared_ptr<nn::Module> module_;
  std::vector<Device> devices_;
  size_t bucket_bytes_;
  // (original, replica 0's alias) pairs of the last Replicate with defer_source_writes.
  std::vector<std::pair<Tensor, Tensor>> source_aliases_;
};

// One replica per device (Replicator(module, devices).Replicate(-1, detach)).
std::vector<std::shared_ptr<nn::Module>> replicate(const std::shared_ptr<nn::Module>& module,
                                                   const std::vector<Device>& devices,
                                                   bool detach = false);

}  // namespace tandem::parallel

#endif  // TANDEM_PARALLEL_REPLICATE_H_
