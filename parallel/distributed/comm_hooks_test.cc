// Runs as an MPI job (mpi_test.sh, 2 and 3 ranks): every rank runs every test, in order.
// PyTorch's assertions for DDP communication hooks and static_graph, replayed: a hooked
// gradient equals the unhooked one and the mean over the ranks; PowerSGD all-reduces plainly
// during its warm-up, then trains near the uncompressed loss, with error feedback kept per
// bucket; a gradient that arrives twice in one backward works under static_graph (equal to one
// process) and is PyTorch's error without it.
#include "parallel/distributed/comm_hooks.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "nn/nn.h"
#include "parallel/distributed/distributed_data_parallel.h"
#include "parallel/distributed/join.h"
#include "parallel/distributed/mpi_testing.h"
#include "parallel/distributed/powersgd_hook.h"
#include "parallel/distributed/process_group_mpi.h"
#include "tensor/core/autograd.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace tandem::parallel::distributed {
namespace {

using ::testing::HasSubstr;

class CommHooksTest : public MpiTest {};

constexpr int64_t kPerRank = 8;
constexpr int64_t kIn = 6;
constexpr int64_t kHidden = 32;
constexpr int64_t kClasses = 3;

std::shared_ptr<nn::Sequential> MakeModel(uint64_t seed) {
  manual_seed(seed);
  return std::make_shared<nn::Sequential>(nn::Linear(kIn, kHidden), nn::ReLU(),
                                          nn::Linear(kHidden, kClasses));
}

struct Data {
  Tensor x, y;
  Data Rows(int64_t start, int64_t count) const {
    return Data{x.narrow(0, start, count).contiguous(), y.narrow(0, start, count).contiguous()};
  }
};

// The whole job's samples of one step (the same on every rank): labels from a fixed teacher,
// so that a model can learn them.
Data MakeData(int world, uint64_t step, int64_t per_rank = kPerRank) {
  Generator teacher_gen(77);
  const Tensor teacher = randn({kIn, kClasses}, {}, &teacher_gen);
  Generator gen(1000 + step);
  const int64_t n = per_rank * world;
  Tensor x = randn({n, kIn}, {}, &gen);
  const std::vector<float> scores = matmul(x, teacher).to_vector<float>();
  std::vector<int64_t> labels(n);
  for (int64_t i = 0; i < n; ++i) {
    int64_t best = 0;
    for (int64_t c = 1; c < kClasses; ++c) {
      if (scores[i * kClasses + c] > scores[i * kClasses + best]) best = c;
    }
    labels[i] = best;
  }
  return Data{x, from_vector(labels, {n})};
}

std::vector<float> Flat(const Tensor& t) { return t.reshape({-1}).to_vector<float>(); }

// Every parameter's gradient, bit for bit.
void ExpectGradsEqual(const nn::Module& got, const nn::Module& want, const std::string& what) {
  const std::vector<nn::NamedTensor> g = got.named_parameters();
  const std::vector<nn::NamedTensor> w = want.named_parameters();
  ASSERT_EQ(g.size(), w.size());
  for (size_t i = 0; i < g.size(); ++i) {
    ASSERT_TRUE(g[i].value.grad().defined()) << what << ": " << g[i].name;
    EXPECT_EQ(Flat(g[i].value.grad()), Flat(w[i].value.grad())) << what << ": " << g[i].name;
  }
}

double MaxGradDiff(const nn::Module& got, const nn::Module& want) {
  const std::vector<Tensor> g = got.parameters();
  const std::vector<Tensor> w = want.parameters();
  double worst = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    worst = std::max(worst, testing::MaxAbsDiff(g[i].grad(), w[i].grad()));
  }
  return worst;
}

double MaxAbsGrad(const nn::Module& module) {
  double largest = 0;
  for (const Tensor& p : module.parameters()) {
    largest = std::max(largest, amax(abs(p.grad()).reshape({-1}), 0).item());
  }
  return largest;
}

// One backward of `ddp` on this rank's rows of step `step`.
void Backward(DistributedDataParallel& ddp, const Data& all, int rank) {
  const Data mine = all.Rows(rank * kPerRank, kPerRank);
  cross_entropy(ddp.forward(mine.x), mine.y).backward();
}

