// Learning-rate schedulers with PyTorch's closed forms (torch.optim.lr_scheduler): StepLR,
// MultiStepLR, ExponentialLR, CosineAnnealingLR, LinearLR (warm-up), OneCycleLR, and
// SequentialLR to chain them. A
// scheduler sets the learning rate of every parameter group of an optimizer; building one
// already sets epoch 0's rate, and step() moves to the next epoch (or batch, for OneCycleLR).
//
//   nn::SGD sgd(model->parameters(), nn::SGDOptions(0.1).momentum(0.9));
//   nn::CosineAnnealingLR cosine(sgd, /*T_max=*/epochs);
//   for (int epoch = 0; epoch < epochs; ++epoch) {
//     train_one_epoch(sgd);    // sgd.step() per batch
//     cosine.step();           // lr for the next epoch; cosine.get_last_lr()[0] reads it
//   }
//
// Warm-up then cosine decay:
//
//   nn::LinearLR warmup(sgd, /*start_factor=*/0.1, /*end_factor=*/1.0, /*total_iters=*/5);
//   nn::CosineAnnealingLR cosine(sgd, /*T_max=*/epochs - 5);
//   nn::SequentialLR schedule(sgd, {&warmup, &cosine}, /*milestones=*/{5});
//
// Each rate is the closed form at the scheduler's epoch, computed from the group's base rate
// (its "initial_lr": the rate it had when its first scheduler was built), so a resumed run
// gets exactly the rates of one that never stopped: state_dict() holds the epoch and the
// base rates; load_state_dict() restores them and sets the optimizer's rates again.
// Difference from PyTorch: a scheduler that another one changed the rates under (two
// schedulers stepping one optimizer together, other than through SequentialLR) overwrites
// them instead of compounding.
#ifndef TANDEM_NN_LR_SCHEDULER_H_
#define TANDEM_NN_LR_SCHEDULER_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "nn/optim.h"
#include "tensor/base/arg.h"
#include "tensor/tensor.h"

namespace tandem::nn {

// A scheduler's state: "last_epoch" (one int64) and "base_lrs" (one double per group,
// stored bit for bit as int64).
using SchedulerState = std::map<std::string, Tensor>;

class LRScheduler {
 public:
  virtual ~LRScheduler() = default;
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  // Moves to the next epoch and sets each group's learning rate.
  void step();
  // The rates the last step (or the constructor) set, one per parameter group.
  const std::vector<double>& get_last_lr() const { return last_lrs_; }
  // Epochs stepped since construction (0 right after it, as PyTorch's last_epoch).
  int64_t last_epoch() const { return last_epoch_; }
  const std::vector<double>& base_lrs() const { return base_lrs_; }
  const std::string& name() const { return name_; }

  SchedulerState state_dict() const;
  // Restores the epoch and base rates of state_dict() (of a scheduler of the same kind over
  // as many groups) and sets the optimizer's rates for that epoch. Checks first: a missing or
  // malformed entry throws, saying which, and changes nothing.
  void load_state_dict(const SchedulerState& state);

 protected:
  // Records the base rates (setting each group's initial_lr where it has none).
  LRScheduler(Optimizer& optimizer, std::string name);
  // The rate of group `group` at epoch `epoch` (>= 0).
  virtual double LrAt(int64_t epoch, size_t group) const = 0;
  // For derived constructors, last: sets epoch 0's rates.
  void Start();
  void Apply();
  // Called by Apply after the rates are set, for what else a scheduler sets per epoch
  // (OneCycleLR's momentum).
  virtual void ApplyOther(int64_t epoch) {}
  friend class SequentialLR;

  Optimizer& optimizer_;
  std::string name_;
  std::vector<double> base_lrs_;
  int64_t last_epoch_ = -1;
  std::vector<double> last_lrs_;
};

// base_lr * gamma^floor(epoch / step_size): the rate falls by gamma every step_size epochs.
class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& optimizer, int64_t step_size, double gamma = 0.1);

 private:
  double LrAt(int64_t epoch, size_t group) const override;
  int64_t step_size_;
  double gamma_;
};

// base_lr * gamma^(number of milestones <= epoch): the rate falls by gamma at each milestone
// (in any order; a milestone listed twice counts twice, as PyTorch's Counter).
class MultiStepLR : public LRScheduler {
 public:
  MultiStepLR(Optimizer& optimizer, std::vector<int64_t> milestones, double gamma = 0.1);

 private:
  double LrAt(int64_t epoch, size_t group) const override;
  std::vector<int64_t> milestones_;  // sorted
  double gamma_;
};

