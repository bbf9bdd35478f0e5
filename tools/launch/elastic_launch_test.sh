#!/usr/bin/env bash
# tools/launch/elastic_launch.sh on a cluster of tools/cluster (2 hosts x 1 rank over TCP):
# rank 1 killed mid-epoch twice, the launcher restarts every rank from the last checkpoint each
# time and the job ends with the uninterrupted run's model, bit for bit; a host that goes away
# mid-epoch is left out and the job finishes on the host left (world size 1, the --sharding=full
# checkpoint resharded), its loss between the uninterrupted 2- and 1-rank runs'; so is a host
# whose data link is cut (it still answers; --check_command finds the link down). The launcher
# says each time what it did; bad usage is refused.
set -euo pipefail
train="$(realpath "$1")"  # //examples:train_with_test_hooks
launch="$(realpath tools/launch/elastic_launch.sh)"
fail() { echo "FAIL: $*"; exit 1; }
rc=0
out="$("$launch" --hostfile=/nonexistent -- true 2>&1)" || rc=$?
[[ $rc == 2 ]] && grep -q 'elastic_launch: --hostfile=/nonexistent cannot be read' <<<"$out" ||
  fail "a missing hostfile was not refused (exit $rc): $out"
source tools/cluster/cluster.sh
cluster_require || { echo "SKIPPED: $CLUSTER_SKIP_REASON"; exit 0; }
data_dir=/usr/share/datasets/fashion-mnist
if [[ ! -f "$data_dir/train-images-idx3-ubyte.gz" ]]; then
  echo "SKIPPED: Fashion-MNIST is not installed in $data_dir (bash tools/setup.sh installs it)"
  exit 0
