// Writes the binary seed inputs of the fuzz targets (IDX files, checkpoints) into the
// corpus folders under the folder given, from the code that writes such files for real.
// The text seeds (devices, flags) are written by hand. Run it when a format changes:
//
//   bazel run --config=cpu //fuzz:make_seeds -- $PWD/fuzz/corpus
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "examples/trainer_state.h"
#include "nn/checkpoint.h"
#include "nn/layers.h"
#include "nn/optim.h"
#include "nn/sequential.h"
#include "tensor/tensor.h"

namespace {

using namespace tandem;

std::vector<uint8_t> Idx(uint32_t magic, const std::vector<uint32_t>& dims, size_t payload) {
  std::vector<uint8_t> bytes;
  auto put = [&](uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8) bytes.push_back(static_cast<uint8_t>(v >> shift));
  };
  put(magic);
  for (uint32_t d : dims) put(d);
  for (size_t i = 0; i < payload; ++i) bytes.push_back(static_cast<uint8_t>(i * 37 % 10));
  return bytes;
}

void Write(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

void WriteGzip(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile file = gzopen(path.c_str(), "wb9");
  gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(file);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_FOLDER (e.g. $PWD/fuzz/corpus)\n", argv[0]);
    return 2;
  }
  namespace fs = std::filesystem;
  const fs::path root = argv[1];
  fs::create_directories(root / "idx");
  fs::create_directories(root / "checkpoint");

  const std::string idx = (root / "idx").string();
  Write(idx + "/labels", Idx(2049, {6}, 6));
  WriteGzip(idx + "/labels.gz", Idx(2049, {6}, 6));
  Write(idx + "/images", Idx(2051, {1, 28, 28}, 28 * 28));
  WriteGzip(idx + "/images.gz", Idx(2051, {2, 28, 28}, 2 * 28 * 28));
  Write(idx + "/images-32x24", Idx(2051, {1, 32, 24}, 28 * 28));
  Write(idx + "/labels-empty", Idx(2049, {0}, 0));
  Write(idx + "/labels-truncated", Idx(2049, {9}, 4));

  // The fuzz target's model and optimizer (fuzz/checkpoint_fuzzer.cc).
  manual_seed(1);
  nn::Sequential model(nn::Linear(3, 2));
  nn::SGD sgd(model.parameters(), nn::SGDOptions(0.1).momentum(0.9));
  cross_entropy(model.forward(randn({2, 3})), from_vector(std::vector<int64_t>{0, 1}, {2}))
      .backward();
  sgd.step();
  const std::string checkpoint = (root / "checkpoint").string();
  nn::SaveCheckpoint(model, checkpoint + "/model.ckpt");
  nn::WriteCheckpoint(
      {{"ids", true, from_vector(std::vector<int64_t>{1, 2}, {2})}, {"empty", true, zeros({0, 3})}},
      checkpoint + "/int64-and-empty.ckpt");
  examples::TrainerState state;
  state.config = "model=fuzz optimizer=sgd";
  state.settings = "devices=cpu:0,cpu:1";
  state.epochs_done = 2;
  state.sampler_epoch = 2;
  state.generators = {{Device::Cpu(0), GeneratorState{1, 7}},
                      {Device::Cpu(1), GeneratorState{1, 9}}};
  state.history = {{1, 0.5, 0.45, 0.85, 1.25, 1000.5}, {2, 0.4, 0.41, 0.86, 1.5, 900.25}};
  examples::SaveTrainerCheckpoint(checkpoint + "/trainer.ckpt", model, sgd, state);
  std::printf("wrote seeds under %s\n", root.c_str());
  return 0;
}
