#include "nn/optim.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>
#include <string>
#include <utility>

#include "tensor/core/autograd.h"
#include "tensor/kernels/vectorized.h"
#include "tensor/runtime/devices.h"
#include "tensor/runtime/profiler.h"
#include "tensor/runtime/run_across_devices.h"
#include "tensor/runtime/threads.h"

namespace tandem::nn {
namespace {

// The gradient of `param` with L2 weight decay folded in (a new tensor when decaying, so
// the stored gradient is left as backward() made it). For the tensor-op path (CUDA, or
// strided CPU tensors).
Tensor DecayedGradient(const Tensor& param, const Tensor& grad, double weight_decay) {
  if (weight_decay == 0.0) return grad;
  return add(grad, mul(param, weight_decay));
}

// Whether the fused CPU loops can update `tensors` (all defined ones on the CPU, float32 and
// contiguous); the rest take the tensor-op path.
bool FusedOnCpu(std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* t : tensors) {
    if (!t->defined()) continue;
    if (!t->device().is_cpu() || t->dtype() != kFloat32 || !t->is_contiguous()) return false;
  }
  return true;
}

float* Floats(const Tensor& t) { return t.defined() ? t.data<float>() : nullptr; }

// About 64 KiB of floats: enough work per piece to be worth a thread's wake-up, small enough
// to balance a model's few large weights over the threads.
constexpr int64_t kPieceElements = int64_t{1} << 14;

// Calls update(item, begin, end) over [0, sizes[item]) for every item, in pieces of at most
// kPieceElements, spread over the workers of the logical CPU devices (they share host
// memory; CpuWorkDevices: every configured one unless narrowed) or, with one, over its
// threads. The pieces are disjoint, and each
// element's arithmetic does not depend on the split, so the result is the same bit for bit
// however the pieces fall.
void RunPieces(const std::vector<int64_t>& sizes,
               const std::function<void(size_t, int64_t, int64_t)>& update) {
  struct Piece {
    size_t item;
    int64_t begin, end;
  };
  std::vector<Piece> pieces;
  for (size_t item = 0; item < sizes.size(); ++item) {
    for (int64_t begin = 0; begin < sizes[item]; begin += kPieceElements) {
      pieces.push_back({item, begin, std::min(sizes[item], begin + kPieceElements)});
    }
  }
  const auto run = [&](int64_t k) {
    const Piece& piece = pieces[static_cast<size_t>(k)];
    update(piece.item, piece.begin, piece.end);
  };
  const int64_t n = static_cast<int64_t>(pieces.size());
  if (n <= 1) {
    for (int64_t k = 0; k < n; ++k) run(k);
    return;
  }
  const std::vector<Device> devices = CpuWorkDevices();
  if (devices.size() > 1) {
    ::tandem::RunAcrossDevices(devices, static_cast<int>(n), [&](int k) { run(k); });
  } else {
    ParallelFor(devices[0], n, 1, [&](int64_t begin, int64_t end) {
      for (int64_t k = begin; k < end; ++k) run(k);
    });
  }
}

// ---- SGD's fused CPU update --------------------------------------------------------------

struct SgdItem {
  float* p;
  const float* g;
  float* buffer;  // null without momentum
  bool first;     // the buffer starts as the gradient
  float lr, momentum, dampening, weight_decay;
  bool nesterov;
};

template <bool kDecay, bool kMomentum, bool kNesterov, bool kFirst>
TANDEM_VECTORIZE void SgdKernel(const SgdItem& it, int64_t begin, int64_t end) {
  float* __restrict p = it.p;
  const float* __restrict g = it.g;
  float* __restrict b = it.buffer;
  const float lr = it.lr, momentum = it.momentum, keep = 1.0f - it.dampening;
  const float decay = it.weight_decay;
  for (int64_t j = begin; j < end; ++j) {
    float d = g[j];
    if (kDecay) d += decay * p[j];
    if (kMomentum) {
      const float bj = kFirst ? d : momentum * b[j] + keep * d;
      b[j] = bj;
      d = kNesterov ? d + momentum * bj : bj;
    }
    p[j] -= lr * d;
  }
}

// The kernel compiled for this CPU's vector unit (tensor/kernels/vectorized.h).
template <bool kDecay, bool kMomentum, bool kNesterov, bool kFirst>
void SgdUpdate(const SgdItem& it, int64_t begin, int64_t end) {
  ::tandem::vec::Vectorized(
      [&] { SgdKernel<kDecay, kMomentum, kNesterov, kFirst>(it, begin, end); });
}

using SgdKernelFn = void (*)(const SgdItem&, int64_t, int64_t);

SgdKernelFn PickSgdKernel(const SgdItem& it) {
  static constexpr SgdKernelFn kTable[16] = {
      SgdUpdate<false, false, false, false>, SgdUpdate<false, false, false, true>,
      SgdUpdate<false, false, true, false>,  SgdUpdate<false, false, true, true>,
      SgdUpdate<false, true, false, false>,  SgdUpdate<false, true, false, true>,
      SgdUpdate<false, true, true, false>,   SgdUpdate<false, true, true, true>,
      SgdUpdate<true, false, false, false>,  SgdUpdate<true, false, false, true>,
      SgdUpdate<true, false, true, false>,   SgdUpdate<true, false, true, true>,
      SgdUpdate<true, true, false, false>,   SgdUpdate<true, true, false, true>,
      SgdUpdate<true, true, true, false>,    SgdUpdate<true, true, true, true>,
  };
  const bool momentum = it.buffer != nullptr;
  return kTable[(it.weight_decay != 0.0f) * 8 + momentum * 4 + (momentum && it.nesterov) * 2 +
                (momentum && it.first)];
}

// ---- Adam's and AdamW's fused CPU update -------------------------------------------------

struct AdamHyper {
  double lr, beta1, beta2, eps, weight_decay;
};

struct AdamItem {
  float* p;
  const float* g;
  float* m;
  float* v;
  float beta1, beta2, eps, weight_decay, step_size, inv_bc2_sqrt, decay_factor;
  bool l2;  // weight decay folded into the gradient (Adam); AdamW scales p by decay_factor
};

TANDEM_VECTORIZE void AdamKernel(const AdamItem& it, int64_t begin, int64_t end) {
  float* __restrict p = it.p;
  const float* __restrict g = it.g;
  float* __restrict m = it.m;
  float* __restrict v = it.v;
  const float b1 = it.beta1, b2 = it.beta2, c1 = 1.0f - it.beta1, c2 = 1.0f - it.beta2;
  const float eps = it.eps, step_size = it.step_size, inv_bc2 = it.inv_bc2_sqrt;
  const float l2 = it.l2 ? it.weight_decay : 0.0f, scale = it.decay_factor;
  for (int64_t j = begin; j < end; ++j) {
    const float pj = p[j] * scale;
    const float d = g[j] + l2 * pj;
    const float mj = b1 * m[j] + c1 * d;
    const float vj = b2 * v[j] + c2 * (d * d);
    m[j] = mj;
    v[j] = vj;
    p[j] = pj - step_size * (mj / (std::sqrt(vj) * inv_bc2 + eps));
  }
}

// ---- RMSprop's fused CPU update ----------------------------------------------------------

struct RmsItem {
  float* p;
  const float* g;
  float* square_avg;
  float* buffer;    // null without momentum
  float* grad_avg;  // null unless centered
  float lr, alpha, eps, weight_decay, momentum;
};

template <bool kMomentum, bool kCentered>
TANDEM_VECTORIZE void RmsKernel(const RmsItem& it, int64_t begin, int64_t end) {
  float* __restrict p = it.p;
  const float* __restrict g = it.g;
  float* __restrict v = it.square_avg;
  float* __restrict b = it.buffer;
  float* __restrict a = it.grad_avg;
  const float alpha = it.alpha, rest = 1.0f - it.alpha, eps = it.eps, lr = it.lr;
  const float decay = it.weight_decay, momentum = it.momentum;
  for (int64_t j = begin; j < end; ++j) {
    const float d = g[j] + decay * p[j];
    const float vj = alpha * v[j] + rest * (d * d);
    v[j] = vj;
    float denom;
    if (kCentered) {
      const float aj = alpha * a[j] + rest * d;
      a[j] = aj;
      denom = std::sqrt(vj - aj * aj) + eps;
    } else {
      denom = std::sqrt(vj) + eps;
    }
    if (kMomentum) {
      const float bj = momentum * b[j] + d / denom;
      b[j] = bj;
      p[j] -= lr * bj;
    } else {
      p[j] -= lr * (d / denom);
    }
  }
}

}  // namespace

