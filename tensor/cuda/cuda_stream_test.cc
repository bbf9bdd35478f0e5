// Streams and events on CUDA devices: two logical devices mapped onto GPU 0
// (TANDEM_CUDA_LOGICAL_DEVICES=2, set below unless the environment already chose), each with
// a compute stream and side streams. A spin kernel (cuda_testing.h) keeps one stream busy for
// a known time, so the tests can see which streams wait for which: events order work across
// streams, kernels under a StreamGuard go to its stream, a copy to another device leaves the
// source computing, and a block recorded on a side stream is not reused before that stream's
// work ends. Skips (with the reason) where there is no usable GPU.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <vector>

#include "tensor/base/device.h"
#include "tensor/base/error.h"
#include "tensor/cuda/cuda.h"
#include "tensor/cuda/cuda_testing.h"
#include "tensor/runtime/allocator.h"
#include "tensor/runtime/backend.h"
#include "tensor/runtime/devices.h"
#include "tensor/runtime/internal/caching_allocator.h"
#include "tensor/runtime/stream.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

// Before main(), so before the CUDA backend looks at the environment.
const bool kLogicalDevicesSet = [] {
  setenv("TANDEM_CUDA_LOGICAL_DEVICES", "2", /*overwrite=*/0);
  return true;
}();

// Long enough that the host's checks right after queuing it run while it spins.
constexpr int64_t kSpinNanoseconds = 500'000'000;  // 0.5 s

constexpr Device kCuda0 = Device::Cuda(0);
constexpr Device kCuda1 = Device::Cuda(1);

class CudaStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(kLogicalDevicesSet);
    if (!tandem::testing::HasCuda()) {
      GTEST_SKIP() << "no usable CUDA device: " << tandem::testing::NoCudaReason();
    }
    ASSERT_GE(DeviceCount(DeviceType::kCUDA), 2)
        << "TANDEM_CUDA_LOGICAL_DEVICES=" << std::getenv("TANDEM_CUDA_LOGICAL_DEVICES");
  }
  void TearDown() override {
    if (tandem::testing::HasCuda()) {
      cuda::Synchronize(0);
      cuda::Synchronize(1);
    }
  }

  // Every element of a float tensor, checked against `expected`.
  static void ExpectAll(const Tensor& t, float expected) {
    const std::vector<float> values = t.to(Device::Cpu(0)).to_vector<float>();
    for (size_t i = 0; i < values.size(); i += 4099) ASSERT_EQ(values[i], expected) << i;
    ASSERT_EQ(values.back(), expected);
  }
};

TEST_F(CudaStreamTest, ComputeAndSideStreamsAreDistinctQueues) {
  const Stream compute = DefaultStream(kCuda0);
  const Stream side = CreateStream(kCuda0);
  EXPECT_GE(side.id(), 1);
  EXPECT_NE(cuda::StreamHandle(compute), cuda::StreamHandle(side));
  EXPECT_NE(cuda::StreamHandle(compute), cuda::StreamHandle(DefaultStream(kCuda1)));
  EXPECT_EQ(SideStream(kCuda0), SideStream(kCuda0));
  EXPECT_EQ(cuda::Stream(0), cuda::StreamHandle(compute));
  {
    StreamGuard guard(side);
    EXPECT_EQ(cuda::Stream(0), cuda::StreamHandle(side));  // the current stream
    EXPECT_EQ(cuda::Stream(1), cuda::StreamHandle(DefaultStream(kCuda1)));
  }
  EXPECT_EQ(cuda::Stream(0), cuda::StreamHandle(compute));
  EXPECT_THAT(tandem::testing::ErrorOf([] { cuda::StreamHandle(Stream(kCuda0, 1 << 20)); }),
              HasSubstr("stream 1048576 of cuda:0 does not exist"));
  EXPECT_THAT(tandem::testing::ErrorOf([] { StreamGuard guard(Stream(kCuda1, 1 << 20)); }),
              HasSubstr("does not exist"));
  EXPECT_THAT(tandem::testing::ErrorOf([] { cuda::StreamHandle(Stream(Device::Cpu(0))); }),
              HasSubstr("CPU streams have no handle"));
  EXPECT_THAT(tandem::testing::ErrorOf([] { DefaultStream(Device::Cuda(2)); }),
              HasSubstr("cuda:2 does not exist"));
}

TEST_F(CudaStreamTest, StreamsAndEventsReportWorkInFlight) {
  const Stream side = CreateStream(kCuda0);
  cuda::testing::Spin(side, kSpinNanoseconds);
  Event event;
  event.Record(side);
  EXPECT_FALSE(side.Query());
  EXPECT_FALSE(event.Query());
  EXPECT_TRUE(DefaultStream(kCuda0).Query()) << "the compute stream has nothing to do";
  event.Synchronize();
  EXPECT_TRUE(event.Query());
  EXPECT_TRUE(side.Query());
  cuda::testing::Spin(side, kSpinNanoseconds);
  side.Synchronize();
  EXPECT_TRUE(side.Query());
  cuda::testing::Spin(side, kSpinNanoseconds);
  cuda::Synchronize(0);  // waits for every stream of the device
  EXPECT_TRUE(side.Query());
}

