// train_step: times whole training steps — forward, cross-entropy, backward, optimizer — of
// the trainer's models on synthetic data, on one device or data-parallel on several: mlp,
// cnn, resnet (a fixed random batch of 28x28 images, SGD with momentum 0.9), gpt2 (GPT-2
// 124M, examples/gpt.h) and gpt (the small byte-level GPT) on fixed pseudo-random token
// sequences of --tokens tokens, with AdamW (lr 6e-4, weight decay 0.1, as nanoGPT).
//
//   bazel run -c opt //tools/bench:train_step -- --model=mlp --batch_size=256
//       --devices=cpu:0 --threads=2 --steps=50 --warmup=5      (one command line)
//   bazel run -c opt //tools/bench:train_step -- --devices=cpu:0,cpu:1 --threads=1
//   bazel run -c opt //tools/bench:train_step -- --model=gpt2 --threads=2 --steps=5
//
// It prints a table (step time median, p10, p90, samples/s, and the median time of each
// phase: forward and loss, zero_grad, backward, optimizer step), the peak memory of a step next
// to the least a step must hold (parameters, gradients, the optimizer's state (momentum, or
// AdamW's two moments) and the activations that backward needs), and, with several CPU devices, the
// speed-up over the first device alone next to the speed-up a perfectly parallel loop gets from the
// same number of workers, measured interleaved in the same run (so both see the same machine) with
// their ratio. With --autocast=bf16 (or fp16, with a GradScaler as PyTorch's AMP recipe) it times
// the same step under tandem::AutocastGuard next to the float32 step, alternated step by step in
// one run, and prints both steps' phases, the ratio of the medians with its spread over the
// alternated pairs, and each step's peak memory above what it held before it. With
// --checkpoint_activations (the GPTs) it compares the same way the step whose transformer blocks
// run through nn::checkpoint with the plain step; --context lengthens the model's context:
//   bazel run -c opt //tools/bench:train_step -- --model=gpt --context=512 --tokens=512
//       --batch_size=4 --checkpoint_activations --steps=10      (one command line)
// On a GPU the phases are the host's time to launch them unless --phase_sync waits for the
// devices at each phase's end. On CUDA devices it also counts one step's device work (under
// --config=cudasim, where the simulator counts; on a real GPU that needs CUPTI and is reported as
// not counted): launches, host syncs and host<->device bytes per phase, and the kernels by
// launches with their blocks per launch. --n_layer shrinks a GPT (so that GPT-2's layer shapes
// fit the simulator; the launches of one layer are the difference between two --n_layer):
//   bazel run --config=cudasim -c opt //tools/bench:train_step -- --devices=cuda:0
//       --model=gpt2 --n_layer=1 --batch_size=1 --tokens=16 --steps=1 --warmup=1
// On CUDA devices it then models the step on an H100 SXM by the roofline (tools/bench/roofline.h;
// a model, labelled so): each counted kernel's bytes and FLOPs at HBM3's bandwidth or its math's
// peak, their sum ("modelled_h100_ms"; forward and backward alone:
// "modelled_forward_backward_h100_ms"), and for the GPTs the ideal of the forward and backward's
// GEMMs and attention at this batch ("roofline_gemm_attention_h100_ms"), next to the measured
// step on a real GPU.
// Simulating every kernel of GPT-2's own step (12 layers, batch 8 x 1024) takes hours; the
// simulator's model-only mode counts the same launches and work without running the kernels and
// GEMMs (tools/cudasim/README.md), so the roofline model of the full step takes a minute; the
// simulated device's memory is the host's (13 GB for this step), hence the cap:
//   TANDEM_CUDASIM_MODEL_ONLY=1 TANDEM_CUDASIM_SMS=132 TANDEM_CUDASIM_MEMORY_MIB=16000
//   bazel run --config=cudasim -c opt //tools/bench:train_step -- --devices=cuda:0
//       --model=gpt2 --batch_size=8 --tokens=1024 --steps=1 --warmup=1 --autocast=bf16
// Its counts and modelled_h100_ms are those of a full simulation; its losses are not computed
// (the device's memory keeps whatever it held), and its times are the simulator's host time.
// With --cuda_graph (one CUDA device) it captures forward, backward and the optimizer step once
// in a CUDA Graph (tensor/cuda/cuda_graph.h) after the warm-up, on a side stream, then each step
// copies the batch into the captured input tensors and replays the graph; every model trains
// with capturable AdamW then (its step count and learning rate on the device), the GPTs without
// dropout (the random generator is not graph-safe yet). Beside the timed graph steps it runs the
// same steps eagerly, checks that both give the same losses bit for bit, and prints the launches
// of one step both ways:
//   bazel run --config=cudasim -c opt //tools/bench:train_step -- --devices=cuda:0
//       --model=gpt --n_layer=1 --batch_size=2 --tokens=16 --steps=3 --warmup=2 --cuda_graph
// The last line is one JSON object with the figures.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <future>
#include <iterator>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "examples/cli.h"
#include "examples/gpt.h"
#include "examples/models.h"
#include "examples/progress.h"
#include "nn/nn.h"
#include "parallel/data_parallel.h"
#include "parallel/reference_loop.h"
#if defined(TANDEM_TRAIN_STEP_CUDA)
#include "tensor/cuda/cuda_graph.h"
#endif
#include "tensor/runtime/allocator.h"
#include "tensor/runtime/profiler.h"
#include "tensor/runtime/stream.h"
#include "tensor/runtime/threads.h"
#include "tensor/tensor.h"
#include "tools/bench/roofline.h"
#include "tools/cuda/device_counters.h"
#if defined(TANDEM_TRAIN_STEP_CUDASIM)
#include "tools/cudasim/counters.h"
#endif

ABSL_FLAG(std::string, model, "mlp",
          "mlp (784-256-128-10), cnn (two conv+pool blocks), resnet, gpt2 (GPT-2 124M) or gpt "
          "(the small byte-level GPT)");
ABSL_FLAG(int, batch_size, 0,
          "Images or sequences per step (split across the devices); 0: 256 images, or 4 "
          "sequences for gpt2 and 16 for gpt");
