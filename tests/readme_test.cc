// Keeps README.md's "Data parallelism" example honest: the code between the markers below is
// compiled and run here, and the test fails if the README's code block no longer shows exactly
// these lines (after its #include), so the two cannot drift apart.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "nn/nn.h"
#include "parallel/parallel.h"
#include "tensor/tensor.h"

namespace tandem {
namespace {

std::vector<std::string> ReadLines(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path << " (a data dependency of this test)";
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// The lines of the first ```c++ block after `heading`, without its #include and blank lines.
std::vector<std::string> ReadmeExample(const std::string& heading) {
  const std::vector<std::string> lines = ReadLines("README.md");
  std::vector<std::string> block;
  bool in_section = false, in_block = false;
  for (const std::string& line : lines) {
    if (line == heading) in_section = true;
    if (!in_section) continue;
    if (!in_block && line == "```c++") {
      in_block = true;
    } else if (in_block && line == "```") {
      break;
    } else if (in_block && !line.empty() && line.rfind("#include", 0) != 0) {
      block.push_back(line);
    }
  }
  return block;
}

// The lines of this file between the markers, without their two-space indentation.
std::vector<std::string> ThisTestsExample() {
  const std::vector<std::string> lines = ReadLines("tests/readme_test.cc");
  std::vector<std::string> block;
  bool in_block = false;
  for (const std::string& line : lines) {
    if (line == "  // README example begins") {
      in_block = true;
    } else if (line == "  // README example ends") {
      break;
    } else if (in_block && !line.empty()) {
      block.push_back(line.substr(std::min<size_t>(2, line.size())));
    }
  }
  return block;
}

TEST(ReadmeTest, DataParallelExampleRunsAndPrintsLikePyTorch) {
  SetCpuDeviceCount(2);
  // clang-format off
  // README example begins
  auto model = std::make_shared<nn::Sequential>(nn::Linear(784, 256), nn::ReLU(),
                                                nn::Linear(256, 10));   // on cpu:0
  auto dp = std::make_shared<parallel::DataParallel>(
      model, std::vector<Device>{Device::Cpu(0), Device::Cpu(1)});
  nn::SGD optimizer(model->parameters(), nn::SGDOptions(0.1).momentum(0.9));
  nn::CrossEntropyLoss criterion;
  Tensor x = randn({64, 784});
  Tensor y = from_vector(std::vector<int64_t>(64, 3), {64});   // int64 class labels
  Tensor loss = dp->forward_loss(criterion, x, y);   // or criterion.forward(dp->forward(x), y)
  optimizer.zero_grad();
  loss.backward();                                   // model's .grad: the sum over replicas
  optimizer.step();
  std::cout << *dp;   // DataParallel(\n  (module): Sequential(...)\n)
  // README example ends
  // clang-format on

  // One step on a single repeated label must lower the loss on the same batch.
  EXPECT_LT(criterion.forward(dp->forward(x), y).item(), loss.item());
  std::ostringstream printed;
  printed << *dp;
  EXPECT_EQ(printed.str(),
            "DataParallel(\n"
            "  (module): Sequential(\n"
            "    (0): Linear(in_features=784, out_features=256, bias=True)\n"
            "    (1): ReLU()\n"
            "    (2): Linear(in_features=256, out_features=10, bias=True)\n"
            "  )\n"
            ")");
}

TEST(ReadmeTest, TheReadmeShowsTheCodeThisTestRuns) {
  const std::vector<std::string> readme = ReadmeExample("## Data parallelism");
  const std::vector<std::string> tested = ThisTestsExample();
  ASSERT_FALSE(tested.empty()) << "the markers in tests/readme_test.cc are gone";
  EXPECT_EQ(readme, tested) << "README.md's Data parallelism example and the code "
                               "tests/readme_test.cc runs differ: change both together";
}

}  // namespace
}  // namespace tandem
