// libFuzzer target: the checkpoint reader (nn::ReadCheckpoint, nn::LoadCheckpoint) and the
// trainer's checkpoint on top of it (examples::LoadTrainerCheckpoint: model, optimizer
// state, progress, generators, history) on arbitrary bytes. Every input must either throw
// tandem::Error, leaving the model and optimizer as they were, or load values that are
// then in the model.
//
//   bash fuzz/run.sh checkpoint_fuzzer 30
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "examples/trainer_state.h"
#include "fuzz/fuzz_util.h"
#include "nn/checkpoint.h"
#include "nn/layers.h"
#include "nn/optim.h"
#include "nn/sequential.h"
#include "tensor/error.h"
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

std::vector<std::vector<float>> Values(const nn::Module& module) {
  std::vector<std::vector<float>> values;
  for (const nn::NamedTensor& p : module.named_parameters())
    values.push_back(p.value.to_vector<float>());
  return values;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const fuzz::ScratchFile file("checkpoint");
  static Target* target = new Target();  // never destroyed: outlives the worker threads
  file.Write(data, size);

  try {
    for (const nn::CheckpointEntry& e : nn::ReadCheckpoint(file.path())) {
      TANDEM_FUZZ_ASSERT(e.value.defined() && e.value.device() == Device::Cpu(0));
      TANDEM_FUZZ_ASSERT(e.value.dim() <= 8);
    }
  } catch (const Error&) {
  }

  const auto before = Values(target->model);
  try {
    nn::LoadCheckpoint(target->model, file.path());
  } catch (const Error&) {
    TANDEM_FUZZ_ASSERT(Values(target->model) == before);  // nothing loaded on error
  }

  examples::TrainerState state;
  state.config = "model=fuzz optimizer=sgd";
  const auto loaded_before = Values(target->model);
  try {
    examples::LoadTrainerCheckpoint(file.path(), target->model, target->sgd, &state);
    TANDEM_FUZZ_ASSERT(state.history.size() == static_cast<size_t>(state.epochs_done));
  } catch (const Error&) {
    TANDEM_FUZZ_ASSERT(Values(target->model) == loaded_before);
  }
  return 0;
}