// base_lr * gamma^epoch.
class ExponentialLR : public LRScheduler {
 public:
  ExponentialLR(Optimizer& optimizer, double gamma);

 private:
  double LrAt(int64_t epoch, size_t group) const override;
  double gamma_;
};

// eta_min + (base_lr - eta_min) * (1 + cos(pi * epoch / T_max)) / 2: from the base rate down
// to eta_min over T_max epochs (and back up over the next T_max, as PyTorch's closed form).
class CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(Optimizer& optimizer, int64_t T_max, double eta_min = 0.0);

 private:
  double LrAt(int64_t epoch, size_t group) const override;
  int64_t t_max_;
  double eta_min_;
};

// base_lr * (start_factor + (end_factor - start_factor) * min(epoch, total_iters) / total_iters):
// a linear warm-up (or decay) over total_iters epochs, then constant.
class LinearLR : public LRScheduler {
 public:
  LinearLR(Optimizer& optimizer, double start_factor = 1.0 / 3, double end_factor = 1.0,
           int64_t total_iters = 5);

 private:
  double LrAt(int64_t epoch, size_t group) const override;
  double start_factor_, end_factor_;
  int64_t total_iters_;
};

struct OneCycleOptions {
  enum class Anneal { kCos, kLinear };

  TANDEM_ARG(double, pct_start) = 0.3;
  // How each phase goes from its start to its end value: cosine (PyTorch's "cos") or linear.
  TANDEM_ARG(Anneal, anneal_strategy) = Anneal::kCos;
  // Cycle the momentum (SGD's and RMSprop's momentum, Adam's beta1) inversely to the rate,
  // between base_momentum and max_momentum: as PyTorch, on by default, and building the
  // scheduler sets the optimizer's momentum to max_momentum.
  TANDEM_ARG(bool, cycle_momentum) = true;
  TANDEM_ARG(double, base_momentum) = 0.85;
  TANDEM_ARG(double, max_momentum) = 0.95;
  TANDEM_ARG(double, div_factor) = 25.0;
  TANDEM_ARG(double, final_div_factor) = 1e4;
  // Three phases (up to max_lr, back down to the initial rate, then to the floor) instead of
  // two, as in fast.ai's and PyTorch's three_phase.
  TANDEM_ARG(bool, three_phase) = false;
};

// The 1cycle policy (Smith & Topin), stepped once per batch over total_steps (PyTorch's
// OneCycleLR): from initial = max_lr / div_factor up to max_lr over the first pct_start of the
// steps (up to step pct_start * total_steps - 1), then down to initial / final_div_factor at
// step total_steps - 1; with three_phase, down to initial at step 2 * pct_start * total_steps
// - 2 and then to the floor. Each phase anneals by anneal_strategy; with cycle_momentum the
// momentum goes the other way (max_momentum -> base_momentum while the rate rises, back after;
// the third phase holds max_momentum). Stepping past total_steps throws. The optimizer's own
// rates are replaced (its groups' initial_lr becomes max_lr / div_factor, as in PyTorch).
class OneCycleLR : public LRScheduler {
 public:
  OneCycleLR(Optimizer& optimizer, double max_lr, int64_t total_steps,
             const OneCycleOptions& options = OneCycleOptions());

 private:
  double LrAt(int64_t epoch, size_t group) const override;
  void ApplyOther(int64_t epoch) override;
  // The phase that `epoch` is in and how far through it (pct), PyTorch's get_lr loop.
  struct Phase {
    size_t index;
    double pct;
  };
  Phase PhaseAt(int64_t epoch) const;
  double Anneal(double start, double end, double pct) const;

  double max_lr_;
  int64_t total_steps_;
  OneCycleOptions options_;
  std::vector<double> phase_ends_;
};

// Runs schedulers one after the other: schedulers[0] until epoch milestones[0], then
// schedulers[1] from its own epoch 0, and so on (milestones ascending, one fewer than
// schedulers). The schedulers must be over the same optimizer and outlive this one; only
// this one is stepped.
class SequentialLR : public LRScheduler {
 public:
  SequentialLR(Optimizer& optimizer, std::vector<LRScheduler*> schedulers,
               std::vector<int64_t> milestones);

 private:
  double LrAt(int64_t epoch, size_t group) const override;
  std::vector<LRScheduler*> schedulers_;
  std::vector<int64_t> milestones_;
};

}  // namespace tandem::nn

#endif  // TANDEM_NN_LR_SCHEDULER_H_
