// Autograd: the define-by-run graph that ops record and Tensor::backward() runs.
//
// This header is the *recording* side: Node (one recorded operation, with one or several
// outputs), Edge, RecordOp, grad mode and the gradient-ready hooks on leaves. The engine
// that runs a backward pass over the recorded graph is tensor/core/engine.h.
//
// Every differentiable op whose inputs require grad records a Node that turns the
// gradients of its outputs into gradients of its inputs; leaves that require grad get an
// AccumulateGrad node that adds into Tensor::grad(). Writing a new differentiable op (see
// tensor/ops/*.cc for many):
//
//   Tensor out = ...;  // computed without recording anything
//   if (NeedsGrad({a})) {
//     RecordOp("MyOpBackward", {a}, out, [a](const Tensor& grad) {
//       return std::vector<Tensor>{grad * 2.0};
//     });
//   }
//
// A closure must not capture `out` itself (that would be a reference cycle): capture
// out.detach() instead. An op with several outputs on several devices (DataParallel's
// broadcast and scatter) derives from Node, gives one output device per output, and
// records with RecordMultiOutputOp; its Apply receives one gradient slot per output (an
// undefined Tensor where an output got no gradient).
//
// Double backward (create_graph, autograd::grad): under create_graph the engine runs nodes
// with grad mode on, so a closure written with differentiable ops records the graph of the
// gradient it computes. A closure opts in with DoubleBackward::kSupported once it is
// differentiable in everything it depends on: saved inputs kept with their graph (not
// detached), saved outputs read through SavedOutput. Every other node (raw kernels) still
// runs, but its gradients then carry a node that refuses a second backward with a clear
// error, never a silently wrong second derivative:
//
//   RecordOp("ExpBackward", {a}, out, [y = out.detach()](const Tensor& grad) {
//     return std::vector<Tensor>{grad * SavedOutput(y)};
//   }, DoubleBackward::kSupported);
//
//   Tensor g = autograd::grad({loss}, {x}, {}, /*create_graph=*/true)[0];
//   (loss + g.square().sum()).backward();  // a gradient penalty
#ifndef TANDEM_TENSOR_CORE_AUTOGRAD_H_
#define TANDEM_TENSOR_CORE_AUTOGRAD_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tensor/base/device.h"
#include "tensor/base/grad_mode.h"  // IWYU pragma: export
#include "tensor/core/tensor.h"

namespace tandem {

class Node;

// Where a gradient goes: output `input_nr` of `node` (PyTorch's naming: it is the index of
// the gradient among the node's inputs in the backward direction).
struct Edge {
  std::shared_ptr<Node> node;  // nullptr: this input needs no gradient
  uint32_t input_nr = 0;
  // The input's dtype: a floating gradient of another floating dtype is converted to it on
  // delivery, as PyTorch's engine does, so a bfloat16 input used in a float32 op (mixed
  // operands promote) still gets a bfloat16 gradient. Unset: delivered as it is.
  std::optional<DType> dtype;
};

// A gradient that adds `values` into a few slices of an input along one axis (the adjoint
// of a gather, e.g. an embedding's lookup, which touches a few rows of a large table):
//   dense[o, index[o, j, i], i] += values[o, j, i]
// for the input's dense gradient, of `shape` = [outer, dim_size, inner] once folded. A node
// hands it to the engine through Node::ApplyScattered: the engine adds the slices into
// the gradient already waiting for that input (a tied head's, say) in place, and builds the
// dense gradient (zeros, then the slices) only when there is none to add into.
struct ScatterGradient {
  Tensor index;   // int64, contiguous, [outer, idx_dim, inner] elements
  Tensor values;  // contiguous, as many elements as index, in the input's dtype
  Shape shape;    // the input's shape
  int64_t outer = 1, dim_size = 0, idx_dim = 0, inner = 1;
};

// One recorded operation.
class Node {
 public:
  // A node with one output on `device`.
  explicit Node(Device device);
  // A node that runs on `device` whose outputs live on `output_devices` (one per output).
  Node(Device device, std::vector<Device> output_devices);
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // Given the gradients of this node's outputs (one per output, each on that output's
  // device; undefined where an output got none), the gradients of its inputs, in the order
  // of next_edges(); an undefined Tensor where an input gets no gradient.
  virtual std::vector<Tensor> Apply(std::vector<Tensor> grad_outputs) = 0;
  virtual std::string name() const = 0;
  // Whether Apply is written with differentiable ops, so that the gradients it computes under
  // create_graph can be differentiated again. A node that says no still runs under
  // create_graph; its gradients then refuse a second backward (see the header comment).
  virtual bool SupportsDoubleBackward() const { return false; }
  // Frees what the node saved for its backward, once a pass that does not retain the graph has
  // run it (PyTorch's release_variables); running it again must then throw, saying so.
  // Nodes that save nothing large keep the default.
  virtual void ReleaseVariables() {}
  // What the engine calls: Apply, for a node that may give an input's gradient as scattered
  // slices (ScatterGradient) instead of a dense tensor. `scattered` comes empty; such a node
  // resizes it to one entry per input, and where it sets one, the gradient it returns for
  // that input must be undefined.
  // Apply itself must still return dense gradients (for callers other than the engine).
  virtual std::vector<Tensor> ApplyScattered(
      std::vector<Tensor> grad_outputs,
      std::vector<std::optional<ScatterGradient>>& /*scattered*/) {
    return Apply(std::move(grad_outputs));
  }