TEST_F(CudaStreamTest, KernelsUnderAGuardGoToItsStream) {
  const Stream side = CreateStream(kCuda0);
  const Tensor a = rand({64, 48}, kCuda0);
  const Tensor b = rand({48, 32}, kCuda0);
  DefaultStream(kCuda0).Synchronize();
  Tensor c;
  {
    StreamGuard guard(side);
    // The first GEMM on a stream allocates (the stream's cuBLAS workspace and its first
    // blocks, with cudaMalloc), which on an H200 waited for the spin below: done first, so
    // that what is checked is where the kernels go.
    (void)matmul(a, b).relu();
    side.Synchronize();
    cuda::testing::Spin(CurrentStream(kCuda0), kSpinNanoseconds);
    c = matmul(a, b).relu();  // cuBLAS and a kernel, both behind the spin
    EXPECT_FALSE(side.Query());
    EXPECT_TRUE(DefaultStream(kCuda0).Query()) << "work under the guard went to compute";
    side.Synchronize();
  }
  const Tensor expected = matmul(a.to(Device::Cpu(0)), b.to(Device::Cpu(0))).relu();
  EXPECT_LT(tandem::testing::MaxAbsDiff(c, expected), 1e-4);
}

// Note [cuBLAS workspace per stream]: GEMMs on the compute stream and a side stream each use
// a workspace of their own, and give the same bits (cudasim refuses a handle that runs on two
// streams through cuBLAS's default pool).
TEST_F(CudaStreamTest, GemmsOnTwoStreamsEachHaveTheirOwnCublasWorkspace) {
  const Tensor a = rand({40, 24}, kCuda0);
  const Tensor b = rand({24, 16}, kCuda0);
  const Tensor first = matmul(a, b);
  const Stream side = CreateStream(kCuda0);
  Tensor on_side;
  {
    StreamGuard guard(side);
    side.Wait(DefaultStream(kCuda0));
    on_side = matmul(a, b);
    side.Synchronize();
  }
  const Tensor again = matmul(a, b);
  EXPECT_EQ(tandem::testing::MaxAbsDiff(first, on_side), 0.0);
  EXPECT_EQ(tandem::testing::MaxAbsDiff(first, again), 0.0);
}

TEST_F(CudaStreamTest, EventsOrderWorkAcrossTwoStreams) {
  const int64_t n = 1 << 22;
  const Stream compute = DefaultStream(kCuda0);
  const Stream side = CreateStream(kCuda0);
  Tensor x = full({n}, -1.0, kCuda0);
  compute.Synchronize();
  Event produced;
  {
    StreamGuard guard(side);
    cuda::testing::Spin(side, kSpinNanoseconds);
    x.fill_(3.0);  // written on the side stream, half a second from now
    produced.Record(side);
  }
  compute.Wait(produced);
  const Tensor y = x * 2.0;  // on the compute stream: must see 3, not -1
  EXPECT_FALSE(compute.Query()) << "the compute stream should wait for the side stream";
  ExpectAll(y, 6.0f);
  // Stream::Wait(Stream) is the same with a fresh event.
  {
    StreamGuard guard(side);
    side.Wait(compute);  // the side stream's fill below comes after y was read
    cuda::testing::Spin(side, kSpinNanoseconds);
    x.fill_(5.0);
  }
  compute.Wait(side);
  ExpectAll(x + 0.0, 5.0f);
}

TEST_F(CudaStreamTest, EventsOrderWorkAcrossDevices) {
  const int64_t n = 1 << 22;
  const Stream side0 = CreateStream(kCuda0);
  Tensor x = full({n}, -1.0, kCuda0);
  Tensor y = full({n}, 0.0, kCuda1);
  cuda::Synchronize(0);
  cuda::Synchronize(1);
  Event produced;
  {
    StreamGuard guard(side0);
    cuda::testing::Spin(side0, kSpinNanoseconds);
    x.fill_(4.0);
    produced.Record(side0);
  }
  DefaultStream(kCuda1).Wait(produced);
  {
    // cuda:1 reads cuda:0's memory directly (one GPU): only the event orders it.
    StreamGuard guard(DefaultStream(kCuda0));
    y = x.to(kCuda1);  // the copy waits for cuda:0's compute stream, not the side stream
  }
  EXPECT_FALSE(DefaultStream(kCuda1).Query());
  ExpectAll(y, 4.0f);
}

