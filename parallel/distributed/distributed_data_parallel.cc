#include "parallel/distributed/distributed_data_parallel.h"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <optional>
#include <sstream>
#include <unordered_set>
#include <utility>

#include "nn/activation_checkpoint.h"
#include "parallel/distributed/broadcast_coalesced.h"
#include "parallel/distributed/same_configuration.h"
#include "tensor/base/error.h"
#include "tensor/core/autograd.h"

namespace tandem::parallel::distributed {
namespace {

using Clock = std::chrono::steady_clock;

constexpr double kFirstBucketBytes = 1024 * 1024;

std::string Prefix(const ProcessGroup& group) {
  return tandem::internal::Concat("DistributedDataParallel (rank ", group.rank(), " of ",
                                  group.size(), "): ");
}

// Every rank's `text`, rank 0's first (collective).
std::vector<std::string> AllgatherStrings(ProcessGroup& group, const std::string& text) {
  const int world = group.size();
  const Device device = group.device();
  Tensor lengths = zeros({world}, TensorOptions(kInt64).device(device));
  group
      .allgather(
          lengths,
          from_vector(std::vector<int64_t>{static_cast<int64_t>(text.size())}, {1}).to(device))
      ->wait();
  const std::vector<int64_t> sizes = lengths.to_vector<int64_t>();
  const int64_t longest = *std::max_element(sizes.begin(), sizes.end());
  std::vector<int64_t> mine(static_cast<size_t>(longest), 0);
  for (size_t i = 0; i < text.size(); ++i) mine[i] = static_cast<unsigned char>(text[i]);
  Tensor all = zeros({world * longest}, TensorOptions(kInt64).device(device));
  group.allgather(all, from_vector(mine, {longest}).to(device))->wait();
  const std::vector<int64_t> chars = all.to_vector<int64_t>();
  std::vector<std::string> texts(world);
  for (int r = 0; r < world; ++r) {
    for (int64_t i = 0; i < sizes[r]; ++i)
      texts[r].push_back(static_cast<char>(chars[r * longest + i]));
  }
  return texts;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// One line per parameter and buffer: what every rank must agree on.
std::string DescribeModel(const nn::Module& module) {
  std::ostringstream out;
  for (const nn::NamedTensor& p : module.named_parameters()) {
    out << "parameter " << p.name << " " << ShapeToString(p.value.shape()) << " " << p.value.dtype()
        << (p.value.requires_grad() ? "" : " (requires_grad false)") << "\n";
  }
  for (const nn::NamedTensor& b : module.named_buffers()) {
    out << "buffer " << b.name << " " << ShapeToString(b.value.shape()) << " " << b.value.dtype()
        << "\n";
  }
  return out.str();
}

// Throws, on every rank alike, when some rank's model differs from rank 0's.
void CheckSameModelEverywhere(ProcessGroup& group, const nn::Module& module) {
  const std::vector<std::string> models = AllgatherStrings(group, DescribeModel(module));
  const std::vector<std::string> reference = Lines(models[0]);
  for (int r = 1; r < group.size(); ++r) {
    if (models[r] == models[0]) continue;
    const std::vector<std::string> other = Lines(models[r]);
    size_t i = 0;
    while (i < reference.size() && i < other.size() && reference[i] == other[i]) ++i;
    const std::string ours = i < reference.size() ? reference[i] : "nothing more";
    const std::string theirs = i < other.size() ? other[i] : "nothing more";
    TANDEM_FAIL(Prefix(group), "rank 0 and rank ", r, " hold different models: at entry ", i + 1,
                " rank 0 has ", ours, " but rank ", r, " has ", theirs, " (", reference.size(),
                " and ", other.size(),
                " parameters and buffers); every rank must construct the same model, with the "
                "same parameters and buffers in the same order, shapes and dtypes");
  }
}

// Throws, on every rank alike, when the ranks were given different options: they decide the
// buckets and the collectives of every backward, so the ranks would otherwise mismatch later.
void CheckSameOptionsEverywhere(ProcessGroup& group, const DistributedDataParallelOptions& o) {
  std::ostringstream cap;
  cap.precision(17);
  cap << o.bucket_cap_mb();
  const std::optional<DType> compression = o.gradient_compression();
  RequireSameConfiguration(
      group,
      {{"gradient_compression", compression ? DTypeName(*compression) : std::string("none")},
       {"bucket_cap_mb", cap.str()},
       {"find_unused_parameters", o.find_unused_parameters() ? "true" : "false"},
       {"static_graph", o.static_graph() ? "true" : "false"},
       {"broadcast_buffers", o.broadcast_buffers() ? "true" : "false"}},
      Prefix(group) +
          "construct DistributedDataParallel with the same "
          "DistributedDataParallelOptions on every rank");
}

}  // namespace

double ReductionStats::overlap_fraction() const {
  if (communication_seconds <= 0) return 0;
  return std::clamp(1.0 - wait_seconds / communication_seconds, 0.0, 1.0);
}

// The gradient reduction: buckets, readiness, and the end-of-backward wait. Shared with the
// gradient hooks (which hold it weakly, so hooks outliving the DDP do nothing).
struct DistributedDataParallel::Reducer {
  struct Bucket {
    std::vector<int> params;  // indices into Reducer::params
    Tensor flat;              // the bucket's gradients, concatenated, in their dtype
    int pending = 0;          // parameters not ready yet in this pass
    std::shared_ptr<CommFuture> future;
  };

