#include "parallel/replicate.h"

#include <algorithm>
#include <iterator>
#include <set>
#include <string>

#include "parallel/comm.h"
#include "tensor/core/autograd.h"

namespace tandem::parallel {
namespace {

// Backward of one bucket of Broadcast: output d * B + b is tensor b's copy on devices[d];
// the gradient of tensor b is the sum of its copies' gradients, on the source device.
class BroadcastBackward final : public Node {
 public:
  BroadcastBackward(Device source, const std::vector<Device>& devices, size_t bucket_size)
      : Node(source, OutputDevices(devices, bucket_size)),
        num_devices_(devices.size()),
        bucket_size_(bucket_size) {}

  std::vector<Tensor> Apply(std::vector<Tensor> grads) override {
    if (GradMode::IsEnabled()) return RecordedSums(grads);
    bool complete = true;
    std::vector<std::vector<Tensor>> per_device(num_devices_);
    for (size_t d = 0; d < num_devices_; ++d) {
      per_device[d].assign(std::make_move_iterator(grads.begin() + d * bucket_size_),
                           std::make_move_iterator(grads.begin() + (d + 1) * bucket_size_));
      for (const Tensor& g : per_device[d]) complete = complete && g.defined();
    }
    if (complete) return reduce_add_coalesced(std::move(per_device), device());
    // Some copies got no gradient (a replica did not use a parameter): sum what there is.
    std::vector<Tensor> sums(bucket_size_);
    for (size_t b = 0; b < bucket_size_; ++b) {
      std::vector<Tensor> defined;
      for (size_t d = 0; d < num_devices_; ++d) {
        if (per_device[d][b].defined()) defined.push_back(per_device[d][b]);
      }
      if (!defined.empty()) sums[b] = reduce_add(defined, device());
    }
    return sums;
  }
  std::string name() const override { return "BroadcastBackward"; }
  bool SupportsDoubleBackward() const override { return true; }

 private:
  // Under create_graph (double backward): the same sums with recorded copies and adds, so
  // the parameters' gradients can be differentiated again.
  std::vector<Tensor> RecordedSums(const std::vector<Tensor>& grads) const {
    std::vector<Tensor> sums(bucket_size_);
    for (size_t b = 0; b < bucket_size_; ++b) {
      for (size_t d = 0; d < num_devices_; ++d) {
        const Tensor& g = grads[d * bucket_size_ + b];
        if (!g.defined()) continue;
        const Tensor here = g.to(device());
        sums[b] = sums[b].defined() ? add(sums[b], here) : here;
      }
    }
    return sums;
  }

