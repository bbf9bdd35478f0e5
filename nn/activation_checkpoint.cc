#include "nn/activation_checkpoint.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>

#include "tensor/base/autocast_mode.h"
#include "tensor/core/autograd.h"

namespace tandem::nn {
namespace {

using GeneratorUses = std::vector<std::pair<Generator*, GeneratorState>>;

// Sets each generator to the state the forward found it in, and back to its present state on
// destruction: the recomputation draws the forward's numbers and leaves the streams where
// they were, as PyTorch's fork_rng does.
class ReplayGenerators {
 public:
  explicit ReplayGenerators(const GeneratorUses& uses) {
    for (const auto& [generator, before] : uses) {
      present_.emplace_back(generator, generator->state());
      generator->set_state(before);
    }
  }
  ~ReplayGenerators() {
    for (const auto& [generator, state] : present_) generator->set_state(state);
  }
  ReplayGenerators(const ReplayGenerators&) = delete;
  ReplayGenerators& operator=(const ReplayGenerators&) = delete;

 private:
  GeneratorUses present_;
};

// Stand-ins for `inputs`: detached, requiring grad as the originals do (a pass from outputs
// computed on them stops there).
std::vector<Tensor> StandIns(const std::vector<Tensor>& inputs,
                             const std::vector<bool>& requires_grad) {
  std::vector<Tensor> leaves;
  leaves.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    leaves.push_back(inputs[i].defined() ? inputs[i].detach() : Tensor());
    if (requires_grad[i]) leaves.back().set_requires_grad(true);
  }
  return leaves;
}

class CheckpointBackward final : public Node {
 public:
  CheckpointBackward(Device device, std::vector<Device> output_devices, CheckpointFunction fn,
                     std::vector<Tensor> inputs, std::vector<bool> input_requires_grad,
                     GeneratorUses generators, AutocastState autocast,
                     std::vector<std::shared_ptr<Node>> leaf_nodes)
      : Node(device, std::move(output_devices)),
        fn_(fn),
        inputs_(std::move(inputs)),
        input_requires_grad_(std::move(input_requires_grad)),
        generators_(std::move(generators)),
        autocast_(std::move(autocast)),
        leaf_nodes_(std::move(leaf_nodes)) {}

  const std::vector<std::shared_ptr<Node>>& leaf_nodes() const { return leaf_nodes_; }

  std::vector<Tensor> Apply(std::vector<Tensor> grad_outputs) override {
    // Leaves standing for the inputs: the nested pass stops at them, and their .grad is what
    // this node hands on to the inputs' own edges.
    std::vector<Tensor> leaves = StandIns(inputs_, input_requires_grad_);
    std::vector<Tensor> outputs;
    {
      ReplayGenerators replay(generators_);
      AutoGradMode grad_on(true);  // the engine runs nodes under NoGradGuard
      AutocastStateGuard autocast(autocast_);
      outputs = fn_(leaves);
    }
    TANDEM_CHECK(static_cast<int>(outputs.size()) == num_outputs(),
                 "checkpoint: the recomputed function returned ", outputs.size(),
                 " tensors but the forward returned ", num_outputs(),
                 "; the function must return the same outputs each time it is called");
    std::vector<Tensor> roots, grads;
    bool any_requires_grad = false;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (!outputs[i].defined() || !outputs[i].requires_grad()) continue;
      any_requires_grad = true;
      if (!grad_outputs[i].defined()) continue;
      roots.push_back(outputs[i]);
      grads.push_back(std::move(grad_outputs[i]));
    }
    TANDEM_CHECK(any_requires_grad,
                 "checkpoint: none of the function's outputs requires grad when recomputed (no "
                 "input requires grad and the function uses no parameter that does), so there is "
                 "nothing to differentiate; call the function without checkpoint, or under "
                 "NoGradGuard");
    if (!roots.empty()) RunBackward(roots, grads);
    std::vector<Tensor> input_grads(leaves.size());
    for (size_t i = 0; i < leaves.size(); ++i) {
      if (input_requires_grad_[i]) input_grads[i] = leaves[i].grad();
    }
    return input_grads;
  }

  std::string name() const override { return "CheckpointBackward"; }

 private:
  CheckpointFunction fn_;
  std::vector<Tensor> inputs_;  // detached: the node must not hold the inputs' graphs twice
  std::vector<bool> input_requires_grad_;
  GeneratorUses generators_;
  AutocastState autocast_;
  std::vector<std::shared_ptr<Node>> leaf_nodes_;  // RecordCheckpointedParameters
};

thread_local int recording_parameters = 0;

