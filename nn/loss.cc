#include "nn/loss.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "tensor/tensor.h"  // TANDEM_AUTOCAST (tensor/ops/autocast.h)

namespace tandem::nn {

const char* ReductionName(Reduction reduction) {
  switch (reduction) {
    case Reduction::kNone:
      return "none";
    case Reduction::kMean:
      return "mean";
    case Reduction::kSum:
      return "sum";
  }
  return "unknown";
}

namespace {

// ---- Checks --------------------------------------------------------------------------------

void CheckDefined(const Tensor& t, const char* op, const char* name) {
  TANDEM_CHECK(t.defined(), op, ": ", name,
               " is an undefined Tensor; pass a tensor made by a factory or by another op");
}

void CheckFloat(const Tensor& t, const char* op, const char* name) {
  TANDEM_CHECK(IsFloatingPoint(t.dtype()), op, ": ", name,
               " must be a floating-point tensor (float32 or float64) but is ", t.dtype(),
               "; convert it with .to(kFloat32)");
}

void CheckSameDevice(const Tensor& a, const char* a_name, const Tensor& b, const char* b_name,
                     const char* op) {
  TANDEM_CHECK(a.device() == b.device(), op, ": ", a_name, " is on ", a.device(), " and ", b_name,
               " on ", b.device(), "; move ", b_name, " with .to(", a.device(),
               ") (a loss module's weights move with its .to())");
}

void CheckReduction(Reduction reduction, const char* op) {
  TANDEM_CHECK(reduction == Reduction::kNone || reduction == Reduction::kMean ||
                   reduction == Reduction::kSum,
               op, ": reduction must be Reduction::kNone, kMean or kSum but is ",
               static_cast<int>(reduction));
}

// True when `from` broadcasts to `to` without enlarging it.
bool BroadcastsTo(const Shape& from, const Shape& to) {
  if (from.size() > to.size()) return false;
  for (size_t i = 1; i <= from.size(); ++i) {
    const int64_t f = from[from.size() - i], t = to[to.size() - i];
    if (f != t && f != 1) return false;
  }
  return true;
}

// Input and target of a regression-style loss: float32, one device, one shape.
void CheckSameShapeFloats(const Tensor& input, const Tensor& target, const char* op) {
  CheckDefined(input, op, "input");
  CheckDefined(target, op, "target");
  CheckFloat(input, op, "input");
  CheckFloat(target, op, "target");
  CheckSameDevice(input, "input", target, "target", op);
  TANDEM_CHECK(input.shape() == target.shape(), op, ": input is ", ShapeToString(input.shape()),
               " and target is ", ShapeToString(target.shape()),
               "; they must have the same shape (broadcasting here usually hides a bug: reshape ",
               "one of them)");
}

// An optional per-class weight: float32 [C] on the input's device.
void CheckClassWeight(const Tensor& weight, const Tensor& input, int64_t classes, const char* op) {
  if (!weight.defined()) return;
  CheckFloat(weight, op, "weight");
  TANDEM_CHECK(weight.dim() == 1 && weight.size(0) == classes, op,
               ": weight must hold one entry per class, [C] = [", classes, "], but is ",
               ShapeToString(weight.shape()), "; give a 1-D float32 tensor of length ", classes,
               " (or no weight)");
  CheckSameDevice(input, "input", weight, "weight", op);
}

void CheckLabelSmoothing(double label_smoothing, const char* op) {
  TANDEM_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0, op,
               ": label_smoothing must be in [0, 1] but is ", label_smoothing);
}

void CheckBeta(double beta, const char* op) {
  TANDEM_CHECK(beta >= 0.0, op, ": beta must be >= 0 (0 gives the L1 loss) but is ", beta);
}

// The sum of the per-element losses and what the mean divides by, as LossParts.
LossParts ElementParts(const Tensor& loss, Reduction reduction) {
  switch (reduction) {
    case Reduction::kNone:
      return {loss, Tensor(), reduction};
    case Reduction::kSum:
      return {sum(loss), Tensor(), reduction};
    case Reduction::kMean:
      break;
  }
  return {sum(loss), full({}, static_cast<double>(loss.numel()), loss.device()), reduction};
}

// forward()'s value from its parts.
Tensor Finish(const LossParts& parts) {
  if (parts.reduction == Reduction::kMean) return div(parts.numerator, parts.denominator);
  return parts.numerator;
}

Tensor Reduce(const Tensor& loss, Reduction reduction) {
  switch (reduction) {
    case Reduction::kNone:
      return loss;
    case Reduction::kSum:
      return sum(loss);
    case Reduction::kMean:
      break;
  }
  return mean(loss);
}

// ---- Class scores as rows ------------------------------------------------------------------

// Scores [C], [N, C] or [N, C, d1, ..., dk] as rows [M, C] (one row per target element), and
// the shape class-index targets (and per-element losses) have: [], [N] or [N, d1, ..., dk].
struct ClassRows {
  Tensor rows;
  Shape element_shape;
  int64_t classes = 0;
};

// Moves dimension 1 (classes) last and flattens the rest: what ClassRows does to input, and
// to a probability target of input's shape.
Tensor AsRows(const Tensor& t, int64_t classes) {
  if (t.dim() == 1) return t.unsqueeze(0);
  if (t.dim() == 2) return t;
  std::vector<int64_t> order = {0};
  for (int64_t d = 2; d < t.dim(); ++d) order.push_back(d);
  order.push_back(1);
  return t.permute(order).reshape({t.numel() / std::max<int64_t>(classes, 1), classes});
}

ClassRows ToRows(const Tensor& input, const char* op) {
  TANDEM_CHECK(input.dim() >= 1, op,
               ": input must have a class dimension ([C], [N, C] or [N, C, d1, ...]) but is "
               "zero-dimensional");
  ClassRows out;
  out.classes = input.dim() == 1 ? input.size(0) : input.size(1);
  if (input.dim() >= 2) {
    out.element_shape = input.shape();
    out.element_shape.erase(out.element_shape.begin() + 1);
  }
  out.rows = AsRows(input, out.classes);
  if (out.classes == 0) out.rows = out.rows.reshape({NumElements(out.element_shape), 0});
  return out;
}

// Checks class-index targets [M] against [0, classes) and ignore_index with small reads back
// (reductions, so it costs little on a GPU too), and returns how many equal ignore_index. An
// error names the first offending element.
int64_t CheckClassTargets(const Tensor& targets, int64_t classes, int64_t ignore_index,
                          const char* op) {
  if (targets.numel() == 0) return 0;
  // The smallest and largest target first (the common case ends here: all in range, and
  // ignore_index outside that range).
  const std::vector<int64_t> range =
      stack({neg(amax(neg(targets), 0)), amax(targets, 0)}).to_vector<int64_t>();
  if (range[0] >= 0 && range[1] < classes && (ignore_index < range[0] || ignore_index > range[1])) {
    return 0;
  }
  const TensorOptions int64_on(TensorOptions(kInt64).device(targets.device()));
  const Tensor ignored = eq(targets, full({}, static_cast<double>(ignore_index), int64_on));
  const Tensor in_range =
      logical_and(ge(targets, zeros({}, int64_on)), lt(targets, full({}, classes, int64_on)));
  const Tensor invalid = logical_and(logical_not(in_range), logical_not(ignored));
  const std::vector<int64_t> counts = stack({sum(ignored), sum(invalid)}).to_vector<int64_t>();
  if (counts[1] > 0) {
    const std::vector<int64_t> values = targets.to_vector<int64_t>();
    for (size_t i = 0; i < values.size(); ++i) {
      const int64_t v = values[i];
      TANDEM_CHECK((v >= 0 && v < classes) || v == ignore_index, op, ": target element ", i,
                   " (row-major) is ", v, ", which is neither a class index in [0, C) = [0, ",
                   classes, ") nor ignore_index (", ignore_index, "); ", counts[1],
                   " target(s) are out of range: check the labels, the number of classes, or ",
                   "set ignore_index");
    }
  }
  return counts[0];
}

// Class-index targets, checked, as [M] against the scores as rows [M, C].
struct ClassIndexTargets {
  ClassRows rows;
  Tensor t;  // [M]
  int64_t m = 0;
  int64_t ignored_count = 0;
};

ClassIndexTargets PrepareClassIndex(const Tensor& input, const Tensor& target, bool logits,
                                    int64_t ignore_index, const char* op) {
  ClassIndexTargets p;
  p.rows = ToRows(input, op);
  TANDEM_CHECK(target.dtype() == kInt64, op, ": target must be int64 class indices but is ",
               target.dtype(),
               logits ? "; convert it with .to(kInt64) (class probabilities must have input's "
                        "shape)"
                      : "; convert it with .to(kInt64)");
  TANDEM_CHECK(target.shape() == p.rows.element_shape, op, ": input is ",
               ShapeToString(input.shape()), " so class-index targets must be ",
               ShapeToString(p.rows.element_shape), " (input's shape without C",
               input.dim() == 1 ? "" : ", its dimension 1",
               logits ? "; class probabilities would have input's shape" : "", ") but are ",
               ShapeToString(target.shape()));
  p.m = NumElements(p.rows.element_shape);
  p.t = target.reshape({p.m});
  p.ignored_count = CheckClassTargets(p.t, p.rows.classes, ignore_index, op);
  return p;
}

// The common case, which the fused kernels compute: a plain mean over targets none ignored.
bool FusedMean(const ClassIndexTargets& p, const Tensor& weight, Reduction reduction,
               double label_smoothing) {
  return !weight.defined() && label_smoothing == 0.0 && reduction == Reduction::kMean &&
         p.ignored_count == 0;
}

Tensor FusedMeanLoss(const ClassIndexTargets& p, bool logits) {
  return logits ? tandem::cross_entropy(p.rows.rows, p.t) : tandem::nll_loss(p.rows.rows, p.t);
}

// The general class-index path of cross_entropy (scores are logits) and nll_loss
// (log-probabilities), as parts.
LossParts ClassIndexParts(const ClassIndexTargets& p, bool logits, const Tensor& weight,
                          int64_t ignore_index, Reduction reduction, double label_smoothing) {
  const int64_t classes = p.rows.classes;
  const int64_t m = p.m;
  const Tensor& t = p.t;
  const Tensor log_probs = logits ? log_softmax(p.rows.rows, 1) : p.rows.rows;
  const Tensor ignored =
      eq(t, full({}, static_cast<double>(ignore_index), TensorOptions(kInt64).device(t.device())));
  const Tensor safe = masked_fill(t, ignored, 0.0);  // any valid index where ignored
  Tensor picked = m > 0 && classes > 0 ? gather(log_probs, 1, safe.unsqueeze(1)).squeeze(1)
                                       : zeros({m}, t.device());
  // The weight of each target, 0 where ignored (masked_fill, not a product: an ignored row may
  // hold -inf, and -inf * 0 is NaN).
  Tensor target_weight;
  Tensor loss;
  if (weight.defined()) {
    const Tensor selected = index_select(weight, 0, safe);
    target_weight = masked_fill(selected, ignored, 0.0);
    loss = masked_fill(neg(mul(picked, selected)), ignored, 0.0);
  } else {
    loss = masked_fill(neg(picked), ignored, 0.0);
  }
  if (label_smoothing > 0.0) {
    // PyTorch: (1 - s) nll + s / C * (-sum_c w_c log p_c), the second term 0 where ignored;
    // for the mean both terms share the denominator sum of w[target] (not ignored).
    const Tensor weighted = weight.defined() ? mul(log_probs, weight) : log_probs;
    const Tensor smooth = masked_fill(neg(sum(weighted, {1})), ignored, 0.0);
    loss = add(mul(loss, 1.0 - label_smoothing),
               mul(smooth, label_smoothing / static_cast<double>(classes)));
  }
  switch (reduction) {
    case Reduction::kNone:
      return {loss.reshape(p.rows.element_shape), Tensor(), reduction};
    case Reduction::kSum:
      return {sum(loss), Tensor(), reduction};
    case Reduction::kMean:
      break;
  }
  // Over the weights of the targets not ignored (their count without a weight): 0 / 0 = NaN
  // when every target is ignored, as in PyTorch.
  if (weight.defined()) return {sum(loss), sum(target_weight), reduction};
  return {sum(loss), full({}, static_cast<double>(m - p.ignored_count), loss.device()), reduction};
}

Tensor ClassIndexLoss(const Tensor& input, const Tensor& target, bool logits, const Tensor& weight,
                      int64_t ignore_index, Reduction reduction, double label_smoothing,
                      const char* op) {
  const ClassIndexTargets p = PrepareClassIndex(input, target, logits, ignore_index, op);
  if (FusedMean(p, weight, reduction, label_smoothing)) return FusedMeanLoss(p, logits);
  return Finish(ClassIndexParts(p, logits, weight, ignore_index, reduction, label_smoothing));
}

LossParts ClassIndexLossParts(const Tensor& input, const Tensor& target, bool logits,
                              const Tensor& weight, int64_t ignore_index, Reduction reduction,
                              double label_smoothing, const char* op) {
  const ClassIndexTargets p = PrepareClassIndex(input, target, logits, ignore_index, op);
  if (FusedMean(p, weight, reduction, label_smoothing) && p.m > 0) {
    // The fused mean times the count: the sum, at the cost of one multiplication.
    const double count = static_cast<double>(p.m);
    return {mul(FusedMeanLoss(p, logits), count), full({}, count, input.device()), reduction};
  }
  return ClassIndexParts(p, logits, weight, ignore_index, reduction, label_smoothing);
}

// The class-probability path of cross_entropy: target has input's shape.
LossParts ProbabilityParts(const Tensor& input, const Tensor& target, const Tensor& weight,
                           int64_t ignore_index, Reduction reduction, double label_smoothing,
                           const char* op) {
  TANDEM_CHECK(IsFloatingPoint(target.dtype()), op, ": target has input's shape ",
               ShapeToString(input.shape()),
               " so it is read as class probabilities and must be floating-point, but is ",
               target.dtype(), "; for class indices give it input's shape without C");
  TANDEM_CHECK(ignore_index < 0, op, ": ignore_index (", ignore_index,
               ") applies to class-index targets only, but target has input's shape and holds "
               "class probabilities; leave ignore_index negative (default -100)");
  const ClassRows rows = ToRows(input, op);
  const int64_t classes = rows.classes;
  Tensor probs = AsRows(target, classes);
  if (label_smoothing > 0.0) {
    probs = add(mul(probs, 1.0 - label_smoothing),
                label_smoothing / static_cast<double>(std::max<int64_t>(classes, 1)));
  }
  Tensor product = mul(log_softmax(rows.rows, 1), probs);
  if (weight.defined()) product = mul(product, weight);
  const Tensor loss = neg(sum(product, {1}));  // [M]
  // The mean is over the number of rows (input.numel() / C), as in PyTorch; NaN for none.
  return ElementParts(loss.reshape(rows.element_shape), reduction);
}

// softplus(-x) = log(1 + e^-x) = -log sigmoid(x) as max(-x, 0) + log(1 + e^(s x)), where
// s = -1 for x > 0 and +1 otherwise (so s x = -|x| and the exponent is never positive). No
// overflow for any x, infinities included, and the exact gradient -sigmoid(-x) everywhere:
// at x = 0, where the textbook max(-x, 0) + log(1 + e^-|x|) has two kinks, clamp passes -1
// and the second term 0.5 * s = 0.5, which add up to -sigmoid(0) = -0.5. Elementwise ops
// only (no where), so it costs a few passes over the input.
Tensor SoftplusOfNegative(const Tensor& x) {
  const Tensor minus_x = neg(x);
  // Not differentiated; in x's dtype (a bool mask times 2.0 would be int64).
  const Tensor s = 1.0 - 2.0 * gt(x, zeros({}, x.device())).to(x.dtype());
  return add(clamp(minus_x, 0.0, std::nullopt), log(add(exp(mul(x, s)), 1.0)));
}

void CheckBroadcastWeight(const Tensor& weight, const char* name, const Tensor& input,
                          const char* op) {
  if (!weight.defined()) return;
  CheckFloat(weight, op, name);
  CheckSameDevice(input, "input", weight, name, op);
  TANDEM_CHECK(BroadcastsTo(weight.shape(), input.shape()), op, ": ", name, " is ",
               ShapeToString(weight.shape()), " which does not broadcast to input's shape ",
               ShapeToString(input.shape()), "; give it input's trailing dimensions (e.g. [",
               input.dim() > 0 ? input.size(-1) : 1, "] for one value per class)");
}

// Checks what cross_entropy's two paths share; true when target holds class probabilities.
bool CheckCrossEntropy(const Tensor& input, const Tensor& target,
                       const CrossEntropyLossOptions& options, const char* op) {
  CheckDefined(input, op, "input");
  CheckDefined(target, op, "target");
  CheckFloat(input, op, "input");
  CheckSameDevice(input, "input", target, "target", op);
  CheckReduction(options.reduction(), op);
  CheckLabelSmoothing(options.label_smoothing(), op);
  TANDEM_CHECK(input.dim() >= 1, op,
               ": input must have a class dimension ([C], [N, C] or [N, C, d1, ...]) but is "
               "zero-dimensional");
  const int64_t classes = input.dim() == 1 ? input.size(0) : input.size(1);
  CheckClassWeight(options.weight(), input, classes, op);
  return target.shape() == input.shape();
}

void CheckNllLoss(const Tensor& input, const Tensor& target, const NLLLossOptions& options,
                  const char* op) {
  CheckDefined(input, op, "input");
  CheckDefined(target, op, "target");
  CheckFloat(input, op, "input");
  CheckSameDevice(input, "input", target, "target", op);
  CheckReduction(options.reduction(), op);
  TANDEM_CHECK(input.dim() >= 1, op,
               ": input must have a class dimension ([C], [N, C] or [N, C, d1, ...]) but is "
               "zero-dimensional");
  const int64_t classes = input.dim() == 1 ? input.size(0) : input.size(1);
  CheckClassWeight(options.weight(), input, classes, op);
}

// The per-element losses of the elementwise losses, checked.
Tensor BceElements(const Tensor& input, const Tensor& target,
                   const BCEWithLogitsLossOptions& options) {
  const char* op = "binary_cross_entropy_with_logits";
  CheckSameShapeFloats(input, target, op);
  CheckReduction(options.reduction(), op);
  CheckBroadcastWeight(options.weight(), "weight", input, op);
  CheckBroadcastWeight(options.pos_weight(), "pos_weight", input, op);
  // PyTorch's form: (1 - t) x - w_t log sigmoid(x), w_t = 1 + (pos_weight - 1) t.
  Tensor minus_log_sigmoid = SoftplusOfNegative(input);
  if (options.pos_weight().defined()) {
    minus_log_sigmoid = mul(minus_log_sigmoid, add(mul(options.pos_weight() - 1.0, target), 1.0));
  }
  Tensor loss = add(mul(1.0 - target, input), minus_log_sigmoid);
  if (options.weight().defined()) loss = mul(loss, options.weight());
  return loss;
}

Tensor MseElements(const Tensor& input, const Tensor& target, const MSELossOptions& options) {
  CheckSameShapeFloats(input, target, "mse_loss");
  CheckReduction(options.reduction(), "mse_loss");
  return square(sub(input, target));
}

Tensor L1Elements(const Tensor& input, const Tensor& target, const L1LossOptions& options) {
  CheckSameShapeFloats(input, target, "l1_loss");
  CheckReduction(options.reduction(), "l1_loss");
  return abs(sub(input, target));
}

Tensor SmoothL1Elements(const Tensor& input, const Tensor& target,
                        const SmoothL1LossOptions& options) {
  const char* op = "smooth_l1_loss";
  CheckSameShapeFloats(input, target, op);
  CheckReduction(options.reduction(), op);
  CheckBeta(options.beta(), op);
  const double beta = options.beta();
  const Tensor diff = sub(input, target);
  const Tensor distance = abs(diff);
  // beta = 0 is the L1 loss (and 0.5 d^2 / 0 would poison the gradient of the other branch).
  if (beta == 0.0) return distance;
  const Tensor quadratic = mul(square(diff), 0.5 / beta);
  const Tensor linear = add(distance, -0.5 * beta);
  return where(lt(distance, full({}, beta, input.device())), quadratic, linear);
}

LossParts CrossEntropyParts(const Tensor& input, const Tensor& target,
                            const CrossEntropyLossOptions& options) {
  const char* op = "cross_entropy";
  if (CheckCrossEntropy(input, target, options, op)) {
    return ProbabilityParts(input, target, options.weight(), options.ignore_index(),
                            options.reduction(), options.label_smoothing(), op);
  }
  return ClassIndexLossParts(input, target, /*logits=*/true, options.weight(),
                             options.ignore_index(), options.reduction(), options.label_smoothing(),
                             op);
}

LossParts NllLossParts(const Tensor& input, const Tensor& target, const NLLLossOptions& options) {
  CheckNllLoss(input, target, options, "nll_loss");
  return ClassIndexLossParts(input, target, /*logits=*/false, options.weight(),
                             options.ignore_index(), options.reduction(),
                             /*label_smoothing=*/0.0, "nll_loss");
}

}  // namespace

