#!/usr/bin/env bash
# The GPU check owed by sessions without a GPU, as one prepared command for the lent machine:
# the bundle's tests (CUDA first, cut at a deadline), then Tandem's training step on cuda:0
# next to PyTorch's same step (tools/gpu/torch_train_step.py), alternated process by process,
# with a table of the ratios at the end. Everything it prints is also kept in $OUT.
#
#   tools/gpu/build_bundle.sh --cuda-only                      # here, on the CPU machine
#   run(command="tools/gpu/gpu_check.sh 240", carry=[".gpu_bundle"], timeout_s=590)
#
# The argument is the seconds the tests may take (default 240); the train-step pairs take
# about four more minutes at most (each run has its own timeout). The table at the end puts
# each step next to PyTorch's and next to the H100 roofline model that train_step prints
# (tools/bench/roofline.h: "roofline ms" is the ideal of GPT-2's GEMMs and attention at that
# batch, a model; "modelled ms" the counted kernels' model where the binary counted them, which
# only the simulator does), so the first lent GPU answers how close the model was.
#
#   tools/gpu/gpu_check.sh --dry_run [SECONDS]   # prints the commands it would run, runs none
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
dry_run=0
if [[ "${1:-}" == "--dry_run" ]]; then
  dry_run=1
  shift
fi
test_seconds="${1:-240}"
out="${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
log() { printf '[gpu_check] %s\n' "$*" >&2; }

# ---- Pairs ----------------------------------------------------------------------------------
# name | train_step arguments | torch_train_step.py arguments | seconds each run may take
pairs=(
  "mlp b256|--model=mlp --batch_size=256 --steps=100 --warmup=10|--model=mlp --batch_size=256 --steps=100 --warmup=10|40"
  "gpt2 b8x1024 fp32|--model=gpt2 --batch_size=8 --tokens=1024 --steps=8 --warmup=2|--model=gpt2 --batch_size=8 --tokens=1024 --steps=8 --warmup=2|90"
  "gpt2 b8x1024 bf16|--model=gpt2 --batch_size=8 --tokens=1024 --steps=8 --warmup=2 --autocast=bf16|--model=gpt2 --batch_size=8 --tokens=1024 --steps=8 --warmup=2 --autocast=bf16|120"
)

if ((dry_run)); then
  echo "nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader"
  echo "LOGS=\$OUT/test_logs tools/gpu/run_bundle.sh --no-benchmarks --test-timeout 90 --deadline $test_seconds"
  for round in 1 2; do
    for pair in "${pairs[@]}"; do
      IFS='|' read -r name ours theirs seconds <<<"$pair"
      echo "timeout $seconds tools/gpu/run_bundle.sh --exec tools_bench__train_step --devices=cuda:0 $ours"
      echo "timeout $seconds python3 tools/gpu/torch_train_step.py $theirs"
    done
  done
  echo "python3 (the table: pair, Tandem ms, PyTorch ms, ratio, roofline ms, Tandem / roofline, modelled ms)"
  exit 0
fi

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader |
  tee "$out/gpu.txt"
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' |
  tee -a "$out/gpu.txt"

# ---- Tests ---------------------------------------------------------------------------------
LOGS="$out/test_logs" tools/gpu/run_bundle.sh --no-benchmarks --test-timeout 90 \
  --deadline "$test_seconds" 2>&1 | tee "$out/tests.txt"
tar -C "$out" -czf "$out/test_logs.tar.gz" test_logs 2>/dev/null && rm -rf "$out/test_logs"

# ---- Training steps against PyTorch ---------------------------------------------------------
results="$out/train_step.jsonl"
: >"$results"
for round in 1 2; do
  for pair in "${pairs[@]}"; do
    IFS='|' read -r name ours theirs seconds <<<"$pair"
    log "round $round: $name"
    # shellcheck disable=SC2086
    line="$(timeout "$seconds" tools/gpu/run_bundle.sh --exec tools_bench__train_step \
      --devices=cuda:0 $ours 2>&1 | tee -a "$out/train_step.txt" | tail -n 1)"
    [[ "$line" == "{"* ]] && echo "{\"pair\":\"$name\",\"round\":$round,\"side\":\"tandem\",${line:1}" >>"$results"
    # shellcheck disable=SC2086
    line="$(timeout "$seconds" python3 tools/gpu/torch_train_step.py $theirs 2>&1 |
      tee -a "$out/train_step.txt" | tail -n 1)"
    [[ "$line" == "{"* ]] && echo "{\"pair\":\"$name\",\"round\":$round,\"side\":\"torch\",${line:1}" >>"$results"
  done
done

python3 - "$results" <<'EOF' | tee "$out/summary.txt"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("\nTraining step on cuda:0, Tandem / PyTorch (median step times; one ratio per round);")
print("roofline ms: H100 SXM model of the GPT step's GEMMs and attention (tools/bench/roofline.h,")
print("a model, not measured; an H200 has more bandwidth, the same peaks); modelled ms: the")
print("counted kernels' model, '-' where not counted (only the CUDA simulator counts)")
print(f"{'pair':<20} {'Tandem ms':>16} {'PyTorch ms':>16} {'ratios':>11} "
      f"{'roofline ms':>11} {'Tandem/roofl.':>13} {'modelled ms':>11}")
for pair in dict.fromkeys(r["pair"] for r in rows):
    ours = [r for r in rows if r["pair"] == pair and r["side"] == "tandem"]
    theirs = [r for r in rows if r["pair"] == pair and r["side"] == "torch"]
    def key(r):  # train_step --autocast reports both steps; the bf16 one through the ratio
        return r["step_ms_median"] * r.get("autocast_ratio", 1.0)
    ratios = [key(o) / t["step_ms_median"] for o, t in zip(ours, theirs)]
    fmt = lambda xs: " ".join(f"{x:.2f}" for x in xs) or "-"
    roofline = [o["roofline_gemm_attention_h100_ms"] for o in ours
                if "roofline_gemm_attention_h100_ms" in o]
    modelled = [o["modelled_h100_ms"] for o in ours if "modelled_h100_ms" in o]
    over = [key(o) / roofline[0] for o in ours] if roofline else []
    print(f"{pair:<20} {fmt([key(o) for o in ours]):>16} "
          f"{fmt([t['step_ms_median'] for t in theirs]):>16} {fmt(ratios):>11} "
          f"{fmt(roofline[:1]):>11} {fmt(over):>13} {fmt(modelled[:1]):>11}")
EOF