// ---- ParamGroup and Optimizer ----------------------------------------------------------

ParamGroup::ParamGroup(const ParamGroup& other)
    : params_(other.params_),
      options_(other.options_ ? other.options_->clone() : nullptr),
      initial_lr_(other.initial_lr_) {}

ParamGroup& ParamGroup::operator=(const ParamGroup& other) {
  if (this != &other) {
    params_ = other.params_;
    options_ = other.options_ ? other.options_->clone() : nullptr;
    initial_lr_ = other.initial_lr_;
  }
  return *this;
}

OptimizerOptions& ParamGroup::options() {
  TANDEM_CHECK(options_ != nullptr,
               "ParamGroup::options: this group has no options of its own; an optimizer fills "
               "them in from its defaults when the group is added (read them through "
               "optimizer.param_groups())");
  return *options_;
}

const OptimizerOptions& ParamGroup::options() const {
  return const_cast<ParamGroup*>(this)->options();
}

Optimizer::Optimizer(std::string name, std::unique_ptr<OptimizerOptions> defaults)
    : defaults_(std::move(defaults)), name_(std::move(name)) {}

void Optimizer::AddGroups(std::vector<ParamGroup> groups, bool from_parameter_list) {
  if (from_parameter_list) {
    TANDEM_CHECK(!groups.empty() && !groups[0].params().empty(), name_,
                 ": got an empty parameter list; pass e.g. module->parameters() of a module "
                 "that has parameters");
  } else {
    TANDEM_CHECK(!groups.empty(), name_,
                 ": got no parameter groups; pass at least one nn::ParamGroup");
  }
  CheckOptions(*defaults_);
  for (const ParamGroup& group : groups) add_param_group(group);
}

