// DataParallel: PyTorch's torch.nn.DataParallel in C++. Wraps a module; each forward splits
// the batch along `dim` across the devices, runs one replica per chunk in parallel (each on
// its device's worker), and gathers the outputs on the output device. In training the
// gradients flow back into the original module's parameters (one reduce-add per bucket of
// parameters, started while backward is still running).
//
//   auto model = std::make_shared<nn::Linear>(10, 5);          // parameters on cpu:0
//   auto dp = std::make_shared<parallel::DataParallel>(
//       model, std::vector<Device>{Device::Cpu(0), Device::Cpu(1)});
//   Tensor y = dp->forward(randn({8, 10}));                    // [8, 5] on cpu:0
//   y.sum().backward();                                        // model's .grad filled
//   std::cout << *dp;  // DataParallel(\n  (module): Linear(in_features=10, ...)\n)
//
// Semantics, as PyTorch's: the module's parameters and buffers must be on device_ids[0]
// (checked at every forward); inputs may be on any device (they are scattered from where
// they are); one device, or a batch that gives one chunk, runs the module directly; the
// output is on the output device in every case (as libtorch's data_parallel); a forward
// with no input runs one replica; the replicas are made afresh at every forward, so they
// follow every change to the module (see parallel/replicate.h); train()/eval() reach the
// replicas; zero_grad() inside a replica's forward does not touch the original and warns
// once, as PyTorch; buffers that require grad get the sum of every replica's gradient;
// in training mode replica 0's buffer updates (BatchNorm's running statistics) reach the
// original module, the other replicas' are dropped. An exception in a replica reaches the
// caller after every replica has stopped, naming the replica and its device (see
// parallel/parallel_apply.h).
//
// Beyond PyTorch: forward_loss() computes the loss inside the replicas, so the full output
// is never gathered onto one device.
#ifndef TANDEM_PARALLEL_DATA_PARALLEL_H_
#define TANDEM_PARALLEL_DATA_PARALLEL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "nn/module.h"
#include "parallel/replicate.h"
#include "tensor/runtime/backend.h"
#include "tensor/runtime/devices.h"
#include "tensor/tensor.h"

namespace tandem::parallel {

// The default device list: every CUDA device, or every logical CPU device without one.
std::vector<Device> DefaultDevices();

// How a CPU-only machine's cores are laid out for data-parallel training: `devices` logical CPU
// devices (cpu:0 ... cpu:n-1) of `threads_per_device` threads each.
struct CpuLayout {
  std::vector<Device> devices;
  int threads_per_device = 1;
};

// The layout to train a model of `parameters` parameters in, with `batch` samples a step of
// `rows_per_sample` rows each (tokens for a sequence model, 1 for an image) on `cores` cores. A
// rule from the model's size and the batch, not a measurement at start-up:
//  - one logical device per core, one thread each (at most one per sample, so that none
//    idles), while each replica's rows carry at most kMaxParametersPerReplicaRow parameters:
//    the replicas meet twice a step (the loss, the gradient sum) where one device with N
//    threads splits and joins every op;
//  - else one device with every core: DataParallel's per-step cost grows with the parameters
//    (one more full gradient per replica, and their sum read and written), the work with the
//    rows, and a large model on a small batch (GPT-2 124M at 4 x 64 tokens: ~970,000
//    parameters per row) pays more for the sum than the devices save.
// `parameters` 0 (unknown) applies the first case. Apply the layout with SetCpuDeviceCount and
// SetCpuThreadsPerDevice (examples::ConfigureCpuDevices(layout.devices, 0) does both):
//   const CpuLayout layout = parallel::ChooseCpuLayout(batch_size, parameter_count, tokens);
inline constexpr int64_t kMaxParametersPerReplicaRow = 65536;
CpuLayout ChooseCpuLayout(int64_t batch, int64_t parameters = 0, int64_t rows_per_sample = 1,
                          int cores = HardwareCores());

class DataParallel : public nn::Module {
 public:
  // device_ids: empty means DefaultDevices(). output_device: unset means device_ids[0].
  // Throws for duplicate or unavailable devices, naming them; warns once (stderr) when some
  // devices have much less memory or fewer cores than the strongest (under 75%).
  explicit DataParallel(std::shared_ptr<nn::Module> module, std::vector<Device> device_ids = {},
                        std::optional<Device> output_device = std::nullopt, int64_t dim = 0);

