#!/usr/bin/env bash
# tools/cluster/cluster.sh: two hosts with their own hostnames and addresses; mpirun on the
# login host starts one rank on each through the launch agent, and their bytes cross the data
# links; a 100 Mbit/s link carries no more than that; a cut link stops traffic and comes
# back; and neither cluster_down, a shell killed with SIGKILL (the watcher), nor a dead run's
# leftovers (stale cleanup at the next cluster_up) leave a namespace behind.
set -euo pipefail
source tools/cluster/cluster.sh
cluster_require || { echo "SKIPPED: $CLUSTER_SKIP_REASON"; exit 0; }
fail() { echo "FAIL: $*"; exit 1; }

# A stale run: namespaces whose owner (a pid above any pid_max) is gone.
stale="tndc$(($(cat /proc/sys/kernel/pid_max) + 1))x1"
ip netns add "$stale-h0"
cluster_up 2 100
ip netns list | grep -q "^$stale-" && fail "cluster_up left the stale run's namespace $stale-h0"
[[ "${#CLUSTER_HOSTS[@]}" == 2 ]] || fail "expected 2 hosts, got ${CLUSTER_HOSTS[*]}"
[[ "$(cluster_on 1 hostname)" == "${CLUSTER_HOSTS[1]}" ]] || fail "host 1 has another hostname"
[[ "$(hostname)" != "${CLUSTER_HOSTS[1]}" ]] || fail "the machine's hostname changed"
cluster_on 0 ip -br addr show eth0 | grep -q ' 198\.18\.0\.10/24' || fail "host 0 has no data address"
cluster_on login ip -br addr show ctl0 | grep -q ' 198\.19\.0\.2/24' || fail "login has no control address"
grep -qx "${CLUSTER_HOSTS[0]} slots=1" "$CLUSTER_HOSTFILE" || fail "bad hostfile: $(cat "$CLUSTER_HOSTFILE")"

# One rank per host, each reporting its host; the job is started from the login host.
out="$(cluster_mpirun -np 2 --map-by node --tag-output hostname)"
grep -qx "\[1,0\]<stdout>:${CLUSTER_HOSTS[0]}" <<<"$out" &&
  grep -qx "\[1,1\]<stdout>:${CLUSTER_HOSTS[1]}" <<<"$out" || fail "mpirun placed the ranks so: $out"

# 4 MB from host 0 to host 1 over the 100 Mbit/s data link: at least 0.9 x 4e6 * 8 / 1e8 s
# (a busy machine can only make it slower; without the limit it takes milliseconds).
receive='import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("198.18.0.11", 5001)); s.listen(1); print("listening", flush=True)
c, _ = s.accept(); n = 0; start = None
while True:
    b = c.recv(1 << 16)
    if not b: break
    if start is None: start = time.monotonic()
    n += len(b)
print(n, time.monotonic() - start, flush=True)'
exec 3< <(cluster_on 1 python3 -c "$receive")
read -r -t 10 line <&3 && [[ "$line" == listening ]] || fail "the receiver on host 1 did not start"
cluster_on 0 bash -c 'head -c 4000000 /dev/zero >/dev/tcp/198.18.0.11/5001'
read -r -t 30 bytes seconds <&3 || fail "the receiver reported nothing"
exec 3<&-
echo "4 MB over the 100 Mbit/s link: $bytes bytes in $seconds s"
[[ "$bytes" == 4000000 ]] || fail "host 1 received $bytes bytes, expected 4000000"
awk -v s="$seconds" 'BEGIN { exit !(s >= 0.9 * 0.32) }' ||
  fail "4 MB crossed the 100 Mbit/s link in $seconds s: the rate limit does not hold"

# A cut link carries nothing (the connection attempt fails or times out); restored, it does.
cluster_link 1 down
if cluster_on 0 timeout 3 bash -c 'echo >/dev/tcp/198.18.0.11/5001' 2>/dev/null; then
  fail "host 0 reached host 1 over a cut link"
fi
cluster_link 1 up
cluster_on 1 ip -br link show eth0 | grep -q 'UP' || fail "host 1's link did not come back"

# cluster_down removes everything; so does the watcher when the owning shell is SIGKILLed.
prefix="$CLUSTER_PREFIX"
cluster_down
ip netns list | grep -q "^$prefix-" && fail "cluster_down left $(ip netns list | grep "^$prefix-")"
bash -c 'source tools/cluster/cluster.sh; cluster_up 2 0; echo "$CLUSTER_PREFIX"; kill -KILL $$' \
  >"${TEST_TMPDIR:-/tmp}/killed_prefix" || true
killed="$(cat "${TEST_TMPDIR:-/tmp}/killed_prefix")"
[[ "$killed" == tndc* ]] || fail "the killed shell made no cluster"
for _ in $(seq 50); do
  ip netns list | grep -q "^$killed-" || break
  sleep 0.2
done
ip netns list | grep -q "^$killed-" && fail "the killed shell's cluster outlived it by 10 s"
echo "PASS"
