#!/usr/bin/env bash
# Builds every test and benchmark binary of //tensor, //nn, //data, //parallel and
# //tools/cuda/tests (those that exist: NCCL's in-process tests among them) with -c opt and
# packs them, with the shared libraries they need that a GPU machine without Bazel or Debian
# packages lacks, into .gpu_bundle/ (git-ignored), for tools/gpu/run_bundle.sh to run there.
# The tests that run ranks under mpirun (process_group_nccl_test) are not cc_tests and need
# Open MPI, which the GPU machine lacks: they are left out. See tools/gpu/README.md.
#
#   tools/gpu/build_bundle.sh                 # all packages
#   tools/gpu/build_bundle.sh //tensor/...    # only these patterns
#   tools/gpu/build_bundle.sh --cuda-only     # only the tests that mention CUDA
#
# Layout of .gpu_bundle/:
#   payload.tar.xz   bin/<package>__<name>   the binaries (stripped)
#                    lib/                     Bazel's per-library .so files, Abseil,
#                                             Google Benchmark, OpenBLAS, libstdc++, ...
#                    lib/glibc/               this machine's C library and loader, used only
#                                             if the GPU machine's glibc is too old
#   manifest.tsv     kind (test|benchmark|tool), binary, label, extra library needs (nccl)
#   BUILD_INFO       when, from which commit, with which toolchain
# Everything is compressed into one payload, with xz and a dictionary that spans many
# binaries: every test binary carries the same ~9 MB of CUDA kernels and libraries linked in,
# which such a dictionary stores once (42 CUDA tests: 450 MiB unpacked, 110 MiB gzipped, 22 MiB
# this way), and what travels to the GPU machine is capped at 64 MiB.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
out="$root/.gpu_bundle"
max_bytes=$((60 * 1024 * 1024))  # leave room under the 64 MiB transfer cap

log() { printf '[build_bundle] %s\n' "$*" >&2; }

# ---- What to build ------------------------------------------------------------------
# --cuda-only: only the tests whose source (foo_test.cc or .cu beside its BUILD) mentions
# CUDA, and no benchmarks: the others run the same on every machine and CI runs them, so a
# short lease need not wait for them to build (42 of 103 tests on 2026-12-04).
cuda_only=0
if [[ "${1:-}" == --cuda-only ]]; then
  cuda_only=1
  shift
