#!/usr/bin/env bash
# Times the same training step in Tandem and in libtorch (PyTorch's C++ API, Debian's
# libtorch-dev 1.13) side by side on this machine: the MLP 784-256-128-10 at batch 256,
# cross-entropy, SGD with momentum 0.9 (MODEL=mlp), or GPT-2 124M at batch 4 x 64 tokens,
# cross-entropy, AdamW lr 6e-4 weight decay 0.1 (MODEL=gpt2; examples/gpt.h and its libtorch
# twin in libtorch_train_step.cc), on the CPU with 2 threads (Tandem: one CPU device,
# --threads=2; libtorch: torch::set_num_threads(2)). Rounds alternate the programs so both
# see the same machine; it prints each round's medians, the median over rounds and
# Tandem's step time as a fraction of libtorch's (below 1: Tandem is faster).
#
# AUTOCAST=bf16 runs both forwards and losses under their CPU autocast to bfloat16, backward
# and the optimizer outside (Tandem: train_step --autocast=bf16; libtorch: its at::autocast,
# as torch.autocast("cpu", dtype=torch.bfloat16)); empty (the default) runs both in float32.
# With it, train_step also times a float32 step alternated with the bf16 one after its own
# timed steps (it has no flag to skip that), so a Tandem run takes about three times as many
# steps; the figure compared is its JSON's step_ms_median, the bf16 step timed alone.
#
#   bash tools/bench/compare_libtorch.sh                 # ROUNDS=5 BATCH=256 THREADS=2 STEPS=50
#   MODEL=gpt2 bash tools/bench/compare_libtorch.sh      # BATCH=4 TOKENS=64 STEPS=10 WARMUP=2
#   MODEL=gpt2 AUTOCAST=bf16 bash tools/bench/compare_libtorch.sh
#   BASELINE=/tmp/old/train_step bash tools/bench/compare_libtorch.sh
#
# BASELINE names another build of train_step (say, main's before a change): each round then
# runs it too, alternated with the rest, and the summary adds this tree's step over its step
# (with AUTOCAST, the baseline must know --autocast too).
#
# libtorch at its best: PyTorch's CPU tuning guide has it run with tcmalloc (or jemalloc) in
# place of glibc's malloc, which returns each large tensor's pages to the kernel, so that every
# step faults them in again (on a paravirtualised VM GPT-2's step took 3.3 s with glibc's
# malloc, 1.56 s with its mmap and trim thresholds raised, 1.46 s with tcmalloc and 5.7 s with
# jemalloc's defaults). Its OpenMP threads spin after each parallel region while OpenBLAS's own
# threads run its matrix products; on a machine with few cores that costs it 10x. So each
# round runs libtorch with tcmalloc under the default OpenMP wait policy, under
# OMP_WAIT_POLICY=PASSIVE and, with THREADS above 1, on one thread (on some hosts its
# one-thread step beat its two-thread one: 2.8 against 7.1 ms for the MLP), then once more
# with glibc's malloc (PASSIVE), and Tandem is compared with the fastest. OpenBLAS gets as
# many threads as libtorch. THREADS=1 compares the two on one core, where libtorch's threading
# plays no part. Each round's ratio is taken against that round's fastest libtorch; the
# summary gives their range next to the ratio of the medians.
#
# Installs libtorch-dev and libtcmalloc-minimal4 when they are missing (as root or through
# sudo; about 1 GB with their dependencies) and builds the libtorch program with g++ outside Bazel: libtorch is not a
# dependency of Tandem, of its CI or of tools/setup.sh.
set -euo pipefail

cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-5}
MODEL=${MODEL:-mlp}
case $MODEL in
  mlp) BATCH=${BATCH:-256} STEPS=${STEPS:-50} WARMUP=${WARMUP:-5} ;;
  gpt2) BATCH=${BATCH:-4} STEPS=${STEPS:-10} WARMUP=${WARMUP:-2} ;;
  *)
    echo "compare_libtorch: MODEL must be mlp or gpt2 but is '$MODEL'" >&2
    exit 2
    ;;
