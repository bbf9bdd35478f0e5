// libtorch_train_step: the train_step benchmark's MLP step in libtorch (PyTorch's C++ API),
// for a side-by-side comparison with Tandem (tools/bench/compare_libtorch.sh builds and runs
// both). Not part of the Bazel build: libtorch is a large optional Debian package.
//
//   g++ -O2 -std=c++17 libtorch_train_step.cc -I/usr/include/torch/csrc/api/include \
//       -ltorch -ltorch_cpu -lc10 -o libtorch_train_step
//   ./libtorch_train_step 256 2 50 5      (batch, threads, timed steps, warm-up steps)
//
// A step is what train_step times: forward (784-256-128-10 MLP with ReLU), cross-entropy,
// zero_grad, backward, SGD (lr 0.01, momentum 0.9), and reading the loss back. It prints
// the median, p10 and p90 of the step times and a JSON line.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

double Quantile(std::vector<double> values, double q) {
  std::sort(values.begin(), values.end());
  const size_t rank = static_cast<size_t>(q * (values.size() - 1) + 0.5);
  return values.at(std::min(rank, values.size() - 1));
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t batch = argc > 1 ? std::atoll(argv[1]) : 256;
  const int threads = argc > 2 ? std::atoi(argv[2]) : 2;
  const int steps = argc > 3 ? std::atoi(argv[3]) : 50;
  const int warmup = argc > 4 ? std::atoi(argv[4]) : 5;
  if (batch < 1 || threads < 1 || steps < 1 || warmup < 0) {
    std::fprintf(stderr,
                 "usage: libtorch_train_step [batch >= 1] [threads >= 1] [steps >= 1] "
                 "[warmup >= 0]\n");
    return 1;
  }
  torch::set_num_threads(threads);
  torch::manual_seed(1);
  torch::nn::Sequential model(torch::nn::Flatten(), torch::nn::Linear(784, 256), torch::nn::ReLU(),
                              torch::nn::Linear(256, 128), torch::nn::ReLU(),
                              torch::nn::Linear(128, 10));
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  const torch::Tensor x = torch::randn({batch, 1, 28, 28});
  std::vector<int64_t> labels(batch);
  for (int64_t i = 0; i < batch; ++i) labels[i] = (i * 7) % 10;
  const torch::Tensor y = torch::tensor(labels, torch::kInt64);

  auto step = [&] {
    torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(x), y);
    optimizer.zero_grad();
    loss.backward();
    optimizer.step();
    return loss.item<double>();
  };
  for (int i = 0; i < warmup; ++i) step();
  std::vector<double> ms;
  for (int i = 0; i < steps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    step();
    ms.push_back(1e3 *
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  const double median = Quantile(ms, 0.5);
  std::printf(
      "libtorch %s: mlp, batch %lld, %d thread%s: median %.2f ms  p10 %.2f ms  "
      "p90 %.2f ms\n",
      TORCH_VERSION, static_cast<long long>(batch), threads, threads == 1 ? "" : "s", median,
      Quantile(ms, 0.1), Quantile(ms, 0.9));
  std::printf(
      "{\"benchmark\":\"libtorch_train_step\",\"model\":\"mlp\",\"batch_size\":%lld,"
      "\"threads\":%d,\"steps\":%d,\"step_ms_median\":%.3f,\"step_ms_p90\":%.3f}\n",
      static_cast<long long>(batch), threads, steps, median, Quantile(ms, 0.9));
  return 0;
}
