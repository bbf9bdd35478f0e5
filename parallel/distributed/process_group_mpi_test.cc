// Runs as an MPI job (mpi_test.sh): every rank runs every test, in the same order.
#include "parallel/distributed/process_group_mpi.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "parallel/distributed/mpi_testing.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace tandem::parallel::distributed {
namespace {

using ::tandem::testing::ErrorOf;
using ::testing::AnyOf;
using ::testing::HasSubstr;

// Every test needs the MPI job that mpi_test.sh starts; run alone, the binary skips them.
class ProcessGroupMpiTest : public MpiTest {};

// One group for the whole binary (groups are collective to create).
ProcessGroupMpi& Group() { return *TestGroup(); }

// Rank r's value at index i of a test tensor.
float Value(int rank, int64_t i) { return static_cast<float>(rank + 1) * 0.5f + (i % 17); }

Tensor RankTensor(int rank, int64_t n) {
  std::vector<float> values(n);
  for (int64_t i = 0; i < n; ++i) values[i] = Value(rank, i);
  return from_vector(values, {n});
}

TEST_F(ProcessGroupMpiTest, RankAndSizeMatchMpirun) {
  ProcessGroupMpi& group = Group();
  ASSERT_TRUE(LaunchedByMpirun()) << "run this test through mpi_test.sh (bazel test does)";
  EXPECT_EQ(group.size(), std::atoi(std::getenv("OMPI_COMM_WORLD_SIZE")));
  EXPECT_EQ(group.rank(), std::atoi(std::getenv("OMPI_COMM_WORLD_RANK")));
  EXPECT_GE(group.size(), 2);
  EXPECT_EQ(group.backend(), "mpi");
  EXPECT_EQ(LocalRank(), group.rank());  // one machine
}

TEST_F(ProcessGroupMpiTest, AllreduceSumAndAverageFloat32OfSeveralSizes) {
  ProcessGroupMpi& group = Group();
  for (int64_t n : {0, 1, 7, 1000, 1 << 18}) {
    Tensor sum = RankTensor(group.rank(), n);
    Tensor average = RankTensor(group.rank(), n).view({-1, 1});
    auto sum_work = group.allreduce(sum, ReduceOp::kSum);
    auto average_work = group.allreduce(average, ReduceOp::kAverage);
    sum_work->wait();
    average_work->wait();
    EXPECT_TRUE(sum_work->is_completed());
    std::vector<float> got_sum = sum.to_vector<float>();
    std::vector<float> got_average = average.to_vector<float>();
    for (int64_t i = 0; i < n; ++i) {
      float expected = 0;
      for (int r = 0; r < group.size(); ++r) expected += Value(r, i);
      ASSERT_FLOAT_EQ(got_sum[i], expected) << "n " << n << " index " << i;
      ASSERT_FLOAT_EQ(got_average[i], expected / group.size()) << "n " << n << " index " << i;
    }
  }
}

// Sizes around the eager pieces of recursive doubling (about 4 KB: 1,008 floats or 504
// int64s with Open MPI's defaults; 4 KB as two pieces, 5,000 floats as five uneven ones), its
// switch to the ring at 128 KB (32,768 floats, 16,384 int64s), and the ring's 512 KB pieces,
// several of them in flight, with blocks that do not divide evenly among the ranks.
TEST_F(ProcessGroupMpiTest, AllreduceOfLargeAndOddSizesSumsEveryElement) {
  ProcessGroupMpi& group = Group();
  for (int64_t n :
       {int64_t{2}, int64_t{503}, int64_t{505}, int64_t{1007}, int64_t{1009}, int64_t{1024},
        int64_t{1025}, int64_t{5000}, int64_t{16383}, int64_t{16385}, int64_t{32767},
        int64_t{32768}, int64_t{32769}, int64_t{3} << 18, (int64_t{3} << 18) + 5}) {
    Tensor sum = RankTensor(group.rank(), n);
    group.allreduce(sum)->wait();
    std::vector<float> got = sum.to_vector<float>();
    for (int64_t i = 0; i < n; ++i) {
      float expected = 0;
      for (int r = 0; r < group.size(); ++r) expected += Value(r, i);
      ASSERT_FLOAT_EQ(got[i], expected) << "n " << n << " index " << i;
    }
    std::vector<int64_t> ids(n);
    for (int64_t i = 0; i < n; ++i) ids[i] = (i << 20) + group.rank();
    Tensor id_sum = from_vector(ids, {n});
    group.allreduce(id_sum)->wait();
    std::vector<int64_t> got_ids = id_sum.to_vector<int64_t>();
    const int64_t s = group.size();
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(got_ids[i], s * (i << 20) + s * (s - 1) / 2) << "n " << n << " index " << i;
    }
  }
}

// DDP's replicas stay identical only if every rank gets the same bits, whatever order the
// additions ran in on each rank.
TEST_F(ProcessGroupMpiTest, AllreduceGivesEveryRankTheSameBits) {
  ProcessGroupMpi& group = Group();
  for (int64_t n : {int64_t{100}, int64_t{5000}, int64_t{300001}}) {
    std::vector<float> values(n);
    for (int64_t i = 0; i < n; ++i) {
      values[i] = std::sin(static_cast<float>(i * (group.rank() + 3))) * 1e3f / (1 + i % 97);
    }
    Tensor t = from_vector(values, {n});
    group.allreduce(t, ReduceOp::kAverage)->wait();
    Tensor all = zeros({group.size(), n});
    group.allgather(all, t)->wait();
    for (int r = 1; r < group.size(); ++r) {
      std::vector<float> first = all.select(0, 0).to_vector<float>();
      std::vector<float> other = all.select(0, r).to_vector<float>();
      ASSERT_EQ(std::memcmp(first.data(), other.data(), n * sizeof(float)), 0)
          << "n " << n << ": rank " << r << " holds different bits from rank 0";
    }
  }
}

