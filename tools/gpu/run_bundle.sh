#!/usr/bin/env bash
# Runs the binaries packed by tools/gpu/build_bundle.sh, on a machine without Bazel (the lent
# GPU machine) or on the build machine itself: every test, then every benchmark with a short
# minimum time. Prints a summary table (binary, passed/failed/skipped, seconds) and the
# benchmark figures; exits non-zero if any test failed. See tools/gpu/README.md.
#
#   tools/gpu/run_bundle.sh                         # everything
#   tools/gpu/run_bundle.sh --filter cuda           # binaries whose name matches a regex
#   tools/gpu/run_bundle.sh --deadline 420          # stop starting binaries after 420 s
#   tools/gpu/run_bundle.sh --no-benchmarks --test-timeout 60
#   tools/gpu/run_bundle.sh --exec tools_bench__train_step --devices=cuda:0   # one binary
#
# Binaries whose name matches --first (default "cuda") run before the others, tests before
# benchmarks, so that a deadline cuts the least important runs.
#
# Environment: BUNDLE (default <repo>/.gpu_bundle), LOGS (default a temporary folder; each
# binary's full output is kept there), BENCHMARK_MIN_TIME (default 0.05 seconds),
# TANDEM_BUNDLE_LOADER=system|bundled (default: system, bundled if the system's glibc is
# too old for the binaries).
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bundle="${BUNDLE:-$root/.gpu_bundle}"
filter="."
first="cuda"
run_benchmarks=1
test_timeout=120
benchmark_timeout=180
deadline=0  # seconds; 0: none
benchmark_min_time="${BENCHMARK_MIN_TIME:-0.05}"
exec_name=""
usage="usage: $0 [--filter REGEX] [--first REGEX] [--no-benchmarks] [--test-timeout SECONDS]
       [--benchmark-timeout SECONDS] [--deadline SECONDS]
   or: $0 --exec BINARY [ARGS...]   (one bundled binary, e.g. tools_bench__train_step)"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --filter) filter="$2"; shift 2 ;;
    --first) first="$2"; shift 2 ;;
    --no-benchmarks) run_benchmarks=0; shift ;;
    --test-timeout) test_timeout="$2"; shift 2 ;;
    --benchmark-timeout) benchmark_timeout="$2"; shift 2 ;;
    --deadline) deadline="$2"; shift 2 ;;
    --exec) exec_name="$2"; shift 2; break ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
started=$SECONDS

log() { printf '[run_bundle] %s\n' "$*" >&2; }
[[ -f "$bundle/payload.tar.xz" && -f "$bundle/manifest.tsv" ]] ||
  { log "no bundle in $bundle: run tools/gpu/build_bundle.sh first"; exit 2; }

work="$(mktemp -d "${TMPDIR:-/tmp}/tandem-run.XXXXXX")"
logs="${LOGS:-$work/logs}"
mkdir -p "$logs"
trap 'rm -rf "$work/bin" "$work/lib"' EXIT
# xz where the machine has it, else Python's lzma (the GPU machine's image has Python).
if command -v xz >/dev/null; then
  xz -dc "$bundle/payload.tar.xz" | tar -C "$work" -xf -
else
  python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), sys.stdout.buffer)' \
    "$bundle/payload.tar.xz" | tar -C "$work" -xf -
fi
sed 's/^/[bundle] /' "$bundle/BUILD_INFO" >&2

# ---- Libraries -------------------------------------------------------------------------------
lib_path="$work/lib"
for cuda_lib in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
  [[ -d "$cuda_lib" ]] && lib_path="$lib_path:$cuda_lib"
done
if awk -F'\t' '$4 == "nccl"' "$bundle/manifest.tsv" | grep -q .; then
  # NCCL is not in the bundle (218 MB): take the system's, or PyTorch's wheel's.
  nccl="$(ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2 / {print $NF; exit}')"
  if [[ -z "$nccl" ]] && command -v python3 >/dev/null; then
    nccl="$(python3 - <<'EOF' 2>/dev/null
