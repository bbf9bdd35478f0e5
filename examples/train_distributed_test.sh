#!/usr/bin/env bash
# The trainer's --distributed mode end to end: 2 ranks under mpirun (through
# parallel/distributed/mpi_test.sh) train for 2 epochs on a subset of Fashion-MNIST; rank 0
# alone prints the summary and the final JSON line, and the model learns something. Then
# ranks that disagree (flags, data, checkpoints) are refused at start on every rank, and a
# rank stopped with SIGSTOP makes the other fail within --collective_timeout, naming it. A
# job killed in epoch 2 and resumed from its checkpoint ends with the same parameters and
# random state as the uninterrupted one; a run that learns nothing says it is at chance level.
# --sharding=zero1, shard_grad_op and full train the plain optimizer's model, bit for bit;
# zero1's checkpoints resume with or without sharding and on another number of ranks (3 -> 2,
# 3 -> 1), full's sharded ones with full on another number of ranks (2 -> 3).
set -euo pipefail
train="$1"  # //examples:train_with_test_hooks: the trainer with --kill_in_epoch
data_dir=/usr/share/datasets/fashion-mnist
if [[ ! -f "$data_dir/train-images-idx3-ubyte.gz" ]]; then
  echo "SKIPPED: Fashion-MNIST is not installed in $data_dir (bash tools/setup.sh installs it)"
  exit 0
