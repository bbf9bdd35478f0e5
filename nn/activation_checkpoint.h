// Activation checkpointing (PyTorch's torch.utils.checkpoint): runs a block without keeping
// its activations and recomputes them in backward, trading one more forward of the block for
// the memory of everything it saves. The standard way to fit a longer context: a transformer
// checkpointed per block keeps one tensor per block (its input) instead of a dozen.
//
//   Tensor y = nn::checkpoint([&](const Tensor& h) { return block->forward(h); }, x);
//   std::vector<Tensor> outs = nn::checkpoint(
//       [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{f(in[0], in[1])}; },
//       {x, mask}, nn::CheckpointOptions().preserve_rng_state(true));
//
// What it does. Forward runs `fn` under NoGradGuard (nothing recorded, so each activation is
// freed as soon as the next op no longer needs it), keeps only the inputs, and records one
// node, CheckpointBackward, with an edge to each input. Its backward restores the state of
// every random generator the forward drew from (the devices' default generators and a
// Dropout's own, whichever the forward's thread used: GeneratorRecorder in
// tensor/core/tensor.h), and the forward's autocast state; runs `fn` again with grad mode on
// over detached copies of the inputs (requiring grad as the originals did); runs a backward
// pass from the recomputed outputs with the incoming gradients (a nested RunBackward, on the
// node's worker thread); and returns the copies' gradients. The nested pass goes on past the
// block: parameters used inside `fn` get their .grad accumulated there, and their
// gradient-ready hooks fire then, once per checkpoint call (DataParallel's reduce-add,
// DistributedDataParallel's buckets, whose end-of-backward callback waits for the outer pass).
// Dropout draws the same masks, so checkpointed and plain blocks give the same gradients, to
// the bit on the CPU.
//
// Why this design (PyTorch's "reentrant" checkpoint, one node with a nested backward), where
// PyTorch now recommends its non-reentrant variant: that one records the block's graph in
// forward and swaps its saved tensors for placeholders through saved-tensor hooks, which
// recompute on first unpack. Tandem's backward closures capture the tensors they save
// directly (tensor/core/autograd.h), so there is no point where a saved tensor could be
// intercepted; recomputing inside one node needs nothing from the ops. What differs from
// PyTorch's non-reentrant checkpoint:
//   - The block's inside is not part of the outer graph: a parameter used only inside a
//     checkpoint is not reachable from the outputs' graph. PyTorch's reentrant checkpoint has
//     this bug under DDP's find_unused_parameters (the parameter is taken for unused, marked
//     ready at once, then its gradient arrives in backward: an error or a hang), and documents
//     it. Here a graph walk that must see them (DistributedDataParallel's find_unused_parameters
//     does) holds a RecordCheckpointedParameters guard around the forward: each checkpoint then
//     runs its forward recording over stand-ins for the inputs, keeps the gradient accumulators
//     of the leaves it reached (CheckpointedLeafNodes) and frees that graph with the block's
//     activations, so the forward holds one block's activations at a time, as the
//     recomputation does. Plain DDP needs none of it: each parameter's hook fires once per
//     checkpoint call, so a layer checkpointed once per forward is fine; one checkpointed
//     twice in a forward fires twice, which DDP refuses without static_graph.
//   - A gradient with respect to a tensor captured by `fn` (not passed as an input) is
//     computed by the nested pass, which runs whatever graph lies behind it; pass such tensors
//     as inputs when they are outputs of other differentiable ops.
//   - Recording happens whenever grad mode is on: whether `fn` uses a parameter that requires
//     grad is known only once it is recomputed; if no recomputed output requires grad,
//     backward says so.
//   - Backward may run again through the same graph (Tandem frees no graph after backward);
//     each run recomputes the block.
//   - Gradients of the block's parameters are accumulated into their .grad by the nested
//     pass, whatever the outer pass asked for: a gradient function that returns gradients
//     instead of accumulating them (PyTorch's torch.autograd.grad) sees only the inputs'
//     gradients through a checkpoint, and the recomputation's graph is not differentiated
//     again (no double backward through a checkpoint).
//   - A checkpoint inside a checkpoint works (the inner one recomputes within the outer's
//     recomputation), with the cost of a third forward.
// Under NoGradGuard `checkpoint` just calls `fn`. The generators the forward drew from, and
// the modules `fn` uses, must outlive backward.
#ifndef TANDEM_NN_ACTIVATION_CHECKPOINT_H_
#define TANDEM_NN_ACTIVATION_CHECKPOINT_H_

#include <functional>
#include <memory>
#include <vector>

#include "tensor/base/arg.h"
#include "tensor/tensor.h"

namespace tandem::nn {

struct CheckpointOptions {
  // Restore the generators the forward drew from before recomputing (and their current state
  // after), so that dropout draws the same masks. Off: the recomputation draws fresh numbers
  // (saves nothing measurable; for blocks known to draw none).
  TANDEM_ARG(bool, preserve_rng_state) = true;
};

using CheckpointFunction = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

// Runs `fn(inputs)` without keeping its activations; see above. The outputs (one or several;
// undefined entries are passed through) are new tensors even where `fn` returns an input.
std::vector<Tensor> checkpoint(const CheckpointFunction& fn, const std::vector<Tensor>& inputs,
                               const CheckpointOptions& options = {});

// The common case: one tensor in, one out.
Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input,
                  const CheckpointOptions& options = {});

// While one lives on this thread, checkpoint() records which leaves (parameters) its function
// reaches, for CheckpointedLeafNodes (see above; it nests).
class RecordCheckpointedParameters {
 public:
  RecordCheckpointedParameters();
  ~RecordCheckpointedParameters();
  RecordCheckpointedParameters(const RecordCheckpointedParameters&) = delete;
  RecordCheckpointedParameters& operator=(const RecordCheckpointedParameters&) = delete;
  static bool active();
};

// For a graph walk: the gradient accumulators of the leaves that the checkpoint whose backward
// node is `node` uses inside (nested checkpoints' too), recorded under
// RecordCheckpointedParameters; empty for any other node, or one recorded without it. They are
// the nodes GradientEdge(parameter) gives while the graph lives.
std::vector<std::shared_ptr<Node>> CheckpointedLeafNodes(const Node& node);

}  // namespace tandem::nn

#endif  // TANDEM_NN_ACTIVATION_CHECKPOINT_H_
