// PyTorch's DataParallel tutorial ("Optional: Data Parallelism"), in C++: a Linear(5, 2)
// model that prints the size of the chunk it gets, wrapped in DataParallel, fed 100 random
// rows in batches of 30. Each replica prints its own line from its own device's thread; the
// loop prints the gathered sizes after each batch.
//
//   bazel run -c opt //examples:tutorial -- --devices=cpu:0,cpu:1,cpu:2
//   Let's use 3 devices!
//   	In Model: input size [10, 5] output size [10, 2]
//   	In Model: input size [10, 5] output size [10, 2]
//   	In Model: input size [10, 5] output size [10, 2]
//   Outside: input size [30, 5] output_size [30, 2]
//   ...
//
// --devices defaults to every CUDA GPU, else every logical CPU device. Logical CPU devices
// are created as needed (cpu:0,...,cpu:7 works on a 2-core machine: they share the cores).
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "data/data.h"
#include "examples/cli.h"
#include "nn/nn.h"
#include "parallel/data_parallel.h"
#include "tensor/tensor.h"

ABSL_FLAG(std::string, devices, "",
          "Comma-separated devices to split each batch over, e.g. cpu:0,cpu:1,cpu:2 or "
          "cuda:0,cuda:1 (default: every CUDA GPU, else every logical CPU device)");
ABSL_FLAG(int, batch_size, 30, "Rows per batch");
ABSL_FLAG(int, data_size, 100, "Rows in the random dataset");

namespace tandem {
namespace {

constexpr int64_t kInputSize = 5;
constexpr int64_t kOutputSize = 2;

// The tutorial's Model: a Linear layer whose forward reports the sizes it sees. Under
// DataParallel each replica runs this on its own chunk, on its device's thread, so the line
// is written with one call (lines from different replicas never interleave).
class Model : public nn::Cloneable<Model> {
 public:
  Model(int64_t input_size, int64_t output_size)
      : input_size_(input_size), output_size_(output_size) {
    reset();
  }

  void reset() override { fc_ = register_module("fc", nn::Linear(input_size_, output_size_)); }

  Tensor forward(const Tensor& input) {
    Tensor output = fc_->forward(input);
    const std::string line = "\tIn Model: input size " + ShapeToString(input.shape()) +
                             " output size " + ShapeToString(output.shape()) + "\n";
    std::fwrite(line.data(), 1, line.size(), stdout);
    return output;
  }

 private:
  int64_t input_size_;
  int64_t output_size_;
  std::shared_ptr<nn::Linear> fc_;
};

// The devices of --devices (creating the logical CPU devices it names), or the defaults.
std::vector<Device> DevicesFromFlag() {
  const std::string text = absl::GetFlag(FLAGS_devices);
  if (text.empty()) return parallel::DefaultDevices();
  std::vector<Device> devices = Device::ParseList(text);
  TANDEM_CHECK(!devices.empty(), "--devices must name at least one device, e.g. cpu:0,cpu:1");
  int cpu_count = 0;
  for (Device d : devices) {
    if (d.is_cpu()) cpu_count = std::max(cpu_count, d.index() + 1);
  }
  if (cpu_count > 0) SetCpuDeviceCount(cpu_count);
  return devices;
}

int Run() {
  const int batch_size = absl::GetFlag(FLAGS_batch_size);
  const int data_size = absl::GetFlag(FLAGS_data_size);
  TANDEM_CHECK(batch_size >= 1, "--batch_size must be at least 1 but is ", batch_size);
  TANDEM_CHECK(data_size >= 1, "--data_size must be at least 1 but is ", data_size);
  const std::vector<Device> devices = DevicesFromFlag();

  auto dataset = std::make_shared<data::RandomDataset>(kInputSize, data_size);
  data::DataLoader loader(dataset, data::DataLoaderOptions().batch_size(batch_size).shuffle(true));

  auto model = std::make_shared<Model>(kInputSize, kOutputSize);
  // DataParallel checks the devices (distinct, available) and wants the model on the first.
  model->to(devices[0]);
  auto parallel_model = std::make_shared<parallel::DataParallel>(model, devices);
  if (devices.size() > 1) std::printf("Let's use %zu devices!\n", devices.size());

  for (data::Batch& batch : loader) {
    const Tensor input = batch.data().to(devices[0]);
    const Tensor output = parallel_model->forward(input);
    std::printf("Outside: input size %s output_size %s\n", ShapeToString(input.shape()).c_str(),
                ShapeToString(output.shape()).c_str());
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  return tandem::examples::RunMain(
      argc, argv, "tutorial",
      "PyTorch's DataParallel tutorial: a Linear(5, 2) model split over devices.\n"
      "  tutorial --devices=cpu:0,cpu:1,cpu:2 [--batch_size=30] [--data_size=100]",
      [] { return tandem::Run(); });
}