fi
logs="${TEST_TMPDIR:-$(mktemp -d)}"
rm -f "$logs"/*.csv "$logs"/*.svg "$logs"/*.json "$logs"/*.ckpt "$logs"/*.model
out="$(bash parallel/distributed/mpi_test.sh 2 "$train" --distributed --devices=cpu:0 \
  --threads=1 --epochs=2 --batch_size=64 --train_limit=2048 --test_limit=500 --workers=0 \
  --log_csv="$logs/run.csv" --plot="$logs/run.svg" --trace="$logs/trace.json" \
  --checkpoint="$logs/run.ckpt" --save="$logs/straight.model")"
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
grep -q '"at_chance_level":false}$' <<<"$json" ||
  { echo "FAIL: expected \"at_chance_level\":false at the end of $json"; exit 1; }
if grep -q 'chance level' <<<"$out"; then echo "FAIL: a run that learned warned of chance level"; exit 1; fi
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

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader \
  OMPI_MCA_plm_rsh_agent=false OMPI_MCA_btl_vader_single_copy_mechanism=none TMPDIR=/tmp \
  OPENBLAS_NUM_THREADS=1
unset XML_OUTPUT_FILE TEST_PREMATURE_EXIT_FILE
base=(--distributed --devices=cpu:0 --threads=1 --epochs=2 --batch_size=64 --train_limit=2048
  --test_limit=500 --workers=0)
ranks2() { timeout 300 mpirun --oversubscribe --bind-to none --tag-output -np 2 "$train" "$@"; }

# The first run's job killed half-way through epoch 2 (rank 0 SIGKILLed, mpirun ends rank 1),
# then started again from its checkpoint: the same model, bit for bit.
rc=0
killed="$(ranks2 "${base[@]}" --checkpoint="$logs/killed.ckpt" --kill_in_epoch=2 2>&1)" || rc=$?
[[ $rc != 0 ]] || { echo "$killed"; echo "FAIL: the job killed in epoch 2 exited 0"; exit 1; }
grep -q '^\[1,0\]<stdout>:epoch 1/2  train loss' <<<"$killed" &&
  ! grep -q '^\[1,0\]<stdout>:epoch 2/2  train loss' <<<"$killed" ||
  { echo "$killed"; echo "FAIL: expected the job to end in epoch 2"; exit 1; }
cp "$logs/killed.ckpt" "$logs/killed_copy.ckpt"
resumed="$(ranks2 "${base[@]}" --checkpoint="$logs/killed.ckpt" --save="$logs/resumed.model" 2>&1)" ||
  { echo "$resumed"; echo "FAIL: the resumed job failed"; exit 1; }
echo "$resumed"
grep -q "Resuming from $logs/killed.ckpt: 1 of 2 epochs done" <<<"$resumed" ||
  { echo "FAIL: the job did not resume after epoch 1"; exit 1; }
if grep -q 'note:' <<<"$resumed"; then echo "FAIL: an exact resume printed a note"; exit 1; fi
cmp "$logs/straight.model" "$logs/resumed.model" ||
  { echo "FAIL: the resumed job's model differs from the uninterrupted job's"; exit 1; }
# The random state a checkpoint holds (trainer.generator.cpu:0: its seed and offset, the 16
# bytes after the record's name, rank, size and data length), in hex.
generator() {
  local name=trainer.generator.cpu:0 at
  at="$(LC_ALL=C grep -obUaF "$name" "$1" | head -1 | cut -d: -f1)"
  [[ -n "$at" ]] || { echo "FAIL: $1 holds no $name" >&2; exit 1; }
  tail -c +$((at + ${#name} + 4 + 8 + 8 + 1)) "$1" | head -c 16 | od -An -tx1 | tr -d ' \n'
}
# Training draws no random numbers from the generators, so the killed job's and the straight
# job's states match whether or not a resume restores them: the check is a resume with another
# --seed (other data order, not exact, as asked), whose saved generators must be the
# checkpoint's, not --seed's (before, they were left as --seed made them).
ranks2 "${base[@]}" --checkpoint="$logs/killed_copy.ckpt" --seed=2 >/dev/null 2>&1 ||
  { echo "FAIL: the job resumed with --seed=2 failed"; exit 1; }
[[ "$(generator "$logs/killed_copy.ckpt")" == "$(generator "$logs/run.ckpt")" ]] ||
  { echo "FAIL: a resume did not restore the checkpoint's random state"; exit 1; }

# A checkpoint of the single-process trainer on cpu:0 and cpu:1, resumed here (after its last
# epoch: nothing left to train): each rank restores cpu:0's random state and says that
# cpu:1's is not used.
"$train" --devices=cpu:0,cpu:1 --threads=1 --epochs=1 --batch_size=64 --train_limit=256 \
  --test_limit=100 --workers=0 --checkpoint="$logs/single.ckpt" >/dev/null ||
  { echo "FAIL: the single-process run failed"; exit 1; }
single="$(ranks2 --distributed --devices=cpu:0 --threads=1 --epochs=1 --batch_size=64 \
  --train_limit=256 --test_limit=100 --workers=0 --checkpoint="$logs/single.ckpt" 2>&1)" ||
  { echo "$single"; echo "FAIL: the resume of a single-process checkpoint failed"; exit 1; }
# (a substring: mpirun may forward part of rank 0's long line, then rank 1's, on one line)
for r in 0 1; do
  grep -qF "[1,$r]<stdout>:rank $r: note: the checkpoint's random state for cpu:1 is not used (not a device of this run)" <<<"$single" ||
    { echo "$single"; echo "FAIL: rank $r did not say that cpu:1's random state is not used"; exit 1; }
done

# A run that learns nothing (--lr=1e-9: the model stays as initialized) ends with status 0 but
# warns that its accuracy is at chance level, naming the flags, and says so in the JSON line.
chance="$(ranks2 --distributed --devices=cpu:0 --threads=1 --epochs=1 --batch_size=64 \
  --train_limit=256 --test_limit=1000 --workers=0 --lr=1e-9 2>&1)" ||
  { echo "$chance"; echo "FAIL: the run at chance level failed"; exit 1; }
grep -qE '^\[1,0\]<stdout>:warning: the final test accuracy \([0-9.]+%\) is at chance level for 10 classes \(10.00% by guessing, 11.50% by always answering the most common class of these 1000 test images\)' <<<"$chance" &&
  grep -qF 'the model did not learn. Look at --lr (now 1e-09; 0.05 suits sgd, 0.001 adam) and --optimizer (now sgd)' <<<"$chance" &&
  grep -q '^\[1,0\]<stdout>:{"model".*,"at_chance_level":true}$' <<<"$chance" ||
  { echo "$chance"; echo "FAIL: the run at chance level did not say so"; exit 1; }
if grep -q '^\[1,1\]<stdout>:.*chance level' <<<"$chance"; then
  echo "FAIL: rank 1 warned too"; exit 1
fi

# --autocast: bf16 forwards with bf16 all-reduces (--ddp_compression) learn as float32 does;
# fp16 (a GradScaler on every rank, fp16 all-reduces) killed in epoch 2 and resumed from its
# checkpoint, which keeps the scale, ends with the uninterrupted job's model bit for bit; the
# checkpoint is refused by a job without --autocast=fp16, naming the precision.
amp="$(ranks2 "${base[@]}" --autocast=bf16 --ddp_compression=bf16 2>&1)" ||
  { echo "$amp"; echo "FAIL: the --autocast=bf16 --ddp_compression=bf16 job failed"; exit 1; }
grep -qx '\[1,0\]<stdout>:Autocast to bfloat16 (--autocast)' <<<"$amp" &&
  grep -qx '\[1,0\]<stdout>:Gradients all-reduced in bfloat16 (--ddp_compression)' <<<"$amp" ||
  { echo "$amp"; echo "FAIL: the bf16 job did not say it autocasts and compresses"; exit 1; }
amp_accuracy="$(grep '^\[1,0\]<stdout>:{"model"' <<<"$amp" | sed 's/.*"test_accuracy":\([0-9.]*\).*/\1/')"
awk -v a="$amp_accuracy" 'BEGIN { exit !(a > 0.4) }' ||
  { echo "$amp"; echo "FAIL: bf16 test accuracy $amp_accuracy, expected above 0.4"; exit 1; }