TEST_F(ProcessGroupMpiTest, AllreduceInt64KeepsAll64Bits) {
  ProcessGroupMpi& group = Group();
  const int64_t big = int64_t{1} << 40;
  Tensor t = from_vector(std::vector<int64_t>{big + group.rank(), -group.rank(), 3}, {3});
  group.allreduce(t)->wait();
  const int64_t s = group.size();
  EXPECT_EQ(t.to_vector<int64_t>(),
            (std::vector<int64_t>{big * s + s * (s - 1) / 2, -s * (s - 1) / 2, 3 * s}));
}

TEST_F(ProcessGroupMpiTest, BroadcastFromEveryRoot) {
  ProcessGroupMpi& group = Group();
  for (int root = 0; root < group.size(); ++root) {
    Tensor f = RankTensor(group.rank(), 300).view({3, 100});
    Tensor i = from_vector(std::vector<int64_t>{group.rank() * 10, -7}, {2});
    Tensor empty = zeros({0});
    auto w1 = group.broadcast(f, root);
    auto w2 = group.broadcast(i, root);
    auto w3 = group.broadcast(empty, root);
    w3->wait();
    w2->wait();
    w1->wait();
    EXPECT_EQ(f.to_vector<float>(), RankTensor(root, 300).to_vector<float>()) << "root " << root;
    EXPECT_EQ(i.to_vector<int64_t>(), (std::vector<int64_t>{root * 10, -7})) << "root " << root;
  }
}

TEST_F(ProcessGroupMpiTest, AllgatherPutsRanksInOrder) {
  ProcessGroupMpi& group = Group();
  for (int64_t n : {0, 1, 5, 4096}) {
    Tensor input = RankTensor(group.rank(), n);
    Tensor output = full({group.size(), n}, -1.0);
    group.allgather(output, input)->wait();
    for (int r = 0; r < group.size(); ++r) {
      EXPECT_EQ(output.select(0, r).to_vector<float>(), RankTensor(r, n).to_vector<float>())
          << "n " << n << " rank " << r;
    }
  }
  Tensor ids = from_vector(std::vector<int64_t>{group.rank(), 100 + group.rank()}, {2});
  Tensor all = zeros({group.size() * 2}, kInt64);
  group.allgather(all, ids)->wait();
  for (int r = 0; r < group.size(); ++r) {
    EXPECT_EQ(all.to_vector<int64_t>()[2 * r], r);
    EXPECT_EQ(all.to_vector<int64_t>()[2 * r + 1], 100 + r);
  }
}

// Tensors larger than one MPI call may move go in pieces: the same results with a limit of 7
// elements per call as without one.
TEST_F(ProcessGroupMpiTest, ChunkingWithALoweredLimitGivesTheSameResults) {
  ProcessGroupMpi chunked(
      ProcessGroupMpiOptions().timeout(std::chrono::seconds(60)).max_elements_per_call(7));
  const int64_t n = 100;  // 14 pieces of 7 and one of 2
  Tensor sum = RankTensor(chunked.rank(), n);
  Tensor reference = RankTensor(chunked.rank(), n);
  chunked.allreduce(sum)->wait();
  Group().allreduce(reference)->wait();
  EXPECT_EQ(sum.to_vector<float>(), reference.to_vector<float>());

  Tensor cast = RankTensor(chunked.rank(), n);
  chunked.broadcast(cast, chunked.size() - 1)->wait();
  EXPECT_EQ(cast.to_vector<float>(), RankTensor(chunked.size() - 1, n).to_vector<float>());

  const int64_t m = 23;  // 3 pieces of 7 and one of 2, per rank
  Tensor output = zeros({chunked.size(), m});
  chunked.allgather(output, RankTensor(chunked.rank(), m))->wait();
  for (int r = 0; r < chunked.size(); ++r) {
    EXPECT_EQ(output.select(0, r).to_vector<float>(), RankTensor(r, m).to_vector<float>());
  }
  Tensor ids = from_vector(std::vector<int64_t>(m, chunked.rank()), {m});
  Tensor all_ids = zeros({chunked.size() * m}, kInt64);
  chunked.allgather(all_ids, ids)->wait();
  std::vector<int64_t> got = all_ids.to_vector<int64_t>();
  for (int64_t k = 0; k < chunked.size() * m; ++k) ASSERT_EQ(got[k], k / m) << k;
}

TEST_F(ProcessGroupMpiTest, ManyCollectivesInFlightFinishInOrder) {
  ProcessGroupMpi& group = Group();
  std::vector<Tensor> tensors;
  std::vector<std::shared_ptr<Work>> works;
  for (int k = 0; k < 20; ++k) {
    tensors.push_back(full({1000}, k + group.rank()));
    works.push_back(group.allreduce(tensors.back()));
  }
  works.push_back(group.barrier());
  for (int k = 20; k >= 0; --k) works[k]->wait();
  const int s = group.size();
  for (int k = 0; k < 20; ++k) {
    EXPECT_EQ(tensors[k].to_vector<float>()[999], static_cast<float>(k * s + s * (s - 1) / 2));
  }
}

