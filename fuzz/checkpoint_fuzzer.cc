// libFuzzer target: the checkpoint reader (nn::ReadCheckpoint, nn::LoadCheckpoint) and the
// trainer's checkpoint on top of it (examples::LoadTrainerCheckpoint: model, optimizer
// state, progress, generators, history) on arbitrary bytes. Every input must either throw
// tandem::Error, leaving the model as it was, or load. Each input is tried as it is (the
// CRC checks) and with its CRC-32 fields recomputed, so that mutations reach the parsing
// behind them.
//
//   bash fuzz/run.sh checkpoint_fuzzer 30
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "examples/trainer_state.h"
#include "fuzz/fuzz_util.h"
#include "nn/checkpoint.h"
#include "nn/layers.h"
#include "nn/optim.h"
#include "nn/sequential.h"
#include "tensor/base/error.h"
#include "tensor/tensor.h"

namespace {

using namespace tandem;

// The model the seed corpus was written from (fuzz/make_seeds.cc): Linear(3, 2) under SGD
// with momentum, trainer config "model=fuzz optimizer=sgd".
struct Target {
  Target() : model(nn::Linear(3, 2)), sgd(model.parameters(), nn::SGDOptions(0.1).momentum(0.9)) {}
  nn::Sequential model;
  nn::SGD sgd;
};

// The parameters' bits: a checkpoint may load NaN weights, and NaN != NaN as a float.
std::vector<std::vector<uint32_t>> Values(const nn::Module& module) {
  std::vector<std::vector<uint32_t>> values;
  for (const nn::NamedTensor& p : module.named_parameters()) {
    const std::vector<float> floats = p.value.to_vector<float>();
    std::vector<uint32_t> bits(floats.size());
    if (!floats.empty()) std::memcpy(bits.data(), floats.data(), floats.size() * sizeof(float));
    values.push_back(std::move(bits));
  }
  return values;
}

void PutCrc(std::vector<uint8_t>& bytes, size_t at, size_t from, size_t size) {
  const auto crc = static_cast<uint32_t>(crc32(0L, bytes.data() + from, static_cast<uInt>(size)));
  std::memcpy(bytes.data() + at, &crc, 4);  // little-endian, as the format
}

// The input with the header's and every whole record's CRC-32 recomputed (see the format
// in nn/checkpoint.h).
std::vector<uint8_t> WithValidCrcs(const uint8_t* data, size_t size) {
  std::vector<uint8_t> bytes(data, data + size);
  if (size < 20) return bytes;
  PutCrc(bytes, 16, 0, 16);
  size_t at = 20;
  while (at + 4 <= size) {
    uint32_t length;
    std::memcpy(&length, bytes.data() + at, 4);
    if (length > size - at - 4 || size - at - 4 - length < 4) break;
    PutCrc(bytes, at + 4 + length, at + 4, length);
    at += 8 + size_t{length};
  }
  return bytes;
}

void Check(const std::string& path) {
  static Target* target = new Target();  // never destroyed: outlives the worker threads

  try {
    for (const nn::CheckpointEntry& e : nn::ReadCheckpoint(path)) {
      TANDEM_FUZZ_ASSERT(e.value.defined() && e.value.device() == Device::Cpu(0));
      TANDEM_FUZZ_ASSERT(e.value.dim() <= 8);
    }
  } catch (const Error&) {
  }

  const auto before = Values(target->model);
  try {
    nn::LoadCheckpoint(target->model, path);
  } catch (const Error&) {
    TANDEM_FUZZ_ASSERT(Values(target->model) == before);  // nothing loaded on error
  }

  examples::TrainerState state;
  state.config = "model=fuzz optimizer=sgd";
  const auto loaded_before = Values(target->model);
  try {
    examples::LoadTrainerCheckpoint(path, target->model, target->sgd, &state);
    TANDEM_FUZZ_ASSERT(state.history.size() == static_cast<size_t>(state.epochs_done));
  } catch (const Error&) {
    TANDEM_FUZZ_ASSERT(Values(target->model) == loaded_before);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const fuzz::ScratchFile file("checkpoint");
  file.Write(data, size);
  Check(file.path());
  const std::vector<uint8_t> fixed = WithValidCrcs(data, size);
  if (!std::equal(fixed.begin(), fixed.end(), data)) {
    file.Write(fixed.data(), fixed.size());
    Check(file.path());
  }
  return 0;
}