fp16=("${base[@]}" --autocast=fp16 --ddp_compression=fp16)
ranks2 "${fp16[@]}" --checkpoint="$logs/fp16_straight.ckpt" --save="$logs/fp16_straight.model" \
  >/dev/null 2>&1 || { echo "FAIL: the fp16 job failed"; exit 1; }
rc=0
ranks2 "${fp16[@]}" --checkpoint="$logs/fp16.ckpt" --kill_in_epoch=2 >/dev/null 2>&1 || rc=$?
[[ $rc != 0 ]] || { echo "FAIL: the fp16 job killed in epoch 2 exited 0"; exit 1; }
fp16_resumed="$(ranks2 "${fp16[@]}" --checkpoint="$logs/fp16.ckpt" \
  --save="$logs/fp16_resumed.model" 2>&1)" ||
  { echo "$fp16_resumed"; echo "FAIL: the resumed fp16 job failed"; exit 1; }
grep -q 'Resuming from .*fp16.ckpt: 1 of 2 epochs done' <<<"$fp16_resumed" ||
  { echo "$fp16_resumed"; echo "FAIL: the fp16 job did not resume after epoch 1"; exit 1; }
cmp "$logs/fp16_straight.model" "$logs/fp16_resumed.model" ||
  { echo "FAIL: the resumed fp16 job's model differs from the uninterrupted job's"; exit 1; }
rc=0
refused="$(ranks2 "${base[@]}" --checkpoint="$logs/fp16.ckpt" 2>&1)" || rc=$?
[[ $rc == 1 ]] && grep -qF 'was saved by a run with model=mlp optimizer=sgd autocast=float16 but this run has model=mlp optimizer=sgd;' <<<"$refused" ||
  { echo "$refused"; echo "FAIL: a float32 job resumed the fp16 checkpoint (exit $rc)"; exit 1; }

