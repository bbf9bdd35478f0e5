#!/usr/bin/env bash
# Runs every test that has CUDA cases under --config=cudasim and counts the GPU cases that ran
# (count_cases.sh): the CI step of tools/cudasim/README.md.
#
#   bash tools/cudasim/run_tests.sh [extra bazel flags]
#
# The tests: //tensor/cuda/..., //tools/cuda/tests/..., //tools/cudasim/..., and every test
# elsewhere (tensor, nn, parallel, data, tests) whose source names a CUDA device. NCCL's tests
# (parallel/distributed) are not among them: the simulator has no NCCL.
set -euo pipefail
cd "$(dirname "$0")/../.."

files="$(grep -rlE 'Device::Cuda\(|kCuda|DeviceType::kCUDA|cuda::' --include='*_test.cc' \
  tensor nn parallel data tests | grep -v -e '^tensor/cuda/' -e '^parallel/distributed/' | sort)"
names="$(for f in $files; do basename "$f" .cc; done | paste -sd'|')"
targets="$(bazel query --noshow_progress \
  "attr(srcs, ':($names)\\.cc', tests(//tensor/... + //nn/... + //parallel/... + //data/... + //tests/...))" \
  2>/dev/null)"
# shellcheck disable=SC2086
bazel test --config=cudasim "$@" //tensor/cuda/... //tools/cuda/tests/... //tools/cudasim/... \
  $targets
bash tools/cudasim/count_cases.sh
