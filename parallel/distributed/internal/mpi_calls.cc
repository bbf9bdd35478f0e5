#include "parallel/distributed/internal/mpi_calls.h"

#include <mpi.h>

#include <cstdlib>

#include "tensor/base/error.h"

namespace tandem::parallel::distributed::internal {
namespace {

// Whether MPI calls must be serialised by us (the library gave MPI_THREAD_SERIALIZED).
bool g_lock_mpi_calls = false;

std::mutex& MpiCallMutex() {
  static std::mutex* mutex = new std::mutex;  // outlives the atexit finalisation
  return *mutex;
}

void FinalizeMpiAtExit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

}  // namespace

MpiCallLock::MpiCallLock() {
  if (g_lock_mpi_calls) lock_ = std::unique_lock<std::mutex>(MpiCallMutex());
}

std::string MpiErrorString(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS)
    return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<size_t>(length));
}

void EnsureMpiInitialized() {
  static std::once_flag once;
  std::call_once(once, [] {
    int finalized = 0;
    MPI_Finalized(&finalized);
    TANDEM_CHECK(!finalized,
                 "ProcessGroupMpi: MPI has already been finalised in this process; create every "
                 "process group before MPI_Finalize");
    int initialized = 0;
    MPI_Initialized(&initialized);
    int provided = MPI_THREAD_SINGLE;
    if (initialized) {
      MPI_Query_thread(&provided);
    } else {
      const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
      TANDEM_CHECK(rc == MPI_SUCCESS,
                   "ProcessGroupMpi: MPI_Init_thread failed: ", MpiErrorString(rc),
                   "; is the program started by mpirun, with Open MPI installed?");
      std::atexit(FinalizeMpiAtExit);
    }
    TANDEM_CHECK(provided >= MPI_THREAD_SERIALIZED,
                 "ProcessGroupMpi needs MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE but MPI "
                 "provides thread level ",
                 provided,
                 (initialized ? "; initialise MPI with MPI_Init_thread(..., MPI_THREAD_MULTIPLE, "
                                "...) or let ProcessGroupMpi do it"
                              : "; use an MPI library built with thread support"));
    g_lock_mpi_calls = provided < MPI_THREAD_MULTIPLE;
  });
}

}  // namespace tandem::parallel::distributed::internal