void Optimizer::add_param_group(const ParamGroup& group) {
  const size_t g = groups_.size();
  std::unique_ptr<OptimizerOptions> options =
      group.has_options() ? group.options().clone() : defaults_->clone();
  CheckOptions(*options);
  std::set<const void*> seen;
  for (const Tensor& p : parameters_) seen.insert(p.impl());
  for (size_t k = 0; k < group.params().size(); ++k) {
    const Tensor& p = group.params()[k];
    const size_t i = parameters_.size() + k;
    TANDEM_CHECK(p.defined(), name_, ": parameter ", i, " is undefined");
    TANDEM_CHECK(IsFloatingPoint(p.dtype()), name_, ": parameter ", i, " is ", p.dtype(),
                 " but only floating-point tensors (float32, float64) can be optimized");
    TANDEM_CHECK(p.is_leaf(), name_, ": parameter ", i, " (", ShapeToString(p.shape()),
                 ") is not a leaf but the result of ", p.grad_fn()->name(),
                 "; an optimizer updates leaves, where gradients accumulate");
    TANDEM_CHECK(seen.insert(p.impl()).second, name_, ": parameter ", i, " (",
                 ShapeToString(p.shape()), ") of group ", g,
                 " appears more than once in this optimizer; give each parameter to one "
                 "group only");
  }
  ParamGroup added(group.params());
  added.set_options(std::move(options));
  if (group.initial_lr()) added.set_initial_lr(*group.initial_lr());
  groups_.push_back(std::move(added));
  parameters_.insert(parameters_.end(), group.params().begin(), group.params().end());
  ResizeState(parameters_.size());
}

