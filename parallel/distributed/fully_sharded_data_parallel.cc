#include "parallel/distributed/fully_sharded_data_parallel.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <utility>

#include "nn/clip_grad.h"
#include "parallel/distributed/broadcast_coalesced.h"
#include "parallel/distributed/internal/optimizer_state_name.h"
#include "parallel/distributed/same_configuration.h"
#include "tensor/base/error.h"
#include "tensor/core/autograd.h"
#include "tensor/core/storage_residency.h"

namespace tandem::parallel::distributed {

const char* ShardingStrategyName(ShardingStrategy strategy) {
  return strategy == ShardingStrategy::kFullShard ? "FULL_SHARD" : "SHARD_GRAD_OP";
}

namespace {

std::string Prefix(const ProcessGroup& group) {
  return tandem::internal::Concat("FullyShardedDataParallel (rank ", group.rank(), " of ",
                                  group.size(), "): ");
}

// One tensor of a unit: where it lies in the flat buffer and every handle that reads it.
struct FlatEntry {
  std::string name;  // its first name in the wrapped module
  std::vector<nn::Parameter> handles;
  Shape shape;
  int64_t offset = 0;
  int64_t numel = 0;
};

// Throws, on every rank alike, naming the first parameter or buffer where the ranks' models
// differ, or the option they disagree on.
void CheckSameEverywhere(ProcessGroup& group, const nn::Module& module,
                         const FullyShardedDataParallelOptions& o,
                         const std::vector<std::string>& unit_names) {
  std::vector<Setting> settings;
  auto dtype_name = [](const std::optional<DType>& d) {
    return d ? std::string(DTypeName(*d)) : std::string("none");
  };
  settings.push_back({"sharding_strategy", ShardingStrategyName(o.sharding_strategy())});
  settings.push_back({"param_dtype", dtype_name(o.param_dtype())});
  settings.push_back({"reduce_dtype", dtype_name(o.reduce_dtype())});
  settings.push_back({"backward_prefetch", o.backward_prefetch() ? "true" : "false"});
  settings.push_back({"forward_prefetch", o.forward_prefetch() ? "true" : "false"});
  settings.push_back({"broadcast_buffers", o.broadcast_buffers() ? "true" : "false"});
  std::string units;
  for (const std::string& name : unit_names) units += (units.empty() ? "" : ", ") + name;
  settings.push_back({"units (auto_wrap_policy)", units});
  for (const nn::NamedTensor& p : module.named_parameters()) {
    settings.push_back({"parameter " + p.name,
                        ShapeToString(p.value.shape()) + " " + DTypeName(p.value.dtype()) +
                            (p.value.requires_grad() ? "" : " (requires_grad false)"),
                        true});
  }
  for (const nn::NamedTensor& b : module.named_buffers()) {
    settings.push_back({"buffer " + b.name,
                        ShapeToString(b.value.shape()) + " " + DTypeName(b.value.dtype()), true});
  }
  RequireSameConfiguration(group, settings,
                           Prefix(group) +
                               "construct FullyShardedDataParallel on every rank with the same "
                               "model (parameters and buffers in the same order, shapes and "
                               "dtypes) and the same FullyShardedDataParallelOptions");
}

}  // namespace

// One gather of a unit's parameters (a forward's, and the backward that follows it): the
// gathered flat buffer, released and restored in place, and the views the handles were bound to.
struct Episode {
  int unit = 0;
  Tensor full;
  // The unit gathered before this one in the same forward: its backward comes right after ours.
  std::shared_ptr<Episode> previous;
  // An all-gather of this episode's unit started early (backward prefetch), into `prefetched`.
  std::shared_ptr<Work> prefetch;
  Tensor prefetched;
  uint64_t forward_id = 0;
  // Whether its views got a backward node (a unit that requires grad, in grad mode). A frozen
  // unit's episode has none to gather it again, so it stays gathered until backward ends.
  bool recorded = false;
};

struct FullyShardedDataParallel::State : std::enable_shared_from_this<State> {
  struct Unit {
    std::string name;
    int parent = -1;  // the enclosing unit (-1 for the root)
    std::vector<FlatEntry> entries;
    DType dtype = kFloat32;  // the parameters' and the shard's
    bool requires_grad = true;
    int64_t numel = 0, shard_numel = 0;
    Tensor shard;  // the leaf the optimizer steps, registered with the wrapper
    std::shared_ptr<Episode> current;
    Tensor accumulated;  // the unsharded gradient summed under no_sync
  };
  // A reduce-scatter in flight, added into its unit's shard gradient at the end of backward.
  struct Pending {
    int unit = 0;
    std::shared_ptr<Work> work;
    Tensor output;
    Tensor input;  // kept alive until the work is done
  };

