#include "parallel/data_parallel.h"

#include <algorithm>
#include <iostream>
#include <set>
#include <sstream>

#include "parallel/comm.h"
#include "parallel/parallel_apply.h"
#include "parallel/scatter_gather.h"
#include "tensor/autograd.h"
#include "tensor/backend.h"
#include "tensor/internal/tensor_impl.h"
#include "tensor/runtime.h"

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

std::vector<Tensor> DataParallel::forward_tensors(const std::vector<Tensor>& inputs) {
  CheckModuleDevice();
  const std::vector<int64_t> chunks = ChunksFor(inputs);
  last_chunk_sizes_ = chunks;
  if (device_ids_.size() == 1 || chunks.size() <= 1) {
    // One device or one chunk: the module itself, on the inputs moved to its device.
    std::vector<Tensor> moved;
    for (const Tensor& x : inputs) moved.push_back(x.defined() ? x.to(device_ids_[0]) : x);
    std::vector<Tensor> outputs = module_->forward_tensors(moved);
    if (device_ids_.size() > 1) {
      for (Tensor& out : outputs) {
        if (out.defined()) out = out.to(output_device_);
      }
    }
    return outputs;
  }
  std::vector<std::vector<Tensor>> per_replica = scatter_inputs(inputs, device_ids_, dim_);
  const size_t n = per_replica.size();
  std::vector<Device> devices(device_ids_.begin(), device_ids_.begin() + n);
  std::vector<std::shared_ptr<nn::Module>> replicas = replicator_->Replicate(static_cast<int>(n));
  std::vector<std::vector<Tensor>> outputs = parallel_apply(replicas, per_replica, devices);
  const size_t count = outputs[0].size();
  for (size_t i = 1; i < n; ++i) {
    TANDEM_CHECK(outputs[i].size() == count, "DataParallel: replica 0 returned ", count,
                 " outputs but replica ", i, " returned ", outputs[i].size(),
                 "; a module must return the same number of tensors for every chunk");
  }
  std::vector<Tensor> gathered;
  for (size_t k = 0; k < count; ++k) {
    std::vector<Tensor> pieces;
    for (size_t i = 0; i < n; ++i) pieces.push_back(outputs[i][k]);
    gathered.push_back(Gather(pieces, output_device_, dim_));
  }
  return gathered;
}

Tensor DataParallel::forward_loss(nn::Module& criterion, const std::vector<Tensor>& inputs,
                                  const Tensor& targets) {
  CheckModuleDevice();
  TANDEM_CHECK(targets.defined(), "DataParallel::forward_loss: the targets are undefined");
  TANDEM_CHECK(!inputs.empty(), "DataParallel::forward_loss: expected at least one input");
  std::vector<Tensor> all = inputs;
  all.push_back(targets);  // chunked with the inputs, so chunk i's targets match its rows
  const std::vector<int64_t> chunks = ChunksFor(all);
  last_chunk_sizes_ = chunks;
  auto loss_of = [&criterion](nn::Module& model, std::vector<Tensor> replica_inputs) {
    Tensor target = replica_inputs.back();
    replica_inputs.pop_back();
    std::vector<Tensor> out = model.forward_tensors(replica_inputs);
    TANDEM_CHECK(!out.empty(), "DataParallel::forward_loss: the module returned no output");
    return criterion.forward_tensors({out[0], target}).at(0);
  };
  if (device_ids_.size() == 1 || chunks.size() <= 1) {
    std::vector<Tensor> moved;
    for (const Tensor& x : all) moved.push_back(x.to(device_ids_[0]));
    return loss_of(*module_, moved).to(output_device_);
  }
  std::vector<std::vector<Tensor>> per_replica = scatter_inputs(all, device_ids_, dim_);
  const size_t n = per_replica.size();
  std::vector<Device> devices(device_ids_.begin(), device_ids_.begin() + n);
  std::vector<std::shared_ptr<nn::Module>> replicas = replicator_->Replicate(static_cast<int>(n));
  std::vector<std::vector<Tensor>> losses = ParallelRun(devices, [&](size_t i) {
    Tensor loss = loss_of(*replicas[i], per_replica[i]);
    TANDEM_CHECK(loss.numel() == 1,
                 "DataParallel::forward_loss: the criterion must return one "
                 "value per chunk (a mean-reduced loss) but returned shape ",
                 ShapeToString(loss.shape()));
    return std::vector<Tensor>{loss.reshape({})};
  });
  std::vector<Tensor> pieces;
  std::vector<float> weights;
  int64_t total = 0;
  for (int64_t c : chunks) total += c;
  for (size_t i = 0; i < n; ++i) {
    pieces.push_back(losses[i][0]);
    weights.push_back(static_cast<float>(static_cast<double>(chunks[i]) / total));
  }
  Tensor per_chunk = Gather(pieces, output_device_, 0);
  Tensor w =
      from_vector(weights, {static_cast<int64_t>(n)}, TensorOptions().device(output_device_));
  return mul(per_chunk, w).sum();
}

}  // namespace tandem::parallel
