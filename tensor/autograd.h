// Autograd: the define-by-run graph behind Tensor::backward().
//
// Every differentiable op whose inputs require grad records a Node that knows how to turn
// the gradient of its output into gradients of its inputs; leaves that require grad get an
// AccumulateGrad node that adds into Tensor::grad(). The engine runs each node on the
// worker of the device its gradient lives on, so the parts of a graph on different devices
// (DataParallel's replicas) run backward in parallel, and joins them where they meet.
//
// Writing a new differentiable op (see tensor/ops.cc for many):
//
//   Tensor out = ...;  // computed without recording anything
//   if (NeedsGrad({a})) {
//     RecordOp("MyOpBackward", {a}, out, [a](const Tensor& grad) {
//       return std::vector<Tensor>{grad * 2.0};
//     });
//   }
//
// A closure must not capture `out` itself (that would be a reference cycle): capture
// out.detach() instead.
#ifndef TANDEM_TENSOR_AUTOGRAD_H_
#define TANDEM_TENSOR_AUTOGRAD_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tensor/device.h"
#include "tensor/tensor.h"

namespace tandem {

class Node;

struct Edge {
  std::shared_ptr<Node> node;  // nullptr: this input needs no gradient
};

// One recorded operation with one output.
class Node {
 public:
  explicit Node(Device device);
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // Given the gradient of this node's output, the gradients of its inputs, in the order
  // of next_edges(); an undefined Tensor where an input gets no gradient.
  virtual std::vector<Tensor> Apply(const Tensor& grad_output) = 0;
  virtual std::string name() const = 0;

  // The device the incoming gradient lives on; Apply runs on that device's worker.
  Device device() const { return device_; }
  const std::vector<Edge>& next_edges() const { return next_edges_; }
  void set_next_edges(std::vector<Edge> edges) { next_edges_ = std::move(edges); }
  // Creation order. Among the ready nodes of one device the engine runs the newest first,
  // as PyTorch does: it follows the forward pass backwards, so cheap cross-device copies
  // recorded late (a gather) start the other devices' work before this device's own.
  uint64_t sequence_nr() const { return sequence_nr_; }

 private:
  Device device_;
  uint64_t sequence_nr_;
  std::vector<Edge> next_edges_;
};

// A Node whose backward is a closure.
class FunctionNode final : public Node {
 public:
  using Backward = std::function<std::vector<Tensor>(const Tensor&)>;
  FunctionNode(std::string name, Device device, Backward backward)
      : Node(device), name_(std::move(name)), backward_(std::move(backward)) {}
  std::vector<Tensor> Apply(const Tensor& grad_output) override { return backward_(grad_output); }
  std::string name() const override { return name_; }

 private:
  std::string name_;
  Backward backward_;
};

// Whether ops record the graph on this thread (on by default in every thread).
class GradMode {
 public:
  static bool IsEnabled();
  static void SetEnabled(bool enabled);
};

// Turns recording off for its lifetime on this thread (optimizer steps, evaluation).
class NoGradGuard {
 public:
  NoGradGuard() : previous_(GradMode::IsEnabled()) { GradMode::SetEnabled(false); }
  ~NoGradGuard() { GradMode::SetEnabled(previous_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// True if grad mode is on and any defined input requires grad.
bool NeedsGrad(const std::vector<Tensor>& inputs);

// Makes `node` the grad_fn of `output` (which must not be a leaf that requires grad)
// with edges to `inputs`, and marks output as requiring grad.
void RecordOp(std::shared_ptr<Node> node, const std::vector<Tensor>& inputs, Tensor& output);
void RecordOp(std::string name, const std::vector<Tensor>& inputs, Tensor& output,
              FunctionNode::Backward backward);

// The edge through which a gradient reaches `tensor` (its grad_fn, or its accumulator if
// it is a leaf that requires grad, or none).
Edge GradientEdge(const Tensor& tensor);

// Calls `hook(grad)` each time a backward pass has finished accumulating into `leaf`'s
// gradient, on the worker of the leaf's device. This is the gradient-ready point that
// overlapping communication with backward (DistributedDataParallel) needs.
void AddGradAccumulatedHook(const Tensor& leaf, std::function<void(const Tensor&)> hook);

// Clears the gradients of `tensors`: drops them (set_to_none, PyTorch's default since 2.0,
// saves a pass over memory and lets the next backward write fresh ones) or fills them with
// zeros. What Module::zero_grad and Optimizer::zero_grad do.
void ZeroGrad(const std::vector<Tensor>& tensors, bool set_to_none = true);

// Runs the backward pass from `roots` with the given gradients (one per root).
void RunBackward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads);

}  // namespace tandem

#endif  // TANDEM_TENSOR_AUTOGRAD_H_