TEST_F(CommHooksTest, AllreduceHookIsBitEqualToNoHookAndToTheMeanOverRanks) {
  auto group = TestGroup();
  const int world = group->size();
  for (double cap_mb : {25.0, 0.00001}) {
    SCOPED_TRACE(tandem::internal::Concat("bucket_cap_mb ", cap_mb));
    auto hooked_model = MakeModel(3);
    auto plain_model = MakeModel(3);
    auto reference = MakeModel(3);
    const auto options = DistributedDataParallelOptions().bucket_cap_mb(cap_mb);
    DistributedDataParallel hooked(hooked_model, group, options);
    hooked.register_comm_hook(group, allreduce_hook);
    DistributedDataParallel plain(plain_model, group, options);
    const Data all = MakeData(world, 1);
    Backward(hooked, all, group->rank());
    Backward(plain, all, group->rank());
    cross_entropy(reference->forward(all.x), all.y).backward();
    ExpectGradsEqual(*hooked_model, *plain_model, "allreduce_hook against no hook");
    EXPECT_LT(MaxGradDiff(*hooked_model, *reference), 1e-5) << "against one process";
  }
}

// fp16/bf16_compress_hook: bit-equal to the gradient_compression shorthand (one code path),
// and within the dtype's precision of the float32 all-reduce (half its epsilon of the largest
// gradient per rounding: each rank's gradient, then the mean).
TEST_F(CommHooksTest, CompressHooksEqualTheShorthandAndFloat32WithinTheirPrecision) {
  auto group = TestGroup();
  const int world = group->size();
  for (DType dtype : {kFloat16, kBFloat16}) {
    SCOPED_TRACE(DTypeName(dtype));
    auto hooked_model = MakeModel(4);
    auto shorthand_model = MakeModel(4);
    auto plain_model = MakeModel(4);
    DistributedDataParallel hooked(hooked_model, group);
    hooked.register_comm_hook(group, dtype == kFloat16 ? fp16_compress_hook : bf16_compress_hook);
    DistributedDataParallel shorthand(shorthand_model, group,
                                      DistributedDataParallelOptions().gradient_compression(dtype));
    DistributedDataParallel plain(plain_model, group);
    const Data all = MakeData(world, 2);
    Backward(hooked, all, group->rank());
    Backward(shorthand, all, group->rank());
    Backward(plain, all, group->rank());
    ExpectGradsEqual(*hooked_model, *shorthand_model, "hook against gradient_compression");
    const double epsilon = dtype == kBFloat16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
    const double gap = MaxGradDiff(*hooked_model, *plain_model);
    EXPECT_LE(gap, 2 * epsilon * MaxAbsGrad(*plain_model) + 1e-7);
    EXPECT_GT(gap, 0.0) << "not compressed";
  }
}

