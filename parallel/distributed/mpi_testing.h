// Test helpers for the tests that run as ranks of an MPI job (mpi_test.bzl starts them under
// mpirun through mpi_test.sh): a fixture that skips when the binary runs alone, and the one
// ProcessGroupMpi a test binary shares (groups are collective to create, so every rank must
// make the same ones in the same order).
//
//   class ProcessGroupMpiTest : public parallel::distributed::MpiTest {};
//   TEST_F(ProcessGroupMpiTest, Sums) { parallel::distributed::TestGroup()->allreduce(...); }
#ifndef TANDEM_PARALLEL_DISTRIBUTED_MPI_TESTING_H_
#define TANDEM_PARALLEL_DISTRIBUTED_MPI_TESTING_H_

#include <gtest/gtest.h>

#include <chrono>
#include <memory>

#include "parallel/distributed/process_group_mpi.h"

namespace tandem::parallel::distributed {

// Skips every test of the fixture unless the binary was started by mpirun.
class MpiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!LaunchedByMpirun()) {
      GTEST_SKIP() << "needs mpirun: bazel test runs it through parallel/distributed/mpi_test.sh";
    }
  }
};

// The binary's group over every rank, created at the first call (a 60 s collective timeout:
// a test that hangs fails in a minute instead of waiting for Bazel's timeout).
inline std::shared_ptr<ProcessGroupMpi> TestGroup() {
  static const auto group =
      std::make_shared<ProcessGroupMpi>(ProcessGroupMpiOptions().timeout(std::chrono::seconds(60)));
  return group;
}

}  // namespace tandem::parallel::distributed

#endif  // TANDEM_PARALLEL_DISTRIBUTED_MPI_TESTING_H_
