#!/bin/bash
# Runs examples/train_gpt_minimal for a few steps (TANDEM_MINIMAL_STEPS) and checks that the
# validation loss after training is below the one before, and that a sample is printed.
# Skips (passes) without Debian's fortunes package, as the trainer's tests do.
set -euo pipefail
binary="$1"
if [[ ! -d /usr/share/games/fortunes ]]; then
  echo "SKIP: /usr/share/games/fortunes is missing (apt-get install fortunes)"
  exit 0
fi
out="$(TANDEM_MINIMAL_STEPS=40 "$binary")"
echo "$out"
first="$(grep -m1 ' val loss ' <<<"$out" | awk '{print $5}')"
last="$(grep ' val loss ' <<<"$out" | tail -1 | awk '{print $5}')"
grep -q '^sample: The meaning of life is' <<<"$out" || { echo "FAIL: no sample line"; exit 1; }
if ! awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.5) }'; then
  echo "FAIL: expected the validation loss to drop by more than 0.5 over 40 steps, but it went" \
       "from $first to $last"
  exit 1
fi
echo "PASS: validation loss $first -> $last"