ABSL_FLAG(int, tokens, 64, "gpt2 and gpt: tokens per sequence (at most the context)");
ABSL_FLAG(int, context, 0,
          "gpt2 and gpt: the model's context (block size), at least --tokens; 0: the model's own "
          "(1024 for gpt2, 128 for gpt)");
ABSL_FLAG(int, n_layer, 0,
          "gpt2 and gpt: transformer blocks (0: the model's own, 12 for gpt2); fewer keep the "
          "layers' shapes in a model small enough for the CUDA simulator");
ABSL_FLAG(int, top_kernels, 12, "CUDA devices: how many kernels to list by launches per step");
ABSL_FLAG(bool, checkpoint_activations, false,
          "gpt2 and gpt: checkpoint each transformer block (nn::checkpoint), and time the step "
          "against the plain one, alternated, with both steps' peak memory");
ABSL_FLAG(std::string, devices, "cpu:0",
          "Devices, comma-separated (cpu:0,cpu:1 or cuda:0); empty: every GPU, or a CPU device "
          "per core");
ABSL_FLAG(int, threads, 0, "Cores each CPU device may use (0: cores / CPU devices)");
ABSL_FLAG(int, steps, 50, "Timed steps");
ABSL_FLAG(int, warmup, 5,
          "Untimed steps first (caches, allocator, replicas), for 0.2 s at least unless 0");
ABSL_FLAG(bool, forward_loss, true,
          "Loss inside the replicas (DataParallel::forward_loss); false: gather the outputs");
ABSL_FLAG(std::string, trace, "",
          "Write a Chrome trace of the timed steps to this path (open it in chrome://tracing or "
          "ui.perfetto.dev): one row per thread, with DataParallel's and autograd's work");
ABSL_FLAG(std::string, autocast, "",
          "bf16 or fp16: also time the step under autocast (fp16 with a GradScaler), alternated "
          "with the float32 step, and print both; empty: float32 only");
ABSL_FLAG(bool, phase_sync, false,
          "Wait for every device at each phase's end, so that the phases' times are the "
          "devices' (on a GPU they are otherwise the host's time to launch the phase, and the "
          "final loss read waits for the rest); the step then pays 3 waits more");
ABSL_FLAG(bool, cuda_graph, false,
          "One CUDA device: capture the step in a CUDA Graph after the warm-up and replay it "
          "(capturable AdamW for every model, no dropout), next to the same steps run eagerly");
ABSL_FLAG(bool, compare, true,
          "With several CPU devices, also time the first device alone and a perfectly parallel "
          "loop, interleaved, and print the speed-ups and their ratio");

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;
using examples::Require;

bool IsGpt(const std::string& kind) { return kind == "gpt2" || kind == "gpt"; }

// Whether the CUDA simulator counts kernels and GEMMs without running them
// (TANDEM_CUDASIM_MODEL_ONLY=1): the CUDA devices' losses are then garbage, never to be compared
// or checked, while their counts and the roofline model stay exact.
bool CudasimModelOnly() {
#if defined(TANDEM_TRAIN_STEP_CUDASIM)
  return cudasim::ModelOnly();
#else
  return false;
#endif
}

// The model of --model, with --context.
examples::GptConfig GptConfigOf(const std::string& kind) {
  examples::GptConfig config =
      kind == "gpt2" ? examples::GptConfig::Gpt2() : examples::GptConfig::Small();
  const int context = absl::GetFlag(FLAGS_context);
  Require(context >= 0, "--context must be at least 1 (or 0 for the model's own) but is ", context);
  if (context > 0) config.block_size(context);
  if (absl::GetFlag(FLAGS_n_layer) > 0) config.n_layer(absl::GetFlag(FLAGS_n_layer));
  return config;
}

// Checks --model; the batch size that 0 stands for.
int DefaultBatch(const std::string& kind) {
  if (kind == "gpt2") return 4;
  if (kind == "gpt") return 16;
  if (kind == "mlp" || kind == "cnn" || kind == "resnet") return 256;
  throw examples::UsageError("--model must be 'mlp', 'cnn', 'resnet', 'gpt2' or 'gpt' but is '" +
                             kind + "'");
}

// Floats that a step must keep from forward for backward.
int64_t SavedActivationFloats(const std::string& kind, int64_t batch, int64_t tokens) {
  if (IsGpt(kind)) return examples::GptSavedActivations(GptConfigOf(kind), batch, tokens);
  return examples::SavedActivationsPerSample(kind) * batch;
}

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string MiB(double bytes) { return absl::StrFormat("%.2f MiB", bytes / 1048576.0); }

// The q-quantile (0..1) of `values`, by the nearest-rank method.
double Quantile(std::vector<double> values, double q) {
  std::sort(values.begin(), values.end());
  const size_t rank = static_cast<size_t>(q * (values.size() - 1) + 0.5);
  return values.at(std::min(rank, values.size() - 1));
}

// --cuda_graph's loss for the image models: the fused cross-entropy op, which checks the labels
// on the device. (nn::CrossEntropyLoss reads the labels' range to the host to handle
// ignore_index, which a capture refuses.)
class DeviceCheckedCrossEntropy : public nn::Cloneable<DeviceCheckedCrossEntropy> {
 public:
  void reset() override {}
  Tensor forward(const Tensor& logits, const Tensor& labels) {
    return cross_entropy(logits, labels);
  }
  void pretty_print(std::ostream& out) const override { out << "DeviceCheckedCrossEntropy()"; }
};