// A collective that nobody waits for still runs (on the group's thread), also right after
// the caller ran one itself (the group then does not wake its thread for each collective)
// and after the group has been idle.
TEST_F(ProcessGroupMpiTest, ACollectiveNobodyWaitsForStillRuns) {
  ProcessGroupMpi& group = Group();
  for (int idle_ms : {0, 300}) {
    Tensor first = ones({4});
    group.allreduce(first)->wait();
    std::this_thread::sleep_for(std::chrono::milliseconds(idle_ms));
    Tensor second = ones({1000});
    std::shared_ptr<Work> work = group.allreduce(second);
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!work->is_completed() && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_TRUE(work->is_completed())
        << "after " << idle_ms << " ms idle: a collective nobody waited for did not run";
    work->wait();
    EXPECT_EQ(second.to_vector<float>()[999], static_cast<float>(group.size()));
  }
}

TEST_F(ProcessGroupMpiTest, MisuseIsAClearErrorOnTheCallingRank) {
  ProcessGroupMpi& group = Group();
  Tensor matrix = zeros({4, 3});
  try {
    group.allreduce(matrix.t());
    FAIL() << "a non-contiguous tensor was accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("must be contiguous"));
    EXPECT_THAT(e.what(), HasSubstr("rank " + std::to_string(group.rank())));
  }
  try {
    group.allreduce(zeros({2}, kInt64), ReduceOp::kAverage);
    FAIL() << "an int64 average was accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("average is defined for floating-point tensors but this one "
                                    "is int64"));
  }
  try {
    group.allreduce(zeros({2}, kInt32));
    FAIL() << "an int32 all-reduce was accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("allreduce takes float32, float64, int64, bfloat16 or float16 "
                                    "tensors but this one is int32"));
  }
  try {
    group.allgather(zeros({3}), zeros({2}));
    FAIL() << "a wrong allgather output was accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(),
                HasSubstr("world size x input = " + std::to_string(group.size()) +
                          " x 2 = " + std::to_string(2 * group.size()) + " elements but holds 3"));
  }
  EXPECT_THAT(ErrorOf([&] { group.allgather(zeros({2 * group.size()}, kInt64), zeros({2})); }),
              HasSubstr("allgather: the output must have the input's dtype, but the input is "
                        "float32 and the output int64"));
  EXPECT_THROW(group.broadcast(zeros({2}), group.size()), Error);
  EXPECT_THROW(group.broadcast(zeros({2}), -1), Error);
  EXPECT_THROW(group.allreduce(Tensor()), Error);
  EXPECT_THROW(ProcessGroupMpi(ProcessGroupMpiOptions().max_elements_per_call(0)), Error);
  // Nothing was issued: the group still works.
  Tensor t = ones({2});
  group.allreduce(t)->wait();
  EXPECT_EQ(t.to_vector<float>()[0], group.size());
}

// bfloat16 and float16 all-reduces: each element is round(factor * sum), the sum of every
// rank's value in float32 in rank order, rounded once, bit for bit on every rank; for sizes
// that leave blocks empty (1 element on 3 ranks) and below and above the float32 all-reduce's
// ring threshold.
template <typename T>
void CheckReducedFloatAllreduce(ProcessGroupMpi& group, DType dtype,
                                const std::vector<int64_t>& sizes) {
  const int world = group.size();
  auto value = [](int rank, int64_t i) {
    // Magnitudes from 2^-10 to 2^10 with 8 significant bits: their float32 sums need more bits
    // than the 16-bit types keep, so rounding partial sums would show.
    const float mantissa = 1.0f + static_cast<float>((i * 37 + rank * 11) % 128) / 128.0f;
    return std::ldexp((i + rank) % 3 == 0 ? -mantissa : mantissa,
                      static_cast<int>((i * 7 + rank * 5) % 21) - 10);
  };
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
    for (int64_t n : sizes) {
      SCOPED_TRACE(tandem::internal::Concat(DTypeName(dtype), " ", ReduceOpName(op), " of ", n));
      std::vector<float> mine(n);
      for (int64_t i = 0; i < n; ++i) mine[i] = value(group.rank(), i);
      Tensor t = from_vector(mine, {n}).to(dtype);
      group.allreduce(t, op)->wait();
      EXPECT_EQ(t.dtype(), dtype);
      const std::vector<float> got = t.to(kFloat32).to_vector<float>();
      const float factor = op == ReduceOp::kAverage ? 1.0f / static_cast<float>(world) : 1.0f;
      int64_t wrong = 0;
      int64_t first_wrong = -1;
      for (int64_t i = 0; i < n; ++i) {
        float sum = 0.0f;
        for (int r = 0; r < world; ++r) sum += static_cast<float>(T(value(r, i)));
        const float want = static_cast<float>(T(sum * factor));
        if (std::memcmp(&want, &got[i], sizeof(float)) != 0 && ++wrong == 1) first_wrong = i;
      }
      EXPECT_EQ(wrong, 0) << "first at " << first_wrong;
    }
  }
}

TEST_F(ProcessGroupMpiTest, AllreduceBFloat16AndFloat16SumInFloat32AndRoundOnce) {
  const std::vector<int64_t> sizes = {1, 7, 1000, 300007};
  CheckReducedFloatAllreduce<BFloat16>(Group(), kBFloat16, sizes);
  CheckReducedFloatAllreduce<Half>(Group(), kFloat16, sizes);
  // Chunked by a lowered max_elements_per_call: the same results.
  ProcessGroupMpi chunked(ProcessGroupMpiOptions().max_elements_per_call(333));
  CheckReducedFloatAllreduce<BFloat16>(chunked, kBFloat16, {1, 1000, 5000});
}

