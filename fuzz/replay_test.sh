#!/usr/bin/env bash
# Replays a fuzz target's inputs (its seed corpus and the inputs of past crashes) through
# the target built with fuzz:standalone_main: fails if any input crashes it.
#   replay_test.sh FUZZER FOLDER...   (folders that do not exist are skipped)
set -euo pipefail
fuzzer="$1"
shift
folders=()
for folder in "$@"; do
  if [[ -d "$folder" ]]; then folders+=("$folder"); fi
done
if [[ ${#folders[@]} -eq 0 ]]; then
  echo "replay_test.sh: none of $* exists; expected at least the seed corpus" >&2
  exit 1
fi
exec "$fuzzer" "${folders[@]}"
