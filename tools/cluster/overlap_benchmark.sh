#!/usr/bin/env bash
# How much of DDP's gradient all-reduce hides behind backward on a network: runs
# parallel/distributed/distributed_benchmark --overlap (section 3) on two hosts of
# tools/cluster (one rank each, Open MPI over TCP) at each link rate, as root.
#
#   bash tools/cluster/overlap_benchmark.sh [MODEL [STEPS [MBITS...]]]   # default: gpt 10 1000 10000
#
# It builds the benchmark with -c opt first.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
bazel build -c opt //parallel/distributed:distributed_benchmark
benchmark="$(bazel info -c opt bazel-bin)/parallel/distributed/distributed_benchmark"
model="${1:-gpt}"
steps="${2:-10}"
shift $(($# < 2 ? $# : 2))
rates=("$@")
((${#rates[@]})) || rates=(1000 10000)
source tools/cluster/cluster.sh
cluster_require || { echo "overlap_benchmark: $CLUSTER_SKIP_REASON" >&2; exit 1; }
export OPENBLAS_NUM_THREADS=1
for mbits in "${rates[@]}"; do
  cluster_up 2 "$mbits"
  echo "== 2 hosts x 1 rank, data links at $mbits Mbit/s each way"
  cluster_mpirun -np 2 --map-by node "$benchmark" --overlap="$model" --steps="$steps"
  cluster_down
done
