// A GPT trained on English text in one short program: read it top to bottom (as llm.c's
// train_gpt2.c) before the full trainer (examples/train.cc, examples/trainer.h).
//
//   bazel run -c opt //examples:train_gpt_minimal
//
// nanoGPT's CPU recipe: a byte-level GPT (examples/gpt.h) of 4 layers, 4 heads and 128
// channels over a context of 64 bytes, no dropout, batches of 12 random windows of Debian's
// fortunes (data/text_corpus.h), AdamW with a cosine learning rate, 2,000 steps, split over
// the machine's cores by DataParallel (one logical CPU device per core). Every 200 steps it
// prints the validation loss; at the end, a sample of the trained model.
//
// No flags. TANDEM_MINIMAL_STEPS=20 (an environment variable) shortens the run for tests.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "data/text_corpus.h"
#include "examples/cli.h"
#include "examples/gpt.h"
#include "nn/nn.h"
#include "parallel/data_parallel.h"
#include "tensor/tensor.h"

namespace tandem {
namespace {

constexpr int64_t kBatch = 12;       // windows per step, split across the devices
constexpr int64_t kContext = 64;     // bytes per window
constexpr int kDefaultSteps = 2000;  // TANDEM_MINIMAL_STEPS overrides
constexpr int kEvalEvery = 200;      // steps between validation losses
constexpr int kEvalBatches = 20;     // batches per validation loss
constexpr double kPeakLr = 1e-3;     // AdamW, cosine down to kPeakLr / 10
constexpr int kWarmupSteps = 100;    // linear warm-up first (a tenth of a shorter run)

// A batch of kBatch windows starting at random offsets of `windows` (stride 1: every offset).
data::Batch RandomBatch(const data::TokenWindows& windows, std::mt19937_64& rng) {
  std::uniform_int_distribution<int64_t> offset(0, windows.size() - 1);
  std::vector<int64_t> indices(kBatch);
  for (int64_t& i : indices) i = offset(rng);
  return windows.get_batch(indices);
}

// nanoGPT's schedule: linear warm-up, then cosine from the peak down to a tenth of it.
double LearningRate(int step, int steps) {
  const int warmup = std::min(kWarmupSteps, std::max(1, steps / 10));
  if (step < warmup) return kPeakLr * (step + 1) / warmup;
  const double progress = static_cast<double>(step - warmup) / std::max(1, steps - warmup);
  return kPeakLr / 10 + 0.5 * (kPeakLr - kPeakLr / 10) * (1 + std::cos(M_PI * progress));
}

int Run() {
  const char* steps_env = std::getenv("TANDEM_MINIMAL_STEPS");
  const int steps = steps_env != nullptr ? std::atoi(steps_env) : kDefaultSteps;
  examples::Require(steps >= 1, "TANDEM_MINIMAL_STEPS must be a positive number of steps but is '",
                    steps_env == nullptr ? "" : steps_env, "'");

  // 1. Devices: one logical CPU device per core (or every CUDA GPU), a thread each.
  const std::vector<Device> devices = examples::ParseDevices("");
  examples::ConfigureCpuDevices(devices, 0);

  // 2. Text: every tenth fortune is held out for validation; windows at every byte offset.
  const data::TextCorpus corpus = data::TextCorpus::Fortunes();
  const data::TokenWindows train(corpus.train(), kContext, /*stride=*/1);
  const data::TokenWindows validation(corpus.validation(), kContext, /*stride=*/1);
  std::printf("fortunes: %zu training and %zu validation bytes\n", corpus.train()->size(),
              corpus.validation()->size());

  // 3. Model, on the first device, replicated to the others by DataParallel at each step.
  manual_seed(1337);
  auto model = std::make_shared<examples::Gpt>(
      examples::GptConfig::Small().block_size(kContext).n_layer(4).n_head(4).n_embd(128).dropout(
          0.0));
  model->to(devices[0]);
  parallel::DataParallel dp(model, devices);
  examples::GptLoss criterion;
  nn::AdamW optimizer(model->parameters(),
                      nn::AdamWOptions(kPeakLr).betas(0.9, 0.99).weight_decay(0.1));
  std::printf(
      "GPT: %lld parameters, %d layers, %d heads, width %d, context %lld; DataParallel "
      "on %s; batch %lld; %d steps\n",
      static_cast<long long>(model->num_parameters()), 4, 4, 128, static_cast<long long>(kContext),
      examples::DeviceNames(devices, ", ").c_str(), static_cast<long long>(kBatch), steps);

  // Mean loss over kEvalBatches random validation batches, without gradients.
  std::mt19937_64 eval_rng(7);
  auto validation_loss = [&] {
    NoGradGuard no_grad;
    model->eval();
    double sum = 0;
    for (int i = 0; i < kEvalBatches; ++i) {
      const data::Batch b = RandomBatch(validation, eval_rng);
      sum +=
          dp.forward_loss(criterion, b.fields[0].to(devices[0]), b.fields[1].to(devices[0])).item();
    }
    model->train();
    return sum / kEvalBatches;
  };

  // 4. The loop: forward and loss in the replicas, backward, AdamW step.
  std::mt19937_64 rng(1337);
  const auto start = std::chrono::steady_clock::now();
  double val_loss = validation_loss();
  std::printf("step %5d  val loss %.4f\n", 0, val_loss);
  for (int step = 0; step < steps; ++step) {
    for (nn::ParamGroup& group : optimizer.param_groups()) {
      group.options().set_lr(LearningRate(step, steps));
    }
    const data::Batch batch = RandomBatch(train, rng);
    Tensor loss =
        dp.forward_loss(criterion, batch.fields[0].to(devices[0]), batch.fields[1].to(devices[0]));
    optimizer.zero_grad();
    loss.backward();
    optimizer.step();
    const bool last = step + 1 == steps;
    if ((step + 1) % 20 == 0 || last) {
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::printf("step %5d  train loss %.4f  lr %.2e  %.1f s\n", step + 1, loss.item(),
                  LearningRate(step, steps), seconds);
    }
    if ((step + 1) % kEvalEvery == 0 || last) {
      val_loss = validation_loss();
      std::printf("step %5d  val loss %.4f\n", step + 1, val_loss);
    }
    std::fflush(stdout);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  // 5. A sample: the trained model continues a prompt, byte by byte.
  const std::string prompt = "The meaning of life is";
  const std::vector<int64_t> ids = data::TextCorpus::Encode(prompt);
  Generator gen(42);
  const Tensor out =
      model->Generate(from_vector(ids, {1, static_cast<int64_t>(ids.size())}).to(devices[0]), 200,
                      /*temperature=*/0.8, /*top_k=*/40, &gen);
  std::printf("\nsample: %s\n",
              data::TextCorpus::Decode(out.to(Device::Cpu(0)).to_vector<int64_t>()).c_str());
  std::printf("{\"steps\":%d,\"seconds\":%.1f,\"val_loss\":%.4f}\n", steps, seconds, val_loss);
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  return tandem::examples::RunMain(argc, argv, "train_gpt_minimal",
                                   "Trains a small GPT on fortunes (no flags).",
                                   [] { return tandem::Run(); });
}