TEST_F(CudaStreamTest, CopyToAnotherDeviceLeavesTheSourceComputing) {
  // 16 MiB: the spin, not the copy's size, keeps cuda:1 busy, and the work on cuda:0 must end
  // within the spin even where memory is slow (the CPU simulator, --config=cudasim).
  const int64_t n = 1 << 22;
  Backend& gpu = GetBackend(DeviceType::kCUDA);
  Tensor src = full({n}, 7.0, kCuda0);  // queued on cuda:0 before the copy: the copy sees it
  Tensor dst = full({n}, -1.0, kCuda1);
  cuda::Synchronize(1);
  cuda::testing::Spin(DefaultStream(kCuda1), kSpinNanoseconds);  // the copy queues behind
  gpu.CopyBetweenDevices(1, dst.raw_data(), 0, src.raw_data(), n * sizeof(float));
  // The source goes on computing: its stream did not wait for the copy.
  Tensor more = src * 3.0;
  DefaultStream(kCuda0).Synchronize();
  EXPECT_FALSE(DefaultStream(kCuda1).Query()) << "cuda:0 waited for the copy on cuda:1";
  ExpectAll(more, 21.0f);
  ExpectAll(dst, 7.0f);
  // The same through Tensor::to, with work queued on the source right after.
  cuda::testing::Spin(DefaultStream(kCuda1), kSpinNanoseconds);
  const Tensor y = (src + 1.0).to(kCuda1);
  Tensor z = src * 2.0;
  DefaultStream(kCuda0).Synchronize();
  EXPECT_FALSE(DefaultStream(kCuda1).Query());
  ExpectAll(y, 8.0f);
  ExpectAll(z, 14.0f);
}

TEST_F(CudaStreamTest, CopySourceIsNotReusedBeforeTheCopyHasReadIt) {
  const int64_t n = 1 << 22;  // as above
  // So that the block freed below is the only one to reuse.
  EmptyCache(kCuda0);
  Tensor dst = full({n}, -1.0, kCuda1);
  cuda::Synchronize(1);
  cuda::testing::Spin(DefaultStream(kCuda1), kSpinNanoseconds);
  void* first_src = nullptr;
  {
    Tensor src = full({n}, 7.0, kCuda0);
    first_src = src.raw_data();
    GetBackend(DeviceType::kCUDA)
        .CopyBetweenDevices(1, dst.raw_data(), 0, src.raw_data(), n * sizeof(float));
  }  // freed at once, while the copy still waits behind the spin on cuda:1
  Tensor other = full({n}, -3.0, kCuda0);  // cuda:0 must not get the copy's source
  EXPECT_NE(other.raw_data(), first_src);
  EXPECT_FALSE(DefaultStream(kCuda1).Query());
  ExpectAll(dst, 7.0f);
  ExpectAll(other, -3.0f);
  // Once the copy is done, the block is reused (`other` still holds the other one).
  Tensor again = empty({n}, kCuda0);
  EXPECT_EQ(again.raw_data(), first_src);
}

TEST_F(CudaStreamTest, BlockRecordedOnASideStreamIsNotReusedBeforeItsWorkEnds) {
  const int64_t n = 1 << 22;
  EmptyCache(kCuda0);
  auto& allocator = dynamic_cast<CachingAllocator&>(GetAllocator(kCuda0));
  const Stream side = CreateStream(kCuda0);
  void* first = nullptr;
  Tensor copy_on_side;
  {
    Tensor gradient = full({n}, 2.0, kCuda0);  // made on the compute stream
    first = gradient.raw_data();
    side.Wait(DefaultStream(kCuda0));
    StreamGuard guard(side);
    cuda::testing::Spin(side, kSpinNanoseconds);  // a slow "all-reduce" that reads it
    copy_on_side = gradient * 1.0;
    RecordStream(gradient, side);
  }  // freed on the host while the side stream has not read it yet
  EXPECT_EQ(allocator.NumPendingBlocks(), 1);
  Tensor reuse = full({n}, -5.0, kCuda0);  // the compute stream goes on
  EXPECT_NE(reuse.raw_data(), first);
  EXPECT_FALSE(side.Query()) << "the check above must run while the side stream works";
  side.Synchronize();
  Tensor again = empty({n}, kCuda0);  // `reuse` still holds the other block
  EXPECT_EQ(again.raw_data(), first);
  EXPECT_EQ(allocator.NumPendingBlocks(), 0);
  DefaultStream(kCuda0).Wait(side);
  ExpectAll(copy_on_side, 2.0f);
}

TEST_F(CudaStreamTest, RecordingTheAllocatingStreamKeepsImmediateReuse) {
  const int64_t n = 1 << 20;
  EmptyCache(kCuda0);
  void* first = nullptr;
  {
    Tensor t = full({n}, 1.0, kCuda0);
    first = t.raw_data();
    RecordStream(t, DefaultStream(kCuda0));
    RecordStream(t, DefaultStream(Device::Cpu(0)));
  }
  Tensor again = empty({n}, kCuda0);
  EXPECT_EQ(again.raw_data(), first);
}

}  // namespace
}  // namespace tandem
