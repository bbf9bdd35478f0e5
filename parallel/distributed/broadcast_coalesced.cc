#include "parallel/distributed/broadcast_coalesced.h"

#include "tensor/base/error.h"

namespace tandem::parallel::distributed {

void BroadcastCoalesced(ProcessGroup& group, const std::vector<Tensor>& tensors, int root) {
  StartBroadcastCoalesced(group, tensors, root).Wait();
}

PendingBroadcast StartBroadcastCoalesced(ProcessGroup& group, const std::vector<Tensor>& tensors,
                                         int root) {
  TANDEM_CHECK(root >= 0 && root < group.size(), "BroadcastCoalesced: root ", root,
               " is not a rank of this group of ", group.size(), "; pass 0 .. ", group.size() - 1);
  NoGradGuard no_grad;
  PendingBroadcast pending;
  pending.receiver_ = group.rank() != root;
  for (int code = 0; code < kNumDTypes; ++code) {
    const DType dtype = static_cast<DType>(code);
    PendingBroadcast::Flat f;
    int64_t total = 0;
    for (const Tensor& t : tensors) {
      if (t.dtype() != dtype) continue;
      f.tensors.push_back(t);
      total += t.numel();
    }
    if (total == 0) continue;  // the same on every rank: their shapes agree
    f.flat = empty({total}, TensorOptions(dtype).device(f.tensors[0].device()));
    if (!pending.receiver_) {
      int64_t offset = 0;
      for (const Tensor& t : f.tensors) {
        f.flat.narrow(0, offset, t.numel()).view(t.shape()).copy_(t);
        offset += t.numel();
      }
    }
    f.work = group.broadcast(f.flat, root);
    pending.flats_.push_back(std::move(f));
  }
  return pending;
}

void PendingBroadcast::Wait() {
  NoGradGuard no_grad;
  for (Flat& f : flats_) {
    f.work->wait();
    if (!receiver_) continue;
    int64_t offset = 0;
    for (Tensor t : f.tensors) {
      t.copy_(f.flat.narrow(0, offset, t.numel()).view(t.shape()));
      offset += t.numel();
    }
  }
  flats_.clear();
}

}  // namespace tandem::parallel::distributed