void Optimizer::zero_grad(bool set_to_none) {
  TANDEM_PROFILE_SCOPE("optim", name_ + ".zero_grad");
  ZeroGrad(parameters_, set_to_none);
}

std::pair<size_t, std::string> Optimizer::ParseStateName(
    const std::string& name, const std::vector<std::string>& fields) const {
  std::string known;
  for (const std::string& f : fields) known += (known.empty() ? "" : ", ") + f;
  const std::string expected =
      "\"state.<parameter index>.<field>\" with a field of " + name_ + " (" + known + ")";
  TANDEM_CHECK(name.rfind("state.", 0) == 0, name_, "::load_state_dict: unknown entry '", name,
               "': expected ", expected, "; was the state saved by another kind of optimizer?");
  const size_t dot = name.find('.', 6);
  const std::string index_text = name.substr(6, dot == std::string::npos ? dot : dot - 6);
  const bool digits = !index_text.empty() && index_text.size() < 10 &&
                      index_text.find_first_not_of("0123456789") == std::string::npos;
  TANDEM_CHECK(digits && dot != std::string::npos, name_, "::load_state_dict: malformed entry '",
               name, "': expected ", expected);
  const size_t index = std::stoul(index_text);
  TANDEM_CHECK(index < parameters_.size(), name_, "::load_state_dict: entry '", name,
               "' is for parameter ", index, " but this optimizer has ", parameters_.size(),
               " parameters; was the state saved for another model?");
  const std::string field = name.substr(dot + 1);
  bool found = false;
  for (const std::string& f : fields) found = found || f == field;
  TANDEM_CHECK(found, name_, "::load_state_dict: unknown entry '", name, "': expected ", expected,
               "; was the state saved by another kind of optimizer?");
  return {index, field};
}

Tensor Optimizer::StateTensorFor(size_t i, const std::string& name, const Tensor& value) const {
  const Tensor& p = parameters_[i];
  TANDEM_CHECK(value.defined(), name_, "::load_state_dict: entry '", name, "' is undefined");
  TANDEM_CHECK(value.dtype() == p.dtype() && value.shape() == p.shape(), name_,
               "::load_state_dict: entry '", name, "' must be ", p.dtype(), " of shape ",
               ShapeToString(p.shape()), " (parameter ", i, "'s) but is ", value.dtype(),
               " of shape ", ShapeToString(value.shape()),
               "; was the state saved for another model?");
  NoGradGuard no_grad;
  return value.to(p.device()).clone();
}

int64_t Optimizer::StepCountFor(const std::string& name, const Tensor& value) const {
  TANDEM_CHECK(value.defined() && value.dtype() == kInt64 && value.numel() == 1, name_,
               "::load_state_dict: entry '", name, "' must be one int64 (the step count)");
  const int64_t step = value.to(Device::Cpu(0)).reshape({1}).to_vector<int64_t>().at(0);
  TANDEM_CHECK(step >= 1, name_, "::load_state_dict: entry '", name,
               "' must be a step count of at least 1 but is ", step);
  return step;
}

// ---- SGD -------------------------------------------------------------------------------

SGD::SGD(std::vector<Tensor> parameters, const SGDOptions& options)
    : Optimizer("SGD", options.clone()) {
  AddGroups({ParamGroup(std::move(parameters))}, /*from_parameter_list=*/true);
}

SGD::SGD(std::vector<ParamGroup> groups, const SGDOptions& defaults)
    : Optimizer("SGD", defaults.clone()) {
  AddGroups(std::move(groups), /*from_parameter_list=*/false);
}

void SGD::CheckOptions(const OptimizerOptions& options) const {
  const auto* o = dynamic_cast<const SGDOptions*>(&options);
  TANDEM_CHECK(o != nullptr, "SGD: a parameter group's options must be nn::SGDOptions");
  TANDEM_CHECK(o->lr() >= 0.0, "SGD: the learning rate must be >= 0 but is ", o->lr());
  TANDEM_CHECK(o->momentum() >= 0.0, "SGD: momentum must be >= 0 but is ", o->momentum());
  TANDEM_CHECK(o->weight_decay() >= 0.0, "SGD: weight_decay must be >= 0 but is ",
               o->weight_decay());
  TANDEM_CHECK(!o->nesterov() || (o->momentum() > 0.0 && o->dampening() == 0.0),
               "SGD: Nesterov momentum needs momentum > 0 and dampening 0, but momentum is ",
               o->momentum(), " and dampening ", o->dampening());
}