// 256 + 1 + 1 on 3 ranks: 258 is a bfloat16, but a ring's partial sum 256 + 1 would round to
// 256 (257 is not one) and end at 256. On 2 ranks 257 rounds to 256 (to even) either way.
TEST_F(ProcessGroupMpiTest, BFloat16AllreduceDoesNotRoundPartialSums) {
  ProcessGroupMpi& group = Group();
  Tensor t = full({5}, group.rank() == 0 ? 256.0 : 1.0, kBFloat16);
  group.allreduce(t)->wait();
  const float sum = 256.0f + static_cast<float>(group.size() - 1);
  EXPECT_EQ(t.to(kFloat32).to_vector<float>(),
            std::vector<float>(5, static_cast<float>(BFloat16(sum))));
  if (group.size() == 3) EXPECT_EQ(t.to(kFloat32).to_vector<float>()[0], 258.0f);
}

TEST_F(ProcessGroupMpiTest, AllreduceFloat64SumsAndAverages) {
  ProcessGroupMpi& group = Group();
  const int world = group.size();
  Tensor t = full({300}, 0.1 * (group.rank() + 1), kFloat64);
  group.allreduce(t, ReduceOp::kAverage)->wait();
  double want = 0;
  for (int r = 0; r < world; ++r) want += 0.1 * (r + 1);
  for (double v : t.to_vector<double>()) EXPECT_NEAR(v, want / world, 1e-15);
}

TEST_F(ProcessGroupMpiTest, BroadcastAndAllgatherMoveEveryDtype) {
  ProcessGroupMpi& group = Group();
  const int world = group.size();
  for (DType dtype : {kFloat32, kFloat64, kInt64, kInt32, kBFloat16, kFloat16, kUInt8, kBool}) {
    SCOPED_TRACE(DTypeName(dtype));
    const double root_value = dtype == kBool ? 1.0 : 3.0;
    Tensor t = full({9}, group.rank() == 0 ? root_value : 0.0, dtype);
    group.broadcast(t, 0)->wait();
    EXPECT_EQ(t.to(kFloat64).to_vector<double>(), std::vector<double>(9, root_value));
    Tensor mine = full({3}, dtype == kBool ? group.rank() % 2 : group.rank() + 1, dtype);
    Tensor all = zeros({3 * world}, dtype);
    group.allgather(all, mine)->wait();
    const std::vector<double> got = all.to(kFloat64).to_vector<double>();
    for (int r = 0; r < world; ++r) {
      for (int k = 0; k < 3; ++k) EXPECT_EQ(got[r * 3 + k], dtype == kBool ? r % 2 : r + 1);
    }
  }
}

// ---- reduce_scatter ------------------------------------------------------------------------

// Rank r's value at global index g of a reduce_scatter input (or an all-gather's), as a double
// that every dtype below holds exactly once rounded to it: for the integers, exact integers up
// to 2^43; for the floats, magnitudes from 2^-10 to 2^10 with 8 significant bits, whose float32
// sums need more bits than float32 keeps, so that adding in another order than rank order
// shows.
double ScatterValue(DType dtype, int rank, int64_t g) {
  if (!IsFloatingPoint(dtype)) {
    return std::ldexp(static_cast<double>((g * 7919) % 1001 - 500), 33) + g * 3 + rank;
  }
  const double mantissa = 1.0 + static_cast<double>((g * 37 + rank * 11) % 128) / 128.0;
  return std::ldexp((g + rank) % 3 == 0 ? -mantissa : mantissa,
                    static_cast<int>((g * 7 + rank * 5) % 21) - 10);
}

Tensor ScatterInput(DType dtype, int rank, int64_t n) {
  std::vector<double> values(n);
  for (int64_t g = 0; g < n; ++g) values[g] = ScatterValue(dtype, rank, g);
  return from_vector(values, {n}).to(dtype);
}

// What rank `rank` must receive from reduce_scatter: chunk `rank` of every rank's input (as
// rounded to T), added in rank order in Acc (float32 for the 16-bit types, T otherwise), times
// `factor`, rounded to T once; as doubles (which hold every T exactly).
template <typename T, typename Acc>
std::vector<double> ExpectedScatter(DType dtype, int world, int rank, int64_t chunk, Acc factor) {
  std::vector<std::vector<double>> inputs;
  for (int q = 0; q < world; ++q) {
    inputs.push_back(ScatterInput(dtype, q, world * chunk).to(kFloat64).to_vector<double>());
  }
  std::vector<double> want(chunk);
  for (int64_t i = 0; i < chunk; ++i) {
    Acc sum = static_cast<Acc>(inputs[0][rank * chunk + i]);
    for (int q = 1; q < world; ++q) sum += static_cast<Acc>(inputs[q][rank * chunk + i]);
    if (factor != Acc{1}) sum *= factor;
    want[i] = static_cast<double>(static_cast<Acc>(T(sum)));
  }
  return want;
}

