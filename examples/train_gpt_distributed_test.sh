#!/usr/bin/env bash
# train --model=gpt --distributed end to end: 2 ranks under mpirun train a tiny GPT on a slice
# of the fortunes corpus for 2 epochs; the validation loss falls, rank 0 alone prints the
# sample and the JSON line (with "ranks":2 and "sample"). A job killed in epoch 2 and resumed
# from its checkpoint ends with the uninterrupted job's model, bit for bit, and its sample, as
# does a job with --sharding=full, whose ranks evaluate their shares of the validation set and
# sample together (no rank holds the whole model): the same validation figures on 2 ranks, and
# on 3 (a rank with no batch of its own) within the rounding by which the models differ.
set -euo pipefail
train="$1"  # //examples:train_with_test_hooks: the trainer with --kill_in_epoch
if [[ ! -d /usr/share/games/fortunes ]]; then
  echo "SKIPPED: the fortunes corpus is not installed (bash tools/setup.sh installs it)"
  exit 0
fi
logs="${TEST_TMPDIR:-$(mktemp -d)}"
rm -f "$logs"/gpt*
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader \
  OMPI_MCA_plm_rsh_agent=false OMPI_MCA_btl_vader_single_copy_mechanism=none TMPDIR=/tmp \
  OPENBLAS_NUM_THREADS=1
unset XML_OUTPUT_FILE TEST_PREMATURE_EXIT_FILE
base=(--distributed --model=gpt --devices=cpu:0 --threads=1 --epochs=2 --batch_size=8
  --train_limit=192 --test_limit=64 --context=32 --n_layer=1 --n_head=2 --n_embd=32 --lr=0.003
  --workers=0 --seed=5 --max_new_tokens=40)
ranks() { timeout 300 mpirun --oversubscribe --bind-to none --tag-output -np "$@"; }
ranks2() { ranks 2 "$train" "$@"; }

out="$(ranks2 "${base[@]}" --log_csv="$logs/gpt.csv" --checkpoint="$logs/gpt_straight.ckpt" \
  --save="$logs/gpt_straight.model" 2>&1)" || { echo "$out"; echo "FAIL: the job failed"; exit 1; }
echo "$out"
json="$(grep '^\[1,0\]<stdout>:{"model"' <<<"$out" | sed 's/^\[1,0\]<stdout>://')"
[[ -n "$json" ]] || { echo "FAIL: rank 0 printed no JSON line"; exit 1; }
if grep -q '^\[1,1\]<stdout>:.*"model"\|^\[1,1\]<stdout>:Sample' <<<"$out"; then
  echo "FAIL: rank 1 printed the JSON line or the sample too"; exit 1
fi
grep -q '"model":"gpt".*"ranks":2' <<<"$json" || { echo "FAIL: expected gpt on 2 ranks in $json"; exit 1; }
grep -q '"sample":"The meaning of life is' <<<"$json" || { echo "FAIL: no sample in $json"; exit 1; }
grep -q '^\[1,0\]<stdout>:Sample (--prompt, 40 new bytes' <<<"$out" ||
  { echo "FAIL: rank 0 printed no sample"; exit 1; }
grep -q '^\[1,0\]<stdout>:epoch 2/2  train loss [0-9.]*  val loss [0-9.]*  val ppl' <<<"$out" ||
  { echo "FAIL: no validation figures in the epoch line"; exit 1; }
# 192 windows over 2 ranks: 96 a rank.
grep -q '96 examples per rank per epoch' <<<"$out" || { echo "FAIL: expected 96 windows a rank"; exit 1; }
first="$(sed -n 2p "$logs/gpt.csv" | cut -d, -f3)"
second="$(sed -n 3p "$logs/gpt.csv" | cut -d, -f3)"
awk -v a="$first" -v b="$second" 'BEGIN { exit !(b < a && a < log(256)) }' ||
  { echo "FAIL: validation loss $first then $second: expected it to fall, below ln 256"; exit 1; }

rc=0
killed="$(ranks2 "${base[@]}" --checkpoint="$logs/gpt_killed.ckpt" --kill_in_epoch=2 2>&1)" || rc=$?
[[ $rc != 0 ]] || { echo "$killed"; echo "FAIL: the job killed in epoch 2 exited 0"; exit 1; }
resumed="$(ranks2 "${base[@]}" --checkpoint="$logs/gpt_killed.ckpt" \
  --save="$logs/gpt_resumed.model" 2>&1)" || { echo "$resumed"; echo "FAIL: the resumed job failed"; exit 1; }
