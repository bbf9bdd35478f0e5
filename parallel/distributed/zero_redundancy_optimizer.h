// ZeroRedundancyOptimizer: ZeRO stage 1 (optimizer state sharded across ranks), as PyTorch's
// torch.distributed.optim.ZeroRedundancyOptimizer. It wraps any Tandem optimizer: each rank
// owns a balanced share of the parameters, keeps optimizer state (Adam's two moments, SGD's
// momentum) for that share alone and steps only it, then every rank's updated share is
// broadcast to the others. With AdamW in float32 that is 8P/N bytes of state per rank instead
// of 8P. Use it with DistributedDataParallel, whose backward leaves every rank the same
// averaged gradients; the parameters then stay equal on every rank, to the bit, and equal to
// what the wrapped optimizer alone would make of them.
//
//   DistributedDataParallel ddp(model, group);
//   ZeroRedundancyOptimizer optimizer(model->parameters(), group,
//                                     MakeOptimizerFactory<nn::AdamW>(nn::AdamWOptions(6e-4)));
//   nn::StepLR scheduler(optimizer, 10);       // schedulers and clipping work unchanged
//   ddp.forward(x) ... backward ...; optimizer.step(); optimizer.zero_grad();
//
// Parameter groups, add_param_group and the learning-rate schedulers behave as for the wrapped
// optimizer: options live in this optimizer's groups and reach the wrapped one at every step.
// The state dict is PyTorch's: consolidate_state_dict(to) gathers every rank's share to rank
// `to` (a collective: every rank calls it), where state_dict() then returns what the wrapped
// optimizer would over all parameters, so it loads into a plain optimizer; load_state_dict()
// takes such a dict (from a plain optimizer too) on every rank and keeps each rank's share.
#ifndef TANDEM_PARALLEL_DISTRIBUTED_ZERO_REDUNDANCY_OPTIMIZER_H_
#define TANDEM_PARALLEL_DISTRIBUTED_ZERO_REDUNDANCY_OPTIMIZER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "nn/optimizer.h"
#include "parallel/distributed/process_group.h"
#include "tensor/tensor.h"

namespace tandem::parallel::distributed {

// Builds the wrapped optimizer over one rank's share, one group per group of the wrapper's
// (a group may be empty: that rank owns none of its parameters).
using OptimizerFactory =
    std::function<std::unique_ptr<nn::Optimizer>(std::vector<nn::ParamGroup> groups)>;

// The factory of an optimizer type that takes (groups, defaults), as every Tandem optimizer:
// MakeOptimizerFactory<nn::SGD>(nn::SGDOptions(0.1).momentum(0.9)).
template <typename OptimizerT, typename OptionsT>
OptimizerFactory MakeOptimizerFactory(OptionsT defaults) {
  return [defaults](std::vector<nn::ParamGroup> groups) -> std::unique_ptr<nn::Optimizer> {
    return std::make_unique<OptimizerT>(std::move(groups), defaults);
  };
}

class ZeroRedundancyOptimizer : public nn::Optimizer {
 public:
  ZeroRedundancyOptimizer(std::vector<Tensor> parameters,
                          std::shared_ptr<ProcessGroup> process_group, OptimizerFactory factory);
  ZeroRedundancyOptimizer(std::vector<nn::ParamGroup> groups,
                          std::shared_ptr<ProcessGroup> process_group, OptimizerFactory factory);

  // Steps this rank's share with the wrapped optimizer (after copying every group's options
  // to it), then broadcasts each rank's share to the others. Collective.
  void step() override;
  // Adds a group, placing each new parameter on the rank with the least numel so far.
  void add_param_group(const nn::ParamGroup& group) override;

  // Gathers every rank's optimizer state to rank `to`; collective (every rank calls it, with
  // the same `to`). Afterwards state_dict() on rank `to` returns the whole state.
  void consolidate_state_dict(int to = 0);
  // The whole state as of the last consolidate_state_dict, on the rank it was gathered to;
  // throws elsewhere, or before any consolidation.
  nn::OptimizerState state_dict() const override;
  // Loads a whole state (of this optimizer or of a plain one of the wrapped kind over the same
  // parameters, e.g. read from a checkpoint on every rank); each rank keeps its share.
  void load_state_dict(const nn::OptimizerState& state) override;

  // The rank that owns parameters()[i], and how many elements each rank owns.
  int owner(size_t i) const { return owners_.at(i); }
  const std::vector<int64_t>& numel_per_rank() const { return numel_per_rank_; }
  // The optimizer over this rank's share (its state names use its own parameter indices).
  const nn::Optimizer& local_optimizer() const { return *local_; }
  ProcessGroup& process_group() const { return *process_group_; }

 protected:
  void CheckOptions(const nn::OptimizerOptions& options) const override;
  void ResizeState(size_t /*n*/) override {}

 private:
  void Init(std::vector<nn::ParamGroup> groups, bool from_parameter_list);

  std::shared_ptr<ProcessGroup> process_group_;
  OptimizerFactory factory_;
  std::unique_ptr<nn::Optimizer> local_;
  std::vector<int> owners_;              // per parameter index
  std::vector<int64_t> local_index_;     // per parameter index: its index in local_, or -1
  std::vector<int64_t> numel_per_rank_;  // per rank
  std::optional<nn::OptimizerState> consolidated_;  // on the rank it was gathered to
};

}  // namespace tandem::parallel::distributed

#endif  // TANDEM_PARALLEL_DISTRIBUTED_ZERO_REDUNDANCY_OPTIMIZER_H_
