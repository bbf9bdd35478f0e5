// For tests of the fused optimizer steps (tensor/ops/fused_optimizers.h): every flag combination
// the kernels pick an instantiation for, listed once, with random tensors to run them on. The
// CPU test (tensor/ops/fused_optimizers_test.cc) and the CUDA one
// (tensor/cuda/fused_optimizers_test.cc) both run this list.
//
//   for (const OptimizerCase& c : AllOptimizerCases()) {
//     CaseTensors t = MakeCaseTensors(c, {1000, 3}, kFloat32, Device::Cpu(0));
//     RunCase(c, t);
//   }
#ifndef TANDEM_TENSOR_OPS_FUSED_OPTIMIZER_CASES_H_
#define TANDEM_TENSOR_OPS_FUSED_OPTIMIZER_CASES_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tensor/ops/fused_optimizers.h"
#include "tensor/tensor.h"

namespace tandem::testing {

struct OptimizerCase {
  enum class Kind { kSgd, kAdam, kRmsprop };
  std::string name;
  Kind kind = Kind::kSgd;
  FusedSgdOptions sgd;
  FusedAdamOptions adam;
  FusedRmspropOptions rmsprop;
};

inline OptimizerCase MakeCase(std::string name, OptimizerCase::Kind kind) {
  OptimizerCase c;
  c.name = std::move(name);
  c.kind = kind;
  return c;
}

inline std::vector<OptimizerCase> AllOptimizerCases() {
  using Kind = OptimizerCase::Kind;
  std::vector<OptimizerCase> cases;
  for (double decay : {0.0, 1e-2}) {
    const std::string suffix = decay != 0.0 ? " with weight decay" : "";
    OptimizerCase plain = MakeCase("sgd" + suffix, Kind::kSgd);
    plain.sgd.lr = 0.1;
    plain.sgd.weight_decay = decay;
    cases.push_back(plain);
    // Nesterov and the first step mean nothing without momentum: every kernel ignores them.
    plain.name += " (nesterov and first set, no momentum)";
    plain.sgd.nesterov = plain.sgd.first_step = true;
    cases.push_back(plain);
    for (bool nesterov : {false, true}) {
      for (bool first : {false, true}) {
        OptimizerCase c = MakeCase("sgd momentum" + std::string(nesterov ? " nesterov" : "") +
                                       (first ? " first step" : "") + suffix,
                                   Kind::kSgd);
        c.sgd.lr = 0.05;
        c.sgd.momentum = 0.9;
        c.sgd.dampening = 0.1;
        c.sgd.weight_decay = decay;
        c.sgd.nesterov = nesterov;
        c.sgd.first_step = first;
        cases.push_back(c);
      }
    }
  }
  OptimizerCase sgd_max = MakeCase("sgd momentum maximize", Kind::kSgd);
  sgd_max.sgd.lr = 0.05;
  sgd_max.sgd.momentum = 0.9;
  sgd_max.sgd.weight_decay = 1e-2;
  sgd_max.sgd.maximize = true;
  cases.push_back(sgd_max);
  for (int variant = 0; variant < 3; ++variant) {  // Adam, Adam with L2, AdamW
    for (int flags = 0; flags < 3; ++flags) {      // plain, amsgrad, maximize
      OptimizerCase c = MakeCase(std::string(variant == 0   ? "adam"
                                             : variant == 1 ? "adam l2"
                                                            : "adamw") +
                                     (flags == 1   ? " amsgrad"
                                      : flags == 2 ? " maximize"
                                                   : ""),
                                 Kind::kAdam);
      c.adam.lr = 1e-3;
      c.adam.weight_decay = variant == 0 ? 0.0 : 1e-2;
      c.adam.decoupled_weight_decay = variant == 2;
      c.adam.amsgrad = flags == 1;
      c.adam.maximize = flags == 2;
      cases.push_back(c);
    }
  }
  for (bool momentum : {false, true}) {
    for (bool centered : {false, true}) {
      OptimizerCase c = MakeCase(
          "rmsprop" + std::string(momentum ? " momentum" : "") + (centered ? " centered" : ""),
          Kind::kRmsprop);
      c.rmsprop.lr = 1e-2;
      c.rmsprop.momentum = momentum ? 0.9 : 0.0;
      c.rmsprop.centered = centered;
      c.rmsprop.weight_decay = momentum && centered ? 1e-2 : 0.0;
      cases.push_back(c);
    }
  }
  OptimizerCase rms_max = MakeCase("rmsprop centered maximize", Kind::kRmsprop);
  rms_max.rmsprop.lr = 1e-2;
  rms_max.rmsprop.centered = true;
  rms_max.rmsprop.maximize = true;
  cases.push_back(rms_max);
  return cases;
}

// A case's tensors: params, grads and the state lists its op takes (in the op's order; a list
// the case does not use is empty), with Adam's step counts.
struct CaseTensors {
  std::vector<Tensor> params, grads;
  std::vector<std::vector<Tensor>> states;
  std::vector<int64_t> steps;