  std::shared_ptr<ProcessGroup> group;
  FullyShardedDataParallelOptions options;
  std::string prefix;
  std::vector<Unit> units;
  uint64_t forward_id = 0;
  std::shared_ptr<Episode> last_gathered;  // in the running forward
  // forward_prefetch: the units a forward gathers, in order, as the first complete forward
  // recorded them; this forward's gathers so far; the all-gathers started ahead, by unit.
  std::vector<int> forward_order;
  bool forward_order_recorded = false;
  size_t forward_gathers = 0;
  struct Prefetch {
    int unit = 0;
    std::shared_ptr<Work> work;
    Tensor full;
  };
  std::vector<Prefetch> forward_prefetches;
  bool require_sync = true;
  bool summoned = false;  // summon_full_params: the module holds whole parameters until forward
  std::mutex mutex;       // guards pending and callback_queued (backward runs on a device worker)
  std::vector<Pending> pending;
  bool callback_queued = false;

  DType compute_dtype(const Unit& u) const { return options.param_dtype().value_or(u.dtype); }
  DType reduce_dtype(const Unit& u) const {
    return options.reduce_dtype().value_or(compute_dtype(u));
  }
  bool IsAncestor(int maybe_ancestor, int unit) const {
    for (int u = units[unit].parent; u >= 0; u = units[u].parent) {
      if (u == maybe_ancestor) return true;
    }
    return false;
  }

  // Starts the all-gather of every rank's `shard` of `unit` (shard_numel elements, any dtype)
  // into a fresh flat buffer.
  std::pair<std::shared_ptr<Work>, Tensor> StartGatherWhole(const Unit& unit, const Tensor& shard) {
    NoGradGuard no_grad;
    Tensor full = empty({unit.shard_numel * group->size()},
                        TensorOptions().dtype(shard.dtype()).device(shard.device()));
    return {group->allgather(full, shard.detach().contiguous()), full};
  }

  // The same for unit u's parameters, in the compute dtype.
  std::pair<std::shared_ptr<Work>, Tensor> StartGather(int u) {
    NoGradGuard no_grad;
    return StartGatherWhole(units[u], units[u].shard.detach().to(compute_dtype(units[u])));
  }

  // The gathered flat buffer for `episode` (its prefetch, or a gather now).
  Tensor Gather(Episode& episode) {
    if (episode.prefetch) {
      episode.prefetch->wait();
      episode.prefetch.reset();
      return std::exchange(episode.prefetched, Tensor());
    }
    auto [work, full] = StartGather(episode.unit);
    work->wait();
    return full;
  }

  // A forward read of unit u's parameters: gathers it unless this forward already has.
  void OnRead(int u) {
    if (summoned) return;
    Unit& unit = units[u];
    if (unit.current && unit.current->forward_id == forward_id &&
        !IsStorageReleased(unit.current->full)) {
      return;
    }
    const bool backward_follows = GradMode::IsEnabled();
    const bool recording = backward_follows && unit.requires_grad;
    auto episode = std::make_shared<Episode>();
    episode->unit = u;
    episode->recorded = recording;
    episode->forward_id = forward_id;
    episode->previous = last_gathered;
    {
      NoGradGuard no_grad;
      auto ahead = std::find_if(forward_prefetches.begin(), forward_prefetches.end(),
                                [u](const Prefetch& p) { return p.unit == u; });
      if (ahead != forward_prefetches.end()) {
        episode->prefetch = std::move(ahead->work);
        episode->prefetched = std::move(ahead->full);
        forward_prefetches.erase(ahead);
      }
      episode->full = Gather(*episode);
      PrefetchNextInForward(u);
    }
    std::vector<Tensor> views;
    views.reserve(unit.entries.size());
    for (const FlatEntry& e : unit.entries) {
      views.push_back(MakeView(episode->full, e));
    }
    if (recording) {
      std::vector<Device> devices(views.size(), episode->full.device());
      RecordMultiOutputOp(std::make_shared<UnitBackward>(shared_from_this(), episode, devices), {},
                          views);
    }
    for (size_t i = 0; i < views.size(); ++i) {
      for (const nn::Parameter& handle : unit.entries[i].handles) handle.rebind(views[i]);
    }
    // The units that this one is not nested in are done with their forward: free them (the
    // root stays, as PyTorch keeps it, for the start of backward).
    for (size_t w = 1; w < units.size(); ++w) {
      Unit& other = units[w];
      // (Units gathered by an earlier forward wait for that forward's backward.)
      if (static_cast<int>(w) == u || !other.current || other.current->forward_id != forward_id ||
          IsAncestor(static_cast<int>(w), u)) {
        continue;
      }
      if (!backward_follows || (options.sharding_strategy() == ShardingStrategy::kFullShard &&
                                other.current->recorded)) {
        ReleaseStorage(other.current->full);
      }
    }
    unit.current = episode;
    last_gathered = episode;
  }