// ---- Functions -------------------------------------------------------------------------------

namespace functional {

Tensor cross_entropy(const Tensor& input, const Tensor& target,
                     const CrossEntropyLossOptions& options) {
  TANDEM_AUTOCAST(kFloat32, cross_entropy, input, target, options);
  const char* op = "cross_entropy";
  if (CheckCrossEntropy(input, target, options, op)) {
    return Finish(ProbabilityParts(input, target, options.weight(), options.ignore_index(),
                                   options.reduction(), options.label_smoothing(), op));
  }
  return ClassIndexLoss(input, target, /*logits=*/true, options.weight(), options.ignore_index(),
                        options.reduction(), options.label_smoothing(), op);
}

Tensor nll_loss(const Tensor& input, const Tensor& target, const NLLLossOptions& options) {
  TANDEM_AUTOCAST(kFloat32, nll_loss, input, target, options);
  const char* op = "nll_loss";
  CheckNllLoss(input, target, options, op);
  return ClassIndexLoss(input, target, /*logits=*/false, options.weight(), options.ignore_index(),
                        options.reduction(), /*label_smoothing=*/0.0, op);
}

Tensor binary_cross_entropy_with_logits(const Tensor& input, const Tensor& target,
                                        const BCEWithLogitsLossOptions& options) {
  TANDEM_AUTOCAST(kFloat32, binary_cross_entropy_with_logits, input, target, options);
  return Reduce(BceElements(input, target, options), options.reduction());
}

Tensor mse_loss(const Tensor& input, const Tensor& target, const MSELossOptions& options) {
  TANDEM_AUTOCAST(kFloat32, mse_loss, input, target, options);
  return Reduce(MseElements(input, target, options), options.reduction());
}

Tensor l1_loss(const Tensor& input, const Tensor& target, const L1LossOptions& options) {
  TANDEM_AUTOCAST(kFloat32, l1_loss, input, target, options);
  return Reduce(L1Elements(input, target, options), options.reduction());
}

Tensor smooth_l1_loss(const Tensor& input, const Tensor& target,
                      const SmoothL1LossOptions& options) {
  TANDEM_AUTOCAST(kFloat32, smooth_l1_loss, input, target, options);
  return Reduce(SmoothL1Elements(input, target, options), options.reduction());
}

}  // namespace functional