  std::shared_ptr<ProcessGroup> group;
  CommHook hook;  // allreduce_hook unless one was registered
  bool find_unused = false;
  bool grad_as_bucket_view = false;
  bool static_graph = false;
  std::string prefix;
  std::vector<Tensor> params;  // those that require grad, in registration order
  std::vector<std::string> names;
  std::vector<int> bucket_of;             // per parameter
  std::vector<int64_t> offset_in_bucket;  // per parameter, in elements
  std::vector<Bucket> buckets;

  std::mutex mutex;          // guards what follows (hooks run on the device's worker)
  bool expect_sync = false;  // a forward prepared a reduction that has not finished
  bool any_ready = false;    // some gradient of this pass has arrived
  bool callback_queued = false;
  std::vector<char> ready;         // per parameter, in this pass
  std::vector<char> locally_used;  // per parameter, in this pass
  std::vector<int> arrivals;       // per parameter: gradient hooks fired in this pass
  // static_graph: per parameter, how many times its gradient arrived in the first iteration
  // (empty until that iteration's reduction).
  std::vector<int> expected_arrivals;
  size_t next_bucket = 0;  // buckets launch in index order
  ReductionStats stats;

  GradBucket MakeGradBucket(size_t b) const {
    const Bucket& bucket = buckets[b];
    std::vector<Tensor> bucket_params;
    std::vector<int64_t> offsets;
    for (int i : bucket.params) {
      bucket_params.push_back(params[i]);
      offsets.push_back(offset_in_bucket[i]);
    }
    return GradBucket(static_cast<int>(b), b + 1 == buckets.size(), bucket.flat,
                      std::move(bucket_params), std::move(offsets));
  }

  // Hands bucket b to the hook, which starts its reduction.
  void Launch(size_t b) {
    GradBucket grad_bucket = MakeGradBucket(b);
    buckets[b].future = hook(grad_bucket);
    TANDEM_CHECK(buckets[b].future != nullptr, prefix,
                 "the communication hook returned a null future for bucket ", b,
                 "; return the CommFuture of its reduction");
  }

  // Waits for bucket b's hook and returns its result, checked against the bucket.
  Tensor Result(size_t b) {
    const Tensor& flat = buckets[b].flat;
    Tensor result = buckets[b].future->wait();
    TANDEM_CHECK(result.defined() && result.shape() == flat.shape() &&
                     result.dtype() == flat.dtype() && result.device() == flat.device(),
                 prefix, "the communication hook's result for bucket ", b, " must be ",
                 ShapeToString(flat.shape()), " ", DTypeName(flat.dtype()), " on ", flat.device(),
                 " (the bucket's buffer) but is ",
                 result.defined()
                     ? tandem::internal::Concat(ShapeToString(result.shape()), " ",
                                                DTypeName(result.dtype()), " on ", result.device())
                     : std::string("undefined"),
                 "; return the reduced buffer (converted back if the hook compressed it)");
    if (grad_as_bucket_view && result.data_ptr() != flat.data_ptr()) {
      NoGradGuard no_grad;
      Tensor(flat).copy_(result);  // .grad is a view of the bucket
      return flat;
    }
    return result;
  }

