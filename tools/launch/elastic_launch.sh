#!/usr/bin/env bash
# elastic_launch.sh: runs an MPI job over the hosts of a hostfile and, when it fails (a rank
# died, a host went away), starts every rank again, up to --max_restarts times: on the same
# hosts when all of them still answer, else on the hosts left (the world size shrinks). The
# program must resume from its own checkpoint, as `train --distributed --checkpoint=FILE` does
# (after each epoch; a sharded checkpoint, --sharding=full, reshards to the new world size).
# Like torchrun's elastic agent, but over mpirun, which owns the ranks: a job ends as a whole
# (mpirun kills the other ranks when one dies) and restarts as a whole.
#
#   tools/launch/elastic_launch.sh --hostfile=hosts --ranks_per_host=2 --max_restarts=3 -- \
#       train --distributed --checkpoint=/shared/run.ckpt --epochs=10
#
# Options (before --):
#   --hostfile=FILE      Open MPI hostfile: a host per line (the first word; "slots=" etc. are
#                        mpirun's). Required.
#   --ranks_per_host=K   ranks started on each host (default 1): world size = hosts x K.
#   --max_restarts=N     restarts after failures before giving up (default 3).
#   --min_hosts=M        fewer hosts than this left: give up (default 1).
#   --agent=CMD          how to reach a host to see whether it answers: `CMD HOST true`, within
#                        --check_timeout seconds (default: $OMPI_MCA_plm_rsh_agent, else ssh;
#                        mpirun uses the same agent to start its daemons).
#   --check_timeout=S    seconds a host has to answer (default 10).
#   --check_command=CMD  what the host must run successfully to be kept (default `true`: it
#                        answers). The agent reaches a host over the management network, which
#                        says nothing of the network MPI moves data over: check that one too,
#                        e.g. --check_command='ip route get 10.1.0.1' (fails once the host's
#                        interface towards 10.1.0.0/16 is down) or a ping of its switch.
#   --mpirun_arg=ARG     one more argument for mpirun (repeatable), e.g. --mpirun_arg=--tag-output.
# Exit status: 0 once an attempt succeeds; the last attempt's status when the restarts run out
# or too few hosts are left; 2 for bad usage. Each decision is said on stderr, prefixed
# "elastic_launch:".
set -uo pipefail

say() { echo "elastic_launch: $*" >&2; }
usage() { say "$*"; say "usage: elastic_launch.sh --hostfile=FILE [options] -- PROGRAM [ARGS...]"; exit 2; }

hostfile="" ranks_per_host=1 max_restarts=3 min_hosts=1 check_timeout=10 check_command=true
agent="${OMPI_MCA_plm_rsh_agent:-ssh}"
mpirun_args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --hostfile=*) hostfile="${1#*=}" ;;
    --ranks_per_host=*) ranks_per_host="${1#*=}" ;;
    --max_restarts=*) max_restarts="${1#*=}" ;;
    --min_hosts=*) min_hosts="${1#*=}" ;;
    --agent=*) agent="${1#*=}" ;;
    --check_timeout=*) check_timeout="${1#*=}" ;;
    --check_command=*) check_command="${1#*=}" ;;
    --mpirun_arg=*) mpirun_args+=("${1#*=}") ;;
    --) shift; break ;;
    *) usage "unknown option '$1' (options come before --, the program after)" ;;
  esac
  shift
done
[[ $# -gt 0 ]] || usage "no program given after --"
[[ -n "$check_command" ]] || usage "--check_command is empty (the default is 'true': the host answers)"
[[ -n "$hostfile" ]] || usage "--hostfile is required"
[[ -r "$hostfile" ]] || usage "--hostfile=$hostfile cannot be read"
for number in ranks_per_host max_restarts min_hosts check_timeout; do
  [[ "${!number}" =~ ^[0-9]+$ ]] || usage "--$number must be a whole number but is '${!number}'"
done
((ranks_per_host >= 1)) || usage "--ranks_per_host must be at least 1"
if ! printf '%s\n' "$@" | grep -q -- '^--checkpoint'; then
  say "warning: the program has no --checkpoint=FILE: each restart starts from the beginning"
fi

# The hosts: the first word of each line that is not blank or a comment.
mapfile -t hosts < <(sed -e 's/#.*//' "$hostfile" | awk 'NF { print $1 }')
((${#hosts[@]} >= min_hosts && ${#hosts[@]} > 0)) ||
  usage "--hostfile=$hostfile lists ${#hosts[@]} hosts, fewer than --min_hosts=$min_hosts"

work="$(mktemp -d "${TMPDIR:-/tmp}/elastic_launch.XXXXXX")"
job=""
stop() {
  # Forwarded to mpirun, which ends its ranks.
  if [[ -n "$job" ]]; then kill -TERM "$job" 2>/dev/null; wait "$job" 2>/dev/null; fi
  rm -rf "$work"
  exit 143
}
trap stop INT TERM
trap 'rm -rf "$work"' EXIT

restarts=0
while true; do
  : >"$work/hostfile"
  for host in "${hosts[@]}"; do echo "$host slots=$ranks_per_host" >>"$work/hostfile"; done
  ranks=$((${#hosts[@]} * ranks_per_host))
  say "attempt $((restarts + 1)) of $((max_restarts + 1)): $ranks ranks, $ranks_per_host on each of ${#hosts[@]} hosts (${hosts[*]})"
  mpirun --hostfile "$work/hostfile" -np "$ranks" --map-by node "${mpirun_args[@]}" "$@" &
  job=$!
  wait "$job"
  status=$?
  job=""
  if ((status == 0)); then
    say "the job finished (attempt $((restarts + 1)), $restarts restarts)"
    exit 0
  fi
  if ((restarts >= max_restarts)); then
    say "the job failed (exit status $status) and --max_restarts=$max_restarts restarts are used up: giving up"
    exit "$status"
  fi
  # Which hosts still answer? Those that do not are left out from now on.
  left=()
  for host in "${hosts[@]}"; do
    # shellcheck disable=SC2086  # the agent may carry options ("ssh -o BatchMode=yes")
    if ! timeout "$check_timeout" $agent "$host" true </dev/null >/dev/null 2>&1; then
      say "host $host does not answer ($agent $host true, ${check_timeout} s): left out"
    elif [[ "$check_command" != true ]] &&
      ! why="$(timeout "$check_timeout" $agent "$host" "$check_command" </dev/null 2>&1)"; then
      why="${why//$'\n'/ }"
      say "host $host answers but fails --check_command ($check_command: ${why:-no output}): left out"
    else
      left+=("$host")
    fi
  done
  if ((${#left[@]} < min_hosts || ${#left[@]} == 0)); then
    say "the job failed (exit status $status) and ${#left[@]} hosts answer, fewer than --min_hosts=$min_hosts: giving up"
    exit "$status"
  fi
  restarts=$((restarts + 1))
  if ((${#left[@]} == ${#hosts[@]})); then
    say "the job failed (exit status $status); every host answers: restarting all $ranks ranks from the last checkpoint (restart $restarts of $max_restarts)"
  else
    say "the job failed (exit status $status); restarting on the ${#left[@]} hosts left, $((${#left[@]} * ranks_per_host)) ranks instead of $ranks, from the last checkpoint (restart $restarts of $max_restarts)"
  fi
  hosts=("${left[@]}")
done