// ---- Modules ---------------------------------------------------------------------------------

namespace {

void CheckModuleWeight(const Tensor& weight, const char* module, const char* name) {
  if (!weight.defined()) return;
  TANDEM_CHECK(IsFloatingPoint(weight.dtype()), module, ": ", name,
               " must be a floating-point tensor (float32 or float64) but is ", weight.dtype(),
               "; convert it with .to(kFloat32)");
}

}  // namespace

CrossEntropyLoss::CrossEntropyLoss(const CrossEntropyLossOptions& options) : options_(options) {
  CheckModuleWeight(options_.weight(), "CrossEntropyLoss", "weight");
  TANDEM_CHECK(!options_.weight().defined() || options_.weight().dim() == 1,
               "CrossEntropyLoss: weight must be 1-D [C] (one entry per class) but is ",
               ShapeToString(options_.weight().shape()));
  CheckLabelSmoothing(options_.label_smoothing(), "CrossEntropyLoss");
  CheckReduction(options_.reduction(), "CrossEntropyLoss");
  reset();
}

void CrossEntropyLoss::reset() {
  if (options_.weight().defined()) weight_ = register_buffer("weight", options_.weight());
}

Tensor CrossEntropyLoss::weight() const { return weight_ ? *weight_ : Tensor(); }

