// The trainer's --distributed strategy (examples/train_strategy.h): one process per device, started
// by mpirun, training the Fashion-MNIST classifier or the GPT on text (the trainer's Task,
// examples/task.h) with parallel::distributed::DistributedDataParallel over Open MPI. Each rank
// reads its share of every epoch (data::DistributedSampler) in batches of --batch_size (per rank,
// as in PyTorch), the gradients are averaged across ranks in backward, and rank 0 alone prints
// progress, evaluates on the test set, writes the checkpoint and prints the final JSON line (with
// "ranks").
//
//   mpirun -np 2 bazel-bin/examples/train --distributed --devices=cpu:0
//   mpirun -H host1,host2 -np 2 /path/to/train --distributed      # one rank per machine
//
// Device: the one --devices names, or cuda:<local rank> where GPUs exist, else cpu:0 with
// --threads threads (default: the machine's cores shared among the ranks on it). Before the
// first step every rank checks that all agree on every setting of the trainer except those
// that may differ per rank or machine (the device, --threads, --workers, paths, and what rank
// 0 alone writes; NamedSettings in examples/trainer.h marks them), on the training data's
// size and steps per epoch, and on the
// epoch a checkpoint resumes at; otherwise every rank prints the same error naming each
// difference and every rank's value, and exits with status 1. A collective that waits longer
// than --collective_timeout seconds fails, naming the ranks that did not answer, and ends the
// job.
//
// --checkpoint holds one random generator state, rank 0's, for every rank: the ranks seed
// theirs alike and draw alike (rank 0 checks at each save and prints a note if they do not),
// so a job resumed from it, on any devices, restores it on each rank's device and repeats the
// uninterrupted job exactly. A checkpoint of the single-process trainer restores each rank's
// own device's state; a rank whose device has none says that its generator starts afresh from
// --seed. The summary ends as the single-process trainer's does: a warning when the final
// accuracy is at chance level (the JSON line has "at_chance_level"), or for --model=gpt the
// sample of rank 0's trained model (the JSON line has "sample").
//
// --autocast=bf16|fp16 runs each rank's forward (and rank 0's evaluation) under autocast, fp16
// with a GradScaler whose state the checkpoint keeps; --ddp_compression=bf16|fp16 all-reduces
// the gradient buckets in that dtype (DistributedDataParallelOptions::gradient_compression).
//
//   mpirun -np 2 bazel-bin/examples/train --distributed --autocast=bf16 --ddp_compression=bf16
//
// --sharding=zero1 wraps the optimizer in parallel::distributed::ZeroRedundancyOptimizer: each
// rank keeps the optimizer state of its share of the parameters (1/N of it), steps that share
// and broadcasts it; the parameters are the plain optimizer's, bit for bit. Its checkpoint holds
// the whole state, gathered to rank 0, so it resumes with or without --sharding, on any number
// of ranks.
//
//   mpirun -np 2 bazel-bin/examples/train --distributed --optimizer=adamw --sharding=zero1
//
// --sharding=full (FULL_SHARD, ZeRO-3) and zero2 or shard_grad_op (SHARD_GRAD_OP, ZeRO-2) wrap the
// model in parallel::distributed::FullyShardedDataParallel (a unit per GPT block, else per
// layer with parameters): each rank keeps 1/N of the gradients, the optimizer state and, under
// full, the parameters; again the plain optimizer's numbers. Its checkpoints are sharded (each
// rank writes its shard, rank 0 the --checkpoint file as the index) and resume with full or
// shard_grad_op on any number of ranks; a whole checkpoint (of none or zero1) resumes too. Rank
// 0's evaluation and --save gather the whole model on every rank first.
//
//   mpirun -np 2 bazel-bin/examples/train --distributed --model=gpt --sharding=full
//
// Data that does not divide evenly over the ranks is used once an epoch (no padding): the
// ranks' shares differ by one example, and a rank with a step fewer shadows the others' last
// under a parallel::distributed::Join, taking the same optimizer step. With --sharding or
// --sync_bn (collectives a Join does not shadow) the shares are padded to be equal instead.
//
// --sync_bn makes every BatchNorm of the model (--model=resnet) normalise with the
// statistics of every rank's batch together (parallel::distributed::ConvertSyncBatchNorm).
#ifndef TANDEM_EXAMPLES_DISTRIBUTED_TRAINING_H_
#define TANDEM_EXAMPLES_DISTRIBUTED_TRAINING_H_

#include <memory>

#include "examples/train_strategy.h"

namespace tandem::examples {

// DistributedDataParallel over the ranks of an mpirun job, one device per process.
std::unique_ptr<TrainStrategy> MakeDistributedStrategy();

}  // namespace tandem::examples

#endif  // TANDEM_EXAMPLES_DISTRIBUTED_TRAINING_H_
