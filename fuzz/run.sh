#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ with clang-14 (-fsanitize=fuzzer,address,undefined:
# `bazel build --config=fuzz`, see .bazelrc) and runs each for a bounded time, printing its
# executions. Exits non-zero when a target crashes (a sanitizer report, an uncaught
# exception, a broken property, a leak, a timeout); the input that did it is kept in the
# artifacts folder and printed: copy it to fuzz/regressions/<target>/ and fix the bug.
#
#   bash fuzz/run.sh                     # every target, 30 s each
#   bash fuzz/run.sh idx_fuzzer 120      # one target, 2 minutes
#   bash fuzz/run.sh all 10              # every target, 10 s each
#
# Environment: TANDEM_FUZZ_OUTPUT_BASE (default ~/.cache/bazel/_tandem_fuzz/<hash of this
# checkout>), TANDEM_FUZZ_ARTIFACTS (default $TMPDIR/tandem-fuzz-artifacts).
#
# Why an output base of its own: --config=fuzz sets --repo_env=CC=clang-14, which makes
# Bazel reconfigure its C++ toolchain; in the main output base every switch between gcc and
# clang would redo that and discard the other build's analysis. The separate output base
# keeps both warm, and the shared --disk_cache keeps clang's objects between checkouts.
# The Bazel server of that output base is shut down at the end.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root="$PWD"

if ! command -v clang-14 >/dev/null 2>&1; then
  echo "fuzz/run.sh: clang-14 not found; install it with: bash tools/setup.sh" >&2
  exit 1
fi

targets=(checkpoint_fuzzer device_fuzzer flags_fuzzer idx_fuzzer)
seconds=30
if [[ $# -ge 1 && -n "$1" && "$1" != all ]]; then targets=("$1"); fi
if [[ $# -ge 2 ]]; then seconds="$2"; fi

output_base="${TANDEM_FUZZ_OUTPUT_BASE:-$HOME/.cache/bazel/_tandem_fuzz/$(printf '%s' "$root" | md5sum | cut -c1-32)}"
artifacts="${TANDEM_FUZZ_ARTIFACTS:-${TMPDIR:-/tmp}/tandem-fuzz-artifacts}"
work="$(mktemp -d "${TMPDIR:-/tmp}/tandem-fuzz.XXXXXX")"
bazel_fuzz() { bazel --output_base="$output_base" "$@"; }
cleanup() {
  bazel_fuzz shutdown >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$artifacts"

labels=()
for t in "${targets[@]}"; do labels+=("//fuzz:$t"); done
build_start=$SECONDS
# gold's "Cannot export local symbol '__asan_...'" warnings are harmless and many: dropped.
if ! bazel_fuzz build --config=fuzz "${labels[@]}" 2>&1 | grep -v "Cannot export local symbol"; then
  echo "fuzz/run.sh: building the fuzz targets with clang-14 failed" >&2
  exit 1
fi
bin="$(bazel_fuzz info --config=fuzz bazel-bin 2>/dev/null)/fuzz"
echo "fuzz/run.sh: built ${#targets[@]} target(s) in $((SECONDS - build_start)) s"

failed=0
for t in "${targets[@]}"; do
  name="${t%_fuzzer}"
  corpus=("$work/$name" "fuzz/corpus/$name")
  mkdir -p "$work/$name"
  if [[ -d "fuzz/regressions/$name" ]]; then corpus+=("fuzz/regressions/$name"); fi
  log="$work/$name.log"
  set +e
  # New inputs go to $work (the first folder), never into the tree's corpus.
  OPENBLAS_NUM_THREADS=1 "$bin/$t" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2560 \
    -print_final_stats=1 -artifact_prefix="$artifacts/$t-" "${corpus[@]}" >"$log" 2>&1
  rc=$?
  set -e
  runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")"
  rate="$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")"
  found="$(ls "$work/$name" | wc -l)"
  if [[ $rc -eq 0 ]]; then
    echo "$t: ${runs:-?} executions in $seconds s (${rate:-?}/s), no crash; $found new input(s) kept in the run's corpus"
  else
    failed=1
    echo "$t: CRASHED (exit code $rc) after ${runs:-?} executions; the end of its log:"
    tail -n 40 "$log"
    grep -h "Test unit written to" "$log" || true
    echo "$t: copy that input to fuzz/regressions/$name/ (bazel test //fuzz:${t}_test replays it)"
  fi
done
exit "$failed"
