// Checkpoints: a module's state (every parameter and buffer: name, shape, dtype, values)
// in a file, and back.
//
//   nn::SaveCheckpoint(*model, "/tmp/mlp.ckpt");
//   nn::LoadCheckpoint(*model, "/tmp/mlp.ckpt");   // same architecture, any device
//
// Saving writes the file atomically (tensor/base/atomic_file.h: a temporary file next to the
// target, fsynced and renamed over it), so a failed or interrupted save leaves the previous
// file as it was and says why (e.g. "No space left on device"); the temporary files of
// earlier saves to the same path that were killed part-way are removed. Saving through a
// symbolic link replaces the link's target and keeps the link; the file keeps its mode, and a
// new one gets 0666 less the umask. Loading
// reads and verifies the whole file and checks it against the module before changing
// anything: a truncated or corrupted file, or one whose names, shapes or dtypes do not
// match the module, is refused with an error saying what is wrong, and the module is left
// as it was. Values are copied into the module's tensors in place (they keep their
// devices, and optimizers holding them stay valid).
//
// File format (version 1; integers little-endian):
//   header:  "TANDEMCK" | u32 version | u32 record count | u32 CRC32 of the previous 16 bytes
//   record:  u32 body length | body | u32 CRC32 of the body
//   body:    u8 kind (0 parameter, 1 buffer) | u8 dtype (0 float32, 1 int64, 2 float64: DType)
//            | u32 name length | name (UTF-8) | u32 rank | i64 sizes[rank]
//            | u64 data length | data (row-major, little-endian elements)
// and nothing after the last record.
#ifndef TANDEM_NN_CHECKPOINT_H_
#define TANDEM_NN_CHECKPOINT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "nn/module.h"
#include "tensor/tensor.h"

namespace tandem::nn {

// One tensor of a checkpoint: its dotted name, whether it is a buffer, and its values (on
// the CPU).
struct CheckpointEntry {
  std::string name;
  bool is_buffer = false;
  Tensor value;
};

void SaveCheckpoint(const Module& module, const std::string& path);
void LoadCheckpoint(Module& module, const std::string& path);

// The most bytes ReadCheckpoint (and LoadCheckpoint) reads by default: 16 GiB. A larger
// regular file is refused before it is read; a device or pipe (/dev/zero) when it passes
// the cap, or at once when its first 8 bytes are not a checkpoint's.
inline constexpr uint64_t kMaxCheckpointBytes = uint64_t{16} << 30;

// The file level, for tools and tests: entries in, entries out (values on cpu:0).
void WriteCheckpoint(const std::vector<CheckpointEntry>& entries, const std::string& path);
std::vector<CheckpointEntry> ReadCheckpoint(const std::string& path,
                                            uint64_t max_bytes = kMaxCheckpointBytes);

// The pieces of SaveCheckpoint and LoadCheckpoint, for files that hold more than one module
// (a trainer's checkpoint: model, optimizer state, progress). ModuleCheckpointEntries gives
// the entries SaveCheckpoint writes (values as they are, on their devices);
// LoadModuleEntries loads exactly such entries (all of them, nothing else) as
// LoadCheckpoint does, checking everything first; `path` names their file in errors.
std::vector<CheckpointEntry> ModuleCheckpointEntries(const Module& module);
void LoadModuleEntries(Module& module, const std::vector<CheckpointEntry>& entries,
                       const std::string& path);

}  // namespace tandem::nn

#endif  // TANDEM_NN_CHECKPOINT_H_
