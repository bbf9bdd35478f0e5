#include "tensor/core/engine.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "tensor/base/autocast_mode.h"
#include "tensor/core/anomaly_mode.h"
#include "tensor/core/autograd.h"
#include "tensor/core/internal/anomaly.h"
#include "tensor/core/internal/autograd_internal.h"
#include "tensor/core/internal/tensor_impl.h"
#include "tensor/kernels/index_kernels.h"
#include "tensor/runtime/backend.h"
#include "tensor/runtime/profiler.h"
#include "tensor/runtime/threads.h"

namespace tandem {
namespace {

// a + b for two gradients of one slot (one shape; either may be a broadcast view), with the
// backend's kernel: the engine sits below the ops layer. Into `a` or `b` when one is a
// full-size buffer nothing else holds (as AccumulateGrad steals one), which saves a buffer
// the size of the gradient wherever gradients fan in (residual streams, tied weights).
Tensor SumOfRawGradients(const Tensor& a, const Tensor& b) {
  const Device device = a.device();
  Backend& backend = GetBackend(device);
  const DType dtype = PromoteTypes(a.dtype(), b.dtype());
  for (const Tensor* into : {&a, &b}) {
    const Tensor& other = into == &a ? b : a;
    if (into->dtype() == dtype && other.dtype() == dtype && into->shape() == other.shape() &&
        IsSoleOwner(*into)) {
      backend.Binary(device.index(), BinaryOp::kAdd, ToKernel(*into), ToKernel(*into),
                     ToKernel(other));
      return *into;
    }
  }
  const auto in_dtype = [&](const Tensor& t) {
    if (t.dtype() == dtype) return t;
    Tensor converted = NewTensor(t.shape(), dtype, device);
    backend.Copy(device.index(), ToKernel(converted), ToKernel(t));
    return converted;
  };
  const Tensor x = in_dtype(a), y = in_dtype(b);
  Tensor sum = NewTensor(a.shape(), dtype, device);
  backend.Binary(device.index(), BinaryOp::kAdd, ToKernel(sum), ToKernel(x), ToKernel(y));
  return sum;
}

class GraphTask;
thread_local GraphTask* t_current_task = nullptr;

class CurrentTaskScope {
 public:
  explicit CurrentTaskScope(GraphTask* task) : previous_(t_current_task) { t_current_task = task; }
  ~CurrentTaskScope() { t_current_task = previous_; }
  CurrentTaskScope(const CurrentTaskScope&) = delete;
  CurrentTaskScope& operator=(const CurrentTaskScope&) = delete;

 private:
  GraphTask* previous_;
};

// The state of one backward pass. Every node reachable from the roots gets a NodeState up
// front, so the map is only read while the pass runs; a node becomes ready when every edge
// into it has delivered (with or without a gradient), and then runs on its device's worker.
class GraphTask : public std::enable_shared_from_this<GraphTask> {
 public:
  GraphTask(bool create_graph, bool retain_graph)
      : caller_(DeviceWorker::Current()),
        outer_(t_current_task),
        create_graph_(create_graph),
        retain_graph_(retain_graph) {}

  // The pass whose callbacks this one's callers queue: the outermost. A pass started from
  // inside a node (activation checkpointing's recomputation, nn/activation_checkpoint.h) is
  // part of the pass that ran the node, so what its hooks queue (DistributedDataParallel's
  // wait for every bucket) must wait for the outer pass, not for the end of the nested one.
  GraphTask* Outermost() {
    GraphTask* task = this;
    while (task->outer_ != nullptr) task = task->outer_;
    return task;
  }

  void CountDependencies(const std::vector<Node*>& roots) {
    std::vector<Node*> stack;
    for (Node* root : roots) {
      if (StateOf(root) == nullptr) {
        states_.emplace(root, std::make_unique<NodeState>(root->num_outputs()));
        stack.push_back(root);
      }
    }
    while (!stack.empty()) {
      Node* node = stack.back();
      stack.pop_back();
      for (const Edge& edge : node->next_edges()) {
        Node* next = edge.node.get();
        if (next == nullptr) continue;
        NodeState* state = StateOf(next);
        if (state == nullptr) {
          state = states_.emplace(next, std::make_unique<NodeState>(next->num_outputs()))
                      .first->second.get();
          stack.push_back(next);
        }
        state->dependencies.fetch_add(1, std::memory_order_relaxed);
      }
    }
  }

