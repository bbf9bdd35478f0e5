#!/usr/bin/env bash
# kernel_budget.py on saved ptxas output (no nvcc needed): a kernel with a stack frame or a
# spill fails the budget unless the allow-list names it with a reason, an entry without a
# reason is refused, block sizes come from the launch (a constexpr constant), from
# __launch_bounds__, or are assumed, and occupancy follows cuda_occupancy.h's arithmetic.
set -euo pipefail
script="tools/cuda/kernel_budget.py"
dir="$TEST_TMPDIR"

cat >"$dir/k.cu" <<'CU'
constexpr int kThreads = 128;
template <typename T> __global__ void Scale(T* x) {}
__global__ void __launch_bounds__(64, 1) Rows(float* x) {}
__global__ void Spills(float* x) {}
void Launch(float* x, int n) {
  Scale<float><<<n, kThreads * 2, 0, nullptr>>>(x);
  Rows<<<n, n % 64 + 1>>>(x);
  Spills<<<1, n>>>(x);
}
CU
entry() { # mangled name, stack, spill stores, spill loads, registers, smem
  echo "ptxas info    : Compiling entry function '$1' for 'sm_90'"
  echo "ptxas info    : Function properties for $1"
  echo "    $2 bytes stack frame, $3 bytes spill stores, $4 bytes spill loads"
  echo "ptxas info    : Used $5 registers, used 1 barriers, $6 bytes smem"
}
{
  entry _Z5ScaleIfEvPT_ 0 0 0 40 0
  entry _Z4RowsPf 0 0 0 182 4096
  entry _Z6SpillsPf 24 8 8 255 0
} >"$dir/ptxas.txt"

# No allow-list: the spilling kernel fails the budget and is named.
if python3 "$script" --allow "$dir/none.txt" --ptxas-log "$dir/ptxas.txt" "$dir/k.cu" \
  >"$dir/out.txt"; then
  echo "expected a failure for Spills"; cat "$dir/out.txt"; exit 1
fi
cat "$dir/out.txt"
grep -q "OVER BUDGET: Spills (.*): 24 bytes stack frame, 8 bytes spill stores" "$dir/out.txt"
grep -q "1 over budget" "$dir/out.txt"
# Scale<float>: 256 threads from the launch (2 * kThreads), 40 registers: 1280 per warp, 12
# warps per sub-partition, 48 per SM, 6 blocks: 75%, limited by registers.
grep -Eq "^Scale<float> +40 +0 +0 +0 +256  +75% \(registers\)" "$dir/out.txt"
# Rows: 64 from __launch_bounds__, 182 registers: 5888 per warp, 2 warps per sub-partition, 8
# per SM, 4 blocks: 12%.
grep -Eq "^Rows +182 +4096 +0 +0 +64b  +12% \(registers\)" "$dir/out.txt"
# Spills: launched with a runtime size, 256 assumed; 255 registers: 8192 per warp, 2 warps per
# sub-partition, 8 per SM: one block of 8 warps, 12%.
grep -Eq "^Spills +255 +0 +24 +16 +256\*  +12% \(registers\)" "$dir/out.txt"

# Allowed with a reason: within budget, and the reason is printed.
printf '# comment\nSpill*  # a test kernel that spills on purpose\n' >"$dir/allow.txt"
python3 "$script" --allow "$dir/allow.txt" --ptxas-log "$dir/ptxas.txt" "$dir/k.cu" \
  >"$dir/out.txt"
grep -q "allowed: a test kernel that spills on purpose" "$dir/out.txt"
grep -q "0 over budget (spill or stack), 1 allowed" "$dir/out.txt"

# An entry without its reason is an error (exit status 2).
printf 'Spill*\n' >"$dir/bad.txt"
set +e
python3 "$script" --allow "$dir/bad.txt" --ptxas-log "$dir/ptxas.txt" "$dir/k.cu" >"$dir/out.txt"
status=$?
set -e
[[ "$status" -eq 2 ]] || { echo "expected exit status 2, got $status"; exit 1; }
grep -q "every allowed spill or stack needs its reason" "$dir/out.txt"
# Tensor cores: a kernel that must use them passes with an mma instruction in its PTX, and fails
# without one, or when no kernel matches its glob, or when there is no PTX to look at.
cat >"$dir/k.ptx" <<'PTX'
.visible .entry _Z5ScaleIfEvPT_(
	.param .u64 _Z5ScaleIfEvPT__param_0
)
{
	wmma.mma.sync.aligned.row.col.m16n16k16.f32.bf16.bf16.f32 {%f1}, {%r1}, {%r2}, {%f2};
	ret;
}
.visible .entry _Z4RowsPf(
	.param .u64 _Z4RowsPf_param_0
)
{
	fma.rn.f32 %f1, %f2, %f3, %f4;
	ret;
}
PTX
python3 "$script" --allow "$dir/allow.txt" --ptxas-log "$dir/ptxas.txt" --ptx-log "$dir/k.ptx" \
  --require-mma 'Scale<*>' "$dir/k.cu" >"$dir/out.txt"
grep -q "0 tensor-core failures" "$dir/out.txt"
expect_no_tensor_cores() { # message, then the script's extra arguments
  local message="$1"
  shift
  if python3 "$script" --allow "$dir/allow.txt" --ptxas-log "$dir/ptxas.txt" "$@" "$dir/k.cu" \
    >"$dir/out.txt"; then
    echo "expected a tensor-core failure: $message"; cat "$dir/out.txt"; exit 1
  fi
  grep -q "NO TENSOR CORES: .*$message" "$dir/out.txt" || { cat "$dir/out.txt"; exit 1; }
}
expect_no_tensor_cores "Rows has no mma/wmma instruction in its PTX" --ptx-log "$dir/k.ptx" \
  --require-mma 'Scale<*>' --require-mma 'Rows'
expect_no_tensor_cores "no kernel matches Attention\*, which must run on tensor cores" \
  --ptx-log "$dir/k.ptx" --require-mma 'Attention*'
expect_no_tensor_cores "no PTX to check Scale<\*>" --require-mma 'Scale<*>'
echo "kernel_budget_test: OK"