// The accumulators of the leaves other than `stand_ins` that `outputs`' graph reaches, through
// nested checkpoints too.
std::vector<std::shared_ptr<Node>> ReachedLeaves(const std::vector<Tensor>& outputs,
                                                 const std::vector<Tensor>& stand_ins) {
  std::unordered_set<const Node*> seen, excluded;
  for (const Tensor& t : stand_ins) {
    if (const Edge edge = GradientEdge(t); edge.node) excluded.insert(edge.node.get());
  }
  std::vector<std::shared_ptr<Node>> stack, leaves;
  auto visit = [&](const std::shared_ptr<Node>& node) {
    if (node && seen.insert(node.get()).second) stack.push_back(node);
  };
  for (const Tensor& out : outputs) visit(GradientEdge(out).node);
  while (!stack.empty()) {
    const std::shared_ptr<Node> node = std::move(stack.back());
    stack.pop_back();
    bool has_next = false;
    for (const Edge& next : node->next_edges()) {
      has_next = has_next || next.node != nullptr;
      visit(next.node);
    }
    for (const std::shared_ptr<Node>& inner : CheckpointedLeafNodes(*node)) visit(inner);
    // A node with nowhere to send gradients is a leaf's accumulator (an op is recorded only
    // when some input requires grad).
    if (!has_next && !excluded.count(node.get())) leaves.push_back(node);
  }
  return leaves;
}

}  // namespace

RecordCheckpointedParameters::RecordCheckpointedParameters() { ++recording_parameters; }
RecordCheckpointedParameters::~RecordCheckpointedParameters() { --recording_parameters; }
bool RecordCheckpointedParameters::active() { return recording_parameters > 0; }

std::vector<std::shared_ptr<Node>> CheckpointedLeafNodes(const Node& node) {
  const auto* checkpointed = dynamic_cast<const CheckpointBackward*>(&node);
  return checkpointed != nullptr ? checkpointed->leaf_nodes()
                                 : std::vector<std::shared_ptr<Node>>{};
}

std::vector<Tensor> checkpoint(const CheckpointFunction& fn, const std::vector<Tensor>& inputs,
                               const CheckpointOptions& options) {
  TANDEM_CHECK(fn != nullptr, "checkpoint: expected a function but got an empty one");
  if (!GradMode::IsEnabled()) return fn(inputs);  // nothing will be recomputed
  std::vector<bool> requires_grad;
  for (const Tensor& input : inputs)
    requires_grad.push_back(input.defined() && input.requires_grad());
  std::vector<Tensor> outputs;
  GeneratorUses generators;
  std::vector<std::shared_ptr<Node>> leaf_nodes;
  {
    std::optional<GeneratorRecorder> recorder;
    if (options.preserve_rng_state()) recorder.emplace();
    if (RecordCheckpointedParameters::active()) {
      // Recorded over stand-ins, to see the leaves; the graph goes with the activations.
      const std::vector<Tensor> stand_ins = StandIns(inputs, requires_grad);
      outputs = fn(stand_ins);
      leaf_nodes = ReachedLeaves(outputs, stand_ins);
      for (Tensor& out : outputs) {
        if (out.defined()) out = out.detach();
      }
    } else {
      NoGradGuard no_grad;
      outputs = fn(inputs);
    }
    if (recorder) generators = recorder->uses();
  }
  // Floating outputs get the node; the others (indices, masks) have no gradient.
  std::vector<Tensor> recorded(outputs.size());
  std::vector<Device> output_devices;
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (outputs[i].defined() && IsFloatingPoint(outputs[i].dtype())) {
      // A new tensor even where fn returned an input (or a view of one): the node becomes its
      // grad_fn, which must not touch the input.
      outputs[i] = outputs[i].detach();
      recorded[i] = outputs[i];
    }
  }
  const auto first =
      std::find_if(recorded.begin(), recorded.end(), [](const Tensor& t) { return t.defined(); });
  if (first == recorded.end()) return outputs;
  for (const Tensor& t : recorded) output_devices.push_back((t.defined() ? t : *first).device());
  std::vector<Tensor> kept;
  for (const Tensor& input : inputs) kept.push_back(input.defined() ? input.detach() : Tensor());
  AutocastState autocast = AutocastMode::GetState();
  autocast.cache.reset();  // the recomputation casts the weights again rather than keep them
  auto node = std::make_shared<CheckpointBackward>(
      first->device(), std::move(output_devices), fn, std::move(kept), std::move(requires_grad),
      std::move(generators), std::move(autocast), std::move(leaf_nodes));
  RecordMultiOutputOp(std::move(node), inputs, recorded);
  return outputs;
}

Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input,
                  const CheckpointOptions& options) {
  TANDEM_CHECK(fn != nullptr, "checkpoint: expected a function but got an empty one");
  return checkpoint([fn](const std::vector<Tensor>& in) { return std::vector<Tensor>{fn(in[0])}; },
                    {input}, options)[0];
}

}  // namespace tandem::nn
