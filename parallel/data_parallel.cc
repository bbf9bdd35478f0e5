#include "parallel/data_parallel.h"

#include <algorithm>
#include <iostream>
#include <set>
#include <sstream>

#include "nn/loss.h"
#include "parallel/comm.h"
#include "parallel/parallel_apply.h"
#include "parallel/scatter_gather.h"
#include "parallel/sync_batch_norm.h"
#include "tensor/core/autograd.h"
#include "tensor/runtime/backend.h"
#include "tensor/runtime/devices.h"
#include "tensor/runtime/profiler.h"

namespace tandem::parallel {
namespace {

std::string DeviceList(const std::vector<Device>& devices) {
  std::ostringstream out;
  for (size_t i = 0; i < devices.size(); ++i) out << (i > 0 ? ", " : "") << devices[i];
  return out.str();
}

}  // namespace

namespace internal {

std::vector<size_t> WeakDevices(const std::vector<DeviceCapacity>& capacities) {
  int64_t max_memory = 0, max_cores = 0;
  for (const DeviceCapacity& c : capacities) {
    max_memory = std::max(max_memory, c.memory_bytes);
    max_cores = std::max(max_cores, c.cores);
  }
  std::vector<size_t> weak;
  for (size_t i = 0; i < capacities.size(); ++i) {
    const DeviceCapacity& c = capacities[i];
    const bool low_memory = c.memory_bytes > 0 && c.memory_bytes < 0.75 * max_memory;
    const bool few_cores = c.cores > 0 && c.cores < 0.75 * max_cores;
    if (low_memory || few_cores) weak.push_back(i);
  }
  return weak;
}

}  // namespace internal

std::vector<Device> DefaultDevices() {
  std::vector<Device> devices;
  const int gpus = DeviceCount(DeviceType::kCUDA);
  if (gpus > 0) {
    for (int i = 0; i < gpus; ++i) devices.push_back(Device::Cuda(i));
  } else {
    for (int i = 0; i < CpuDeviceCount(); ++i) devices.push_back(Device::Cpu(i));
  }
  return devices;
}

CpuLayout ChooseCpuLayout(int64_t batch, int64_t parameters, int64_t rows_per_sample, int cores) {
  TANDEM_CHECK(batch >= 1, "ChooseCpuLayout: the batch must have at least 1 sample but has ",
               batch);
  TANDEM_CHECK(parameters >= 0,
               "ChooseCpuLayout: the parameter count must be at least 0 (0: ", "unknown) but is ",
               parameters);
  TANDEM_CHECK(rows_per_sample >= 1, "ChooseCpuLayout: a sample must have at least 1 row but ",
               "has ", rows_per_sample);
  TANDEM_CHECK(cores >= 1, "ChooseCpuLayout: expected at least 1 core but got ", cores);
  int count = static_cast<int>(std::min<int64_t>(cores, batch));
  const int64_t rows_per_replica = batch / count * rows_per_sample;
  if (parameters > kMaxParametersPerReplicaRow * rows_per_replica) count = 1;
  CpuLayout layout;
  for (int i = 0; i < count; ++i) layout.devices.push_back(Device::Cpu(i));
  layout.threads_per_device = cores / count;
  return layout;
}

DataParallel::DataParallel(std::shared_ptr<nn::Module> module, std::vector<Device> device_ids,
                           std::optional<Device> output_device, int64_t dim)
    : nn::Module("DataParallel"),
      module_(std::move(module)),
      device_ids_(device_ids.empty() ? DefaultDevices() : std::move(device_ids)),
      dim_(dim) {
  TANDEM_CHECK(module_ != nullptr, "DataParallel: the module is null");
  TANDEM_CHECK(!device_ids_.empty(), "DataParallel: no devices to run on");
  std::set<Device> seen;
  std::vector<Device> duplicates;
  for (Device d : device_ids_) {
    if (!seen.insert(d).second) duplicates.push_back(d);
    CheckAvailable(d);
  }
  TANDEM_CHECK(duplicates.empty(), "DataParallel: device_ids must be distinct but ",
               DeviceList(duplicates), duplicates.size() == 1 ? " appears" : " appear",
               " more than once in [", DeviceList(device_ids_), "]; list each device once");
  output_device_ = output_device.value_or(device_ids_[0]);
  CheckAvailable(output_device_);
  register_module("module", module_);
  replicator_ = std::make_unique<Replicator>(module_, device_ids_);

  std::vector<DeviceCapacity> capacities;
  for (Device d : device_ids_) capacities.push_back(GetBackend(d).Capacity(d.index()));
  std::vector<size_t> weak = internal::WeakDevices(capacities);
  if (!weak.empty()) {
    std::vector<Device> names;
    for (size_t i : weak) names.push_back(device_ids_[i]);
    std::cerr << "warning: DataParallel: " << DeviceList(names)
              << " have less than 75% of the memory or cores of the strongest device in ["
              << DeviceList(device_ids_)
              << "]; the slowest replica sets the pace, so consider leaving them out\n";
  }
}

void DataParallel::set_bucket_bytes(size_t bytes) {
  TANDEM_CHECK(bytes > 0, "DataParallel::set_bucket_bytes: the size must be positive");
  replicator_ = std::make_unique<Replicator>(module_, device_ids_, bytes);
}

void DataParallel::CheckModuleDevice() const {
  const Device first = device_ids_[0];
  for (const auto& list : {module_->named_parameters(), module_->named_buffers()}) {
    for (const nn::NamedTensor& entry : list) {
      TANDEM_CHECK(entry.value.device() == first,
                   "module must have its parameters and buffers on device ", first,
                   " (device_ids[0]) but found one of them on device: ", entry.value.device(), " (",
                   entry.name, "); move the module with module->to(", first, ")");
    }
  }
}

std::vector<int64_t> DataParallel::ChunksFor(const std::vector<Tensor>& inputs) const {
  if (inputs.empty()) return {};
  TANDEM_CHECK(inputs[0].defined(), "DataParallel: input 0 is undefined");
  TANDEM_CHECK(inputs[0].dim() > 0,
               "DataParallel: input 0 is 0-dimensional; DataParallel "
               "splits inputs along dimension ",
               dim_, ", so give them a batch dimension");
  const int64_t axis = WrapDim(dim_, inputs[0].dim(), "DataParallel");
  return ChunkSizes(inputs[0].size(axis), static_cast<int64_t>(device_ids_.size()));
}

namespace {

// Replica 0's in-place writes reach the module once every replica has run (Replicator's
// defer_source_writes), also when one threw.
struct CommitSourceWritesOnExit {
  Replicator& replicator;
  ~CommitSourceWritesOnExit() { replicator.CommitSourceWrites(); }
};

}  // namespace

DataParallel::Scattered DataParallel::ScatterAndReplicate(const std::vector<Tensor>& inputs) {
  Scattered scattered;
  {
    TANDEM_PROFILE_SCOPE("parallel", "scatter");
    scattered.per_replica = scatter_inputs(inputs, device_ids_, dim_);
  }
  const size_t n = scattered.per_replica.size();
  scattered.devices.assign(device_ids_.begin(), device_ids_.begin() + n);
  {
    TANDEM_PROFILE_SCOPE("parallel", "replicate");
    scattered.replicas =
        replicator_->Replicate(static_cast<int>(n), /*detach=*/false, /*defer_source_writes=*/true);
  }
  return scattered;
}

std::vector<Tensor> DataParallel::forward_tensors(const std::vector<Tensor>& inputs) {
  CheckModuleDevice();
  const std::vector<int64_t> chunks = ChunksFor(inputs);
  last_chunk_sizes_ = chunks;
  if (device_ids_.size() == 1 || chunks.size() <= 1) {
    // One device or one chunk: the module itself, on the inputs moved to its device.
    std::vector<Tensor> moved;
    for (const Tensor& x : inputs) moved.push_back(x.defined() ? x.to(device_ids_[0]) : x);
    std::vector<Tensor> outputs = module_->forward_tensors(moved);
    for (Tensor& out : outputs) {
      if (out.defined()) out = out.to(output_device_);  // as libtorch's data_parallel
    }
    return outputs;
  }
  const Scattered scattered = ScatterAndReplicate(inputs);
  const CommitSourceWritesOnExit commit{*replicator_};
  const size_t n = scattered.per_replica.size();
  auto group = std::make_shared<ReplicaGroup>(n);  // synchronized BatchNorms meet in it
  std::vector<std::vector<Tensor>> outputs = ParallelRun(scattered.devices, [&](size_t i) {
    const ReplicaScope scope(group, i);
    return scattered.replicas[i]->forward_tensors(scattered.per_replica[i]);
  });
  const size_t count = outputs[0].size();
  for (size_t i = 1; i < n; ++i) {
    TANDEM_CHECK(outputs[i].size() == count, "DataParallel: replica 0 returned ", count,
                 " outputs but replica ", i, " returned ", outputs[i].size(),
                 "; a module must return the same number of tensors for every chunk");
  }
  TANDEM_PROFILE_SCOPE("parallel", "gather");
  std::vector<Tensor> gathered;
  for (size_t k = 0; k < count; ++k) {
    std::vector<Tensor> pieces;
    for (size_t i = 0; i < n; ++i) pieces.push_back(outputs[i][k]);
    gathered.push_back(Gather(pieces, output_device_, dim_));
  }
  return gathered;
}

namespace {

// The criterion to run on `device`: itself when every parameter and buffer it has is there,
// else a copy there (clone(device), a few floats each call) whose parameters are
// differentiable copies of the original's, so that gradients still reach them.
std::shared_ptr<nn::Module> CriterionOn(nn::Module& criterion, Device device) {
  bool elsewhere = false;
  for (const auto& list : {criterion.named_parameters(), criterion.named_buffers()}) {
    for (const nn::NamedTensor& entry : list) {
      if (entry.value.defined() && entry.value.device() != device) elsewhere = true;
    }
  }
  if (!elsewhere) return nullptr;
  std::shared_ptr<nn::Module> copy;
  try {
    copy = criterion.clone(device);
  } catch (const Error& e) {
    TANDEM_CHECK(false, "DataParallel::forward_loss: the criterion has parameters or buffers ",
                 "that are not on ", device, ", where a replica computes its loss, and copying ",
                 "it there failed: ", e.what(),
                 "; make the criterion cloneable (nn::Cloneable) or give it no tensors");
  }
  for (const nn::NamedTensor& entry : criterion.named_parameters()) {
    copy->replace_parameter(entry.name, entry.value.to(device));
  }
  return copy;
}

}  // namespace

Tensor DataParallel::forward_loss(nn::Module& criterion, const std::vector<Tensor>& inputs,
                                  const Tensor& targets) {
  CheckModuleDevice();
  TANDEM_CHECK(targets.defined(), "DataParallel::forward_loss: the targets are undefined");
  TANDEM_CHECK(!inputs.empty(), "DataParallel::forward_loss: expected at least one input");
  std::vector<Tensor> all = inputs;
  all.push_back(targets);  // chunked with the inputs, so chunk i's targets match its rows
  const std::vector<int64_t> chunks = ChunksFor(all);
  last_chunk_sizes_ = chunks;
  // Replica i's output and target chunk.
  auto output_of = [](nn::Module& model, std::vector<Tensor> replica_inputs) {
    Tensor target = replica_inputs.back();
    replica_inputs.pop_back();
    std::vector<Tensor> out = model.forward_tensors(replica_inputs);
    TANDEM_CHECK(!out.empty(), "DataParallel::forward_loss: the module returned no output");
    return std::pair<Tensor, Tensor>(out[0], target);
  };
  if (device_ids_.size() == 1 || chunks.size() <= 1) {
    std::vector<Tensor> moved;
    for (const Tensor& x : all) moved.push_back(x.to(device_ids_[0]));
    std::shared_ptr<nn::Module> copy = CriterionOn(criterion, device_ids_[0]);
    nn::Module& local = copy ? *copy : criterion;
    auto [output, target] = output_of(*module_, moved);
    return local.forward_tensors({output, target}).at(0).to(output_device_);
  }
  const Scattered scattered = ScatterAndReplicate(all);
  const CommitSourceWritesOnExit commit{*replicator_};
  const std::vector<Device>& devices = scattered.devices;
  const size_t n = devices.size();
  // The criterion on each replica's device (the original where its tensors already are).
  std::vector<std::shared_ptr<nn::Module>> copies;
  std::vector<nn::Module*> criteria;
  for (Device d : devices) {
    copies.push_back(CriterionOn(criterion, d));
    criteria.push_back(copies.back() ? copies.back().get() : &criterion);
  }
  const bool chunkable = dynamic_cast<const nn::ChunkableLoss*>(&criterion) != nullptr;
  std::vector<nn::Reduction> reductions(n, nn::Reduction::kMean);
  auto group = std::make_shared<ReplicaGroup>(n);
  std::vector<std::vector<Tensor>> results = ParallelRun(devices, [&](size_t i) {
    const ReplicaScope scope(group, i);
    auto [output, target] = output_of(*scattered.replicas[i], scattered.per_replica[i]);
    if (chunkable) {
      const auto* loss = dynamic_cast<const nn::ChunkableLoss*>(criteria[i]);
      TANDEM_CHECK(loss != nullptr, "DataParallel::forward_loss: the criterion's copy on ",
                   devices[i], " is not a ChunkableLoss; its clone() must return its own type");
      nn::LossParts parts = loss->forward_parts(output, target);
      reductions[i] = parts.reduction;
      if (parts.reduction == nn::Reduction::kMean) {
        return std::vector<Tensor>{parts.numerator.reshape({1}), parts.denominator.reshape({1})};
      }
      if (parts.reduction == nn::Reduction::kSum) {
        return std::vector<Tensor>{parts.numerator.reshape({1})};
      }
      return std::vector<Tensor>{parts.numerator};
    }
    Tensor loss = criteria[i]->forward_tensors({output, target}).at(0);
    TANDEM_CHECK(loss.numel() == 1,
                 "DataParallel::forward_loss: the criterion must return one "
                 "value per chunk (a mean-reduced loss) but returned shape ",
                 ShapeToString(loss.shape()),
                 "; for other reductions implement nn::ChunkableLoss (as the stock losses do)");
    return std::vector<Tensor>{loss.reshape({1})};
  });
  TANDEM_PROFILE_SCOPE("parallel", "gather losses");
  std::vector<Tensor> numerators, denominators;
  for (size_t i = 0; i < n; ++i) {
    numerators.push_back(results[i][0]);
    if (results[i].size() > 1) denominators.push_back(results[i][1]);
  }
  if (chunkable) {
    switch (reductions[0]) {
      case nn::Reduction::kNone:
        // The per-element losses, in batch order.
        return Gather(numerators, output_device_, dim_);
      case nn::Reduction::kSum:
        return Gather(numerators, output_device_, 0).sum();
      case nn::Reduction::kMean:
        // 0 / 0 = NaN when every target is ignored, as PyTorch gives.
        return div(Gather(numerators, output_device_, 0).sum(),
                   Gather(denominators, output_device_, 0).sum());
    }
  }
  // Any other criterion: the chunks' losses weighted by chunk size, exact for a mean over
  // the rows of the batch.
  std::vector<double> weights;
  int64_t total = 0;
  for (int64_t c : chunks) total += c;
  for (size_t i = 0; i < n; ++i) {
    weights.push_back(static_cast<double>(chunks[i]) / total);
  }
  Tensor per_chunk = Gather(numerators, output_device_, 0);
  Tensor w = from_vector(weights, {static_cast<int64_t>(n)},
                         TensorOptions().dtype(per_chunk.dtype()).device(output_device_));
  return mul(per_chunk, w).sum();
}

}  // namespace tandem::parallel
