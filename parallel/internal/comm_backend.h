// Internal to //parallel: the backend behind comm (parallel/comm.h), an optional
// implementation of broadcast and reduce between devices that copies cannot match (NCCL
// between distinct physical GPUs). comm.cc asks the registered backend first and falls back
// to device copies when there is none or it declines. The NCCL backend
// (parallel/internal/nccl_comm_backend.cc) registers itself in CUDA builds, so comm.cc itself
// never includes a CUDA header.
//
// One word per layer, as PyTorch: comm is the collectives among one process's devices
// (torch.cuda.comm), a comm backend implements some of them (NCCL, as torch.distributed's
// backends), and a process group (parallel/distributed/process_group.h) runs collectives
// among processes.
//
//   struct Registration {
//     Registration() { RegisterCommBackend(new NcclCommBackend); }   // lives for the process
//   } registration;
#ifndef TANDEM_PARALLEL_INTERNAL_COMM_BACKEND_H_
#define TANDEM_PARALLEL_INTERNAL_COMM_BACKEND_H_

#include <vector>

#include "tensor/tensor.h"

namespace tandem::parallel::internal {

class CommBackend {
 public:
  virtual ~CommBackend() = default;
  // Whether this backend serves exactly this set of devices (in this order) for tensors of
  // `dtype`; comm falls back to device copies where it does not.
  virtual bool Supports(const std::vector<Device>& devices, DType dtype) const = 0;
  // buffers[i] (contiguous, same numel and dtype, on devices[i]) all receive buffers[root].
  virtual void Broadcast(const std::vector<Tensor>& buffers, int root) = 0;
  // output (on devices[root]) = the sum of inputs[i] (each on devices[i]).
  virtual void Reduce(const std::vector<Tensor>& inputs, const Tensor& output, int root) = 0;
};

// The registered backend, or nullptr.
CommBackend* GetCommBackend();
// Registers `backend` (owned by the caller, alive for the process); the last one wins.
void RegisterCommBackend(CommBackend* backend);

}  // namespace tandem::parallel::internal

#endif  // TANDEM_PARALLEL_INTERNAL_COMM_BACKEND_H_