// A hook of one's own: it sees every bucket once, in index order, the last marked, with the
// parameters DDP put there; what it returns is what .grad gets (here twice the mean).
TEST_F(CommHooksTest, AUserWrittenHookSeesEachBucketOnceAndItsResultBecomesTheGradient) {
  auto group = TestGroup();
  const int world = group->size();
  auto hooked_model = MakeModel(5);
  auto plain_model = MakeModel(5);
  const auto options = DistributedDataParallelOptions().bucket_cap_mb(0.00001);
  DistributedDataParallel hooked(hooked_model, group, options);
  DistributedDataParallel plain(plain_model, group, options);
  struct Seen {
    std::shared_ptr<ProcessGroup> group;
    std::vector<int> indices;
    std::vector<bool> last;
    std::vector<int64_t> parameters;
  };
  auto seen = std::make_shared<Seen>();
  seen->group = group;
  hooked.register_comm_hook(seen, [](Seen& s, GradBucket& bucket) {
    s.indices.push_back(bucket.index());
    s.last.push_back(bucket.is_last());
    s.parameters.push_back(static_cast<int64_t>(bucket.parameters().size()));
    const std::vector<Tensor> grads = bucket.gradients();
    for (size_t k = 0; k < grads.size(); ++k) {
      EXPECT_EQ(grads[k].shape(), bucket.parameters()[k].shape());
      EXPECT_EQ(Flat(grads[k]), Flat(bucket.parameters()[k].grad())) << "the bucket's copy";
    }
    return CommFuture::FromWork(s.group->allreduce(bucket.buffer(), ReduceOp::kAverage),
                                bucket.buffer())
        ->Then([](Tensor mean) { return mean * 2.0; });
  });
  const Data all = MakeData(world, 3);
  Backward(hooked, all, group->rank());
  Backward(plain, all, group->rank());
  const size_t buckets = hooked.bucket_parameter_names().size();
  ASSERT_EQ(buckets, 4u);  // one parameter a bucket at this cap
  for (size_t b = 0; b < buckets; ++b) {
    EXPECT_EQ(seen->indices[b], static_cast<int>(b));
    EXPECT_EQ(seen->last[b], b + 1 == buckets);
    EXPECT_EQ(seen->parameters[b], 1);
  }
  const std::vector<Tensor> got = hooked_model->parameters();
  const std::vector<Tensor> want = plain_model->parameters();
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(Flat(got[i].grad()), Flat(want[i].grad() * 2.0)) << "parameter " << i;
  }
  // And under gradient_as_bucket_view the result lands in the bucket that .grad views.
  auto viewed_model = MakeModel(5);
  DistributedDataParallel viewed(
      viewed_model, group, DistributedDataParallelOptions(options).gradient_as_bucket_view(true));
  viewed.register_comm_hook(group, [](ProcessGroup& g, GradBucket& bucket) {
    return allreduce_hook(g, bucket)->Then([](Tensor mean) { return mean * 2.0; });
  });
  Backward(viewed, all, group->rank());
  const std::vector<Tensor> viewed_params = viewed_model->parameters();
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(Flat(viewed_params[i].grad()), Flat(want[i].grad() * 2.0)) << "parameter " << i;
  }
}

TEST_F(CommHooksTest, PowerSgdAllreducesPlainlyDuringWarmUpThenCompresses) {
  auto group = TestGroup();
  const int world = group->size();
  auto psgd_model = MakeModel(6);
  auto plain_model = MakeModel(6);
  DistributedDataParallel psgd(psgd_model, group);
  DistributedDataParallel plain(plain_model, group);
  auto state = std::make_shared<PowerSGDState>(
      group, PowerSGDOptions().matrix_approximation_rank(1).start_powerSGD_iter(3));
  psgd.register_comm_hook(state, powersgd_hook);
  nn::SGD psgd_sgd(psgd_model->parameters(), nn::SGDOptions(0.1));
  nn::SGD plain_sgd(plain_model->parameters(), nn::SGDOptions(0.1));
  for (int step = 0; step < 4; ++step) {
    const Data all = MakeData(world, 10 + step);
    psgd_sgd.zero_grad();
    plain_sgd.zero_grad();
    Backward(psgd, all, group->rank());
    Backward(plain, all, group->rank());
    EXPECT_EQ(state->iteration(), step + 1);
    if (step < 3) {
      ExpectGradsEqual(*psgd_model, *plain_model, "warm-up step " + std::to_string(step));
      EXPECT_FALSE(state->error(0).defined()) << "no error feedback before compression";
      EXPECT_EQ(state->numel_before_compression(), 0);
    } else {
      // Both weights are compressed at rank 1 (32 x 6: 38 numbers instead of 192; 3 x 32: 35
      // instead of 96); the biases (one dimension) are all-reduced plainly.
      const std::vector<Tensor> got = psgd_model->parameters();
      const std::vector<Tensor> want = plain_model->parameters();
      for (size_t i = 0; i < got.size(); ++i) {
        const double gap = testing::MaxAbsDiff(got[i].grad(), want[i].grad());
        if (i % 2 == 0) {
          EXPECT_GT(gap, 1e-4) << "parameter " << i << " is compressed";
        } else {
          EXPECT_LT(gap, 1e-6) << "parameter " << i << " is not";
        }
      }
      EXPECT_EQ(state->numel_before_compression(),
                kHidden * kIn + kHidden + kClasses * kHidden + kClasses);
      EXPECT_EQ(state->numel_after_compression(),
                (kHidden + kIn) + kHidden + (kClasses + kHidden) + kClasses);
      EXPECT_TRUE(state->error(0).defined());
    }
    // Every rank holds the same gradients.
    Tensor mine = psgd_model->parameters()[0].grad().reshape({-1}).contiguous();
    Tensor gathered = zeros({world * mine.numel()});
    group->allgather(gathered, mine)->wait();
    for (int r = 1; r < world; ++r) {
      EXPECT_EQ(Flat(gathered.narrow(0, r * mine.numel(), mine.numel())), Flat(mine));
    }
    psgd_sgd.step();
    plain_sgd.step();
  }
}