  // Makes the pass capture the gradients that reach `edges` (autograd::grad) instead of
  // running the whole graph: only the nodes with a path to a captured edge run, so the
  // accumulators (and their hooks) never do. Call after CountDependencies.
  void CaptureAt(const std::vector<Edge>& edges) {
    capturing_ = true;
    captured_.resize(edges.size());
    for (size_t i = 0; i < edges.size(); ++i) {
      captures_[edges[i].node.get()].emplace_back(edges[i].input_nr, i);
    }
    // Every node of the pass in topological order (Kahn's, over the counted dependencies);
    // then, walking it backwards, a node is needed if one of its edges leads to a captured
    // node or a needed one.
    std::unordered_map<Node*, int> remaining;
    std::vector<Node*> order;
    for (const auto& [node, state] : states_) {
      remaining[node] = state->dependencies.load(std::memory_order_relaxed);
      if (remaining[node] == 0) order.push_back(node);
    }
    for (size_t i = 0; i < order.size(); ++i) {
      for (const Edge& edge : order[i]->next_edges()) {
        if (edge.node && --remaining[edge.node.get()] == 0) order.push_back(edge.node.get());
      }
    }
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      for (const Edge& edge : (*it)->next_edges()) {
        Node* next = edge.node.get();
        if (next != nullptr && (captures_.count(next) > 0 || needed_.count(next) > 0)) {
          needed_.insert(*it);
          break;
        }
      }
    }
  }

  std::vector<Tensor> TakeCaptured() {
    std::lock_guard<std::mutex> lock(mutex_);
    return std::move(captured_);
  }

  void AddRoot(const Edge& edge, const Tensor& grad) {
    Deposit(StateOf(edge.node.get()), edge.input_nr, grad);
    roots_.push_back(edge.node);
  }

  void Run() {
    if (caller_ == nullptr && !roots_.empty() && RunsInline(roots_[0]->device())) {
      // A thread that is no device's worker (the program's own) runs the nodes of its root's
      // CPU device itself, as PyTorch's engine runs CPU work on the thread that called
      // backward: a backward pass on one CPU device then hands nothing to another thread,
      // and one over several devices hands off only what the other devices run.
      caller_ = &DeviceWorker::For(roots_[0]->device());
    }
    std::unordered_set<Node*> started;
    for (const auto& root : roots_) {
      NodeState* state = StateOf(root.get());
      if (state->dependencies.load() == 0 && started.insert(root.get()).second) {
        std::vector<std::shared_ptr<Node>> pending;
        OnReady(root, std::move(state->slots), pending);
        for (const auto& next : pending) Release(next);
      }
    }
    // The graph (and the tensors its nodes saved) is let go on the caller's thread before
    // backward() returns, as in PyTorch: a worker that finished the last node may still be
    // unwinding its task, and must not be the one holding the graph's last references.
    struct ReleaseGraphOnExit {
      GraphTask* task;
      ~ReleaseGraphOnExit() { task->ReleaseGraph(); }
    } release{this};
    WaitUntilDone();
    RunCallbacks();
  }

  // Drops the roots and any queued nodes; called once every node has run (or was skipped).
  void ReleaseGraph() {
    std::vector<std::shared_ptr<Node>> roots;
    std::unordered_map<DeviceWorker*, std::vector<ReadyNode>> ready;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      roots.swap(roots_);
      ready.swap(ready_);
    }
  }

  bool failed() const { return failed_.load(); }

  void AddCallback(std::function<void()> callback) {
    std::lock_guard<std::mutex> lock(mutex_);
    callbacks_.push_back(std::move(callback));
  }

 private:
  struct NodeState {
    explicit NodeState(int num_outputs) : slots(num_outputs) {}
    std::atomic<int> dependencies{0};
    std::mutex mutex;  // guards slots while gradients are delivered
    std::vector<Tensor> slots;
  };

  NodeState* StateOf(Node* node) const {
    auto it = states_.find(node);
    return it == states_.end() ? nullptr : it->second.get();
  }