Tensor CrossEntropyLoss::forward(const Tensor& input, const Tensor& target) {
  CrossEntropyLossOptions options = options_;
  options.weight(weight());
  return functional::cross_entropy(input, target, options);
}

LossParts CrossEntropyLoss::forward_parts(const Tensor& input, const Tensor& target) const {
  TANDEM_AUTOCAST(kFloat32, forward_parts, input, target);
  CrossEntropyLossOptions options = options_;
  options.weight(weight());
  return CrossEntropyParts(input, target, options);
}

NLLLoss::NLLLoss(const NLLLossOptions& options) : options_(options) {
  CheckModuleWeight(options_.weight(), "NLLLoss", "weight");
  TANDEM_CHECK(!options_.weight().defined() || options_.weight().dim() == 1,
               "NLLLoss: weight must be 1-D [C] (one entry per class) but is ",
               ShapeToString(options_.weight().shape()));
  CheckReduction(options_.reduction(), "NLLLoss");
  reset();
}

void NLLLoss::reset() {
  if (options_.weight().defined()) weight_ = register_buffer("weight", options_.weight());
}

Tensor NLLLoss::weight() const { return weight_ ? *weight_ : Tensor(); }

Tensor NLLLoss::forward(const Tensor& input, const Tensor& target) {
  NLLLossOptions options = options_;
  options.weight(weight());
  return functional::nll_loss(input, target, options);
}