// A rank-1 approximation of an orthogonal projection is exact for a rank-1 mean gradient: with
// every rank's gradient the same outer product, PowerSGD returns it (up to rounding).
TEST_F(CommHooksTest, PowerSgdIsExactForARankOneGradient) {
  auto group = TestGroup();
  manual_seed(8);
  auto model = std::make_shared<nn::Linear>(12, 10, /*bias=*/false);
  DistributedDataParallel ddp(model, group);
  auto state = std::make_shared<PowerSGDState>(
      group, PowerSGDOptions().start_powerSGD_iter(0).min_compression_rate(1));
  ddp.register_comm_hook(state, powersgd_hook);
  Generator gen(9);
  const Tensor u = randn({1, 10}, {}, &gen);
  const Tensor x = randn({1, 12}, {}, &gen);
  // loss = u . (W x): dL/dW = u^T x, rank one, the same on every rank.
  sum(mul(ddp.forward(x), u)).backward();
  const Tensor want = matmul(u.t(), x);
  EXPECT_LT(testing::MaxAbsDiff(model->parameters()[0].grad(), want), 1e-5);
  EXPECT_LT(amax(abs(state->error(0)).reshape({-1}), 0).item(), 1e-5) << "nothing was lost";
}

// PowerSGD works in its bucket's dtype: a float64 rank-one gradient comes back to float64
// precision, a bfloat16 one to bfloat16's (a few of its 2^-8 steps of the largest element).
TEST_F(CommHooksTest, PowerSgdWorksInItsBucketsDtype) {
  auto group = TestGroup();
  for (DType dtype : {kFloat64, kBFloat16}) {
    SCOPED_TRACE(DTypeName(dtype));
    manual_seed(8);
    auto model = std::make_shared<nn::Linear>(12, 10, /*bias=*/false);
    model->to(dtype);
    DistributedDataParallel ddp(model, group);
    auto state = std::make_shared<PowerSGDState>(
        group, PowerSGDOptions().start_powerSGD_iter(0).min_compression_rate(1));
    ddp.register_comm_hook(state, powersgd_hook);
    Generator gen(9);
    const Tensor u = randn({1, 10}, {}, &gen).to(dtype);
    const Tensor x = randn({1, 12}, {}, &gen).to(dtype);
    sum(mul(ddp.forward(x), u)).backward();
    const Tensor grad = model->parameters()[0].grad();
    EXPECT_EQ(grad.dtype(), dtype);
    EXPECT_EQ(state->error(0).dtype(), dtype);
    const Tensor want = matmul(u.t(), x).to(kFloat64);
    const double largest = amax(abs(want).reshape({-1}), 0).item();
    const double tolerance = dtype == kFloat64 ? 1e-12 : 4 * std::ldexp(1.0, -8) * largest;
    EXPECT_LT(testing::MaxAbsDiff(grad.to(kFloat64), want), tolerance);
  }
}