template <typename T, typename Acc>
void CheckReduceScatter(ProcessGroup& group, DType dtype, const std::vector<int64_t>& chunks) {
  const int world = group.size();
  std::vector<ReduceOp> ops = {ReduceOp::kSum};
  if (IsFloatingPoint(dtype)) ops.push_back(ReduceOp::kAverage);
  for (ReduceOp op : ops) {
    for (int64_t chunk : chunks) {
      SCOPED_TRACE(tandem::internal::Concat(DTypeName(dtype), " ", ReduceOpName(op), " of ", world,
                                            " x ", chunk));
      const Tensor input = ScatterInput(dtype, group.rank(), world * chunk);
      const Tensor before = input.clone();
      Tensor output = full({chunk}, 7.0, dtype);
      std::shared_ptr<Work> work = group.reduce_scatter(output, input, op);
      work->wait();
      EXPECT_TRUE(work->is_completed());
      EXPECT_EQ(output.dtype(), dtype);
      const Acc factor = op == ReduceOp::kAverage ? Acc(1) / static_cast<Acc>(world) : Acc(1);
      const std::vector<double> want =
          ExpectedScatter<T, Acc>(dtype, world, group.rank(), chunk, factor);
      const std::vector<double> got = output.to(kFloat64).to_vector<double>();
      int64_t wrong = 0;
      int64_t first_wrong = -1;
      for (int64_t i = 0; i < chunk; ++i) {
        if (got[i] != want[i] && ++wrong == 1) first_wrong = i;
      }
      EXPECT_EQ(wrong, 0) << "first at " << first_wrong << ": got "
                          << (first_wrong >= 0 ? got[first_wrong] : 0) << ", want "
                          << (first_wrong >= 0 ? want[first_wrong] : 0);
      EXPECT_EQ(testing::MaxAbsDiff(input, before), 0.0) << "the input was changed";
    }
  }
}

// Chunks of no size, one element, and primes (not multiples of any vector width, piece or rank
// count), one of them over one 4 MB window of float32.
TEST_F(ProcessGroupMpiTest, ReduceScatterOfEveryDTypeSumsChunkRankInRankOrder) {
  ProcessGroupMpi& group = Group();
  const std::vector<int64_t> chunks = {0, 1, 7, 1009, 65537};
  CheckReduceScatter<float, float>(group, kFloat32, {0, 1, 7, 1009, 65537, (1 << 20) + 3});
  CheckReduceScatter<double, double>(group, kFloat64, chunks);
  CheckReduceScatter<int64_t, int64_t>(group, kInt64, chunks);
  CheckReduceScatter<BFloat16, float>(group, kBFloat16, chunks);
  CheckReduceScatter<Half, float>(group, kFloat16, chunks);
}

// Windows of at most max_elements_per_call elements, the next in flight while one is added:
// 23 elements per rank in windows of 7 (three and a part), the same results.
TEST_F(ProcessGroupMpiTest, ReduceScatterInWindowsGivesTheSameResults) {
  ProcessGroupMpi chunked(
      ProcessGroupMpiOptions().timeout(std::chrono::seconds(60)).max_elements_per_call(7));
  CheckReduceScatter<float, float>(chunked, kFloat32, {6, 7, 8, 23});
  CheckReduceScatter<int64_t, int64_t>(chunked, kInt64, {23});
  CheckReduceScatter<BFloat16, float>(chunked, kBFloat16, {23});
}

// ZeRO's step in miniature: reduce_scatter then allgather of the shards give what allreduce
// gives, issued together with other collectives and waited for in reverse order. Integer
// values, so that every algorithm's order of additions gives the same sums.
TEST_F(ProcessGroupMpiTest, ReduceScatterThenAllgatherEqualsAllreduce) {
  ProcessGroupMpi& group = Group();
  const int world = group.size();
  for (int64_t chunk : {int64_t{1}, int64_t{13}, int64_t{4099}}) {
    std::vector<float> values(world * chunk);
    for (int64_t g = 0; g < world * chunk; ++g) {
      values[g] = static_cast<float>((g * 31 + group.rank() * 7) % 1000);
    }
    Tensor gradients = from_vector(values, {world * chunk});
    Tensor reference = gradients.clone();
    Tensor shard = zeros({chunk});
    Tensor gathered = zeros({world, chunk});
    std::vector<std::shared_ptr<Work>> works;
    works.push_back(group.reduce_scatter(shard, gradients, ReduceOp::kAverage));
    works.push_back(group.allreduce(reference, ReduceOp::kAverage));
    works.push_back(group.allgather(gathered, shard));
    works.push_back(group.barrier());
    for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait();
    EXPECT_EQ(gathered.reshape({-1}).to_vector<float>(), reference.to_vector<float>())
        << "chunk " << chunk;
  }
}

TEST_F(ProcessGroupMpiTest, ReduceScatterMisuseIsAClearErrorOnEveryRank) {
  ProcessGroupMpi& group = Group();
  const int world = group.size();
  const std::string rank = "ProcessGroupMpi rank " + std::to_string(group.rank()) + " of " +
                           std::to_string(world) + ": reduce_scatter";
  auto error = [&](Tensor output, Tensor input, ReduceOp op = ReduceOp::kSum) {
    return ErrorOf([&] { group.reduce_scatter(output, input, op); });
  };
  EXPECT_THAT(error(zeros({2}), zeros({2 * world + 1})),
              HasSubstr(rank + ": the input must hold world size x output = " +
                        std::to_string(world) + " x 2 = " + std::to_string(2 * world) +
                        " elements but holds " + std::to_string(2 * world + 1) +
                        ", not a multiple of the world size; pad the input to a multiple of " +
                        std::to_string(world) + " elements"));
  EXPECT_THAT(error(zeros({3}), zeros({2 * world})),
              HasSubstr("but holds " + std::to_string(2 * world) +
                        "; make the output input.numel() / world size = 2 elements"));
  EXPECT_THAT(error(zeros({2}), zeros({2 * world}, kFloat64)),
              HasSubstr(rank + ": the output must have the input's dtype, but the input is "
                               "float64 and the output float32; convert one of them with "
                               ".to(dtype)"));
  EXPECT_THAT(error(zeros({2}, kInt32), zeros({2 * world}, kInt32)),
              HasSubstr(rank + " takes float32, float64, int64, bfloat16 or float16 tensors but "
                               "these are int32"));
  EXPECT_THAT(error(zeros({2}, kInt64), zeros({2 * world}, kInt64), ReduceOp::kAverage),
              HasSubstr(rank + ": average is defined for floating-point tensors but these are "
                               "int64; use ReduceOp::kSum"));
  EXPECT_THAT(error(zeros({2}), zeros({2, world}).t().reshape({world, 2}).t()),
              HasSubstr(rank + ": the input tensor must be contiguous; call .contiguous()"));
  EXPECT_THAT(error(zeros({2, 3}).t(), zeros({6 * world})),
              HasSubstr(rank + ": the output tensor must be contiguous"));
  EXPECT_THAT(error(Tensor(), zeros({world})),
              HasSubstr(rank + ": the output tensor is undefined"));
  Tensor both = zeros({3 * world});
  EXPECT_THAT(error(both.narrow(0, 0, 3), both),
              HasSubstr(rank + ": the output must not share storage with the input"));
  // Nothing was issued: the group still works.
  Tensor out = zeros({2});
  group.reduce_scatter(out, ones({2 * world}))->wait();
  EXPECT_EQ(out.to_vector<float>(), std::vector<float>(2, static_cast<float>(world)));
}

