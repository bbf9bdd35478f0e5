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
# libtorch's OpenMP threads spin after each parallel region while OpenBLAS's own threads
# run its matrix products; on a machine with few cores that costs it 10x. So libtorch runs
# twice a round, with the default OpenMP wait policy and with OMP_WAIT_POLICY=PASSIVE, and
# Tandem is compared with the faster of the two. OpenBLAS, under both, gets THREADS threads.
# THREADS=1 compares the two on one core, where libtorch's threading plays no part.
#
# Installs libtorch-dev when it is missing (as root or through sudo; about 1 GB with its
# dependencies) and builds the libtorch program with g++ outside Bazel: libtorch is not a
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

if [[ ! -e $TORCH_INCLUDE/torch/torch.h ]]; then
  echo "compare_libtorch: installing libtorch-dev (Debian's libtorch 1.13)" >&2
  if [[ $(id -u) -eq 0 ]]; then
    apt-get install -y libtorch-dev
  else
    sudo apt-get install -y libtorch-dev
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
libtorch_step() { # extra environment assignments
  env OPENBLAS_NUM_THREADS="$THREADS" "$@" "$program" "$BATCH" "$THREADS" "$STEPS" "$WARMUP" \
    "$MODEL" "$TOKENS" "$precision" | field
}

printf '%-6s %14s %22s %22s' round "Tandem (ms)" "libtorch default (ms)" "libtorch passive (ms)"
if [[ -n $baseline ]]; then printf ' %14s' "baseline (ms)"; fi
printf '\n'
t_all=() d_all=() p_all=() b_all=()
for ((r = 1; r <= ROUNDS; ++r)); do
  if [[ -n $baseline ]]; then b=$(tandem_step "$baseline"); b_all+=("$b"); fi
  t=$(tandem_step "$tandem")
  d=$(libtorch_step)
  p=$(libtorch_step OMP_WAIT_POLICY=PASSIVE)
  printf '%-6s %14s %22s %22s' "$r" "$t" "$d" "$p"
  if [[ -n $baseline ]]; then printf ' %14s' "$b"; fi
  printf '\n'
  t_all+=("$t") d_all+=("$d") p_all+=("$p")
done
tm=$(printf '%s\n' "${t_all[@]}" | median)
dm=$(printf '%s\n' "${d_all[@]}" | median)
pm=$(printf '%s\n' "${p_all[@]}" | median)
best=$(printf '%s\n%s\n' "$dm" "$pm" | sort -g | head -1)
ratio=$(awk -v a="$tm" -v b="$best" 'BEGIN {printf "%.2f", a / b}')
printf '%-6s %14s %22s %22s\n' median "$tm" "$dm" "$pm"
if [[ $MODEL == gpt2 ]]; then
  echo "gpt2 (124M), batch $BATCH x $TOKENS tokens, AdamW, $precision, $THREADS threads," \
    "one CPU device, $(nproc) cores:"
else
  echo "mlp, batch $BATCH, SGD momentum 0.9, $precision, $THREADS threads, one CPU device," \
    "$(nproc) cores:"
fi
echo "  Tandem step / libtorch step (the faster libtorch) = $tm / $best = $ratio"
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
printf '"tandem_ms":%s,"libtorch_default_ms":%s,"libtorch_passive_ms":%s,"ratio":%s}\n' \
  "$tm" "$dm" "$pm" "$ratio"
