// cudasim's NCCL against host arithmetic: every collective, type and operation, results that
// span several staging rounds, in-place forms, communicators from ncclCommInitAll and from
// ncclCommInitRank (a group in one thread, and one thread per rank), NCCL's argument checks,
// and the failures a GPU would hang on (mismatched calls, a rank that never comes, an abort)
// reported with the ranks' names. Runs with three simulated devices (BUILD sets
// TANDEM_CUDASIM_DEVICES=3). Ranks in other processes: process_group_nccl_test under mpirun.
#include <cuda_runtime.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "tools/cudasim/float16.h"

namespace cudasim_tests {
namespace {

using ::testing::HasSubstr;

constexpr int kRanks = 3;

// Bytes per element, by ncclDataType_t value (ncclInt8 ... ncclBfloat16).
size_t SizeOf(ncclDataType_t type) {
  constexpr size_t kSizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
  return kSizes[type];
}

// Host values to and from a buffer of `type` (values the tests use are exact in every type).
void Store(ncclDataType_t type, void* data, size_t i, double v) {
  char* p = static_cast<char*>(data) + i * SizeOf(type);
  auto put = [&](auto x) { std::memcpy(p, &x, sizeof(x)); };
  switch (type) {
    case ncclInt8:
      return put(static_cast<int8_t>(v));
    case ncclUint8:
      return put(static_cast<uint8_t>(v));
    case ncclInt32:
      return put(static_cast<int32_t>(v));
    case ncclUint32:
      return put(static_cast<uint32_t>(v));
    case ncclInt64:
      return put(static_cast<int64_t>(v));
    case ncclUint64:
      return put(static_cast<uint64_t>(v));
    case ncclFloat16:
      return put(cudasim::internal::FloatToHalf(static_cast<float>(v)));
    case ncclBfloat16:
      return put(cudasim::internal::FloatToBFloat16(static_cast<float>(v)));
    case ncclFloat32:
      return put(static_cast<float>(v));
    default:
      return put(v);
  }
}

double Load(ncclDataType_t type, const void* data, size_t i) {
  const char* p = static_cast<const char*>(data) + i * SizeOf(type);
  auto get = [&](auto x) {
    std::memcpy(&x, p, sizeof(x));
    return x;
  };
  switch (type) {
    case ncclInt8:
      return get(int8_t{});
    case ncclUint8:
      return get(uint8_t{});
    case ncclInt32:
      return get(int32_t{});
    case ncclUint32:
      return get(uint32_t{});
    case ncclInt64:
      return static_cast<double>(get(int64_t{}));
    case ncclUint64:
      return static_cast<double>(get(uint64_t{}));
    case ncclFloat16:
      return cudasim::internal::HalfToFloat(get(uint16_t{}));
    case ncclBfloat16:
      return cudasim::internal::BFloat16ToFloat(get(uint16_t{}));
    case ncclFloat32:
      return get(float{});
    default:
      return get(double{});
  }
}

bool IsFloat(ncclDataType_t type) {
  return type == ncclFloat16 || type == ncclBfloat16 || type == ncclFloat32 || type == ncclFloat64;
}

// Rank r's element i: small integers (signed types: some negative), exact in every type, whose
// sums, products of three, and averages in halves stay exact.
double Value(ncclDataType_t type, int r, size_t i) {
  const bool is_signed = type != ncclUint8 && type != ncclUint32 && type != ncclUint64;
  return static_cast<double>((i * 7 + r * 3) % 5) - (is_signed ? 2.0 : 0.0) + r;
}

// One device buffer of `count` elements of `type` per rank, with the rank's values.
struct Buffers {
  std::vector<void*> data;
  Buffers(ncclDataType_t type, size_t count, bool fill) : data(kRanks) {
    for (int r = 0; r < kRanks; ++r) {
      EXPECT_EQ(cudaSetDevice(r), cudaSuccess);
      EXPECT_EQ(cudaMalloc(&data[r], count * SizeOf(type)), cudaSuccess);
      std::vector<char> host(count * SizeOf(type));
      for (size_t i = 0; i < count && fill; ++i) Store(type, host.data(), i, Value(type, r, i));
      if (fill) {
        EXPECT_EQ(cudaMemcpy(data[r], host.data(), host.size(), cudaMemcpyHostToDevice),
                  cudaSuccess);
      }
    }
    cudaSetDevice(0);
  }
  ~Buffers() {
    for (void* p : data) cudaFree(p);
  }
  std::vector<char> Host(int r, size_t bytes) const {
    std::vector<char> host(bytes);
    EXPECT_EQ(cudaMemcpy(host.data(), data[r], bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }
};

class NcclTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
    ASSERT_GE(count, kRanks) << "BUILD sets TANDEM_CUDASIM_DEVICES=3";
    ASSERT_EQ(ncclCommInitAll(comms_, kRanks, nullptr), ncclSuccess) << ncclGetLastError(nullptr);
  }
  void TearDown() override {
    for (ncclComm_t comm : comms_) EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
    cudaSetDevice(0);
  }
  // Each rank's call, inside one group (one thread drives every rank).
  template <typename F>
  void OnEveryRank(F&& call) {
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < kRanks; ++r) ASSERT_EQ(call(r), ncclSuccess) << ncclGetLastError(nullptr);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
    for (int r = 0; r < kRanks; ++r) {
      ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    }
  }
  ncclComm_t comms_[kRanks] = {};
};

TEST(NcclApiTest, VersionAndErrorStrings) {
  int version = 0;
  ASSERT_EQ(ncclGetVersion(&version), ncclSuccess);
  EXPECT_EQ(version, NCCL_VERSION_CODE);
  EXPECT_EQ(version, NCCL_VERSION(2, 28, 9));
  EXPECT_STREQ(ncclGetErrorString(ncclSuccess), "no error");
  EXPECT_THAT(ncclGetErrorString(ncclInvalidArgument), HasSubstr("invalid argument"));
}

TEST_F(NcclTest, CommunicatorQueries) {
  for (int r = 0; r < kRanks; ++r) {
    int count = 0, device = -1, rank = -1;
    ASSERT_EQ(ncclCommCount(comms_[r], &count), ncclSuccess);
    ASSERT_EQ(ncclCommCuDevice(comms_[r], &device), ncclSuccess);
    ASSERT_EQ(ncclCommUserRank(comms_[r], &rank), ncclSuccess);
    EXPECT_EQ(count, kRanks);
    EXPECT_EQ(device, r);
    EXPECT_EQ(rank, r);
  }
}

// All-reduce of every type with every operation, against host arithmetic in rank order.
TEST_F(NcclTest, AllReduceEveryTypeAndOperation) {
  const size_t count = 1000;
  for (ncclDataType_t type : {ncclInt8, ncclUint8, ncclInt32, ncclUint32, ncclInt64, ncclUint64,
                              ncclFloat16, ncclBfloat16, ncclFloat32, ncclFloat64}) {
    for (ncclRedOp_t op : {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg}) {
      Buffers send(type, count, true), recv(type, count, false);
      OnEveryRank([&](int r) {
        return ncclAllReduce(send.data[r], recv.data[r], count, type, op, comms_[r], nullptr);
      });
      for (int r = 0; r < kRanks; ++r) {
        const std::vector<char> got = recv.Host(r, count * SizeOf(type));
        for (size_t i = 0; i < count; ++i) {
          double want = Value(type, 0, i);
          for (int q = 1; q < kRanks; ++q) {
            const double v = Value(type, q, i);
            want = op == ncclProd  ? want * v
                   : op == ncclMax ? std::max(want, v)
                   : op == ncclMin ? std::min(want, v)
                                   : want + v;
          }
          if (op == ncclAvg) want = IsFloat(type) ? want / kRanks : std::trunc(want / kRanks);
          // Float averages pre-multiply by 1/3, which rounds: within a few of the type's ulps.
          const double tolerance = op == ncclAvg && IsFloat(type) ? 0.05 : 0.0;
          ASSERT_NEAR(Load(type, got.data(), i), want, tolerance)
              << "type " << type << " op " << op << " rank " << r << " element " << i;
        }
      }
    }
  }
}

// bfloat16 sums round at every step, as NCCL's reductions do: 1 + 2^-8 ties to 1 (even), and
// again, where a float sum rounded once would give 1 + 2^-7.
TEST_F(NcclTest, SixteenBitSumsRoundEachStep) {
  Buffers x(ncclBfloat16, 1, false);
  const double values[kRanks] = {1.0, std::ldexp(1.0, -8), std::ldexp(1.0, -8)};
  for (int r = 0; r < kRanks; ++r) {
    uint16_t bits = cudasim::internal::FloatToBFloat16(static_cast<float>(values[r]));
    ASSERT_EQ(cudaMemcpy(x.data[r], &bits, 2, cudaMemcpyHostToDevice), cudaSuccess);
  }
  OnEveryRank([&](int r) {
    return ncclAllReduce(x.data[r], x.data[r], 1, ncclBfloat16, ncclSum, comms_[r], nullptr);
  });
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(Load(ncclBfloat16, x.Host(r, 2).data(), 0), 1.0);
}

// Broadcast, reduce, all-gather and reduce-scatter, large enough for several staging rounds,
// out of place and in place, from every root.
TEST_F(NcclTest, RootedAndGatheringCollectivesOverSeveralRounds) {
  const size_t count = 300000;  // 1.2 MB of float32 per rank: two rounds of 1 MiB
  const ncclDataType_t type = ncclFloat32;
  for (int root = 0; root < kRanks; ++root) {
    Buffers send(type, count, true), recv(type, count, false);
    OnEveryRank([&](int r) {
      return ncclBroadcast(send.data[r], recv.data[r], count, type, root, comms_[r], nullptr);
    });
    for (int r = 0; r < kRanks; ++r) {
      const std::vector<char> got = recv.Host(r, count * 4);
      for (size_t i = 0; i < count; i += 997)
        ASSERT_EQ(Load(type, got.data(), i), Value(type, root, i));
    }
    OnEveryRank([&](int r) {
      return ncclReduce(send.data[r], send.data[r], count, type, ncclSum, root, comms_[r], nullptr);
    });
    const std::vector<char> sum = send.Host(root, count * 4);
    for (size_t i = 0; i < count; i += 997) {
      ASSERT_EQ(Load(type, sum.data(), i),
                Value(type, 0, i) + Value(type, 1, i) + Value(type, 2, i));
    }
    const std::vector<char> untouched = send.Host((root + 1) % kRanks, count * 4);
    EXPECT_EQ(Load(type, untouched.data(), 5), Value(type, (root + 1) % kRanks, 5));
  }
  // All-gather in place: rank r's part already sits at r * part.
  const size_t part = 200000;
  Buffers gathered(type, part * kRanks, true);
  OnEveryRank([&](int r) {
    char* own = static_cast<char*>(gathered.data[r]) + r * part * 4;
    return ncclAllGather(own, gathered.data[r], part, type, comms_[r], nullptr);
  });
  for (int r = 0; r < kRanks; ++r) {
    const std::vector<char> got = gathered.Host(r, part * kRanks * 4);
    for (int q = 0; q < kRanks; ++q) {
      for (size_t i = 0; i < part; i += 991) {
        ASSERT_EQ(Load(type, got.data(), q * part + i), Value(type, q, q * part + i)) << r << q;
      }
    }
  }
  // Reduce-scatter: rank r receives the sum of every rank's r-th part.
  Buffers scattered_in(type, part * kRanks, true), scattered(type, part, false);
  OnEveryRank([&](int r) {
    return ncclReduceScatter(scattered_in.data[r], scattered.data[r], part, type, ncclSum,
                             comms_[r], nullptr);
  });
  for (int r = 0; r < kRanks; ++r) {
    const std::vector<char> got = scattered.Host(r, part * 4);
    for (size_t i = 0; i < part; i += 991) {
      double want = 0;
      for (int q = 0; q < kRanks; ++q) want += Value(type, q, r * part + i);
      ASSERT_EQ(Load(type, got.data(), i), want) << r << " " << i;
    }
  }
}

// NCCL's argument checks: each a clear ncclInvalidArgument with a last-error message.
TEST_F(NcclTest, ArgumentChecks) {
  Buffers x(ncclFloat32, 64, true);  // 256 bytes: exactly a cudaMalloc block
  auto error = [](ncclResult_t result) {
    EXPECT_EQ(result, ncclInvalidArgument);
    return std::string(ncclGetLastError(nullptr));
  };
  EXPECT_THAT(
      error(ncclAllReduce(x.data[0], x.data[0], 64, ncclFloat32, ncclSum, nullptr, nullptr)),
      HasSubstr("comm is NULL"));
  EXPECT_THAT(
      error(ncclAllReduce(x.data[0], x.data[0], 64, ncclFloat8e4m3, ncclSum, comms_[0], nullptr)),
      HasSubstr("datatype 10"));
  EXPECT_THAT(
      error(ncclAllReduce(x.data[0], x.data[0], 64, ncclFloat32, ncclNumOps, comms_[0], nullptr)),
      HasSubstr("op 5"));
  EXPECT_THAT(
      error(ncclBroadcast(x.data[0], x.data[0], 64, ncclFloat32, kRanks, comms_[0], nullptr)),
      HasSubstr("root 3 is not a rank"));
  EXPECT_THAT(
      error(ncclReduce(x.data[0], x.data[0], 64, ncclFloat32, ncclSum, -1, comms_[0], nullptr)),
      HasSubstr("root -1"));
  std::vector<float> host(64);
  EXPECT_THAT(
      error(ncclAllReduce(host.data(), x.data[0], 64, ncclFloat32, ncclSum, comms_[0], nullptr)),
      HasSubstr("sendbuff"));
  EXPECT_THAT(
      error(ncclAllReduce(x.data[0], x.data[0], 65, ncclFloat32, ncclSum, comms_[0], nullptr)),
      HasSubstr("not inside one cudaMalloc block"));
  EXPECT_THAT(
      error(ncclAllReduce(x.data[1], x.data[1], 64, ncclFloat32, ncclSum, comms_[0], nullptr)),
      HasSubstr("memory of cuda:1 but the communicator's device is cuda:0"));
  EXPECT_THAT(error(ncclAllGather(x.data[0], x.data[0], 64, ncclFloat32, comms_[0], nullptr)),
              HasSubstr("recvbuff"));  // needs 3 x 64 elements
  cudaStream_t other = nullptr;
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  ASSERT_EQ(cudaStreamCreate(&other), cudaSuccess);
  EXPECT_THAT(
      error(ncclAllReduce(x.data[0], x.data[0], 64, ncclFloat32, ncclSum, comms_[0], other)),
      HasSubstr("stream is on cuda:1"));
  ASSERT_EQ(cudaStreamDestroy(other), cudaSuccess);
  // Non-root ranks' unused buffers are not checked, as in NCCL.
  OnEveryRank([&](int r) {
    return ncclReduce(x.data[r], r == 0 ? x.data[r] : nullptr, 64, ncclFloat32, ncclSum, 0,
                      comms_[r], nullptr);
  });
}

TEST(NcclApiTest, DuplicateGpusAndBadIdsAreRefused) {
  ncclComm_t comms[2] = {};
  const int same[2] = {1, 1};
  EXPECT_EQ(ncclCommInitAll(comms, 2, same), ncclInvalidUsage);
  EXPECT_THAT(ncclGetLastError(nullptr), HasSubstr("Duplicate GPU detected"));
  ncclUniqueId zero;
  std::memset(&zero, 0, sizeof(zero));
  ncclComm_t comm = nullptr;
  EXPECT_EQ(ncclCommInitRank(&comm, 2, zero, 0), ncclInvalidArgument);
  EXPECT_THAT(ncclGetLastError(nullptr), HasSubstr("did not come from ncclGetUniqueId"));
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  EXPECT_EQ(ncclCommInitRank(&comm, 2, id, 2), ncclInvalidArgument);
}

// ncclCommInitRank's shared-memory rendezvous, in one process: ranks created in a group by one
// thread, and by a thread each.
TEST(NcclApiTest, CommInitRankInAGroupAndFromThreads) {
  for (bool threads : {false, true}) {
    ncclUniqueId id;
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    ncclComm_t comms[2] = {};
    auto init = [&](int r) {
      EXPECT_EQ(cudaSetDevice(r), cudaSuccess);
      EXPECT_EQ(ncclCommInitRank(&comms[r], 2, id, r), ncclSuccess) << ncclGetLastError(nullptr);
    };
    if (threads) {
      std::thread other(init, 1);
      init(0);
      other.join();
    } else {
      ASSERT_EQ(ncclGroupStart(), ncclSuccess);
      init(0);
      init(1);
      ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
    }
    std::vector<int64_t> values = {int64_t{1} << 40, -7};
    std::vector<void*> data(2);
    for (int r = 0; r < 2; ++r) {
      ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&data[r], 16), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(data[r], values.data(), 16, cudaMemcpyHostToDevice), cudaSuccess);
    }
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < 2; ++r) {
      ASSERT_EQ(ncclAllReduce(data[r], data[r], 2, ncclInt64, ncclSum, comms[r], nullptr),
                ncclSuccess);
    }
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
    for (int r = 0; r < 2; ++r) {
      std::vector<int64_t> got(2);
      ASSERT_EQ(cudaMemcpy(got.data(), data[r], 16, cudaMemcpyDeviceToHost), cudaSuccess);
      EXPECT_EQ(got, (std::vector<int64_t>{int64_t{1} << 41, -14}));
      ASSERT_EQ(ncclCommDestroy(comms[r]), ncclSuccess);
      ASSERT_EQ(cudaFree(data[r]), cudaSuccess);
    }
  }
  cudaSetDevice(0);
}

