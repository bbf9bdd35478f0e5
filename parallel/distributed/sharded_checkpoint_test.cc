// Runs as an MPI job (mpi_test.sh, 2 and 3 ranks). A checkpoint resumed at the same world size
// continues as the uninterrupted run, to the bit; one written by N ranks loads into one rank
// (every rank alone, over a group of its own) and back, equal to the full state; missing,
// corrupted and foreign files are refused on every rank, naming the file.
#include "parallel/distributed/sharded_checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "nn/nn.h"
#include "parallel/distributed/fully_sharded_data_parallel.h"
#include "parallel/distributed/mpi_testing.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace tandem::parallel::distributed {
namespace {

using testing::ErrorOf;
using ::testing::HasSubstr;
using testing::MaxAbsDiff;

class ShardedCheckpointTest : public MpiTest {};

// A group of one rank (this process alone): a world of size 1 inside the MPI job.
class SelfGroup : public ProcessGroup {
 public:
  SelfGroup() : ProcessGroup(0, 1) {}
  std::string backend() const override { return "self"; }
  std::shared_ptr<Work> allreduce(Tensor, ReduceOp) override { return Done("allreduce"); }
  std::shared_ptr<Work> broadcast(Tensor, int) override { return Done("broadcast"); }
  std::shared_ptr<Work> allgather(Tensor output, Tensor input) override {
    output.copy_(input);
    return Done("allgather");
  }
  std::shared_ptr<Work> reduce_scatter(Tensor output, Tensor input, ReduceOp) override {
    output.copy_(input);
    return Done("reduce_scatter");
  }
  std::shared_ptr<Work> barrier() override { return Done("barrier"); }

 private:
  static std::shared_ptr<Work> Done(const std::string& what) {
    auto work = std::make_shared<Work>(what);
    work->Start();
    work->Finish();
    return work;
  }
};

// Uneven units: 105 + 15, 45 + 3 (with a BatchNorm's buffers), 33 + 11 elements.
std::shared_ptr<nn::Sequential> MakeModel(uint64_t seed = 7) {
  manual_seed(seed);
  return std::make_shared<nn::Sequential>(nn::Linear(7, 15), nn::Tanh(), nn::Linear(15, 3),
                                          nn::BatchNorm1d(3), nn::Linear(3, 11));
}

FullyShardedDataParallelOptions Options() {
  return FullyShardedDataParallelOptions().auto_wrap_policy(
      [](const std::string& name, const nn::Module&) { return name == "0" || name == "2"; });
}

std::unique_ptr<nn::Optimizer> MakeOptimizer(FullyShardedDataParallel& fsdp) {
  return std::make_unique<nn::AdamW>(fsdp.parameters(), nn::AdamWOptions(1e-2).weight_decay(0.1));
}

void Train(FullyShardedDataParallel& fsdp, nn::Optimizer& optimizer, int step, int rank) {
  Generator gen(100 * step + rank);
  const Tensor x = randn({4, 7}, {}, &gen), y = randn({4, 11}, {}, &gen);
  optimizer.zero_grad();
  mse_loss(fsdp.forward(x), y).backward();
  optimizer.step();
}

// A directory every rank shares (rank 0's name), empty.
std::string SharedDirectory(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/" + name;
  if (TestGroup()->rank() == 0) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  TestGroup()->barrier()->wait();
  return dir;
}

void ExpectEqualStates(const std::vector<nn::NamedTensor>& got,
                       const std::vector<nn::NamedTensor>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].name, want[i].name) << what;
    EXPECT_EQ(MaxAbsDiff(got[i].value, want[i].value), 0.0) << what << ": " << got[i].name;
  }
}

TEST_F(ShardedCheckpointTest, ResumesExactlyAtTheSameWorldSize) {
  const int rank = TestGroup()->rank();
  const std::string path = SharedDirectory("same") + "/run";
  FullyShardedDataParallel straight(MakeModel(), TestGroup(), Options());
  auto straight_optimizer = MakeOptimizer(straight);
  for (int step = 0; step < 3; ++step) Train(straight, *straight_optimizer, step, rank);
  SaveShardedCheckpoint(straight, *straight_optimizer, path);
  for (int step = 3; step < 5; ++step) Train(straight, *straight_optimizer, step, rank);

  FullyShardedDataParallel resumed(MakeModel(/*seed=*/99), TestGroup(), Options());
  auto resumed_optimizer = MakeOptimizer(resumed);
  LoadShardedCheckpoint(resumed, *resumed_optimizer, path);
  for (int step = 3; step < 5; ++step) Train(resumed, *resumed_optimizer, step, rank);
  ExpectEqualStates(resumed.full_state_dict(), straight.full_state_dict(), "resumed");
  ExpectEqualStates(
      [&] {
        std::vector<nn::NamedTensor> out;
        for (auto& [k, v] : resumed.full_optimizer_state(resumed_optimizer->state_dict()))
          out.push_back({k, v});
        return out;
      }(),
      [&] {
        std::vector<nn::NamedTensor> out;
        for (auto& [k, v] : straight.full_optimizer_state(straight_optimizer->state_dict()))
          out.push_back({k, v});
        return out;
      }(),
      "optimizer state");

  // Each rank wrote its own file, and the index names them.
  const int world = TestGroup()->size();
  int shard_files = 0;
  for (const auto& f :
       std::filesystem::directory_iterator(std::filesystem::path(path).parent_path())) {
    if (f.path().filename().string().find(".rank") != std::string::npos) ++shard_files;
  }
  EXPECT_EQ(shard_files, world);
  TestGroup()->barrier()->wait();  // every rank has counted
  // A second save replaces the first's files.
  SaveShardedCheckpoint(straight, *straight_optimizer, path);
  TestGroup()->barrier()->wait();
  shard_files = 0;
  for (const auto& f :
       std::filesystem::directory_iterator(std::filesystem::path(path).parent_path())) {
    if (f.path().filename().string().find(".rank") != std::string::npos) ++shard_files;
  }
  EXPECT_EQ(shard_files, world);
}