// Ranks that reduce_scatter different sizes, dtypes or ops, or that run an all-reduce against
// it, fail at once naming both sides. Every rank receives from every other one, so every rank
// sees the last rank's difference (except, against an all-reduce on 3 ranks, rank 1, whom the
// all-reduce's ring does not send to: it times out).
TEST_F(ProcessGroupMpiTest, RanksThatDisagreeOnAReduceScatterFailNamingBothSides) {
  const int size = Group().size();
  const int last = size - 1;
  struct Case {
    int64_t chunk, last_chunk;
    DType last_dtype;
    ReduceOp last_op;
    bool last_allreduces;
    std::string rank0_sees;
  };
  const std::string from_last = ", rank " + std::to_string(last) + " sent ";
  const std::vector<Case> cases = {
      {2, 4, kFloat32, ReduceOp::kSum, false,
       "the ranks disagree on the size of the reduce-scatter: rank 0 (this rank) has 2 float32 "
       "elements per rank (sum)" +
           from_last + "4 float32 elements per rank (sum)"},
      {300, 200, kFloat32, ReduceOp::kSum, false,
       "the ranks disagree on the size of the reduce-scatter: rank 0 (this rank) has 300 float32 "
       "elements per rank (sum)" +
           from_last + "200 float32 elements per rank (sum)"},
      {64, 64, kFloat32, ReduceOp::kAverage, false,
       "the ranks disagree on the op of the reduce-scatter: rank 0 (this rank) has 64 float32 "
       "elements per rank (sum)" +
           from_last + "64 float32 elements per rank (average)"},
      {64, 64, kBFloat16, ReduceOp::kSum, false,
       "the ranks disagree on the dtype of the reduce-scatter: rank 0 (this rank) has 64 float32 "
       "elements per rank (sum)" +
           from_last + "64 bfloat16 elements per rank (sum)"},
      {64, 64, kFloat32, ReduceOp::kSum, true,
       "the ranks run different collectives: rank 0 (this rank) runs a reduce-scatter of 64 "
       "float32 elements per rank (sum)" +
           from_last + "a message of an all-reduce of " + std::to_string(64 * size) +
           " float32 elements (sum); every rank must issue the same collectives in the same "
           "order"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.rank0_sees);
    ProcessGroupMpi fragile(ProcessGroupMpiOptions().timeout(std::chrono::milliseconds(500)));
    const bool odd = fragile.rank() == last;
    const int64_t chunk = odd ? c.last_chunk : c.chunk;
    const DType dtype = odd ? c.last_dtype : kFloat32;
    Tensor input = ones({size * chunk}, dtype);
    Tensor output = zeros({chunk}, dtype);
    const std::string error = ErrorOf([&] {
      if (odd && c.last_allreduces) {
        fragile.allreduce(input)->wait();
      } else {
        fragile.reduce_scatter(output, input, odd ? c.last_op : ReduceOp::kSum)->wait();
      }
    });
    if (c.last_allreduces && size == 3 && fragile.rank() == 1) {
      EXPECT_THAT(error, HasSubstr("did not finish within 0.5 s"));
    } else if (c.last_allreduces) {
      EXPECT_THAT(error, HasSubstr("the ranks run different collectives"));
    } else {
      EXPECT_THAT(error, HasSubstr("every rank must reduce_scatter tensors of the same size and "
                                   "dtype with the same op"));
    }
    if (fragile.rank() == 0) EXPECT_THAT(error, HasSubstr(c.rank0_sees));
    if (odd && !c.last_allreduces) {
      EXPECT_THAT(error, HasSubstr("rank " + std::to_string(last) + " (this rank) has " +
                                   std::to_string(c.last_chunk) + " " + DTypeName(c.last_dtype)));
      // On 3 ranks the first message of the others that arrives names its sender.
      const std::string sent = " sent " + std::to_string(c.chunk) + " float32";
      EXPECT_THAT(error, AnyOf(HasSubstr("rank 0" + sent), HasSubstr("rank 1" + sent)));
    }
    Group().barrier()->wait();
  }
}

