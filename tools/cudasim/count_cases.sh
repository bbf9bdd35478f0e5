#!/usr/bin/env bash
# Counts the test cases that ran under --config=cudasim, from gtest's XML reports, and fails if
# any was skipped (under the simulator every CUDA case must run) or if none ran.
#
#   bazel test --config=cudasim <targets>
#   bash tools/cudasim/count_cases.sh [testlogs dir] [CPU testlogs dir]
#
# The first directory defaults to bazel-out/k8-fastbuildcudasim/testlogs (where
# --config=cudasim writes). The second (default bazel-out/k8-fastbuild/testlogs) holds a run
# of the same targets without a GPU (e.g. --config=cpu): the cases that did not run there but
# ran here are the GPU cases, and the few that ran there but skip here are CPU-only cases
# (they skip where CUDA is present) and allowed. Without it, every case is counted and no
# skip is allowed. The NCCL cases among the GPU cases are those of test targets named *nccl*
# (parallel:nccl_test, tools/cudasim:nccl_test, process_group_nccl_test under mpirun) and cases
# named *Nccl* elsewhere (cuda_libs_test's). Prints, for example:
#   cudasim: 300 GPU cases ran (60 NCCL), 0 skipped (412 cases in 24 test targets; 3 CPU-only ...)
set -euo pipefail

sim_logs="${1:-bazel-out/k8-fastbuildcudasim/testlogs}"
cpu_logs="${2:-bazel-out/k8-fastbuild/testlogs}"

if [[ ! -d "$sim_logs" ]]; then
  echo "cudasim: no test logs at $sim_logs: run bazel test --config=cudasim first" >&2
  exit 1
fi

# One line per test case: "<target path>|<suite>.<case> <status>", status run or skipped.
cases() {
  local logs="$1"
  find -L "$logs" -name test.xml | sort | while read -r xml; do
    local target="${xml#"$logs"/}"
    target="${target%/test.xml}"
    # gtest writes one <testcase .../> element per line.
    grep -o '<testcase [^>]*' "$xml" | while read -r line; do
      local name classname result status
      name="$(sed -n 's/.* name="\([^"]*\)".*/\1/p' <<<"$line")"
      classname="$(sed -n 's/.* classname="\([^"]*\)".*/\1/p' <<<"$line")"
      result="$(sed -n 's/.* result="\([^"]*\)".*/\1/p' <<<"$line")"
      status="$(sed -n 's/.* status="\([^"]*\)".*/\1/p' <<<"$line")"
      if [[ "$result" == "skipped" || "$status" == "notrun" ]]; then
        echo "$target|$classname.$name skipped"
      else
        echo "$target|$classname.$name run"
      fi
    done
  done
}

sim="$(cases "$sim_logs")"
if [[ -z "$sim" ]]; then
  echo "cudasim: no test cases found under $sim_logs" >&2
  exit 1
fi
targets="$(cut -d'|' -f1 <<<"$sim" | sort -u | wc -l)"
total="$(wc -l <<<"$sim")"
ran="$(grep ' run$' <<<"$sim" | sed 's/ run$//' | sort -u || true)"
skipped="$(grep ' skipped$' <<<"$sim" | sed 's/ skipped$//' | sort -u || true)"
count() { if [[ -z "$1" ]]; then echo 0; else wc -l <<<"$1"; fi; }

# Without a GPU (the CPU run's logs), a case that ran there and skips here is a CPU-only case
# (it skips where CUDA is present); a case that skipped there, or whose target is not built
# there (cuda_cc_test under --config=cpu), and runs here is a GPU case.
gpu="$ran"
cpu_only=""
if [[ -d "$cpu_logs" ]] && [[ -n "$(find -L "$cpu_logs" -name test.xml -print -quit)" ]]; then
  cpu="$(cases "$cpu_logs")"
  cpu_ran="$(grep ' run$' <<<"$cpu" | sed 's/ run$//' | sort -u || true)"
  gpu="$(comm -23 <(echo "$ran") <(echo "$cpu_ran") | sed '/^$/d')"
  cpu_only="$(comm -12 <(echo "$skipped") <(echo "$cpu_ran") | sed '/^$/d')"
  skipped="$(comm -23 <(echo "$skipped") <(echo "$cpu_ran") | sed '/^$/d')"
fi

nccl="$(grep -i 'nccl' <<<"$gpu" || true)"
echo "cudasim: $(count "$gpu") GPU cases ran ($(count "$nccl") NCCL), $(count "$skipped") skipped" \
  "($total cases in $targets test targets; $(count "$cpu_only") CPU-only cases skip where" \
  "CUDA is present)"
if [[ -n "$skipped" ]]; then
  echo "cudasim: skipped under the simulator (every CUDA case must run there):" >&2
  sed 's/^/  /' <<<"$skipped" >&2
  exit 1
fi
if [[ -z "$gpu" ]]; then
  echo "cudasim: no GPU case ran" >&2
  exit 1
fi