  // After this forward's gather of unit u: records it (the first forward), or starts the
  // all-gather of the unit the recorded order gathers next, before u computes. Every rank
  // records the same order (the forward is collective), so they issue the same all-gathers.
  void PrefetchNextInForward(int u) {
    if (!options.forward_prefetch()) return;
    const size_t k = forward_gathers++;
    if (!forward_order_recorded) {
      forward_order.push_back(u);
      return;
    }
    if (k + 1 >= forward_order.size()) return;
    const int next = forward_order[k + 1];
    for (const Prefetch& p : forward_prefetches) {
      if (p.unit == next) return;
    }
    Prefetch p;
    p.unit = next;
    std::tie(p.work, p.full) = StartGather(next);
    forward_prefetches.push_back(std::move(p));
  }

  // The start and end of a forward through the wrapper: all-gathers started ahead and not used
  // (a forward that took another path, or threw) are waited for and dropped; the parameters
  // may change before the next forward. A forward that completes fixes the order.
  void BeginForward() {
    DropForwardPrefetches();
    forward_gathers = 0;
    if (!forward_order_recorded) forward_order.clear();
  }
  void EndForward() {
    DropForwardPrefetches();
    forward_order_recorded = true;
  }
  void DropForwardPrefetches() {
    std::vector<Prefetch> stale;
    stale.swap(forward_prefetches);
    for (Prefetch& p : stale) p.work->wait();
  }

  // Every rank's `shard` of `unit` in one flat tensor.
  Tensor GatherWhole(const Unit& unit, const Tensor& shard) {
    auto [work, full] = StartGatherWhole(unit, shard);
    work->wait();
    return full;
  }

  // `values` (one per entry, of its shape; undefined: zeros) in one padded flat tensor.
  static Tensor Flatten(const Unit& unit, int world, const std::vector<Tensor>& values, DType dtype,
                        Device device) {
    NoGradGuard no_grad;
    Tensor full = zeros({unit.shard_numel * world}, TensorOptions().dtype(dtype).device(device));
    for (size_t i = 0; i < values.size(); ++i) {
      if (!values[i].defined()) continue;
      const FlatEntry& e = unit.entries[i];
      full.narrow(0, e.offset, e.numel).copy_(values[i].reshape({e.numel}));
    }
    return full;
  }

  // This rank's shard of `values` flattened.
  Tensor ShardOf(const Unit& unit, const std::vector<Tensor>& values) const {
    const Tensor full =
        Flatten(unit, group->size(), values, values.at(0).dtype(), unit.shard.device());
    return full.narrow(0, unit.shard_numel * group->rank(), unit.shard_numel).clone();
  }

  // The units with parameters, in the order of the wrapper's parameters().
  std::vector<int> ShardedUnits() const {
    std::vector<int> out;
    for (size_t u = 0; u < units.size(); ++u) {
      if (!units[u].entries.empty()) out.push_back(static_cast<int>(u));
    }
    return out;
  }

  static Tensor MakeView(const Tensor& full, const FlatEntry& e) {
    return full.narrow(0, e.offset, e.numel).view(e.shape);
  }

  // Frees every unit's gathered parameters.
  void ReleaseAll() {
    for (Unit& unit : units) {
      if (unit.current) ReleaseStorage(unit.current->full);
    }
  }

  // Makes sure `episode`'s memory is there (its backward comes next).
  void Restore(Episode& episode) {
    if (!IsStorageReleased(episode.full)) return;
    RestoreStorage(episode.full, Gather(episode));
  }

  // The backward of one gathered unit; runs after every node that used its views and, autograd
  // running nodes newest first, before every node recorded before the unit was gathered.
  class UnitBackward final : public Node {
   public:
    UnitBackward(std::shared_ptr<State> state, std::shared_ptr<Episode> episode,
                 std::vector<Device> devices)
        : Node(devices.at(0), devices), state_(std::move(state)), episode_(std::move(episode)) {}
    std::string name() const override { return "FullyShardedUnitBackward"; }
    std::vector<Tensor> Apply(std::vector<Tensor> grads) override {
      state_->Backward(*episode_, grads);
      return {};
    }