LossParts NLLLoss::forward_parts(const Tensor& input, const Tensor& target) const {
  TANDEM_AUTOCAST(kFloat32, forward_parts, input, target);
  NLLLossOptions options = options_;
  options.weight(weight());
  return NllLossParts(input, target, options);
}

BCEWithLogitsLoss::BCEWithLogitsLoss(const BCEWithLogitsLossOptions& options) : options_(options) {
  CheckModuleWeight(options_.weight(), "BCEWithLogitsLoss", "weight");
  CheckModuleWeight(options_.pos_weight(), "BCEWithLogitsLoss", "pos_weight");
  CheckReduction(options_.reduction(), "BCEWithLogitsLoss");
  reset();
}

void BCEWithLogitsLoss::reset() {
  if (options_.weight().defined()) weight_ = register_buffer("weight", options_.weight());
  if (options_.pos_weight().defined()) {
    pos_weight_ = register_buffer("pos_weight", options_.pos_weight());
  }
}

Tensor BCEWithLogitsLoss::weight() const { return weight_ ? *weight_ : Tensor(); }
Tensor BCEWithLogitsLoss::pos_weight() const { return pos_weight_ ? *pos_weight_ : Tensor(); }

Tensor BCEWithLogitsLoss::forward(const Tensor& input, const Tensor& target) {
  BCEWithLogitsLossOptions options = options_;
  options.weight(weight());
  options.pos_weight(pos_weight());
  return functional::binary_cross_entropy_with_logits(input, target, options);
}

