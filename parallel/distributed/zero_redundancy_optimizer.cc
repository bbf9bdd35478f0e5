#include "parallel/distributed/zero_redundancy_optimizer.h"

#include <algorithm>
#include <numeric>
#include <sstream>
#include <string>
#include <utility>

#include "parallel/distributed/broadcast_coalesced.h"
#include "parallel/distributed/internal/optimizer_state_name.h"
#include "tensor/base/error.h"
#include "tensor/runtime/profiler.h"

namespace tandem::parallel::distributed {
namespace {

constexpr const char* kName = "ZeroRedundancyOptimizer";

// The wrapped optimizer's defaults, from one built over an empty group.
std::unique_ptr<nn::OptimizerOptions> DefaultsOf(const OptimizerFactory& factory) {
  TANDEM_CHECK(static_cast<bool>(factory), kName,
               ": got no optimizer factory; pass e.g. "
               "MakeOptimizerFactory<nn::AdamW>(nn::AdamWOptions(6e-4))");
  std::unique_ptr<nn::Optimizer> probe = factory({nn::ParamGroup({})});
  TANDEM_CHECK(probe != nullptr, kName, ": the optimizer factory returned null");
  return probe->defaults().clone();
}

}  // namespace

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<Tensor> parameters,
                                                 std::shared_ptr<ProcessGroup> process_group,
                                                 OptimizerFactory factory)
    : nn::Optimizer(kName, DefaultsOf(factory)),
      process_group_(std::move(process_group)),
      factory_(std::move(factory)) {
  Init({nn::ParamGroup(std::move(parameters))}, /*from_parameter_list=*/true);
}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<nn::ParamGroup> groups,
                                                 std::shared_ptr<ProcessGroup> process_group,
                                                 OptimizerFactory factory)
    : nn::Optimizer(kName, DefaultsOf(factory)),
      process_group_(std::move(process_group)),
      factory_(std::move(factory)) {
  Init(std::move(groups), /*from_parameter_list=*/false);
}

void ZeroRedundancyOptimizer::Init(std::vector<nn::ParamGroup> groups, bool from_parameter_list) {
  TANDEM_CHECK(process_group_ != nullptr, kName, ": got a null process group");
  numel_per_rank_.assign(static_cast<size_t>(process_group_->size()), 0);
  AddGroups(std::move(groups), from_parameter_list);
}

void ZeroRedundancyOptimizer::CheckOptions(const nn::OptimizerOptions& options) const {
  // The wrapped optimizer checks their kind and values when built over a group that has them.
  nn::ParamGroup probe({});
  probe.set_options(options.clone());
  factory_({probe});
}

void ZeroRedundancyOptimizer::add_param_group(const nn::ParamGroup& group) {
  const size_t first = parameters_.size();
  nn::Optimizer::add_param_group(group);  // checks the parameters and fills in the options
  const nn::ParamGroup& added = groups_.back();
  const std::vector<Tensor>& params = added.params();

  // PyTorch's placement: largest first, each on the rank that owns the fewest elements so far
  // (the lowest such rank on a tie), so every rank's share is within one parameter of even.
  std::vector<size_t> order(params.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return params[a].numel() > params[b].numel(); });
  owners_.resize(parameters_.size(), -1);
  local_index_.resize(parameters_.size(), -1);
  for (size_t k : order) {
    const auto least = std::min_element(numel_per_rank_.begin(), numel_per_rank_.end());
    owners_[first + k] = static_cast<int>(least - numel_per_rank_.begin());
    *least += params[k].numel();
  }

  std::vector<Tensor> mine;
  const size_t local_first = local_ ? local_->parameters().size() : 0;
  for (size_t k = 0; k < params.size(); ++k) {
    if (owners_[first + k] != process_group_->rank()) continue;
    local_index_[first + k] = static_cast<int64_t>(local_first + mine.size());
    mine.push_back(params[k]);
  }
  nn::ParamGroup local_group(std::move(mine));
  local_group.set_options(added.options().clone());
  if (local_ == nullptr) {
    local_ = factory_({local_group});
  } else {
    local_->add_param_group(local_group);
  }
}