import glob, os, site
roots = site.getsitepackages() + [site.getusersitepackages()]
for root in roots:
    for hit in glob.glob(os.path.join(root, "nvidia", "nccl", "lib", "libnccl.so.2")) + \
               glob.glob(os.path.join(root, "torch", "lib", "libnccl.so.2")):
        print(hit)
        raise SystemExit
EOF
)"
  fi
  if [[ -n "$nccl" ]]; then
    log "NCCL: $nccl"
    lib_path="$lib_path:$(dirname "$nccl")"
  else
    log "NCCL not found: binaries that need it will fail to start"
  fi
fi
export LD_LIBRARY_PATH="$lib_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# The binaries were linked against the build machine's glibc. If this machine's is older,
# start them through the bundled loader and C library instead.
loader_mode="${TANDEM_BUNDLE_LOADER:-}"
probe="$(awk -F'\t' 'NR == 1 {print $2}' "$bundle/manifest.tsv")"
if [[ -z "$loader_mode" ]]; then
  loader_mode=system
  if ! "$work/bin/$probe" --help </dev/null >/dev/null 2>"$work/probe.err" &&
      grep -q 'GLIBC' "$work/probe.err"; then
    loader_mode=bundled
  fi
fi
launch=()
if [[ "$loader_mode" == bundled ]]; then
  loader="$(ls "$work"/lib/glibc/ld-linux* | head -n1)"
  launch=("$loader" --library-path "$work/lib/glibc:$LD_LIBRARY_PATH")
  log "starting binaries through the bundled loader ($loader)"
fi

if [[ -n "$exec_name" ]]; then
  [[ -x "$work/bin/$exec_name" ]] || {
    log "no binary $exec_name in the bundle; it has: $(ls "$work/bin" | tr '\n' ' ')"
    exit 2
  }
  "${launch[@]}" "$work/bin/$exec_name" "$@" </dev/null
  exit $?
fi

if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null |
    sed 's/^/[gpu] /' >&2
else
  log "no nvidia-smi: GPU tests will skip"
fi

# The manifest's entries of one kind: those matching --first, then by package, the most
# basic first (a deadline then cuts the runs that depend on the others).
entries() {
  awk -F'\t' -v kind="$1" '$1 == kind' "$bundle/manifest.tsv" >"$work/entries"
  awk -F'\t' -v first="$first" '$2 ~ first' "$work/entries"
  awk -F'\t' -v first="$first" '$2 !~ first' "$work/entries" |
    awk -F'\t' '{rank = 9; n = split("tensor parallel nn data", p, " ");
                 for (i = 1; i <= n; ++i) if (index($2, p[i] "_") == 1) { rank = i; break }
                 print rank "\t" $0}' |
    sort -s -t$'\t' -k1,1n | cut -f2-
}

# Seconds a binary may run: its own timeout, cut to what is left before the deadline;
# 0 once the deadline has passed.
budget() {
  local limit=$1
  if [[ $deadline -gt 0 ]]; then
    local left=$((deadline - (SECONDS - started)))
    [[ $left -le 0 ]] && { echo 0; return; }
    [[ $left -lt $limit ]] && limit=$left
  fi
  echo "$limit"
}
not_run=()

# ---- Tests ------------------------------------------------------------------------------------
# Multi-device tests run on two logical CUDA devices mapped onto GPU 0.
multi_device_regex='multi_device|parallel|replicate|scatter|gather|comm|data_parallel'

# Per-test result lines of gtest's output ("[  SKIPPED ] Suite.Test (3 ms)"); the summary
# at the end repeats failed and skipped tests without the duration, so those do not count.
count() { grep -cE "^\[ +$1 +\] [^ ]+\.[^ ]+ \([0-9]+ ms\)\$" "$2" || true; }