esac
TOKENS=${TOKENS:-64}
AUTOCAST=${AUTOCAST:-}
case $AUTOCAST in
  '') precision=f32 ;;
  bf16) precision=bf16 ;;
  *)
    echo "compare_libtorch: AUTOCAST must be bf16 (or empty for float32) but is '$AUTOCAST'" >&2
    exit 2
    ;;
esac
THREADS=${THREADS:-2}
TORCH_INCLUDE=/usr/include/torch/csrc/api/include

TCMALLOC=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4

missing=()
if [[ ! -e $TORCH_INCLUDE/torch/torch.h ]]; then missing+=(libtorch-dev); fi
if [[ ! -e $TCMALLOC ]]; then missing+=(libtcmalloc-minimal4); fi
if ((${#missing[@]})); then
  echo "compare_libtorch: installing ${missing[*]} (libtorch 1.13 and tcmalloc from Debian)" >&2
  if [[ $(id -u) -eq 0 ]]; then
    apt-get install -y "${missing[@]}"
  else
    sudo apt-get install -y "${missing[@]}"
  fi
fi

work=${TMPDIR:-/tmp}/tandem_compare_libtorch
mkdir -p "$work"
program=$work/libtorch_train_step
if [[ ! -x $program || tools/bench/libtorch_train_step.cc -nt $program ]]; then
  echo "compare_libtorch: compiling tools/bench/libtorch_train_step.cc with g++" >&2
  g++ -O2 -std=c++17 tools/bench/libtorch_train_step.cc -I"$TORCH_INCLUDE" \
    -ltorch -ltorch_cpu -lc10 -o "$program"
fi
# A CPU comparison: --config=cpu leaves out the CUDA backend (and nvcc's long build).
bazel build -c opt --config=cpu //tools/bench:train_step >&2
tandem=$(bazel info -c opt --config=cpu bazel-bin 2>/dev/null)/tools/bench/train_step

median() { sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
field() { grep -o "\"step_ms_median\":[0-9.]*" | tail -1 | cut -d: -f2; }

baseline=${BASELINE:-}
tandem_step() { # binary
  local gpt_flags=()  # a BASELINE from before the GPT models knows no --tokens
  if [[ $MODEL == gpt2 ]]; then gpt_flags=(--tokens="$TOKENS"); fi
  local autocast_flags=()
  if [[ -n $AUTOCAST ]]; then autocast_flags=(--autocast="$AUTOCAST"); fi
  "$1" --model="$MODEL" --batch_size="$BATCH" "${gpt_flags[@]}" "${autocast_flags[@]}" \
    --devices=cpu:0 --threads="$THREADS" --steps="$STEPS" --warmup="$WARMUP" | field
}
libtorch_step() { # threads, extra environment assignments
  local threads=$1
  shift
  env OPENBLAS_NUM_THREADS="$threads" "$@" "$program" "$BATCH" "$threads" "$STEPS" "$WARMUP" \
    "$MODEL" "$TOKENS" "$precision" | field
}
one_thread=$((THREADS > 1))

printf '%-6s %14s %22s %22s' round "Tandem (ms)" "libtorch default (ms)" "libtorch passive (ms)"
if ((one_thread)); then printf ' %22s' "libtorch 1 thread (ms)"; fi
printf ' %22s' "glibc malloc (ms)"
if [[ -n $baseline ]]; then printf ' %14s' "baseline (ms)"; fi
printf '\n'
t_all=() d_all=() p_all=() o_all=() g_all=() b_all=() r_all=()
for ((r = 1; r <= ROUNDS; ++r)); do
  if [[ -n $baseline ]]; then b=$(tandem_step "$baseline"); b_all+=("$b"); fi
  t=$(tandem_step "$tandem")
  d=$(libtorch_step "$THREADS" LD_PRELOAD="$TCMALLOC")
  p=$(libtorch_step "$THREADS" LD_PRELOAD="$TCMALLOC" OMP_WAIT_POLICY=PASSIVE)
  o=$p
  if ((one_thread)); then o=$(libtorch_step 1 LD_PRELOAD="$TCMALLOC"); fi
  g=$(libtorch_step "$THREADS" OMP_WAIT_POLICY=PASSIVE)
  printf '%-6s %14s %22s %22s' "$r" "$t" "$d" "$p"
  if ((one_thread)); then printf ' %22s' "$o"; fi
  printf ' %22s' "$g"
  if [[ -n $baseline ]]; then printf ' %14s' "$b"; fi
  printf '\n'
  t_all+=("$t") d_all+=("$d") p_all+=("$p") o_all+=("$o") g_all+=("$g")
  r_all+=("$(printf '%s\n%s\n%s\n%s\n' "$d" "$p" "$o" "$g" | sort -g | head -1 |
    awk -v a="$t" '{printf "%.3f", a / $1}')")
done
tm=$(printf '%s\n' "${t_all[@]}" | median)
dm=$(printf '%s\n' "${d_all[@]}" | median)
pm=$(printf '%s\n' "${p_all[@]}" | median)
om=$(printf '%s\n' "${o_all[@]}" | median)
gm=$(printf '%s\n' "${g_all[@]}" | median)
best=$(printf '%s\n%s\n%s\n%s\n' "$dm" "$pm" "$om" "$gm" | sort -g | head -1)
rounds_sorted=$(printf '%s\n' "${r_all[@]}" | sort -g | tr '\n' ' ')
ratio=$(awk -v a="$tm" -v b="$best" 'BEGIN {printf "%.2f", a / b}')
printf '%-6s %14s %22s %22s' median "$tm" "$dm" "$pm"
if ((one_thread)); then printf ' %22s' "$om"; fi
printf ' %22s\n' "$gm"
if [[ $MODEL == gpt2 ]]; then
  echo "gpt2 (124M), batch $BATCH x $TOKENS tokens, AdamW, $precision, $THREADS threads," \
    "one CPU device, $(nproc) cores:"
else
  echo "mlp, batch $BATCH, SGD momentum 0.9, $precision, $THREADS threads, one CPU device," \
    "$(nproc) cores:"
fi
echo "  Tandem step / libtorch step (the fastest libtorch) = $tm / $best = $ratio;" \
  "per round, sorted: $rounds_sorted"
if [[ -n $baseline ]]; then
  bm=$(printf '%s\n' "${b_all[@]}" | median)
  per_round=$(for ((i = 0; i < ROUNDS; ++i)); do
    awk -v a="${t_all[$i]}" -v b="${b_all[$i]}" 'BEGIN {printf "%.3f\n", a / b}'
  done | sort -g | tr '\n' ' ')
  echo "  this tree's step / the baseline's ($baseline) = $tm / $bm; per round, sorted: $per_round"
fi
printf '{"benchmark":"compare_libtorch","model":"%s","precision":"%s","batch_size":%s,' \
  "$MODEL" "$precision" "$BATCH"
printf '"threads":%s,"rounds":%s,' "$THREADS" "$ROUNDS"
printf '"tandem_ms":%s,"libtorch_default_ms":%s,"libtorch_passive_ms":%s,' "$tm" "$dm" "$pm"
if ((one_thread)); then printf '"libtorch_one_thread_ms":%s,' "$om"; fi
printf '"libtorch_glibc_malloc_ms":%s,' "$gm"
printf '"ratio":%s,"ratio_rounds_min":%s,"ratio_rounds_max":%s}\n' "$ratio" \
  "$(printf '%s\n' "${r_all[@]}" | sort -g | head -1)" "$(printf '%s\n' "${r_all[@]}" | sort -g | tail -1)"