  // The device whose worker runs Apply.
  Device device() const { return device_; }
  int num_outputs() const { return static_cast<int>(output_devices_.size()); }
  // The device the gradient of output `i` is delivered on.
  Device output_device(int i) const { return output_devices_[i]; }
  const std::vector<Edge>& next_edges() const { return next_edges_; }
  void set_next_edges(std::vector<Edge> edges) { next_edges_ = std::move(edges); }
  // Creation order. Among the ready nodes of one device the engine runs the newest first,
  // as PyTorch does: it follows the forward pass backwards, so cheap cross-device copies
  // recorded late (a gather) start the other devices' work before this device's own.
  // Gradient accumulators (leaves) have kAccumulatorSequenceNr.
  uint64_t sequence_nr() const { return sequence_nr_; }

  // The sequence number of every gradient accumulator: the largest, so that a leaf's
  // gradient is accumulated (and its hooks run) the moment it is ready rather than after
  // the rest of the pass, as PyTorch does; DistributedDataParallel launches its buckets
  // from those hooks. (A leaf's accumulator lives as long as the leaf's graphs do, so a
  // creation-order number would make it the oldest node of every later pass.)
  static constexpr uint64_t kAccumulatorSequenceNr = ~uint64_t{0};

 protected:
  // For nodes with a fixed place in the engine's order (gradient accumulators).
  Node(Device device, uint64_t sequence_nr);

 private:
  Device device_;
  std::vector<Device> output_devices_;
  uint64_t sequence_nr_;
  std::vector<Edge> next_edges_;
};

// Whether a closure's gradients can be differentiated again (Node::SupportsDoubleBackward).
enum class DoubleBackward { kRefused, kSupported };

// A single-output Node whose backward is a closure.
class FunctionNode final : public Node {
 public:
  using Backward = std::function<std::vector<Tensor>(const Tensor&)>;
  FunctionNode(std::string name, Device device, Backward backward,
               DoubleBackward double_backward = DoubleBackward::kRefused)
      : Node(device),
        name_(std::move(name)),
        backward_(std::move(backward)),
        double_backward_(double_backward) {}
  std::vector<Tensor> Apply(std::vector<Tensor> grad_outputs) override;
  std::string name() const override { return name_; }
  bool SupportsDoubleBackward() const override {
    return double_backward_ == DoubleBackward::kSupported;
  }
  // Drops the closure, and with it the tensors it captured.
  void ReleaseVariables() override { backward_ = nullptr; }