   private:
    std::shared_ptr<State> state_;
    std::shared_ptr<Episode> episode_;
  };

  void Backward(Episode& episode, const std::vector<Tensor>& grads) {
    NoGradGuard no_grad;
    Unit& unit = units[episode.unit];
    // The unit gathered before ours runs next: gather it now (and the ones before it up to one
    // with a backward node of its own: frozen units have none), and start the one before that.
    Episode* previous = episode.previous.get();
    for (; previous != nullptr; previous = previous->previous.get()) {
      Restore(*previous);
      if (previous->recorded) break;
    }
    if (previous != nullptr && options.backward_prefetch()) {
      Episode* before = previous->previous.get();
      if (before != nullptr && IsStorageReleased(before->full) && !before->prefetch) {
        std::tie(before->prefetch, before->prefetched) = StartGather(before->unit);
      }
    }
    Tensor flat = Flatten(unit, group->size(), grads, reduce_dtype(unit), episode.full.device());
    ReleaseStorage(episode.full);
    if (!require_sync) {
      unit.accumulated = unit.accumulated.defined() ? unit.accumulated.add_(flat) : flat;
      return;
    }
    if (unit.accumulated.defined()) {
      flat.add_(unit.accumulated);
      unit.accumulated = Tensor();
    }
    Tensor output =
        empty({unit.shard_numel}, TensorOptions().dtype(flat.dtype()).device(flat.device()));
    std::shared_ptr<Work> work = group->reduce_scatter(output, flat, ReduceOp::kAverage);
    {
      std::lock_guard<std::mutex> lock(mutex);
      pending.push_back({episode.unit, std::move(work), output, flat});
      if (!callback_queued) {
        callback_queued = true;
        QueueCallback([self = shared_from_this()] { self->Finish(); });
      }
    }
    // The reduce-scatters that have finished meanwhile free their unsharded gradients now,
    // not at the end of backward: the whole gradient is never in memory at once.
    Drain(/*wait=*/false);
  }

  // Adds the finished reduce-scatters (all of them, waiting, if `wait`) to their shards'
  // gradients, in the order they were started.
  void Drain(bool wait) {
    NoGradGuard no_grad;
    for (;;) {
      Pending p;
      {
        std::lock_guard<std::mutex> lock(mutex);
        if (pending.empty() || (!wait && !pending.front().work->is_completed())) return;
        p = std::move(pending.front());
        pending.erase(pending.begin());
      }
      p.work->wait();
      Unit& unit = units[p.unit];
      Tensor grad = p.output.to(unit.dtype);
      Tensor existing = unit.shard.grad();
      if (existing.defined()) {
        existing.add_(grad);
      } else {
        unit.shard.set_grad(grad);
      }
    }
  }

  // A backward that failed part-way never ran its end-of-pass callback: wait for the
  // reduce-scatters it left (every rank issued them) and drop them, so that the next backward
  // queues its own callback and writes its gradients.
  void AbandonFailedBackward() {
    std::vector<Pending> stale;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!callback_queued) return;
      stale.swap(pending);
      callback_queued = false;
    }
    for (Pending& p : stale) {
      try {
        p.work->wait();
      } catch (const std::exception&) {
        // The failed pass reported its error; this one is the same collective's.
      }
    }
  }

  // The end of a reduced backward: every reduce-scatter's result added to its shard's gradient.
  void Finish() {
    Drain(/*wait=*/true);
    for (Unit& unit : units) {  // frozen units stayed gathered for backward
      if (!unit.requires_grad && unit.current) ReleaseStorage(unit.current->full);
    }
    std::lock_guard<std::mutex> lock(mutex);
    callback_queued = false;
  }
};

