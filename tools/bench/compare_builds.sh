#!/usr/bin/env bash
# Times train_step of this tree against another build of it (say, main before a change),
# alternated process by process so both see the same machine, for each model and device
# layout, and prints each pair's ratio with the median and range over the rounds (below 1:
# this tree is faster).
#
#   bazel build -c opt --config=cpu //tools/bench:train_step   # in the old tree too
#   BASELINE=/tmp/old/train_step bash tools/bench/compare_builds.sh
#   BASELINE=... ROUNDS=7 MODELS="mlp gpt" bash tools/bench/compare_builds.sh
#
# Each (model, layout) runs ROUNDS pairs, the order within a pair alternating. Layouts:
# "cpu:0 with 2 threads" and "cpu:0,cpu:1 with 1 thread each" (DataParallel).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

baseline=${BASELINE:?set BASELINE to the other build of train_step}
ROUNDS=${ROUNDS:-5}
MODELS=${MODELS:-mlp cnn gpt}
bazel build -c opt --config=cpu //tools/bench:train_step >&2
current=$(bazel info -c opt --config=cpu bazel-bin 2>/dev/null)/tools/bench/train_step

field() { grep -o "\"step_ms_median\":[0-9.]*" | tail -1 | cut -d: -f2; }
median() { sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
flags_of() { # model
  case $1 in
    mlp) echo "--batch_size=256 --steps=100 --warmup=10" ;;
    cnn) echo "--batch_size=64 --steps=10 --warmup=2" ;;
    gpt) echo "--batch_size=16 --steps=10 --warmup=2" ;;
    *) echo "unknown model $1" >&2; exit 1 ;;
  esac
}

printf '%-5s %-26s %6s %12s %12s %8s\n' model layout round "new (ms)" "old (ms)" new/old
summary=()
for model in $MODELS; do
  for layout in "cpu:0 2" "cpu:0,cpu:1 1"; do
    read -r devices threads <<<"$layout"
    # shellcheck disable=SC2046
    run() { "$1" --model="$model" $(flags_of "$model") --devices="$devices" --threads="$threads" | field; }
    ratios=()
    for ((r = 1; r <= ROUNDS; ++r)); do
      if ((r % 2)); then n=$(run "$current"); o=$(run "$baseline"); else o=$(run "$baseline"); n=$(run "$current"); fi
      ratio=$(awk -v a="$n" -v b="$o" 'BEGIN {printf "%.3f", a / b}')
      ratios+=("$ratio")
      printf '%-5s %-26s %6d %12s %12s %8s\n' "$model" "$devices x $threads thr" "$r" "$n" "$o" "$ratio"
    done
    sorted=$(printf '%s\n' "${ratios[@]}" | sort -g)
    summary+=("$(printf '%-5s %-26s new/old median %s (%s-%s, %d pairs)' "$model" \
      "$devices x $threads thr" "$(printf '%s\n' "${ratios[@]}" | median)" \
      "$(head -1 <<<"$sorted")" "$(tail -1 <<<"$sorted")" "$ROUNDS")")
  done
done
printf '\nsummary (%s, load %s)\n' "$(date -u +%F)" "$(cut -d' ' -f1-3 /proc/loadavg)"
printf '  %s\n' "${summary[@]}"