# --sharding=zero1 (ZeroRedundancyOptimizer, Adam's two moments kept by each parameter's owner
# rank alone) trains the model DDP's plain optimizer does, bit for bit. Its checkpoint holds the
# whole optimizer state, gathered to rank 0: a job without --sharding resumes it exactly as a
# --sharding=zero1 job resumes the plain one's (ZeRO state lost in the gathering would make the
# two resumed models differ).
adam=("${base[@]}" --optimizer=adam --lr=0.001)
ranks2 "${adam[@]}" --epochs=1 --checkpoint="$logs/plain.ckpt" --save="$logs/plain.model" \
  >/dev/null 2>&1 || { echo "FAIL: the Adam job without --sharding failed"; exit 1; }
zero="$(ranks2 "${adam[@]}" --epochs=1 --sharding=zero1 --checkpoint="$logs/zero.ckpt" \
  --save="$logs/zero.model" 2>&1)" || { echo "$zero"; echo "FAIL: the --sharding=zero1 job failed"; exit 1; }
grep -qE '^\[1,0\]<stdout>:Optimizer state sharded across the ranks \(--sharding=zero1, ZeroRedundancyOptimizer\): [0-9.]+%, [0-9.]+% of the [0-9]+ parameters' <<<"$zero" &&
  grep -q '^\[1,0\]<stdout>:{"model".*"sharding":"zero1"' <<<"$zero" ||
  { echo "$zero"; echo "FAIL: the zero1 job did not say it shards the optimizer state"; exit 1; }
cmp "$logs/plain.model" "$logs/zero.model" ||
  { echo "FAIL: the --sharding=zero1 job's model differs from the plain optimizer's"; exit 1; }
# --sharding=shard_grad_op and full (FullyShardedDataParallel: gradients, Adam's moments and,
# under full, the parameters sharded) train the plain optimizer's model too, bit for bit on 2
# ranks (the reduce-scatter adds two ranks' gradients as the all-reduce does). Their checkpoints
# are sharded (each rank its file, the --checkpoint file an index written last): a full job
# resumes its own as it resumes the plain job's whole checkpoint (the same model), 3 ranks
# resume 2 ranks' (resharded), and a job without sharding refuses it, saying why.
cp "$logs/plain.ckpt" "$logs/plain_for_full.ckpt"
for sharding in zero2 full; do
  fsdp="$(ranks2 "${adam[@]}" --epochs=1 --sharding=$sharding --checkpoint="$logs/$sharding.ckpt" \
    --save="$logs/$sharding.model" 2>&1)" ||
    { echo "$fsdp"; echo "FAIL: the --sharding=$sharding job failed"; exit 1; }
  grep -qE "^\[1,0\]<stdout>:Parameters, gradients and optimizer state sharded across the ranks \(--sharding=$sharding, (FULL_SHARD|SHARD_GRAD_OP)\): [0-9]+ units" <<<"$fsdp" &&
    grep -q "^\[1,0\]<stdout>:{\"model\".*\"sharding\":\"$sharding\"" <<<"$fsdp" ||
    { echo "$fsdp"; echo "FAIL: the --sharding=$sharding job did not say it shards"; exit 1; }
  cmp "$logs/plain.model" "$logs/$sharding.model" ||
    { echo "FAIL: the --sharding=$sharding job's model differs from the plain optimizer's"; exit 1; }
done
# --autocast=fp16 under --sharding=full: a ShardedGradScaler unscales each rank's shard and the
# ranks agree on every skipped step; the model is the plain fp16 job's, bit for bit.
ranks2 "${base[@]}" --epochs=1 --autocast=fp16 --save="$logs/fp16_plain.model" >/dev/null 2>&1 ||
  { echo "FAIL: the plain fp16 job failed"; exit 1; }
fp16_full="$(ranks2 "${base[@]}" --epochs=1 --autocast=fp16 --sharding=full \
  --save="$logs/fp16_full.model" 2>&1)" || { echo "$fp16_full"; echo "FAIL: the fp16 --sharding=full job failed"; exit 1; }