FullyShardedDataParallel::FullyShardedDataParallel(std::shared_ptr<nn::Module> module,
                                                   std::shared_ptr<ProcessGroup> process_group,
                                                   FullyShardedDataParallelOptions options)
    : nn::Module("FullyShardedDataParallel"),
      module_(std::move(module)),
      state_(std::make_shared<State>()) {
  TANDEM_CHECK(module_ != nullptr, "FullyShardedDataParallel: the module is null");
  TANDEM_CHECK(process_group != nullptr, "FullyShardedDataParallel: the process group is null");
  State& s = *state_;
  s.group = std::move(process_group);
  s.options = std::move(options);
  ProcessGroup& group = *s.group;
  s.prefix = Prefix(group);
  const int world = group.size();
  const Device device = group.device();

  // The units: the root, then every submodule the policy picks, pre-order.
  s.units.push_back({});
  std::vector<std::pair<std::string, int>> unit_prefixes;  // "blocks.0." -> unit
  std::function<void(const nn::Module&, const std::string&, int)> find_units =
      [&](const nn::Module& m, const std::string& path, int enclosing) {
        for (const nn::NamedModule& child : m.named_children()) {
          const std::string name = path.empty() ? child.name : path + "." + child.name;
          int unit = enclosing;
          const AutoWrapPolicy& policy = s.options.auto_wrap_policy();
          if (policy && policy(name, *child.module)) {
            unit = static_cast<int>(s.units.size());
            s.units.push_back({});
            s.units.back().name = name;
            s.units.back().parent = enclosing;
            unit_prefixes.emplace_back(name + ".", unit);
          }
          find_units(*child.module, name, unit);
        }
      };
  find_units(*module_, "", 0);
  std::vector<std::string> unit_names;
  for (const State::Unit& u : s.units) unit_names.push_back(u.name.empty() ? "(root)" : u.name);
  CheckSameEverywhere(group, *module_, s.options, unit_names);

  for (const nn::NamedTensor& p : module_->named_parameters()) {
    TANDEM_CHECK(p.value.device() == device, s.prefix, "parameter ", p.name, " is on ",
                 p.value.device(), " but the process group's collectives run on ", device,
                 "; move the model there first (model->to(", device, "))");
  }
  {
    NoGradGuard no_grad;
    BroadcastCoalesced(group, module_->parameters());
    BroadcastCoalesced(group, module_->buffers());
  }

  // Each tensor goes to the innermost unit that holds every name it is registered under.
  auto unit_of_name = [&](const std::string& name) {
    int best = 0;
    size_t best_length = 0;
    for (const auto& [unit_prefix, unit] : unit_prefixes) {
      if (name.compare(0, unit_prefix.size(), unit_prefix) == 0 &&
          unit_prefix.size() > best_length) {
        best = unit;
        best_length = unit_prefix.size();
      }
    }
    return best;
  };
  auto common_unit = [&](int a, int b) {
    std::vector<int> chain;
    for (int u = a; u >= 0; u = s.units[u].parent) chain.push_back(u);
    for (int u = b; u >= 0; u = s.units[u].parent) {
      if (std::find(chain.begin(), chain.end(), u) != chain.end()) return u;
    }
    return 0;
  };
  struct Tied {
    int unit;
    FlatEntry entry;
    Tensor value;
  };
  std::vector<Tied> tensors;
  std::unordered_map<const TensorImpl*, size_t> index_of;
  for (const auto& [name, handle] : module_->named_parameter_handles()) {
    const Tensor& value = handle.peek();
    auto [it, fresh] = index_of.emplace(value.impl(), tensors.size());
    if (fresh) {
      FlatEntry entry;
      entry.name = name;
      entry.shape = value.shape();
      entry.numel = value.numel();
      tensors.push_back({unit_of_name(name), std::move(entry), value});
    } else {
      Tied& t = tensors[it->second];
      t.unit = common_unit(t.unit, unit_of_name(name));
    }
    tensors[it->second].entry.handles.push_back(handle);
  }

  // Flatten, pad and shard each unit; bind the handles to views of the (released) whole.
  for (size_t u = 0; u < s.units.size(); ++u) {
    State::Unit& unit = s.units[u];
    std::vector<Tensor> values;
    for (Tied& t : tensors) {
      if (t.unit != static_cast<int>(u)) continue;
      if (unit.entries.empty()) {
        unit.dtype = t.value.dtype();
        unit.requires_grad = t.value.requires_grad();
      }
      const std::string where = unit.name.empty() ? "the root unit" : "unit " + unit.name;
      TANDEM_CHECK(t.value.dtype() == unit.dtype, s.prefix, "the parameters of ", where,
                   " must share one dtype to be flattened, but ", unit.entries[0].name, " is ",
                   unit.dtype, " and ", t.entry.name, " is ", t.value.dtype(),
                   "; convert the model to one dtype (model->to(kFloat32)) or put them in "
                   "different units (auto_wrap_policy)");
      TANDEM_CHECK(t.value.requires_grad() == unit.requires_grad, s.prefix, "the parameters of ",
                   where, " must all require grad or none, but ", t.entry.name,
                   (t.value.requires_grad() ? " does" : " does not"), " and ", unit.entries[0].name,
                   (unit.requires_grad ? " does" : " does not"),
                   "; put frozen parameters in a unit of their own (auto_wrap_policy)");
      t.entry.offset = unit.numel;
      unit.numel += t.entry.numel;
      unit.entries.push_back(t.entry);
      values.push_back(t.value);
    }
    unit.shard_numel = (unit.numel + world - 1) / world;
    if (unit.entries.empty()) continue;  // a root without parameters of its own
    NoGradGuard no_grad;
    Tensor full = State::Flatten(unit, world, values, unit.dtype, device);
    unit.shard = full.narrow(0, unit.shard_numel * group.rank(), unit.shard_numel).clone();
    unit.shard =
        register_parameter("flat_param_" + std::to_string(u), unit.shard, unit.requires_grad)
            .peek();
    auto episode = std::make_shared<Episode>();
    episode->unit = static_cast<int>(u);
    episode->full = full;
    for (const FlatEntry& e : unit.entries) {
      for (const nn::Parameter& handle : e.handles) handle.rebind(State::MakeView(full, e));
    }
    ReleaseStorage(full);
    unit.current = episode;
  }
  // From now on a forward's reads gather.
  std::weak_ptr<State> weak = state_;
  for (size_t u = 0; u < s.units.size(); ++u) {
    for (const FlatEntry& e : s.units[u].entries) {
      for (const nn::Parameter& handle : e.handles) {
        handle.set_read_hook([weak, u] {
          if (std::shared_ptr<State> state = weak.lock()) state->OnRead(static_cast<int>(u));
        });
      }
    }
  }
  train(module_->is_training());
}

