#!/usr/bin/env bash
# A small cluster inside this machine, for tests and benchmarks that need several "hosts" over
# a real network stack: each host is a network namespace (its own interfaces, addresses and
# routes) and, when something runs on it, a UTS namespace (its own hostname, so that Open MPI
# sees separate nodes and moves bytes over TCP, not shared memory). A namespace "switch" holds
# two bridges: the data network 198.18.0.0/24 (MPI's TCP transport; each host's link limited
# to a rate with `tc tbf` in both directions) and the control network 198.19.0.0/24 (mpirun's
# out-of-band channel to its daemons, never limited, so that a data link cut with
# `cluster_link H down` leaves mpirun able to end the job). mpirun itself runs on a "login"
# host attached to the control network only, and starts each host's daemon through
# launch_agent.sh (in place of ssh). Addresses come from 198.18.0.0/15, set aside for
# benchmarking; nothing is added to the machine's own namespace, so no traffic leaves.
#
# Needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN), `ip`, `tc` and `unshare`; under Bazel a test
# that uses it needs tags = ["no-sandbox"] (the sandbox's namespaces hide /run/netns).
#
#   source tools/cluster/cluster.sh
#   cluster_require || { echo "SKIPPED: $CLUSTER_SKIP_REASON"; exit 0; }
#   cluster_up 2 1000                  # 2 hosts, 1000 Mbit/s each way per link (0: unlimited)
#   cluster_mpirun -np 2 --map-by node ./prog    # one rank per host, over TCP
#   cluster_on 1 ip addr               # a command on host 1 (its hostname: ${CLUSTER_HOSTS[1]})
#   cluster_link 1 down                # cut host 1's data link (up: restore it)
#   cluster_remove_host 1              # host 1 crashes for good
#   cluster_down                       # or let the EXIT trap do it
#
# Cleanup never leaves a namespace behind: every name starts with a prefix unique to the run
# (tndc<pid of the owning shell>x<random>); cluster_up sets an EXIT/INT/TERM trap, starts a
# watcher outside the caller's process group that tears the cluster down once the owning
# shell is gone (even after SIGKILL), and first removes what runs whose owner is dead left.
# Tearing down kills the processes inside the run's namespaces (they are the run's own), then
# deletes the namespaces, which deletes their interfaces, and Open MPI's session folders of the
# run's hosts.
#
# Variables cluster_up sets: CLUSTER_PREFIX, CLUSTER_HOSTS (hostnames, index = host number),
# CLUSTER_HOSTFILE (one line per host, "slots=" CLUSTER_SLOTS, default 1), CLUSTER_AGENT (the
# launch agent's path), CLUSTER_DIR (a folder of the run's files, removed at cluster_down).

CLUSTER_TOOLS="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CLUSTER_AGENT="$CLUSTER_TOOLS/launch_agent.sh"
CLUSTER_DATA_NET=198.18.0
CLUSTER_CONTROL_NET=198.19.0

# Returns 0 when this machine can make the cluster; otherwise sets CLUSTER_SKIP_REASON.
cluster_require() {
  CLUSTER_SKIP_REASON=""
  local tool
  for tool in ip tc unshare nsenter mpirun; do
    if ! command -v "$tool" >/dev/null; then
      CLUSTER_SKIP_REASON="the cluster fixture needs '$tool', which is not installed"
      return 1
    fi
  done
  if [[ "$(id -u)" != 0 ]]; then
    CLUSTER_SKIP_REASON="the cluster fixture makes network namespaces, which needs root (this is uid $(id -u)); run as root (CI does)"
    return 1
  fi
  local probe="tndc$$x${RANDOM}-probe" out
  if ! out="$(ip netns add "$probe" 2>&1)"; then
    CLUSTER_SKIP_REASON="'ip netns add' failed ($out): no privileges for network namespaces here (a Bazel test needs tags = [\"no-sandbox\"])"
    return 1
  fi
  if ! out="$(ip netns exec "$probe" unshare --uts true 2>&1)"; then
    ip netns del "$probe"
    CLUSTER_SKIP_REASON="'unshare --uts' failed in a network namespace ($out)"
    return 1
  fi
  ip netns del "$probe"
}

# Removes the namespaces of runs whose owning shell is dead (a run killed before its trap ran,
# and before its watcher could act).
cluster_clean_stale() {
  local ns owner
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^tndc[0-9]+x[0-9]+-' || true); do
    owner="${ns#tndc}"
    owner="${owner%%x*}"
    if ! kill -0 "$owner" 2>/dev/null; then
      _cluster_delete_ns "$ns"
    fi
  done
  # Open MPI's session folders (under TMPDIR=/tmp, cluster_mpi_env) of dead runs' hosts: a
  # daemon killed with its host leaves its own behind.
  local dir
  for dir in /tmp/ompi.tndc*; do
    [[ -d "$dir" ]] || continue
    owner="${dir#/tmp/ompi.tndc}"
    owner="${owner%%x*}"
    if [[ "$owner" =~ ^[0-9]+$ ]] && ! kill -0 "$owner" 2>/dev/null; then rm -rf "$dir"; fi
  done
}

