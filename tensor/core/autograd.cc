#include "tensor/core/autograd.h"

#include <atomic>
#include <mutex>

#include "tensor/core/anomaly_mode.h"
#include "tensor/core/internal/anomaly.h"
#include "tensor/core/internal/autograd_internal.h"
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
      if (GradMode::IsEnabled()) {
        // backward(create_graph): .grad keeps the gradient's graph, and a later pass adds out
        // of place so the graph of the earlier one stays valid (as PyTorch's AccumulateGrad).
        leaf_->grad =
            leaf_->grad.defined() ? internal::AddGradientsWithGraph(leaf_->grad, grad) : grad;
      } else if (!leaf_->grad.defined()) {
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
  bool SupportsDoubleBackward() const override { return true; }

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

// Stands in, under create_graph, for the graph of gradients that a node without double
// backward support computed: a second backward that reaches it throws.
class DoubleBackwardRefused final : public Node {
 public:
  DoubleBackwardRefused(std::string name, Device device, std::vector<Device> output_devices)
      : Node(device, std::move(output_devices)), name_(std::move(name)) {}
  std::vector<Tensor> Apply(std::vector<Tensor> /*grad_outputs*/) override {
    throw Error("second derivative of " + name_ +
                " is not supported: its backward is computed with raw kernels, not with "
                "differentiable ops; compute this gradient without create_graph, or leave " +
                name_ +
                " out of the part of the model that is differentiated twice. Ops "
                "supported twice: " +
                OpsSupportingDoubleBackward());
  }
  std::string name() const override { return name_ + "DoubleBackwardRefused"; }

 private:
  std::string name_;
};

thread_local const std::shared_ptr<Node>* t_applying_node = nullptr;

}  // namespace

const char* OpsSupportingDoubleBackward() {
  return "add, sub, mul, div (tensor and scalar), neg, pow, exp, log, sqrt, abs, square, "
         "maximum, minimum, where, masked_fill, clamp, dropout, tril, triu, tanh, sigmoid, relu, "
         "gelu (both forms), silu, sum, "
         "mean, amax, softmax, log_softmax, layer_norm, rms_norm, mse_loss, nll_loss, "
         "cross_entropy, "
         "matmul "
         "(batched too), "
         "linear, linear_gelu, linear_gelu_linear, conv2d, max_pool2d, avg_pool2d, "
         "adaptive_avg_pool2d, gather, "
         "index_select, "
         "embedding, scaled_dot_product_attention, view, reshape, flatten, narrow, select, split, "
         "chunk, transpose, permute, "
         "unsqueeze, squeeze, expand, contiguous, clone, cat, stack, to(device), to(dtype), "
         "DataParallel's scatter, gather and parameter broadcast";
}

namespace internal {

ApplyingNodeScope::ApplyingNodeScope(const std::shared_ptr<Node>& node)
    : previous_(t_applying_node) {
  t_applying_node = &node;
}

ApplyingNodeScope::~ApplyingNodeScope() { t_applying_node = previous_; }

void RefuseDoubleBackward(const Node& node, const std::vector<Tensor>& grad_outputs,
                          std::vector<Tensor>& input_grads) {
  std::vector<Edge> edges;
  for (const Edge& edge : node.next_edges()) {
    if (edge.node) edges.push_back(edge);
  }
  for (const Tensor& g : grad_outputs) {
    if (g.defined() && g.requires_grad()) edges.push_back(GradientEdge(g));
  }
  if (edges.empty()) return;  // nothing a second derivative could reach
  std::vector<Device> devices;
  for (const Tensor& g : input_grads) devices.push_back(g.defined() ? g.device() : node.device());
  if (devices.empty()) return;
  auto refused = std::make_shared<DoubleBackwardRefused>(node.name(), node.device(), devices);
  refused->set_next_edges(std::move(edges));
  for (size_t i = 0; i < input_grads.size(); ++i) {
    if (!input_grads[i].defined()) continue;
    input_grads[i] = input_grads[i].detach();  // a handle of its own carries the node
    TensorImpl* impl = input_grads[i].impl();
    impl->grad_fn = refused;
    impl->output_nr = static_cast<uint32_t>(i);
    impl->requires_grad = true;
  }
}

}  // namespace internal