  // Typed forwards: the module's first output, gathered (forward_tensors for all of them).
  template <typename... Rest,
            typename = std::enable_if_t<(std::is_convertible_v<const Rest&, const Tensor&> && ...)>>
  Tensor forward(const Tensor& input, const Rest&... rest) {
    return forward_tensors({input, rest...}).at(0);
  }
  std::vector<Tensor> forward_tensors(const std::vector<Tensor>& inputs) override;

  // criterion(module(inputs), targets) computed inside each replica on its chunk, so the
  // full output is never gathered; the value and the gradients equal those of the criterion
  // on the gathered output, on the output device. Exact for every reduction and option of
  // the stock losses (nn::ChunkableLoss, nn/loss.h): each replica returns its reduction's
  // parts and they are combined as the whole batch's: kMean as sum(numerators) /
  // sum(denominators) (class weights and ignored targets included; NaN when every target is
  // ignored, as PyTorch), kSum as the sum, kNone as the per-element losses gathered along
  // `dim` in batch order. Any other criterion must return one value per chunk; the chunks'
  // values are weighted by chunk size, which is exact only for a plain mean over the rows
  // (implement nn::ChunkableLoss otherwise). A criterion whose parameters or buffers (e.g. a
  // class weight) are not on a replica's device is cloned there for the call (gradients
  // still reach its parameters). The criterion's forward takes (output, target) and may be
  // called from several threads at once (the stock losses are stateless).
  Tensor forward_loss(nn::Module& criterion, const std::vector<Tensor>& inputs,
                      const Tensor& targets);
  Tensor forward_loss(nn::Module& criterion, const Tensor& input, const Tensor& targets) {
    return forward_loss(criterion, std::vector<Tensor>{input}, targets);
  }

  const std::shared_ptr<nn::Module>& module() const { return module_; }
  const std::vector<Device>& device_ids() const { return device_ids_; }
  Device output_device() const { return output_device_; }
  int64_t dim() const { return dim_; }
  // How the last forward split its batch: rows per replica (e.g. {15, 15}).
  const std::vector<int64_t>& last_chunk_sizes() const { return last_chunk_sizes_; }
  // Bytes of parameters per gradient-reduction bucket (default kDefaultBucketBytes). A
  // value at least the parameters' size gives one bucket: reduction waits for the end of
  // backward.
  void set_bucket_bytes(size_t bytes);

 private:
  void CheckModuleDevice() const;
  // Chunk sizes for a batch of `batch` rows over the devices (maybe fewer than devices).
  std::vector<int64_t> ChunksFor(const std::vector<Tensor>& inputs) const;
  // Replica i's inputs, device and module copy: one per chunk, so there may be fewer than
  // devices. Both forwards scatter and replicate alike; only what runs on the replicas differs.
  struct Scattered {
    std::vector<std::vector<Tensor>> per_replica;
    std::vector<Device> devices;
    std::vector<std::shared_ptr<nn::Module>> replicas;
  };
  Scattered ScatterAndReplicate(const std::vector<Tensor>& inputs);

  std::shared_ptr<nn::Module> module_;
  std::vector<Device> device_ids_;
  Device output_device_;
  int64_t dim_;
  std::unique_ptr<Replicator> replicator_;
  std::vector<int64_t> last_chunk_sizes_;
};

namespace internal {
// Indices of devices whose memory or cores are under 75% of the strongest's (unknown, zero,
// capacities are never weak).
std::vector<size_t> WeakDevices(const std::vector<DeviceCapacity>& capacities);
}  // namespace internal

}  // namespace tandem::parallel

#endif  // TANDEM_PARALLEL_DATA_PARALLEL_H_
