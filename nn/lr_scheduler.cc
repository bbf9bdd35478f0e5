#include "nn/lr_scheduler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

namespace tandem::nn {
namespace {

constexpr double kPi = 3.14159265358979323846;

int64_t BitsOf(double value) {
  int64_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

double FromBits(int64_t bits) {
  double value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// PyTorch's cosine annealing from `start` (pct = 0) to `end` (pct = 1).
double CosineAnneal(double start, double end, double pct) {
  return end + (start - end) / 2.0 * (std::cos(kPi * pct) + 1.0);
}

}  // namespace

LRScheduler::LRScheduler(Optimizer& optimizer, std::string name)
    : optimizer_(optimizer), name_(std::move(name)) {
  for (ParamGroup& group : optimizer_.param_groups()) {
    if (!group.initial_lr()) group.set_initial_lr(group.options().get_lr());
    base_lrs_.push_back(*group.initial_lr());
  }
}

void LRScheduler::Start() {
  last_epoch_ = 0;
  Apply();
}

void LRScheduler::step() {
  ++last_epoch_;
  Apply();
}

void LRScheduler::Apply() {
  std::vector<ParamGroup>& groups = optimizer_.param_groups();
  TANDEM_CHECK(groups.size() == base_lrs_.size(), name_, ": the optimizer has ", groups.size(),
               " parameter groups but had ", base_lrs_.size(),
               " when the scheduler was built; build the scheduler after add_param_group");
  std::vector<double> lrs;
  for (size_t g = 0; g < groups.size(); ++g) lrs.push_back(LrAt(last_epoch_, g));
  for (size_t g = 0; g < groups.size(); ++g) groups[g].options().set_lr(lrs[g]);
  optimizer_.SyncLearningRates();
  last_lrs_ = std::move(lrs);
  ApplyOther(last_epoch_);
}

SchedulerState LRScheduler::state_dict() const {
  std::vector<int64_t> bits;
  for (double lr : base_lrs_) bits.push_back(BitsOf(lr));
  return {{"last_epoch", from_vector(std::vector<int64_t>{last_epoch_}, Shape{})},
          {"base_lrs", from_vector(bits, {static_cast<int64_t>(bits.size())})}};
}

void LRScheduler::load_state_dict(const SchedulerState& state) {
  for (const auto& entry : state) {
    TANDEM_CHECK(entry.first == "last_epoch" || entry.first == "base_lrs", name_,
                 "::load_state_dict: unknown entry '", entry.first,
                 "'; expected last_epoch and base_lrs (from LRScheduler::state_dict())");
  }
  const auto epoch = state.find("last_epoch");
  const auto base = state.find("base_lrs");
  TANDEM_CHECK(epoch != state.end() && base != state.end(), name_,
               "::load_state_dict: expected entries last_epoch and base_lrs but ",
               epoch == state.end() ? "last_epoch" : "base_lrs", " is missing");
  TANDEM_CHECK(
      epoch->second.defined() && epoch->second.dtype() == kInt64 && epoch->second.numel() == 1,
      name_, "::load_state_dict: last_epoch must be one int64");
  const int64_t last_epoch =
      epoch->second.to(Device::Cpu(0)).reshape({1}).to_vector<int64_t>().at(0);
  TANDEM_CHECK(last_epoch >= 0, name_, "::load_state_dict: last_epoch must be >= 0 but is ",
               last_epoch);
  TANDEM_CHECK(base->second.defined() && base->second.dtype() == kInt64 &&
                   base->second.numel() == static_cast<int64_t>(base_lrs_.size()),
               name_, "::load_state_dict: base_lrs must hold ", base_lrs_.size(),
               " int64 (one rate per parameter group, as bits) but holds ",
               base->second.defined() ? base->second.numel() : 0,
               "; was the state saved for an optimizer with other parameter groups?");
  std::vector<double> base_lrs;
  for (int64_t bits : base->second.to(Device::Cpu(0)).reshape({-1}).to_vector<int64_t>()) {
    base_lrs.push_back(FromBits(bits));
  }
  const std::vector<double> old_base = base_lrs_;
  const int64_t old_epoch = last_epoch_;
  base_lrs_ = std::move(base_lrs);
  last_epoch_ = last_epoch;
  try {
    Apply();
  } catch (...) {
    base_lrs_ = old_base;
    last_epoch_ = old_epoch;
    throw;
  }
}

// ---- StepLR ----------------------------------------------------------------------------

StepLR::StepLR(Optimizer& optimizer, int64_t step_size, double gamma)
    : LRScheduler(optimizer, "StepLR"), step_size_(step_size), gamma_(gamma) {
  TANDEM_CHECK(step_size >= 1, "StepLR: step_size must be >= 1 but is ", step_size);
  Start();
}

double StepLR::LrAt(int64_t epoch, size_t group) const {
  return base_lrs_[group] * std::pow(gamma_, static_cast<double>(epoch / step_size_));
}

// ---- MultiStepLR -----------------------------------------------------------------------

MultiStepLR::MultiStepLR(Optimizer& optimizer, std::vector<int64_t> milestones, double gamma)
    : LRScheduler(optimizer, "MultiStepLR"), milestones_(std::move(milestones)), gamma_(gamma) {
  std::sort(milestones_.begin(), milestones_.end());
  Start();
}

double MultiStepLR::LrAt(int64_t epoch, size_t group) const {
  const auto passed = std::upper_bound(milestones_.begin(), milestones_.end(), epoch) -
                      milestones_.begin();  // PyTorch's bisect_right
  return base_lrs_[group] * std::pow(gamma_, static_cast<double>(passed));
}

// ---- ExponentialLR ---------------------------------------------------------------------

ExponentialLR::ExponentialLR(Optimizer& optimizer, double gamma)
    : LRScheduler(optimizer, "ExponentialLR"), gamma_(gamma) {
  Start();
}

double ExponentialLR::LrAt(int64_t epoch, size_t group) const {
  return base_lrs_[group] * std::pow(gamma_, static_cast<double>(epoch));
}

// ---- CosineAnnealingLR -----------------------------------------------------------------

CosineAnnealingLR::CosineAnnealingLR(Optimizer& optimizer, int64_t T_max, double eta_min)
    : LRScheduler(optimizer, "CosineAnnealingLR"), t_max_(T_max), eta_min_(eta_min) {
  TANDEM_CHECK(T_max >= 1, "CosineAnnealingLR: T_max must be >= 1 but is ", T_max,
               "; pass the number of epochs (or steps) to anneal over");
  Start();
}

double CosineAnnealingLR::LrAt(int64_t epoch, size_t group) const {
  return CosineAnneal(base_lrs_[group], eta_min_,
                      static_cast<double>(epoch) / static_cast<double>(t_max_));
}

// ---- LinearLR --------------------------------------------------------------------------

LinearLR::LinearLR(Optimizer& optimizer, double start_factor, double end_factor,
                   int64_t total_iters)
    : LRScheduler(optimizer, "LinearLR"),
      start_factor_(start_factor),
      end_factor_(end_factor),
      total_iters_(total_iters) {
  TANDEM_CHECK(start_factor > 0.0 && start_factor <= 1.0,
               "LinearLR: start_factor must be in (0, 1] but is ", start_factor);
  TANDEM_CHECK(end_factor >= 0.0 && end_factor <= 1.0,
               "LinearLR: end_factor must be in [0, 1] but is ", end_factor);
  TANDEM_CHECK(total_iters >= 1, "LinearLR: total_iters must be >= 1 but is ", total_iters);
  Start();
}

double LinearLR::LrAt(int64_t epoch, size_t group) const {
  const double done = static_cast<double>(std::min(epoch, total_iters_)) / total_iters_;
  return base_lrs_[group] * (start_factor_ + (end_factor_ - start_factor_) * done);
}

// ---- OneCycleLR ------------------------------------------------------------------------

OneCycleLR::OneCycleLR(Optimizer& optimizer, double max_lr, int64_t total_steps,
                       const OneCycleOptions& options)
    : LRScheduler(optimizer, "OneCycleLR"),
      max_lr_(max_lr),
      total_steps_(total_steps),
      options_(options) {
  TANDEM_CHECK(std::isfinite(max_lr) && max_lr > 0.0,
               "OneCycleLR: max_lr must be a positive number but is ", max_lr);
  TANDEM_CHECK(total_steps >= 1, "OneCycleLR: total_steps must be >= 1 but is ", total_steps,
               "; pass epochs * batches per epoch");
  TANDEM_CHECK(options.pct_start() >= 0.0 && options.pct_start() <= 1.0,
               "OneCycleLR: pct_start must be in [0, 1] but is ", options.pct_start());
  TANDEM_CHECK(options.div_factor() > 0.0 && options.final_div_factor() > 0.0,
               "OneCycleLR: div_factor and final_div_factor must be > 0 but are ",
               options.div_factor(), " and ", options.final_div_factor());
  TANDEM_CHECK(!options.three_phase() || options.pct_start() <= 0.5,
               "OneCycleLR: with three_phase, pct_start must be <= 0.5 (two phases of that share) "
               "but is ",
               options.pct_start());
  const double total = static_cast<double>(total_steps);
  phase_ends_.push_back(options.pct_start() * total - 1.0);
  if (options.three_phase()) phase_ends_.push_back(2.0 * options.pct_start() * total - 2.0);
  phase_ends_.push_back(total - 1.0);
  std::vector<ParamGroup>& groups = optimizer_.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    base_lrs_[g] = max_lr / options.div_factor();
    groups[g].set_initial_lr(base_lrs_[g]);
    TANDEM_CHECK(!options.cycle_momentum() || groups[g].options().get_momentum().has_value(),
                 "OneCycleLR: cycle_momentum is on but the options of parameter group ", g,
                 " have no momentum; turn it off (OneCycleOptions().cycle_momentum(false))");
  }
  Start();
}

double OneCycleLR::Anneal(double start, double end, double pct) const {
  if (options_.anneal_strategy() == OneCycleOptions::Anneal::kLinear) {
    return (end - start) * pct + start;
  }
  return CosineAnneal(start, end, pct);
}

OneCycleLR::Phase OneCycleLR::PhaseAt(int64_t epoch) const {
  TANDEM_CHECK(epoch <= total_steps_, "OneCycleLR: tried to step ", epoch,
               " times but total_steps is ", total_steps_,
               "; build the scheduler with total_steps = epochs * batches per epoch");
  const double step = static_cast<double>(epoch);
  double start = 0.0;
  for (size_t i = 0;; ++i) {
    const double end = phase_ends_[i];
    if (step <= end || i + 1 == phase_ends_.size()) {
      // A phase of no length (pct_start * total_steps <= 1) is at its end at once.
      return {i, end - start > 0.0 ? (step - start) / (end - start) : 1.0};
    }
    start = end;
  }
}

double OneCycleLR::LrAt(int64_t epoch, size_t group) const {
  const Phase phase = PhaseAt(epoch);
  const double initial = base_lrs_[group];
  const double min_lr = initial / options_.final_div_factor();
  // Each phase's (start, end) rate: up, [down to initial,] down to the floor.
  const double three[3][2] = {{initial, max_lr_}, {max_lr_, initial}, {initial, min_lr}};
  const double two[2][2] = {{initial, max_lr_}, {max_lr_, min_lr}};
  const double* ends = options_.three_phase() ? three[phase.index] : two[phase.index];
  return Anneal(ends[0], ends[1], phase.pct);
}

void OneCycleLR::ApplyOther(int64_t epoch) {
  if (!options_.cycle_momentum()) return;
  const Phase phase = PhaseAt(epoch);
  const double low = options_.base_momentum(), high = options_.max_momentum();
  const double three[3][2] = {{high, low}, {low, high}, {high, high}};
  const double two[2][2] = {{high, low}, {low, high}};
  const double* ends = options_.three_phase() ? three[phase.index] : two[phase.index];
  const double momentum = Anneal(ends[0], ends[1], phase.pct);
  for (ParamGroup& group : optimizer_.param_groups()) group.options().set_momentum(momentum);
}

// ---- SequentialLR ----------------------------------------------------------------------

SequentialLR::SequentialLR(Optimizer& optimizer, std::vector<LRScheduler*> schedulers,
                           std::vector<int64_t> milestones)
    : LRScheduler(optimizer, "SequentialLR"),
      schedulers_(std::move(schedulers)),
      milestones_(std::move(milestones)) {
  TANDEM_CHECK(!schedulers_.empty(), "SequentialLR: expected at least one scheduler");
  TANDEM_CHECK(milestones_.size() + 1 == schedulers_.size(), "SequentialLR: expected ",
               schedulers_.size() - 1, " milestones (one fewer than the ", schedulers_.size(),
               " schedulers) but got ", milestones_.size());
  for (size_t k = 0; k < schedulers_.size(); ++k) {
    TANDEM_CHECK(schedulers_[k] != nullptr, "SequentialLR: scheduler ", k, " is null");
    TANDEM_CHECK(&schedulers_[k]->optimizer_ == &optimizer_, "SequentialLR: scheduler ", k, " (",
                 schedulers_[k]->name(),
                 ") is over another optimizer; every scheduler must be over this one");
  }
  for (size_t k = 0; k < milestones_.size(); ++k) {
    TANDEM_CHECK(milestones_[k] >= 1 && (k == 0 || milestones_[k] > milestones_[k - 1]),
                 "SequentialLR: milestones must be ascending and >= 1 but milestone ", k, " is ",
                 milestones_[k]);
  }
  Start();
}

double SequentialLR::LrAt(int64_t epoch, size_t group) const {
  const size_t k = static_cast<size_t>(
      std::upper_bound(milestones_.begin(), milestones_.end(), epoch) - milestones_.begin());
  const int64_t offset = k == 0 ? 0 : milestones_[k - 1];
  return schedulers_[k]->LrAt(epoch - offset, group);
}

}  // namespace tandem::nn