FullyShardedDataParallel::~FullyShardedDataParallel() {
  // The state holds the module's handles, whose views' autograd nodes hold the state: detach
  // the views to break that cycle (a graph still alive keeps its nodes, and they the state).
  for (const State::Unit& unit : state_->units) {
    for (const FlatEntry& e : unit.entries) {
      for (const nn::Parameter& handle : e.handles) {
        handle.set_read_hook(nullptr);
        handle.rebind(handle.peek().detach());
      }
    }
  }
}

std::vector<Tensor> FullyShardedDataParallel::forward_tensors(const std::vector<Tensor>& inputs) {
  State& s = *state_;
  s.AbandonFailedBackward();
  if (s.summoned) {
    s.ReleaseAll();
    s.summoned = false;
  }
  ++s.forward_id;
  s.last_gathered.reset();
  s.BeginForward();
  std::vector<Tensor> cast = inputs;
  if (const std::optional<DType> dtype = s.options.param_dtype()) {
    for (Tensor& t : cast) {
      if (t.defined() && IsFloatingPoint(t.dtype())) t = t.to(*dtype);
    }
  }
  if (s.options.broadcast_buffers() && is_training() && GradMode::IsEnabled()) {
    const std::vector<Tensor> buffers = module_->buffers();
    if (!buffers.empty()) {
      NoGradGuard no_grad;
      BroadcastCoalesced(*s.group, buffers);
    }
  }
  std::vector<Tensor> outputs = module_->forward_tensors(cast);
  s.EndForward();
  if (!GradMode::IsEnabled()) s.ReleaseAll();  // no backward follows
  s.last_gathered.reset();
  return outputs;
}

void FullyShardedDataParallel::train(bool on) {
  nn::Module::train(on);
  module_->train(on);
}

NoSyncGuard FullyShardedDataParallel::no_sync() { return NoSyncGuard(&state_->require_sync); }

double FullyShardedDataParallel::clip_grad_norm_(double max_norm, double norm_type) {
  const bool infinity = std::isinf(norm_type) && norm_type > 0;
  TANDEM_CHECK(infinity || (std::isfinite(norm_type) && norm_type > 0.0), state_->prefix,
               "clip_grad_norm_: norm_type must be > 0 or infinity but is ", norm_type,
               "; use 2 for the Euclidean norm");
  NoGradGuard no_grad;
  ProcessGroup& group = *state_->group;
  const Device device = group.device();
  // This rank's part, the largest magnitude or the sum of |g|^p in float64, kept on the device:
  // the only host read is the norm returned at the end (none per unit, on a GPU).
  Tensor local = zeros({1}, TensorOptions(kFloat64).device(device));
  std::vector<Tensor> shards;
  for (const State::Unit& unit : state_->units) {
    if (unit.entries.empty()) continue;
    const Tensor grad = unit.shard.grad();
    if (!grad.defined() || grad.numel() == 0) continue;
    shards.push_back(unit.shard);
    const Tensor g = abs(grad.to(kFloat64));
    const Tensor part = (infinity           ? amax(g, 0)
                         : norm_type == 2.0 ? sum(square(g))
                                            : sum(pow(g, norm_type)))
                            .reshape({1})
                            .to(device);
    local = infinity ? maximum(local, part) : local + part;
  }
  Tensor total;
  if (infinity) {
    Tensor all = zeros({group.size()}, TensorOptions(kFloat64).device(device));
    group.allgather(all, local)->wait();
    total = amax(all, 0);
  } else {
    group.allreduce(local, ReduceOp::kSum)->wait();
    total = pow(local, 1.0 / norm_type).reshape({});
  }
  nn::clip_grads_with_norm_(shards, max_norm, total);
  return total.item();
}

