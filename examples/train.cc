// Trains a classifier on Fashion-MNIST on one device and reports test accuracy: the
// tensor, nn and data libraries end to end.
//
//   bazel run -c opt //examples:train -- --device=cpu:0 --epochs=3
//   bazel run -c opt //examples:train -- --model=cnn --optimizer=adam --lr=0.001
//
// Progress is printed about ten times an epoch; the run ends with a summary table.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "data/data.h"
#include "nn/nn.h"
#include "tensor/tensor.h"

ABSL_FLAG(std::string, device, "cpu:0", "Device to train on: cpu:0, cuda:0, ...");
ABSL_FLAG(std::string, model, "mlp", "mlp (784-256-128-10) or cnn (two conv+pool blocks)");
ABSL_FLAG(std::string, optimizer, "sgd", "sgd (momentum 0.9) or adam");
ABSL_FLAG(double, lr, 0.05, "Learning rate (0.05 suits sgd, 0.001 adam)");
ABSL_FLAG(int, epochs, 3, "Passes over the 60,000 training images");
ABSL_FLAG(int, batch_size, 128, "Images per step");
ABSL_FLAG(int, workers, 1, "DataLoader threads that prefetch batches (0: load inline)");
ABSL_FLAG(uint64_t, seed, 1, "Seed for initialisation and shuffling");
ABSL_FLAG(std::string, data_dir, tandem::data::FashionMnist::kDefaultRoot,
          "Folder with the gzipped IDX files (Debian package dataset-fashion-mnist)");
ABSL_FLAG(std::string, save, "", "If set, write a checkpoint of the trained model here");

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::shared_ptr<nn::Sequential> MakeModel(const std::string& kind) {
  if (kind == "mlp") {
    return std::make_shared<nn::Sequential>(nn::Flatten(), nn::Linear(784, 256), nn::ReLU(),
                                            nn::Linear(256, 128), nn::ReLU(), nn::Linear(128, 10));
  }
  if (kind == "cnn") {
    return std::make_shared<nn::Sequential>(
        nn::Conv2d(nn::Conv2dOptions(1, 32, 3).padding(1)), nn::ReLU(), nn::MaxPool2d(2),
        nn::Conv2d(nn::Conv2dOptions(32, 64, 3).padding(1)), nn::ReLU(), nn::MaxPool2d(2),
        nn::Flatten(), nn::Linear(64 * 7 * 7, 128), nn::ReLU(), nn::Linear(128, 10));
  }
  TANDEM_FAIL("--model must be 'mlp' or 'cnn' but is '", kind, "'");
}

std::unique_ptr<nn::Optimizer> MakeOptimizer(const std::string& kind, nn::Module& model,
                                             double lr) {
  TANDEM_CHECK(lr > 0, "--lr must be positive but is ", lr);
  if (kind == "sgd") {
    return std::make_unique<nn::SGD>(model.parameters(), nn::SGDOptions(lr).momentum(0.9));
  }
  if (kind == "adam") return std::make_unique<nn::Adam>(model.parameters(), nn::AdamOptions(lr));
  TANDEM_FAIL("--optimizer must be 'sgd' or 'adam' but is '", kind, "'");
}

// Fraction of the test set classified correctly, in evaluation mode without a graph.
double Evaluate(nn::Sequential& model, data::DataLoader& test_loader) {
  NoGradGuard no_grad;
  model.eval();
  int64_t correct = 0, total = 0;
  for (data::Batch& batch : test_loader) {
    Tensor predicted = argmax(model.forward(batch.data()), 1);
    correct += static_cast<int64_t>(sum(eq(predicted, batch.target())).item());
    total += batch.target().size(0);
  }
  model.train();
  return total == 0 ? 0.0 : static_cast<double>(correct) / total;
}