// The compression hooks compress from the bucket's dtype and write the mean back into it: a
// float64 model's gradients stay float64, within the 16-bit dtype's precision of the float64
// all-reduce; a bfloat16 bucket under bf16_compress_hook is all-reduced as it is (bit equal
// to no hook).
TEST_F(CommHooksTest, CompressHooksCompressFromTheBucketsDtype) {
  auto group = TestGroup();
  const int world = group->size();
  const Data all = MakeData(world, 6);
  for (DType dtype : {kFloat16, kBFloat16}) {
    SCOPED_TRACE(DTypeName(dtype));
    auto hooked_model = MakeModel(4);
    auto plain_model = MakeModel(4);
    hooked_model->to(kFloat64);
    plain_model->to(kFloat64);
    DistributedDataParallel hooked(hooked_model, group);
    DistributedDataParallel plain(plain_model, group);
    hooked.register_comm_hook(group, dtype == kFloat16 ? fp16_compress_hook : bf16_compress_hook);
    const Data mine = all.Rows(group->rank() * kPerRank, kPerRank);
    cross_entropy(hooked.forward(mine.x.to(kFloat64)), mine.y).backward();
    cross_entropy(plain.forward(mine.x.to(kFloat64)), mine.y).backward();
    for (const Tensor& p : hooked_model->parameters()) EXPECT_EQ(p.grad().dtype(), kFloat64);
    const double epsilon = dtype == kBFloat16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
    const double diff = MaxGradDiff(*hooked_model, *plain_model);
    EXPECT_LE(diff, 2 * epsilon * MaxAbsGrad(*plain_model));
    EXPECT_GT(diff, 0.0) << "not compressed";
  }
  auto hooked_model = MakeModel(4);
  auto plain_model = MakeModel(4);
  hooked_model->to(kBFloat16);
  plain_model->to(kBFloat16);
  DistributedDataParallel hooked(hooked_model, group);
  DistributedDataParallel plain(plain_model, group);
  hooked.register_comm_hook(group, bf16_compress_hook);
  Backward(hooked, Data{all.x.to(kBFloat16), all.y}, group->rank());
  Backward(plain, Data{all.x.to(kBFloat16), all.y}, group->rank());
  const std::vector<Tensor> got = hooked_model->parameters();
  const std::vector<Tensor> want = plain_model->parameters();
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].grad().dtype(), kBFloat16);
    EXPECT_EQ(Flat(got[i].grad().to(kFloat32)), Flat(want[i].grad().to(kFloat32)))
        << "parameter " << i;
  }
}

// Error feedback: what compression lost in a bucket is added to its next gradients, and kept
// in the state: error_k = (gradient_k + error_{k-1}) - reduced_k, per rank.
TEST_F(CommHooksTest, PowerSgdErrorFeedbackPersistsAcrossIterations) {
  auto group = TestGroup();
  const int world = group->size();
  auto model = MakeModel(12);
  auto local = MakeModel(12);  // this rank's own gradient
  DistributedDataParallel ddp(model, group);
  auto state = std::make_shared<PowerSGDState>(
      group, PowerSGDOptions().start_powerSGD_iter(0).matrix_approximation_rank(1));
  ddp.register_comm_hook(state, powersgd_hook);
  const Data mine = MakeData(world, 20).Rows(group->rank() * kPerRank, kPerRank);
  cross_entropy(local->forward(mine.x), mine.y).backward();
  // One bucket: the parameters in reverse order, as DDP lays them out.
  const auto flatten = [](const nn::Module& m, bool grads) {
    std::vector<Tensor> parts;
    const std::vector<Tensor> params = m.parameters();
    for (size_t i = params.size(); i-- > 0;) {
      parts.push_back((grads ? params[i].grad() : params[i]).reshape({-1}));
    }
    return cat(parts);
  };
  ASSERT_EQ(ddp.bucket_parameter_names().size(), 1u);
  const Tensor gradient = flatten(*local, true);
  Tensor previous_error = zeros(gradient.shape());
  std::vector<float> previous_reduced;
  for (int step = 0; step < 3; ++step) {
    model->zero_grad();
    cross_entropy(ddp.forward(mine.x), mine.y).backward();
    const Tensor reduced = flatten(*model, true);
    const Tensor error = state->error(0);
    ASSERT_TRUE(error.defined());
    EXPECT_LT(testing::MaxAbsDiff(error, gradient + previous_error - reduced), 1e-6)
        << "step " << step;
    EXPECT_GT(amax(abs(error), 0).item(), 1e-4) << "rank 1 of a 32 x 6 gradient loses some";
    // The same data each step, yet the reduced gradient changes: the error is fed back.
    if (step > 0) {
      EXPECT_NE(Flat(reduced), previous_reduced);
    }
    previous_reduced = Flat(reduced);
    previous_error = error.clone();
  }
  // Without error feedback there is none to keep.
  auto plain_state = std::make_shared<PowerSGDState>(
      group, PowerSGDOptions().start_powerSGD_iter(0).use_error_feedback(false));
  DistributedDataParallel no_feedback(MakeModel(12), group);
  no_feedback.register_comm_hook(plain_state, powersgd_hook);
  cross_entropy(no_feedback.forward(mine.x), mine.y).backward();
  EXPECT_FALSE(plain_state->error(0).defined());
}

