// Replicate: copies of a module on several devices whose parameters are differentiable
// broadcasts of the original's, so that backward reduce-adds every replica's gradients into
// the original parameters' .grad (PyTorch's torch.nn.parallel.replicate).
//
// The broadcast is split into buckets of parameters in reverse registration order (the
// order backward produces their gradients), each bucket one autograd node: a bucket's
// reduce-add starts as soon as every replica has produced its gradients, while the rest of
// backward is still running. Buffers are broadcast without gradient; replica 0 (on the
// module's own device) shares the original's buffers, so its in-place updates (BatchNorm's
// running statistics) reach the original, as in PyTorch.
//
// Replicator caches the cloned structure between calls and only re-binds fresh broadcast
// tensors each step (Module::replace_parameter), so a training step pays for one coalesced
// broadcast, not a deep clone:
//
//   parallel::Replicator replicator(model, {Device::Cpu(0), Device::Cpu(1)});
//   std::vector<std::shared_ptr<nn::Module>> replicas = replicator.Replicate();
//   // or, once: auto replicas = parallel::replicate(*model, devices);
#ifndef TANDEM_PARALLEL_REPLICATE_H_
#define TANDEM_PARALLEL_REPLICATE_H_

#include <cstddef>
#include <memory>
#include <vector>

#include "nn/module.h"
#include "tensor/tensor.h"

namespace tandem::parallel {

// Parameters per gradient-reduction bucket (bytes); the last bucket may be smaller.
inline constexpr size_t kDefaultBucketBytes = size_t{1} << 20;

// The differentiable broadcast of `tensors` (all on one device) to `devices`: result[d][i].
// Backward sums the copies' gradients onto the source device (reduce_add_coalesced), one
// autograd node per bucket of `bucket_bytes`, filled in reverse order of `tensors`.
std::vector<std::vector<Tensor>> Broadcast(const std::vector<Tensor>& tensors,
                                           const std::vector<Device>& devices,
                                           size_t bucket_bytes = kDefaultBucketBytes);

class Replicator {
 public:
  // `module`'s parameters and buffers must all be on devices[0].
  Replicator(std::shared_ptr<nn::Module> module, std::vector<Device> devices,
             size_t bucket_bytes = kDefaultBucketBytes);

  // One replica per device, for the first `count` devices (all when -1). With `detach` (or
  // under NoGradGuard) no graph is built: the replicas' parameters are plain copies.
  // Replicas share their structure with earlier calls' (cloned once); each call binds fresh
  // broadcasts of the module's current parameters and buffers and its training modes.
  std::vector<std::shared_ptr<nn::Module>> Replicate(int count = -1, bool detach = false);

  const std::vector<Device>& devices() const { return devices_; }

 private:
  // Whether the cached clones have the module's names, shapes and dtypes.
  bool CacheMatchesModule(const std::vector<nn::NamedTensor>& parameters,
                          const std::vector<nn::NamedTensor>& buffers) const;

  std::shared_ptr<nn::Module> module_;
  std::vector<Device> devices_;
  size_t bucket_bytes_;
  std::vector<std::shared_ptr<nn::Module>> clones_;  // one per device, built lazily
};

// One fresh replica per device (clones every call; Replicator caches).
std::vector<std::shared_ptr<nn::Module>> replicate(const std::shared_ptr<nn::Module>& module,
                                                   const std::vector<Device>& devices,
                                                   bool detach = false);

}  // namespace tandem::parallel

#endif  // TANDEM_PARALLEL_REPLICATE_H_