  // Every tensor the step writes: params, then each state list.
  std::vector<Tensor> Written() const {
    std::vector<Tensor> all = params;
    for (const auto& list : states) all.insert(all.end(), list.begin(), list.end());
    return all;
  }
};

// Uniform in [low, high): drawn in float32 on the CPU from `seed`, then converted, so that
// every device and dtype starts from the same values (rounded for 16-bit dtypes).
inline Tensor RandomTensor(int64_t n, double low, double high, DType dtype, Device device) {
  return (rand({n}) * (high - low) + low).to(dtype).to(device);
}

inline CaseTensors MakeCaseTensors(const OptimizerCase& c, const std::vector<int64_t>& sizes,
                                   DType dtype, Device device, uint64_t seed = 1) {
  using Kind = OptimizerCase::Kind;
  manual_seed(seed);
  // Each state's range: second moments are non-negative, and RMSprop's square_avg exceeds
  // grad_avg squared, as an optimizer's would, so that the square roots are of numbers (NaN
  // would match NaN and hide a difference).
  struct Range {
    bool used;
    double low, high;
  };
  std::vector<Range> ranges;
  switch (c.kind) {
    case Kind::kSgd:
      ranges = {{c.sgd.momentum != 0.0, -1.0, 1.0}};
      break;
    case Kind::kAdam:
      ranges = {{true, -1.0, 1.0}, {true, 0.0, 1.0}, {c.adam.amsgrad, 0.0, 1.0}};
      break;
    case Kind::kRmsprop:
      ranges = {
          {true, 0.5, 1.5}, {c.rmsprop.momentum > 0.0, -1.0, 1.0}, {c.rmsprop.centered, -0.5, 0.5}};
      break;
  }
  CaseTensors t;
  t.states.resize(ranges.size());
  for (size_t k = 0; k < sizes.size(); ++k) {
    t.params.push_back(RandomTensor(sizes[k], -2.0, 2.0, dtype, device));
    t.grads.push_back(RandomTensor(sizes[k], -2.0, 2.0, dtype, device));
    for (size_t s = 0; s < ranges.size(); ++s) {
      if (!ranges[s].used) continue;
      t.states[s].push_back(RandomTensor(sizes[k], ranges[s].low, ranges[s].high, dtype, device));
    }
    t.steps.push_back(static_cast<int64_t>(k % 5) + 1);
  }
  return t;
}

inline void RunCase(const OptimizerCase& c, CaseTensors& t) {
  switch (c.kind) {
    case OptimizerCase::Kind::kSgd:
      fused_sgd_(t.params, t.grads, t.states[0], c.sgd);
      break;
    case OptimizerCase::Kind::kAdam:
      fused_adam_(t.params, t.grads, t.states[0], t.states[1], t.states[2], t.steps, c.adam);
      break;
    case OptimizerCase::Kind::kRmsprop:
      fused_rmsprop_(t.params, t.grads, t.states[0], t.states[1], t.states[2], c.rmsprop);
      break;
  }
}

}  // namespace tandem::testing

#endif  // TANDEM_TENSOR_OPS_FUSED_OPTIMIZER_CASES_H_