int Run() {
  const Device device = Device::Parse(absl::GetFlag(FLAGS_device));
  if (device.is_cpu()) SetCpuDeviceCount(device.index() + 1);
  CheckAvailable(device);
  const int epochs = absl::GetFlag(FLAGS_epochs);
  const int batch_size = absl::GetFlag(FLAGS_batch_size);
  TANDEM_CHECK(epochs >= 1, "--epochs must be at least 1 but is ", epochs);
  TANDEM_CHECK(batch_size >= 1, "--batch_size must be at least 1 but is ", batch_size);
  manual_seed(absl::GetFlag(FLAGS_seed));

  const std::string root = absl::GetFlag(FLAGS_data_dir);
  const auto options = data::FashionMnistOptions().normalize();
  auto train_set =
      std::make_shared<data::FashionMnist>(root, data::FashionMnist::Split::kTrain, options);
  auto test_set =
      std::make_shared<data::FashionMnist>(root, data::FashionMnist::Split::kTest, options);
  data::DataLoader train_loader(train_set, data::DataLoaderOptions()
                                               .batch_size(batch_size)
                                               .shuffle(true)
                                               .seed(absl::GetFlag(FLAGS_seed))
                                               .num_workers(absl::GetFlag(FLAGS_workers))
                                               .device(device));
  data::DataLoader test_loader(test_set, data::DataLoaderOptions()
                                             .batch_size(1000)
                                             .num_workers(absl::GetFlag(FLAGS_workers))
                                             .device(device));

  auto model = MakeModel(absl::GetFlag(FLAGS_model));
  model->to(device);
  auto optimizer = MakeOptimizer(absl::GetFlag(FLAGS_optimizer), *model, absl::GetFlag(FLAGS_lr));
  nn::CrossEntropyLoss criterion;

  std::cout << "Fashion-MNIST: " << train_set->size() << " training and " << test_set->size()
            << " test images from " << root << "\n"
            << "Device " << device << " (" << (device.is_cpu() ? CpuThreadsPerDevice() : 1)
            << (device.is_cpu() ? " thread(s))" : ")") << ", batch " << batch_size << ", "
            << absl::GetFlag(FLAGS_optimizer) << " lr " << absl::GetFlag(FLAGS_lr) << "\n"
            << *model << "\n\n";

  struct EpochResult {
    double loss, train_accuracy, test_accuracy, seconds, samples_per_second;
  };
  std::vector<EpochResult> results;
  const int64_t steps = static_cast<int64_t>(train_loader.size());
  const int64_t report_every = std::max<int64_t>(1, steps / 10);
  const auto run_start = Clock::now();
  for (int epoch = 1; epoch <= epochs; ++epoch) {
    const auto epoch_start = Clock::now();
    double loss_sum = 0;
    int64_t correct = 0, seen = 0, step = 0;
    for (data::Batch& batch : train_loader) {
      Tensor logits = model->forward(batch.data());
      Tensor loss = criterion.forward(logits, batch.target());
      optimizer->zero_grad();
      loss.backward();
      optimizer->step();

      const int64_t n = batch.target().size(0);
      loss_sum += loss.item() * n;
      {
        NoGradGuard no_grad;
        correct += static_cast<int64_t>(sum(eq(argmax(logits, 1), batch.target())).item());
      }
      seen += n;
      if (++step % report_every == 0 || step == steps) {
        std::printf("epoch %d/%d [%4lld/%lld]  loss %.4f  train acc %5.1f%%  %7.0f samples/s\n",
                    epoch, epochs, static_cast<long long>(step), static_cast<long long>(steps),
                    loss_sum / seen, 100.0 * correct / seen, seen / SecondsSince(epoch_start));
        std::fflush(stdout);
      }
    }
    const double seconds = SecondsSince(epoch_start);
    const double test_accuracy = Evaluate(*model, test_loader);
    results.push_back({loss_sum / seen, static_cast<double>(correct) / seen, test_accuracy, seconds,
                       seen / seconds});
    std::printf("epoch %d/%d done in %.1f s: test accuracy %.2f%%\n\n", epoch, epochs, seconds,
                100.0 * test_accuracy);
  }

  std::printf("Summary (%s on %s, %.1f s in all)\n", absl::GetFlag(FLAGS_model).c_str(),
              device.ToString().c_str(), SecondsSince(run_start));
  std::printf("  epoch   train loss   train acc   test acc   seconds   samples/s\n");
  for (size_t i = 0; i < results.size(); ++i) {
    const EpochResult& r = results[i];
    std::printf("  %5zu   %10.4f   %8.2f%%   %7.2f%%   %7.1f   %9.0f\n", i + 1, r.loss,
                100.0 * r.train_accuracy, 100.0 * r.test_accuracy, r.seconds, r.samples_per_second);
  }
  const std::string save = absl::GetFlag(FLAGS_save);
  if (!save.empty()) {
    nn::SaveCheckpoint(*model, save);
    std::printf("Checkpoint written to %s\n", save.c_str());
  }
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Trains a classifier on Fashion-MNIST.\n  train --device=cpu:0 --epochs=3 --model=mlp");
  absl::ParseCommandLine(argc, argv);
  try {
    return tandem::Run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train: %s\n", e.what());
    return 1;
  }
}
