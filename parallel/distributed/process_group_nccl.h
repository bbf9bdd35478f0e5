// ProcessGroupNccl: a ProcessGroup over NCCL for CUDA tensors, one GPU per process (CUDA
// builds only: target //parallel/distributed:process_group_nccl). The NCCL communicator is
// created from a unique id that rank 0 makes and sends to the others over a bootstrap group
// (ProcessGroupMpi under mpirun; none for a single process).
//
//   auto mpi = std::make_shared<parallel::distributed::ProcessGroupMpi>();
//   Device gpu = Device::Cuda(parallel::distributed::LocalRank());
//   auto nccl = std::make_shared<parallel::distributed::ProcessGroupNccl>(gpu, mpi);
//   nccl->allreduce(grad_on_gpu, parallel::distributed::ReduceOp::kAverage)->wait();
//
// Each collective runs on the device's communication side stream, after the work already
// queued on the calling thread's current stream (an event), and work queued there later waits
// for it (another event), as in PyTorch: the returned Work is already complete for the host,
// and GPU work that reads the tensor is ordered after the collective. Reading the tensor on
// the host (to_vector, item) waits for the device. NCCL has no timeout here: a peer that
// never joins makes the GPU wait. NCCL refuses two ranks on one GPU ("Duplicate GPU").
#ifndef TANDEM_PARALLEL_DISTRIBUTED_PROCESS_GROUP_NCCL_H_
#define TANDEM_PARALLEL_DISTRIBUTED_PROCESS_GROUP_NCCL_H_

#include <memory>
#include <string>

#include "parallel/distributed/process_group.h"
#include "tensor/base/device.h"

namespace tandem::parallel::distributed {

class ProcessGroupNccl final : public ProcessGroup {
 public:
  // Collective over `bootstrap`'s ranks (this rank and size are bootstrap's): creates the
  // NCCL communicator for `device` (a CUDA device). A null bootstrap means one process (rank
  // 0 of 1). Throws without a usable GPU, naming why.
  explicit ProcessGroupNccl(Device device, std::shared_ptr<ProcessGroup> bootstrap = nullptr);
  ~ProcessGroupNccl() override;

  std::string backend() const override { return "nccl"; }
  Device device() const override { return device_; }

  std::shared_ptr<Work> allreduce(Tensor tensor, ReduceOp op = ReduceOp::kSum) override;
  std::shared_ptr<Work> broadcast(Tensor tensor, int root = 0) override;
  std::shared_ptr<Work> allgather(Tensor output, Tensor input) override;
  // Also waits on the host until the barrier's all-reduce has finished on the GPU.
  std::shared_ptr<Work> barrier() override;

 private:
  struct Impl;
  ProcessGroupNccl(Device device, std::unique_ptr<Impl> impl);
  Device device_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::parallel::distributed

#endif  // TANDEM_PARALLEL_DISTRIBUTED_PROCESS_GROUP_NCCL_H_