fi
patterns=("$@")
# Programs that the GPU check runs by name (tools/gpu/gpu_check.sh).
tool_binaries=(//tools/bench:train_step)
if [[ ${#patterns[@]} -eq 0 ]]; then
  for package in tensor nn data parallel tools/cuda/tests; do
    [[ -f "$package/BUILD" || -f "$package/BUILD.bazel" ]] && patterns+=("//$package/...")
  done
fi
scope="$(printf ' + %s' "${patterns[@]}")"
scope="${scope:3}"
log "scope: $scope"

# Tests (not tagged manual) and benchmark binaries (cc_binary named *_benchmark(s)).
tests="$(bazel query --noshow_progress "kind('cc_test rule', $scope) except attr(tags, 'manual', $scope)" 2>/dev/null | sort)"
benchmarks="$(bazel query --noshow_progress "attr(name, '_benchmarks?\$', kind('cc_binary rule', $scope))" 2>/dev/null | sort)"
if [[ $cuda_only -eq 1 ]]; then
  kept=""
  for test in $tests; do
    package="${test%%:*}"
    source=""
    for candidate in "${package#//}/${test##*:}".{cc,cu}; do
      [[ -f "$candidate" ]] && source="$candidate" && break
    done
    # A test whose source is not where the convention puts it is kept.
    if [[ -z "$source" ]] || grep -qi cuda "$source"; then kept+="$test"$'\n'; fi
  done
  tests="$kept"
  benchmarks=""
fi
targets=($tests $benchmarks "${tool_binaries[@]}")
[[ ${#targets[@]} -gt 0 ]] || { log "no test or benchmark targets in $scope"; exit 1; }
log "$(wc -w <<<"$tests") tests, $(wc -w <<<"$benchmarks") benchmarks"

# -c opt for real timings. --symlink_prefix=/ keeps bazel-bin & co pointing where they
# were (others may be using them). --keep_going: a package that does not build yet
# (work in progress) must not keep the others off the GPU; it is listed as missing.
build_flags=(-c opt --symlink_prefix=/)
bin_dir="$(bazel info "${build_flags[@]}" bazel-bin 2>/dev/null)"
set +e
bazel build "${build_flags[@]}" --keep_going "${targets[@]}"
build_rc=$?
set -e
[[ $build_rc -eq 0 ]] || log "bazel build exited with $build_rc; bundling what was built"

# ---- Collect binaries and the libraries they load ------------------------------------
stage="$(mktemp -d "${TMPDIR:-/tmp}/tandem-bundle.XXXXXX")"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib/glibc"
manifest="$stage/manifest.tsv"
: >"$manifest"
declare -A libs=()       # resolved path -> soname
declare -A glibc_libs=()
missing=()

# The GPU machine has the CUDA toolkit's libraries (cudart, cuBLAS) and the driver; NCCL
# only inside PyTorch's environment (run_bundle.sh finds it). Everything else is shipped;
# the C library and loader go to lib/glibc for the old-glibc fallback only.
classify() {  # soname path -> skip | nccl | glibc | ship
  case "$1" in
    linux-vdso.so.*) echo skip ;;
    libcuda.so.*|libcudart.so.*|libcublas.so.*|libcublasLt.so.*|libnvJitLink.so.*) echo skip ;;
    libnccl.so.*) echo nccl ;;
    libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|libresolv.so.*|ld-linux*) echo glibc ;;
    *) echo ship ;;
  esac
}

for target in "${targets[@]}"; do
  package="${target%%:*}"
  package="${package#//}"
  name="${target##*:}"
  binary="$bin_dir/$package/$name"
  if [[ ! -x "$binary" ]]; then
    missing+=("$target")
    continue
  fi
  kind=test
  grep -qxF "$target" <<<"$benchmarks" && kind=benchmark
  [[ " ${tool_binaries[*]} " == *" $target "* ]] && kind=tool
  bundled_name="${package//\//_}__${name//\//_}"
  cp "$binary" "$stage/bin/$bundled_name"
  needs=""
  # ldd resolves Bazel's _solib_k8 libraries through the binary's RUNPATH.
  while read -r soname arrow path _; do
    [[ "$arrow" == "=>" && -n "$path" && "$path" != "not" ]] || continue
    case "$(classify "$soname")" in
      skip) ;;
      nccl) needs="nccl" ;;
      glibc) glibc_libs["$path"]="$soname" ;;
      ship) libs["$path"]="$soname" ;;
    esac
  done < <(ldd "$binary")
  # The loader has no "=>" line.
  loader="$(ldd "$binary" | awk '/ld-linux/ && !/=>/ {print $1}' | head -n1)"
  [[ -n "$loader" ]] && glibc_libs["$loader"]="$(basename "$loader")"
  printf '%s\t%s\t%s\t%s\n' "$kind" "$bundled_name" "$target" "${needs:--}" >>"$manifest"
done

for path in "${!libs[@]}"; do cp -L "$path" "$stage/lib/${libs[$path]}"; done
for path in "${!glibc_libs[@]}"; do cp -L "$path" "$stage/lib/glibc/${glibc_libs[$path]}"; done
# Smaller payload; the binaries keep their dynamic symbols, which is all they need.
strip --strip-unneeded "$stage"/bin/* "$stage"/lib/*.so* 2>/dev/null || true
chmod +x "$stage"/bin/* "$stage"/lib/glibc/ld-linux* 2>/dev/null || true

{
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "scope: $scope"
  echo "compiler: $(gcc --version | head -n1)"
  echo "nvcc: $(/usr/local/cuda/bin/nvcc --version 2>/dev/null | tail -n1 || echo none)"
  echo "glibc: $(ldd --version | head -n1)"
  for target in "${missing[@]}"; do echo "missing (did not build): $target"; done
} >"$stage/BUILD_INFO"

# ---- Pack ---------------------------------------------------------------------------------
rm -rf "$out"
mkdir -p "$out"
log "compressing (xz, one stream, 192 MiB dictionary: a few minutes)"
tar -C "$stage" -cf - bin lib | xz -T1 --lzma2=preset=6,dict=192MiB >"$out/payload.tar.xz"
cp "$manifest" "$stage/BUILD_INFO" "$out/"
unpacked="$(du -sb "$stage/bin" "$stage/lib" | awk '{s += $1} END {print s}')"
packed="$(du -sb "$out" | awk '{print $1}')"
log "$(grep -c . "$manifest") binaries, $(ls "$stage/lib" | wc -l) libraries;" \
  "$((unpacked / 1048576)) MiB unpacked, $((packed / 1048576)) MiB in $out"
for target in "${missing[@]}"; do log "missing (did not build): $target"; done
if [[ $packed -gt $max_bytes ]]; then
  log "ERROR: the bundle is $((packed / 1048576)) MiB, over the $((max_bytes / 1048576)) MiB budget"
  exit 1
fi
[[ $build_rc -eq 0 ]]
