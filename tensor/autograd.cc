#include "tensor/autograd.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "tensor/tensor_impl.h"
#include "tensor/worker.h"

namespace tandem {
namespace {

thread_local bool grad_mode_enabled = true;
std::atomic<uint64_t> next_sequence_nr{0};

// Adds incoming gradients into a leaf's .grad and runs its gradient-ready hooks.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> leaf)
      : Node(leaf->device()), leaf_(std::move(leaf)) {}

  std::vector<Tensor> Apply(const Tensor& grad) override {
    TANDEM_CHECK(grad.shape() == leaf_->shape, "internal error: a gradient of shape ",
                 ShapeToString(grad.shape()), " reached a leaf of shape ",
                 ShapeToString(leaf_->shape));
    Tensor accumulated;
    std::vector<std::function<void(const Tensor&)>> hooks;
    {
      std::lock_guard<std::mutex> lock(leaf_->grad_mutex);
      if (!leaf_->grad.defined()) {
        // A copy: the incoming gradient may be a view (an expand, say) or held elsewhere,
        // and .grad is accumulated into in place by later passes.
        leaf_->grad = grad.detach().clone();
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

// The state of one backward pass. Nodes become ready when every edge into them has
// delivered its gradient; each ready node runs on its device's worker.
class GraphTask : public std::enable_shared_from_this<GraphTask> {
 public:
  GraphTask() : caller_(DeviceWorker::Current()) {}

  void CountDependencies(const std::vector<Node*>& roots) {
    std::vector<Node*> stack = roots;
    std::unordered_set<Node*> seen(roots.begin(), roots.end());
    while (!stack.empty()) {
      Node* node = stack.back();
      stack.pop_back();
      for (const Edge& edge : node->next_edges()) {
        Node* next = edge.node.get();
        if (next == nullptr) continue;
        ++dependencies_[next];
        if (seen.insert(next).second) stack.push_back(next);
      }
    }
  }

  // Adds a root's gradient; starts it once nothing else feeds it.
  void AddRoot(const std::shared_ptr<Node>& node, const Tensor& grad) {
    std::unique_lock<std::mutex> lock(mutex_);
    Accumulate(node.get(), grad);
    roots_.push_back(node);
  }

  void Run() {
    std::vector<std::pair<std::shared_ptr<Node>, Tensor>> ready;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      std::unordered_set<Node*> started;
      for (const auto& root : roots_) {
        if (dependencies_[root.get()] == 0 && started.insert(root.get()).second) {
          ready.emplace_back(root, TakeBuffer(root.get()));
        }
      }
    }
    for (auto& [node, grad] : ready) Dispatch(node, std::move(grad));
    WaitUntilDone();
  }

 private:
  void Accumulate(Node* node, const Tensor& grad) {
    auto it = buffers_.find(node);
    if (it == buffers_.end()) {
      buffers_.emplace(node, grad);
    } else {
      it->second = add(it->second, grad);
    }
  }

  Tensor TakeBuffer(Node* node) {
    auto it = buffers_.find(node);
    Tensor grad = std::move(it->second);
    buffers_.erase(it);
    return grad;
  }

  // Queues a ready node for its device. Each device has a heap of ready nodes ordered by
  // sequence number; every queued node posts one "run the newest ready node" task to the
  // device's worker, so all get run and the order follows the heap, not the posting.
  void Dispatch(std::shared_ptr<Node> node, Tensor grad) {
    DeviceWorker* worker = &DeviceWorker::For(node->device());
    auto self = shared_from_this();
    auto task = [self, worker] { self->RunNewestReady(worker); };
    std::lock_guard<std::mutex> lock(mutex_);
    ++outstanding_;
    std::vector<ReadyNode>& heap = ready_[worker];
    heap.push_back(ReadyNode{std::move(node), std::move(grad)});
    std::push_heap(heap.begin(), heap.end());
    if (worker == caller_) {
      // The caller is this device's worker and is blocked in WaitUntilDone: it runs the
      // task itself rather than deadlocking on its own queue.
      local_tasks_.push_back(std::move(task));
      wake_.notify_all();
    } else {
      worker->Post(std::move(task));
    }
  }

  void RunNewestReady(DeviceWorker* worker) {
    ReadyNode next;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      std::vector<ReadyNode>& heap = ready_[worker];
      std::pop_heap(heap.begin(), heap.end());
      next = std::move(heap.back());
      heap.pop_back();
    }
    Execute(next.node, next.grad);
  }

  void Execute(const std::shared_ptr<Node>& node, const Tensor& grad) {
    std::vector<std::pair<std::shared_ptr<Node>, Tensor>> ready;
    if (!failed_.load()) {
      try {
        NoGradGuard no_grad;
        std::vector<Tensor> input_grads = node->Apply(grad);
        const auto& edges = node->next_edges();
        TANDEM_CHECK(input_grads.size() == edges.size(), "internal error: ", node->name(),
                     " returned ", input_grads.size(), " gradients for ", edges.size(), " inputs");
        for (size_t i = 0; i < input_grads.size(); ++i) {
          const std::shared_ptr<Node>& next = edges[i].node;
          if (!next) continue;
          Tensor g = input_grads[i];
          if (g.defined() && g.device() != next->device()) g = g.to(next->device());
          std::lock_guard<std::mutex> lock(mutex_);
          if (g.defined()) Accumulate(next.get(), g);
          ReleaseDependency(next, &ready);
        }
      } catch (const std::exception& e) {
        RecordFailure(node, e.what());
      } catch (...) {
        RecordFailure(node, "unknown exception");
      }
    }
    for (auto& [next, g] : ready) Dispatch(next, std::move(g));
    std::lock_guard<std::mutex> lock(mutex_);
    if (--outstanding_ == 0) wake_.notify_all();
  }

  // Marks one edge into `next` as delivered (with or without a gradient); a node whose
  // edges have all delivered is ready, or, if no gradient reached it at all, is skipped and
  // releases its own inputs in turn. Called with mutex_ held.
  void ReleaseDependency(const std::shared_ptr<Node>& next,
                         std::vector<std::pair<std::shared_ptr<Node>, Tensor>>* ready) {
    std::vector<std::shared_ptr<Node>> pending = {next};
    while (!pending.empty()) {
      std::shared_ptr<Node> node = std::move(pending.back());
      pending.pop_back();
      if (--dependencies_[node.get()] != 0) continue;
      if (buffers_.count(node.get()) != 0) {
        ready->emplace_back(node, TakeBuffer(node.get()));
      } else {
        for (const Edge& edge : node->next_edges()) {
          if (edge.node) pending.push_back(edge.node);
        }
      }
    }
  }

  void RecordFailure(const std::shared_ptr<Node>& node, const std::string& what) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!failed_.exchange(true)) {
      error_ =
          "backward failed in " + node->name() + " on " + node->device().ToString() + ": " + what;
    }
  }

