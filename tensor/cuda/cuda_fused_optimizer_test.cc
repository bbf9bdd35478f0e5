// Fused optimizer update CUDA kernels against the CPU backend (bitwise).
//
// Shared fixture and helpers: cuda_backend_testing.h. Skips (with the reason) where there is
// no usable GPU; set TANDEM_TEST_SEED to replay a run.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "tensor/base/error.h"
#include "tensor/cuda/cuda_backend_testing.h"
#include "tensor/kernels/internal/elementwise_math.h"
#include "tensor/runtime/backend.h"

namespace tandem {
namespace cuda_test {

// ---- Fused optimizer updates ---------------------------------------------------------------
// Note [Fused optimizer updates]: both backends run the same element functions
// (optimizer_math.h) in the same order, and optimizer_kernels.cu is compiled without FMA
// contraction, so the GPU must give the CPU's bits for every flag combination the backends
// pick an instantiation for, in float32 and float64.

// One row of the matrix of flags: the hyper-parameters and which states the update has
// (bit s: state s); FusedUpdate's numel and pointers are filled in per tensor.
struct OptimizerCase {
  std::string name;
  FusedUpdate update;
  unsigned states = 0;
};

std::vector<OptimizerCase> AllOptimizerCases() {
  std::vector<OptimizerCase> cases;
  for (double decay : {0.0, 1e-2}) {
    const std::string suffix = decay != 0.0 ? " with weight decay" : "";
    OptimizerCase plain{"sgd" + suffix, {}, 0};
    plain.update.lr = 0.1;
    plain.update.weight_decay = decay;
    cases.push_back(plain);
    // Nesterov and the first step mean nothing without a buffer: both backends must ignore them.
    plain.name += " (nesterov and first set, no buffer)";
    plain.update.nesterov = plain.update.first = true;
    cases.push_back(plain);
    for (bool nesterov : {false, true}) {
      for (bool first : {false, true}) {
        OptimizerCase c{"sgd momentum" + std::string(nesterov ? " nesterov" : "") +
                            (first ? " first step" : "") + suffix,
                        {},
                        1};
        c.update.lr = 0.05;
        c.update.momentum = 0.9;
        c.update.dampening = 0.1;
        c.update.weight_decay = decay;
        c.update.nesterov = nesterov;
        c.update.first = first;
        cases.push_back(c);
      }
    }
  }
  for (int variant = 0; variant < 3; ++variant) {  // Adam, Adam with L2, AdamW
    const double lr = 1e-3, step = 3;
    OptimizerCase c{variant == 0 ? "adam" : variant == 1 ? "adam l2" : "adamw", {}, 3};
    c.update.kind = OptimizerKind::kAdam;
    c.update.beta1 = 0.9;
    c.update.beta2 = 0.999;
    c.update.eps = 1e-8;
    c.update.step_size = lr / (1 - std::pow(0.9, step));
    c.update.inv_bc2_sqrt = 1 / std::sqrt(1 - std::pow(0.999, step));
    c.update.weight_decay = variant == 1 ? 1e-2 : 0.0;
    c.update.l2 = variant == 1;
    c.update.decay_factor = variant == 2 ? 1 - lr * 1e-2 : 1.0;
    cases.push_back(c);
  }
  for (bool momentum : {false, true}) {
    for (bool centered : {false, true}) {
      OptimizerCase c{
          "rmsprop" + std::string(momentum ? " momentum" : "") + (centered ? " centered" : ""),
          {},
          1u | (momentum ? 2u : 0u) | (centered ? 4u : 0u)};
      c.update.kind = OptimizerKind::kRmsprop;
      c.update.lr = 1e-2;
      c.update.alpha = 0.99;
      c.update.eps = 1e-8;
      c.update.momentum = momentum ? 0.9 : 0.0;
      c.update.weight_decay = momentum && centered ? 1e-2 : 0.0;
      cases.push_back(c);
    }
  }
  return cases;
}

// Each state's starting values: Adam's exp_avg_sq and RMSprop's square_avg are non-negative,
// and RMSprop's square_avg exceeds grad_avg squared, as an optimizer's would, so that the
// square roots are of numbers (NaN would match NaN and hide a difference).
std::pair<double, double> StateRange(OptimizerKind kind, int state) {
  if (kind == OptimizerKind::kAdam && state == 1) return {0.0, 1.0};
  if (kind == OptimizerKind::kRmsprop && state == 0) return {0.5, 1.5};
  if (kind == OptimizerKind::kRmsprop && state == 2) return {-0.5, 0.5};
  return {-1.0, 1.0};
}

// One FusedOptimizerUpdate on each device: tensor k is items[k]'s case on items[k].second
// elements, from the same random param, grad and states (an empty tensor has null pointers).
// Every param and state buffer must then be bitwise the CPU's.
template <typename T>
void CudaBackendTest::ExpectFusedUpdatesMatch(
    const std::vector<std::pair<const OptimizerCase*, int64_t>>& items, const std::string& what) {
  struct Tensors {
    std::unique_ptr<Buffer<T>> param, grad, states[3];
  };
  std::vector<Tensors> tensors(items.size());
  std::vector<FusedUpdate> on_cpu, on_gpu;
  for (size_t k = 0; k < items.size(); ++k) {
    const OptimizerCase& c = *items[k].first;
    const int64_t n = items[k].second;
    FusedUpdate cpu_update = c.update, gpu_update = c.update;
    cpu_update.numel = gpu_update.numel = n;
    if (n > 0) {
      Tensors& t = tensors[k];
      t.param = std::make_unique<Buffer<T>>(Random<T>(n, -2.0, 2.0));
      t.grad = std::make_unique<Buffer<T>>(Random<T>(n, -2.0, 2.0));
      cpu_update.param = t.param->cpu();
      gpu_update.param = t.param->gpu();
      cpu_update.grad = t.grad->cpu();
      gpu_update.grad = t.grad->gpu();
      void** cpu_states[3] = {&cpu_update.state0, &cpu_update.state1, &cpu_update.state2};
      void** gpu_states[3] = {&gpu_update.state0, &gpu_update.state1, &gpu_update.state2};
      for (int s = 0; s < 3; ++s) {
        if ((c.states >> s & 1) == 0) continue;
        const auto [low, high] = StateRange(c.update.kind, s);
        t.states[s] = std::make_unique<Buffer<T>>(Random<T>(n, low, high));
        *cpu_states[s] = t.states[s]->cpu();
        *gpu_states[s] = t.states[s]->gpu();
      }
    }
    on_cpu.push_back(cpu_update);
    on_gpu.push_back(gpu_update);
  }
  const DType dtype = DTypeOf<T>::value;
  cpu_.FusedOptimizerUpdate(0, dtype, on_cpu);
  gpu_.FusedOptimizerUpdate(0, dtype, on_gpu);
  for (size_t k = 0; k < items.size(); ++k) {
    if (items[k].second == 0) continue;
    const std::string tensor = what + ", " + items[k].first->name + " on " +
                               std::to_string(items[k].second) + " elements: ";
    const Tensors& t = tensors[k];
    ExpectBitwiseEqual(t.param->Cpu(), t.param->Gpu(), Note(tensor + "param"));
    for (int s = 0; s < 3; ++s) {
      if (t.states[s] == nullptr) continue;
      ExpectBitwiseEqual(t.states[s]->Cpu(), t.states[s]->Gpu(),
                         Note(tensor + "state" + std::to_string(s)));
    }
  }
}

// Each case alone on tensors of several sizes (one past 65536, several not multiples of the
// block, an empty one), then every case in one call, as an optimizer with mixed groups would.
template <typename T>
void CudaBackendTest::ExpectEveryOptimizerCaseMatches() {
  const std::string dtype = DTypeName(DTypeOf<T>::value);
  const std::vector<OptimizerCase> cases = AllOptimizerCases();
  const int64_t sizes[] = {1, 255, 0, 1000, 70001};
  for (const OptimizerCase& c : cases) {
    std::vector<std::pair<const OptimizerCase*, int64_t>> items;
    for (int64_t n : sizes) items.emplace_back(&c, n);
    ExpectFusedUpdatesMatch<T>(items, dtype);
  }
  std::vector<std::pair<const OptimizerCase*, int64_t>> mixed;
  for (size_t k = 0; k < cases.size(); ++k) mixed.emplace_back(&cases[k], 17 + 301 * k);
  ExpectFusedUpdatesMatch<T>(mixed, dtype + " mixed call");
}

TEST_F(CudaBackendTest, FusedOptimizerUpdatesAreBitwiseTheCpus) {
  ExpectEveryOptimizerCaseMatches<float>();
  ExpectEveryOptimizerCaseMatches<double>();
}

TEST_F(CudaBackendTest, FusedOptimizerUpdateEdgeCases) {
  gpu_.FusedOptimizerUpdate(0, kFloat32, {});  // nothing to do
  FusedUpdate empty;                           // numel 0, no tensors: also nothing
  empty.kind = OptimizerKind::kAdam;
  gpu_.FusedOptimizerUpdate(0, kFloat64, {empty});
  // Another dtype throws, naming the kernel, even with nothing to update (as on the CPU).
  for (const std::vector<FusedUpdate>& updates :
       {std::vector<FusedUpdate>{}, std::vector<FusedUpdate>{empty}}) {
    try {
      gpu_.FusedOptimizerUpdate(0, kInt64, updates);
      FAIL() << "int64 must throw";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("CUDA FusedOptimizerUpdate"), std::string::npos)
          << error.what();
    }
  }
  // A missing state is an error on the host, not a fault on the GPU.
  Buffer<float> p(Random<float>(8, -1, 1)), g(Random<float>(8, -1, 1)), m(Random<float>(8, -1, 1));
  FusedUpdate adam;
  adam.kind = OptimizerKind::kAdam;
  adam.numel = 8;
  adam.param = p.gpu();
  adam.grad = g.gpu();
  adam.state0 = m.gpu();
  try {
    gpu_.FusedOptimizerUpdate(0, kFloat32, {adam});
    FAIL() << "Adam without exp_avg_sq must throw";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("exp_avg_sq"), std::string::npos) << error.what();
  }
  EXPECT_EQ(p.Gpu(), p.Cpu());  // nothing ran
}

