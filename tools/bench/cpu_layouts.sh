#!/usr/bin/env bash
# cpu_layouts.sh: is DataParallel over N logical CPU devices (1 thread each) at least as fast
# as one CPU device with N threads, at the same batch? Runs train_step in the two layouts,
# alternated process by process (so both see the same machine, even a loaded one), and prints
# each round's medians, then the median of the rounds' ratios and their range.
#
#   bazel build -c opt //tools/bench:train_step
#   tools/bench/cpu_layouts.sh                          # MLP, batch 256, 2 cores, 5 rounds
#   MODEL=cnn BATCH=128 ROUNDS=7 tools/bench/cpu_layouts.sh
#
# ratio = (one device, N threads) / (N devices, 1 thread): above 1 means the devices win.
set -euo pipefail

MODEL="${MODEL:-mlp}"
BATCH="${BATCH:-256}"
N="${N:-2}"
ROUNDS="${ROUNDS:-5}"
STEPS="${STEPS:-30}"
WARMUP="${WARMUP:-5}"
BIN="${BIN:-bazel-bin/tools/bench/train_step}"
EXTRA="${EXTRA:-}"  # more train_step flags for both layouts

if [[ ! -x "$BIN" ]]; then
  echo "cpu_layouts.sh: expected the train_step binary at $BIN; build it with" \
    "'bazel build -c opt //tools/bench:train_step' or set BIN" >&2
  exit 2
fi
many=""
for ((i = 0; i < N; ++i)); do many+="${many:+,}cpu:$i"; done

# Median step time (ms) of one train_step run, from its last line (a JSON object).
step_ms() {
  # shellcheck disable=SC2086
  "$BIN" --model="$MODEL" --batch_size="$BATCH" --steps="$STEPS" --warmup="$WARMUP" \
    --compare=false $EXTRA "$@" | tail -n 1 |
    sed -n 's/.*"step_ms_median":\([0-9.]*\).*/\1/p'
}

ratios=()
printf '%s batch %s: cpu:0 with %s threads against %s with 1 thread each, %s rounds\n' \
  "$MODEL" "$BATCH" "$N" "$many" "$ROUNDS"
printf '  %5s %12s %12s %7s\n' round "1 device" "$N devices" ratio
for ((r = 1; r <= ROUNDS; ++r)); do
  # Alternate which layout goes first, so that neither always follows the other.
  if ((r % 2)); then
    one=$(step_ms --devices=cpu:0 --threads="$N")
    dev=$(step_ms --devices="$many" --threads=1)
  else
    dev=$(step_ms --devices="$many" --threads=1)
    one=$(step_ms --devices=cpu:0 --threads="$N")
  fi
  ratio=$(awk -v a="$one" -v b="$dev" 'BEGIN { printf "%.3f", a / b }')
  ratios+=("$ratio")
  printf '  %5d %9.2f ms %9.2f ms %7s\n' "$r" "$one" "$dev" "$ratio"
done
printf '%s\n' "${ratios[@]}" | sort -n | awk '
  { v[NR] = $1 }
  END {
    m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
    printf "ratio (1 device / %s devices): median %.3f, range %.3f-%.3f over %d rounds\n",
      "'"$N"'", m, v[1], v[NR], NR
  }'