// Ranks that all-gather different sizes or dtypes fail at once on every rank, naming both
// sides (MPI_Iallgather aborted the job on the rank sent too much, and took too little silently).
TEST_F(ProcessGroupMpiTest, RanksThatDisagreeOnAnAllgatherFailNamingBothSides) {
  const int size = Group().size();
  const int last = size - 1;
  for (DType last_dtype : {kFloat32, kInt32}) {
    ProcessGroupMpi fragile(ProcessGroupMpiOptions().timeout(std::chrono::milliseconds(500)));
    const bool odd = fragile.rank() == last;
    const int64_t n = odd && last_dtype == kFloat32 ? 5 : 3;
    const DType dtype = odd ? last_dtype : kFloat32;
    Tensor output = zeros({n * size}, dtype);
    const std::string error = ErrorOf([&] { fragile.allgather(output, ones({n}, dtype))->wait(); });
    const std::string what = last_dtype == kFloat32 ? "size" : "dtype";
    const std::string theirs = last_dtype == kFloat32 ? "5 float32" : "3 int32";
    EXPECT_THAT(error, HasSubstr("the ranks disagree on the " + what + " of the all-gather"));
    EXPECT_THAT(error, HasSubstr("every rank must all-gather an input of the same size and dtype"));
    if (fragile.rank() == 0) {
      EXPECT_THAT(error,
                  HasSubstr("rank 0 (this rank) has 3 float32 elements per rank, rank " +
                            std::to_string(last) + " sent " + theirs + " elements per rank"));
    }
    Group().barrier()->wait();
  }
}

// A rank that never joins a reduce_scatter: the others fail after the timeout, naming it.
TEST_F(ProcessGroupMpiTest, ARankThatSkipsAReduceScatterIsNamedAfterTheTimeout) {
  ProcessGroupMpi fragile(ProcessGroupMpiOptions()
                              .timeout(std::chrono::milliseconds(1500))
                              .timeout_name("--collective_timeout"));
  const int world = fragile.size();
  if (fragile.rank() != 1) {
    Tensor output = zeros({5});
    const std::string error =
        ErrorOf([&] { fragile.reduce_scatter(output, ones({5 * world}))->wait(); });
    EXPECT_THAT(
        error, HasSubstr("rank " + std::to_string(fragile.rank()) + " of " + std::to_string(world) +
                         ": reduce_scatter (sum) of " + std::to_string(5 * world) +
                         " float32 elements, 5 per rank did not finish within 1.5 s: rank "
                         "1 did not answer (stopped, hung or dead"));
    EXPECT_THAT(error, HasSubstr("raise --collective_timeout if a rank is only slow"));
    if (world == 3) {
      EXPECT_THAT(error, HasSubstr("rank " + std::to_string(2 - fragile.rank()) +
                                   " waits in this collective too"));
    }
    EXPECT_THAT(ErrorOf([&] { fragile.reduce_scatter(output, ones({5 * world})); }),
                HasSubstr("failed earlier"));
  }
  Group().barrier()->wait();
}

// A rank that fails before a collective: the others get an error within the timeout instead
// of hanging, naming their rank and the collective; the group refuses later collectives.
TEST_F(ProcessGroupMpiTest, ARankThatThrowsBeforeACollectiveMakesTheOthersFailInTime) {
  ProcessGroupMpi fragile(ProcessGroupMpiOptions().timeout(std::chrono::milliseconds(1500)));
  Tensor t = ones({64});
  auto step = [&] {
    if (fragile.rank() == 1) throw std::runtime_error("rank 1 failed before the allreduce");
    fragile.allreduce(t)->wait();
  };
  const auto start = std::chrono::steady_clock::now();
  if (fragile.rank() == 1) {
    EXPECT_THROW(step(), std::runtime_error);
  } else {
    try {
      step();
      FAIL() << "the allreduce finished without rank 1";
    } catch (const Error& e) {
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      EXPECT_LT(seconds, 30.0);
      EXPECT_THAT(e.what(), HasSubstr("rank " + std::to_string(fragile.rank())));
      EXPECT_THAT(e.what(), HasSubstr("allreduce (sum) of 64 float32 elements"));
      EXPECT_THAT(e.what(), HasSubstr("did not finish within 1.5 s"));
    }
    try {
      fragile.barrier();
      FAIL() << "a failed group accepted a collective";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("failed earlier"));
    }
  }
  // The healthy group still works on every rank.
  Group().barrier()->wait();
}