void SGD::step() {
  NoGradGuard no_grad;
  TANDEM_PROFILE_SCOPE("optim", name_ + ".step");
  std::vector<SgdItem> items;
  std::vector<int64_t> sizes;
  ForEachParameter<SGDOptions>([&](const SGDOptions& o, size_t i) {
    Tensor& p = parameters_[i];
    const Tensor grad = p.grad();
    if (!grad.defined()) return;
    Tensor& buffer = momentum_buffers_[i];
    const bool momentum = o.momentum() != 0.0;
    const bool first = momentum && !buffer.defined();
    if (FusedOnCpu({&p, &grad, &buffer})) {
      if (first) buffer = empty(p.shape(), TensorOptions().device(p.device()));
      items.push_back({p.data<float>(), grad.data<float>(), momentum ? Floats(buffer) : nullptr,
                       first, static_cast<float>(o.lr()), static_cast<float>(o.momentum()),
                       static_cast<float>(o.dampening()), static_cast<float>(o.weight_decay()),
                       o.nesterov()});
      sizes.push_back(p.numel());
      return;
    }
    Tensor g = DecayedGradient(p, grad, o.weight_decay());
    if (momentum) {
      if (first) {
        buffer = g.clone();
      } else {
        buffer.mul_(o.momentum()).add_(g, 1.0 - o.dampening());
      }
      g = o.nesterov() ? add(g, mul(buffer, o.momentum())) : buffer;
    }
    p.add_(g, -o.lr());
  });
  RunPieces(sizes, [&](size_t k, int64_t begin, int64_t end) {
    PickSgdKernel(items[k])(items[k], begin, end);
  });
}

OptimizerState SGD::state_dict() const {
  NoGradGuard no_grad;
  OptimizerState state;
  for (size_t i = 0; i < momentum_buffers_.size(); ++i) {
    if (momentum_buffers_[i].defined()) {
      state["state." + std::to_string(i) + ".momentum_buffer"] = momentum_buffers_[i].clone();
    }
  }
  return state;
}

void SGD::load_state_dict(const OptimizerState& state) {
  std::vector<Tensor> buffers(parameters_.size());
  for (const auto& [name, value] : state) {
    const size_t i = ParseStateName(name, {"momentum_buffer"}).first;
    buffers[i] = StateTensorFor(i, name, value);
  }
  momentum_buffers_ = std::move(buffers);
}

// ---- Adam and AdamW --------------------------------------------------------------------

