// Join: training with DistributedDataParallel when the ranks have different numbers of
// batches (uneven inputs), as PyTorch's torch.distributed.algorithms.Join. Without it, a rank
// that runs out first leaves the others waiting in their next collective until it times out.
// Under a Join each training forward first tells the others (one small all-reduce) that this
// rank still trains; a rank that has finished calls Finish(), which shadows the others'
// iterations (their buffer broadcasts and gradient all-reduces, with zeros from it) until every
// rank has finished. The averaged gradients stay the sum over the ranks that trained divided by
// the world size (PyTorch's default). A rank that shadows also writes them into .grad and runs
// `after_shadow_step`: give it the optimizer's step, and every rank keeps the same parameters
// and optimizer state.
//
//   DistributedDataParallel ddp(model, group);
//   nn::SGD optimizer(model->parameters(), nn::SGDOptions(0.1).momentum(0.9));
//   Join join(ddp, [&] { optimizer.step(); optimizer.zero_grad(); });
//   for (const Batch& b : my_batches) {      // 3 on rank 0, 4 on rank 1
//     optimizer.zero_grad();
//     cross_entropy(ddp.forward(b.x), b.y).backward();
//     optimizer.step();
//   }
//   join.Finish();                          // rank 0 shadows rank 1's 4th step
//
// With ZeroRedundancyOptimizer as the optimizer, pass its step as `after_shadow_step`: the
// shadowing rank's step then sends the shares it owns and receives the others', as the ranks
// still training expect. FullyShardedDataParallel cannot be joined (nor can PyTorch's): its
// forward gathers parameters that a finished rank would have to keep serving; give its ranks
// equal shares (DistributedSampler pads them).
//
// Every rank must call Finish() once its loop is done (a rank that throws out of the loop
// leaves the others to fail at their collective timeout, as without Join). Evaluation forwards
// (eval mode or grad mode off) take no part.
#ifndef TANDEM_PARALLEL_DISTRIBUTED_JOIN_H_
#define TANDEM_PARALLEL_DISTRIBUTED_JOIN_H_

#include <functional>

#include "parallel/distributed/distributed_data_parallel.h"

namespace tandem::parallel::distributed {

class Join {
 public:
  explicit Join(DistributedDataParallel& ddp, std::function<void()> after_shadow_step = nullptr);
  ~Join();
  Join(const Join&) = delete;
  Join& operator=(const Join&) = delete;

  // Collective: shadows the other ranks' iterations until every rank has called it. Returns how
  // many this rank shadowed.
  int Finish();

 private:
  DistributedDataParallel& ddp_;
  std::function<void()> after_shadow_step_;
  bool finished_ = false;
};

}  // namespace tandem::parallel::distributed

#endif  // TANDEM_PARALLEL_DISTRIBUTED_JOIN_H_