_cluster_delete_ns() {
  local ns="$1" pid
  # Processes still inside would keep the namespace (and its interfaces) alive.
  for pid in $(ip netns pids "$ns" 2>/dev/null); do
    kill -KILL "$pid" 2>/dev/null || true
  done
  ip netns del "$ns" 2>/dev/null || true
}

# cluster_up HOSTS MBITS [SLOTS]: HOSTS hosts whose data links carry MBITS Mbit/s each way
# (0: as fast as the machine moves bytes), SLOTS ranks per host in the hostfile (default 1).
cluster_up() {
  local hosts="$1" mbits="$2" slots="${3:-1}"
  if [[ ! "$hosts" =~ ^[1-9][0-9]?$ ]] || ((hosts > 200)); then
    echo "cluster_up: the number of hosts must be 1 to 200 but is '$hosts'" >&2
    return 1
  fi
  if [[ ! "$mbits" =~ ^[0-9]+$ ]]; then
    echo "cluster_up: the rate must be a whole number of Mbit/s (0: unlimited) but is '$mbits'" >&2
    return 1
  fi
  if [[ -n "${CLUSTER_PREFIX:-}" ]]; then
    echo "cluster_up: a cluster ($CLUSTER_PREFIX) is already up in this shell; cluster_down first" >&2
    return 1
  fi
  cluster_clean_stale
  CLUSTER_PREFIX="tndc$$x$RANDOM"
  CLUSTER_SLOTS="$slots"
  CLUSTER_DIR="$(mktemp -d "/tmp/$CLUSTER_PREFIX.XXXXXX")"
  CLUSTER_HOSTFILE="$CLUSTER_DIR/hostfile"
  CLUSTER_HOSTS=()
  trap cluster_down EXIT
  trap 'cluster_down; exit 130' INT
  trap 'cluster_down; exit 143' TERM
  # The watcher: its own session (Bazel's timeout kills the test's process group), its output
  # nowhere (a test's pipes must close when the test ends).
  # shellcheck disable=SC2016  # expanded by the watcher's shell
  setsid bash -c '
    owner="$1" prefix="$2" dir="$3"
    while kill -0 "$owner" 2>/dev/null; do sleep 1; done
    for ns in $(ip netns list | awk "{print \$1}" | grep "^$prefix-"); do
      for pid in $(ip netns pids "$ns"); do kill -KILL "$pid"; done
      ip netns del "$ns"
    done
    rm -rf "$dir" /tmp/ompi."$prefix"-*' cluster-watcher "$$" "$CLUSTER_PREFIX" "$CLUSTER_DIR" \
    </dev/null >/dev/null 2>&1 &
  disown
  local sw="$CLUSTER_PREFIX-sw"
  _cluster_try ip netns add "$sw" || return 1
  _cluster_try ip -n "$sw" link set lo up || return 1
  local bridge
  for bridge in data ctl; do
    _cluster_try ip -n "$sw" link add "$bridge" type bridge || return 1
    _cluster_try ip -n "$sw" link set "$bridge" up || return 1
  done
  local i
  for ((i = 0; i < hosts; i++)); do
    _cluster_add_host "$CLUSTER_PREFIX-h$i" "h$i" "$((10 + i))" "$mbits" || return 1
    CLUSTER_HOSTS+=("$CLUSTER_PREFIX-h$i")
    echo "$CLUSTER_PREFIX-h$i slots=$slots" >>"$CLUSTER_HOSTFILE"
  done
  _cluster_add_host "$CLUSTER_PREFIX-login" login 2 "" || return 1
}

_cluster_try() {
  local out
  if ! out="$("$@" 2>&1)"; then
    echo "cluster: '$*' failed: $out" >&2
    return 1
  fi
}

