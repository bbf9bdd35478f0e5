// ProcessGroupNccl: a ProcessGroup over NCCL for CUDA tensors, one GPU per process (CUDA
// builds only: target //parallel/distributed:process_group_nccl). The NCCL communicator is
// created from a unique id that rank 0 makes and sends to the others over a bootstrap group
// (ProcessGroupMpi under mpirun; none for a single process).
//
//   auto mpi = std::make_shared<parallel::distributed::ProcessGroupMpi>();
//   Device gpu = Device::Cuda(parallel::distributed::LocalRank());
//   auto nccl = std::make_shared<parallel::distributed::ProcessGroupNccl>(
//       gpu, mpi,
//       parallel::distributed::ProcessGroupNcclOptions().timeout(std::chrono::minutes(5)));
//   nccl->allreduce(grad_on_gpu, parallel::distributed::ReduceOp::kAverage)->wait();
//
// Each collective runs on the device's communication side stream, after the work already
// queued on the calling thread's current stream (an event), and work queued there later waits
// for it (another event), as in PyTorch: issuing returns at once, and GPU work that reads the
// tensor is ordered after the collective. wait() blocks the host until the collective has
// finished on the GPU, or throws. A watchdog thread, as PyTorch's, polls each collective's
// event: one that has not finished `timeout` after it was issued (a peer that never joins, a
// stopped or dead rank) aborts the communicator (ncclCommAbort) and fails with a tandem::Error
// naming the collective, the timeout and, over a ProcessGroupMpi bootstrap, the ranks that did
// not answer (internal/hang_diagnosis.h); the group then refuses further collectives. NCCL
// refuses two ranks on one GPU ("Duplicate GPU").
#ifndef TANDEM_PARALLEL_DISTRIBUTED_PROCESS_GROUP_NCCL_H_
#define TANDEM_PARALLEL_DISTRIBUTED_PROCESS_GROUP_NCCL_H_

#include <chrono>
#include <memory>
#include <string>

#include "parallel/distributed/process_group.h"
#include "tensor/base/arg.h"
#include "tensor/base/device.h"

namespace tandem::parallel::distributed {

struct ProcessGroupNcclOptions {
  // How long a collective may take on the GPU, from when it was issued, before the watchdog
  // aborts the communicator and fails it (ProcessGroupMpi's default, and PyTorch's).
  TANDEM_ARG(std::chrono::milliseconds, timeout) = std::chrono::minutes(30);
  // What raises the timeout, for the timeout's error message (a flag's name, for one).
  TANDEM_ARG(std::string, timeout_name) = "ProcessGroupNcclOptions::timeout";
};

class ProcessGroupNccl final : public ProcessGroup {
 public:
  // Collective over `bootstrap`'s ranks (this rank and size are bootstrap's): creates the
  // NCCL communicator for `device` (a CUDA device). A null bootstrap means one process (rank
  // 0 of 1). Throws without a usable GPU, naming why. Over a ProcessGroupMpi bootstrap it also
  // sets up the hang diagnosis (collective over MPI_COMM_WORLD).
  explicit ProcessGroupNccl(Device device, std::shared_ptr<ProcessGroup> bootstrap = nullptr,
                            ProcessGroupNcclOptions options = {});
  // Waits for the collectives already issued (each at most until its timeout), stops the
  // watchdog and destroys the communicator (unless it was aborted).
  ~ProcessGroupNccl() override;

  std::string backend() const override { return "nccl"; }
  Device device() const override { return device_; }
  const ProcessGroupNcclOptions& options() const { return options_; }

  std::shared_ptr<Work> allreduce(Tensor tensor, ReduceOp op = ReduceOp::kSum) override;
  std::shared_ptr<Work> broadcast(Tensor tensor, int root = 0) override;
  std::shared_ptr<Work> allgather(Tensor output, Tensor input) override;
  // Every dtype but bool, as allreduce (NCCL's average: each value times 1 / size, then summed).
  std::shared_ptr<Work> reduce_scatter(Tensor output, Tensor input,
                                       ReduceOp op = ReduceOp::kSum) override;
  // An all-reduce of one element; its wait() returns once every rank has reached it.
  std::shared_ptr<Work> barrier() override;

 private:
  struct Impl;
  ProcessGroupNccl(Device device, ProcessGroupNcclOptions options, std::unique_ptr<Impl> impl);
  Device device_;
  ProcessGroupNcclOptions options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::parallel::distributed

#endif  // TANDEM_PARALLEL_DISTRIBUTED_PROCESS_GROUP_NCCL_H_