// N ranks' checkpoint into one rank (each rank alone), and one rank's into N.
TEST_F(ShardedCheckpointTest, ReshardsToOneRankAndBack) {
  const int rank = TestGroup()->rank();
  const std::string dir = SharedDirectory("reshard");
  FullyShardedDataParallel sharded(MakeModel(), TestGroup(), Options());
  auto optimizer = MakeOptimizer(sharded);
  for (int step = 0; step < 3; ++step) Train(sharded, *optimizer, step, rank);
  SaveShardedCheckpoint(sharded, *optimizer, dir + "/wide");
  const std::vector<nn::NamedTensor> want = sharded.full_state_dict();
  const nn::OptimizerState want_optimizer = sharded.full_optimizer_state(optimizer->state_dict());

  auto self = std::make_shared<SelfGroup>();
  FullyShardedDataParallel alone(MakeModel(/*seed=*/99), self, Options());
  auto alone_optimizer = MakeOptimizer(alone);
  LoadShardedCheckpoint(alone, *alone_optimizer, dir + "/wide");
  ExpectEqualStates(alone.full_state_dict(), want, "N ranks -> 1");
  const nn::OptimizerState got_optimizer =
      alone.full_optimizer_state(alone_optimizer->state_dict());
  ASSERT_EQ(got_optimizer.size(), want_optimizer.size());
  for (const auto& [name, value] : want_optimizer) {
    EXPECT_EQ(MaxAbsDiff(got_optimizer.at(name).to(kFloat64), value.to(kFloat64)), 0.0) << name;
  }

  // One rank's (rank 0's alone) into every rank.
  if (rank == 0) SaveShardedCheckpoint(alone, *alone_optimizer, dir + "/narrow");
  TestGroup()->barrier()->wait();
  FullyShardedDataParallel wide(MakeModel(/*seed=*/98), TestGroup(), Options());
  auto wide_optimizer = MakeOptimizer(wide);
  LoadShardedCheckpoint(wide, *wide_optimizer, dir + "/narrow");
  ExpectEqualStates(wide.full_state_dict(), want, "1 rank -> N");
  // And both continue alike.
  Train(wide, *wide_optimizer, 3, rank);
  Train(sharded, *optimizer, 3, rank);
  ExpectEqualStates(wide.full_state_dict(), sharded.full_state_dict(), "after a step");
}

TEST_F(ShardedCheckpointTest, MissingCorruptedAndForeignFilesAreRefusedOnEveryRank) {
  const int rank = TestGroup()->rank();
  const int world = TestGroup()->size();
  const std::string dir = SharedDirectory("broken");
  FullyShardedDataParallel fsdp(MakeModel(), TestGroup(), Options());
  auto optimizer = MakeOptimizer(fsdp);
  Train(fsdp, *optimizer, 0, rank);
  SaveShardedCheckpoint(fsdp, *optimizer, dir + "/run");
  std::string last_file;
  for (const auto& f : std::filesystem::directory_iterator(dir)) {
    const std::string name = f.path().string();
    if (name.find(".rank" + std::to_string(world - 1) + "-of-") != std::string::npos) {
      last_file = name;
    }
  }
  ASSERT_FALSE(last_file.empty());
  TestGroup()->barrier()->wait();

  // Corrupted: one byte of the last rank's file flipped.
  if (rank == 0) {
    std::fstream file(last_file, std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(100);
    char byte = 0;
    file.read(&byte, 1);
    byte = static_cast<char>(byte ^ 0x5a);
    file.seekp(100);
    file.write(&byte, 1);
  }
  TestGroup()->barrier()->wait();
  const std::string corrupted =
      ErrorOf([&] { LoadShardedCheckpoint(fsdp, *optimizer, dir + "/run"); });
  if (rank == world - 1) {
    EXPECT_THAT(corrupted, HasSubstr(last_file));
  } else {
    EXPECT_THAT(corrupted,
                HasSubstr("failed on rank " + std::to_string(world - 1) + " (see its error)"));
  }

  // Missing.
  TestGroup()->barrier()->wait();
  if (rank == 0) std::filesystem::remove(last_file);
  TestGroup()->barrier()->wait();
  const std::string missing =
      ErrorOf([&] { LoadShardedCheckpoint(fsdp, *optimizer, dir + "/run"); });
  if (rank == world - 1) {
    EXPECT_THAT(missing,
                HasSubstr("rank " + std::to_string(world - 1) + "'s shard file " + last_file +
                          " of the save that " + dir + "/run" + " names is missing"));
  } else {
    EXPECT_THAT(missing, HasSubstr("(see its error)"));
  }

  // Another model.
  FullyShardedDataParallel other(
      std::make_shared<nn::Sequential>(nn::Linear(7, 16), nn::Tanh(), nn::Linear(16, 3),
                                       nn::BatchNorm1d(3), nn::Linear(3, 11)),
      TestGroup(), Options());
  auto other_optimizer = MakeOptimizer(other);
  SaveShardedCheckpoint(fsdp, *optimizer, dir + "/whole");
  EXPECT_THAT(ErrorOf([&] { LoadShardedCheckpoint(other, *other_optimizer, dir + "/whole"); }),
              HasSubstr("holds another model or auto-wrap policy: it has 'unit 0: 0.weight [15, "
                        "7] 0.bias [15]' where this model has 'unit 0: 0.weight [16, 7]"));
}

}  // namespace
}  // namespace tandem::parallel::distributed
