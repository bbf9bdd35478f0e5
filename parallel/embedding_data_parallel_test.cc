// nn::Embedding's max_norm, norm_type and scale_grad_by_freq through replicate and
// DataParallel: every replica keeps the options; each renormalises, in its own copy of the
// weight, the rows its chunk looks up (replica 0's writes reach the module, the others' are
// dropped, as PyTorch's replicas) and divides its gradients by the counts in its own chunk,
// before the reduce-add sums the replicas' gradients.
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <vector>

#include "nn/nn.h"
#include "parallel/data_parallel.h"
#include "parallel/replicate.h"
#include "tensor/testing.h"

namespace tandem::parallel {
namespace {

using ::tandem::testing::MaxAbsDiff;

class EmbeddingDataParallelTest : public ::testing::Test {
 protected:
  void SetUp() override { SetCpuDeviceCount(2); }
};

// Rows of 2-norm 5, 0.5, 10, 2, 0.
std::shared_ptr<nn::Embedding> BoundedEmbedding() {
  auto embed = std::make_shared<nn::Embedding>(
      nn::EmbeddingOptions(5, 2).max_norm(1.0).norm_type(2.0).scale_grad_by_freq(true));
  NoGradGuard no_grad;
  embed->weight().copy_(
      from_vector(std::vector<float>{3, 4, 0.3f, 0.4f, 6, 8, 0, 2, 0, 0}, {5, 2}));
  return embed;
}

TEST_F(EmbeddingDataParallelTest, ReplicasKeepTheOptions) {
  std::shared_ptr<nn::Embedding> embed = BoundedEmbedding();
  for (const std::shared_ptr<nn::Module>& replica : replicate(embed, CpuDevices(2))) {
    auto copy = std::dynamic_pointer_cast<nn::Embedding>(replica);
    ASSERT_NE(copy, nullptr);
    EXPECT_EQ(copy->ToString(), "Embedding(5, 2, max_norm=1.0, scale_grad_by_freq=True)");
    EXPECT_EQ(copy->options().max_norm(), std::optional<double>(1.0));
    EXPECT_EQ(copy->options().norm_type(), 2.0);
    EXPECT_TRUE(copy->options().scale_grad_by_freq());
  }
}

TEST_F(EmbeddingDataParallelTest, EachReplicaRenormalisesAndScalesByItsOwnChunk) {
  std::shared_ptr<nn::Embedding> embed = BoundedEmbedding();
  DataParallel dp(embed, CpuDevices(2));
  // cpu:0 looks up rows 0, 0, 1; cpu:1 rows 0, 2, 3.
  Tensor ids = from_vector(std::vector<int64_t>{0, 0, 1, 0, 2, 3}, {6});
  Tensor out = dp.forward(ids);
  // Every looked-up row over the bound comes out scaled to it: [3, 4] / 5, [6, 8] / 10,
  // [0, 2] / 2 (up to the 1e-7 in the divisor); row 1 (norm 0.5) as it is.
  const std::vector<float> expected = {0.6f, 0.8f, 0.6f, 0.8f, 0.3f, 0.4f,
                                       0.6f, 0.8f, 0.6f, 0.8f, 0.0f, 1.0f};
  EXPECT_LT(MaxAbsDiff(out, from_vector(expected, {6, 2})), 1e-6);
  // Replica 0's renormalisation of row 0 reached the module; replica 1's of rows 2 and 3 did
  // not.
  const std::vector<float> weight = embed->weight().to_vector<float>();
  EXPECT_NEAR(weight[0], 0.6f, 1e-6);
  EXPECT_NEAR(weight[1], 0.8f, 1e-6);
  EXPECT_EQ(std::vector<float>(weight.begin() + 2, weight.end()),
            (std::vector<float>{0.3f, 0.4f, 6, 8, 0, 2, 0, 0}));
  // Row 0's gradient: cpu:0's two occurrences over their count (2), plus cpu:1's one.
  Tensor upstream = randn({6, 2});
  out.backward(upstream);
  const std::vector<float> u = upstream.to_vector<float>();
  const std::vector<float> g = embed->weight().grad().to_vector<float>();
  for (int d = 0; d < 2; ++d) {
    EXPECT_NEAR(g[0 * 2 + d], (u[0 * 2 + d] + u[1 * 2 + d]) / 2 + u[3 * 2 + d], 1e-6);
    EXPECT_NEAR(g[1 * 2 + d], u[2 * 2 + d], 1e-6);
    EXPECT_NEAR(g[2 * 2 + d], u[4 * 2 + d], 1e-6);
    EXPECT_NEAR(g[3 * 2 + d], u[5 * 2 + d], 1e-6);
    EXPECT_EQ(g[4 * 2 + d], 0.0f);
  }
}

}  // namespace
}  // namespace tandem::parallel
