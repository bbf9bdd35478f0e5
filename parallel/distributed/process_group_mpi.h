// ProcessGroupMpi: a ProcessGroup over Open MPI for CPU tensors. Start the program with mpirun;
// each process is one rank of MPI_COMM_WORLD. Broadcast and all-gather move every dtype;
// all-reduce takes float32, float64, int64, and bfloat16 and float16, which it sums in float32
// (each rank adds one block of the buffer in float32 and rounds once; see below).
//
//   auto group = std::make_shared<parallel::distributed::ProcessGroupMpi>();  // collective
//   Tensor grad = ...;                                        // contiguous, on the CPU
//   std::shared_ptr<parallel::distributed::Work> work =
//       group->allreduce(grad, parallel::distributed::ReduceOp::kAverage);
//   ...                                                       // overlap other work
//   work->wait();
//
//   $ mpirun -np 2 ./my_program                  # two ranks on this machine
//   $ mpirun -H host1,host2 -np 2 ./my_program   # one rank on each of two machines
//
// MPI is initialised on first use (MPI_Init_thread asking for MPI_THREAD_MULTIPLE; a library
// that provides less than MPI_THREAD_SERIALIZED is refused, and with SERIALIZED every MPI call
// is made under one process-wide lock) and finalised at exit; a program that initialised MPI
// itself keeps that. Each group works on its own duplicate of MPI_COMM_WORLD and runs its
// collectives one at a time in the order they were issued: on its own thread, or on the
// thread that waits for one that has not started yet when nothing else is running (the usual
// issue-then-wait then costs no thread hand-off; while callers do that, the group's thread is
// not woken for each collective but starts any that nobody waits for within 0.5-1 ms). The
// group's thread polls every 50 us (spinning only while a caller waits for it), so that it
// keeps collectives moving beside a compute thread without taking half its core. Collectives
// are MPI's non-blocking calls, polled, so that one that a peer never joins fails after
// `timeout` instead of hanging; its error says (internal/hang_diagnosis.h, which
// ProcessGroupNccl's watchdog shares) which ranks did not answer (a stopped, hung
// or dead rank) and which wait in another collective (every rank that waits in a collective
// answers such a question within milliseconds). An all-reduce's messages carry its size,
// dtype and op, so that ranks that disagree on them fail at once, naming both sides. The all-reduce
// is its own recursive doubling (below 128 KB, its exchanges cut into messages that fit the
// shared-memory transport's eager limit, all in flight at once) or ring over non-blocking
// point-to-point messages, the algorithms of Open MPI's tuned blocking MPI_Allreduce, since Open
// MPI's MPI_Iallreduce (libnbc) is several times slower on one machine; every rank gets
// bit-identical sums. bfloat16 and float16 go as 2-byte elements (half of float32's bytes) in
// a reduce-scatter by all-to-all, where each rank adds its block's contributions in float32
// and rounds once, then an all-gather: a ring would round each partial sum at every hop.
// reduce_scatter (the all-reduce's dtypes) is that reduce-scatter alone: each rank adds its
// chunk's contributions in rank order (16-bit types in float32, rounded once). allgather (every
// dtype) is the all-gather alone, straight into the output. Both go in 4 MB windows, the next in
// flight, and tag their messages as the all-reduce does, with the collective's kind, so that
// ranks that disagree on the size, dtype or op, or run another of the three, fail at once naming
// both sides (MPI_Iallgather aborted the job on such a mismatch). Against the bare blocking
// MPI_Reduce_scatter_block and MPI_Allgather: distributed_benchmark's section 1c. After
// a timeout the group is unusable: later collectives fail at once, naming the first error. Tensors
// larger than MPI's int counts are sent in pieces of at most max_elements_per_call. MPI's errors
// (MPI_ERRORS_RETURN) become tandem::Error naming the rank, the collective and MPI's message.
#ifndef TANDEM_PARALLEL_DISTRIBUTED_PROCESS_GROUP_MPI_H_
#define TANDEM_PARALLEL_DISTRIBUTED_PROCESS_GROUP_MPI_H_

#include <chrono>
#include <climits>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "parallel/distributed/process_group.h"
#include "tensor/base/arg.h"

namespace tandem::parallel::distributed {

struct ProcessGroupMpiOptions {
  // How long one collective may run once started before it fails (PyTorch's default: 30 min).
  TANDEM_ARG(std::chrono::milliseconds, timeout) = std::chrono::minutes(30);
  // What raises the timeout, for the timeout's error message: a program that reads it from a
  // flag names the flag ("--collective_timeout").
  TANDEM_ARG(std::string, timeout_name) = "ProcessGroupMpiOptions::timeout";
  // The most elements one MPI call moves (MPI counts are ints); lower it to test chunking.
  TANDEM_ARG(int64_t, max_elements_per_call) = INT_MAX;
};

class ProcessGroupMpi final : public ProcessGroup {
 public:
  // Collective over MPI_COMM_WORLD: every rank constructs its groups in the same order.
  // Throws when MPI cannot be initialised or lacks thread support.
  explicit ProcessGroupMpi(ProcessGroupMpiOptions options = {});
  // Stops the group's thread (after the collectives already issued, or at once after a
  // failure).
  ~ProcessGroupMpi() override;

  std::string backend() const override { return "mpi"; }
  const ProcessGroupMpiOptions& options() const { return options_; }

  std::shared_ptr<Work> allreduce(Tensor tensor, ReduceOp op = ReduceOp::kSum) override;
  std::shared_ptr<Work> broadcast(Tensor tensor, int root = 0) override;
  std::shared_ptr<Work> allgather(Tensor output, Tensor input) override;
  std::shared_ptr<Work> reduce_scatter(Tensor output, Tensor input,
                                       ReduceOp op = ReduceOp::kSum) override;
  std::shared_ptr<Work> barrier() override;

 private:
  struct Impl;
  ProcessGroupMpi(ProcessGroupMpiOptions options, std::unique_ptr<Impl> impl);
  ProcessGroupMpiOptions options_;
  std::unique_ptr<Impl> impl_;
};

// The rank of this process among those of the job on the same machine (0 without mpirun):
// what picks cuda:<local rank>. Reads Open MPI's OMPI_COMM_WORLD_LOCAL_RANK.
int LocalRank();
// True when this process was started by mpirun (Open MPI's environment is present).
bool LaunchedByMpirun();

// Ends every process of the job (MPI_Abort on MPI_COMM_WORLD) with exit status `code`: what a
// rank that cannot go on should do, so that the others stop at once instead of waiting for it
// until their collectives time out (a rank that merely returns from main() would wait in
// MPI_Finalize for the others, which wait for it). Without MPI initialised: std::exit(code).
[[noreturn]] void AbortJob(int code);

}  // namespace tandem::parallel::distributed

#endif  // TANDEM_PARALLEL_DISTRIBUTED_PROCESS_GROUP_MPI_H_
