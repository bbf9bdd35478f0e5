// The MPI plumbing that every MPI user in parallel/distributed shares: MPI initialised once per
// process with thread support, the process-wide lock that serialises MPI calls when the library
// gives only MPI_THREAD_SERIALIZED, and MPI's error codes as text. Internal: ProcessGroupMpi and
// the hang diagnosis (hang_diagnosis.h) use it; programs use ProcessGroupMpi.
//
//   internal::EnsureMpiInitialized();
//   {
//     internal::MpiCallLock lock;  // around every MPI call made from any thread
//     const int rc = MPI_Comm_dup(MPI_COMM_WORLD, &comm);
//     TANDEM_CHECK(rc == MPI_SUCCESS, "MPI_Comm_dup failed: ", internal::MpiErrorString(rc));
//   }
#ifndef TANDEM_PARALLEL_DISTRIBUTED_INTERNAL_MPI_CALLS_H_
#define TANDEM_PARALLEL_DISTRIBUTED_INTERNAL_MPI_CALLS_H_

#include <mutex>
#include <string>

namespace tandem::parallel::distributed::internal {

// Initialises MPI once per process (MPI_Init_thread asking for MPI_THREAD_MULTIPLE, finalised
// at exit); later calls only read the result. Throws when MPI cannot be initialised, was
// finalised already, or provides less than MPI_THREAD_SERIALIZED.
void EnsureMpiInitialized();

// Held around an MPI call: takes the process-wide lock when MPI provides only
// MPI_THREAD_SERIALIZED (several threads make MPI calls: a group's thread, its callers, a NCCL
// group's watchdog), nothing otherwise.
class MpiCallLock {
 public:
  MpiCallLock();

 private:
  std::unique_lock<std::mutex> lock_;
};

// MPI's text for an error code, or "MPI error <code>".
std::string MpiErrorString(int code);

}  // namespace tandem::parallel::distributed::internal

#endif  // TANDEM_PARALLEL_DISTRIBUTED_INTERNAL_MPI_CALLS_H_