  // Waits for every launched bucket, ignoring their errors (before reporting another one: the
  // buffers must not be reused while a collective still writes them).
  void DrainLaunched() {
    for (Bucket& bucket : buckets) {
      if (!bucket.future) continue;
      try {
        bucket.future->wait();
      } catch (const std::exception&) {
      }
    }
  }

  // Copies parameter i's gradient (zeros if it has none) into its bucket and launches every
  // bucket, in order, that is now complete.
  void MarkReadyLocked(int i, const Tensor& grad) {
    NoGradGuard no_grad;
    Bucket& bucket = buckets[bucket_of[i]];
    Tensor slot = bucket.flat.narrow(0, offset_in_bucket[i], params[i].numel());
    if (grad.defined()) {
      Tensor view = slot.view(params[i].shape());
      view.copy_(grad);  // nothing to do when .grad is this view already
      if (grad_as_bucket_view) params[i].set_grad(view);
    } else {
      slot.zero_();
    }
    ready[i] = 1;
    --bucket.pending;
    while (next_bucket < buckets.size() && buckets[next_bucket].pending == 0) {
      Launch(next_bucket++);
    }
  }

  void Prepare(const std::vector<Tensor>& outputs) {
    std::lock_guard<std::mutex> lock(mutex);
    TANDEM_CHECK(!(expect_sync && any_ready), prefix,
                 "the previous backward pass did not finish its gradient reduction (it failed, or "
                 "some gradients were computed without the end of backward being reached); the "
                 "ranks may now disagree, so this DistributedDataParallel cannot continue: "
                 "recreate it (and fix what made backward fail)");
    expect_sync = true;
    any_ready = false;
    callback_queued = false;
    next_bucket = 0;
    std::fill(ready.begin(), ready.end(), 0);
    std::fill(locally_used.begin(), locally_used.end(), 0);
    std::fill(arrivals.begin(), arrivals.end(), 0);
    for (Bucket& bucket : buckets) {
      bucket.pending = static_cast<int>(bucket.params.size());
      bucket.future.reset();
    }
    if (static_graph) {
      // The parameters the first iteration did not use are ready at once.
      for (size_t i = 0; i < expected_arrivals.size(); ++i) {
        if (expected_arrivals[i] == 0) MarkReadyLocked(static_cast<int>(i), params[i].grad());
      }
      return;
    }
    if (!find_unused) return;
    // The parameters the outputs depend on: those whose accumulator the graph reaches.
    std::unordered_set<const Node*> seen;
    std::vector<const Node*> stack;
    for (const Tensor& out : outputs) {
      const Edge edge = GradientEdge(out);
      if (edge.node && seen.insert(edge.node.get()).second) stack.push_back(edge.node.get());
    }
    while (!stack.empty()) {
      const Node* node = stack.back();
      stack.pop_back();
      for (const Edge& next : node->next_edges()) {
        if (next.node && seen.insert(next.node.get()).second) stack.push_back(next.node.get());
      }
      // A checkpoint's inside is not in the graph: the leaves its forward recorded (the
      // forward ran under RecordCheckpointedParameters) stand for it.
      for (const std::shared_ptr<Node>& leaf : nn::CheckpointedLeafNodes(*node)) {
        if (seen.insert(leaf.get()).second) stack.push_back(leaf.get());
      }
    }
    for (size_t i = 0; i < params.size(); ++i) {
      if (!seen.count(GradientEdge(params[i]).node.get()))
        MarkReadyLocked(static_cast<int>(i), params[i].grad());
    }
  }