Tensor SavedOutput(const Tensor& saved, uint32_t output_nr) {
  if (!GradMode::IsEnabled() || t_applying_node == nullptr || !saved.defined()) return saved;
  Tensor attached = saved.detach();
  TensorImpl* impl = attached.impl();
  impl->grad_fn = *t_applying_node;
  impl->output_nr = output_nr;
  impl->requires_grad = true;
  return attached;
}

Tensor SavedIntermediate(const Tensor& saved, std::string name, FunctionNode::Backward backward) {
  if (!GradMode::IsEnabled() || t_applying_node == nullptr || !saved.defined()) return saved;
  auto node = std::make_shared<FunctionNode>(std::move(name), saved.device(), std::move(backward),
                                             DoubleBackward::kSupported);
  node->set_next_edges((*t_applying_node)->next_edges());
  Tensor attached = saved.detach();
  TensorImpl* impl = attached.impl();
  impl->grad_fn = std::move(node);
  impl->output_nr = 0;
  impl->requires_grad = true;
  return attached;
}

std::vector<Tensor> FunctionNode::Apply(std::vector<Tensor> grad_outputs) {
  TANDEM_CHECK(backward_ != nullptr, "Trying to backward through the graph a second time: ", name_,
               " freed its saved tensors when the first backward through it ended. Pass "
               "retain_graph=true to that first backward() (or autograd::grad()) if you need to "
               "backward through the graph a second time, or compute the forward again");
  return backward_(grad_outputs[0]);
}

namespace autograd {

std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs, bool create_graph,
                         std::optional<bool> retain_graph, bool allow_unused) {
  TANDEM_CHECK(!outputs.empty(), "grad: no outputs given; pass the tensors to differentiate");
  TANDEM_CHECK(grad_outputs.empty() || grad_outputs.size() == outputs.size(),
               "grad: ", outputs.size(), " outputs but ", grad_outputs.size(),
               " grad_outputs; give one per output, or none for one-element outputs");
  std::vector<Tensor> grads;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& out = outputs[i];
    TANDEM_CHECK(out.defined(), "grad: output ", i, " is an undefined Tensor");
    TANDEM_CHECK(out.requires_grad(), "grad: output ", i,
                 " does not require grad and has no grad_fn; compute it from a tensor marked "
                 "with set_requires_grad(true)");
    Tensor g = grad_outputs.empty() ? Tensor() : grad_outputs[i];
    if (!g.defined()) {
      TANDEM_CHECK(out.numel() == 1, "grad: output ", i, " has shape ", ShapeToString(out.shape()),
                   "; grad_outputs must give its gradient (only one-element outputs get an "
                   "implicit 1)");
      g = ones(out.shape(), TensorOptions().device(out.device()).dtype(out.dtype()));
    }
    TANDEM_CHECK(g.shape() == out.shape(), "grad: grad_outputs[", i, "] has shape ",
                 ShapeToString(g.shape()), " but output ", i, " has shape ",
                 ShapeToString(out.shape()), "; give a gradient of the output's shape");
    TANDEM_CHECK(IsFloatingPoint(g.dtype()) && IsFloatingPoint(out.dtype()), "grad: grad_outputs[",
                 i, "] is ", g.dtype(), " and output ", i, " is ", out.dtype(),
                 "; gradients are floating-point: convert it with .to(", out.dtype(), ")");
    grads.push_back(g.dtype() == out.dtype() ? g : g.to(out.dtype()));
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    TANDEM_CHECK(inputs[i].defined(), "grad: input ", i, " is an undefined Tensor");
    TANDEM_CHECK(inputs[i].requires_grad(), "grad: input ", i, " (shape ",
                 ShapeToString(inputs[i].shape()),
                 ") does not require grad; mark it with set_requires_grad(true) before "
                 "computing the outputs from it");
  }
  std::vector<Tensor> result =
      RunBackwardToInputs(outputs, grads, inputs, create_graph, retain_graph);
  for (size_t i = 0; i < result.size(); ++i) {
    TANDEM_CHECK(allow_unused || result[i].defined(), "grad: input ", i, " (shape ",
                 ShapeToString(inputs[i].shape()),
                 ") was not used to compute the outputs, so it has no gradient; pass "
                 "allow_unused = true to get an undefined Tensor for it instead");
    if (result[i].defined() && !create_graph) result[i] = result[i].detach();
  }
  return result;
}

}  // namespace autograd

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
              FunctionNode::Backward backward, DoubleBackward double_backward) {
  RecordOp(std::make_shared<FunctionNode>(std::move(name), output.device(), std::move(backward),
                                          double_backward),
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