namespace internal {
namespace {

AdamHyper HyperOf(const OptimizerOptions& options) {
  if (const auto* o = dynamic_cast<const AdamOptions*>(&options)) {
    return {o->lr(), std::get<0>(o->betas()), std::get<1>(o->betas()), o->eps(), o->weight_decay()};
  }
  const auto& o = static_cast<const AdamWOptions&>(options);
  return {o.lr(), std::get<0>(o.betas()), std::get<1>(o.betas()), o.eps(), o.weight_decay()};
}

}  // namespace

void AdamBase::CheckOptions(const OptimizerOptions& options) const {
  const bool right_kind = decoupled_ ? dynamic_cast<const AdamWOptions*>(&options) != nullptr
                                     : dynamic_cast<const AdamOptions*>(&options) != nullptr;
  TANDEM_CHECK(right_kind, name_, ": a parameter group's options must be nn::", name_, "Options");
  const AdamHyper o = HyperOf(options);
  TANDEM_CHECK(o.lr >= 0.0, name_, ": the learning rate must be >= 0 but is ", o.lr);
  TANDEM_CHECK(o.eps >= 0.0, name_, ": eps must be >= 0 but is ", o.eps);
  TANDEM_CHECK(o.beta1 >= 0.0 && o.beta1 < 1.0 && o.beta2 >= 0.0 && o.beta2 < 1.0, name_,
               ": betas must be in [0, 1) but are (", o.beta1, ", ", o.beta2, ")");
  TANDEM_CHECK(o.weight_decay >= 0.0, name_, ": weight_decay must be >= 0 but is ", o.weight_decay);
}

void AdamBase::ResizeState(size_t n) {
  steps_.resize(n, 0);
  exp_avg_.resize(n);
  exp_avg_sq_.resize(n);
}

void AdamBase::step() {
  NoGradGuard no_grad;
  TANDEM_PROFILE_SCOPE("optim", name_ + ".step");
  std::vector<AdamItem> items;
  std::vector<int64_t> sizes;
  ForEachParameter<OptimizerOptions>([&](const OptimizerOptions& options, size_t i) {
    const AdamHyper o = HyperOf(options);
    Tensor& p = parameters_[i];
    const Tensor grad = p.grad();
    if (!grad.defined()) return;
    Tensor& m = exp_avg_[i];
    Tensor& v = exp_avg_sq_[i];
    if (!m.defined()) {
      m = zeros_like(p);
      v = zeros_like(p);
    }
    const int64_t t = ++steps_[i];
    const double bias_correction1 = 1.0 - std::pow(o.beta1, static_cast<double>(t));
    const double bias_correction2 = 1.0 - std::pow(o.beta2, static_cast<double>(t));
    const double decay_factor = decoupled_ ? 1.0 - o.lr * o.weight_decay : 1.0;
    if (FusedOnCpu({&p, &grad, &m, &v})) {
      items.push_back({p.data<float>(), grad.data<float>(), m.data<float>(), v.data<float>(),
                       static_cast<float>(o.beta1), static_cast<float>(o.beta2),
                       static_cast<float>(o.eps), static_cast<float>(o.weight_decay),
                       static_cast<float>(o.lr / bias_correction1),
                       static_cast<float>(1.0 / std::sqrt(bias_correction2)),
                       static_cast<float>(decay_factor), !decoupled_});
      sizes.push_back(p.numel());
      return;
    }
    if (decoupled_ && o.weight_decay != 0.0) p.mul_(decay_factor);
    const Tensor g = decoupled_ ? grad : DecayedGradient(p, grad, o.weight_decay);
    m.mul_(o.beta1).add_(g, 1.0 - o.beta1);
    v.mul_(o.beta2).add_(square(g), 1.0 - o.beta2);
    // denom = sqrt(v) / sqrt(bias_correction2) + eps, built in one temporary.
    Tensor denom = sqrt(v);
    denom.mul_(1.0 / std::sqrt(bias_correction2)).add_(o.eps);
    p.add_(div(m, denom), -o.lr / bias_correction1);
  });
  RunPieces(sizes, [&](size_t k, int64_t begin, int64_t end) {
    ::tandem::vec::Vectorized([&] { AdamKernel(items[k], begin, end); });
  });
}

OptimizerState AdamBase::state_dict() const {
  NoGradGuard no_grad;
  OptimizerState state;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    if (!exp_avg_[i].defined()) continue;
    const std::string prefix = "state." + std::to_string(i) + ".";
    state[prefix + "exp_avg"] = exp_avg_[i].clone();
    state[prefix + "exp_avg_sq"] = exp_avg_sq_[i].clone();
    state[prefix + "step"] = from_vector(std::vector<int64_t>{steps_[i]}, Shape{});
  }
  return state;
}