  void OnGradReady(int i, const Tensor& grad, const std::weak_ptr<Reducer>& self) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!expect_sync) return;  // no_sync, or a backward not prepared by our forward
    if (!callback_queued) {
      callback_queued = true;
      // It runs after the outermost pass (QueueCallback's rule): a gradient may arrive in a
      // backward that a node runs inside this one (reentrant checkpointing), the others after.
      QueueCallback([self] {
        if (std::shared_ptr<Reducer> reducer = self.lock()) reducer->Finalize();
      });
    }
    any_ready = true;
    locally_used[i] = 1;
    ++arrivals[i];
    if (static_graph) {
      if (expected_arrivals.empty()) return;  // the first iteration reduces at its end
      TANDEM_CHECK(arrivals[i] <= expected_arrivals[i], prefix, "static_graph: parameter ",
                   names[i], " received its gradient ", arrivals[i],
                   " times in this backward pass but ", expected_arrivals[i],
                   " times in the first iteration; static_graph expects the same graph every "
                   "iteration: construct without static_graph if the graph changes");
      if (arrivals[i] == expected_arrivals[i]) MarkReadyLocked(i, grad);
      return;
    }
    TANDEM_CHECK(!ready[i], prefix, "Expected to mark a variable ready only once, but parameter ",
                 names[i], " (index ", i, ") received its gradient ", arrivals[i],
                 " times in this backward pass: multiple gradient hooks fired for it in one "
                 "iteration. This happens when the same parameters are used by several "
                 "reentrant backward passes (the same layer checkpointed twice, a node that runs "
                 "a backward of its own), when a parameter is used outside forward, or when "
                 "backward runs twice through one forward",
                 find_unused ? " (or find_unused_parameters found it unused)" : "",
                 ". If the model's graph is the same every iteration, construct with "
                 "DistributedDataParallelOptions().static_graph(true) (DDP then waits for every "
                 "arrival of each gradient); otherwise run forward again before each backward");
    MarkReadyLocked(i, grad);
  }

  // At the end of backward: waits for every bucket and writes the averages into .grad.
  void Finalize() {
    std::lock_guard<std::mutex> lock(mutex);
    expect_sync = false;
    if (static_graph && expected_arrivals.empty()) {
      // The first iteration: what arrived is the graph; every gradient is complete now.
      expected_arrivals = arrivals;
      for (int i = static_cast<int>(params.size()) - 1; i >= 0; --i) {
        if (!ready[i]) MarkReadyLocked(i, params[i].grad());
      }
    }
    std::vector<std::string> missing;
    for (size_t i = 0; i < params.size(); ++i) {
      if (!ready[i]) {
        missing.push_back(static_graph
                              ? tandem::internal::Concat(names[i], " (", arrivals[i], " of ",
                                                         expected_arrivals[i], " arrivals)")
                              : names[i]);
      }
    }
    if (!missing.empty()) {
      // The buckets already launched still write into their buffers: let them finish (every
      // rank launched at least these) before the next forward may reuse the buffers.
      DrainLaunched();
      std::ostringstream list;
      for (size_t k = 0; k < missing.size() && k < 5; ++k) list << (k ? ", " : "") << missing[k];
      if (missing.size() > 5) list << " and " << missing.size() - 5 << " more";
      TANDEM_FAIL(prefix, missing.size(),
                  " parameter(s) got no gradient in this backward pass: ", list.str(),
                  "; their buckets cannot be reduced. ",
                  static_graph ? "static_graph expects every gradient to arrive as many times as "
                                 "in the first iteration; construct without static_graph if the "
                                 "graph changes"
                               : "If the model has parameters that forward does not always use, "
                                 "pass DistributedDataParallelOptions().find_unused_parameters("
                                 "true); otherwise make the loss depend on them");
    }
    // With find_unused_parameters: which parameters some rank used (the others keep .grad).
    // (static_graph: the graph's unused parameters, which may differ between ranks too.)
    Tensor used;
    std::shared_ptr<Work> used_work;
    if (find_unused || static_graph) {
      std::vector<int64_t> flags(locally_used.begin(), locally_used.end());
      used = from_vector(flags, {static_cast<int64_t>(flags.size())}).to(group->device());
      used_work = group->allreduce(used, ReduceOp::kSum);
    }
    const Clock::time_point start = Clock::now();
    stats = ReductionStats();
    std::vector<Tensor> results;
    try {
      for (size_t b = 0; b < buckets.size(); ++b) {
        results.push_back(Result(b));
        stats.communication_seconds +=
            std::chrono::duration<double>(buckets[b].future->communication_time()).count();
      }
    } catch (...) {
      DrainLaunched();
      if (used_work) used_work->wait();
      throw;
    }
    if (used_work) used_work->wait();
    stats.backward_done = start;
    stats.reduced = Clock::now();
    stats.wait_seconds = std::chrono::duration<double>(stats.reduced - start).count();
    stats.buckets = static_cast<int>(buckets.size());
    WriteAverages(results, used.defined() ? used.to(Device::Cpu(0)).to_vector<int64_t>()
                                          : std::vector<int64_t>(params.size(), 1));
  }