std::vector<nn::NamedTensor> FullyShardedDataParallel::full_state_dict(
    FullStateDictOptions options) {
  State& s = *state_;
  const bool keep = !options.rank0_only() || s.group->rank() == 0;
  auto place = [&](const Tensor& t) { return options.offload_to_cpu() ? t.to(Device::Cpu(0)) : t; };
  std::unordered_map<std::string, Tensor> by_name;
  for (int u : s.ShardedUnits()) {
    const State::Unit& unit = s.units[u];
    // Every rank takes part in each gather; one that keeps nothing frees the unit here.
    const Tensor full = s.GatherWhole(unit, unit.shard);
    if (!keep) continue;
    const Tensor kept = place(full);
    for (const FlatEntry& e : unit.entries) by_name[e.name] = State::MakeView(kept, e);
  }
  if (!keep) return {};
  // The wrapped module's order (named_parameters), then its buffers.
  std::vector<nn::NamedTensor> ordered;
  for (const nn::NamedTensor& p : module_->named_parameters()) {
    ordered.push_back({p.name, by_name.at(p.name)});
  }
  std::vector<Tensor> buffers;
  for (const nn::NamedTensor& b : module_->named_buffers()) {
    ordered.push_back({b.name, b.value.clone()});
    buffers.push_back(ordered.back().value);
  }
  NoGradGuard no_grad;
  // Rank 0's, as a checkpoint keeps them (rank 0's own need no collective).
  if (!options.rank0_only()) BroadcastCoalesced(*s.group, buffers);
  const size_t parameters = ordered.size() - buffers.size();
  for (size_t i = parameters; i < ordered.size(); ++i) ordered[i].value = place(ordered[i].value);
  return ordered;
}

void FullyShardedDataParallel::summon_full_params() {
  State& s = *state_;
  NoGradGuard no_grad;
  for (int u : s.ShardedUnits()) {
    State::Unit& unit = s.units[u];
    auto episode = std::make_shared<Episode>();
    episode->unit = u;
    episode->full = s.GatherWhole(unit, unit.shard);
    for (const FlatEntry& e : unit.entries) {
      for (const nn::Parameter& handle : e.handles) {
        handle.rebind(State::MakeView(episode->full, e));
      }
    }
    if (unit.current) ReleaseStorage(unit.current->full);
    unit.current = episode;
  }
  s.summoned = true;
}

std::unordered_map<std::string, size_t> FullyShardedDataParallel::ParameterIndices() const {
  std::unordered_map<std::string, size_t> index_of;
  for (const nn::NamedTensor& p : module_->named_parameters()) {
    index_of.emplace(p.name, index_of.size());
  }
  return index_of;
}

nn::OptimizerState FullyShardedDataParallel::full_optimizer_state(
    const nn::OptimizerState& sharded) {
  State& s = *state_;
  const std::vector<int> sharded_units = s.ShardedUnits();
  const std::unordered_map<std::string, size_t> index_of = ParameterIndices();
  nn::OptimizerState full;
  for (const auto& [name, value] : sharded) {  // sorted: every rank gathers in one order
    // (One flat shard per unit with parameters.)
    const auto [k, field] = internal::SplitOptimizerStateName(s.prefix, name, sharded_units.size());
    const State::Unit& unit = s.units[sharded_units[k]];
    const bool per_element = value.dim() == 1 && value.numel() == unit.shard_numel;
    const Tensor whole = per_element ? s.GatherWhole(unit, value) : Tensor();
    for (const FlatEntry& e : unit.entries) {
      const std::string key =
          "state." + std::to_string(index_of.at(e.name)) + "." + std::string(field);
      full[key] = per_element ? State::MakeView(whole, e).clone() : value.clone();
    }
  }
  return full;
}