cmp "$logs/fp16_plain.model" "$logs/fp16_full.model" ||
  { echo "FAIL: the fp16 --sharding=full job's model differs from the plain fp16 job's"; exit 1; }
ls "$logs"/full.ckpt.*.rank0-of-2 "$logs"/full.ckpt.*.rank1-of-2 >/dev/null ||
  { ls "$logs"; echo "FAIL: the --sharding=full checkpoint has no shard file per rank"; exit 1; }
rm -rf "$logs/full3.d" && mkdir "$logs/full3.d" && cp "$logs"/full.ckpt* "$logs/full3.d/"
ranks2 "${adam[@]}" --epochs=2 --sharding=full --checkpoint="$logs/full.ckpt" \
  --save="$logs/full_then_full.model" >/dev/null 2>&1 ||
  { echo "FAIL: the --sharding=full job resuming its sharded checkpoint failed"; exit 1; }
ranks2 "${adam[@]}" --epochs=2 --sharding=full --checkpoint="$logs/plain_for_full.ckpt" \
  --save="$logs/plain_then_full.model" >/dev/null 2>&1 ||
  { echo "FAIL: the --sharding=full job resuming the plain checkpoint failed"; exit 1; }
cmp "$logs/full_then_full.model" "$logs/plain_then_full.model" ||
  { echo "FAIL: the sharded checkpoint resumed differs from the whole one resumed"; exit 1; }
rc=0
refused="$(ranks2 "${adam[@]}" --epochs=2 --checkpoint="$logs/full3.d/full.ckpt" 2>&1)" || rc=$?
[[ $rc != 0 ]] && grep -qF "is a sharded checkpoint (of --distributed --sharding=full or shard_grad_op" <<<"$refused" ||
  { echo "$refused"; echo "FAIL: a job without sharding did not refuse the sharded checkpoint (exit $rc)"; exit 1; }
resharded="$(timeout 300 mpirun --oversubscribe --bind-to none --tag-output -np 3 "$train" \
  "${adam[@]}" --epochs=2 --sharding=full --checkpoint="$logs/full3.d/full.ckpt" 2>&1)" ||
  { echo "$resharded"; echo "FAIL: 3 ranks did not resume 2 ranks' sharded checkpoint"; exit 1; }
grep -q 'Resuming from .*full.ckpt: 1 of 2 epochs done' <<<"$resharded" &&
  grep -q '^\[1,0\]<stdout>:{"model".*"ranks":3,"sharding":"full"' <<<"$resharded" ||
  { echo "$resharded"; echo "FAIL: the 3-rank resume of the sharded checkpoint did not say so"; exit 1; }
ls "$logs"/full3.d/full.ckpt.*.rank2-of-3 >/dev/null &&
  ! ls "$logs"/full3.d/full.ckpt.*-of-2 >/dev/null 2>&1 ||
  { ls "$logs/full3.d"; echo "FAIL: the 3-rank save did not replace the 2-rank shard files"; exit 1; }
ranks2 "${adam[@]}" --epochs=2 --checkpoint="$logs/zero.ckpt" --save="$logs/zero_then_plain.model" \
  >/dev/null 2>&1 || { echo "FAIL: the plain job resuming the zero1 checkpoint failed"; exit 1; }
ranks2 "${adam[@]}" --epochs=2 --sharding=zero1 --checkpoint="$logs/plain.ckpt" \
  --save="$logs/plain_then_zero.model" >/dev/null 2>&1 ||
  { echo "FAIL: the zero1 job resuming the plain checkpoint failed"; exit 1; }
cmp "$logs/zero_then_plain.model" "$logs/plain_then_zero.model" ||
  { echo "FAIL: a zero1 checkpoint resumed without --sharding differs from the reverse"; exit 1; }