// Ranks that all-reduce tensors of different sizes, dtypes or ops fail at once with an error
// naming both sides, instead of MPI_ERR_IN_STATUS (the larger message truncated), a hang (fewer
// messages than the receiver expects) or wrong numbers (a shorter message received silently).
// On 3 ranks (a ring) the last rank differs: rank 0, which receives from it, and the last rank,
// which receives from rank 1, see the difference; rank 1 only sees rank 0 stop, and times out.
TEST_F(ProcessGroupMpiTest, RanksThatDisagreeOnAnAllreduceFailNamingBothSides) {
  const int size = Group().size();
  const int last = size - 1;
  struct Case {
    int64_t numel, last_numel;
    DType last_dtype;
    ReduceOp last_op;
    std::string rank0_sees;  // on rank 0, from the last rank
  };
  const std::vector<Case> cases = {
      // One message each way; the last rank's is longer.
      {2, 4, kFloat32, ReduceOp::kSum,
       "the ranks disagree on the size of the all-reduce: rank 0 (this rank) has 2 float32 "
       "elements (sum), rank " +
           std::to_string(last) + " sent 4 float32 elements (sum)"},
      // Two messages against three (4,032-byte pieces): the receiver of two messages waits
      // for a third that never comes, but sees the first's tag.
      {2000, 3000, kFloat32, ReduceOp::kSum,
       "rank 0 (this rank) has 2000 float32 elements (sum), rank " + std::to_string(last) +
           " sent 3000 float32 elements (sum)"},
      {64, 64, kFloat32, ReduceOp::kAverage,
       "the ranks disagree on the op of the all-reduce: rank 0 (this rank) has 64 float32 "
       "elements (sum), rank " +
           std::to_string(last) + " sent 64 float32 elements (average)"},
      {64, 64, kInt64, ReduceOp::kSum,
       "the ranks disagree on the dtype of the all-reduce: rank 0 (this rank) has 64 float32 "
       "elements (sum), rank " +
           std::to_string(last) + " sent 64 int64 elements (sum)"},
      // A float32 all-reduce against a compressed (bfloat16) one: another algorithm too.
      {64, 64, kBFloat16, ReduceOp::kSum,
       "the ranks disagree on the dtype of the all-reduce: rank 0 (this rank) has 64 float32 "
       "elements (sum), rank " +
           std::to_string(last) + " sent 64 bfloat16 elements (sum)"},
  };
  for (const Case& c : cases) {
    ProcessGroupMpi fragile(ProcessGroupMpiOptions().timeout(std::chrono::milliseconds(500)));
    const bool odd = fragile.rank() == last;
    Tensor t = odd ? ones({c.last_numel}, c.last_dtype) : ones({c.numel});
    const std::string error =
        ErrorOf([&] { fragile.allreduce(t, odd ? c.last_op : ReduceOp::kSum)->wait(); });
    SCOPED_TRACE(c.rank0_sees);
    if (size == 2 || fragile.rank() != 1) {
      EXPECT_THAT(error, HasSubstr("every rank must all-reduce a tensor of the same size"));
    } else {
      EXPECT_THAT(error, HasSubstr("did not finish within 0.5 s"));
    }
    if (fragile.rank() == 0) {
      EXPECT_THAT(error, HasSubstr(c.rank0_sees));
    }
    if (size == 2 && fragile.rank() == last) {
      EXPECT_THAT(error, HasSubstr("rank 1 (this rank) has " + std::to_string(c.last_numel)));
      EXPECT_THAT(error, HasSubstr("rank 1 (this rank) has " + std::to_string(c.last_numel) + " " +
                                   DTypeName(c.last_dtype)));
      EXPECT_THAT(error, HasSubstr("rank 0 sent " + std::to_string(c.numel) + " float32"));
    }
    Group().barrier()->wait();
  }
}

// A rank that stops (SIGSTOP) in the middle of the job: the others' collective fails after
// the timeout, naming the collective and the rank that did not answer, and (on 3 ranks) that
// the other live rank waits in the same collective. Rank 0 then resumes it (SIGCONT).
TEST_F(ProcessGroupMpiTest, AStoppedRankIsNamedByTheOthersAfterTheTimeout) {
  ProcessGroupMpi fragile(ProcessGroupMpiOptions()
                              .timeout(std::chrono::milliseconds(1500))
                              .timeout_name("--collective_timeout"));
  Tensor pids = zeros({fragile.size()}, kInt64);
  fragile.allgather(pids, full({1}, static_cast<double>(getpid()), kInt64))->wait();
  if (fragile.rank() == 1) {
    raise(SIGSTOP);  // until rank 0 sends SIGCONT
  } else {
    Tensor t = ones({1000});
    const std::string error = ErrorOf([&] { fragile.allreduce(t)->wait(); });
    if (fragile.rank() == 0) kill(static_cast<pid_t>(pids.to_vector<int64_t>()[1]), SIGCONT);
    EXPECT_THAT(error, HasSubstr("rank " + std::to_string(fragile.rank()) + " of " +
                                 std::to_string(fragile.size()) +
                                 ": allreduce (sum) of 1000 float32 elements did not finish "
                                 "within 1.5 s: rank 1 did not answer (stopped, hung or dead"));
    EXPECT_THAT(error, HasSubstr("raise --collective_timeout if a rank is only slow"));
    if (fragile.size() == 3) {
      EXPECT_THAT(error, HasSubstr("rank " + std::to_string(2 - fragile.rank()) +
                                   " waits in this collective too"));
    }
  }
  Group().barrier()->wait();
}

// Ranks that issue different collectives: the error of the one that times out says which
// collective each other rank waits in. The other ranks wait longer (4 s), so that they are
// still in their collective when rank 0 asks; with equal timeouts they could leave it at the
// moment the question comes, and rank 0 would read "did not answer".
TEST_F(ProcessGroupMpiTest, RanksInDifferentCollectivesAreNamedWithTheirs) {
  ProcessGroupMpi fragile(ProcessGroupMpiOptions().timeout(
      std::chrono::milliseconds(Group().rank() == 0 ? 1500 : 4000)));
  Tensor t = ones({16});
  fragile.allreduce(t)->wait();
  const std::string error = ErrorOf([&] {
    if (fragile.rank() == 0) {
      fragile.allreduce(t)->wait();
    } else {
      fragile.barrier()->wait();
    }
  });
  if (fragile.rank() == 0) {
    EXPECT_THAT(error, HasSubstr("allreduce (sum) of 16 float32 elements did not finish within "
                                 "1.5 s: rank 1 waits in its collective number 2 (barrier)"));
    EXPECT_THAT(error, HasSubstr("where this rank is in its collective number 2"));
  } else {
    // Rank 0 has left its all-reduce by now (it timed out first): it is named as not
    // answering, or, if it still was in it, with its collective.
    EXPECT_THAT(error, HasSubstr("barrier did not finish within 4.0 s: "));
    EXPECT_THAT(error, HasSubstr("rank 0 "));
  }
  Group().barrier()->wait();
}

}  // namespace
}  // namespace tandem::parallel::distributed