  // Adds `grad` into slot `slot` of a node. The addition runs outside the slot's lock: a
  // thread that finds the slot occupied takes the value out, adds, and puts the sum back
  // (again, if another thread filled the slot meanwhile), so several devices' gradients
  // meeting in one node are summed in parallel. A delivery completes before its dependency
  // is released, so the node sees every sum when it becomes ready.
  void Deposit(NodeState* state, uint32_t slot, Tensor grad) {
    while (true) {
      Tensor existing;
      {
        std::lock_guard<std::mutex> lock(state->mutex);
        Tensor& target = state->slots[slot];
        if (!target.defined()) {
          target = std::move(grad);
          return;
        }
        existing = std::move(target);
        target = Tensor();
      }
      grad = SumOfGradients(existing, grad);
    }
  }

  // Adds scattered slices into slot `slot`: in place into the gradient waiting there when
  // nothing else holds it (a kernel's fresh output), so neither a zero-filled dense buffer
  // nor a full-size sum is made; otherwise as a dense gradient.
  void DepositScatter(NodeState* state, uint32_t slot, const ScatterGradient& scattered) {
    Tensor existing;
    {
      std::lock_guard<std::mutex> lock(state->mutex);
      Tensor& target = state->slots[slot];
      if (target.defined() && target.dtype() == scattered.values.dtype() &&
          target.shape() == scattered.shape && target.device() == scattered.values.device() &&
          IsSoleOwner(target)) {
        existing = std::move(target);
        target = Tensor();
      }
    }
    if (existing.defined()) {
      ScatterInto(existing, scattered);
      Deposit(state, slot, std::move(existing));  // sums with whatever arrived meanwhile
    } else {
      Deposit(state, slot, Densify(scattered));
    }
  }

  static void ScatterInto(const Tensor& dense, const ScatterGradient& s) {
    const Device device = dense.device();
    if (s.values.numel() == 0) return;
    ScatterAddKernel(device, dense.dtype(), ToKernel(dense).data, ToKernel(s.values).data,
                     static_cast<const int64_t*>(ToKernel(s.index).data), s.outer, s.dim_size,
                     s.idx_dim, s.inner);
  }

  // The dense gradient of scattered slices: zeros, then the slices added.
  static Tensor Densify(const ScatterGradient& s) {
    const Device device = s.values.device();
    Tensor dense = NewTensor(s.shape, s.values.dtype(), device);
    GetBackend(device).Fill(device.index(), ToKernel(dense), 0.0);
    ScatterInto(dense, s);
    return dense;
  }

  // a + b for two gradients of one slot; under create_graph a sum of gradients with graphs
  // is recorded.
  Tensor SumOfGradients(const Tensor& a, const Tensor& b) const {
    if (create_graph_ && (a.requires_grad() || b.requires_grad())) {
      return internal::AddGradientsWithGraph(a, b);
    }
    return SumOfRawGradients(a, b);
  }

  // Marks one edge into `next` as delivered. A node whose edges have all delivered is
  // dispatched, or, if no gradient reached any of its outputs, skipped, releasing its own
  // inputs in turn.
  void Release(const std::shared_ptr<Node>& next) {
    std::vector<std::shared_ptr<Node>> pending = {next};
    while (!pending.empty()) {
      std::shared_ptr<Node> node = std::move(pending.back());
      pending.pop_back();
      NodeState* state = StateOf(node.get());
      if (state->dependencies.fetch_sub(1, std::memory_order_acq_rel) != 1) continue;
      std::vector<Tensor> grads;
      {
        std::lock_guard<std::mutex> lock(state->mutex);
        grads = std::move(state->slots);
      }
      OnReady(std::move(node), std::move(grads), pending);
    }
  }