void ZeroRedundancyOptimizer::step() {
  TANDEM_PROFILE_SCOPE("optim", "ZeroRedundancyOptimizer.step");
  NoGradGuard no_grad;
  consolidated_.reset();
  // Schedulers write the learning rate (and momentum) into this optimizer's groups.
  for (size_t g = 0; g < groups_.size(); ++g) {
    local_->param_groups()[g].set_options(groups_[g].options().clone());
  }
  // Every rank's share goes out in rank order, each parameter straight from its owner's tensor
  // into the others' (no staging copy). The shares of the ranks before this one are received
  // while this rank steps its own (the group's thread runs those broadcasts as their roots
  // finish stepping); its own goes once stepped. A parameter that is not contiguous goes
  // through BroadcastCoalesced's staging buffer at the end.
  const int rank = process_group_->rank();
  std::vector<std::shared_ptr<Work>> works;
  std::vector<std::vector<Tensor>> staged(static_cast<size_t>(process_group_->size()));
  auto send = [&](int r) {
    for (size_t i = 0; i < parameters_.size(); ++i) {
      if (owners_[i] != r) continue;
      if (parameters_[i].is_contiguous()) {
        works.push_back(process_group_->broadcast(parameters_[i].detach(), r));
      } else {
        staged[static_cast<size_t>(r)].push_back(parameters_[i]);
      }
    }
  };
  for (int r = 0; r < rank; ++r) send(r);
  local_->step();
  for (int r = rank; r < process_group_->size(); ++r) send(r);
  for (const std::shared_ptr<Work>& work : works) work->wait();
  for (int r = 0; r < process_group_->size(); ++r) {
    BroadcastCoalesced(*process_group_, staged[static_cast<size_t>(r)], r);
  }
}

void ZeroRedundancyOptimizer::consolidate_state_dict(int to) {
  ProcessGroup& group = *process_group_;
  TANDEM_CHECK(to >= 0 && to < group.size(), kName, ": consolidate_state_dict(", to,
               ") names no rank of this group of ", group.size(), "; pass 0 .. ", group.size() - 1);
  consolidated_.reset();
  std::vector<size_t> global_of(local_->parameters().size());
  for (size_t i = 0; i < local_index_.size(); ++i) {
    if (local_index_[i] >= 0) global_of[static_cast<size_t>(local_index_[i])] = i;
  }
  const Device device = group.device();
  nn::OptimizerState whole;
  for (int r = 0; r < group.size(); ++r) {
    // Rank r says what it holds (name, dtype, shape per line), then sends the tensors.
    std::vector<std::string> names;
    std::vector<Tensor> tensors;
    std::string meta;
    if (group.rank() == r) {
      for (const auto& [name, value] : local_->state_dict()) {
        const auto [local, field] =
            internal::SplitOptimizerStateName(std::string(kName) + ": ", name, global_of.size());
        names.push_back("state." + std::to_string(global_of[local]) + "." + field);
        tensors.push_back(value.contiguous().to(device));
        std::ostringstream line;
        line << names.back() << ' ' << static_cast<int>(value.dtype()) << ' ' << value.dim();
        for (int64_t d : value.shape()) line << ' ' << d;
        meta += line.str() + "\n";
      }
    }
    Tensor length = from_vector(std::vector<int64_t>{static_cast<int64_t>(meta.size())}, {1});
    length = length.to(device);
    group.broadcast(length, r)->wait();
    const int64_t bytes = static_cast<int64_t>(length.item());
    if (bytes == 0) continue;
    Tensor text = group.rank() == r
                      ? from_vector(std::vector<uint8_t>(meta.begin(), meta.end()), {bytes})
                      : empty({bytes}, TensorOptions(kUInt8));
    text = text.to(device);
    group.broadcast(text, r)->wait();
    if (group.rank() != r) {
      const Tensor host = text.to(Device::Cpu(0));
      const uint8_t* data = host.data_ptr<uint8_t>();
      std::istringstream lines(std::string(data, data + bytes));
      std::string name;
      int dtype = 0;
      int64_t dims = 0;
      while (lines >> name >> dtype >> dims) {
        TANDEM_CHECK(dtype >= 0 && dtype < kNumDTypes && dims >= 0, kName, ": rank ", r,
                     " sent a malformed state entry \"", name, "\"");
        Shape shape(static_cast<size_t>(dims));
        for (int64_t& d : shape) lines >> d;
        names.push_back(name);
        tensors.push_back(empty(shape, TensorOptions(static_cast<DType>(dtype)).device(device)));
      }
    }
    BroadcastCoalesced(group, tensors, r);
    if (group.rank() == to) {
      for (size_t k = 0; k < names.size(); ++k) whole[names[k]] = tensors[k];
    }
  }
  if (group.rank() == to) consolidated_ = std::move(whole);
}

nn::OptimizerState ZeroRedundancyOptimizer::state_dict() const {
  TANDEM_CHECK(consolidated_.has_value(), kName, ": rank ", process_group_->rank(),
               " holds no consolidated state; call consolidate_state_dict(to) on every rank "
               "after the last step, then state_dict() on rank `to`");
  return *consolidated_;
}

void ZeroRedundancyOptimizer::load_state_dict(const nn::OptimizerState& state) {
  nn::OptimizerState mine;
  for (const auto& [name, value] : state) {
    const auto [index, field] =
        internal::SplitOptimizerStateName(std::string(kName) + ": ", name, parameters_.size());
    if (owners_[index] != process_group_->rank()) continue;
    mine["state." + std::to_string(local_index_[index]) + "." + field] = value;
  }
  local_->load_state_dict(mine);
  consolidated_.reset();
}

}  // namespace tandem::parallel::distributed
