#!/usr/bin/env bash
# Keeps Bazel's shared --disk_cache (.bazelrc: ~/.cache/tandem-bazel-disk) under a size cap.
# Bazel 4.2.3 never deletes from a disk cache, and every checkout, sanitizer config and the
# CUDA simulator add to it: left alone it grew past 50 GB here and filled the disk. The files
# written longest ago go first (an entry Bazel needs again is rebuilt and written anew).
#
#   bash tools/prune_disk_cache.sh            # cap 30 GB (TANDEM_DISK_CACHE_CAP_MB=30720)
#   bash tools/prune_disk_cache.sh --cap_mb=10240 --dir=/path/to/cache
set -euo pipefail
dir="${HOME:-$(getent passwd "$(id -u)" | cut -d: -f6)}/.cache/tandem-bazel-disk"
cap_mb="${TANDEM_DISK_CACHE_CAP_MB:-30720}"
for arg in "$@"; do
  case "$arg" in
    --cap_mb=*) cap_mb="${arg#*=}" ;;
    --dir=*) dir="${arg#*=}" ;;
    *) echo "prune_disk_cache: unknown option '$arg' (--cap_mb=N, --dir=PATH)" >&2; exit 2 ;;
  esac
done
[[ "$cap_mb" =~ ^[0-9]+$ ]] || { echo "prune_disk_cache: --cap_mb must be a whole number of MB but is '$cap_mb'" >&2; exit 2; }
[[ -d "$dir" ]] || exit 0
cap=$((cap_mb * 1024 * 1024))
# Every file with its modification time and size, oldest first; delete until the rest fits.
total=0
while read -r _ size _; do total=$((total + size)); done < <(find "$dir" -type f -printf '%T@ %s %p\n')
if ((total <= cap)); then
  echo "prune_disk_cache: $dir holds $((total >> 20)) MB, under the cap of $cap_mb MB"
  exit 0
fi
before=$total
# (A process substitution: leaving the loop early must not fail the script on sort's SIGPIPE.)
while read -r _ size path; do
  ((total > cap)) || break
  rm -f -- "$path"
  total=$((total - size))
done < <(find "$dir" -type f -printf '%T@ %s %p\n' | sort -n)
after=0
while read -r _ size _; do after=$((after + size)); done < <(find "$dir" -type f -printf '%T@ %s %p\n')
echo "prune_disk_cache: $dir went from $((before >> 20)) MB to $((after >> 20)) MB (cap $cap_mb MB)"