// One model, its optimizer (SGD, or AdamW for the GPTs) and its DataParallel wrapper, on
// `devices`.
class Trainer {
 public:
  // `autocast`: kFloat32 for a plain float32 step, kBFloat16 or kFloat16 for the forward under
  // AutocastGuard (float16 with a GradScaler). `checkpointed`: the GPT's blocks through
  // nn::checkpoint.
  // `capturable`: capturable AdamW for every model and no dropout, so that the step can be
  // captured (CaptureGraph).
  Trainer(const std::string& kind, const std::vector<Device>& devices, int64_t batch,
          bool forward_loss, DType autocast = kFloat32, bool checkpointed = false,
          bool capturable = false)
      : forward_loss_(forward_loss),
        autocast_(autocast),
        device_type_(devices[0].type()),
        devices_(devices),
        phase_sync_(absl::GetFlag(FLAGS_phase_sync)),
        scaler_(nn::GradScalerOptions().enabled(autocast == kFloat16)) {
    manual_seed(1);
    if (IsGpt(kind)) {
      examples::GptConfig config = GptConfigOf(kind).checkpoint_activations(checkpointed);
      if (capturable) config.dropout(0.0);
      const int64_t tokens = absl::GetFlag(FLAGS_tokens);
      Require(tokens >= 1 && tokens <= config.block_size(), "--tokens must be in [1, ",
              config.block_size(), "] (the context of --model=", kind, ") but is ", tokens);
      model_ = std::make_shared<examples::Gpt>(config);
      criterion_ = std::make_shared<examples::GptLoss>();
      const examples::TokenBatch data =
          examples::SyntheticTokenBatch(config, batch, tokens, /*seed=*/12345, devices[0]);
      x_ = data.x;
      y_ = data.y;
    } else {
      model_ = examples::MakeModel(kind);
      if (capturable) {
        criterion_ = std::make_shared<DeviceCheckedCrossEntropy>();
      } else {
        criterion_ = std::make_shared<nn::CrossEntropyLoss>();
      }
      x_ = randn({batch, 1, 28, 28}, TensorOptions().device(devices[0]));
      std::vector<int64_t> labels(batch);
      for (int64_t i = 0; i < batch; ++i) labels[i] = (i * 7) % 10;
      y_ = from_vector(labels, {batch}, TensorOptions().device(devices[0]));
    }
    model_->to(devices[0]);
    if (IsGpt(kind) || capturable) {
      optimizer_ = std::make_unique<nn::AdamW>(
          model_->parameters(),
          nn::AdamWOptions(IsGpt(kind) ? 6e-4 : 1e-3).weight_decay(0.1).capturable(capturable));
      optimizer_state_copies_ = 2;  // exp_avg and exp_avg_sq
    } else {
      optimizer_ =
          std::make_unique<nn::SGD>(model_->parameters(), nn::SGDOptions(0.01).momentum(0.9));
      optimizer_state_copies_ = 1;  // the momentum
    }
    dp_ = std::make_shared<parallel::DataParallel>(model_, devices);
  }

  // The phases of a step that Step() times, in order.
  static constexpr int kPhases = 4;
  static constexpr const char* kPhaseNames[kPhases] = {"forward and loss", "zero_grad", "backward",
                                                       "optimizer step"};
  static constexpr int kBackwardPhase = 2;  // kPhaseNames' "backward"

  // One full step; returns when its work is done (the loss is read back). Records how long
  // each phase took (the loss read-back counts to the optimizer step: it is only a copy).
  // With `counts`, the device counters from the step's start to each phase's end (before
  // --phase_sync's wait) and, last, to the end of the loss read-back.
  double Step(bool record = true, std::vector<DeviceCounters>* counts = nullptr) {
    const auto count = [&] {
      if (counts != nullptr) counts->push_back(ReadDeviceCounters());
    };
    if (counts != nullptr) {
      Synchronize();  // the previous step's work is not this one's
      counts->clear();
      ResetDeviceCounters();
    }
#if defined(TANDEM_TRAIN_STEP_CUDA)
    if (graph_.captured()) return GraphStep(record, count);
#endif
    Clock::time_point marks[kPhases + 1];
    marks[0] = Clock::now();
    Tensor loss;
    {
      AutocastGuard autocast(device_type_, autocast_ == kFloat32 ? kBFloat16 : autocast_,
                             /*enabled=*/autocast_ != kFloat32);
      loss = forward_loss_ ? dp_->forward_loss(*criterion_, x_, y_)
                           : criterion_->forward_tensors({dp_->forward(x_), y_}).at(0);
    }
    count();
    marks[1] = PhaseEnd();
    optimizer_->zero_grad();
    count();
    marks[2] = PhaseEnd();
    scaler_.scale(loss).backward();
    count();
    marks[3] = PhaseEnd();
    scaler_.step(*optimizer_);
    scaler_.update();
    count();
    const double value = loss.item();
    count();
    marks[4] = Clock::now();
    for (int k = 0; record && k < kPhases; ++k) {
      phase_ms_[k].push_back(1e3 * std::chrono::duration<double>(marks[k + 1] - marks[k]).count());
    }
    return value;
  }
  // Captures one step in a CUDA Graph on a side stream after `warmup` eager steps there (as
  // torch.cuda.graph requires); later Step()s copy the batch into the captured inputs and
  // replay it. One CUDA device, a capturable trainer.
  void CaptureGraph(int warmup) {
#if !defined(TANDEM_TRAIN_STEP_CUDA)
    (void)warmup;
    throw examples::UsageError(
        "--cuda_graph: this build has no CUDA (build with CUDA or "
        "--config=cudasim)");
#else
    const Device device = devices_[0];
    const Stream side = SideStream(device);
    side.Wait(CurrentStream(device));
    // The batch a step copies in: kept apart from the captured inputs, as a loader's would be.
    batch_x_ = x_.clone();
    batch_y_ = y_.clone();
    {
      StreamGuard guard(side);
      for (int i = 0; i < std::max(warmup, 1); ++i) Step(/*record=*/false);
      cuda::CUDAGraphCapture capture(graph_, device);
      optimizer_->zero_grad();
      graph_loss_ = dp_->forward_loss(*criterion_, x_, y_);
      graph_loss_.backward();
      optimizer_->step();
    }
    CurrentStream(device).Wait(side);
#endif
  }
#if defined(TANDEM_TRAIN_STEP_CUDA)
  int64_t graph_nodes() const { return graph_.num_nodes(); }
#else
  int64_t graph_nodes() const { return 0; }
#endif

  // The end of a phase: now, after waiting for the devices with --phase_sync.
  Clock::time_point PhaseEnd() const {
    if (phase_sync_) Synchronize();
    return Clock::now();
  }
  void Synchronize() const {
    for (Device d : devices_) CurrentStream(d).Synchronize();
  }
  // Forgets the phase times recorded so far (after warm-up).
  void ClearPhases() {
    for (auto& times : phase_ms_) times.clear();
  }
  // The median time of phase k over the steps since ClearPhases.
  double PhaseMedian(int k) const { return Quantile(phase_ms_[k], 0.5); }

