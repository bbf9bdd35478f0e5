// Runs as an MPI job (mpi_test.sh, 2 and 3 ranks). The oracle is PyTorch's own assertion for
// SyncBatchNorm: rank r normalises r + 2 samples (batches of unequal sizes), and its output,
// input gradient and running statistics equal those of a plain BatchNorm over every rank's
// samples together (which every rank computes itself from the same seed), and the parameter
// gradients summed over the ranks equal the plain layer's. In float64, to 1e-12.
#include "parallel/distributed/sync_batch_norm.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "nn/nn.h"
#include "parallel/distributed/mpi_testing.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace tandem::parallel::distributed {
namespace {

using testing::ErrorOf;
using ::testing::HasSubstr;
using testing::MaxAbsDiff;

class SyncBatchNormTest : public MpiTest {};

constexpr double kTolerance = 1e-12;

// Rank r's rows of a batch in which rank q holds rows_of(q) rows: [offset, offset + rows).
struct Share {
  int64_t offset = 0, rows = 0, total = 0;
};
template <typename RowsOf>
Share ShareOf(int rank, int world, RowsOf rows_of) {
  Share s;
  for (int q = 0; q < world; ++q) {
    if (q < rank) s.offset += rows_of(q);
    s.total += rows_of(q);
  }
  s.rows = rows_of(rank);
  return s;
}

// A plain BatchNorm and a synchronized twin with the same (non-trivial) weight and bias, in
// float64.
template <typename Norm>
std::pair<std::shared_ptr<Norm>, std::shared_ptr<Norm>> Twins(int64_t channels) {
  auto plain = std::make_shared<Norm>(channels);
  auto synced = std::make_shared<Norm>(channels);
  plain->to(kFloat64);
  synced->to(kFloat64);
  Generator gen(11);
  const Tensor w = rand({channels}, TensorOptions().dtype(kFloat64), &gen) + 0.5;
  const Tensor b = randn({channels}, TensorOptions().dtype(kFloat64), &gen);
  NoGradGuard no_grad;
  for (const auto& norm : {plain, synced}) {
    norm->weight().copy_(w);
    norm->bias().copy_(b);
  }
  EXPECT_EQ(ConvertSyncBatchNorm(*synced, TestGroup()), 1);
  EXPECT_TRUE(synced->synchronized());
  return {plain, synced};
}

// Two training steps and an evaluation of batches shaped [rows, C, rest...], rank r holding
// rows_of(r) of them, against the plain layer over all of them.
template <typename Norm, typename RowsOf>
void ExpectSynchronizedMatchesTheWholeBatch(const Shape& rest, RowsOf rows_of) {
  const int rank = TestGroup()->rank(), world = TestGroup()->size();
  const Share share = ShareOf(rank, world, rows_of);
  const int64_t channels = rest[0];
  auto [plain, synced] = Twins<Norm>(channels);
  for (int step = 0; step < 3; ++step) {
    const bool training = step < 2;
    plain->train(training);
    synced->train(training);
    const std::string what = "rank " + std::to_string(rank) + " of " + std::to_string(world) +
                             ", step " + std::to_string(step);
    Shape shape = {share.total};
    shape.insert(shape.end(), rest.begin(), rest.end());
    Generator gen(100 + step);
    const Tensor all = randn(shape, TensorOptions().dtype(kFloat64), &gen) * 3.0 + 1.0;
    const Tensor upstream = randn(shape, TensorOptions().dtype(kFloat64), &gen);

    Tensor x_all = all.clone();
    x_all.set_requires_grad(true);
    const Tensor y_all = plain->forward(x_all);
    (y_all * upstream).sum().backward();

    Tensor x = all.narrow(0, share.offset, share.rows).clone();
    x.set_requires_grad(true);
    const Tensor y = synced->forward(x);
    (y * upstream.narrow(0, share.offset, share.rows)).sum().backward();

    EXPECT_LT(MaxAbsDiff(y, y_all.narrow(0, share.offset, share.rows)), kTolerance) << what;
    EXPECT_LT(MaxAbsDiff(x.grad(), x_all.grad().narrow(0, share.offset, share.rows)), kTolerance)
        << what;
    for (const char* name : {"weight", "bias"}) {
      const Tensor summed = AllReduceSum(synced->parameter(name).grad(), TestGroup());
      EXPECT_LT(MaxAbsDiff(summed, plain->parameter(name).grad()), kTolerance) << what << name;
    }
    EXPECT_LT(MaxAbsDiff(synced->running_mean(), plain->running_mean()), kTolerance) << what;
    EXPECT_LT(MaxAbsDiff(synced->running_var(), plain->running_var()), kTolerance) << what;
    EXPECT_EQ(synced->num_batches_tracked().template item<int64_t>(),
              plain->num_batches_tracked().template item<int64_t>())
        << what;
    plain->zero_grad();
    synced->zero_grad();
  }
}

TEST_F(SyncBatchNormTest, BatchNorm2dOverUnequalBatchesMatchesTheWholeBatch) {
  ExpectSynchronizedMatchesTheWholeBatch<nn::BatchNorm2d>({3, 4, 5}, [](int r) { return r + 2; });
}

TEST_F(SyncBatchNormTest, BatchNorm1dMatchesTheWholeBatch) {
  ExpectSynchronizedMatchesTheWholeBatch<nn::BatchNorm1d>({6}, [](int r) { return r + 2; });
  ExpectSynchronizedMatchesTheWholeBatch<nn::BatchNorm1d>({4, 7}, [](int r) { return 3 - r % 2; });
}

// One sample on rank 0 is no batch for a plain BatchNorm, but the ranks' samples together are.
TEST_F(SyncBatchNormTest, OneSampleOnARankIsEnoughTogether) {
  ExpectSynchronizedMatchesTheWholeBatch<nn::BatchNorm2d>({2, 3, 3}, [](int r) { return r + 1; });
}

TEST_F(SyncBatchNormTest, ConvertsEveryBatchNormOfAModelAndSaysHowMany) {
  nn::Sequential model(nn::Conv2d(nn::Conv2dOptions(1, 4, 3)), nn::BatchNorm2d(4), nn::ReLU(),
                       nn::Flatten(), nn::Linear(4, 3), nn::BatchNorm1d(3));
  EXPECT_EQ(ConvertSyncBatchNorm(model, TestGroup()), 2);
  nn::Linear alone(2, 2);
  EXPECT_EQ(ConvertSyncBatchNorm(alone, TestGroup()), 0);
  EXPECT_THAT(ErrorOf([&] { ConvertSyncBatchNorm(model, nullptr); }),
              HasSubstr("expected a process group"));
}

// Every rank gets every rank's sum, and each rank's gradient is the sum of the output
// gradients.
TEST_F(SyncBatchNormTest, AllReduceSumIsDifferentiable) {
  const int rank = TestGroup()->rank(), world = TestGroup()->size();
  Tensor x = full({3}, rank + 1.0, TensorOptions().dtype(kFloat64));
  x.set_requires_grad(true);
  const Tensor y = AllReduceSum(x, TestGroup());
  EXPECT_EQ(y.to_vector<double>(), std::vector<double>(3, world * (world + 1) / 2.0));
  (y * (rank + 1.0)).sum().backward();
  EXPECT_EQ(x.grad().to_vector<double>(), std::vector<double>(3, world * (world + 1) / 2.0));
}

}  // namespace
}  // namespace tandem::parallel::distributed
