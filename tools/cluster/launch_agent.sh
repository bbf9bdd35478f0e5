#!/usr/bin/env bash
# mpirun's launch agent for the cluster of tools/cluster/cluster.sh, in place of ssh
# (--mca plm_rsh_agent, which cluster_mpi_env sets): `launch_agent.sh HOST COMMAND...` runs
# COMMAND on HOST, that is inside the network namespace named HOST with HOST as its hostname
# (a UTS namespace of its own). As ssh does, it joins the words of COMMAND and hands them to a
# shell (mpirun passes its daemon's command line as words meant for a remote shell).
set -euo pipefail
# ssh options mpirun may pass before the host (none by default; -x: no X11 forwarding).
while [[ $# -gt 0 && "$1" == -* ]]; do shift; done
if [[ $# -lt 2 ]]; then
  echo "launch_agent.sh: expected HOST COMMAND..., got: $*" >&2
  exit 255
fi
host="$1"
shift
if [[ ! "$host" =~ ^tndc[0-9]+x[0-9]+-[a-z0-9]+$ || ! -e "/run/netns/$host" ]]; then
  echo "launch_agent.sh: no host '$host' in a cluster of tools/cluster/cluster.sh (is it up? was the host removed?)" >&2
  exit 255
fi
# shellcheck disable=SC2016  # expanded by the host's shell
exec ip netns exec "$host" unshare --uts -- bash -c 'hostname "$1" && shift && eval "$*"' \
  launch_agent "$host" "$@"