  int64_t parameter_bytes() const {
    int64_t n = 0;
    for (const Tensor& p : model_->parameters()) n += p.numel();
    return n * static_cast<int64_t>(sizeof(float));
  }
  // Copies of the parameters that the optimizer keeps (SGD's momentum: 1, AdamW's: 2).
  int optimizer_state_copies() const { return optimizer_state_copies_; }
  const std::vector<int64_t>& last_split() const { return dp_->last_chunk_sizes(); }

 private:
  bool forward_loss_;
  DType autocast_;
  DeviceType device_type_;
  std::vector<Device> devices_;
  bool phase_sync_;
  nn::GradScaler scaler_;  // a pass-through unless float16
  std::shared_ptr<nn::Module> model_;
  std::unique_ptr<nn::Optimizer> optimizer_;
  int optimizer_state_copies_ = 1;
  std::shared_ptr<parallel::DataParallel> dp_;
  std::shared_ptr<nn::Module> criterion_;
  Tensor x_, y_;
  std::vector<double> phase_ms_[kPhases];
#if defined(TANDEM_TRAIN_STEP_CUDA)
  cuda::CUDAGraph graph_;
  Tensor graph_loss_, batch_x_, batch_y_;

  // A captured step: the inputs copied in, one replay, the loss read back. Its time is the
  // optimizer step's phase (the phases are one launch), the others 0.
  template <typename Count>
  double GraphStep(bool record, const Count& count) {
    const Clock::time_point start = Clock::now();
    x_.copy_(batch_x_);
    y_.copy_(batch_y_);
    count();
    graph_.replay();
    count();
    const double value = graph_loss_.item();
    count();
    for (int k = 0; record && k < kPhases; ++k) {
      phase_ms_[k].push_back(k + 1 < kPhases ? 0.0 : 1e3 * SecondsSince(start));
    }
    return value;
  }
#endif
};

constexpr double kNoLoss = std::numeric_limits<double>::quiet_NaN();
constexpr double kMinWarmupSeconds = 0.2;

double TimeIt(const std::function<void()>& work) {
  const auto start = Clock::now();
  work();
  return 1e3 * SecondsSince(start);
}

// The most a step held above what was in use before it (activations, gradients, temporaries),
// summed over the devices.
int64_t StepPeakAboveStart(Trainer& trainer, const std::vector<Device>& devices) {
  std::vector<int64_t> before;
  for (Device d : devices) {
    ResetPeakMemory(d);
    before.push_back(GetMemoryStats(d).in_use_bytes);
  }
  trainer.Step(/*record=*/false);
  int64_t above = 0;
  for (size_t i = 0; i < devices.size(); ++i) {
    above += GetMemoryStats(devices[i]).peak_bytes - before[i];
  }
  return above;
}

// Two steps timed against each other: `a` / `b`.
struct StepComparison {
  double ratio_median = 0, ratio_min = 0, ratio_max = 0;  // p50, p10, p90 of the pairs' ratios
  double a_ms = 0, b_ms = 0;
  int64_t a_peak = 0, b_peak = 0;  // peak memory of a step above what was in use before it
};

// Step `a` against step `b` (both warmed up), alternated step by step so that both see the same
// machine; prints both steps' phases, the ratios and their peak memory.
StepComparison CompareSteps(Trainer& a, Trainer& b, const std::vector<Device>& devices,
                            int64_t batch, int steps, const std::string& title,
                            const std::string& a_name, const std::string& b_name) {
  StepComparison result;
  result.a_peak = StepPeakAboveStart(a, devices);
  result.b_peak = StepPeakAboveStart(b, devices);
  a.ClearPhases();
  b.ClearPhases();
  std::vector<double> a_ms, b_ms, ratios;
  examples::ProgressBar bar(stdout, "vs " + b_name, steps);
  const auto start = Clock::now();
  for (int i = 0; i < steps; ++i) {
    // Alternate which goes first, so that neither always runs right after the other's
    // caches were filled.
    const bool a_first = i % 2 == 0;
    double ta = 0, tb = 0;
    if (a_first) ta = TimeIt([&] { a.Step(); });
    tb = TimeIt([&] { b.Step(); });
    if (!a_first) ta = TimeIt([&] { a.Step(); });
    a_ms.push_back(ta);
    b_ms.push_back(tb);
    ratios.push_back(ta / tb);
    bar.Update(i + 1, static_cast<int64_t>(i + 1) * batch, kNoLoss, SecondsSince(start));
  }
  bar.Finish();
  result.a_ms = Quantile(a_ms, 0.5);
  result.b_ms = Quantile(b_ms, 0.5);
  result.ratio_median = Quantile(ratios, 0.5);
  result.ratio_min = Quantile(ratios, 0.1);
  result.ratio_max = Quantile(ratios, 0.9);
  std::printf("\n%s (medians of %d alternated pairs):\n", title.c_str(), steps);
  std::printf("  %-28s %12s %12s %8s\n", "", a_name.c_str(), b_name.c_str(), "ratio");
  std::printf("  %-28s %9.2f ms %9.2f ms %7.2fx  (p10-p90 of the pairs' ratios %.2f-%.2f)\n",
              "train step", result.a_ms, result.b_ms, result.ratio_median, result.ratio_min,
              result.ratio_max);
  for (int k = 0; k < Trainer::kPhases; ++k) {
    std::printf("  %-28s %9.2f ms %9.2f ms %7.2fx\n", Trainer::kPhaseNames[k], a.PhaseMedian(k),
                b.PhaseMedian(k), a.PhaseMedian(k) / b.PhaseMedian(k));
  }
  std::printf("  %-28s %12s %12s %7.2fx\n", "peak memory above start", MiB(result.a_peak).c_str(),
              MiB(result.b_peak).c_str(), static_cast<double>(result.a_peak) / result.b_peak);
  return result;
}