  // A node whose edges have all delivered: captured where autograd::grad asked for its
  // gradients, then dispatched, or, if no gradient reached any of its outputs, skipped (its
  // next nodes go to `pending` to be released in turn). A pass that captures runs only the
  // nodes that lead to a capture.
  void OnReady(std::shared_ptr<Node> node, std::vector<Tensor> grads,
               std::vector<std::shared_ptr<Node>>& pending) {
    if (capturing_) {
      auto it = captures_.find(node.get());
      if (it != captures_.end()) {
        std::lock_guard<std::mutex> lock(mutex_);
        for (const auto& [slot, index] : it->second) captured_[index] = grads[slot];
      }
      // The nodes after one that is not needed are not needed either: nothing waits on them.
      if (needed_.count(node.get()) == 0) return;
    }
    if (std::any_of(grads.begin(), grads.end(), [](const Tensor& g) { return g.defined(); })) {
      Dispatch(std::move(node), std::move(grads));
    } else {
      for (const Edge& edge : node->next_edges()) {
        if (edge.node) pending.push_back(edge.node);
      }
    }
  }

  // Queues a ready node for its device. Each device has a heap of ready nodes ordered by
  // sequence number; every queued node posts one "run the newest ready node" task to the
  // device's worker, so all get run and the order follows the heap, not the posting.
  void Dispatch(std::shared_ptr<Node> node, std::vector<Tensor> grads) {
    DeviceWorker* worker = &DeviceWorker::For(node->device());
    auto self = shared_from_this();
    auto task = [self, worker] { self->RunNewestReady(worker); };
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++outstanding_;
      std::vector<ReadyNode>& heap = ready_[worker];
      heap.push_back(ReadyNode{std::move(node), std::move(grads)});
      std::push_heap(heap.begin(), heap.end());
      if (worker == caller_) {
        // The caller is this device's worker and is blocked in WaitUntilDone: it runs the
        // task itself rather than deadlocking on its own queue.
        local_tasks_.push_back(std::move(task));
        wake_signals_.fetch_add(1, std::memory_order_release);
        wake_.notify_all();
        return;
      }
    }
    worker->Post(std::move(task));
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
    Execute(std::move(next.node), std::move(next.grads));
  }

  void Execute(std::shared_ptr<Node> node, std::vector<Tensor> grads) {
    if (!failed_.load()) {
      try {
        CurrentTaskScope current(this);
        // Under create_graph the node's ops record the gradients' own graph.
        AutoGradMode grad_mode(create_graph_);
        // A backward computes in the dtypes its forward chose; autocast must not recast it.
        AutocastSuspendGuard no_autocast;
        const bool detect_anomaly = AnomalyMode::IsEnabled();
        // Under create_graph a node that cannot be differentiated again runs without
        // recording, and its gradients get a node that refuses a second backward.
        const bool refuse = create_graph_ && !node->SupportsDoubleBackward();
        std::vector<Tensor> received;
        if (detect_anomaly || refuse) received = grads;
        std::vector<Tensor> input_grads;
        std::vector<std::optional<ScatterGradient>> scattered;  // a scattering node sizes it
        {
          TANDEM_PROFILE_SCOPE("autograd", node->name());
          internal::ApplyingNodeScope applying(node);
          if (!create_graph_) {
            input_grads = node->ApplyScattered(std::move(grads), scattered);
          } else if (refuse) {
            NoGradGuard no_grad;
            input_grads = node->Apply(std::move(grads));
          } else {
            input_grads = node->Apply(std::move(grads));  // dense: scattering is not recorded
          }
        }
        // Its saved tensors go now, not when the graph does: a backward's peak then holds
        // only the activations of the layers still to go (PyTorch's release_variables).
        if (!retain_graph_) node->ReleaseVariables();
        if (refuse) internal::RefuseDoubleBackward(*node, received, input_grads);
        const auto& edges = node->next_edges();
        TANDEM_CHECK(input_grads.size() == edges.size(), "internal error: ", node->name(),
                     " returned ", input_grads.size(), " gradients for ", edges.size(), " inputs");
        if (detect_anomaly) {
          // The check reads every gradient: scattered ones are made dense first.
          for (size_t i = 0; i < scattered.size(); ++i) {
            if (scattered[i] && !input_grads[i].defined()) input_grads[i] = Densify(*scattered[i]);
            scattered[i].reset();
          }
          internal::CheckBackwardAnomaly(*node, received, input_grads);
        }
        for (size_t i = 0; i < input_grads.size(); ++i) {
          const Edge& edge = edges[i];
          if (!edge.node) continue;
          Tensor g = std::move(input_grads[i]);
          if (!g.defined() && i < scattered.size() && scattered[i]) {
            const ScatterGradient& part = *scattered[i];
            const Device target = edge.node->output_device(static_cast<int>(edge.input_nr));
            if (part.values.device() == target &&
                (!edge.dtype || *edge.dtype == part.values.dtype())) {
              DepositScatter(StateOf(edge.node.get()), edge.input_nr, part);
              Release(edge.node);
              continue;
            }
            g = Densify(part);  // then delivered as any gradient: copied, converted
          }
          if (g.defined()) {
            const Device target = edge.node->output_device(static_cast<int>(edge.input_nr));
            if (g.device() != target) g = g.to(target);
            if (edge.dtype && *edge.dtype != g.dtype() && IsFloatingPoint(*edge.dtype) &&
                IsFloatingPoint(g.dtype())) {
              g = g.to(*edge.dtype);
            }
            Deposit(StateOf(edge.node.get()), edge.input_nr, std::move(g));
          }
          Release(edge.node);
        }
      } catch (...) {
        RecordFailure(node, std::current_exception());
      }
    }
    node.reset();  // before the caller can wake: backward() returns with the node released
    std::lock_guard<std::mutex> lock(mutex_);
    if (--outstanding_ == 0) {
      wake_signals_.fetch_add(1, std::memory_order_release);
      wake_.notify_all();
    }
  }

  void RecordFailure(const std::shared_ptr<Node>& node, std::exception_ptr error) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!failed_.exchange(true)) {
      error_ = std::move(error);
      failed_node_ = node->name() + " on " + node->device().ToString();
    }
  }

  void WaitUntilDone() {
    WorkerScope as_worker(caller_);  // the nodes run here see the device they run for
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      if (outstanding_ != 0 && local_tasks_.empty()) {
        // Another device's nodes are running; the next event (a node for this thread, or the
        // end) often follows within microseconds, sooner than a sleeping thread wakes.
        const int seen = wake_signals_.load(std::memory_order_acquire);
        lock.unlock();
        SpinWait([&] { return wake_signals_.load(std::memory_order_acquire) != seen; },
                 kHandOffSpin);
        lock.lock();
      }
      wake_.wait(lock, [this] { return outstanding_ == 0 || !local_tasks_.empty(); });
      if (local_tasks_.empty()) break;
      auto task = std::move(local_tasks_.front());
      local_tasks_.pop_front();
      lock.unlock();
      task();
      lock.lock();
    }
    lock.unlock();
    if (failed_) ThrowFailure();
  }

  // A tandem::Error naming the node, with the node's own exception nested inside.
  [[noreturn]] void ThrowFailure() {
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(error_);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    try {
      std::rethrow_exception(error_);
    } catch (...) {
      std::throw_with_nested(Error("backward failed in " + failed_node_ + ": " + what));
    }
  }

  void RunCallbacks() {
    CurrentTaskScope current(this);
    while (true) {
      std::function<void()> callback;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (next_callback_ == callbacks_.size()) return;
        callback = std::move(callbacks_[next_callback_++]);
      }
      callback();
    }
  }

  struct ReadyNode {
    std::shared_ptr<Node> node;
    std::vector<Tensor> grads;
    bool operator<(const ReadyNode& other) const {
      return node->sequence_nr() < other.node->sequence_nr();
    }
  };

  DeviceWorker* caller_;
  // The pass running the node that started this one (it outlives this one), or null.
  GraphTask* const outer_;
  const bool create_graph_;
  const bool retain_graph_;
  std::unordered_map<Node*, std::unique_ptr<NodeState>> states_;  // fixed before Run
  // autograd::grad (fixed before Run): the slots captured (node -> (slot, index in
  // captured_)) and the nodes that lead to one, the only ones run.
  bool capturing_ = false;
  std::unordered_map<Node*, std::vector<std::pair<uint32_t, size_t>>> captures_;
  std::unordered_set<Node*> needed_;
  std::vector<std::shared_ptr<Node>> roots_;
  std::atomic<bool> failed_{false};

  std::mutex mutex_;  // guards everything below
  std::condition_variable wake_;
  std::unordered_map<DeviceWorker*, std::vector<ReadyNode>> ready_;
  std::deque<std::function<void()>> local_tasks_;
  int outstanding_ = 0;
  // Bumped (under mutex_) whenever WaitUntilDone has something new to look at, so that it can
  // poll for it without the lock before sleeping.
  std::atomic<int> wake_signals_{0};
  std::exception_ptr error_;
  std::string failed_node_;
  std::vector<std::function<void()>> callbacks_;
  size_t next_callback_ = 0;
  std::vector<Tensor> captured_;
};

