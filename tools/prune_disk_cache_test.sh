#!/usr/bin/env bash
# tools/prune_disk_cache.sh deletes the files written longest ago until the cache fits its cap,
# leaves a cache under the cap alone, and refuses bad options.
set -euo pipefail
prune="$1"
fail() { echo "FAIL: $*"; exit 1; }
dir="${TEST_TMPDIR:-$(mktemp -d)}/cache"
mkdir -p "$dir/ac" "$dir/cas"
for i in 1 2 3 4; do
  head -c 1048576 /dev/zero >"$dir/cas/f$i"
  touch -d "$((5 - i)) hours ago" "$dir/cas/f$i"  # f1 oldest
done
bash "$prune" --dir="$dir" --cap_mb=10 | grep -q "under the cap of 10 MB" || fail "a cache under its cap was touched"
[[ "$(ls "$dir/cas" | wc -l)" == 4 ]] || fail "files went from a cache under its cap"
out="$(bash "$prune" --dir="$dir" --cap_mb=2)"
echo "$out"
[[ "$(ls "$dir/cas")" == "$(printf 'f3\nf4')" ]] || fail "expected the two newest files to stay, found: $(ls "$dir/cas")"
grep -q "went from 4 MB to 2 MB (cap 2 MB)" <<<"$out" || fail "unexpected report: $out"
# Thousands of entries (3000 KB), most of them kept under a 2 MB cap: the script stops early
# and still succeeds.
many="$dir/many"
mkdir -p "$many"
kib="$(printf '%1024s' '')"  # written by the shell itself: no process per entry
for i in $(seq 3000); do printf '%s' "$kib" >"$many/entry_with_a_long_name_$i"; done
touch -d "1 day ago" "$many/entry_with_a_long_name_1"
bash "$prune" --dir="$many" --cap_mb=2 || fail "pruning a large cache failed (exit $?)"
[[ ! -e "$many/entry_with_a_long_name_1" && "$(ls "$many" | wc -l)" == 2048 ]] ||
  fail "expected the oldest entries to go until 2048 KB were left, found $(ls "$many" | wc -l)"
rc=0
bash "$prune" --dir="$dir" --cap_mb=lots 2>/dev/null || rc=$?
[[ $rc == 2 ]] || fail "a bad --cap_mb was not refused (exit $rc)"
bash "$prune" --dir="$dir/none" --cap_mb=1 || fail "a missing cache folder is not an error"
echo PASS
