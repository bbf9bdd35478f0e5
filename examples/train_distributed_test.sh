#!/usr/bin/env bash
# The trainer's --distributed mode end to end: 2 ranks under mpirun (through
# parallel/distributed/mpi_test.sh) train for 2 epochs on a subset of Fashion-MNIST; rank 0
# alone prints the summary and the final JSON line, and the model learns something.
set -euo pipefail
train="$1"
data_dir=/usr/share/datasets/fashion-mnist
if [[ ! -f "$data_dir/train-images-idx3-ubyte.gz" ]]; then
  echo "SKIPPED: Fashion-MNIST is not installed in $data_dir (bash tools/setup.sh installs it)"
  exit 0
fi
logs="${TEST_TMPDIR:-$(mktemp -d)}"
rm -f "$logs/run.csv" "$logs/run.svg" "$logs/trace.json"
out="$(bash parallel/distributed/mpi_test.sh 2 "$train" --distributed --devices=cpu:0 \
  --threads=1 --epochs=2 --batch_size=64 --train_limit=2048 --test_limit=500 --workers=0 \
  --log_csv="$logs/run.csv" --plot="$logs/run.svg" --trace="$logs/trace.json")"
echo "$out"
json="$(grep '^\[1,0\]<stdout>:{"model"' <<<"$out" | sed 's/^\[1,0\]<stdout>://')"
[[ -n "$json" ]] || { echo "FAIL: rank 0 printed no JSON line"; exit 1; }
if grep -q '^\[1,1\]<stdout>:.*"model"' <<<"$out"; then
  echo "FAIL: rank 1 printed the JSON line too"; exit 1
fi
grep -q '"ranks":2' <<<"$json" || { echo "FAIL: expected \"ranks\":2 in $json"; exit 1; }
# Progress comes as plain lines (a rank's output is a pseudo-terminal even when mpirun's goes
# to a pipe, as here): no carriage returns of a redrawn bar.
if grep -q $'\r' <<<"$out"; then echo "FAIL: the progress bar redraws into a pipe"; exit 1; fi
grep -q '^\[1,0\]<stdout>:epoch 1/2 \[' <<<"$out" ||
  { echo "FAIL: rank 0 printed no progress line"; exit 1; }
grep -q '"epochs":2' <<<"$json" || { echo "FAIL: expected \"epochs\":2 in $json"; exit 1; }
accuracy="$(sed 's/.*"test_accuracy":\([0-9.]*\).*/\1/' <<<"$json")"
# Chance is 0.10; two short epochs on 2048 images reach about 0.6.
awk -v a="$accuracy" 'BEGIN { exit !(a > 0.4) }' ||
  { echo "FAIL: test accuracy $accuracy, expected above 0.4"; exit 1; }
# Rank 0 writes the CSV (a header and a row per epoch) and the chart.
[[ "$(wc -l <"$logs/run.csv")" == 3 ]] || { echo "FAIL: expected 3 lines in the CSV:"; cat "$logs/run.csv"; exit 1; }
head -1 "$logs/run.csv" | grep -q '^epoch,train_loss,test_loss,test_accuracy' ||
  { echo "FAIL: the CSV has no header"; exit 1; }
grep -q '<svg' "$logs/run.svg" && grep -q '2 ranks on cpu:0' "$logs/run.svg" ||
  { echo "FAIL: the plot is not an SVG chart titled with the ranks"; exit 1; }
# Rank 0 traces its first epoch (1024 images a rank in batches of 64: 16 steps, fewer than
# the 50 a trace holds), its all-reduces included.
grep -q 'trace of 16 steps' <<<"$out" || { echo "FAIL: rank 0 did not say it wrote the trace"; exit 1; }
grep -q '"name":"ProcessGroupMpi rank 0 thread"\|"name":"allreduce (average) of' "$logs/trace.json" ||
  { echo "FAIL: the trace holds no all-reduce"; exit 1; }
echo "PASS: $json"