printf '\n%-44s %7s %7s %7s %9s  %s\n' binary passed failed skipped seconds status
failures=0
total_passed=0 total_failed=0 total_skipped=0
while IFS=$'\t' read -r kind name label needs; do
  [[ "$name" =~ $filter ]] || continue
  limit=$(budget "$test_timeout")
  if [[ $limit -eq 0 ]]; then
    not_run+=("$name")
    continue
  fi
  output="$logs/$name.log"
  env_vars=()
  [[ "$name" =~ $multi_device_regex ]] && env_vars+=(TANDEM_CUDA_LOGICAL_DEVICES=2)
  start=$(date +%s.%N)
  env "${env_vars[@]}" timeout "$limit" "${launch[@]}" "$work/bin/$name" \
    --gtest_color=no </dev/null >"$output" 2>&1
  rc=$?
  seconds=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN {printf "%.1f", e - s}')
  passed=$(count OK "$output")
  failed=$(count FAILED "$output")
  skipped=$(count SKIPPED "$output")
  total_passed=$((total_passed + passed))
  total_failed=$((total_failed + failed))
  total_skipped=$((total_skipped + skipped))
  status=ok
  if [[ $rc -eq 124 ]]; then
    status="TIMEOUT after ${limit}s"
  elif [[ $rc -ne 0 ]]; then
    status="FAILED (exit $rc)"
  fi
  [[ $rc -ne 0 ]] && failures=$((failures + 1))
  [[ ${#env_vars[@]} -gt 0 ]] && status="$status [${env_vars[*]}]"
  printf '%-44s %7s %7s %7s %9s  %s\n' "$name" "$passed" "$failed" "$skipped" "$seconds" "$status"
  if [[ $rc -ne 0 ]]; then
    grep -E '^\[  FAILED  \]|Failure|rror' "$output" | head -n 20 | sed 's/^/    /'
    tail -n 5 "$output" | sed 's/^/    | /'
  fi
done < <(entries test)
printf '%-44s %7s %7s %7s\n' total "$total_passed" "$total_failed" "$total_skipped"

# ---- Benchmarks --------------------------------------------------------------------------------
if [[ $run_benchmarks -eq 1 ]]; then
  have_cuda_benchmarks=0
  awk -F'\t' '$1 == "benchmark" {print $2}' "$bundle/manifest.tsv" | grep -q '__cuda_benchmarks$' &&
    have_cuda_benchmarks=1
  while IFS=$'\t' read -r kind name label needs; do
    [[ "$name" =~ $filter ]] || continue
    limit=$(budget "$benchmark_timeout")
    if [[ $limit -eq 0 ]]; then
      not_run+=("$name")
      continue
    fi
    args=(--benchmark_min_time="$benchmark_min_time" --benchmark_color=false)
    # //tensor:tensor_benchmark links the CUDA benchmarks too; run them once.
    if [[ "$name" != *__cuda_benchmarks && $have_cuda_benchmarks -eq 1 ]]; then
      args+=(--benchmark_filter=-BM_Cuda)
    fi
    printf '\n==== %s (%s)\n' "$name" "$label"
    output="$logs/$name.log"
    timeout "$limit" "${launch[@]}" "$work/bin/$name" "${args[@]}" </dev/null >"$output" 2>&1
    rc=$?
    cat "$output"
    if [[ $rc -eq 124 ]]; then
      echo "benchmark $name: TIMEOUT after ${limit}s"
      failures=$((failures + 1))
    elif [[ $rc -ne 0 ]]; then
      echo "benchmark $name exited with $rc"
      failures=$((failures + 1))
    fi
  done < <(entries benchmark)
fi

for name in "${not_run[@]}"; do log "not run (deadline of ${deadline}s reached): $name"; done

echo
log "logs: $logs"
if [[ $failures -gt 0 || ${#not_run[@]} -gt 0 ]]; then
  log "$failures binaries failed, ${#not_run[@]} not run"
  exit 1
fi
log "all binaries passed"