# _cluster_add_host NS PORT_NAME ADDRESS_BYTE MBITS: a namespace with a control link and, unless
# MBITS is empty (the login host), a data link at MBITS Mbit/s (0: unlimited).
_cluster_add_host() {
  local ns="$1" port="$2" byte="$3" mbits="$4" sw="$CLUSTER_PREFIX-sw"
  _cluster_try ip netns add "$ns" || return 1
  _cluster_try ip -n "$ns" link set lo up || return 1
  local net bridge dev address
  for net in ctl data; do
    if [[ "$net" == data && -z "$mbits" ]]; then continue; fi
    if [[ "$net" == data ]]; then
      bridge=data dev=eth0 address="$CLUSTER_DATA_NET.$byte"
    else
      bridge=ctl dev=ctl0 address="$CLUSTER_CONTROL_NET.$byte"
    fi
    # Created inside the namespaces: nothing appears in the machine's own, even for a moment.
    _cluster_try ip -n "$sw" link add "$net-$port" type veth peer name "$dev" netns "$ns" || return 1
    _cluster_try ip -n "$sw" link set "$net-$port" master "$bridge" up || return 1
    _cluster_try ip -n "$ns" addr add "$address/24" dev "$dev" || return 1
    _cluster_try ip -n "$ns" link set "$dev" up || return 1
    if [[ "$net" == data && "$mbits" != 0 ]]; then
      # A token bucket each way (out of the host; out of the switch towards it). The bucket
      # holds 1 ms of traffic (at least 64 KB: a GSO segment), the queue 10 ms.
      local burst=$((mbits * 125 > 65536 ? mbits * 125 : 65536))
      _cluster_try tc -n "$ns" qdisc add dev "$dev" root tbf rate "${mbits}mbit" burst "$burst" \
        latency 10ms || return 1
      _cluster_try tc -n "$sw" qdisc add dev "$net-$port" root tbf rate "${mbits}mbit" \
        burst "$burst" latency 10ms || return 1
    fi
  done
}

# cluster_on HOST COMMAND...: runs COMMAND on host HOST (a number, "login", or a hostname of
# CLUSTER_HOSTS), with that host's hostname.
cluster_on() {
  local host="$1"
  shift
  if [[ "$host" =~ ^[0-9]+$ ]]; then host="${CLUSTER_HOSTS[$host]:?no such host}"; fi
  if [[ "$host" == login ]]; then host="$CLUSTER_PREFIX-login"; fi
  # shellcheck disable=SC2016  # expanded by the host's shell
  ip netns exec "$host" unshare --uts -- bash -c 'hostname "$1" && shift && exec "$@"' \
    cluster_on "$host" "$@"
}

# The Open MPI settings of a job on the cluster: MPI over TCP on the data network (shared
# memory between the ranks of one host), mpirun's channel on the control network, the launch
# agent instead of ssh.
cluster_mpi_env() {
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TMPDIR=/tmp
  export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_vader_single_copy_mechanism=none
  export OMPI_MCA_btl_tcp_if_include="$CLUSTER_DATA_NET.0/24"
  export OMPI_MCA_oob_tcp_if_include="$CLUSTER_CONTROL_NET.0/24"
  export OMPI_MCA_plm_rsh_agent="$CLUSTER_AGENT"
  # The hostnames resolve nowhere: the daemons report addresses, not names.
  export OMPI_MCA_orte_keep_fqdn_hostnames=1
}

# cluster_mpirun MPIRUN_ARGS...: mpirun on the login host over CLUSTER_HOSTFILE (add -np,
# --map-by node or slot, the program and its arguments).
cluster_mpirun() {
  (
    cluster_mpi_env
    cluster_on login mpirun --hostfile "$CLUSTER_HOSTFILE" --oversubscribe --bind-to none "$@"
  )
}

# cluster_link HOST up|down: restores or cuts host HOST's data link (the control link stays).
cluster_link() {
  local host="$1" state="$2"
  if [[ "$host" =~ ^[0-9]+$ ]]; then host="${CLUSTER_HOSTS[$host]:?no such host}"; fi
  ip -n "$host" link set eth0 "$state"
}

# cluster_pids HOST: the processes running on host HOST (a number or a hostname).
cluster_pids() {
  local host="$1"
  if [[ "$host" =~ ^[0-9]+$ ]]; then host="${CLUSTER_HOSTS[$host]:?no such host}"; fi
  ip netns pids "$host"
}

# cluster_remove_host HOST: the host goes away for good (what runs on it is killed, its
# namespace deleted), as a machine that crashed: the launch agent no longer reaches it.
cluster_remove_host() {
  local host="$1"
  if [[ "$host" =~ ^[0-9]+$ ]]; then host="${CLUSTER_HOSTS[$host]:?no such host}"; fi
  _cluster_delete_ns "$host"
}

# Tears the cluster down (idempotent): kills what runs on its hosts, deletes the namespaces.
cluster_down() {
  [[ -n "${CLUSTER_PREFIX:-}" ]] || return 0
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$CLUSTER_PREFIX-" || true); do
    _cluster_delete_ns "$ns"
  done
  rm -rf "${CLUSTER_DIR:?}" /tmp/ompi."$CLUSTER_PREFIX"-*
  CLUSTER_PREFIX=""
  CLUSTER_HOSTS=()
}
