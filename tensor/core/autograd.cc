#include "tensor/core/autograd.h"

#include <atomic>
#include <mutex>

#include "tensor/core/anomaly_mode.h"
#include "tensor/core/internal/anomaly.h"
#include "tensor/core/internal/tensor_impl.h"

namespace tandem {
namespace {

std::atomic<uint64_t> next_sequence_nr{0};

// Adds incoming gradients into a leaf's .grad and runs its gradient-ready hooks. The
// per-leaf lock makes accumulation from several devices' workers safe; the engine gives
// each pass's gradients for one leaf to this node once, already summed.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> leaf)
      : Node(leaf->device(), kAccumulatorSequenceNr), leaf_(std::move(leaf)) {}

  std::vector<Tensor> Apply(std::vector<Tensor> grads) override {
    const Tensor& grad = grads[0];
    TANDEM_CHECK(grad.shape() == leaf_->shape, "internal error: a gradient of shape ",
                 ShapeToString(grad.shape()), " reached a leaf of shape ",
                 ShapeToString(leaf_->shape));
    Tensor accumulated;
    std::vector<std::function<void(const Tensor&)>> hooks;
    {
      std::lock_guard<std::mutex> lock(leaf_->grad_mutex);
      if (!leaf_->grad.defined()) {
        // .grad is accumulated into in place by later passes, so it must own its memory: a
        // gradient nothing else can see (the usual case: a kernel's fresh output) becomes
        // .grad as it is, as PyTorch's AccumulateGrad steals it; a view (an expand, say) or
        // one held elsewhere is copied.
        leaf_->grad = IsSoleOwner(grad) ? grad : grad.detach().clone();
      } else {
        leaf_->grad.add_(grad);
      }
      accumulated = leaf_->grad;
      hooks = leaf_->grad_hooks;
    }
    for (const auto& hook : hooks) hook(accumulated);
    return {};
  }
  std::string name() const override { return "AccumulateGrad"; }

 private:
  std::shared_ptr<TensorImpl> leaf_;
};

std::shared_ptr<Node> AccumulatorFor(const Tensor& leaf) {
  TensorImpl* impl = leaf.impl();
  std::lock_guard<std::mutex> lock(impl->grad_mutex);
  std::shared_ptr<Node> accumulator = impl->grad_accumulator.lock();
  if (!accumulator) {
    accumulator = std::make_shared<AccumulateGrad>(leaf.impl_ptr());
    impl->grad_accumulator = accumulator;
  }
  return accumulator;
}

std::vector<Edge> EdgesTo(const std::vector<Tensor>& inputs) {
  std::vector<Edge> edges;
  edges.reserve(inputs.size());
  for (const Tensor& input : inputs) edges.push_back(GradientEdge(input));
  return edges;
}

}  // namespace

Node::Node(Device device) : Node(device, {device}) {}

Node::Node(Device device, uint64_t sequence_nr)
    : device_(device), output_devices_{device}, sequence_nr_(sequence_nr) {}

Node::Node(Device device, std::vector<Device> output_devices)
    : device_(device),
      output_devices_(std::move(output_devices)),
      sequence_nr_(next_sequence_nr++) {
  TANDEM_CHECK(!output_devices_.empty(), "internal error: a Node needs at least one output");
}

bool NeedsGrad(const std::vector<Tensor>& inputs) {
  if (!GradMode::IsEnabled()) return false;
  for (const Tensor& t : inputs) {
    if (t.requires_grad()) return true;
  }
  return false;
}

Edge GradientEdge(const Tensor& tensor) {
  if (!tensor.defined() || !tensor.requires_grad()) return Edge{};
  if (tensor.grad_fn()) return Edge{tensor.grad_fn(), tensor.impl()->output_nr, tensor.dtype()};
  return Edge{AccumulatorFor(tensor), 0, tensor.dtype()};
}

void RecordOp(std::shared_ptr<Node> node, const std::vector<Tensor>& inputs, Tensor& output) {
  TANDEM_CHECK(output.defined(), "internal error: RecordOp on an undefined output");
  if (AnomalyMode::IsEnabled()) internal::CheckForwardAnomaly(*node, inputs, {output});
  node->set_next_edges(EdgesTo(inputs));
  output.impl()->grad_fn = std::move(node);
  output.impl()->output_nr = 0;
  output.impl()->requires_grad = true;
}

void RecordOp(std::string name, const std::vector<Tensor>& inputs, Tensor& output,
              FunctionNode::Backward backward) {
  RecordOp(std::make_shared<FunctionNode>(std::move(name), output.device(), std::move(backward)),
           inputs, output);
}

void RecordMultiOutputOp(std::shared_ptr<Node> node, const std::vector<Tensor>& inputs,
                         std::vector<Tensor>& outputs) {
  TANDEM_CHECK(static_cast<int>(outputs.size()) == node->num_outputs(),
               "internal error: ", node->name(), " has ", node->num_outputs(), " outputs but ",
               outputs.size(), " tensors were recorded");
  if (AnomalyMode::IsEnabled()) internal::CheckForwardAnomaly(*node, inputs, outputs);
  node->set_next_edges(EdgesTo(inputs));
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!outputs[i].defined()) continue;
    TANDEM_CHECK(outputs[i].device() == node->output_device(static_cast<int>(i)),
                 "internal error: output ", i, " of ", node->name(), " is on ", outputs[i].device(),
                 " but the node declares ", node->output_device(static_cast<int>(i)));
    TensorImpl* impl = outputs[i].impl();
    impl->grad_fn = node;
    impl->output_nr = static_cast<uint32_t>(i);
    impl->requires_grad = true;
  }
}

void AddGradAccumulatedHook(const Tensor& leaf, std::function<void(const Tensor&)> hook) {
  TANDEM_CHECK(leaf.defined() && leaf.is_leaf() && leaf.requires_grad(),
               "AddGradAccumulatedHook: the tensor must be a leaf that requires grad");
  std::lock_guard<std::mutex> lock(leaf.impl()->grad_mutex);
  leaf.impl()->grad_hooks.push_back(std::move(hook));
}

void ZeroGrad(const std::vector<Tensor>& tensors, bool set_to_none) {
  NoGradGuard no_grad;
  for (const Tensor& t : tensors) {
    Tensor grad = t.grad();
    if (!grad.defined()) continue;
    if (set_to_none) {
      Tensor(t).set_grad(Tensor());
    } else {
      grad.zero_();
    }
  }
}

}  // namespace tandem
