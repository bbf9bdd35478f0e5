#!/usr/bin/env bash
# The trainer's --distributed mode across "hosts" (tools/cluster/cluster.sh: network
# namespaces with their own hostnames, 1 Gbit/s data links, Open MPI over TCP between hosts):
# 2 hosts x 1 rank and 2 hosts x 2 ranks (oversubscribed) train the model that 2 and 4 ranks
# on one host train, bit for bit, and their gradients cross the data links. A host's data link
# cut mid-step makes the collective time out naming the rank and host that stopped answering;
# a rank killed on one host ends every rank within the timeout, mpirun naming rank and host.
set -euo pipefail
train="$(realpath "$1")"  # //examples:train_with_test_hooks
source tools/cluster/cluster.sh
cluster_require || { echo "SKIPPED: $CLUSTER_SKIP_REASON"; exit 0; }
data_dir=/usr/share/datasets/fashion-mnist
if [[ ! -f "$data_dir/train-images-idx3-ubyte.gz" ]]; then
  echo "SKIPPED: Fashion-MNIST is not installed in $data_dir (bash tools/setup.sh installs it)"
  exit 0
fi
fail() { echo "FAIL: $*"; exit 1; }
logs="${TEST_TMPDIR:-$(mktemp -d)}"
unset XML_OUTPUT_FILE TEST_PREMATURE_EXIT_FILE
export OPENBLAS_NUM_THREADS=1
base=(--distributed --devices=cpu:0 --threads=1 --epochs=2 --batch_size=64 --train_limit=2048
  --test_limit=500 --workers=0)
cluster_up 2 1000 2

# The one-host results: 2 and 4 ranks under mpi_test.sh (shared memory).
for n in 2 4; do
  bash parallel/distributed/mpi_test.sh "$n" "$train" "${base[@]}" --save="$logs/local$n.model" \
    >"$logs/local$n.txt" 2>&1 || { cat "$logs/local$n.txt"; fail "$n ranks on one host failed"; }
done
# The same on the cluster: --map-by node puts rank r on host r % 2.
for n in 2 4; do
  tx0="$(cluster_on 0 cat /sys/class/net/eth0/statistics/tx_bytes)"
  out="$(cluster_mpirun -np "$n" --map-by node --tag-output "$train" "${base[@]}" \
    --save="$logs/cluster$n.model" 2>&1)" || { echo "$out"; fail "2 hosts x $((n / 2)) ranks failed"; }
  tx1="$(cluster_on 0 cat /sys/class/net/eth0/statistics/tx_bytes)"
  grep -q "^\[1,0\]<stdout>:{\"model\".*\"ranks\":$n" <<<"$out" || { echo "$out"; fail "no JSON line of $n ranks"; }
  # Each epoch's line says what the all-reduces took over the network and how much of them
  # backward hid.
  grep -qE '^\[1,0\]<stdout>:epoch 2/2 .* all-reduce [0-9.]+ ms/step, [0-9]+% hidden behind backward$' <<<"$out" ||
    { echo "$out"; fail "no all-reduce figures in the epoch line"; }
  cmp "$logs/local$n.model" "$logs/cluster$n.model" ||
    fail "2 hosts x $((n / 2)) ranks trained another model than $n ranks on one host"
  # 2 epochs of 16 or 8 steps, each all-reducing 235146 floats (940 KB): host 0 sends at
  # least half of that per step over its link.
  sent=$((tx1 - tx0))
  ((sent > 16 * 470000)) || fail "host 0 sent $sent bytes over its data link: the ranks did not use TCP"
  echo "2 hosts x $((n / 2)) ranks: the one-host model; host 0 sent $sent bytes over its link"
done

# long_job LOG TIMEOUT_S: 2 hosts x 1 rank training for long, in the background (job=its pid);
# returns once rank 0 is in epoch 2.
long_job() {
  cluster_mpirun -np 2 --map-by node --tag-output "$train" --distributed --devices=cpu:0 \
    --threads=1 --epochs=1000 --batch_size=64 --train_limit=2048 --test_limit=100 --workers=0 \
    --collective_timeout="$2" >"$1" 2>&1 &
  job=$!
  for _ in $(seq 1200); do
    grep -q '^\[1,0\]<stdout>:epoch *2/' "$1" && return 0
    sleep 0.1
  done
  cat "$1"
  fail "the job did not reach epoch 2 in 120 s"
}
# ended_within LOG SECONDS: the background job ended, with a non-zero status, within SECONDS.
ended_within() {
  local start=$SECONDS
  for _ in $(seq $(($2 * 10))); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$job" 2>/dev/null; then cat "$1"; fail "the job still ran $2 s later"; fi
  local rc=0
  wait "$job" || rc=$?
  [[ $rc != 0 ]] || { cat "$1"; fail "the job exited 0"; }
  echo "the job ended $((SECONDS - start)) s later, exit status $rc"
}

# Host 1's data link cut mid-training (the control network stays, as a management network
# would): rank 0 times out within --collective_timeout, naming rank 1 and its host.
long_job "$logs/cut.txt" 3
cluster_link 1 down
ended_within "$logs/cut.txt" 60
grep -E "^\[1,0\]<stderr>:train \(rank 0\): ProcessGroupMpi rank 0 of 2: [a-z]+[^:]* did not finish within 3\.0 s: rank 1 \(on host ${CLUSTER_HOSTS[1]}\) did not answer \(stopped, hung or dead" \
  "$logs/cut.txt" || { cat "$logs/cut.txt"; fail "rank 0 did not name rank 1 on ${CLUSTER_HOSTS[1]}"; }
cluster_link 1 up

# Rank 1 (on host 1) SIGKILLed: mpirun ends every rank long before the 60 s timeout, saying
# which rank on which host died and how; no rank waits for a timeout.
long_job "$logs/killed.txt" 60
rank1=""
for pid in $(cluster_pids 1); do
  if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=1'; then
    rank1="$pid"
  fi
done
[[ -n "$rank1" ]] || fail "found no rank 1 on host 1"
kill -KILL "$rank1"
ended_within "$logs/killed.txt" 30
grep "^mpirun noticed that process rank 1 with PID $rank1 on node ${CLUSTER_HOSTS[1]} exited on signal 9 (Killed)" \
  "$logs/killed.txt" || { cat "$logs/killed.txt"; fail "mpirun did not name rank 1 on host 1"; }
if grep -q 'did not finish within' "$logs/killed.txt"; then
  cat "$logs/killed.txt"; fail "a rank waited for the collective timeout"
fi
echo "PASS"
