// Runs as an MPI job (mpi_test.sh, 2 and 3 ranks): every rank runs every test, in order.
// The oracle is one process training the same model on every rank's samples at once.
#include "parallel/distributed/distributed_data_parallel.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "nn/nn.h"
#include "parallel/distributed/mpi_testing.h"
#include "parallel/distributed/process_group_mpi.h"
#include "tensor/runtime/allocator.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace tandem::parallel::distributed {
namespace {

using ::testing::HasSubstr;

// Every test needs the MPI job that mpi_test.sh starts; run alone, the binary skips them.
class DistributedDataParallelTest : public MpiTest {};

constexpr int64_t kPerRank = 8;
constexpr int64_t kIn = 6;
constexpr int64_t kClasses = 3;

std::shared_ptr<ProcessGroupMpi> Group() { return TestGroup(); }

std::shared_ptr<nn::Sequential> MakeModel(uint64_t seed, int64_t hidden = 5) {
  manual_seed(seed);
  return std::make_shared<nn::Sequential>(nn::Linear(kIn, hidden), nn::ReLU(),
                                          nn::Linear(hidden, kClasses));
}

// The whole job's samples of one step (the same on every rank), and one rank's rows.
struct Data {
  Tensor x, y;
  Data Rows(int64_t start, int64_t count) const {
    return Data{x.narrow(0, start, count).contiguous(), y.narrow(0, start, count).contiguous()};
  }
};
Data MakeData(int world, uint64_t step) {
  Generator gen(1000 + step);
  const int64_t n = kPerRank * world;
  Tensor x = randn({n, kIn}, {}, &gen);
  std::vector<int64_t> labels(n);
  for (int64_t i = 0; i < n; ++i) labels[i] = (i * 7 + static_cast<int64_t>(step)) % kClasses;
  return Data{x, from_vector(labels, {n})};
}

void ExpectGradsClose(const nn::Module& got, const nn::Module& want, double tolerance,
                      const std::string& what) {
  std::vector<nn::NamedTensor> g = got.named_parameters();
  std::vector<nn::NamedTensor> w = want.named_parameters();
  ASSERT_EQ(g.size(), w.size());
  for (size_t i = 0; i < g.size(); ++i) {
    ASSERT_TRUE(g[i].value.grad().defined()) << what << ": " << g[i].name << " has no gradient";
    EXPECT_LT(testing::MaxAbsDiff(g[i].value.grad(), w[i].value.grad()), tolerance)
        << what << ": " << g[i].name;
  }
}

void ExpectParamsClose(const nn::Module& got, const nn::Module& want, double tolerance,
                       const std::string& what) {
  std::vector<nn::NamedTensor> g = got.named_parameters();
  std::vector<nn::NamedTensor> w = want.named_parameters();
  ASSERT_EQ(g.size(), w.size());
  for (size_t i = 0; i < g.size(); ++i) {
    EXPECT_LE(testing::MaxAbsDiff(g[i].value, w[i].value), tolerance) << what << ": " << g[i].name;
  }
}

TEST_F(DistributedDataParallelTest, ConstructionCopiesRankZerosParameters) {
  auto group = Group();
  auto model = MakeModel(1 + group->rank());  // different on every rank
  DistributedDataParallel ddp(model, group);
  ExpectParamsClose(*model, *MakeModel(1), 0.0, "after construction");
  EXPECT_EQ(ddp.bucket_parameter_names().size(), 1u);  // 25 MB hold this model
  std::ostringstream printed;
  printed << ddp;
  EXPECT_THAT(printed.str(), HasSubstr("DistributedDataParallel(\n  (module): Sequential("));
}

// 8 samples on each of N ranks give, after backward, the gradients of one process on all 8N.
TEST_F(DistributedDataParallelTest, GradientsEqualOneProcessOnAllSamples) {
  auto group = Group();
  const int world = group->size();
  for (double cap_mb : {25.0, 0.00001}) {  // one bucket; one bucket per parameter
    auto model = MakeModel(7 + group->rank());
    DistributedDataParallel ddp(model, group,
                                DistributedDataParallelOptions().bucket_cap_mb(cap_mb));
    auto reference = MakeModel(7);
    const Data all = MakeData(world, 0);
    const Data mine = all.Rows(group->rank() * kPerRank, kPerRank);
    cross_entropy(ddp.forward(mine.x), mine.y).backward();
    cross_entropy(reference->forward(all.x), all.y).backward();
    ExpectGradsClose(*model, *reference, 1e-5, "bucket_cap_mb " + std::to_string(cap_mb));
  }
}

// A gradient penalty on the input (WGAN-GP's: the critic's gradient with respect to each
// sample, through autograd::grad with create_graph) on 8 samples per rank equals one process's
// on all 8N. The first-order pass accumulates nothing, so the reducer's hooks fire only in the
// final backward (as PyTorch's DDP with torch.autograd.grad); a hook that fired in the first
// pass would fail the final one ("received a gradient twice") or its averages.
TEST_F(DistributedDataParallelTest, AnInputGradientPenaltyWithCreateGraphEqualsOneProcess) {
  auto group = Group();
  const int world = group->size();
  const auto make = [](uint64_t seed) {
    manual_seed(seed);
    return std::make_shared<nn::Sequential>(nn::Linear(kIn, 5), nn::Tanh(), nn::Linear(5, 1));
  };
  auto model = make(11 + group->rank());
  DistributedDataParallel ddp(model, group);
  auto reference = make(11);
  const Data all = MakeData(world, 3);
  const Data mine = all.Rows(group->rank() * kPerRank, kPerRank);
  const auto critic_loss = [](const std::function<Tensor(const Tensor&)>& critic,
                              const nn::Module& module, const Tensor& input) {
    Tensor x = input.detach().clone();
    x.set_requires_grad(true);
    const Tensor out = critic(x);
    const Tensor g = autograd::grad({out.sum()}, {x}, {}, /*create_graph=*/true)[0];
    for (const Tensor& p : module.parameters()) EXPECT_FALSE(p.grad().defined());
    const Tensor penalty = square(sqrt(square(g).sum({1})) - 1.0).mean();
    return add(out.mean(), mul(penalty, 10.0));
  };
  critic_loss([&](const Tensor& x) { return ddp.forward(x); }, *model, mine.x).backward();
  critic_loss([&](const Tensor& x) { return reference->forward(x); }, *reference, all.x).backward();
  ExpectGradsClose(*model, *reference, 1e-5, "gradient penalty");
}

// gradient_compression(kBFloat16 or kFloat16): each gradient is round(mean of every rank's
// gradient rounded to the dtype), the mean taken in float32 (as ProcessGroupMpi's 16-bit
// all-reduce does), exactly; and so within the dtype's precision of the float32 all-reduce.
TEST_F(DistributedDataParallelTest, CompressedGradientsEqualTheFloat32AllreduceWithinTolerance) {
  auto group = Group();
  const int world = group->size();
  for (DType dtype : {kBFloat16, kFloat16}) {
    for (double cap_mb : {25.0, 0.00001}) {
      SCOPED_TRACE(tandem::internal::Concat(DTypeName(dtype), ", bucket_cap_mb ", cap_mb));
      auto compressed_model = MakeModel(3);
      auto float_model = MakeModel(3);
      DistributedDataParallel compressed(
          compressed_model, group,
          DistributedDataParallelOptions().bucket_cap_mb(cap_mb).gradient_compression(dtype));
      DistributedDataParallel plain(float_model, group,
                                    DistributedDataParallelOptions().bucket_cap_mb(cap_mb));
      const Data all = MakeData(world, 2);
      const Data mine = all.Rows(group->rank() * kPerRank, kPerRank);
      cross_entropy(compressed.forward(mine.x), mine.y).backward();
      cross_entropy(plain.forward(mine.x), mine.y).backward();
      // Every rank's own gradients, computed here for all ranks.
      std::vector<std::vector<Tensor>> per_rank;
      for (int r = 0; r < world; ++r) {
        auto local = MakeModel(3);
        const Data rows = all.Rows(r * kPerRank, kPerRank);
        cross_entropy(local->forward(rows.x), rows.y).backward();
        per_rank.emplace_back();
        for (const Tensor& p : local->parameters()) per_rank.back().push_back(p.grad());
      }
      const std::vector<nn::NamedTensor> got = compressed_model->named_parameters();
      const std::vector<Tensor> want32 = float_model->parameters();
      const float factor = 1.0f / static_cast<float>(world);
      for (size_t k = 0; k < got.size(); ++k) {
        const Tensor grad = got[k].value.grad();
        ASSERT_TRUE(grad.defined()) << got[k].name;
        EXPECT_EQ(grad.dtype(), kFloat32) << got[k].name;
        Tensor sum = zeros(grad.shape());
        for (int r = 0; r < world; ++r) sum = sum + per_rank[r][k].to(dtype).to(kFloat32);
        const Tensor want = (sum * static_cast<double>(factor)).to(dtype).to(kFloat32);
        EXPECT_EQ(grad.reshape({-1}).to_vector<float>(), want.reshape({-1}).to_vector<float>())
            << got[k].name;
        // Against the float32 all-reduce: each rank's gradient rounded (half the dtype's
        // epsilon, 2^-8 for bfloat16, 2^-11 for float16, of its largest element), then the
        // mean rounded once more.
        const Tensor exact = want32[k].grad();
        double largest = 0;
        for (int r = 0; r < world; ++r) {
          largest = std::max(largest, amax(abs(per_rank[r][k]).reshape({-1}), 0).item());
        }
        const double epsilon = dtype == kBFloat16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
        EXPECT_LE(testing::MaxAbsDiff(grad, exact), epsilon * largest + 1e-6) << got[k].name;
        if (dtype == kBFloat16) {
          EXPECT_GT(testing::MaxAbsDiff(grad, exact), 0.0) << got[k].name << ": not compressed";
        }
      }
    }
  }
}

TEST_F(DistributedDataParallelTest, CompressedTrainingTracksFloat32) {
  auto group = Group();
  const int world = group->size();
  auto model = MakeModel(11);
  auto reference = MakeModel(11);
  DistributedDataParallel ddp(model, group,
                              DistributedDataParallelOptions().gradient_compression(kBFloat16));
  DistributedDataParallel reference_ddp(reference, group);
  nn::SGD optimizer(model->parameters(), nn::SGDOptions(0.1));
  nn::SGD reference_optimizer(reference->parameters(), nn::SGDOptions(0.1));
  for (int step = 0; step < 10; ++step) {
    const Data mine = MakeData(world, 200 + step).Rows(group->rank() * kPerRank, kPerRank);
    optimizer.zero_grad();
    cross_entropy(ddp.forward(mine.x), mine.y).backward();
    optimizer.step();
    reference_optimizer.zero_grad();
    cross_entropy(reference_ddp.forward(mine.x), mine.y).backward();
    reference_optimizer.step();
  }
  // Parameters of magnitude <= ~1 after 10 steps of lr 0.1: bfloat16 gradients move them by
  // well under 1e-2.
  ExpectParamsClose(*model, *reference, 1e-2, "after 10 compressed steps");
  // And the ranks agree exactly.
  Tensor mine = model->parameters()[0].detach().contiguous();
  Tensor all = zeros({world * mine.numel()});
  group->allgather(all, mine.reshape({-1}))->wait();
  for (int r = 1; r < world; ++r) {
    EXPECT_EQ(all.narrow(0, r * mine.numel(), mine.numel()).to_vector<float>(),
              all.narrow(0, 0, mine.numel()).to_vector<float>());
  }
}

TEST_F(DistributedDataParallelTest, AWrongCompressionDtypeIsAClearError) {
  auto group = Group();
  for (DType dtype : {kInt32, kFloat64, kFloat32}) {
    EXPECT_THAT(testing::ErrorOf([&] {
                  DistributedDataParallel ddp(
                      MakeModel(1), group,
                      DistributedDataParallelOptions().gradient_compression(dtype));
                }),
                HasSubstr("gradient_compression must be bfloat16 or float16 (PyTorch's "
                          "bf16_compress_hook and fp16_compress_hook) but is " +
                          std::string(DTypeName(dtype))));
  }
}

TEST_F(DistributedDataParallelTest, RanksThatDisagreeOnOptionsAreRefusedOnEveryRank) {
  auto group = Group();
  const int last = group->size() - 1;
  const bool odd = group->rank() == last;
  auto options = DistributedDataParallelOptions();
  if (odd) options.gradient_compression(kBFloat16);
  const std::string error =
      testing::ErrorOf([&] { DistributedDataParallel ddp(MakeModel(1), group, options); });
  EXPECT_THAT(error, HasSubstr("ranks disagree on gradient_compression"));
  EXPECT_THAT(error, HasSubstr("bfloat16 on rank " + std::to_string(last)));
  EXPECT_THAT(error, HasSubstr("construct DistributedDataParallel with the same "
                               "DistributedDataParallelOptions on every rank"));
  // bucket_cap_mb decides the buckets: a difference is refused too.
  const std::string cap_error = testing::ErrorOf([&] {
    DistributedDataParallel ddp(MakeModel(1), group,
                                DistributedDataParallelOptions().bucket_cap_mb(odd ? 1.0 : 25.0));
  });
  EXPECT_THAT(cap_error, HasSubstr("ranks disagree on bucket_cap_mb"));
}

TEST_F(DistributedDataParallelTest, ReductionStatsTimeTheWaitAtTheEndOfBackward) {
  auto group = Group();
  auto model = MakeModel(5);
  DistributedDataParallel ddp(model, group,
                              DistributedDataParallelOptions().bucket_cap_mb(0.00001));
  const Data mine = MakeData(group->size(), 0).Rows(group->rank() * kPerRank, kPerRank);
  const auto before = std::chrono::steady_clock::now();
  cross_entropy(ddp.forward(mine.x), mine.y).backward();
  const auto after = std::chrono::steady_clock::now();
  const ReductionStats stats = ddp.last_reduction_stats();
  EXPECT_EQ(stats.buckets, 4);  // one per parameter
  EXPECT_GE(stats.communication_seconds, 0.0);
  EXPECT_LE(before, stats.backward_done);
  EXPECT_LE(stats.backward_done, stats.reduced);
  EXPECT_LE(stats.reduced, after);
  EXPECT_NEAR(stats.wait_seconds,
              std::chrono::duration<double>(stats.reduced - stats.backward_done).count(), 1e-9);
}

TEST_F(DistributedDataParallelTest, SmallBucketsHoldEveryParameterOnceInReverseOrder) {
  auto group = Group();
  auto model = MakeModel(3, /*hidden=*/20);  // 140 + 20 + 60 + 3 floats
  // 0.0002 MiB is 52 floats; a bucket closes once it holds that much, so in reverse order
  // 2.bias (3) and 2.weight (60) fill one, 0.bias (20) and 0.weight (120) the next.
  DistributedDataParallel ddp(model, group, DistributedDataParallelOptions().bucket_cap_mb(0.0002));
  std::vector<std::vector<std::string>> buckets = ddp.bucket_parameter_names();
  EXPECT_EQ(buckets, (std::vector<std::vector<std::string>>{{"2.bias", "2.weight"},
                                                            {"0.bias", "0.weight"}}));
  DistributedDataParallel small(model, group,
                                DistributedDataParallelOptions().bucket_cap_mb(0.00001));
  EXPECT_EQ(small.bucket_parameter_names().size(), 4u);
  // With the default 25 MB the first bucket still closes at 1 MiB (as in PyTorch).
  auto big = std::make_shared<nn::Sequential>(nn::Linear(512, 512), nn::Linear(512, 512),
                                              nn::Linear(512, 512));  // 1 MiB of weight each
  DistributedDataParallel defaults(big, group);
  EXPECT_EQ(defaults.bucket_parameter_names(),
            (std::vector<std::vector<std::string>>{{"2.bias", "2.weight"},
                                                   {"1.bias", "1.weight", "0.bias", "0.weight"}}));
}

// A float64 model is reduced in float64 (its buckets are float64, as PyTorch's): its gradients
// equal one process's on all samples to float64 precision, where float32 buckets miss by ~1e-8;
// under gradient_as_bucket_view .grad is a float64 view of the bucket.
TEST_F(DistributedDataParallelTest, AFloat64ModelIsReducedInFloat64) {
  auto group = Group();
  const int world = group->size();
  for (const auto& [cap_mb, view] : {std::pair{25.0, false}, {0.00001, false}, {25.0, true}}) {
    SCOPED_TRACE(tandem::internal::Concat("bucket_cap_mb ", cap_mb, ", as bucket view ", view));
    auto model = MakeModel(7 + group->rank());
    model->to(kFloat64);
    DistributedDataParallel ddp(
        model, group,
        DistributedDataParallelOptions().bucket_cap_mb(cap_mb).gradient_as_bucket_view(view));
    auto reference = MakeModel(7);
    reference->to(kFloat64);
    Data all = MakeData(world, 0);
    all.x = all.x.to(kFloat64);
    const Data mine = all.Rows(group->rank() * kPerRank, kPerRank);
    cross_entropy(ddp.forward(mine.x), mine.y).backward();
    cross_entropy(reference->forward(all.x), all.y).backward();
    for (const Tensor& p : model->parameters()) EXPECT_EQ(p.grad().dtype(), kFloat64);
    ExpectGradsClose(*model, *reference, 1e-12, "float64");
  }
}

// A bfloat16 model's buckets are bfloat16: 2 bytes a gradient go to the all-reduce (float32
// buckets sent 4), and each gradient is the float32 mean of every rank's bfloat16 gradient
// rounded once to bfloat16 (ProcessGroupMpi's 16-bit all-reduce sums in float32 and rounds
// once; NCCL would round each hop's partial sum): the float32-bucket result, rounded. The hook
// sees the bucket in its own dtype; without a hook DDP reduces it the same way, bit for bit.
TEST_F(DistributedDataParallelTest, ABFloat16ModelIsReducedInBFloat16) {
  auto group = Group();
  const int world = group->size();
  const auto make = [](uint64_t seed) {
    auto model = MakeModel(seed);
    model->to(kBFloat16);
    return model;
  };
  Data all = MakeData(world, 4);
  all.x = all.x.to(kBFloat16);
  const Data mine = all.Rows(group->rank() * kPerRank, kPerRank);
  // Every rank's own gradients, computed here for all ranks.
  std::vector<std::vector<Tensor>> per_rank;
  for (int r = 0; r < world; ++r) {
    auto local = make(3);
    const Data rows = all.Rows(r * kPerRank, kPerRank);
    cross_entropy(local->forward(rows.x), rows.y).backward();
    per_rank.emplace_back();
    for (const Tensor& p : local->parameters()) per_rank.back().push_back(p.grad());
  }
  const float factor = 1.0f / static_cast<float>(world);
  for (double cap_mb : {25.0, 0.00001}) {
    SCOPED_TRACE(tandem::internal::Concat("bucket_cap_mb ", cap_mb));
    const DistributedDataParallelOptions options =
        DistributedDataParallelOptions().bucket_cap_mb(cap_mb);
    auto plain_model = make(3);
    auto hooked_model = make(3);
    DistributedDataParallel plain(plain_model, group, options);
    DistributedDataParallel hooked(hooked_model, group, options);
    std::vector<DType> dtypes;
    int64_t bytes = 0;
    hooked.register_comm_hook(group, [&](ProcessGroup& g, GradBucket& bucket) {
      dtypes.push_back(bucket.buffer().dtype());
      bytes += bucket.buffer().numel() * static_cast<int64_t>(ElementSize(bucket.buffer().dtype()));
      return allreduce_hook(g, bucket);
    });
    cross_entropy(plain.forward(mine.x), mine.y).backward();
    cross_entropy(hooked.forward(mine.x), mine.y).backward();
    int64_t numel = 0;
    for (const Tensor& p : hooked_model->parameters()) numel += p.numel();
    EXPECT_EQ(bytes, 2 * numel) << "bytes all-reduced in one backward";
    EXPECT_EQ(dtypes, std::vector<DType>(plain.bucket_parameter_names().size(), kBFloat16));
    const std::vector<nn::NamedTensor> got = plain_model->named_parameters();
    const std::vector<Tensor> got_hooked = hooked_model->parameters();
    for (size_t k = 0; k < got.size(); ++k) {
      const Tensor grad = got[k].value.grad();
      ASSERT_TRUE(grad.defined()) << got[k].name;
      EXPECT_EQ(grad.dtype(), kBFloat16) << got[k].name;
      Tensor sum = zeros(grad.shape());
      for (int r = 0; r < world; ++r) sum = sum + per_rank[r][k].to(kFloat32);
      const Tensor want = (sum * static_cast<double>(factor)).to(kBFloat16).to(kFloat32);
      EXPECT_EQ(grad.to(kFloat32).reshape({-1}).to_vector<float>(),
                want.reshape({-1}).to_vector<float>())
          << got[k].name;
      EXPECT_EQ(got_hooked[k].grad().to(kFloat32).reshape({-1}).to_vector<float>(),
                want.reshape({-1}).to_vector<float>())
          << got[k].name << " (through allreduce_hook)";
    }
  }
}

// Three layers: float32, float64, float32 (each converts its input to its own dtype).
class MixedDtypes : public nn::Module {
 public:
  explicit MixedDtypes(uint64_t seed) : nn::Module("MixedDtypes") {
    manual_seed(seed);
    a_ = register_module("a", std::make_shared<nn::Linear>(kIn, 5));
    b_ = register_module("b", std::make_shared<nn::Linear>(5, 5));
    c_ = register_module("c", std::make_shared<nn::Linear>(5, kClasses));
    b_->to(kFloat64);
  }
  std::vector<Tensor> forward_tensors(const std::vector<Tensor>& inputs) override {
    Tensor h = tanh(a_->forward(inputs[0])).to(kFloat64);
    return {c_->forward(tanh(b_->forward(h)).to(kFloat32))};
  }
  Tensor forward(const Tensor& x) { return forward_tensors({x})[0]; }
  std::shared_ptr<nn::Linear> a_, b_, c_;
};

// Parameters of different dtypes never share a bucket (PyTorch's bucket assignment groups by
// dtype): the float32 layers around the float64 one share one bucket, the float64 layer gets
// its own, each reduced in its dtype, and the gradients equal one process's.
TEST_F(DistributedDataParallelTest, ParametersOfTwoDtypesGetABucketEach) {
  auto group = Group();
  const int world = group->size();
  auto model = std::make_shared<MixedDtypes>(5 + group->rank());
  DistributedDataParallel ddp(model, group);
  EXPECT_EQ(ddp.bucket_parameter_names(),
            (std::vector<std::vector<std::string>>{{"c.bias", "c.weight", "a.bias", "a.weight"},
                                                   {"b.bias", "b.weight"}}));
  std::vector<DType> dtypes;
  ddp.register_comm_hook(group, [&](ProcessGroup& g, GradBucket& bucket) {
    dtypes.push_back(bucket.buffer().dtype());
    return allreduce_hook(g, bucket);
  });
  auto reference = std::make_shared<MixedDtypes>(5);
  const Data all = MakeData(world, 5);
  const Data mine = all.Rows(group->rank() * kPerRank, kPerRank);
  cross_entropy(ddp.forward(mine.x), mine.y).backward();
  cross_entropy(reference->forward(all.x), all.y).backward();
  EXPECT_EQ(dtypes, (std::vector<DType>{kFloat32, kFloat64}));
  for (const nn::NamedTensor& p : model->named_parameters()) {
    EXPECT_EQ(p.value.grad().dtype(), p.value.dtype()) << p.name;
  }
  ExpectGradsClose(*model, *reference, 1e-5, "mixed dtypes");
  // Tiny buckets: one per parameter, whatever its dtype.
  DistributedDataParallel small(model, group,
                                DistributedDataParallelOptions().bucket_cap_mb(0.00001));
  EXPECT_EQ(small.bucket_parameter_names().size(), 6u);
}

TEST_F(DistributedDataParallelTest, TwentySgdStepsTrackOneProcess) {
  auto group = Group();
  const int world = group->size();
  auto model = MakeModel(11 + group->rank());
  DistributedDataParallel ddp(model, group,
                              DistributedDataParallelOptions().bucket_cap_mb(0.00001));
  auto reference = MakeModel(11);
  nn::SGD optimizer(model->parameters(), nn::SGDOptions(0.1).momentum(0.9));
  nn::SGD reference_optimizer(reference->parameters(), nn::SGDOptions(0.1).momentum(0.9));
  for (int step = 0; step < 20; ++step) {
    const Data all = MakeData(world, 100 + step);
    const Data mine = all.Rows(group->rank() * kPerRank, kPerRank);
    optimizer.zero_grad();
    cross_entropy(ddp.forward(mine.x), mine.y).backward();
    optimizer.step();
    reference_optimizer.zero_grad();
    cross_entropy(reference->forward(all.x), all.y).backward();
    reference_optimizer.step();
  }
  ExpectParamsClose(*model, *reference, 1e-4, "after 20 steps");
  // And the ranks agree exactly: they all applied the same averaged gradients.
  Tensor mine = model->parameters()[0].detach().contiguous();
  Tensor all = zeros({world * mine.numel()});
  group->allgather(all, mine.reshape({-1}))->wait();
  for (int r = 1; r < world; ++r) {
    EXPECT_EQ(all.narrow(0, r * mine.numel(), mine.numel()).to_vector<float>(),
              all.narrow(0, 0, mine.numel()).to_vector<float>());
  }
}

// Two micro-batches of 4 under no_sync and then without it equal one batch of 8.
TEST_F(DistributedDataParallelTest, NoSyncAccumulatesLocallyThenReducesTheSum) {
  auto group = Group();
  const int world = group->size();
  auto model = MakeModel(5);
  DistributedDataParallel ddp(model, group);
  const Data all = MakeData(world, 7);
  const Data mine = all.Rows(group->rank() * kPerRank, kPerRank);
  const Data first = mine.Rows(0, kPerRank / 2);
  const Data second = mine.Rows(kPerRank / 2, kPerRank / 2);
  {
    auto guard = ddp.no_sync();
    (cross_entropy(ddp.forward(first.x), first.y) * 0.5).backward();
  }
  // Nothing was reduced: the gradient is this rank's own.
  auto local = MakeModel(5);
  (cross_entropy(local->forward(first.x), first.y) * 0.5).backward();
  ExpectGradsClose(*model, *local, 1e-6, "inside no_sync");
  (cross_entropy(ddp.forward(second.x), second.y) * 0.5).backward();
  auto reference = MakeModel(5);
  cross_entropy(reference->forward(all.x), all.y).backward();
  ExpectGradsClose(*model, *reference, 1e-5, "after no_sync");
}

// A module whose forward may skip its `extra` layer.
class WithExtra : public nn::Module {
 public:
  explicit WithExtra(uint64_t seed) : nn::Module("WithExtra") {
    manual_seed(seed);
    main_ = register_module("main", std::make_shared<nn::Linear>(kIn, kClasses));
    extra_ = register_module("extra", std::make_shared<nn::Linear>(kIn, kClasses));
  }
  std::vector<Tensor> forward_tensors(const std::vector<Tensor>& inputs) override {
    Tensor out = main_->forward(inputs[0]);
    if (use_extra) out = out + extra_->forward(inputs[0]);
    return {out};
  }
  Tensor forward(const Tensor& x) { return forward_tensors({x})[0]; }
  bool use_extra = false;
  std::shared_ptr<nn::Linear> main_, extra_;
};

// gradient_as_bucket_view: .grad is a view of the bucket (the parameters of one bucket lie
// side by side in reverse order), the same numbers as without it through fresh gradients,
// accumulation into the view and no_sync, and a rank holds one gradient copy (4 bytes a
// parameter) less after backward.
TEST_F(DistributedDataParallelTest, GradientAsBucketViewAliasesTheBucketAndSavesACopy) {
  auto group = Group();
  const int world = group->size();
  const int rank = group->rank();
  auto viewed_model = MakeModel(21, 40);
  auto plain_model = MakeModel(21, 40);
  DistributedDataParallel viewed(viewed_model, group,
                                 DistributedDataParallelOptions().gradient_as_bucket_view(true));
  DistributedDataParallel plain(plain_model, group);
  nn::SGD viewed_sgd(viewed_model->parameters(), nn::SGDOptions(0.1).momentum(0.9));
  nn::SGD plain_sgd(plain_model->parameters(), nn::SGDOptions(0.1).momentum(0.9));
  const Device cpu = Device::Cpu(0);
  int64_t numel = 0;
  for (const Tensor& p : viewed_model->parameters()) numel += p.numel();
  for (int step = 0; step < 4; ++step) {
    const Data mine = MakeData(world, 300 + step).Rows(rank * kPerRank, kPerRank);
    // Step 2 accumulates into last step's gradients (no zero_grad), step 3 through no_sync.
    if (step != 2) {
      viewed_sgd.zero_grad();
      plain_sgd.zero_grad();
    }
    if (step == 3) {
      auto a = viewed.no_sync();
      auto b = plain.no_sync();
      cross_entropy(viewed.forward(mine.x), mine.y).backward();
      cross_entropy(plain.forward(mine.x), mine.y).backward();
    }
    const int64_t before = GetMemoryStats(cpu).in_use_bytes;
    cross_entropy(viewed.forward(mine.x), mine.y).backward();
    const int64_t viewed_bytes = GetMemoryStats(cpu).in_use_bytes - before;
    cross_entropy(plain.forward(mine.x), mine.y).backward();
    const int64_t plain_bytes = GetMemoryStats(cpu).in_use_bytes - before - viewed_bytes;
    if (step == 0) {
      EXPECT_EQ(plain_bytes - viewed_bytes, numel * 4) << "a gradient copy less";
    }
    ExpectGradsClose(*viewed_model, *plain_model, 1e-30, "step " + std::to_string(step));
    // One bucket here (bucket_cap_mb 25): the last parameter's gradient first, then backwards.
    const std::vector<Tensor> params = viewed_model->parameters();
    for (size_t i = params.size() - 1; i > 0; --i) {
      EXPECT_EQ(params[i].grad().data_ptr<float>() + params[i].numel(),
                params[i - 1].grad().data_ptr<float>())
          << "step " << step << ": parameter " << i - 1 << "'s gradient does not follow " << i
          << "'s in the bucket";
    }
    viewed_sgd.step();
    plain_sgd.step();
  }
  ExpectParamsClose(*viewed_model, *plain_model, 0.0, "after 4 steps");
  // With gradient_compression (a communication hook: the bucket stays float32 and the hook's
  // result is copied into it), .grad is the same view and holds the same numbers as without.
  auto both_model = MakeModel(22, 40);
  auto compressed_model = MakeModel(22, 40);
  DistributedDataParallel both(
      both_model, group,
      DistributedDataParallelOptions().gradient_as_bucket_view(true).gradient_compression(
          kBFloat16));
  DistributedDataParallel compressed(
      compressed_model, group, DistributedDataParallelOptions().gradient_compression(kBFloat16));
  const Data mine = MakeData(world, 310).Rows(rank * kPerRank, kPerRank);
  cross_entropy(both.forward(mine.x), mine.y).backward();
  cross_entropy(compressed.forward(mine.x), mine.y).backward();
  ExpectGradsClose(*both_model, *compressed_model, 1e-30, "compressed, as bucket view");
  const std::vector<Tensor> both_params = both_model->parameters();
  EXPECT_EQ(both_params[1].grad().data_ptr<float>() + both_params[1].numel(),
            both_params[0].grad().data_ptr<float>());
}

TEST_F(DistributedDataParallelTest, AnUnusedParameterIsAClearErrorWithoutFindUnusedParameters) {
  auto group = Group();
  auto model = std::make_shared<WithExtra>(2);
  DistributedDataParallel ddp(model, group,
                              DistributedDataParallelOptions().bucket_cap_mb(0.00001));
  const Data mine = MakeData(group->size(), 3).Rows(group->rank() * kPerRank, kPerRank);
  const std::string error =
      testing::ErrorOf([&] { cross_entropy(ddp.forward(mine.x), mine.y).backward(); });
  EXPECT_THAT(error, HasSubstr("2 parameter(s) got no gradient in this backward pass"));
  EXPECT_THAT(error, HasSubstr("extra.weight"));
  EXPECT_THAT(error, HasSubstr("find_unused_parameters(true)"));
  // The DDP recovers: with every parameter used the next step reduces normally.
  model->use_extra = true;
  model->zero_grad();
  cross_entropy(ddp.forward(mine.x), mine.y).backward();
  EXPECT_TRUE(model->extra_->parameters()[0].grad().defined());
}

TEST_F(DistributedDataParallelTest, FindUnusedParametersReducesWhatSomeRankUsed) {
  auto group = Group();
  const int world = group->size();
  const Data all = MakeData(world, 4);
  const Data mine = all.Rows(group->rank() * kPerRank, kPerRank);
  for (double cap_mb : {25.0, 0.00001}) {
    // Unused on every rank: .grad stays undefined, the rest is reduced.
    auto model = std::make_shared<WithExtra>(2);
    DistributedDataParallel ddp(
        model, group,
        DistributedDataParallelOptions().find_unused_parameters(true).bucket_cap_mb(cap_mb));
    cross_entropy(ddp.forward(mine.x), mine.y).backward();
    auto reference = std::make_shared<WithExtra>(2);
    cross_entropy(reference->forward(all.x), all.y).backward();
    EXPECT_LT(testing::MaxAbsDiff(model->main_->parameters()[0].grad(),
                                  reference->main_->parameters()[0].grad()),
              1e-5);
    EXPECT_FALSE(model->extra_->parameters()[0].grad().defined());

    // Used on rank 0 only: every rank gets rank 0's gradient divided by the world size.
    model->zero_grad();
    model->use_extra = group->rank() == 0;
    cross_entropy(ddp.forward(mine.x), mine.y).backward();
    auto rank0 = std::make_shared<WithExtra>(2);
    rank0->use_extra = true;
    const Data rows0 = all.Rows(0, kPerRank);
    (cross_entropy(rank0->forward(rows0.x), rows0.y) * (1.0 / world)).backward();
    ASSERT_TRUE(model->extra_->parameters()[0].grad().defined());
    EXPECT_LT(testing::MaxAbsDiff(model->extra_->parameters()[0].grad(),
                                  rank0->extra_->parameters()[0].grad()),
              1e-5);
  }
}

// Two layers with a pass-through op between them whose backward writes "between" into a log,
// as the gradient-accumulated hooks of the layers' weights write their names.
class TwoLayersWithAProbe : public nn::Module {
 public:
  TwoLayersWithAProbe() : nn::Module("TwoLayersWithAProbe") {
    manual_seed(6);
    first_ = register_module("first", std::make_shared<nn::Linear>(kIn, 5));
    second_ = register_module("second", std::make_shared<nn::Linear>(5, kClasses));
  }
  std::vector<Tensor> forward_tensors(const std::vector<Tensor>& inputs) override {
    Tensor hidden = first_->forward(inputs[0]);
    Tensor probed;
    {
      NoGradGuard no_grad;
      probed = hidden.clone();
    }
    std::vector<std::string>* log = &log_;
    RecordOp("Probe", {hidden}, probed, [log](const Tensor& grad) {
      log->push_back("between");
      return std::vector<Tensor>{grad};
    });
    return {second_->forward(probed)};
  }
  std::vector<std::string> log_;
  std::shared_ptr<nn::Linear> first_, second_;
};

// Overlap needs each bucket launched as soon as its layer's gradients are in, not at the end
// of backward: the second layer's weight gradient (its own bucket) must be ready before
// backward reaches the op below that layer, in every pass.
TEST_F(DistributedDataParallelTest, ALayersGradientIsReadyBeforeBackwardGoesBelowIt) {
  auto group = Group();
  auto model = std::make_shared<TwoLayersWithAProbe>();
  DistributedDataParallel ddp(model, group,
                              DistributedDataParallelOptions().bucket_cap_mb(0.00001));
  for (const char* name : {"first.weight", "second.weight"}) {
    for (const nn::NamedTensor& p : model->named_parameters()) {
      if (p.name != name) continue;
      AddGradAccumulatedHook(p.value,
                             [&model, name](const Tensor&) { model->log_.push_back(name); });
    }
  }
  const Data mine = MakeData(group->size(), 7).Rows(group->rank() * kPerRank, kPerRank);
  for (int step = 0; step < 3; ++step) {
    model->log_.clear();
    model->zero_grad();
    cross_entropy(ddp.forward(mine.x), mine.y).backward();
    EXPECT_EQ(model->log_, (std::vector<std::string>{"second.weight", "between", "first.weight"}))
        << "step " << step;
  }
}

TEST_F(DistributedDataParallelTest, MismatchedModelsAreRefusedOnEveryRank) {
  auto group = Group();
  const int last = group->size() - 1;
  auto model = MakeModel(1, group->rank() == last ? 4 : 5);
  const std::string error = testing::ErrorOf([&] { DistributedDataParallel ddp(model, group); });
  EXPECT_THAT(error, HasSubstr("rank 0 and rank " + std::to_string(last) +
                               " hold different models: at entry 1 rank 0 has parameter 0.weight "
                               "[5, 6] float32 but rank " +
                               std::to_string(last) + " has parameter 0.weight [4, 6] float32"));
  // A missing parameter.
  manual_seed(1);
  auto shorter = group->rank() == last
                     ? std::make_shared<nn::Sequential>(nn::Linear(kIn, 5), nn::ReLU())
                     : std::make_shared<nn::Sequential>(nn::Linear(kIn, 5), nn::ReLU(),
                                                        nn::Linear(5, kClasses));
  EXPECT_THAT(testing::ErrorOf([&] { DistributedDataParallel ddp(shorter, group); }),
              HasSubstr("at entry 3 rank 0 has parameter 2.weight [3, 5] float32 but rank " +
                        std::to_string(last) + " has nothing more"));
}

TEST_F(DistributedDataParallelTest, BuffersFollowRankZeroBeforeEachTrainingForward) {
  auto group = Group();
  auto model = std::make_shared<nn::Sequential>(nn::Linear(kIn, 4), nn::BatchNorm1d(4));
  DistributedDataParallel ddp(model, group);
  Tensor running_mean = model->buffer("1.running_mean");
  const Data mine = MakeData(group->size(), 9).Rows(group->rank() * kPerRank, kPerRank);
  const Tensor batch_mean = model->children()[0]->forward_tensors({mine.x})[0].detach().mean({0});
  const double own = group->rank() + 1.0;
  auto set_own = [&] {
    NoGradGuard no_grad;
    running_mean.fill_(own);
  };
  // Without grad mode (or in eval) forward runs no collective: BatchNorm updates this rank's
  // own running mean (momentum 0.1).
  set_own();
  {
    NoGradGuard no_grad;
    ddp.forward(mine.x);
  }
  EXPECT_LT(testing::MaxAbsDiff(running_mean, ones({4}) * (0.9 * own) + batch_mean * 0.1), 1e-5);
  set_own();
  ddp.eval();
  ddp.forward(mine.x);
  EXPECT_EQ(running_mean.to_vector<float>(), std::vector<float>(4, static_cast<float>(own)));
  // A training forward starts from rank 0's running mean (1.0), then adds this rank's batch.
  ddp.train();
  ddp.forward(mine.x).sum().backward();
  EXPECT_LT(testing::MaxAbsDiff(running_mean, ones({4}) * 0.9 + batch_mean * 0.1), 1e-5);
  // broadcast_buffers(false) keeps every rank's own.
  DistributedDataParallel own_buffers(model, group,
                                      DistributedDataParallelOptions().broadcast_buffers(false));
  set_own();
  own_buffers.forward(mine.x).sum().backward();
  EXPECT_LT(testing::MaxAbsDiff(running_mean, ones({4}) * (0.9 * own) + batch_mean * 0.1), 1e-5);
}

// A rank that fails before backward's collectives: the others' backward fails within the
// group's timeout, naming the collective, instead of hanging.
TEST_F(DistributedDataParallelTest, ARankThatThrowsMakesTheOthersFailWithinTheTimeout) {
  auto fragile = std::make_shared<ProcessGroupMpi>(
      ProcessGroupMpiOptions().timeout(std::chrono::milliseconds(1500)));
  auto model = MakeModel(1);
  DistributedDataParallel ddp(model, fragile);
  const Data mine = MakeData(fragile->size(), 1).Rows(fragile->rank() * kPerRank, kPerRank);
  auto step = [&] {
    Tensor loss = cross_entropy(ddp.forward(mine.x), mine.y);
    if (fragile->rank() == 1) throw std::runtime_error("rank 1 failed before backward");
    loss.backward();
  };
  if (fragile->rank() == 1) {
    EXPECT_THROW(step(), std::runtime_error);
  } else {
    const auto start = std::chrono::steady_clock::now();
    const std::string error = testing::ErrorOf(step);
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
              30.0);
    EXPECT_THAT(error, HasSubstr("allreduce (average)"));
    EXPECT_THAT(error, HasSubstr("did not finish within 1.5 s"));
  }
  Group()->barrier()->wait();
}

}  // namespace
}  // namespace tandem::parallel::distributed
