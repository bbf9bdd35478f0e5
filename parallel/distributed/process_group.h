// ProcessGroup: the processes ("ranks") of one distributed job and the collectives they run
// together on tensors, as torch.distributed's ProcessGroup. Every collective is asynchronous:
// it returns a Work handle at once and runs on the group's own thread (or on the thread that
// waits for it, if that one comes first); wait() blocks until it has finished and throws
// tandem::Error if it failed or timed out. Every rank must issue the same collectives in the same
// order.
//
// Use it through DistributedDataParallel (parallel/distributed/distributed_data_parallel.h),
// or directly for your own collectives. The concrete groups are ProcessGroupMpi (CPU tensors,
// parallel/distributed/process_group_mpi.h) and ProcessGroupNccl (CUDA tensors, bootstrapped
// over ProcessGroupMpi; its timeout is a watchdog); run the program under mpirun:
//
//   auto group = std::make_shared<parallel::distributed::ProcessGroupMpi>();
//   Tensor t = full({4}, group->rank());
//   group->allreduce(t, parallel::distributed::ReduceOp::kSum)->wait();  // 0 + 1 + ... everywhere
//   Tensor shard = zeros({2});
//   group->reduce_scatter(shard, full({2 * group->size()}, 1.0))->wait();  // size() everywhere
//
//   $ mpirun -np 2 ./my_program
#ifndef TANDEM_PARALLEL_DISTRIBUTED_PROCESS_GROUP_H_
#define TANDEM_PARALLEL_DISTRIBUTED_PROCESS_GROUP_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "tensor/tensor.h"

namespace tandem::parallel::distributed {

enum class ReduceOp {
  kSum,
  kAverage,  // the sum divided by the world size (floating-point tensors only)
};

const char* ReduceOpName(ReduceOp op);  // "sum", "average"

// The handle of one asynchronous collective. Thread-safe.
class Work {
 public:
  // `description` names the collective in errors, e.g. "allreduce of 1024 float32 (rank 0 of 2)".
  explicit Work(std::string description);
  // The same, with the description made only when first asked for (an error, a log line):
  // formatting it costs about as much as a whole small all-reduce on one machine.
  explicit Work(std::function<std::string()> describe);
  virtual ~Work() = default;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  // True once the collective has finished, successfully or not.
  bool is_completed() const;
  // Blocks until the collective has finished; throws the tandem::Error it failed with (a
  // peer's failure or a timeout included). The tensors it was given are then up to date.
  void wait();
  const std::string& description() const;

  // How long the collective ran, from when the group started it (after those issued before
  // it) to when it finished; zero until it has finished.
  std::chrono::steady_clock::duration run_time() const;

  // For process groups: marks the collective started (its turn came) and returns when, so
  // that the group can reckon its deadline from the same clock reading. Called once, by the
  // thread that runs the collective, before Finish.
  std::chrono::steady_clock::time_point Start();
  // For process groups: marks the collective finished, with the error it failed with (or
  // nullptr), and wakes the waiters. Called once, by the thread that ran it.
  void Finish(std::exception_ptr error = nullptr);

 protected:
  // Called by wait() before it blocks: a process group may run the collective on the waiting
  // thread here if no other thread has started it yet (ProcessGroupMpi does, which saves the
  // two thread hand-offs of issue-then-wait), or watch it finish there (ProcessGroupNccl polls
  // its CUDA event on the waiting thread). Returns once it has run it, or at once.
  virtual void RunIfNotStarted() {}

 private:
  mutable std::once_flag describe_once_;
  mutable std::function<std::string()> describe_;
  mutable std::string description_;
  // A small collective costs a few microseconds, so its start and finish take no lock: the
  // finishing thread writes what follows done_ before it sets done_ (release), and readers
  // read it only after they have seen done_ set (acquire). Only a thread that goes to sleep
  // on done_cv_ counts itself in sleepers_, so that Finish locks and notifies only then.
  std::mutex mutex_;  // for done_cv_ alone
  std::condition_variable done_cv_;
  std::atomic<int> sleepers_{0};
  std::atomic<bool> done_{false};
  std::chrono::steady_clock::time_point started_;
  std::chrono::steady_clock::time_point finished_;
  std::exception_ptr error_;
};

class ProcessGroup {
 public:
  ProcessGroup(int rank, int size) : rank_(rank), size_(size) {}
  virtual ~ProcessGroup() = default;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  // This process's index in the group, 0 .. size() - 1, and the number of processes.
  int rank() const { return rank_; }
  int size() const { return size_; }
  // "mpi" or "nccl".
  virtual std::string backend() const = 0;
  // Where this group's collectives take their tensors: cpu:0 for MPI, the group's GPU for
  // NCCL. Code that exchanges its own small tensors (sizes, flags, settings) makes them here.
  virtual Device device() const { return Device::Cpu(0); }

  // Every collective takes tensors by handle and keeps them alive until it has finished; do
  // not read or write them before wait() returns. They must be contiguous, and each rank
  // must pass the same shape and dtype.

  // Reduces `tensor` across ranks in place: afterwards every rank holds the sum (or average).
  virtual std::shared_ptr<Work> allreduce(Tensor tensor, ReduceOp op = ReduceOp::kSum) = 0;
  // Copies rank `root`'s `tensor` into `tensor` on every other rank.
  virtual std::shared_ptr<Work> broadcast(Tensor tensor, int root = 0) = 0;
  // torch.distributed.all_gather_into_tensor: `output` (size() * input.numel() elements, of
  // input's dtype) receives every rank's `input`, rank 0's first.
  virtual std::shared_ptr<Work> allgather(Tensor output, Tensor input) = 0;
  // torch.distributed.reduce_scatter_tensor: `input` (size() * output.numel() elements, of
  // output's dtype) is cut into size() chunks; rank r's `output` receives the sum (or average)
  // over the ranks of chunk r. Sharded data parallelism's gradient reduction: each rank ends
  // with the reduced gradients of its own shard only.
  virtual std::shared_ptr<Work> reduce_scatter(Tensor output, Tensor input,
                                               ReduceOp op = ReduceOp::kSum) = 0;
  // Finishes once every rank has called barrier().
  virtual std::shared_ptr<Work> barrier() = 0;

 private:
  const int rank_;
  const int size_;
};

}  // namespace tandem::parallel::distributed

#endif  // TANDEM_PARALLEL_DISTRIBUTED_PROCESS_GROUP_H_
