#include "examples/data_parallel_training.h"

#include <algorithm>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "data/sampler.h"
#include "examples/cli.h"
#include "examples/train_strategy.h"
#include "parallel/comm.h"
#include "parallel/data_parallel.h"
#include "parallel/sync_batch_norm.h"

namespace tandem::examples {
namespace {

std::string Split(const std::vector<int64_t>& chunks) { return absl::StrJoin(chunks, "+"); }

class DataParallelStrategy : public TrainStrategy {
 public:
  void Start(const TrainConfig& config, Task& task) override {
    Require(!ParseDdpCompression(config.ddp_compression),
            "--ddp_compression=", config.ddp_compression,
            " compresses DistributedDataParallel's all-reduce and needs --distributed; "
            "DataParallel reduces its gradients without it: drop the flag or add --distributed");
    Require(config.sharding == "none", "--sharding=", config.sharding,
            " shards the optimizer state across the ranks of --distributed; DataParallel keeps "
            "one optimizer in one process: drop the flag or add --distributed");
    devices_ = ParseDevices(config.devices);
    // Without --devices and --threads on a machine without a GPU, the layout follows the
    // model's size (parallel::ChooseCpuLayout): a logical device per core for models whose
    // replicas meet cheaply, one device with every core when the per-step gradient sum over
    // the parameters would outweigh the split.
    if (config.devices.empty() && config.threads == 0 && !devices_.empty() &&
        devices_[0].is_cpu()) {
      manual_seed(config.task.seed);
      int64_t parameters = 0;
      for (const Tensor& p : task.MakeModel()->parameters()) parameters += p.numel();
      devices_ =
          parallel::ChooseCpuLayout(config.task.batch_size, parameters, task.rows_per_sample())
              .devices;
      layout_note_ = absl::StrFormat(
          "Layout: %d logical CPU device%s, chosen for %d parameters at batch %d "
          "(parallel::ChooseCpuLayout; --devices and --threads choose another)\n",
          devices_.size(), devices_.size() == 1 ? "" : "s", parameters, config.task.batch_size);
    }
    threads_ = ConfigureCpuDevices(devices_, config.threads);
  }
  Device device() const override { return devices_[0]; }
  std::vector<Device> local_devices() const override { return devices_; }
  int threads() const override { return threads_; }
  std::string Settings(const TrainConfig& c) const override {
    const DType autocast = ParseAutocast(c.autocast);
    return absl::StrFormat(
        "devices=%s threads=%d batch_size=%d seed=%d lr=%g lr_decay=%s "
        "weight_decay=%g epochs=%d train_limit=%d autocast=%s",
        examples::DeviceNames(devices_, ","), threads_, c.task.batch_size, c.task.seed, c.task.lr,
        c.lr_decay, c.weight_decay, c.epochs, c.task.train_limit,
        autocast == kFloat32 ? "none" : DTypeName(autocast));
  }
  std::string RestoreGenerators(const TrainerState& state, uint64_t seed) override {
    return examples::RestoreGenerators(state, devices_, seed);
  }
  std::unique_ptr<data::Sampler> MakeSampler(int64_t size, uint64_t seed, int64_t epoch) override {
    auto sampler = std::make_unique<data::RandomSampler>(size, seed);
    sampler->set_epoch(epoch);
    sampler_ = sampler.get();
    return sampler;
  }
  int64_t sampler_epoch() const override { return sampler_->epoch(); }
  void Wrap(std::shared_ptr<nn::Module> model, const TrainConfig& config) override {
    try {
      dp_ = std::make_shared<parallel::DataParallel>(model, devices_);
    } catch (const Error& e) {
      throw UsageError("--devices: " + OneLine(e.what()));
    }
    forward_loss_ = config.forward_loss;
    if (config.sync_bn) {
      synchronized_norms_ = parallel::ConvertSyncBatchNorm(*model);
      RequireSynchronizedNorms(synchronized_norms_, config.task.model);
    }
  }
  std::string Header(const TrainConfig& config) const override {
    const int64_t batch = config.task.batch_size;
    const std::vector<int64_t> split =
        parallel::ChunkSizes(batch, static_cast<int64_t>(devices_.size()));
    std::string text = layout_note_;
    text += "DataParallel on " + examples::DeviceNames(devices_, ", ");
    if (threads_ > 0) {
      text += absl::StrFormat(" (%d thread%s per CPU device)", threads_, threads_ == 1 ? "" : "s");
    }
    text += absl::StrFormat(", batch %d split %s", batch, Split(split));
    if (split.size() < devices_.size()) {
      text += absl::StrFormat(
          " (%d chunk%s for %d devices: the rest idle; use a batch of at least %d)", split.size(),
          split.size() == 1 ? "" : "s", devices_.size(), devices_.size());
    }
    text += "\n";
    if (synchronized_norms_ > 0) {
      text += absl::StrFormat(
          "BatchNorm over the whole batch across the devices (--sync_bn): %d layers "
          "synchronized\n",
          synchronized_norms_);
    }
    return text;
  }
  std::string LossWhere(const TrainConfig& config) const override {
    return config.forward_loss ? "inside the replicas (--forward_loss)"
                               : "on the gathered output (--noforward_loss)";
  }
  std::string WrapperText() const override {
    std::ostringstream out;
    out << *dp_;
    return out.str();
  }
  void StartEpoch() override { splits_.clear(); }
  Tensor Loss(nn::Module& criterion, const Tensor& input, const Tensor& target) override {
    return forward_loss_ ? dp_->forward_loss(criterion, input, target)
                         : criterion.forward_tensors({dp_->forward(input), target})[0];
  }
  void StepDone() override { ++splits_[dp_->last_chunk_sizes()]; }
  std::vector<double> EpochTotals(double loss_sum, double seen) override {
    return {loss_sum, seen};
  }
  std::string SaveGenerators(TrainerState* state, bool) override {
    state->generators.clear();
    for (Device d : devices_) state->generators.push_back({d, default_generator(d).state()});
    return "";
  }
  Tensor EvalForward(const Tensor& input) override { return dp_->forward(input); }
  void SetTraining(bool on) override {
    if (on) {
      dp_->train();
    } else {
      dp_->eval();
    }
  }
  std::string EpochNote() override {
    std::vector<std::pair<int64_t, std::string>> counted;
    for (const auto& [chunks, count] : splits_) {
      counted.push_back({count, absl::StrFormat("%d x %s", count, Split(chunks))});
    }
    std::stable_sort(counted.begin(), counted.end(),
                     [](const auto& a, const auto& b) { return a.first > b.first; });
    std::vector<std::string> text;
    for (const auto& c : counted) text.push_back(c.second);
    return "  split " + absl::StrJoin(text, ", ");
  }
  std::string Where(int64_t batch_size, const std::string& separator) const override {
    return absl::StrFormat(" on %s, batch %d", examples::DeviceNames(devices_, separator),
                           batch_size);
  }
  std::vector<std::string> DeviceNames() const override {
    std::vector<std::string> names;
    for (Device d : devices_) names.push_back(d.ToString());
    return names;
  }

 private:
  std::vector<Device> devices_;
  int threads_ = 0;
  std::string layout_note_;
  data::RandomSampler* sampler_ = nullptr;  // owned by the loader
  std::shared_ptr<parallel::DataParallel> dp_;
  bool forward_loss_ = true;
  int synchronized_norms_ = 0;  // --sync_bn
  std::map<std::vector<int64_t>, int64_t> splits_;
};

}  // namespace

std::unique_ptr<TrainStrategy> MakeDataParallelStrategy() {
  return std::make_unique<DataParallelStrategy>();
}

}  // namespace tandem::examples