// A pass from `roots` with `grads`, its dependencies counted and its roots fed, not yet run.
// `what` names the caller in errors.
std::shared_ptr<GraphTask> PrepareTask(const std::vector<Tensor>& roots,
                                       const std::vector<Tensor>& grads, bool create_graph,
                                       bool retain_graph, const char* what) {
  TANDEM_CHECK(roots.size() == grads.size(), what, ": ", roots.size(), " tensors but ",
               grads.size(), " gradients");
  auto task = std::make_shared<GraphTask>(create_graph, retain_graph);
  std::vector<Node*> root_nodes;
  std::vector<std::pair<Edge, Tensor>> starts;
  for (size_t i = 0; i < roots.size(); ++i) {
    const Edge edge = GradientEdge(roots[i]);
    TANDEM_CHECK(edge.node != nullptr, what, ": tensor ", i,
                 " does not require grad and has no grad_fn");
    TANDEM_CHECK(grads[i].defined() && grads[i].shape() == roots[i].shape(), what,
                 ": the gradient for tensor ", i, " must have shape ",
                 ShapeToString(roots[i].shape()));
    root_nodes.push_back(edge.node.get());
    // Under create_graph a gradient that has a graph keeps it, as in PyTorch.
    Tensor grad = create_graph ? grads[i] : grads[i].detach();
    const Device target = edge.node->output_device(static_cast<int>(edge.input_nr));
    if (grad.device() != target) grad = grad.to(target);
    starts.emplace_back(edge, grad);
  }
  task->CountDependencies(root_nodes);
  {
    AutoGradMode grad_mode(create_graph);
    for (auto& [edge, grad] : starts) task->AddRoot(edge, grad);
  }
  return task;
}

}  // namespace

