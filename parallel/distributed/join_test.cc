// Runs as an MPI job (mpi_test.sh, 2 and 3 ranks). Rank r trains on 3 + r batches under a Join,
// with SGD or with ZeroRedundancyOptimizer over SGD; the oracle is one process taking the same
// steps: at step t the gradient is the sum over the ranks that still have a batch, divided by
// the world size.
#include "parallel/distributed/join.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "nn/nn.h"
#include "parallel/distributed/mpi_testing.h"
#include "parallel/distributed/zero_redundancy_optimizer.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace tandem::parallel::distributed {
namespace {

using ::testing::HasSubstr;
using testing::MaxAbsDiff;

class JoinTest : public MpiTest {};

// With a BatchNorm, so that the buffers' broadcast is shadowed too.
std::shared_ptr<nn::Sequential> MakeModel() {
  manual_seed(5);
  return std::make_shared<nn::Sequential>(nn::Linear(6, 8), nn::BatchNorm1d(8), nn::ReLU(),
                                          nn::Linear(8, 3));
}

struct Batch {
  Tensor x, y;
};

Batch BatchOf(int rank, int step) {
  Generator gen(1000 * rank + step);
  Tensor x = randn({4, 6}, {}, &gen);
  std::vector<int64_t> labels = {0, 1, 2, static_cast<int64_t>((rank + step) % 3)};
  return {x, from_vector(labels, {4})};
}

int BatchesOf(int rank) { return 3 + rank; }

TEST_F(JoinTest, RanksWithMoreBatchesTrainAsOneProcessOverTheSameBatches) {
  const int rank = TestGroup()->rank();
  const int world = TestGroup()->size();
  // The sharded optimizer (ZeRO-1) too: a shadowing rank's step takes part in the broadcasts of
  // the updated shares, which its owner sends.
  struct Case {
    bool bucket_view, zero;
  };
  for (const Case c : {Case{false, false}, Case{true, false}, Case{false, true}}) {
    SCOPED_TRACE(std::string(c.bucket_view ? "gradient_as_bucket_view" : "plain buckets") +
                 (c.zero ? ", ZeroRedundancyOptimizer" : ", SGD"));
    auto model = MakeModel();
    DistributedDataParallel ddp(
        model, TestGroup(),
        DistributedDataParallelOptions().gradient_as_bucket_view(c.bucket_view));
    const nn::SGDOptions sgd = nn::SGDOptions(0.1).momentum(0.9);
    std::unique_ptr<nn::Optimizer> owned =
        c.zero ? std::unique_ptr<nn::Optimizer>(std::make_unique<ZeroRedundancyOptimizer>(
                     model->parameters(), TestGroup(), MakeOptimizerFactory<nn::SGD>(sgd)))
               : std::make_unique<nn::SGD>(model->parameters(), sgd);
    nn::Optimizer& optimizer = *owned;
    int shadowed = 0;
    {
      Join join(ddp, [&] {
        optimizer.step();
        optimizer.zero_grad();
      });
      for (int step = 0; step < BatchesOf(rank); ++step) {
        const Batch b = BatchOf(rank, step);
        optimizer.zero_grad();
        cross_entropy(ddp.forward(b.x), b.y).backward();
        optimizer.step();
      }
      shadowed = join.Finish();
    }
    EXPECT_EQ(shadowed, BatchesOf(world - 1) - BatchesOf(rank));

    // One process: each step's gradient from every rank that still had a batch.
    auto reference = MakeModel();
    nn::SGD reference_optimizer(reference->parameters(), nn::SGDOptions(0.1).momentum(0.9));
    const std::vector<Tensor> params = reference->parameters();
    for (int step = 0; step < BatchesOf(world - 1); ++step) {
      std::vector<Tensor> sums(params.size());
      for (int r = 0; r < world; ++r) {
        if (step >= BatchesOf(r)) continue;
        reference->zero_grad();
        const Batch b = BatchOf(r, step);
        cross_entropy(reference->forward(b.x), b.y).backward();
        for (size_t i = 0; i < params.size(); ++i) {
          sums[i] = sums[i].defined() ? sums[i] + params[i].grad() : params[i].grad().clone();
        }
      }
      for (size_t i = 0; i < params.size(); ++i) {
        Tensor p = params[i];
        p.set_grad(sums[i] / static_cast<double>(world));
      }
      reference_optimizer.step();
    }
    const std::vector<nn::NamedTensor> got = model->named_parameters();
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_LE(MaxAbsDiff(got[i].value, params[i]), 1e-6) << got[i].name << " on rank " << rank;
      // And every rank holds the same values, to the bit.
      Tensor everyone = zeros({world * got[i].value.numel()});
      TestGroup()->allgather(everyone, got[i].value.detach().reshape({-1}).contiguous())->wait();
      for (int r = 1; r < world; ++r) {
        EXPECT_EQ(MaxAbsDiff(everyone.narrow(0, r * got[i].value.numel(), got[i].value.numel()),
                             everyone.narrow(0, 0, got[i].value.numel())),
                  0.0)
            << got[i].name << ": rank " << r << " differs from rank 0";
      }
    }
  }
}

TEST_F(JoinTest, FinishTwiceAndNestedJoinsAreClearErrors) {
  auto model = MakeModel();
  DistributedDataParallel ddp(model, TestGroup());
  Join join(ddp);
  EXPECT_THAT(testing::ErrorOf([&] { Join again(ddp); }), HasSubstr("already under a Join"));
  EXPECT_EQ(join.Finish(), 0);
  EXPECT_THAT(testing::ErrorOf([&] { join.Finish(); }), HasSubstr("Finish was called twice"));
}

}  // namespace
}  // namespace tandem::parallel::distributed