// PowerSGD rank 2 (after 10 plain steps) trains a 6-64-3 MLP for 80 SGD steps to within 0.05
// of the uncompressed run's loss on the whole data; the gap measured is printed.
TEST_F(CommHooksTest, PowerSgdTrainsASmallModelNearTheUncompressedLoss) {
  auto group = TestGroup();
  const int world = group->size();
  const auto make = [] {
    manual_seed(13);
    return std::make_shared<nn::Sequential>(nn::Linear(kIn, 64), nn::ReLU(),
                                            nn::Linear(64, kClasses));
  };
  auto psgd_model = make();
  auto plain_model = make();
  DistributedDataParallel psgd(psgd_model, group);
  DistributedDataParallel plain(plain_model, group);
  auto state = std::make_shared<PowerSGDState>(
      group, PowerSGDOptions().matrix_approximation_rank(2).start_powerSGD_iter(10));
  psgd.register_comm_hook(state, powersgd_hook);
  nn::SGD psgd_sgd(psgd_model->parameters(), nn::SGDOptions(0.2));
  nn::SGD plain_sgd(plain_model->parameters(), nn::SGDOptions(0.2));
  const Data test = MakeData(1, 999, 512);
  const double initial = cross_entropy(plain_model->forward(test.x), test.y).item();
  for (int step = 0; step < 80; ++step) {
    const Data all = MakeData(world, 100 + step, 16);
    const Data mine = all.Rows(group->rank() * 16, 16);
    psgd_sgd.zero_grad();
    cross_entropy(psgd.forward(mine.x), mine.y).backward();
    psgd_sgd.step();
    plain_sgd.zero_grad();
    cross_entropy(plain.forward(mine.x), mine.y).backward();
    plain_sgd.step();
  }
  NoGradGuard no_grad;
  const double psgd_loss = cross_entropy(psgd_model->forward(test.x), test.y).item();
  const double plain_loss = cross_entropy(plain_model->forward(test.x), test.y).item();
  if (group->rank() == 0) {
    std::printf(
        "[powersgd] %d ranks: loss %.4f -> uncompressed %.4f, PowerSGD rank 2 %.4f "
        "(gap %.4f)\n",
        world, initial, plain_loss, psgd_loss, psgd_loss - plain_loss);
  }
  EXPECT_LT(plain_loss, 0.6 * initial) << "the uncompressed run learns";
  EXPECT_LT(std::abs(psgd_loss - plain_loss), 0.05);
  EXPECT_LT(state->numel_after_compression(), state->numel_before_compression());
}

// Under Join (uneven inputs) a rank out of data runs the hook on zeros, so that it issues the
// collectives the others' hooks do: PowerSGD's two all-reduces per bucket keep every rank in
// step, and the ranks end with the same parameters, to the bit.
TEST_F(CommHooksTest, AJoinedRankRunsTheHookSoPowerSgdRanksStayInStep) {
  auto group = TestGroup();
  const int world = group->size();
  const int rank = group->rank();
  auto model = MakeModel(16);
  DistributedDataParallel ddp(model, group);
  ddp.register_comm_hook(
      std::make_shared<PowerSGDState>(group, PowerSGDOptions().start_powerSGD_iter(1)),
      powersgd_hook);
  nn::SGD sgd(model->parameters(), nn::SGDOptions(0.1));
  int shadowed = 0;
  {
    Join join(ddp, [&] {
      sgd.step();
      sgd.zero_grad();
    });
    for (int step = 0; step < 2 + rank; ++step) {
      const Data mine = MakeData(world, 70 + step).Rows(rank * kPerRank, kPerRank);
      sgd.zero_grad();
      cross_entropy(ddp.forward(mine.x), mine.y).backward();
      sgd.step();
    }
    shadowed = join.Finish();
  }
  EXPECT_EQ(shadowed, world - 1 - rank);
  for (const Tensor& p : model->parameters()) {
    Tensor mine = p.detach().reshape({-1}).contiguous();
    Tensor everyone = zeros({world * mine.numel()});
    group->allgather(everyone, mine)->wait();
    for (int r = 1; r < world; ++r) {
      EXPECT_EQ(Flat(everyone.narrow(0, r * mine.numel(), mine.numel())), Flat(mine));
    }
  }
}

