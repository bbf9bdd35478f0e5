// FullyShardedDataParallel: PyTorch's FSDP (FULL_SHARD and SHARD_GRAD_OP, ZeRO stage 3 and 2) in
// C++, for models that do not fit whole on every device. The model is cut into units (each
// submodule the auto-wrap policy picks, and the root: every parameter left over); each unit's
// parameters are flattened into one buffer, padded to a multiple of the world size and sharded,
// so that rank r keeps only its 1/N of every unit, and the optimizer steps only that shard. A
// unit's parameters are all-gathered when its forward reads them and freed again after it, then
// gathered once more for its backward, whose gradients are reduce-scattered: each rank ends with
// the averaged gradients of its own shard. With AdamW in float32 that is 16P/N bytes a rank plus
// the units being computed, against DistributedDataParallel's 16P; the steps equal DDP's. The
// units in memory at once: in forward the root and one unit (one more with forward_prefetch);
// in backward a unit, its unsharded gradient and the flat copy being reduce-scattered, with the
// next unit gathered ahead (backward_prefetch): up to about 3 of the largest unit (GPT-2 on 2
// ranks, tools/bench:zero_benchmark: a peak of 0.97-1.01x of 16P/N + 3 x the root).
//
//   auto group = std::make_shared<parallel::distributed::ProcessGroupMpi>();
//   auto model = std::make_shared<examples::Gpt>(config);    // built whole, then sharded
//   auto fsdp = std::make_shared<parallel::distributed::FullyShardedDataParallel>(
//       model, group, parallel::distributed::FullyShardedDataParallelOptions().auto_wrap_policy(
//                         parallel::distributed::ModuleTypeWrapPolicy<examples::GptBlock>()));
//   nn::AdamW optimizer(fsdp->parameters(), nn::AdamWOptions(6e-4));   // the flat shards
//   Tensor loss = cross_entropy(fsdp->forward(x), y);                  // this rank's batch
//   optimizer.zero_grad();
//   loss.backward();              // each rank: the average gradient of its shards
//   fsdp->clip_grad_norm_(1.0);   // the norm of the whole gradient
//   optimizer.step();
//
//   $ mpirun -np 2 ./train
//
// How it works, as PyTorch's FSDP does (and where it differs):
// - Units are found at construction: the policy is asked about every submodule; a unit holds
//   the parameters under it that no nested unit holds; a parameter registered under several
//   names (tied weights) belongs to the innermost unit that holds all of its names. A unit's
//   parameters must share one dtype and requires_grad; a frozen unit (none requires grad)
//   stays gathered from its forward to the end of backward.
// - A module reads its parameters through its handles (nn::Parameter) in forward; FSDP hooks
//   those reads (TensorHandle::set_read_hook): the first read of a unit in a forward all-gathers
//   it and binds every handle to a view of the gathered buffer. Under kFullShard the units that
//   are not enclosing the one just gathered are freed then (ReleaseStorage), except the root:
//   a transformer holds the root and one block at a time.
// - The views' gradients meet in one autograd node per gathered unit. Autograd runs nodes
//   newest first, so the node of the unit gathered after unit u runs after everything of that
//   later unit and before anything of u: it gathers u again (RestoreStorage: every tensor saved
//   for backward sees the memory), and already starts the all-gather of the unit before u
//   (backward_prefetch). Then it flattens the gradients, starts their reduce-scatter (in
//   reduce_dtype) and frees its unit. The end of backward waits for the reduce-scatters and
//   adds each into its shard's .grad.
// - forward_prefetch: the first forward through the wrapper records the order in which it
//   gathers the units; each later one, right after gathering a unit, starts the all-gather of
//   the next in that order, before the unit computes. All-gathers started ahead and not used
//   by the end of the forward are waited for and dropped.
// - no_sync() keeps the unsharded gradients (one flat buffer per unit) and reduces their sum in
//   the first backward after it: one reduce-scatter per unit per optimizer step.
// - Mixed precision (param_dtype): the shards stay in their dtype (float32 master weights),
//   each gather casts the shard first, floating inputs are cast, gradients are reduced in
//   reduce_dtype (default: param_dtype) and added to the shards' .grad in the shard dtype.
// - Buffers are not sharded: every rank keeps them whole, rank 0's copied to every rank at
//   construction and (broadcast_buffers) at each forward in training mode, as DDP does.
// - Every forward and backward is collective: every rank runs them, the same number of times.
//   A unit whose parameters get no gradient in a backward must not be followed, in forward
//   order, by units whose backward needs it gathered again; a second backward through one
//   forward (retain_graph) is not supported. Reading the wrapped module's parameters outside a
//   forward throws (their memory is released); use full_state_dict(), summon_full_params(), or
//   sharded checkpoints (parallel/distributed/sharded_checkpoint.h: no rank holds the whole).
#ifndef TANDEM_PARALLEL_DISTRIBUTED_FULLY_SHARDED_DATA_PARALLEL_H_
#define TANDEM_PARALLEL_DISTRIBUTED_FULLY_SHARDED_DATA_PARALLEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "nn/module.h"
#include "nn/optimizer.h"
#include "parallel/distributed/no_sync_guard.h"
#include "parallel/distributed/process_group.h"
#include "tensor/base/arg.h"
#include "tensor/tensor.h"

