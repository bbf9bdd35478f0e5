#include "parallel/distributed/broadcast_coalesced.h"

#include "tensor/base/error.h"

namespace tandem::parallel::distributed {

void BroadcastCoalesced(ProcessGroup& group, const std::vector<Tensor>& tensors, int root) {
  TANDEM_CHECK(root >= 0 && root < group.size(), "BroadcastCoalesced: root ", root,
               " is not a rank of this group of ", group.size(), "; pass 0 .. ", group.size() - 1);
  NoGradGuard no_grad;
  for (int code = 0; code < kNumDTypes; ++code) {
    const DType dtype = static_cast<DType>(code);
    std::vector<Tensor> mine;
    int64_t total = 0;
    for (const Tensor& t : tensors) {
      if (t.dtype() != dtype) continue;
      mine.push_back(t);
      total += t.numel();
    }
    if (total == 0) continue;  // the same on every rank: their shapes agree
    Tensor flat = empty({total}, TensorOptions(dtype).device(mine[0].device()));
    int64_t offset = 0;
    if (group.rank() == root) {
      for (const Tensor& t : mine) {
        flat.narrow(0, offset, t.numel()).view(t.shape()).copy_(t);
        offset += t.numel();
      }
    }
    group.broadcast(flat, root)->wait();
    if (group.rank() == root) continue;
    offset = 0;
    for (Tensor t : mine) {
      t.copy_(flat.narrow(0, offset, t.numel()).view(t.shape()));
      offset += t.numel();
    }
  }
}

}  // namespace tandem::parallel::distributed