void AdamBase::load_state_dict(const OptimizerState& state) {
  std::vector<int64_t> steps(parameters_.size(), 0);
  std::vector<Tensor> exp_avg(parameters_.size()), exp_avg_sq(parameters_.size());
  std::vector<int> fields_seen(parameters_.size(), 0);
  for (const auto& [name, value] : state) {
    const auto [i, field] = ParseStateName(name, {"exp_avg", "exp_avg_sq", "step"});
    ++fields_seen[i];
    if (field == "step") {
      steps[i] = StepCountFor(name, value);
    } else {
      (field == "exp_avg" ? exp_avg : exp_avg_sq)[i] = StateTensorFor(i, name, value);
    }
  }
  for (size_t i = 0; i < parameters_.size(); ++i) {
    TANDEM_CHECK(fields_seen[i] == 0 || fields_seen[i] == 3, name_, "::load_state_dict: parameter ",
                 i, " has only some of exp_avg, exp_avg_sq and step; expected all three or none");
  }
  steps_ = std::move(steps);
  exp_avg_ = std::move(exp_avg);
  exp_avg_sq_ = std::move(exp_avg_sq);
}

}  // namespace internal

Adam::Adam(std::vector<Tensor> parameters, const AdamOptions& options)
    : AdamBase("Adam", options.clone(), /*decoupled=*/false) {
  AddGroups({ParamGroup(std::move(parameters))}, /*from_parameter_list=*/true);
}

Adam::Adam(std::vector<ParamGroup> groups, const AdamOptions& defaults)
    : AdamBase("Adam", defaults.clone(), /*decoupled=*/false) {
  AddGroups(std::move(groups), /*from_parameter_list=*/false);
}

AdamW::AdamW(std::vector<Tensor> parameters, const AdamWOptions& options)
    : AdamBase("AdamW", options.clone(), /*decoupled=*/true) {
  AddGroups({ParamGroup(std::move(parameters))}, /*from_parameter_list=*/true);
}

AdamW::AdamW(std::vector<ParamGroup> groups, const AdamWOptions& defaults)
    : AdamBase("AdamW", defaults.clone(), /*decoupled=*/true) {
  AddGroups(std::move(groups), /*from_parameter_list=*/false);
}

// ---- RMSprop ---------------------------------------------------------------------------

RMSprop::RMSprop(std::vector<Tensor> parameters, const RMSpropOptions& options)
    : Optimizer("RMSprop", options.clone()) {
  AddGroups({ParamGroup(std::move(parameters))}, /*from_parameter_list=*/true);
}

RMSprop::RMSprop(std::vector<ParamGroup> groups, const RMSpropOptions& defaults)
    : Optimizer("RMSprop", defaults.clone()) {
  AddGroups(std::move(groups), /*from_parameter_list=*/false);
}

void RMSprop::CheckOptions(const OptimizerOptions& options) const {
  const auto* o = dynamic_cast<const RMSpropOptions*>(&options);
  TANDEM_CHECK(o != nullptr, "RMSprop: a parameter group's options must be nn::RMSpropOptions");
  TANDEM_CHECK(o->lr() >= 0.0, "RMSprop: the learning rate must be >= 0 but is ", o->lr());
  TANDEM_CHECK(o->alpha() >= 0.0, "RMSprop: alpha must be >= 0 but is ", o->alpha());
  TANDEM_CHECK(o->eps() >= 0.0, "RMSprop: eps must be >= 0 but is ", o->eps());
  TANDEM_CHECK(o->momentum() >= 0.0, "RMSprop: momentum must be >= 0 but is ", o->momentum());
  TANDEM_CHECK(o->weight_decay() >= 0.0, "RMSprop: weight_decay must be >= 0 but is ",
               o->weight_decay());
}

void RMSprop::ResizeState(size_t n) {
  steps_.resize(n, 0);
  square_avg_.resize(n);
  momentum_buffers_.resize(n);
  grad_avg_.resize(n);
}