void RunBackward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
                 bool create_graph, std::optional<bool> retain_graph) {
  TANDEM_PROFILE_SCOPE("autograd", "backward");
  PrepareTask(roots, grads, create_graph, retain_graph.value_or(create_graph), "backward")->Run();
}

std::vector<Tensor> RunBackwardToInputs(const std::vector<Tensor>& roots,
                                        const std::vector<Tensor>& grads,
                                        const std::vector<Tensor>& inputs, bool create_graph,
                                        std::optional<bool> retain_graph) {
  TANDEM_PROFILE_SCOPE("autograd", "grad");
  std::vector<Edge> edges;
  for (size_t i = 0; i < inputs.size(); ++i) {
    edges.push_back(GradientEdge(inputs[i]));
    TANDEM_CHECK(edges.back().node != nullptr, "grad: input ", i,
                 " does not require grad; only tensors that require grad (or were computed from "
                 "ones that do) have gradients");
  }
  auto task = PrepareTask(roots, grads, create_graph, retain_graph.value_or(create_graph), "grad");
  task->CaptureAt(edges);
  task->Run();
  return task->TakeCaptured();
}

void QueueCallback(std::function<void()> callback) {
  TANDEM_CHECK(t_current_task != nullptr,
               "QueueCallback: called outside a backward pass; call it from a node or a "
               "gradient hook while backward() runs");
  t_current_task->Outermost()->AddCallback(std::move(callback));
}

bool InBackwardPass() { return t_current_task != nullptr; }

bool BackwardPassFailed() { return t_current_task != nullptr && t_current_task->failed(); }

namespace internal {

Tensor AddGradientsWithGraph(const Tensor& a, const Tensor& b) {
  Tensor sum = SumOfRawGradients(a, b);
  RecordOp(
      "AddGradientsBackward", {a, b}, sum,
      [](const Tensor& g) {
        return std::vector<Tensor>{g, g};
      },
      DoubleBackward::kSupported);
  return sum;
}

}  // namespace internal

}  // namespace tandem