// Reentrant activation checkpointing in miniature: forward runs `layer` without recording, and
// backward recomputes it and runs a backward of its own through it (inside the outer one), so
// the layer's parameters get their gradient from that nested pass: twice when the same layer
// is checkpointed twice.
class ReentrantNode : public Node {
 public:
  ReentrantNode(std::shared_ptr<nn::Linear> layer, Tensor input)
      : Node(input.device()), layer_(std::move(layer)), input_(input.detach()) {}
  std::vector<Tensor> Apply(std::vector<Tensor> grad_outputs) override {
    AutoGradMode enable(true);
    Tensor input = input_.detach();
    input.set_requires_grad(true);
    Tensor output = layer_->forward(input);
    RunBackward({output}, {grad_outputs[0]});
    return {input.grad()};
  }
  std::string name() const override { return "ReentrantNode"; }

 private:
  std::shared_ptr<nn::Linear> layer_;
  Tensor input_;
};

Tensor Checkpoint(const std::shared_ptr<nn::Linear>& layer, const Tensor& input) {
  Tensor output;
  {
    NoGradGuard no_grad;
    output = layer->forward(input);
  }
  if (GradMode::IsEnabled())
    RecordOp(std::make_shared<ReentrantNode>(layer, input), {input}, output);
  return output;
}

// in -> square (checkpointed) -> tanh -> square again (checkpointed) -> head.
class TwiceCheckpointed : public nn::Module {
 public:
  explicit TwiceCheckpointed(bool checkpoint)
      : nn::Module("TwiceCheckpointed"), checkpoint_(checkpoint) {
    square_ = register_module("square", std::make_shared<nn::Linear>(kIn, kIn));
    head_ = register_module("head", std::make_shared<nn::Linear>(kIn, kClasses));
  }
  std::vector<Tensor> forward_tensors(const std::vector<Tensor>& inputs) override {
    const auto apply = [this](const Tensor& x) {
      return checkpoint_ ? Checkpoint(square_, x) : square_->forward(x);
    };
    return {head_->forward(apply(tanh(apply(inputs[0]))))};
  }
  Tensor forward(const Tensor& x) { return forward_tensors({x})[0]; }
  void set_checkpoint(bool checkpoint) { checkpoint_ = checkpoint; }

 private:
  bool checkpoint_;
  std::shared_ptr<nn::Linear> square_, head_;
};

TEST_F(CommHooksTest, StaticGraphReducesAGradientThatArrivesTwiceAsOneProcessDoes) {
  auto group = TestGroup();
  const int world = group->size();
  for (bool hooked : {false, true}) {
    SCOPED_TRACE(hooked ? "with bf16_compress_hook" : "plain all-reduce");
    manual_seed(14);
    auto model = std::make_shared<TwiceCheckpointed>(true);
    manual_seed(14);
    auto reference = std::make_shared<TwiceCheckpointed>(false);
    DistributedDataParallel ddp(
        model, group,
        DistributedDataParallelOptions().static_graph(true).bucket_cap_mb(hooked ? 25.0 : 0.00001));
    if (hooked) ddp.register_comm_hook(group, bf16_compress_hook);
    nn::SGD sgd(model->parameters(), nn::SGDOptions(0.1));
    nn::SGD reference_sgd(reference->parameters(), nn::SGDOptions(0.1));
    for (int step = 0; step < 4; ++step) {  // the first learns the graph, the others use it
      const Data all = MakeData(world, 40 + step);
      const Data mine = all.Rows(group->rank() * kPerRank, kPerRank);
      sgd.zero_grad();
      cross_entropy(ddp.forward(mine.x), mine.y).backward();
      reference_sgd.zero_grad();
      cross_entropy(reference->forward(all.x), all.y).backward();
      const double tolerance = hooked ? std::ldexp(1.0, -7) * MaxAbsGrad(*reference) : 1e-5;
      EXPECT_LT(MaxGradDiff(*model, *reference), tolerance) << "step " << step;
      sgd.step();
      reference_sgd.step();
    }
  }
}

