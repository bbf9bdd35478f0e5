// The names of an optimizer's state entries, "state.<parameter index>.<field>" (what
// nn::Optimizer::state_dict gives), split apart: the sharded optimizers and checkpoints of
// parallel/distributed/ renumber and reshard them.
//
//   auto [index, field] = SplitOptimizerStateName("ZeroRedundancyOptimizer: ",
//                                                 "state.3.exp_avg", parameters.size());
//   // index 3, field "exp_avg"
#ifndef TANDEM_PARALLEL_DISTRIBUTED_INTERNAL_OPTIMIZER_STATE_NAME_H_
#define TANDEM_PARALLEL_DISTRIBUTED_INTERNAL_OPTIMIZER_STATE_NAME_H_

#include <cstddef>
#include <string>
#include <utility>

namespace tandem::parallel::distributed::internal {

// {index, field}; throws, beginning with `owner`, when `name` is not of that form or its index
// is not below `parameters`.
std::pair<size_t, std::string> SplitOptimizerStateName(const std::string& owner,
                                                       const std::string& name, size_t parameters);

}  // namespace tandem::parallel::distributed::internal

#endif  // TANDEM_PARALLEL_DISTRIBUTED_INTERNAL_OPTIMIZER_STATE_NAME_H_