 private:
  std::string name_;
  Backward backward_;
  DoubleBackward double_backward_;
};

// True if grad mode is on and any defined input requires grad.
bool NeedsGrad(const std::vector<Tensor>& inputs);

// Makes `node` the grad_fn of `output` (which must not be a leaf that requires grad)
// with edges to `inputs`, and marks output as requiring grad.
void RecordOp(std::shared_ptr<Node> node, const std::vector<Tensor>& inputs, Tensor& output);
void RecordOp(std::string name, const std::vector<Tensor>& inputs, Tensor& output,
              FunctionNode::Backward backward,
              DoubleBackward double_backward = DoubleBackward::kRefused);
// Makes `node` the grad_fn of every output (output i is the node's output i; their count
// and devices must match the node's) with edges to `inputs`. Undefined outputs are skipped.
void RecordMultiOutputOp(std::shared_ptr<Node> node, const std::vector<Tensor>& inputs,
                         std::vector<Tensor>& outputs);

// The edge through which a gradient reaches `tensor` (its grad_fn and output index, or its
// accumulator if it is a leaf that requires grad, or none).
Edge GradientEdge(const Tensor& tensor);

// Calls `hook(grad)` each time a backward pass has finished accumulating into `leaf`'s
// gradient, on the worker of the leaf's device. This is the gradient-ready point that
// overlapping communication with backward (DistributedDataParallel) needs.
void AddGradAccumulatedHook(const Tensor& leaf, std::function<void(const Tensor&)> hook);

// Inside a node's backward: `saved`, an output of that node saved detached when it was
// recorded (saving it attached would be a reference cycle), as the node's output `output_nr`
// again when the backward runs under create_graph, so a second derivative flows through it
// (PyTorch's SavedVariable for outputs). Otherwise `saved` as it is.
Tensor SavedOutput(const Tensor& saved, uint32_t output_nr = 0);

// Inside a node's backward under create_graph: `saved`, a value its forward computed from the
// node's inputs (a fused op's intermediate, not its output), attached to the graph as a
// function of those inputs through a node named `name` whose gradient `backward` gives (one
// per input of the applying node, written with differentiable ops). Otherwise `saved`.
Tensor SavedIntermediate(const Tensor& saved, std::string name, FunctionNode::Backward backward);

// The ops whose backward can be differentiated again under create_graph, for error messages
// and the documentation (one list, kept next to the flag the ops set).
const char* OpsSupportingDoubleBackward();

namespace autograd {

// The gradients of `outputs` with respect to `inputs` (PyTorch's torch.autograd.grad),
// returned rather than accumulated into .grad: no input's .grad changes and no
// gradient-ready hook runs (so DistributedDataParallel does not reduce them). `inputs` may be
// non-leaves. `grad_outputs` holds one gradient per output (empty: ones for one-element
// outputs). With `create_graph` the result carries its own graph, for a second derivative
// (gradient penalties, Hessian-vector products). Unless `retain_graph` (default:
// create_graph, as PyTorch's) the nodes that ran free their saved tensors, and a later pass
// through them throws. An input no
// gradient reaches is an error naming it, unless `allow_unused` (then its entry is undefined).
//
//   Tensor x = randn({3}, TensorOptions().requires_grad(true));
//   Tensor y = (x * x * x).sum();
//   Tensor g = autograd::grad({y}, {x}, {}, /*create_graph=*/true)[0];  // 3x^2
//   Tensor h = autograd::grad({g.sum()}, {x})[0];                        // 6x
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs = {}, bool create_graph = false,
                         std::optional<bool> retain_graph = std::nullopt,
                         bool allow_unused = false);

}  // namespace autograd

// Clears the gradients of `tensors`: drops them (set_to_none, PyTorch's default since 2.0,
// saves a pass over memory and lets the next backward write fresh ones) or fills them with
// zeros. What Module::zero_grad and Optimizer::zero_grad do.
void ZeroGrad(const std::vector<Tensor>& tensors, bool set_to_none = true);

}  // namespace tandem

#include "tensor/core/engine.h"  // IWYU pragma: export (RunBackward, QueueCallback)

#endif  // TANDEM_TENSOR_CORE_AUTOGRAD_H_