// What a GPU would hang on fails here, naming the ranks and the calls (in a child process:
// the device's error is sticky).
class NcclFailureTest : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

void RunAndSynchronize(const std::function<void(ncclComm_t*, float**)>& calls) {
  ncclComm_t comms[2];
  if (ncclCommInitAll(comms, 2, nullptr) != ncclSuccess) std::exit(3);
  float* data[2];
  for (int r = 0; r < 2; ++r) {
    cudaSetDevice(r);
    cudaMalloc(&data[r], 64);
  }
  calls(comms, data);
  for (int r = 0; r < 2; ++r) {
    cudaSetDevice(r);
    cudaDeviceSynchronize();
  }
  std::exit(0);
}

TEST_F(NcclFailureTest, MismatchedCallsAreNamed) {
  EXPECT_EXIT(RunAndSynchronize([](ncclComm_t* comms, float** data) {
                ncclGroupStart();
                ncclAllReduce(data[0], data[0], 4, ncclFloat32, ncclSum, comms[0], nullptr);
                ncclBroadcast(data[1], data[1], 4, ncclFloat32, 1, comms[1], nullptr);
                ncclGroupEnd();
              }),
              ::testing::ExitedWithCode(0),
              "NCCL rank 0 of 2 on cuda:0 ran ncclAllReduce #0 of 4 ncclFloat32 ncclSum but rank "
              "1 ran ncclBroadcast #0 of 4 ncclFloat32 root 1");
}

TEST_F(NcclFailureTest, ARankThatNeverComesIsNamed) {
  EXPECT_EXIT(RunAndSynchronize([](ncclComm_t* comms, float** data) {
                setenv("TANDEM_CUDASIM_NCCL_TIMEOUT_S", "1", 1);
                ncclAllReduce(data[0], data[0], 4, ncclFloat32, ncclSum, comms[0], nullptr);
              }),
              ::testing::ExitedWithCode(0), "rank\\(s\\) 1 did not arrive within 1 s");
}

TEST_F(NcclFailureTest, AbortStopsThePeers) {
  EXPECT_EXIT(RunAndSynchronize([](ncclComm_t* comms, float** data) {
                ncclAllReduce(data[1], data[1], 4, ncclFloat32, ncclSum, comms[1], nullptr);
                std::this_thread::sleep_for(std::chrono::milliseconds(100));
                ncclCommAbort(comms[0]);
              }),
              ::testing::ExitedWithCode(0), "NCCL rank 0 of 2 on cuda:0 called ncclCommAbort");
}

}  // namespace
}  // namespace cudasim_tests