  // Join: a rank that has run out of data takes part in one reduction of the others (zeros
  // from it: the average stays the sum over the ranks that trained, divided by the world size,
  // as PyTorch's) and writes the averages into .grad.
  void Shadow() {
    std::lock_guard<std::mutex> lock(mutex);
    NoGradGuard no_grad;
    // The hooks run on zeros, so that this rank issues the collectives the others do.
    for (size_t b = 0; b < buckets.size(); ++b) {
      buckets[b].flat.zero_();
      Launch(b);
    }
    Tensor used;
    std::shared_ptr<Work> used_work;
    if (find_unused || static_graph) {
      used = zeros({static_cast<int64_t>(params.size())},
                   TensorOptions(kInt64).device(group->device()));
      used_work = group->allreduce(used, ReduceOp::kSum);
    }
    std::vector<Tensor> results;
    for (size_t b = 0; b < buckets.size(); ++b) results.push_back(Result(b));
    if (used_work) used_work->wait();
    WriteAverages(results, used.defined() ? used.to(Device::Cpu(0)).to_vector<int64_t>()
                                          : std::vector<int64_t>(params.size(), 1));
  }

  // Writes each bucket's reduced gradients (the hooks' results) into the .grad of the
  // parameters some rank used.
  void WriteAverages(const std::vector<Tensor>& results,
                     const std::vector<int64_t>& used_anywhere) {
    NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) {
      if (used_anywhere[i] == 0) continue;
      Tensor average = results[bucket_of[i]]
                           .narrow(0, offset_in_bucket[i], params[i].numel())
                           .view(params[i].shape());
      Tensor grad = params[i].grad();
      if (grad.defined()) {
        grad.copy_(average);  // nothing to do when .grad is this view already
      } else {
        // The bucket holds the parameter's dtype (Result checked the hook's result against it).
        params[i].set_grad(grad_as_bucket_view ? average : average.clone());
      }
    }
  }
};

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<nn::Module> module,
                                                 std::shared_ptr<ProcessGroup> process_group,
                                                 DistributedDataParallelOptions options)
    : nn::Module("DistributedDataParallel"),
      module_(std::move(module)),
      process_group_(std::move(process_group)),
      options_(options) {
  TANDEM_CHECK(process_group_ != nullptr, "DistributedDataParallel: the process group is null");
  const std::string prefix = Prefix(*process_group_);
  TANDEM_CHECK(module_ != nullptr, prefix, "the module is null");
  TANDEM_CHECK(options_.bucket_cap_mb() > 0, prefix, "bucket_cap_mb must be positive but is ",
               options_.bucket_cap_mb());
  const std::optional<DType> compression = options_.gradient_compression();
  TANDEM_CHECK(!compression || *compression == kBFloat16 || *compression == kFloat16, prefix,
               "gradient_compression must be bfloat16 or float16 (PyTorch's bf16_compress_hook "
               "and fp16_compress_hook) but is ",
               DTypeName(*compression),
               "; leave it unset (std::nullopt) to all-reduce the gradients in the parameters' "
               "dtype");
  register_module("module", module_);

  std::vector<nn::NamedTensor> named = module_->named_parameters();
  for (size_t i = 1; i < named.size(); ++i) {
    TANDEM_CHECK(named[i].value.device() == named[0].value.device(), prefix,
                 "one device per process: every parameter must be on one device, but ",
                 named[0].name, " is on ", named[0].value.device(), " and ", named[i].name, " on ",
                 named[i].value.device(), "; move the module with to(device) before wrapping it");
  }
  CheckSameOptionsEverywhere(*process_group_, options_);
  CheckSameModelEverywhere(*process_group_, *module_);
  BroadcastCoalesced(*process_group_, module_->parameters());
  BroadcastCoalesced(*process_group_, module_->buffers());

  reducer_ = std::make_shared<Reducer>();
  Reducer& r = *reducer_;
  r.group = process_group_;
  ProcessGroup* group = process_group_.get();  // the DDP, which holds the reducer, holds it
  if (compression) {
    const DType dtype = *compression;
    r.hook = [group, dtype](GradBucket& bucket) { return CompressHook(dtype, *group, bucket); };
  } else {
    r.hook = [group](GradBucket& bucket) { return allreduce_hook(*group, bucket); };
  }
  r.find_unused = options_.find_unused_parameters();
  r.grad_as_bucket_view = options_.gradient_as_bucket_view();
  r.static_graph = options_.static_graph();
  r.prefix = prefix;
  for (const nn::NamedTensor& p : named) {
    if (!p.value.requires_grad()) continue;
    r.params.push_back(p.value);
    r.names.push_back(p.name);
  }
  const int n = static_cast<int>(r.params.size());
  r.bucket_of.assign(n, -1);
  r.offset_in_bucket.assign(n, 0);
  r.ready.assign(n, 0);
  r.locally_used.assign(n, 0);
  r.arrivals.assign(n, 0);
  // Buckets in reverse registration order, one dtype per bucket (PyTorch's
  // compute_bucket_assignment_by_size): each dtype fills its own open bucket, closed once it
  // holds bucket_cap_mb; the first of each dtype closes at 1 MiB already (as in PyTorch), so
  // that reduction starts early in backward. Buckets are numbered (and launch) in the order
  // they were opened. One device per process, so the dtype alone is PyTorch's (dtype, device).
  const double cap_bytes = options_.bucket_cap_mb() * 1024 * 1024;
  const double first_cap_bytes = std::min(cap_bytes, kFirstBucketBytes);
  struct OpenBucket {
    DType dtype;
    int index;   // into r.buckets
    int opened;  // buckets of this dtype so far
    int64_t elements;
  };
  std::vector<OpenBucket> open;  // one per dtype met so far
  for (int i = n - 1; i >= 0; --i) {
    const DType dtype = r.params[i].dtype();
    auto it = std::find_if(open.begin(), open.end(),
                           [dtype](const OpenBucket& o) { return o.dtype == dtype; });
    if (it == open.end()) it = open.insert(open.end(), OpenBucket{dtype, -1, 0, 0});
    const double cap = it->opened <= 1 ? first_cap_bytes : cap_bytes;
    const double bytes = static_cast<double>(it->elements * ElementSize(dtype));
    if (it->index < 0 || bytes >= cap) {
      it->index = static_cast<int>(r.buckets.size());
      ++it->opened;
      it->elements = 0;
      r.buckets.emplace_back();
    }
    r.bucket_of[i] = it->index;
    r.offset_in_bucket[i] = it->elements;
    r.buckets[it->index].params.push_back(i);
    it->elements += r.params[i].numel();
  }
  for (Reducer::Bucket& bucket : r.buckets) {
    int64_t total = 0;
    for (int i : bucket.params) total += r.params[i].numel();
    const Tensor& first = r.params[bucket.params[0]];
    bucket.flat = zeros({total}, TensorOptions(first.dtype()).device(first.device()));
  }
  std::weak_ptr<Reducer> weak = reducer_;
  for (int i = 0; i < n; ++i) {
    AddGradAccumulatedHook(r.params[i], [weak, i](const Tensor& grad) {
      if (std::shared_ptr<Reducer> reducer = weak.lock()) reducer->OnGradReady(i, grad, weak);
    });
  }
}