grep -q "Resuming from $logs/gpt_killed.ckpt: 1 of 2 epochs done" <<<"$resumed" ||
  { echo "$resumed"; echo "FAIL: the job did not resume after epoch 1"; exit 1; }
if grep -q 'note:' <<<"$resumed"; then echo "$resumed"; echo "FAIL: an exact resume printed a note"; exit 1; fi
cmp "$logs/gpt_straight.model" "$logs/gpt_resumed.model" ||
  { echo "FAIL: the resumed job's model differs from the uninterrupted job's"; exit 1; }
json_resumed="$(grep '^\[1,0\]<stdout>:{"model"' <<<"$resumed" | sed 's/^\[1,0\]<stdout>://')"
[[ "$(sed 's/.*"sample"//' <<<"$json")" == "$(sed 's/.*"sample"//' <<<"$json_resumed")" ]] ||
  { echo "FAIL: the resumed job sampled other text: $json_resumed"; exit 1; }
# --sharding=full (FullyShardedDataParallel: a unit per block, the embeddings and the head tied
# to them in the root) trains the plain job's model, bit for bit, and samples its text.
full="$(ranks2 "${base[@]}" --sharding=full --save="$logs/gpt_full.model" \
  --log_csv="$logs/gpt_full.csv" 2>&1)" ||
  { echo "$full"; echo "FAIL: the --sharding=full job failed"; exit 1; }
grep -q '^\[1,0\]<stdout>:Parameters, gradients and optimizer state sharded across the ranks (--sharding=full, FULL_SHARD): 2 units' <<<"$full" ||
  { echo "$full"; echo "FAIL: the --sharding=full job did not say it shards into 2 units"; exit 1; }
cmp "$logs/gpt_straight.model" "$logs/gpt_full.model" ||
  { echo "FAIL: the --sharding=full job's model differs from the plain job's"; exit 1; }
json_full="$(grep '^\[1,0\]<stdout>:{"model"' <<<"$full" | sed 's/^\[1,0\]<stdout>://')"
[[ "$(sed 's/.*"sample"//' <<<"$json")" == "$(sed 's/.*"sample"//' <<<"$json_full")" ]] ||
  { echo "FAIL: the --sharding=full job sampled other text: $json_full"; exit 1; }
if grep -q '^\[1,1\]<stdout>:.*"model"\|^\[1,1\]<stdout>:Sample' <<<"$full"; then
  echo "FAIL: rank 1 of the --sharding=full job printed the JSON line or the sample"; exit 1
fi
# Validation loss and next-byte accuracy of each epoch (the CSV's columns 3 and 4).
validation() { cut -d, -f3,4 "$1" | tail -n +2; }
[[ "$(validation "$logs/gpt.csv")" == "$(validation "$logs/gpt_full.csv")" ]] ||
  { echo "FAIL: the --sharding=full job's validation figures differ from the plain job's:";
    validation "$logs/gpt.csv"; validation "$logs/gpt_full.csv"; exit 1; }
# 3 ranks, 2 validation batches of 32 windows: rank 2 has none of its own.
for sharding in none full; do
  ranks 3 "$train" "${base[@]}" --sharding=$sharding --log_csv="$logs/gpt3_$sharding.csv" \
    >"$logs/gpt3_$sharding.out" 2>&1 ||
    { cat "$logs/gpt3_$sharding.out"; echo "FAIL: the 3-rank --sharding=$sharding job failed";
      exit 1; }
done
paste -d, <(validation "$logs/gpt3_none.csv") <(validation "$logs/gpt3_full.csv") |
  awk -F, '{ d = $1 - $3; if (d < 0) d = -d; if (d > 1e-5 || $2 != $4) bad = 1 }
    END { exit bad }' ||
  { echo "FAIL: the 3-rank --sharding=full job's validation figures differ from the plain job's:";
    validation "$logs/gpt3_none.csv"; validation "$logs/gpt3_full.csv"; exit 1; }
echo "PASS: $json"
