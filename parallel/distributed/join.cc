#include "parallel/distributed/join.h"

#include <utility>
#include <vector>

#include "tensor/base/error.h"

namespace tandem::parallel::distributed {

Join::Join(DistributedDataParallel& ddp, std::function<void()> after_shadow_step)
    : ddp_(ddp), after_shadow_step_(std::move(after_shadow_step)) {
  TANDEM_CHECK(!ddp_.join_mode_, "Join: this DistributedDataParallel is already under a Join");
  ddp_.join_mode_ = true;
}

Join::~Join() { ddp_.join_mode_ = false; }

int Join::Finish() {
  TANDEM_CHECK(!finished_, "Join::Finish was called twice; call it once, after the loop");
  finished_ = true;
  ProcessGroup& group = *ddp_.process_group();
  int shadowed = 0;
  for (;;) {
    // What the ranks still training run this iteration (their forward adds theirs).
    Tensor flags = zeros({3}, TensorOptions(kInt64).device(group.device()));
    group.allreduce(flags, ReduceOp::kSum)->wait();
    const std::vector<int64_t> f = flags.to(Device::Cpu(0)).to_vector<int64_t>();
    if (f[0] == 0) break;  // every rank has finished
    ddp_.ShadowIteration(/*reduces=*/f[1] > 0, /*broadcasts_buffers=*/f[2] > 0);
    if (f[1] > 0 && after_shadow_step_) after_shadow_step_();
    ++shadowed;
  }
  ddp_.join_mode_ = false;
  return shadowed;
}

}  // namespace tandem::parallel::distributed