DistributedDataParallel::~DistributedDataParallel() = default;

void DistributedDataParallel::SyncBuffers() {
  BroadcastCoalesced(*process_group_, module_->buffers());
}

bool DistributedDataParallel::BroadcastsBuffers() const {
  return options_.broadcast_buffers() && process_group_->size() > 1 && !module_->buffers().empty();
}

void DistributedDataParallel::ShadowIteration(bool reduces, bool broadcasts_buffers) {
  if (broadcasts_buffers) SyncBuffers();
  if (reduces) reducer_->Shadow();
}

void DistributedDataParallel::RegisterCommHook(CommHook hook) {
  const std::string prefix = Prefix(*process_group_);
  TANDEM_CHECK(hook != nullptr, prefix, "register_comm_hook: the hook is empty");
  TANDEM_CHECK(!options_.gradient_compression(), prefix,
               "register_comm_hook: this DistributedDataParallel was constructed with "
               "gradient_compression(",
               DTypeName(options_.gradient_compression().value_or(kFloat32)),
               "), which is itself a communication hook; drop gradient_compression and register "
               "the hook (bf16_compress_hook or fp16_compress_hook for the same effect)");
  TANDEM_CHECK(!hook_registered_, prefix,
               "register_comm_hook: a communication hook is registered already; it can be "
               "registered only once (as in PyTorch)");
  TANDEM_CHECK(!forwarded_, prefix,
               "register_comm_hook: called after the first forward; register the hook right "
               "after constructing DistributedDataParallel, before any forward (as in PyTorch)");
  std::lock_guard<std::mutex> lock(reducer_->mutex);
  reducer_->hook = std::move(hook);
  hook_registered_ = true;
}