# Another world size: 3 ranks' zero1 checkpoint resumed by 2 ranks re-shards the whole state
# it holds (the same model with and without --sharding), and by the single-process trainer.
timeout 300 mpirun --oversubscribe --bind-to none --tag-output -np 3 "$train" "${adam[@]}" \
  --epochs=1 --sharding=zero1 --checkpoint="$logs/zero3.ckpt" >/dev/null 2>&1 ||
  { echo "FAIL: the 3-rank --sharding=zero1 job failed"; exit 1; }
cp "$logs/zero3.ckpt" "$logs/zero3_copy.ckpt"
cp "$logs/zero3.ckpt" "$logs/zero3_single.ckpt"
resharded="$(ranks2 "${adam[@]}" --epochs=2 --sharding=zero1 --checkpoint="$logs/zero3.ckpt" \
  --save="$logs/zero3_then_zero2.model" 2>&1)" ||
  { echo "$resharded"; echo "FAIL: 2 zero1 ranks did not resume 3 ranks' checkpoint"; exit 1; }
grep -q 'Resuming from .*zero3.ckpt: 1 of 2 epochs done' <<<"$resharded" &&
  grep -q 'note: the checkpoint was made with distributed ranks=3' <<<"$resharded" ||
  { echo "$resharded"; echo "FAIL: the 2-rank resume of 3 ranks' checkpoint did not say so"; exit 1; }
ranks2 "${adam[@]}" --epochs=2 --checkpoint="$logs/zero3_copy.ckpt" \
  --save="$logs/zero3_then_plain2.model" >/dev/null 2>&1 ||
  { echo "FAIL: 2 plain ranks did not resume 3 zero1 ranks' checkpoint"; exit 1; }
cmp "$logs/zero3_then_zero2.model" "$logs/zero3_then_plain2.model" ||
  { echo "FAIL: 3 ranks' zero1 checkpoint resumed on 2 differs with and without --sharding"; exit 1; }
single_resume="$("$train" --devices=cpu:0 --threads=1 --batch_size=64 --train_limit=2048 \
  --test_limit=500 --workers=0 --optimizer=adam --lr=0.001 --epochs=2 \
  --checkpoint="$logs/zero3_single.ckpt" 2>&1)" ||
  { echo "$single_resume"; echo "FAIL: one process did not resume 3 zero1 ranks' checkpoint"; exit 1; }
grep -q 'Resuming from .*zero3_single.ckpt: 1 of 2 epochs done' <<<"$single_resume" ||
  { echo "$single_resume"; echo "FAIL: one process did not resume after epoch 1"; exit 1; }
# --sync_bn: the ResNet's BatchNorm layers normalise over both ranks' batches; the MLP has none.
sync="$(ranks2 --distributed --devices=cpu:0 --threads=1 --model=resnet --epochs=1 \
  --batch_size=16 --train_limit=128 --test_limit=64 --workers=0 --sync_bn 2>&1)" ||
  { echo "$sync"; echo "FAIL: the --sync_bn ResNet job failed"; exit 1; }
grep -qx '\[1,0\]<stdout>:BatchNorm over every rank.s batch together (--sync_bn): [0-9]* layers synchronized' <<<"$sync" &&
  grep -q '^\[1,0\]<stdout>:{"model":"resnet"' <<<"$sync" ||
  { echo "$sync"; echo "FAIL: the --sync_bn job did not say it synchronizes BatchNorm"; exit 1; }
rc=0
nobn="$(ranks2 "${base[@]}" --sync_bn 2>&1)" || rc=$?
[[ $rc == 1 ]] && grep -qF -- "--sync_bn synchronizes BatchNorm layers but --model=mlp has none" <<<"$nobn" ||
  { echo "$nobn"; echo "FAIL: --sync_bn on the MLP was not refused (exit $rc)"; exit 1; }