// ---- bfloat16 and float16 ----------------------------------------------------------------

template <typename T>
void CudaBackendReducedTest::ExpectFusedUpdatesMatch16() {
  const std::vector<OptimizerCase> cases = AllOptimizerCases();
  for (const OptimizerCase& c : cases) {
    for (int64_t n : {1, 255, 1000}) {
      std::unique_ptr<Buffer<T>> tensors[5];  // param, grad, three states
      std::unique_ptr<Buffer<float>> wide[5];
      FusedUpdate on_cpu = c.update, on_gpu = c.update;
      on_cpu.numel = on_gpu.numel = n;
      void** cpu_slots[5] = {&on_cpu.param, const_cast<void**>(&on_cpu.grad), &on_cpu.state0,
                             &on_cpu.state1, &on_cpu.state2};
      void** gpu_slots[5] = {&on_gpu.param, const_cast<void**>(&on_gpu.grad), &on_gpu.state0,
                             &on_gpu.state1, &on_gpu.state2};
      for (int s = 0; s < 5; ++s) {
        if (s >= 2 && (c.states >> (s - 2) & 1) == 0) continue;
        const auto [low, high] =
            s >= 2 ? StateRange(c.update.kind, s - 2) : std::pair<double, double>{-2.0, 2.0};
        tensors[s] = std::make_unique<Buffer<T>>(RandomReduced<T>(n, low, high));
        wide[s] = std::make_unique<Buffer<float>>(Widened(tensors[s]->Cpu()));
        *cpu_slots[s] = wide[s]->cpu();
        *gpu_slots[s] = tensors[s]->gpu();
      }
      cpu_.FusedOptimizerUpdate(0, kFloat32, {on_cpu});
      gpu_.FusedOptimizerUpdate(0, DTypeOf<T>::value, {on_gpu});
      for (int s = 0; s < 5; ++s) {
        if (tensors[s] == nullptr || s == 1) continue;
        ExpectBitwiseEqual(Rounded<T>(wide[s]->Cpu()), tensors[s]->Gpu(),
                           Note(DTypePrefix<T>() + c.name + " on " + std::to_string(n) +
                                " elements: tensor " + std::to_string(s)));
      }
    }
  }
}

TEST_F(CudaBackendReducedTest, FusedOptimizerUpdatesBFloat16) {
  ExpectFusedUpdatesMatch16<BFloat16>();
}
TEST_F(CudaBackendReducedTest, FusedOptimizerUpdatesFloat16) { ExpectFusedUpdatesMatch16<Half>(); }

}  // namespace cuda_test
}  // namespace tandem