// A trainer like the main one but for one difference, warmed up.
std::unique_ptr<Trainer> WarmTrainer(const std::string& kind, const std::vector<Device>& devices,
                                     int64_t batch, bool forward_loss, int warmup, DType autocast,
                                     bool checkpointed) {
  auto trainer =
      std::make_unique<Trainer>(kind, devices, batch, forward_loss, autocast, checkpointed);
  for (int i = 0; i < std::max(warmup, 1); ++i) trainer->Step(/*record=*/false);
  return trainer;
}

// An H100's streaming multiprocessors: a kernel with fewer than twice as many blocks leaves some
// of them idle or with one block each.
constexpr int kH100Sms = 132;

// Prints what one step asked of the devices, counted from `counts` (Trainer::Step's: one per
// phase, then the loss read-back), and returns the whole step's counts.
DeviceCounters PrintDeviceWork(const std::vector<DeviceCounters>& counts) {
  std::printf("\nDevice work of one step");
  const DeviceCounters& step = counts.back();
  if (!step.counted) {
    std::printf(": %s\n", step.not_counted.c_str());
    return step;
  }
  std::printf(" (counted by the CUDA simulator; cuda:0 has %d SMs, TANDEM_CUDASIM_SMS):\n",
              step.sm_count);
  std::printf("  %-28s %9s %11s %12s %12s\n", "", "launches", "host syncs", "bytes H->D",
              "bytes D->H");
  static constexpr const char* kCounted[] = {"forward and loss", "zero_grad", "backward",
                                             "optimizer step", "loss read-back (.item())"};
  static_assert(std::size(kCounted) == Trainer::kPhases + 1, "a name per counted segment");
  DeviceCounters before;
  for (size_t k = 0; k < counts.size(); ++k) {
    const DeviceCounters& c = counts[k];
    std::printf("  %-28s %9lld %11lld %12lld %12lld\n", kCounted[k], c.launches - before.launches,
                c.host_syncs - before.host_syncs,
                c.bytes_host_to_device - before.bytes_host_to_device,
                c.bytes_device_to_host - before.bytes_device_to_host);
    before = c;
  }
  std::printf("  %-28s %9lld %11lld %12lld %12lld\n", "step", step.launches, step.host_syncs,
              step.bytes_host_to_device, step.bytes_device_to_host);
  const int top = std::min<int>(absl::GetFlag(FLAGS_top_kernels), step.kernels.size());
  if (top <= 0) return step;
  std::printf(
      "  top %d of %zu kernels by launches (blocks per launch, least-most; '<2x132' marks grids "
      "under twice an H100's SMs: the element count is not read, so check the work is > 1M; "
      "library calls' grids are cuBLAS's and NCCL's own, '-'):\n",
      top, step.kernels.size());
  for (int i = 0; i < top; ++i) {
    const KernelLaunches& k = step.kernels[i];
    const std::string blocks =
        k.max_blocks == 0
            ? "-"
            : absl::StrFormat("%lld-%lld x %lld", k.min_blocks, k.max_blocks, k.threads_per_block);
    std::printf("  %6lld  %-24s %-7s %s\n", k.launches, blocks.c_str(),
                k.max_blocks > 0 && k.min_blocks < 2 * kH100Sms ? "<2x132" : "", k.name.c_str());
  }
  return step;
}

// Prints what one replayed step asked of the device (Trainer::GraphStep's counts: inputs
// copied, replay, loss read-back) and returns the whole step's counts.
DeviceCounters PrintGraphWork(const std::vector<DeviceCounters>& counts) {
  std::printf("\nDevice work of one replayed step");
  const DeviceCounters& step = counts.back();
  if (!step.counted) {
    std::printf(": %s\n", step.not_counted.c_str());
    return step;
  }
  std::printf(" (counted by the CUDA simulator):\n");
  std::printf("  %-28s %9s %7s %14s %11s %12s %12s\n", "", "launches", "graphs", "graph kernels",
              "host syncs", "bytes H->D", "bytes D->H");
  static constexpr const char* kCounted[] = {"inputs copied in", "graph replay",
                                             "loss read-back (.item())"};
  DeviceCounters before;
  for (size_t k = 0; k < counts.size() && k < std::size(kCounted); ++k) {
    const DeviceCounters& c = counts[k];
    std::printf("  %-28s %9lld %7lld %14lld %11lld %12lld %12lld\n", kCounted[k],
                c.launches - before.launches, c.graph_launches - before.graph_launches,
                c.graph_kernels - before.graph_kernels, c.host_syncs - before.host_syncs,
                c.bytes_host_to_device - before.bytes_host_to_device,
                c.bytes_device_to_host - before.bytes_device_to_host);
    before = c;
  }
  return step;
}

// --autocast: kFloat32 when empty.
DType ParseAutocast(const std::string& text) {
  if (text.empty()) return kFloat32;
  if (text == "bf16" || text == "bfloat16") return kBFloat16;
  if (text == "fp16" || text == "float16") return kFloat16;
  throw examples::UsageError(
      "--autocast must be bf16 or fp16 (or empty for float32 only) but is '" + text + "'");
}