  static std::vector<Device> OutputDevices(const std::vector<Device>& devices, size_t n) {
    std::vector<Device> out;
    for (Device d : devices) out.insert(out.end(), n, d);
    return out;
  }
  size_t num_devices_;
  size_t bucket_size_;
};

void CheckDistinct(const std::vector<Device>& devices, const char* op) {
  TANDEM_CHECK(!devices.empty(), op, ": expected at least one device but got none");
  std::set<Device> seen;
  for (Device d : devices) {
    TANDEM_CHECK(seen.insert(d).second, op, ": device ", d,
                 " appears more than once in the device list; list each device once");
  }
}

}  // namespace

std::vector<std::vector<Tensor>> Broadcast(const std::vector<Tensor>& tensors,
                                           const std::vector<Device>& devices, size_t bucket_bytes,
                                           bool alias_source) {
  std::vector<Tensor> detached;
  for (const Tensor& t : tensors) detached.push_back(t.detach());
  std::vector<std::vector<Tensor>> copies = broadcast_coalesced(detached, devices);
  const bool all_cpu =
      std::all_of(devices.begin(), devices.end(), [](Device d) { return d.is_cpu(); });
  if (alias_source && all_cpu && !tensors.empty() && tensors[0].device() == devices[0]) {
    for (size_t k = 0; k < tensors.size(); ++k) {
      copies[0][k] = alias_on_cpu_device(detached[k], devices[0]);
    }
  }
  if (!GradMode::IsEnabled()) return copies;
  // Buckets in reverse order: backward produces the last parameters' gradients first.
  std::vector<std::vector<size_t>> buckets;
  size_t open_bytes = 0;
  for (size_t k = tensors.size(); k-- > 0;) {
    if (!tensors[k].requires_grad()) continue;
    const size_t bytes = static_cast<size_t>(tensors[k].numel()) * ElementSize(tensors[k].dtype());
    if (buckets.empty() || (open_bytes > 0 && open_bytes + bytes > bucket_bytes)) {
      buckets.emplace_back();
      open_bytes = 0;
    }
    buckets.back().push_back(k);
    open_bytes += bytes;
  }
  for (const std::vector<size_t>& bucket : buckets) {
    std::vector<Tensor> inputs;
    std::vector<Tensor> outputs;
    for (size_t d = 0; d < devices.size(); ++d) {
      for (size_t k : bucket) {
        // A fresh handle even where the copy is the input itself (the source device), so
        // that recording never touches the caller's tensor.
        outputs.push_back(copies[d][k].detach());
      }
    }
    for (size_t k : bucket) inputs.push_back(tensors[k]);
    RecordMultiOutputOp(
        std::make_shared<BroadcastBackward>(tensors[bucket[0]].device(), devices, bucket.size()),
        inputs, outputs);
    for (size_t d = 0; d < devices.size(); ++d) {
      for (size_t b = 0; b < bucket.size(); ++b) {
        copies[d][bucket[b]] = outputs[d * bucket.size() + b];
      }
    }
  }
  return copies;
}

Replicator::Replicator(std::shared_ptr<nn::Module> module, std::vector<Device> devices,
                       size_t bucket_bytes)
    : module_(std::move(module)), devices_(std::move(devices)), bucket_bytes_(bucket_bytes) {
  TANDEM_CHECK(module_ != nullptr, "Replicator: the module is null");
  CheckDistinct(devices_, "replicate");
}

std::vector<std::shared_ptr<nn::Module>> Replicator::Replicate(int count, bool detach,
                                                               bool defer_source_writes) {
  if (count < 0) count = static_cast<int>(devices_.size());
  TANDEM_CHECK(count >= 1 && count <= static_cast<int>(devices_.size()), "replicate: asked for ",
               count, " replicas but there are ", devices_.size(), " devices");
  const Device source = devices_[0];
  const std::vector<nn::NamedTensor> parameters = module_->named_parameters();
  const std::vector<nn::NamedTensor> buffers = module_->named_buffers();
  for (const auto* list : {&parameters, &buffers}) {
    for (const nn::NamedTensor& entry : *list) {
      TANDEM_CHECK(entry.value.device() == source,
                   "replicate: the module must have its "
                   "parameters and buffers on ",
                   source, " (devices[0]) but ", entry.name, " is on ", entry.value.device(),
                   "; call module->to(", source, ") first");
    }
  }
  const std::vector<Device> targets(devices_.begin(), devices_.begin() + count);
  const bool differentiable = GradMode::IsEnabled() && !detach;

  // Parameters, then the buffers that require grad (PyTorch's buffers_rg): broadcast with a
  // gradient path back to the original. The other buffers: replica 0 shares the original's,
  // the others get copies of their own (not broadcast_coalesced's aliases between CPU
  // devices), so that their in-place updates stay their own.
  std::vector<Tensor> with_grad;
  std::vector<Tensor> without_grad;
  for (const nn::NamedTensor& p : parameters) with_grad.push_back(p.value);
  for (const nn::NamedTensor& b : buffers) {
    (differentiable && b.value.requires_grad() ? with_grad : without_grad).push_back(b.value);
  }
  std::vector<std::vector<Tensor>> with_grad_copies;
  const bool alias_source = defer_source_writes && count > 1;
  {
    AutoGradMode mode(differentiable);
    with_grad_copies = Broadcast(with_grad, targets, bucket_bytes_, alias_source);
  }
  source_aliases_.clear();
  if (alias_source) {
    for (size_t i = 0; i < with_grad.size(); ++i) {
      source_aliases_.emplace_back(with_grad[i], with_grad_copies[0][i]);
    }
  }
  NoGradGuard no_grad;
  std::vector<std::shared_ptr<nn::Module>> replicas;
  for (int d = 0; d < count; ++d) {
    nn::Module::TensorBindings bindings;
    for (size_t i = 0; i < with_grad.size(); ++i) {
      bindings.emplace(with_grad[i].impl(), with_grad_copies[d][i]);
    }
    for (const Tensor& b : without_grad) {
      Tensor value = b;
      if (targets[d] != source) {
        value = empty(b.shape(), TensorOptions().dtype(b.dtype()).device(targets[d]));
        value.copy_(b);
      }
      bindings.emplace(b.impl(), std::move(value));
    }
    replicas.push_back(module_->replicate_structure(bindings));
  }
  return replicas;
}

void Replicator::CommitSourceWrites() {
  for (const auto& [original, alias] : source_aliases_) commit_alias_writes(original, alias);
  source_aliases_.clear();
}

std::vector<std::shared_ptr<nn::Module>> replicate(const std::shared_ptr<nn::Module>& module,
                                                   const std::vector<Device>& devices,
                                                   bool detach) {
  return Replicator(module, devices).Replicate(-1, detach);
}

}  // namespace tandem::parallel