rc=0
bad="$(ranks2 "${base[@]}" --sharding=zero3 2>&1)" || rc=$?
# (each rank stops on its own before the ranks connect; mpirun may end one before it prints)
[[ $rc == 1 ]] && grep -qE "^\[1,[01]\]<stderr>:train \(rank [01]\): --sharding must be 'none' \(every rank keeps the whole model and optimizer state\), 'zero1' \(the optimizer state sharded across the ranks\), 'zero2' or 'shard_grad_op' \(gradients too\) or 'full' \(parameters too\) but is 'zero3'" <<<"$bad" ||
  { echo "$bad"; echo "FAIL: --sharding=zero3 was not refused (exit $rc)"; exit 1; }
rc=0
bad="$(ranks2 "${base[@]}" --sharding=full --ddp_compression=bf16 2>&1)" || rc=$?
[[ $rc == 1 ]] && grep -qF -- "--ddp_compression compresses DistributedDataParallel's all-reduce, but --sharding=full reduce-scatters with FullyShardedDataParallel" <<<"$bad" ||
  { echo "$bad"; echo "FAIL: --sharding=full with --ddp_compression was not refused (exit $rc)"; exit 1; }

# Data that does not divide evenly (2049 examples over 2 ranks: 1025 and 1024, 17 and 16 steps)
# is used once an epoch, not padded: the rank with fewer steps shadows the other's last under a
# Join (parallel/distributed/join_test checks the numbers), and the job ends, where a rank left
# waiting would time out.
uneven="$(ranks2 "${base[@]}" --train_limit=2049 --epochs=2 2>&1)" ||
  { echo "$uneven"; echo "FAIL: the uneven job failed"; exit 1; }
grep -q '1024 or 1025 examples per rank per epoch (each example once; a Join evens out the steps)' <<<"$uneven" &&
  grep -q '^\[1,0\]<stdout>:{"model".*"epochs":2' <<<"$uneven" ||
  { echo "$uneven"; echo "FAIL: the uneven job did not say it uses every example once"; exit 1; }

# Ranks that disagree: started as MPMD (one mpirun, two command lines), every rank refuses at
# start with the same one-line error naming what differs and each rank's value, exit status
# 1, no hang (before: --epochs 3 against 2 waited forever, --batch_size failed with
# MPI_ERR_IN_STATUS, --optimizer or --seed trained on without a word).
# mpmd EXPECTED RANK1_FLAGS...: rank 1 gets the extra flags; both ranks must print EXPECTED.
mpmd() {
  local expected="$1"
  shift
  local rc=0
  mismatch="$(timeout 120 mpirun --oversubscribe --bind-to none --tag-output \
    -np 1 "$train" "${base[@]}" : -np 1 "$train" "${base[@]}" "$@" 2>&1)" || rc=$?
  [[ $rc == 1 ]] || { echo "$mismatch"; echo "FAIL: rank 1 with $*: exit status $rc, expected 1"; exit 1; }
  for r in 0 1; do
    grep -qF "[1,$r]<stderr>:train (rank $r): the 2 ranks disagree on $expected; start every rank" \
      <<<"$mismatch" || { echo "$mismatch"; echo "FAIL: rank $r with $*: expected '$expected'"; exit 1; }
  done
}
mpmd "--epochs (2 on rank 0, 3 on rank 1)" --epochs=3
mpmd "--batch_size (64 on rank 0, 128 on rank 1)" --batch_size=128
mpmd "--train_limit (2048 on rank 0, 1024 on rank 1)" --train_limit=1024
mpmd "--optimizer (sgd on rank 0, adam on rank 1)" --optimizer=adam
mpmd "--seed (1 on rank 0, 2 on rank 1)" --seed=2
mpmd "--lr (0.05 on rank 0, 0.1 on rank 1)" --lr=0.1
mpmd "--model (mlp on rank 0, cnn on rank 1)" --model=cnn
mpmd "--sharding (none on rank 0, zero1 on rank 1)" --sharding=zero1
# Same flags, other data: rank 1 reads a copy of the first 1,000 training images (plain IDX
# files with their own headers), so the data sizes differ.
small="$logs/small_data"
mkdir -p "$small"
set +o pipefail  # head ends the pipes early
{ printf '\x00\x00\x08\x03\x00\x00\x03\xe8\x00\x00\x00\x1c\x00\x00\x00\x1c'
  zcat "$data_dir/train-images-idx3-ubyte.gz" | tail -c +17 | head -c 784000; } \
  >"$small/train-images-idx3-ubyte"
{ printf '\x00\x00\x08\x01\x00\x00\x03\xe8'
  zcat "$data_dir/train-labels-idx1-ubyte.gz" | tail -c +9 | head -c 1000; } \
  >"$small/train-labels-idx1-ubyte"
