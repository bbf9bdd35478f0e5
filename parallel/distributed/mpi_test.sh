#!/usr/bin/env bash
# Runs a test binary as an MPI job on this machine: mpi_test.sh RANKS BINARY [ARGS...]
# (what the mpi_test() macro in mpi_test.bzl runs under `bazel test`). Every rank runs the
# whole binary; the job passes when every rank exits 0. Open MPI refuses root unless told,
# and the ranks share the machine's cores (--oversubscribe, no binding).
set -euo pipefail
ranks="$1"
binary="$2"
shift 2
# Bazel's XML_OUTPUT_FILE and premature-exit file would have every rank write (and remove)
# the same file: rank 0 alone writes gtest's report there (so that Bazel's test.xml lists the
# cases, and tools/cudasim/count_cases.sh counts them), the others none.
report="${XML_OUTPUT_FILE:-}"
unset XML_OUTPUT_FILE TEST_PREMATURE_EXIT_FILE
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Shared memory and loopback only; no ssh; keep the session directory path short (the
# Unix socket paths under it must fit in 108 characters).
export OMPI_MCA_btl=self,vader OMPI_MCA_plm_rsh_agent=false OMPI_MCA_btl_vader_single_copy_mechanism=none
export TMPDIR=/tmp
# One BLAS thread per rank: the ranks already share the cores.
export OPENBLAS_NUM_THREADS=1
if [[ -z "$report" ]]; then
  exec mpirun --oversubscribe --bind-to none --tag-output -np "$ranks" "$binary" "$@"
fi
export TANDEM_MPI_TEST_REPORT="$report"
# shellcheck disable=SC2016
exec mpirun --oversubscribe --bind-to none --tag-output -np "$ranks" bash -c \
  'if [[ "$OMPI_COMM_WORLD_RANK" == 0 ]]; then export GTEST_OUTPUT="xml:$TANDEM_MPI_TEST_REPORT"; fi
   exec "$@"' mpi_test "$binary" "$@"