namespace tandem::parallel::distributed {

enum class ShardingStrategy {
  kFullShard,    // parameters, gradients and optimizer state sharded (ZeRO-3)
  kShardGradOp,  // parameters stay gathered from forward to the unit's backward (ZeRO-2)
};

const char* ShardingStrategyName(ShardingStrategy strategy);  // "FULL_SHARD", "SHARD_GRAD_OP"

// Picks the submodules that become units of their own, given each one's dotted name.
using AutoWrapPolicy = std::function<bool(const std::string& name, const nn::Module& module)>;

// Every submodule of one of the types M... becomes a unit (PyTorch's ModuleWrapPolicy).
template <typename... M>
AutoWrapPolicy ModuleTypeWrapPolicy() {
  return [](const std::string&, const nn::Module& module) {
    return ((dynamic_cast<const M*>(&module) != nullptr) || ...);
  };
}

struct FullyShardedDataParallelOptions {
  TANDEM_ARG(ShardingStrategy, sharding_strategy) = ShardingStrategy::kFullShard;
  // nullptr: the whole model is one unit.
  TANDEM_ARG(AutoWrapPolicy, auto_wrap_policy) = nullptr;
  // Mixed precision: gather parameters (and compute) in this dtype; nullopt: their own.
  TANDEM_ARG(std::optional<DType>, param_dtype) = std::nullopt;
  // Reduce-scatter gradients in this dtype; nullopt: param_dtype (or the parameters' dtype).
  TANDEM_ARG(std::optional<DType>, reduce_dtype) = std::nullopt;
  // Start the all-gather of the unit after next in backward while this one computes.
  TANDEM_ARG(bool, backward_prefetch) = true;
  // PyTorch's forward_prefetch: start the all-gather of the unit the forward gathers next
  // before this one computes (the order recorded by the first forward through the wrapper), so
  // that it overlaps the compute; a forward then holds one unit more. Off by default, as
  // PyTorch's: it pays where the all-gather is slow against the unit's compute.
  TANDEM_ARG(bool, forward_prefetch) = false;
  // Copy rank 0's buffers (BatchNorm's running statistics) to every rank at each forward in
  // training mode, as DistributedDataParallel's broadcast_buffers.
  TANDEM_ARG(bool, broadcast_buffers) = true;
};

// How full_state_dict gathers (PyTorch's FullStateDictConfig). The defaults give every rank the
// whole state; rank0_only with offload_to_cpu is how a job larger than one device saves: rank 0
// collects it in host memory, unit by unit, and no other rank ever holds more than one unit.
struct FullStateDictOptions {
  // Only rank 0 gets the state; every other rank takes part in the gathers, keeps nothing and
  // gets an empty one.
  TANDEM_ARG(bool, rank0_only) = false;
  // The values on cpu:0 (each unit copied there as soon as it is gathered).
  TANDEM_ARG(bool, offload_to_cpu) = false;
};

// One unit, for inspection and tests.
struct FsdpUnitInfo {
  std::string name;                          // the submodule's dotted name; "" for the root
  std::vector<std::string> parameter_names;  // the wrapped module's names, one per tensor
  std::vector<Shape> parameter_shapes;       // and their shapes (flattened in this order)
  int64_t numel = 0;                         // the unit's parameters together
  int64_t shard_numel = 0;  // each rank's shard (numel padded to a multiple of the world size)
  bool gathered = false;    // whether its whole parameters are in memory now
};

class FullyShardedDataParallel : public nn::Module {
 public:
  // Collective: every rank constructs it with the same model (checked, naming the first
  // difference) and options; rank 0's values are copied to every rank, then each rank keeps
  // its shards. The model's parameters must be on the process group's device.
  FullyShardedDataParallel(std::shared_ptr<nn::Module> module,
                           std::shared_ptr<ProcessGroup> process_group,
                           FullyShardedDataParallelOptions options = {});
  ~FullyShardedDataParallel() override;

