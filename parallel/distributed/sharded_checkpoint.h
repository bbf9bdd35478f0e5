// Sharded checkpoints of FullyShardedDataParallel, as PyTorch's torch.distributed.checkpoint
// with FSDP's SHARDED_STATE_DICT: each rank writes its own shards of the parameters and of the
// optimizer state, so that no rank ever holds the whole model, and a checkpoint written by N
// ranks loads into M: each rank reads the parts of the files that overlap its new shards.
//
//   SaveShardedCheckpoint(fsdp, optimizer, "/ckpt/run");  // run.rank0-of-2, run.rank1-of-2
//   ... later, with 3 ranks:
//   LoadShardedCheckpoint(fsdp, optimizer, "/ckpt/run");  // rank r reads the files it needs
//
// `optimizer` is one over fsdp.parameters() (the flat shards), of any kind: per-element state
// (Adam's moments, SGD's momentum) is resharded as the parameters are, scalars (a step count)
// are copied. The files are nn checkpoint files (nn/checkpoint.h: each written atomically,
// CRC-checked when read):
//   <path>                          the index, written by rank 0 once every shard is written:
//                                   the save's id, its world size, the model's layout (units,
//                                   parameter names and shapes) and the buffers
//   <path>.<id>.rank<r>-of-<N>      rank r's unpadded part of every unit's flat parameters and
//                                   per-element optimizer state, and the optimizer's scalars
// (The index's own entries are named "fsdp.*", its buffers "buffer.<name>".)
// A load reads the index, then only the shard files it names: a save killed part-way leaves the
// previous save whole (its index and files), and a save's last step (rank 0) removes the files
// of earlier saves. A checkpoint loads only into the same model and auto-wrap policy (its
// layout is compared), at any world size.
//
// Both are collective. A rank that fails (a full disk; a missing, truncated or corrupted file;
// another model) makes every rank throw: that rank with the reason, naming the file, the others
// naming that rank.
#ifndef TANDEM_PARALLEL_DISTRIBUTED_SHARDED_CHECKPOINT_H_
#define TANDEM_PARALLEL_DISTRIBUTED_SHARDED_CHECKPOINT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "nn/checkpoint.h"
#include "nn/optimizer.h"
#include "parallel/distributed/fully_sharded_data_parallel.h"

namespace tandem::parallel::distributed {

// `index_extra`: entries rank 0 adds to the index (a trainer's progress: the index is the
// save's one commit point); their names must not begin with "fsdp." or "buffer.".
void SaveShardedCheckpoint(FullyShardedDataParallel& fsdp, const nn::Optimizer& optimizer,
                           const std::string& path,
                           const std::vector<nn::CheckpointEntry>& index_extra = {});
void LoadShardedCheckpoint(FullyShardedDataParallel& fsdp, nn::Optimizer& optimizer,
                           const std::string& path);

// Whether `entries` (a checkpoint file's) are a sharded checkpoint's index.
bool IsShardedCheckpointIndex(const std::vector<nn::CheckpointEntry>& entries);

// "<path>.<save_id>.rank<rank>-of-<world>" (the id in 16 hexadecimal digits).
std::string ShardFileName(const std::string& path, uint64_t save_id, int rank, int world);

}  // namespace tandem::parallel::distributed

#endif  // TANDEM_PARALLEL_DISTRIBUTED_SHARDED_CHECKPOINT_H_