fi
logs="${TEST_TMPDIR:-$(mktemp -d)}"
rm -f "$logs"/*.ckpt* "$logs"/*.model "$logs"/*.csv
unset XML_OUTPUT_FILE TEST_PREMATURE_EXIT_FILE
export OPENBLAS_NUM_THREADS=1
# 3 epochs of 64 steps (8192 images, 128 a step): about a second each, long enough to be
# killed in the middle of.
base=(--distributed --devices=cpu:0 --threads=1 --epochs=3 --batch_size=128 --train_limit=8192
  --test_limit=500 --workers=0)
cluster_up 2 1000

launcher_options=()
# elastic LOG PROGRAM_ARGS...: the launcher on the login host, in the background (job=its pid).
elastic() {
  local log="$1"
  shift
  (
    cluster_mpi_env
    cluster_on login "$launch" --hostfile="$CLUSTER_HOSTFILE" --max_restarts=3 --check_timeout=5 \
      "${launcher_options[@]}" --mpirun_arg=--tag-output --mpirun_arg=--oversubscribe --mpirun_arg=--bind-to \
      --mpirun_arg=none -- "$train" "$@"
  ) >"$log" 2>&1 &
  job=$!
}
# after_line LOG PATTERN: waits until a line matching PATTERN comes after the log's current end.
wait_for() {
  local log="$1" pattern="$2" from="$3"
  for _ in $(seq 1200); do
    tail -c +"$from" "$log" | grep -q -- "$pattern" && return 0
    kill -0 "$job" 2>/dev/null || { cat "$log"; fail "the launcher ended before '$pattern'"; }
    sleep 0.05
  done
  cat "$log"
  fail "no '$pattern' within 60 s"
}
kill_rank1() {
  local pid
  for pid in $(cluster_pids 1); do
    if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=1'; then
      kill -KILL "$pid"
      return 0
    fi
  done
  fail "found no rank 1 on host 1"
}
finish() {
  local rc=0
  wait "$job" || rc=$?
  [[ $rc == 0 ]] || { cat "$1"; fail "the elastic job failed (exit $rc)"; }
}

# The uninterrupted run.
cluster_mpirun -np 2 --map-by node "$train" "${base[@]}" --checkpoint="$logs/straight.ckpt" \
  --save="$logs/straight.model" --log_csv="$logs/straight.csv" >"$logs/straight.txt" 2>&1 ||
  { cat "$logs/straight.txt"; fail "the uninterrupted run failed"; }

# Rank 1 killed in epoch 2, then (after the restart) in epoch 3.
log="$logs/twice.txt"
elastic "$log" "${base[@]}" --checkpoint="$logs/twice.ckpt" --save="$logs/twice.model"
wait_for "$log" '^\[1,0\]<stdout>:epoch 2/3 \[' 1
kill_rank1
wait_for "$log" 'elastic_launch: attempt 2 of 4' 1
wait_for "$log" '^\[1,0\]<stdout>:epoch 3/3 \[' "$(($(stat -c %s "$log") + 1))"
kill_rank1
wait_for "$log" 'elastic_launch: attempt 3 of 4' 1
finish "$log"
grep '^elastic_launch:' "$log"
for expected in \
  'elastic_launch: attempt 1 of 4: 2 ranks, 1 on each of 2 hosts' \
  'elastic_launch: the job failed (exit status 137); every host answers: restarting all 2 ranks from the last checkpoint (restart 1 of 3)' \
  'elastic_launch: the job failed (exit status 137); every host answers: restarting all 2 ranks from the last checkpoint (restart 2 of 3)' \
  'elastic_launch: the job finished (attempt 3, 2 restarts)' \
  "Resuming from $logs/twice.ckpt: 1 of 3 epochs done" \
  "Resuming from $logs/twice.ckpt: 2 of 3 epochs done"; do
  grep -qF "$expected" "$log" || { cat "$log"; fail "expected '$expected'"; }
done
cmp "$logs/straight.model" "$logs/twice.model" ||
  fail "the job restarted twice ended with another model than the uninterrupted one"

# Host 1 goes away in epoch 2 (--sharding=full: each rank saves its shard): the launcher
# leaves it out and the job resumes on host 0 alone, one rank taking the whole model.
full=("${base[@]}" --sharding=full)
cluster_mpirun -np 2 --map-by node "$train" "${full[@]}" --log_csv="$logs/full_straight.csv" \
  >"$logs/full_straight.txt" 2>&1 || { cat "$logs/full_straight.txt"; fail "the full run failed"; }
# And on one rank (before the host goes: mpirun starts a daemon on every host listed).
cluster_mpirun -np 1 "$train" "${full[@]}" --log_csv="$logs/one_rank.csv" >"$logs/one_rank.txt" 2>&1 ||
  { cat "$logs/one_rank.txt"; fail "the 1-rank run failed"; }
# between_runs CSV: the final train loss of a job whose world size went from 2 ranks to 1 after
# epoch 1 lies between the uninterrupted 2-rank and 1-rank runs' (5% margin), and its epoch 1 is
# the 2-rank run's. (--batch_size is per rank: one rank steps with half of two ranks' global
# batch, twice as often, so the curves at 1 and 2 ranks differ.)
between_runs() {
  cat "$1"
  [[ "$(sed -n 2p "$1" | cut -d, -f2)" == "$(sed -n 2p "$logs/full_straight.csv" | cut -d, -f2)" ]] ||
    fail "epoch 1 before the world shrank differs from the uninterrupted 2-rank run's"
  local two one left
  two="$(tail -1 "$logs/full_straight.csv" | cut -d, -f2)"
  one="$(tail -1 "$logs/one_rank.csv" | cut -d, -f2)"
  left="$(tail -1 "$1" | cut -d, -f2)"
  echo "final train loss: 2 ranks $two, 1 rank $one, 2 ranks then 1 on the host left $left"
  awk -v a="$two" -v b="$one" -v g="$left" 'BEGIN {
    lo = (a < b ? a : b) * 0.95; hi = (a > b ? a : b) * 1.05; exit !(g >= lo && g <= hi) }' ||
    fail "the job on the host left ends at train loss $left, outside [$one, $two] +- 5%"
}

# Host 1's data link cut in epoch 2 (the host still answers over the management network): rank
# 0 times out naming it, and --check_command, which checks the data network, leaves host 1 out.
log="$logs/link_cut.txt"
launcher_options=("--check_command=ip route get $CLUSTER_DATA_NET.1")
elastic "$log" "${full[@]}" --checkpoint="$logs/cut.ckpt" --log_csv="$logs/cut.csv" \
  --collective_timeout=3
wait_for "$log" '^\[1,0\]<stdout>:epoch 2/3 \[' 1
cluster_link 1 down
finish "$log"
cluster_link 1 up
launcher_options=()
grep '^elastic_launch:' "$log"
for expected in \
  "elastic_launch: host ${CLUSTER_HOSTS[1]} answers but fails --check_command (ip route get $CLUSTER_DATA_NET.1: RTNETLINK answers: Network is unreachable): left out" \
  "restarting on the 1 hosts left, 1 ranks instead of 2, from the last checkpoint (restart 1 of 3)" \
  "Resuming from $logs/cut.ckpt: 1 of 3 epochs done"; do
  grep -qF "$expected" "$log" || { cat "$log"; fail "expected '$expected'"; }
done
between_runs "$logs/cut.csv"

log="$logs/host_gone.txt"
elastic "$log" "${full[@]}" --checkpoint="$logs/gone.ckpt" --log_csv="$logs/gone.csv"
wait_for "$log" '^\[1,0\]<stdout>:epoch 2/3 \[' 1
cluster_remove_host 1
finish "$log"
grep '^elastic_launch:' "$log"
for expected in \
  "elastic_launch: host ${CLUSTER_HOSTS[1]} does not answer" \
  "restarting on the 1 hosts left, 1 ranks instead of 2, from the last checkpoint (restart 1 of 3)" \
  'elastic_launch: attempt 2 of 4: 1 ranks, 1 on each of 1 hosts' \
  "Resuming from $logs/gone.ckpt: 1 of 3 epochs done"; do
  grep -qF "$expected" "$log" || { cat "$log"; fail "expected '$expected'"; }
done
between_runs "$logs/gone.csv"
echo "PASS"
