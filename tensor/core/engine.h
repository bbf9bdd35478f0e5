// The autograd engine: runs a backward pass over the graph that ops recorded
// (tensor/core/autograd.h). Tensor::backward() calls RunBackward; most code never calls this
// header directly.
//
// Each node runs on the worker of its device, so the parts of a graph on different devices
// (DataParallel's replicas) run backward in parallel; the nodes on the CPU device of the
// first root run on the thread that called backward when that thread is no device's worker
// (as PyTorch runs CPU work on the calling thread), which saves two thread hand-offs a pass.
// Gradients that meet in one node are summed outside any lock shared by the pass, by the threads
// that deliver them, so N devices accumulate in parallel. A node's exception stops the pass; the
// caller gets a tandem::Error naming the node, with the original exception nested inside
// (std::rethrow_if_nested reaches it, type intact).
//
// Code that runs inside a backward pass (a node, a gradient-ready hook) may queue a
// callback that runs once, on the caller's thread, after every node has finished — where
// DistributedDataParallel waits for its last all-reduce:
//
//   AddGradAccumulatedHook(weight, [](const Tensor&) {
//     QueueCallback([] { /* every gradient of this pass is in place */ });
//   });
#ifndef TANDEM_TENSOR_CORE_ENGINE_H_
#define TANDEM_TENSOR_CORE_ENGINE_H_

#include <functional>
#include <optional>
#include <vector>

#include "tensor/core/tensor.h"

namespace tandem {

// Runs the backward pass from `roots` with the given gradients (one per root). With
// `create_graph` the nodes run with grad mode on, so the gradients record a graph of their own
// (double backward; see tensor/core/autograd.h). Unless `retain_graph` (default: create_graph,
// as PyTorch's), each node frees its saved tensors once it has run, and a second pass through
// it throws. A node may call it from its Apply (on its
// device's worker): the nested pass runs that device's nodes on the same thread and the other
// devices' on their workers, and returns when it is done.
void RunBackward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
                 bool create_graph = false, std::optional<bool> retain_graph = std::nullopt);

// The gradients that reach `inputs` from `roots` (one per input, undefined where none
// reaches it), as autograd::grad returns them: only the nodes between the roots and the
// inputs run, and no gradient accumulator, so no .grad changes and no gradient-ready hook runs.
std::vector<Tensor> RunBackwardToInputs(const std::vector<Tensor>& roots,
                                        const std::vector<Tensor>& grads,
                                        const std::vector<Tensor>& inputs, bool create_graph,
                                        std::optional<bool> retain_graph = std::nullopt);

// Queues `callback` to run once when the backward pass the calling code is part of has
// finished, after every node, on the thread that called backward (in the order queued; a
// callback may queue further ones). Not run if the pass fails. Throws when called outside a
// backward pass. Inside a pass that a node started (a nested RunBackward, as activation
// checkpointing's recomputation runs), the callback waits for the outermost pass.
void QueueCallback(std::function<void()> callback);

// True on a thread that is running a node (or hook) of a backward pass.
bool InBackwardPass();

// True on a thread running a node of a backward pass in which some node has already failed:
// the pass will throw, so a node waiting for another device's node (a meeting of replicas)
// can stop waiting.
bool BackwardPassFailed();

}  // namespace tandem

#endif  // TANDEM_TENSOR_CORE_ENGINE_H_
