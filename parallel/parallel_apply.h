// parallel_apply: runs replica i on inputs[i] on device i's worker, all at once, and returns
// the outputs in order (PyTorch's torch.nn.parallel.parallel_apply, without a thread per
// call: each device's DeviceWorker runs its replica).
//
// The replicas run with the caller's grad mode. If any replica throws, parallel_apply waits
// for every replica to stop, then throws a tandem::Error whose message starts with
// "Caught <exception type> in replica <i> on device <device>:" followed by the original
// message, with the original exception nested (std::rethrow_if_nested reaches its type).
//
//   auto replicas = parallel::replicate(model, devices);
//   auto inputs = parallel::scatter_inputs({x}, devices);
//   std::vector<std::vector<Tensor>> outputs =
//       parallel::parallel_apply(replicas, inputs, devices);   // outputs[i] from replica i
#ifndef TANDEM_PARALLEL_PARALLEL_APPLY_H_
#define TANDEM_PARALLEL_PARALLEL_APPLY_H_

#include <functional>
#include <memory>
#include <vector>

#include "nn/module.h"
#include "tensor/tensor.h"

namespace tandem::parallel {

// modules[i]->forward_tensors(inputs[i]) on devices[i]'s worker, for every i. A single
// replica runs on the calling thread, as in PyTorch (its kernels still use its device's
// threads): there is nothing to overlap, and it saves a hand-off; so does the first CPU
// replica when the caller is no device's worker (CPU kernels run on the thread that calls
// them, with their device's intra-op threads). The three
// lists must have the same length (devices may be omitted: then each replica runs on the
// device of its first input, or of its first parameter when it has no input).
std::vector<std::vector<Tensor>> parallel_apply(
    const std::vector<std::shared_ptr<nn::Module>>& modules,
    const std::vector<std::vector<Tensor>>& inputs, const std::vector<Device>& devices = {});

// What a replica throws when it stops only because another replica failed (it waited for the
// other at a meeting, as synchronized BatchNorm's replicas do): ParallelRun then reports the
// other replica's error, the cause, whatever the replicas' order.
class PeerReplicaFailed : public Error {
 public:
  using Error::Error;
};

// The general form: work(i) on devices[i]'s worker for every i, results in order, with the
// same error handling: the first replica's error, in replica order, that is not a
// PeerReplicaFailed. (A worker that is the calling thread runs its part inline; a calling
// thread that is no worker runs the first CPU device's part.)
std::vector<std::vector<Tensor>> ParallelRun(
    const std::vector<Device>& devices,
    const std::function<std::vector<Tensor>(size_t replica)>& work);

}  // namespace tandem::parallel

#endif  // TANDEM_PARALLEL_PARALLEL_APPLY_H_
