#include "parallel/distributed/sharded_checkpoint.h"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <map>
#include <random>
#include <sstream>
#include <utility>
#include <vector>

#include "nn/checkpoint.h"
#include "parallel/distributed/internal/optimizer_state_name.h"
#include "tensor/base/error.h"
#include "tensor/base/grad_mode.h"

namespace tandem::parallel::distributed {

std::string ShardFileName(const std::string& path, uint64_t save_id, int rank, int world) {
  char id[17];
  std::snprintf(id, sizeof(id), "%016" PRIx64, save_id);
  return path + "." + id + ".rank" + std::to_string(rank) + "-of-" + std::to_string(world);
}

namespace {

// The units with parameters, in the order of fsdp.parameters().
std::vector<FsdpUnitInfo> ShardedUnits(const FullyShardedDataParallel& fsdp) {
  std::vector<FsdpUnitInfo> units;
  for (FsdpUnitInfo& u : fsdp.units()) {
    if (!u.parameter_names.empty()) units.push_back(std::move(u));
  }
  return units;
}

// What a checkpoint must match: every unit's parameters, names and shapes, in order.
std::string Layout(const FullyShardedDataParallel& fsdp) {
  std::ostringstream out;
  for (const FsdpUnitInfo& u : ShardedUnits(fsdp)) {
    out << "unit " << (u.name.empty() ? "(root)" : u.name) << ":";
    for (size_t i = 0; i < u.parameter_names.size(); ++i) {
      out << " " << u.parameter_names[i] << " " << ShapeToString(u.parameter_shapes[i]);
    }
    out << "\n";
  }
  return out.str();
}

// The elements of a unit's unpadded flat parameters that rank `rank` of `world` holds.
int64_t ShardLength(int64_t numel, int rank, int world) {
  const int64_t shard = (numel + world - 1) / world;
  return std::clamp<int64_t>(numel - rank * shard, 0, shard);
}

Tensor TextTensor(const std::string& text) {
  return from_vector(std::vector<uint8_t>(text.begin(), text.end()),
                     {static_cast<int64_t>(text.size())});
}

std::string TextOf(const Tensor& t) {
  const std::vector<uint8_t> bytes = t.contiguous().to_vector<uint8_t>();
  return std::string(bytes.begin(), bytes.end());
}

Tensor Int64(int64_t value) { return from_vector(std::vector<int64_t>{value}, Shape{}); }

// Every rank learns whether every rank succeeded: throws on all of them if one failed (that
// rank its own error, the others naming the ranks that failed).
void Agree(ProcessGroup& group, const std::string& error, const std::string& what) {
  Tensor failed = zeros({group.size()}, TensorOptions(kInt64).device(group.device()));
  group
      .allgather(failed,
                 full({1}, error.empty() ? 0.0 : 1.0, TensorOptions(kInt64).device(group.device())))
      ->wait();
  const std::vector<int64_t> flags = failed.to(Device::Cpu(0)).to_vector<int64_t>();
  std::string ranks;
  for (int r = 0; r < group.size(); ++r) {
    if (flags[r] != 0) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  }
  if (ranks.empty()) return;
  if (!error.empty()) TANDEM_FAIL(what, " (rank ", group.rank(), "): ", error);
  TANDEM_FAIL(what, " failed on rank ", ranks, " (see its error); rank ", group.rank(),
              " stops too");
}

std::map<std::string, Tensor> ByName(std::vector<nn::CheckpointEntry> entries) {
  std::map<std::string, Tensor> out;
  for (nn::CheckpointEntry& e : entries) out[e.name] = std::move(e.value);
  return out;
}

const Tensor& Need(const std::map<std::string, Tensor>& entries, const std::string& name,
                   const std::string& file) {
  auto it = entries.find(name);
  TANDEM_CHECK(it != entries.end(), file, " has no entry '", name,
               "': it is not a sharded checkpoint of this kind (SaveShardedCheckpoint writes it)");
  return it->second;
}

std::string Directory(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? "." : parent.string();
}

}  // namespace

bool IsShardedCheckpointIndex(const std::vector<nn::CheckpointEntry>& entries) {
  for (const nn::CheckpointEntry& e : entries) {
    if (e.name == "fsdp.save_id") return true;
  }
  return false;
}

void SaveShardedCheckpoint(FullyShardedDataParallel& fsdp, const nn::Optimizer& optimizer,
                           const std::string& path,
                           const std::vector<nn::CheckpointEntry>& index_extra) {
  ProcessGroup& group = *fsdp.process_group();
  const int rank = group.rank(), world = group.size();
  const std::string what = "SaveShardedCheckpoint(" + path + ")";
  NoGradGuard no_grad;
  // One id for this save, drawn by rank 0: it names the files and ties them to the index.
  Tensor id = zeros({1}, TensorOptions(kInt64).device(group.device()));
  if (rank == 0) {
    std::random_device random;
    const uint64_t drawn =
        (uint64_t{random()} << 32) ^ random() ^
        static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    id = full({1}, 0.0, TensorOptions(kInt64).device(group.device()));
    id.copy_(from_vector(std::vector<int64_t>{static_cast<int64_t>(drawn >> 1)}, {1}));
  }
  group.broadcast(id, 0)->wait();
  const uint64_t save_id = static_cast<uint64_t>(id.to(Device::Cpu(0)).to_vector<int64_t>()[0]);

  std::string error;
  try {
    const std::vector<FsdpUnitInfo> units = ShardedUnits(fsdp);
    const std::vector<Tensor> shards = fsdp.parameters();
    std::vector<nn::CheckpointEntry> entries = {{"fsdp.save_id", false, Int64(save_id)},
                                                {"fsdp.world_size", false, Int64(world)},
                                                {"fsdp.rank", false, Int64(rank)}};
    for (size_t k = 0; k < units.size(); ++k) {
      const int64_t mine = ShardLength(units[k].numel, rank, world);
      entries.push_back({"fsdp.flat." + std::to_string(k), false,
                         shards[k].detach().narrow(0, 0, mine).to(Device::Cpu(0)).clone()});
    }
    for (const auto& [name, value] : optimizer.state_dict()) {
      // An optimizer over fsdp.parameters(): one flat shard per unit with parameters.
      const size_t k =
          internal::SplitOptimizerStateName("the optimizer's ", name, units.size()).first;
      const bool per_element = value.dim() == 1 && value.numel() == units[k].shard_numel;
      const Tensor part =
          per_element ? value.narrow(0, 0, ShardLength(units[k].numel, rank, world)) : value;
      entries.push_back({"optim." + name, false, part.to(Device::Cpu(0)).clone()});
    }
    nn::WriteCheckpoint(entries, ShardFileName(path, save_id, rank, world));
  } catch (const std::exception& e) {
    error = e.what();
  }
  Agree(group, error, what);

  // The index last: a load finds this save only once every shard is written.
  if (rank == 0) {
    try {
      std::vector<nn::CheckpointEntry> index = {{"fsdp.save_id", false, Int64(save_id)},
                                                {"fsdp.world_size", false, Int64(world)},
                                                {"fsdp.layout", false, TextTensor(Layout(fsdp))}};
      for (const nn::NamedTensor& b : fsdp.module()->named_buffers()) {
        index.push_back({"buffer." + b.name, true, b.value.to(Device::Cpu(0)).clone()});
      }
      for (const nn::CheckpointEntry& e : index_extra) {
        TANDEM_CHECK(e.name.rfind("fsdp.", 0) != 0 && e.name.rfind("buffer.", 0) != 0,
                     "SaveShardedCheckpoint: the extra index entry '", e.name,
                     "' would clash with the index's own (fsdp.*, buffer.*); rename it");
        index.push_back(e);
      }
      nn::WriteCheckpoint(index, path);
      // Earlier saves' shard files (any world size) are no longer named by the index.
      const std::string base = std::filesystem::path(path).filename().string() + ".";
      const std::string current = ShardFileName(path, save_id, 0, world);
      const std::string current_id =
          std::filesystem::path(current).filename().string().substr(base.size(), 16);
      for (const auto& file : std::filesystem::directory_iterator(Directory(path))) {
        const std::string name = file.path().filename().string();
        if (name.size() > base.size() + 17 && name.compare(0, base.size(), base) == 0 &&
            name.compare(base.size() + 16, 5, ".rank") == 0 &&
            name.compare(base.size(), 16, current_id) != 0) {
          std::error_code ignored;
          std::filesystem::remove(file.path(), ignored);
        }
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  Agree(group, error, what);
}

void LoadShardedCheckpoint(FullyShardedDataParallel& fsdp, nn::Optimizer& optimizer,
                           const std::string& path) {
  ProcessGroup& group = *fsdp.process_group();
  const int rank = group.rank(), world = group.size();
  const std::string what = "LoadShardedCheckpoint(" + path + ")";
  NoGradGuard no_grad;
  std::string error;
  try {
    const std::map<std::string, Tensor> index = ByName(nn::ReadCheckpoint(path));
    const uint64_t save_id =
        static_cast<uint64_t>(Need(index, "fsdp.save_id", path).to_vector<int64_t>()[0]);
    const int saved_world =
        static_cast<int>(Need(index, "fsdp.world_size", path).to_vector<int64_t>()[0]);
    TANDEM_CHECK(saved_world >= 1, path, " says it was saved by ", saved_world, " ranks");
    const std::string layout = TextOf(Need(index, "fsdp.layout", path));
    const std::string ours = Layout(fsdp);
    if (layout != ours) {
      std::istringstream a(layout), b(ours);
      std::string line_a, line_b;
      while (std::getline(a, line_a) && std::getline(b, line_b) && line_a == line_b) {
      }
      TANDEM_FAIL(
          path, " holds another model or auto-wrap policy: it has '", line_a,
          "' where this model has '", line_b,
          "'; load it into the model and FullyShardedDataParallelOptions it was saved with");
    }

    const std::vector<FsdpUnitInfo> units = ShardedUnits(fsdp);
    // The saved ranks whose files overlap this rank's new shards.
    std::map<int, std::map<std::string, Tensor>> files;
    auto file_of = [&](int q) -> const std::map<std::string, Tensor>& {
      auto it = files.find(q);
      if (it != files.end()) return it->second;
      const std::string name = ShardFileName(path, save_id, q, saved_world);
      TANDEM_CHECK(std::filesystem::exists(name), "rank ", q, "'s shard file ", name,
                   " of the save that ", path,
                   " names is missing; restore it, or load another "
                   "checkpoint");
      std::map<std::string, Tensor> entries = ByName(nn::ReadCheckpoint(name));
      TANDEM_CHECK(static_cast<uint64_t>(
                       Need(entries, "fsdp.save_id", name).to_vector<int64_t>()[0]) == save_id &&
                       Need(entries, "fsdp.rank", name).to_vector<int64_t>()[0] == q,
                   name, " is not rank ", q, "'s shard of the save that ", path, " names");
      return files.emplace(q, std::move(entries)).first->second;
    };

    std::vector<Tensor> flats;
    nn::OptimizerState state;
    for (size_t k = 0; k < units.size(); ++k) {
      const int64_t numel = units[k].numel, shard = units[k].shard_numel;
      const int64_t begin = rank * shard, end = begin + ShardLength(numel, rank, world);
      const int64_t saved_shard = (numel + saved_world - 1) / saved_world;
      std::vector<int> sources;
      for (int q = 0; q < saved_world; ++q) {
        const int64_t q_begin = q * saved_shard;
        const int64_t q_end = q_begin + ShardLength(numel, q, saved_world);
        if (q_begin < end && begin < q_end) sources.push_back(q);
      }
      // A rank with no elements of this unit still takes its scalar state (from rank 0's file).
      const int scalars_from = sources.empty() ? 0 : sources[0];
      const std::string flat_name = "fsdp.flat." + std::to_string(k);
      const std::string prefix = "optim.state." + std::to_string(k) + ".";
      // This rank's new shard of one saved per-element tensor (zeros in the padding).
      auto assemble = [&](const std::string& entry, DType dtype) {
        Tensor out = zeros({shard}, TensorOptions(dtype));
        for (int q : sources) {
          const std::string file = ShardFileName(path, save_id, q, saved_world);
          const Tensor& part = Need(file_of(q), entry, file);
          const int64_t q_begin = q * saved_shard;
          TANDEM_CHECK(part.dim() == 1 && part.numel() == ShardLength(numel, q, saved_world), file,
                       " holds ", part.numel(), " elements of '", entry, "' but rank ", q, " of ",
                       saved_world, " holds ", ShardLength(numel, q, saved_world));
          const int64_t from = std::max(begin, q_begin);
          const int64_t to = std::min(end, q_begin + part.numel());
          out.narrow(0, from - begin, to - from).copy_(part.narrow(0, from - q_begin, to - from));
        }
        return out;
      };
      flats.push_back(assemble(flat_name, fsdp.parameters()[k].dtype()));
      for (const auto& [entry, value] : file_of(scalars_from)) {
        if (entry.compare(0, prefix.size(), prefix) != 0) continue;
        const std::string key = entry.substr(6);  // "state.<k>.<field>"
        // Per-element fields have a dimension (the shard's elements); scalars have none.
        state[key] = value.dim() == 1 ? assemble(entry, value.dtype()) : value;
      }
    }
    optimizer.load_state_dict(state);  // checks everything before changing it
    const std::vector<Tensor> shards = fsdp.parameters();
    for (size_t k = 0; k < shards.size(); ++k) {
      shards[k].detach().copy_(flats[k]);
    }
    std::vector<nn::NamedTensor> buffers;
    for (const nn::NamedTensor& b : fsdp.module()->named_buffers()) {
      buffers.push_back({b.name, Need(index, "buffer." + b.name, path)});
    }
    fsdp.module()->load_state_dict(buffers, /*strict=*/false);
  } catch (const std::exception& e) {
    error = e.what();
  }
  Agree(group, error, what);
}

}  // namespace tandem::parallel::distributed