std::vector<Tensor> DistributedDataParallel::forward_tensors(const std::vector<Tensor>& inputs) {
  forwarded_ = true;
  // Collectives only in training with grad mode on, so that one rank may evaluate alone.
  const bool training_step = is_training() && GradMode::IsEnabled();
  if (join_mode_ && training_step) {
    // Join: the ranks that have run out of data learn what this iteration runs (parallel/
    // distributed/join.h): [ranks still training, ranks reducing, ranks broadcasting buffers].
    const bool reduces = require_sync_ && !reducer_->params.empty();
    Tensor flags =
        from_vector(std::vector<int64_t>{1, reduces ? 1 : 0, BroadcastsBuffers() ? 1 : 0}, {3})
            .to(process_group_->device());
    process_group_->allreduce(flags, ReduceOp::kSum)->wait();
  }
  if (training_step && BroadcastsBuffers()) SyncBuffers();
  const bool walks_graph = training_step && require_sync_ && !reducer_->params.empty() &&
                           reducer_->find_unused && !reducer_->static_graph;
  std::vector<Tensor> outputs;
  {
    // find_unused_parameters must see the parameters used inside nn::checkpoint.
    std::optional<nn::RecordCheckpointedParameters> record;
    if (walks_graph) record.emplace();
    outputs = module_->forward_tensors(inputs);
  }
  if (training_step && require_sync_ && !reducer_->params.empty()) reducer_->Prepare(outputs);
  return outputs;
}

std::vector<std::vector<std::string>> DistributedDataParallel::bucket_parameter_names() const {
  std::vector<std::vector<std::string>> names;
  for (const Reducer::Bucket& bucket : reducer_->buckets) {
    names.emplace_back();
    for (int i : bucket.params) names.back().push_back(reducer_->names[i]);
  }
  return names;
}

ReductionStats DistributedDataParallel::last_reduction_stats() const {
  std::lock_guard<std::mutex> lock(reducer_->mutex);
  return reducer_->stats;
}

}  // namespace tandem::parallel::distributed