set -o pipefail
mpmd "training examples (2048 on rank 0, 1000 on rank 1)" \
  --data_dir="$small"
# Each rank's own checkpoint path (one per machine), but rank 1's file does not exist: rank 0
# would resume after epoch 2, rank 1 start from epoch 1.
base+=(--checkpoint="$logs/run.ckpt")
mpmd "epochs done (from --checkpoint) (2 on rank 0, 0 on rank 1); data order (from --checkpoint) (2 on rank 0, 0 on rank 1)" \
  --checkpoint="$logs/other.ckpt"
# Both resume from the same checkpoint, but rank 1 was given another optimizer: the flags are
# compared before the checkpoint is read, so every rank names the flag (before, rank 1 alone
# failed inside the load: the checkpoint "was saved by a run with" sgd).
mpmd "--optimizer (sgd on rank 0, adam on rank 1)" --optimizer=adam

# A rank stopped with SIGSTOP in the middle of training: rank 0 fails within
# --collective_timeout, naming the collective and the rank that did not answer, and the job
# ends (before: the others waited 30 minutes without a word).
stalled="$logs/stalled.txt"
timeout 300 mpirun --oversubscribe --bind-to none --tag-output -np 2 "$train" \
  --distributed --devices=cpu:0 --threads=1 --epochs=1000 --batch_size=64 --train_limit=2048 \
  --test_limit=100 --workers=0 --collective_timeout=2 >"$stalled" 2>&1 &
job=$!
rank1=""
cleanup() {
  if [[ -n "$rank1" ]]; then kill -CONT "$rank1" 2>/dev/null || true; fi
  kill "$job" 2>/dev/null || true
}
trap cleanup EXIT
for _ in $(seq 1200); do
  grep -q '^\[1,0\]<stdout>:epoch *2/' "$stalled" && break
  sleep 0.1
done
for child in $(pgrep -P "$(pgrep -P "$job" mpirun || echo "$job")" || true); do
  if tr '\0' '\n' <"/proc/$child/environ" 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=1'; then
    rank1="$child"
  fi
done
[[ -n "$rank1" ]] || { cat "$stalled"; echo "FAIL: found no rank 1 under mpirun $job"; exit 1; }
kill -STOP "$rank1"
rc=0
wait "$job" || rc=$?
[[ $rc != 124 ]] || { cat "$stalled"; echo "FAIL: the job with a stopped rank was still running after 300 s"; exit 1; }
[[ $rc != 0 ]] || { cat "$stalled"; echo "FAIL: the job with a stopped rank exited 0"; exit 1; }
grep -qE '^\[1,0\]<stderr>:train \(rank 0\): ProcessGroupMpi rank 0 of 2: (allreduce|barrier|broadcast|allgather)[^:]* did not finish within 2\.0 s: rank 1 did not answer \(stopped, hung or dead, or busy outside this group.s collectives\)\. .*raise --collective_timeout if a rank is only slow$' \
  "$stalled" || { cat "$stalled"; echo "FAIL: rank 0 did not name the stopped rank 1 and the collective"; exit 1; }
grep '^\[1,0\]<stderr>:train (rank 0)' "$stalled"
echo "PASS: $json"