nn::OptimizerState FullyShardedDataParallel::shard_optimizer_state(
    const nn::OptimizerState& full) const {
  const State& s = *state_;
  // The plain state's fields by parameter index.
  const std::unordered_map<std::string, size_t> index_of = ParameterIndices();
  std::map<size_t, std::map<std::string, Tensor>> fields;
  for (const auto& [name, value] : full) {
    const auto [index, field] = internal::SplitOptimizerStateName(s.prefix, name, index_of.size());
    fields[index][field] = value;
  }
  nn::OptimizerState sharded;
  const std::vector<int> sharded_units = s.ShardedUnits();
  for (size_t k = 0; k < sharded_units.size(); ++k) {
    const State::Unit& unit = s.units[sharded_units[k]];
    const auto first = fields.find(index_of.at(unit.entries[0].name));
    if (first == fields.end()) continue;  // no state yet (a step never taken)
    for (const auto& [field, sample] : first->second) {
      std::vector<Tensor> values;
      bool per_element = IsFloatingPoint(sample.dtype());
      for (const FlatEntry& e : unit.entries) {
        const auto it = fields.find(index_of.at(e.name));
        TANDEM_CHECK(it != fields.end() && it->second.count(field), s.prefix,
                     "the optimizer state has '", field, "' for ", unit.entries[0].name,
                     " but not for ", e.name,
                     ", flattened with it; pass a whole optimizer's "
                     "state_dict() over module()->parameters()");
        const Tensor& v = it->second.at(field);
        per_element = per_element && v.shape() == e.shape;
        values.push_back(v);
      }
      const std::string key = "state." + std::to_string(k) + "." + field;
      sharded[key] = per_element ? s.ShardOf(unit, values) : sample.clone();
    }
  }
  return sharded;
}

void FullyShardedDataParallel::load_full_state_dict(const std::vector<nn::NamedTensor>& state) {
  State& s = *state_;
  NoGradGuard no_grad;
  std::unordered_map<std::string, const Tensor*> by_name;
  for (const nn::NamedTensor& t : state) {
    TANDEM_CHECK(by_name.emplace(t.name, &t.value).second, s.prefix,
                 "load_full_state_dict: the state holds '", t.name, "' twice");
  }
  // Check everything before changing anything.
  for (const State::Unit& unit : s.units) {
    for (const FlatEntry& e : unit.entries) {
      auto it = by_name.find(e.name);
      TANDEM_CHECK(it != by_name.end(), s.prefix, "load_full_state_dict: the state has no '",
                   e.name,
                   "'; give it a full state dict of this model (full_state_dict(), or "
                   "the unwrapped module's state_dict())");
      TANDEM_CHECK(it->second->shape() == e.shape, s.prefix, "load_full_state_dict: '", e.name,
                   "' is ", ShapeToString(it->second->shape()), " in the state but ",
                   ShapeToString(e.shape), " in the model");
    }
  }
  std::vector<nn::NamedTensor> buffers;
  for (const nn::NamedTensor& b : module_->named_buffers()) {
    auto it = by_name.find(b.name);
    TANDEM_CHECK(it != by_name.end(), s.prefix, "load_full_state_dict: the state has no buffer '",
                 b.name, "'");
    buffers.push_back({b.name, *it->second});
  }
  for (int u : s.ShardedUnits()) {
    State::Unit& unit = s.units[u];
    std::vector<Tensor> values;
    for (const FlatEntry& e : unit.entries) values.push_back(by_name.at(e.name)->to(unit.dtype));
    unit.shard.detach().copy_(s.ShardOf(unit, values));
  }
  module_->load_state_dict(buffers, /*strict=*/false);
}

const std::shared_ptr<ProcessGroup>& FullyShardedDataParallel::process_group() const {
  return state_->group;
}

const FullyShardedDataParallelOptions& FullyShardedDataParallel::options() const {
  return state_->options;
}

std::vector<FsdpUnitInfo> FullyShardedDataParallel::units() const {
  std::vector<FsdpUnitInfo> out;
  for (const State::Unit& unit : state_->units) {
    FsdpUnitInfo info;
    info.name = unit.name;
    for (const FlatEntry& e : unit.entries) {
      info.parameter_names.push_back(e.name);
      info.parameter_shapes.push_back(e.shape);
    }
    info.numel = unit.numel;
    info.shard_numel = unit.shard_numel;
    info.gathered = unit.current && !IsStorageReleased(unit.current->full);
    out.push_back(std::move(info));
  }
  return out;
}

}  // namespace tandem::parallel::distributed