void RMSprop::step() {
  NoGradGuard no_grad;
  TANDEM_PROFILE_SCOPE("optim", name_ + ".step");
  std::vector<RmsItem> items;
  std::vector<int64_t> sizes;
  ForEachParameter<RMSpropOptions>([&](const RMSpropOptions& o, size_t i) {
    Tensor& p = parameters_[i];
    const Tensor grad = p.grad();
    if (!grad.defined()) return;
    Tensor& v = square_avg_[i];
    Tensor& b = momentum_buffers_[i];
    Tensor& a = grad_avg_[i];
    if (!v.defined()) v = zeros_like(p);
    // Options may change between steps (a group's momentum set later): buffers start at 0.
    if (o.momentum() > 0.0 && !b.defined()) b = zeros_like(p);
    if (o.centered() && !a.defined()) a = zeros_like(p);
    ++steps_[i];
    if (FusedOnCpu({&p, &grad, &v, &b, &a})) {
      items.push_back({p.data<float>(), grad.data<float>(), v.data<float>(),
                       o.momentum() > 0.0 ? b.data<float>() : nullptr,
                       o.centered() ? a.data<float>() : nullptr, static_cast<float>(o.lr()),
                       static_cast<float>(o.alpha()), static_cast<float>(o.eps()),
                       static_cast<float>(o.weight_decay()), static_cast<float>(o.momentum())});
      sizes.push_back(p.numel());
      return;
    }
    const Tensor g = DecayedGradient(p, grad, o.weight_decay());
    v.mul_(o.alpha()).add_(square(g), 1.0 - o.alpha());
    Tensor denom;
    if (o.centered()) {
      a.mul_(o.alpha()).add_(g, 1.0 - o.alpha());
      denom = sqrt(sub(v, square(a)));
    } else {
      denom = sqrt(v);
    }
    denom.add_(o.eps());
    if (o.momentum() > 0.0) {
      b.mul_(o.momentum()).add_(div(g, denom));
      p.add_(b, -o.lr());
    } else {
      p.add_(div(g, denom), -o.lr());
    }
  });
  RunPieces(sizes, [&](size_t k, int64_t begin, int64_t end) {
    const RmsItem& it = items[k];
    ::tandem::vec::Vectorized([&] {
      if (it.buffer && it.grad_avg) {
        RmsKernel<true, true>(it, begin, end);
      } else if (it.buffer) {
        RmsKernel<true, false>(it, begin, end);
      } else if (it.grad_avg) {
        RmsKernel<false, true>(it, begin, end);
      } else {
        RmsKernel<false, false>(it, begin, end);
      }
    });
  });
}

OptimizerState RMSprop::state_dict() const {
  NoGradGuard no_grad;
  OptimizerState state;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    if (!square_avg_[i].defined()) continue;
    const std::string prefix = "state." + std::to_string(i) + ".";
    state[prefix + "square_avg"] = square_avg_[i].clone();
    state[prefix + "step"] = from_vector(std::vector<int64_t>{steps_[i]}, Shape{});
    if (momentum_buffers_[i].defined()) {
      state[prefix + "momentum_buffer"] = momentum_buffers_[i].clone();
    }
    if (grad_avg_[i].defined()) state[prefix + "grad_avg"] = grad_avg_[i].clone();
  }
  return state;
}

void RMSprop::load_state_dict(const OptimizerState& state) {
  const size_t n = parameters_.size();
  std::vector<int64_t> steps(n, 0);
  std::vector<Tensor> square_avg(n), buffers(n), grad_avg(n);
  for (const auto& [name, value] : state) {
    const auto [i, field] =
        ParseStateName(name, {"square_avg", "step", "momentum_buffer", "grad_avg"});
    if (field == "step") {
      steps[i] = StepCountFor(name, value);
    } else if (field == "square_avg") {
      square_avg[i] = StateTensorFor(i, name, value);
    } else if (field == "momentum_buffer") {
      buffers[i] = StateTensorFor(i, name, value);
    } else {
      grad_avg[i] = StateTensorFor(i, name, value);
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const bool any =
        steps[i] != 0 || square_avg[i].defined() || buffers[i].defined() || grad_avg[i].defined();
    TANDEM_CHECK(!any || (steps[i] != 0 && square_avg[i].defined()), name_,
                 "::load_state_dict: parameter ", i,
                 " has state but lacks square_avg or step; expected both (and momentum_buffer, "
                 "grad_avg where momentum or centered are on)");
  }
  steps_ = std::move(steps);
  square_avg_ = std::move(square_avg);
  momentum_buffers_ = std::move(buffers);
  grad_avg_ = std::move(grad_avg);
}

}  // namespace tandem::nn