  // The module's first output (forward_tensors for all of them). Collective.
  template <typename... Rest,
            typename = std::enable_if_t<(std::is_convertible_v<const Rest&, const Tensor&> && ...)>>
  Tensor forward(const Tensor& input, const Rest&... rest) {
    return forward_tensors({input, rest...}).at(0);
  }
  std::vector<Tensor> forward_tensors(const std::vector<Tensor>& inputs) override;
  void train(bool on = true) override;

  // While the guard lives, backward passes keep each unit's unsharded gradient (summed)
  // instead of reducing it; the first backward after it reduces the sum (no_sync_guard.h).
  [[nodiscard]] NoSyncGuard no_sync();

  // nn::clip_grad_norm_ over the sharded gradients: the norm of the whole gradient (one
  // all-reduce), every shard scaled alike. Collective; returns the norm before clipping.
  double clip_grad_norm_(double max_norm, double norm_type = 2.0);

  // Every parameter whole, by the wrapped module's names (each tensor once, as its
  // state_dict), then every buffer (rank 0's): what the module alone would hold. Collective:
  // the units are gathered one at a time, each freed before the next unless kept (see
  // FullStateDictOptions: by default every rank gets it). load_full_state_dict takes such a
  // state (or the unwrapped module's) on every rank and keeps this rank's shards.
  std::vector<nn::NamedTensor> full_state_dict(FullStateDictOptions options = {});
  void load_full_state_dict(const std::vector<nn::NamedTensor>& state);

  // PyTorch's summon_full_params, until the next forward through the wrapper: gathers every
  // unit whole (in the parameters' own dtype) and binds the wrapped module's parameters to it,
  // as plain tensors, so that the module runs forward, and its state_dict() reads, on one rank
  // alone. Collective, and every rank then holds the whole model: to evaluate or sample, run
  // forward through the wrapper on every rank instead (one unit gathered at a time); to save,
  // full_state_dict(FullStateDictOptions().rank0_only(true).offload_to_cpu(true)). The next
  // forward through the wrapper frees them and shards again.
  void summon_full_params();

  // PyTorch's FSDP.optim_state_dict: the state of an optimizer over parameters() (the flat
  // shards, "state.<k>.<field>" for the k-th unit with parameters) as a plain optimizer of the
  // same kind over the wrapped module's parameters() would hold it ("state.<i>.<field>", i
  // indexing module()->parameters()): per-element fields gathered and cut per parameter,
  // scalars (a step count) given to each of the unit's parameters. Collective.
  nn::OptimizerState full_optimizer_state(const nn::OptimizerState& sharded);
  // The inverse (optim_state_dict_to_load): this rank's shard of each field of a plain
  // optimizer's state, to load into an optimizer over parameters(). Not collective.
  nn::OptimizerState shard_optimizer_state(const nn::OptimizerState& full) const;

  const std::shared_ptr<nn::Module>& module() const { return module_; }
  const std::shared_ptr<ProcessGroup>& process_group() const;
  const FullyShardedDataParallelOptions& options() const;
  std::vector<FsdpUnitInfo> units() const;

 private:
  struct State;
  // The wrapped module's parameter names -> their indices in module()->parameters().
  std::unordered_map<std::string, size_t> ParameterIndices() const;
  std::shared_ptr<nn::Module> module_;
  std::shared_ptr<State> state_;  // the hooks and nodes hold it weakly or share it
};

}  // namespace tandem::parallel::distributed

#endif  // TANDEM_PARALLEL_DISTRIBUTED_FULLY_SHARDED_DATA_PARALLEL_H_
