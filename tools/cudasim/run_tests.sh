#!/usr/bin/env bash
# Runs every test that has CUDA cases under --config=cudasim and counts the GPU cases that ran
# (count_cases.sh): the CI step of tools/cudasim/README.md.
#
#   bash tools/cudasim/run_tests.sh [extra bazel flags]
#
# The tests: //tensor/cuda/..., //tools/cuda/tests/..., //tools/cudasim/..., and every test
# elsewhere (tensor, nn, parallel, data, tests, examples and tools/bench, whose tests count a
# GPT-2 step's launches, grids, host syncs and model-only work) whose source names a CUDA
# device, among them the NCCL tests of parallel/distributed, which run under mpirun (mpi_test.bzl: a test per number
# of ranks, each running the cc_binary that holds the source).
set -euo pipefail
cd "$(dirname "$0")/../.."

files="$(grep -rlE 'Device::Cuda\(|kCuda|DeviceType::kCUDA|cuda::' --include='*_test.cc' \
  tensor nn parallel data tests examples tools/bench | grep -v -e '^tensor/cuda/' | sort)"
names="$(for f in $files; do basename "$f" .cc; done | paste -sd'|')"
universe="//tensor/... + //nn/... + //parallel/... + //data/... + //tests/... + //examples/... +
  //tools/bench/..."
# A cc_test holds its source; an mpi_test's sh_tests run the binary that does (depth 1).
targets="$(bazel query --noshow_progress \
  "tests(rdeps($universe, attr(srcs, ':($names)\\.cc', $universe), 1))" 2>/dev/null)"
# shellcheck disable=SC2086
bazel test --config=cudasim "$@" //tensor/cuda/... //tools/cuda/tests/... //tools/cudasim/... \
  $targets
bash tools/cudasim/count_cases.sh