TEST_F(CommHooksTest, AGradientThatArrivesTwiceWithoutStaticGraphIsPyTorchsError) {
  auto group = TestGroup();
  manual_seed(15);
  DistributedDataParallel ddp(std::make_shared<TwiceCheckpointed>(true), group);
  const Data mine = MakeData(group->size(), 50).Rows(group->rank() * kPerRank, kPerRank);
  const std::string error =
      testing::ErrorOf([&] { cross_entropy(ddp.forward(mine.x), mine.y).backward(); });
  EXPECT_THAT(error, HasSubstr("Expected to mark a variable ready only once, but parameter "
                               "square.weight (index 0) received its gradient 2 times"));
  EXPECT_THAT(error, HasSubstr("construct with DistributedDataParallelOptions()"
                               ".static_graph(true)"));
}

// static_graph learns the arrivals in the first iteration; a later one with more is refused.
TEST_F(CommHooksTest, AStaticGraphThatChangesIsAClearError) {
  auto group = TestGroup();
  manual_seed(17);
  auto model = std::make_shared<TwiceCheckpointed>(false);
  DistributedDataParallel ddp(model, group, DistributedDataParallelOptions().static_graph(true));
  const Data mine = MakeData(group->size(), 55).Rows(group->rank() * kPerRank, kPerRank);
  cross_entropy(ddp.forward(mine.x), mine.y).backward();  // one arrival each
  model->set_checkpoint(true);
  EXPECT_THAT(testing::ErrorOf([&] { cross_entropy(ddp.forward(mine.x), mine.y).backward(); }),
              HasSubstr("static_graph: parameter square.weight received its gradient 2 times in "
                        "this backward pass but 1 times in the first iteration"));
}

TEST_F(CommHooksTest, HooksRegisteredWronglyOrReturningTheWrongTensorAreClearErrors) {
  auto group = TestGroup();
  const Data mine = MakeData(group->size(), 60).Rows(group->rank() * kPerRank, kPerRank);
  {
    DistributedDataParallel ddp(MakeModel(1), group);
    ddp.register_comm_hook(group, allreduce_hook);
    EXPECT_THAT(testing::ErrorOf([&] { ddp.register_comm_hook(group, fp16_compress_hook); }),
                HasSubstr("a communication hook is registered already"));
  }
  {
    DistributedDataParallel ddp(MakeModel(1), group);
    cross_entropy(ddp.forward(mine.x), mine.y).backward();
    EXPECT_THAT(testing::ErrorOf([&] { ddp.register_comm_hook(group, allreduce_hook); }),
                HasSubstr("called after the first forward; register the hook right after "
                          "constructing DistributedDataParallel"));
  }
  {
    DistributedDataParallel ddp(MakeModel(1), group,
                                DistributedDataParallelOptions().gradient_compression(kBFloat16));
    EXPECT_THAT(testing::ErrorOf([&] { ddp.register_comm_hook(group, allreduce_hook); }),
                HasSubstr("constructed with gradient_compression(bfloat16), which is itself a "
                          "communication hook"));
  }
  {
    DistributedDataParallel ddp(MakeModel(1), group);
    EXPECT_THAT(testing::ErrorOf([&] {
                  ddp.register_comm_hook(std::shared_ptr<ProcessGroup>(), allreduce_hook);
                }),
                HasSubstr("register_comm_hook: the state is null"));
  }
  const int64_t numel = kHidden * kIn + kHidden + kClasses * kHidden + kClasses;
  for (bool wrong_dtype : {true, false}) {
    DistributedDataParallel ddp(MakeModel(1), group);
    ddp.register_comm_hook(group, [wrong_dtype](ProcessGroup& g, GradBucket& bucket) {
      return allreduce_hook(g, bucket)->Then([wrong_dtype](Tensor mean) {
        return wrong_dtype ? mean.to(kFloat64) : mean.narrow(0, 0, 5).contiguous();
      });
    });
    const std::string error =
        testing::ErrorOf([&] { cross_entropy(ddp.forward(mine.x), mine.y).backward(); });
    EXPECT_THAT(error, HasSubstr("the communication hook's result for bucket 0 must be [" +
                                 std::to_string(numel) +
                                 "] float32 on cpu:0 (the bucket's "
                                 "buffer) but is " +
                                 (wrong_dtype ? "[" + std::to_string(numel) + "] float64"
                                              : std::string("[5] float32"))));
  }
}

}  // namespace
}  // namespace tandem::parallel::distributed