LossParts BCEWithLogitsLoss::forward_parts(const Tensor& input, const Tensor& target) const {
  TANDEM_AUTOCAST(kFloat32, forward_parts, input, target);
  BCEWithLogitsLossOptions options = options_;
  options.weight(weight());
  options.pos_weight(pos_weight());
  return ElementParts(BceElements(input, target, options), options.reduction());
}

Tensor MSELoss::forward(const Tensor& input, const Tensor& target) {
  return functional::mse_loss(input, target, options_);
}

LossParts MSELoss::forward_parts(const Tensor& input, const Tensor& target) const {
  TANDEM_AUTOCAST(kFloat32, forward_parts, input, target);
  return ElementParts(MseElements(input, target, options_), options_.reduction());
}

Tensor L1Loss::forward(const Tensor& input, const Tensor& target) {
  return functional::l1_loss(input, target, options_);
}

LossParts L1Loss::forward_parts(const Tensor& input, const Tensor& target) const {
  TANDEM_AUTOCAST(kFloat32, forward_parts, input, target);
  return ElementParts(L1Elements(input, target, options_), options_.reduction());
}

SmoothL1Loss::SmoothL1Loss(const SmoothL1LossOptions& options) : options_(options) {
  CheckBeta(options_.beta(), "SmoothL1Loss");
  CheckReduction(options_.reduction(), "SmoothL1Loss");
}

Tensor SmoothL1Loss::forward(const Tensor& input, const Tensor& target) {
  return functional::smooth_l1_loss(input, target, options_);
}

LossParts SmoothL1Loss::forward_parts(const Tensor& input, const Tensor& target) const {
  TANDEM_AUTOCAST(kFloat32, forward_parts, input, target);
  return ElementParts(SmoothL1Elements(input, target, options_), options_.reduction());
}

}  // namespace tandem::nn