  void WaitUntilDone() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      wake_.wait(lock, [this] { return outstanding_ == 0 || !local_tasks_.empty(); });
      if (!local_tasks_.empty()) {
        auto task = std::move(local_tasks_.front());
        local_tasks_.pop_front();
        lock.unlock();
        task();
        lock.lock();
        continue;
      }
      break;
    }
    if (failed_) throw Error(error_);
  }

  struct ReadyNode {
    std::shared_ptr<Node> node;
    Tensor grad;
    bool operator<(const ReadyNode& other) const {
      return node->sequence_nr() < other.node->sequence_nr();
    }
  };

  DeviceWorker* caller_;
  std::unordered_map<DeviceWorker*, std::vector<ReadyNode>> ready_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::unordered_map<Node*, int> dependencies_;
  std::unordered_map<Node*, Tensor> buffers_;
  std::vector<std::shared_ptr<Node>> roots_;
  std::deque<std::function<void()>> local_tasks_;
  int outstanding_ = 0;
  std::atomic<bool> failed_{false};
  std::string error_;
};

}  // namespace

Node::Node(Device device) : device_(device), sequence_nr_(next_sequence_nr++) {}

bool GradMode::IsEnabled() { return grad_mode_enabled; }
void GradMode::SetEnabled(bool enabled) { grad_mode_enabled = enabled; }

bool NeedsGrad(const std::vector<Tensor>& inputs) {
  if (!GradMode::IsEnabled()) return false;
  for (const Tensor& t : inputs) {
    if (t.requires_grad()) return true;
  }
  return false;
}

Edge GradientEdge(const Tensor& tensor) {
  if (!tensor.defined() || !tensor.requires_grad()) return Edge{};
  if (tensor.grad_fn()) return Edge{tensor.grad_fn()};
  return Edge{AccumulatorFor(tensor)};
}

void RecordOp(std::shared_ptr<Node> node, const std::vector<Tensor>& inputs, Tensor& output) {
  TANDEM_CHECK(output.defined(), "internal error: RecordOp on an undefined output");
  std::vector<Edge> edges;
  edges.reserve(inputs.size());
  for (const Tensor& input : inputs) edges.push_back(GradientEdge(input));
  node->set_next_edges(std::move(edges));
  output.impl()->grad_fn = std::move(node);
  output.impl()->requires_grad = true;
}

void RecordOp(std::string name, const std::vector<Tensor>& inputs, Tensor& output,
              FunctionNode::Backward backward) {
  RecordOp(std::make_shared<FunctionNode>(std::move(name), output.device(), std::move(backward)),
           inputs, output);
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

void RunBackward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads) {
  TANDEM_CHECK(roots.size() == grads.size(), "backward: ", roots.size(), " tensors but ",
               grads.size(), " gradients");
  auto task = std::make_shared<GraphTask>();
  std::vector<Node*> root_nodes;
  std::vector<std::pair<std::shared_ptr<Node>, Tensor>> starts;
  for (size_t i = 0; i < roots.size(); ++i) {
    const Edge edge = GradientEdge(roots[i]);
    TANDEM_CHECK(edge.node != nullptr, "backward: tensor ", i,
                 " does not require grad and has no grad_fn");
    TANDEM_CHECK(grads[i].defined() && grads[i].shape() == roots[i].shape(),
                 "backward: the gradient for tensor ", i, " must have shape ",
                 ShapeToString(roots[i].shape()));
    root_nodes.push_back(edge.node.get());
    Tensor grad = grads[i].detach();
    if (grad.device() != edge.node->device()) grad = grad.to(edge.node->device());
    starts.emplace_back(edge.node, grad);
  }
  task->CountDependencies(root_nodes);
  {
    NoGradGuard no_grad;
    for (auto& [node, grad] : starts) task->AddRoot(node, grad);
  }
  task->Run();
}

}  // namespace tandem