int Run() {
  const std::string kind = absl::GetFlag(FLAGS_model);
  const int batch =
      absl::GetFlag(FLAGS_batch_size) > 0 ? absl::GetFlag(FLAGS_batch_size) : DefaultBatch(kind);
  const int steps = absl::GetFlag(FLAGS_steps);
  const int warmup = absl::GetFlag(FLAGS_warmup);
  const bool forward_loss = absl::GetFlag(FLAGS_forward_loss);
  const std::string autocast_name = absl::GetFlag(FLAGS_autocast);
  const DType autocast = ParseAutocast(autocast_name);
  const bool checkpointed = absl::GetFlag(FLAGS_checkpoint_activations);
  const bool cuda_graph = absl::GetFlag(FLAGS_cuda_graph);
  DefaultBatch(kind);  // checks --model
  Require(absl::GetFlag(FLAGS_batch_size) >= 0, "--batch_size must be at least 1 (or 0 for the ",
          "model's default) but is ", absl::GetFlag(FLAGS_batch_size));
  Require(steps >= 1, "--steps must be at least 1 but is ", steps);
  Require(warmup >= 0, "--warmup must be at least 0 but is ", warmup);
  Require(absl::GetFlag(FLAGS_n_layer) >= 0,
          "--n_layer must be at least 1 (or 0 for the model's own) but is ",
          absl::GetFlag(FLAGS_n_layer));
  Require(!checkpointed || IsGpt(kind),
          "--checkpoint_activations checkpoints a GPT's transformer blocks: use it with "
          "--model=gpt or --model=gpt2, not --model=",
          kind);
  Require(!checkpointed || autocast == kFloat32,
          "--checkpoint_activations compares float32 steps: leave --autocast empty");
  examples::RequireWritableFile("--trace", absl::GetFlag(FLAGS_trace));
  Require(!cuda_graph || (autocast == kFloat32 && !checkpointed),
          "--cuda_graph captures the float32 step: leave --autocast empty (fp16's GradScaler "
          "reads its inf check to the host) and drop --checkpoint_activations (its recompute "
          "replays the random generator's state)");
  Require(!cuda_graph || forward_loss,
          "--cuda_graph captures DataParallel::forward_loss: keep --forward_loss");
  const std::vector<Device> devices = examples::ParseDevices(absl::GetFlag(FLAGS_devices));
  if (cuda_graph) {
    Require(devices.size() == 1 && devices[0].is_cuda(),
            "--cuda_graph captures the step of one CUDA device (--devices=cuda:0); CPU devices "
            "run their kernels on the host, with nothing to capture, and DataParallel over "
            "several devices is not captured; got --devices=",
            absl::GetFlag(FLAGS_devices));
  }
  const int threads = examples::ConfigureCpuDevices(devices, absl::GetFlag(FLAGS_threads));
  bool all_cpu = true;
  for (Device d : devices) all_cpu = all_cpu && d.is_cpu();
  const bool compare = absl::GetFlag(FLAGS_compare) && devices.size() > 1 && all_cpu;
  const bool model_only = !all_cpu && CudasimModelOnly();

  std::unique_ptr<Trainer> trainer;
  try {
    trainer = std::make_unique<Trainer>(kind, devices, batch, forward_loss, autocast, checkpointed,
                                        cuda_graph);
  } catch (const Error& e) {
    throw examples::UsageError("--devices: " + examples::OneLine(e.what()));
  }
  const int tokens = absl::GetFlag(FLAGS_tokens);
  std::printf("train_step: %s, batch %d%s on %s", kind.c_str(), batch,
              IsGpt(kind) ? absl::StrCat(" x ", tokens, " tokens").c_str() : "",
              examples::DeviceNames(devices, ", ").c_str());
  if (threads > 0) std::printf(" (%d thread%s per CPU device)", threads, threads == 1 ? "" : "s");
  const std::string warmup_text =
      warmup > 0 ? absl::StrCat(warmup, " warm-up steps (0.2 s at least)") : "no warm-up";
  std::printf("\nforward, cross-entropy (%s), backward, %s; %s + %d timed steps; %d cores\n",
              forward_loss ? "inside the replicas" : "on the gathered output",
              IsGpt(kind)  ? "AdamW lr 6e-4 weight decay 0.1"
              : cuda_graph ? "AdamW lr 1e-3 weight decay 0.1"
                           : "SGD momentum 0.9",
              warmup_text.c_str(), steps, HardwareCores());
  if (checkpointed) std::printf("each transformer block checkpointed (nn::checkpoint)\n");
  if (cuda_graph) {
    std::printf("captured in a CUDA Graph after the warm-up and replayed (capturable AdamW%s)\n",
                IsGpt(kind) ? ", dropout 0: the random generator is not graph-safe yet" : "");
  }
  if (autocast != kFloat32) {
    std::printf("forward under autocast to %s%s\n", DTypeName(autocast),
                autocast == kFloat16 ? " with a GradScaler" : "");
  }
  if (model_only) {
    std::printf(
        "model-only (TANDEM_CUDASIM_MODEL_ONLY=1): kernels and GEMMs are counted, not run; loss: "
        "not computed (model-only); times are the simulator's host time; launches, work and the "
        "H100 model are exact\n");
    if (autocast == kFloat16) {
      std::printf(
          "  fp16: the GradScaler's inf check is not computed either, so whether the optimizer "
          "step runs (and is counted) rests on an uncomputed flag; bf16's counts do not\n");
    }
  }
  std::fflush(stdout);

  // Warm-up lasts kMinWarmupSeconds at least: a new process's device workers start on the core of
  // the thread that woke them, and the kernel moves one to the idle core only after tens of
  // milliseconds (2-device MLP steps took 3.4-4.7 ms for the first 30-70 ms, then 2.0-2.3).
  const auto warmup_start = Clock::now();
  int warmup_steps = 0;
  for (int i = 0; i < warmup || (warmup > 0 && SecondsSince(warmup_start) < kMinWarmupSeconds);
       ++i) {
    trainer->Step();
    ++warmup_steps;
  }
  if (cuda_graph) {
    trainer->CaptureGraph(warmup);
    warmup_steps += std::max(warmup, 1);
  }
  trainer->ClearPhases();
  const std::string split = absl::StrJoin(trainer->last_split(), "+");
  std::vector<int64_t> in_use;
  for (Device d : devices) {
    ResetPeakMemory(d);
    in_use.push_back(GetMemoryStats(d).in_use_bytes);
  }
  std::vector<double> ms, losses;
  examples::StepTrace trace(absl::GetFlag(FLAGS_trace), steps);  // written after the last
  examples::ProgressBar bar(stdout, "timing", steps);
  const auto start = Clock::now();
  for (int i = 0; i < steps; ++i) {
    ms.push_back(TimeIt([&] {
      TANDEM_PROFILE_SCOPE("step", "step " + std::to_string(i));
      losses.push_back(trainer->Step());
    }));
    trace.StepDone();
    bar.Update(i + 1, static_cast<int64_t>(i + 1) * batch, kNoLoss, SecondsSince(start));
  }
  bar.Finish();
  std::printf("%s", trace.TakeMessage().c_str());
  int64_t peak = 0;
  for (Device d : devices) peak += GetMemoryStats(d).peak_bytes;
  const double median = Quantile(ms, 0.5), p10 = Quantile(ms, 0.1), p90 = Quantile(ms, 0.9);
  const double samples_per_s = batch / (median / 1e3);

  std::printf("\n  %-24s %6s %9s %8s %8s %8s %11s\n", "devices", "batch", "split", "median", "p10",
              "p90", "samples/s");
  std::printf("  %-24s %6d %9s %5.2f ms %5.2f ms %5.2f ms %11.0f\n",
              examples::DeviceNames(devices, "+").c_str(), batch, split.c_str(), median, p10, p90,
              samples_per_s);
  std::printf("\n  where a step's time goes (median of each phase%s):",
              devices[0].is_cuda() && !absl::GetFlag(FLAGS_phase_sync)
                  ? "; on a GPU the host's time to launch it, --phase_sync for the device's"
                  : "");
  for (int k = 0; k < Trainer::kPhases; ++k) {
    std::printf("%s %s %.2f ms", k == 0 ? "" : ",", Trainer::kPhaseNames[k],
                trainer->PhaseMedian(k));
  }
  std::printf("\n");

  const int64_t params = trainer->parameter_bytes();
  const int64_t activations = SavedActivationFloats(kind, batch, tokens) * 4;
  const int copies = 2 + trainer->optimizer_state_copies();
  const int64_t minimum = copies * params + activations;
  std::printf("\nMemory of a step (allocator statistics, summed over the devices):\n");
  std::printf("  peak while stepping        %s\n", MiB(peak).c_str());
  std::printf(
      "  least it must hold         %s  (parameters, gradients, %s %d x %s + "
      "activations for backward %s)\n",
      MiB(minimum).c_str(), copies == 3 ? "momentum" : "AdamW's two moments", copies,
      MiB(params).c_str(), MiB(activations).c_str());
  std::printf("  peak / least               %.2fx\n", static_cast<double>(peak) / minimum);

  DeviceCounters work, eager_work;
  std::string roofline_json;
  bool replay_equals_eager = false;
  if (cuda_graph) {
    // The same steps eagerly, from the same start: equal losses bit for bit, and the eager step's
    // launches beside the replay's.
    std::vector<DeviceCounters> counts;
    trainer->Step(/*record=*/false, &counts);
    work = PrintGraphWork(counts);
    Trainer eager(kind, devices, batch, forward_loss, kFloat32, false, /*capturable=*/true);
    for (int i = 0; i < warmup_steps; ++i) eager.Step(/*record=*/false);
    replay_equals_eager = true;
    for (int i = 0; i < steps; ++i) {
      const double loss = eager.Step(/*record=*/false);
      replay_equals_eager = replay_equals_eager && loss == losses[i];
    }
    eager.Step(/*record=*/false, &counts);
    eager_work = counts.back();
    if (model_only) {
      std::printf(
          "\nReplay against the same %d steps run eagerly: losses not computed "
          "(model-only), not compared\n",
          steps);
    } else {
      std::printf("\nReplay against the same %d steps run eagerly: losses %s bit for bit\n", steps,
                  replay_equals_eager ? "equal" : "DIFFER");
    }
    std::printf("  graph: %lld nodes\n", static_cast<long long>(trainer->graph_nodes()));
    if (work.counted) {
      std::printf(
          "  launches from the host per step: eager %lld, replayed %lld (%lld graph launch%s "
          "running %lld kernels, %lld other)\n",
          eager_work.launches, work.launches + work.graph_launches, work.graph_launches,
          work.graph_launches == 1 ? "" : "es", work.graph_kernels, work.launches);
    }
  } else if (devices[0].is_cuda()) {
    std::vector<DeviceCounters> counts;
    trainer->Step(/*record=*/false, &counts);
    work = PrintDeviceWork(counts);
    const examples::GptConfig gpt = IsGpt(kind) ? GptConfigOf(kind) : examples::GptConfig();
    // From the step's start to its backward's end: the ideal's scope.
    roofline_json = bench::ReportRoofline(work, &counts[Trainer::kBackwardPhase],
                                          IsGpt(kind) ? &gpt : nullptr, batch, tokens,
                                          autocast == kFloat32    ? "fp32"
                                          : autocast == kBFloat16 ? "bf16"
                                                                  : "fp16",
                                          median, !work.counted, absl::GetFlag(FLAGS_top_kernels));
  }

  // Model-only mode's times are the simulator's host time: nothing to compare.
  if (model_only && (autocast != kFloat32 || checkpointed)) {
    std::printf("\nNo timed comparison (autocast, checkpointing) in model-only mode\n");
  }
  StepComparison amp, ckpt;
  if (autocast != kFloat32 && !model_only) {
    std::unique_ptr<Trainer> f32 =
        WarmTrainer(kind, devices, batch, forward_loss, warmup, kFloat32, false);
    amp = CompareSteps(*trainer, *f32, devices, batch, steps,
                       absl::StrCat("autocast ", DTypeName(autocast), " against float32"),
                       DTypeName(autocast), "float32");
  }
  if (checkpointed && !model_only) {
    std::unique_ptr<Trainer> plain =
        WarmTrainer(kind, devices, batch, forward_loss, warmup, kFloat32, false);
    ckpt = CompareSteps(*trainer, *plain, devices, batch, steps,
                        "activation checkpointing against the plain step", "checkpointed", "plain");
  }

  double speedup = 0, loop_speedup = 0;
  if (compare) {
    // The same step on the first device alone (same threads), the data-parallel step, and
    // the reference loop on one and on N threads, interleaved round by round. Each runs once
    // untimed before its timed run in a round: switching lets the other configuration's
    // threads fall asleep and its model out of the caches, which a training run, stepping
    // one configuration over and over, does not pay every step.
    Trainer single(kind, {devices[0]}, batch, forward_loss, autocast);
    for (int i = 0; i < warmup; ++i) {
      CpuWorkDevicesScope one_device({devices[0]});
      single.Step();
    }
    single.ClearPhases();
    trainer->ClearPhases();
    const int workers = static_cast<int>(devices.size());
    const int64_t reps = parallel::CalibratedReps(median / 1e3);
    std::vector<double> one, many, loop_one, loop_many;
    examples::ProgressBar compare_bar(stdout, "scaling", steps);
    const auto compare_start = Clock::now();
    for (int i = 0; i < steps; ++i) {
      {
        // On its device's threads alone, as in a process configured with that device only
        // (the optimizer's update would otherwise also use the other devices' workers).
        CpuWorkDevicesScope one_device({devices[0]});
        single.Step(/*record=*/false);
        one.push_back(TimeIt([&] { single.Step(); }));
      }
      trainer->Step(/*record=*/false);
      many.push_back(TimeIt([&] { trainer->Step(); }));
      parallel::ReferenceLoop({devices[0]}, reps);
      loop_one.push_back(TimeIt([&] { parallel::ReferenceLoop({devices[0]}, reps); }));
      parallel::ReferenceLoop(devices, reps);
      loop_many.push_back(TimeIt([&] { parallel::ReferenceLoop(devices, reps); }));
      compare_bar.Update(i + 1, static_cast<int64_t>(i + 1) * batch, kNoLoss,
                         SecondsSince(compare_start));
    }
    compare_bar.Finish();
    const double m1 = Quantile(one, 0.5), mn = Quantile(many, 0.5);
    const double l1 = Quantile(loop_one, 0.5), ln = Quantile(loop_many, 0.5);
    speedup = m1 / mn;
    loop_speedup = l1 / ln;
    std::printf(
        "\nScaling over %s alone, %d thread%s per device (medians of %d interleaved rounds, each "
        "run after an untimed one of its own):\n",
        devices[0].ToString().c_str(), threads, threads == 1 ? "" : "s", steps);
    std::printf("  %-28s %10s %12s %9s\n", "", "1 device",
                absl::StrFormat("%d devices", workers).c_str(), "speed-up");
    std::printf("  %-28s %7.2f ms %9.2f ms %8.2fx\n", "train step", m1, mn, speedup);
    std::printf("  %-28s %7.2f ms %9.2f ms %8.2fx\n", "perfectly parallel loop", l1, ln,
                loop_speedup);
    std::printf("  %-28s %33.2f\n", "ratio (step / loop speed-up)", speedup / loop_speedup);
    std::printf("  where the time goes (medians of each phase):\n");
    for (int k = 0; k < Trainer::kPhases; ++k) {
      std::printf("    %-26s %7.2f ms %9.2f ms\n", Trainer::kPhaseNames[k], single.PhaseMedian(k),
                  trainer->PhaseMedian(k));
    }
  }

  std::vector<std::string> quoted;
  for (Device d : devices) quoted.push_back("\"" + d.ToString() + "\"");
  std::string json = absl::StrFormat(
      "{\"benchmark\":\"train_step\",\"model\":\"%s\",\"batch_size\":%d,\"devices\":[%s],"
      "\"threads\":%d,\"steps\":%d,\"step_ms_median\":%.2f,\"step_ms_p90\":%.2f,"
      "\"samples_per_s\":%.1f,\"peak_bytes\":%d,\"min_bytes\":%d",
      kind, batch, absl::StrJoin(quoted, ","), threads, steps, median, p90, samples_per_s, peak,
      minimum);
  if (IsGpt(kind)) {
    absl::StrAppendFormat(&json, ",\"tokens\":%d,\"n_layer\":%d", tokens,
                          GptConfigOf(kind).n_layer());
  }
  if (model_only) json += ",\"model_only\":true";
  if (cuda_graph) {
    absl::StrAppendFormat(&json, ",\"cuda_graph\":true,\"replay_equals_eager\":%s",
                          model_only            ? "null"
                          : replay_equals_eager ? "true"
                                                : "false");
  }
  if (work.counted) {
    absl::StrAppendFormat(&json, ",\"launches_per_step\":%d,\"host_syncs_per_step\":%d",
                          work.launches + work.graph_launches, work.host_syncs);
  }
  if (cuda_graph && work.counted) {
    absl::StrAppendFormat(&json, ",\"eager_launches_per_step\":%d,\"graph_kernels_per_step\":%d",
                          eager_work.launches, work.graph_kernels);
  }
  json += roofline_json;
  if (compare) {
    absl::StrAppendFormat(&json, ",\"speedup\":%.3f,\"loop_speedup\":%.3f,\"speedup_ratio\":%.3f",
                          speedup, loop_speedup, speedup / loop_speedup);
  }
  if (autocast != kFloat32 && model_only) {
    absl::StrAppendFormat(&json, ",\"autocast\":\"%s\"", DTypeName(autocast));
  } else if (autocast != kFloat32) {
    absl::StrAppendFormat(
        &json,
        ",\"autocast\":\"%s\",\"autocast_ratio\":%.3f,\"autocast_ratio_p10\":%.3f,"
        "\"autocast_ratio_p90\":%.3f,\"autocast_peak_above_start\":%d,"
        "\"float32_peak_above_start\":%d",
        DTypeName(autocast), amp.ratio_median, amp.ratio_min, amp.ratio_max, amp.a_peak,
        amp.b_peak);
  }
  if (checkpointed && model_only) {
    absl::StrAppendFormat(&json, ",\"context\":%d", GptConfigOf(kind).block_size());
  } else if (checkpointed) {
    absl::StrAppendFormat(&json,
                          ",\"context\":%d,\"checkpoint_time_ratio\":%.3f,"
                          "\"checkpoint_time_ratio_p10\":%.3f,\"checkpoint_time_ratio_p90\":%.3f,"
                          "\"checkpointed_peak_above_start\":%d,\"plain_peak_above_start\":%d",
                          GptConfigOf(kind).block_size(), ckpt.ratio_median, ckpt.ratio_min,
                          ckpt.ratio_max, ckpt.a_peak, ckpt.b_peak);
  }
  std::printf("\n%s}\n", json.c_str());
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  return tandem::examples::RunMain(
      argc, argv, "train_step",
      "Times training steps on synthetic data.\n"
      "  train_step --model=mlp --batch_size=256 --devices=cpu:0,cpu:1 --threads=1",
      [] { return tandem::Run(); });
}
