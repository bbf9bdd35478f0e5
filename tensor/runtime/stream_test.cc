// Tests of streams, events, StreamGuard and RecordStream on CPU devices, where work is
// synchronous: the API must behave (events complete when recorded, guards nest and restore,
// bad devices and streams are clear errors) so that code written for GPUs runs on the CPU.
// The CUDA behaviour is tested in tensor/cuda/cuda_stream_test.cc.
#include "tensor/runtime/stream.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "tensor/runtime/backend.h"
#include "tensor/runtime/devices.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace tandem {
namespace {

using testing::ErrorOf;
using ::testing::HasSubstr;

class StreamTest : public ::testing::Test {
 protected:
  void SetUp() override { SetCpuDeviceCount(2); }
};

TEST_F(StreamTest, StreamsAreValuesWithTheComputeStreamAsId0) {
  const Stream compute = DefaultStream(Device::Cpu(1));
  EXPECT_EQ(compute, Stream(Device::Cpu(1)));
  EXPECT_EQ(compute.device(), Device::Cpu(1));
  EXPECT_EQ(compute.id(), Stream::kComputeId);
  EXPECT_TRUE(compute.is_compute());
  EXPECT_NE(compute, Stream(Device::Cpu(0)));
  EXPECT_NE(compute, Stream(Device::Cpu(1), 1));
  EXPECT_LT(Stream(Device::Cpu(0), 5), Stream(Device::Cpu(1), 0));
  EXPECT_EQ(Stream(), Stream(Device::Cpu(0)));
  EXPECT_EQ(compute.ToString(), "cpu:1/compute");
  std::ostringstream text;
  text << Stream(Device::Cpu(0), 3);
  EXPECT_EQ(text.str(), "cpu:0/stream 3");
}

TEST_F(StreamTest, CreateStreamGivesDistinctSideStreams) {
  const Stream a = CreateStream(Device::Cpu(0));
  const Stream b = CreateStream(Device::Cpu(0));
  EXPECT_EQ(a.device(), Device::Cpu(0));
  EXPECT_FALSE(a.is_compute());
  EXPECT_GE(a.id(), 1);
  EXPECT_NE(a, b);
}

TEST_F(StreamTest, SideStreamIsOnePerDeviceAndNotTheComputeStream) {
  const Stream side = SideStream(Device::Cpu(0));
  EXPECT_FALSE(side.is_compute());
  EXPECT_EQ(SideStream(Device::Cpu(0)), side);
  EXPECT_EQ(SideStream(Device::Cpu(1)).device(), Device::Cpu(1));
}

TEST_F(StreamTest, StreamsOfACpuDeviceAreAlwaysIdle) {
  for (Stream stream : {DefaultStream(Device::Cpu(0)), CreateStream(Device::Cpu(1))}) {
    EXPECT_TRUE(stream.Query());
    EXPECT_NO_THROW(stream.Synchronize());
  }
}

TEST_F(StreamTest, CurrentStreamIsTheComputeStreamWithoutAGuard) {
  EXPECT_EQ(CurrentStream(Device::Cpu(0)), Stream(Device::Cpu(0)));
  EXPECT_EQ(CurrentStream(Device::Cuda(3)), Stream(Device::Cuda(3)));  // no check, no error
}

TEST_F(StreamTest, GuardsNestAndRestore) {
  const Stream a = CreateStream(Device::Cpu(0));
  const Stream b = CreateStream(Device::Cpu(0));
  const Stream other = CreateStream(Device::Cpu(1));
  {
    StreamGuard outer(a);
    EXPECT_EQ(outer.original(), Stream(Device::Cpu(0)));
    EXPECT_EQ(outer.current(), a);
    EXPECT_EQ(CurrentStream(Device::Cpu(0)), a);
    {
      StreamGuard inner(b);
      EXPECT_EQ(inner.original(), a);
      EXPECT_EQ(CurrentStream(Device::Cpu(0)), b);
      {
        StreamGuard on_other_device(other);
        EXPECT_EQ(CurrentStream(Device::Cpu(1)), other);
        EXPECT_EQ(CurrentStream(Device::Cpu(0)), b);  // each device has its own
        {
          StreamGuard back_to_compute(DefaultStream(Device::Cpu(0)));
          EXPECT_EQ(CurrentStream(Device::Cpu(0)), Stream(Device::Cpu(0)));
        }
        EXPECT_EQ(CurrentStream(Device::Cpu(0)), b);
      }
      EXPECT_EQ(CurrentStream(Device::Cpu(1)), Stream(Device::Cpu(1)));
    }
    EXPECT_EQ(CurrentStream(Device::Cpu(0)), a);
  }
  EXPECT_EQ(CurrentStream(Device::Cpu(0)), Stream(Device::Cpu(0)));
}

TEST_F(StreamTest, GuardsAffectOnlyTheirOwnThread) {
  const Stream side = CreateStream(Device::Cpu(0));
  StreamGuard guard(side);
  Stream seen_elsewhere(Device::Cpu(1), 99);
  std::thread([&] { seen_elsewhere = CurrentStream(Device::Cpu(0)); }).join();
  EXPECT_EQ(seen_elsewhere, Stream(Device::Cpu(0)));
  EXPECT_EQ(CurrentStream(Device::Cpu(0)), side);
}

TEST_F(StreamTest, CurrentStreamsCarryIntoAnotherThread) {
  EXPECT_TRUE(CurrentStreams().empty());
  const Stream a = CreateStream(Device::Cpu(0));
  const Stream b = CreateStream(Device::Cpu(1));
  std::vector<Stream> captured;
  {
    StreamGuard guard_a(a);
    StreamGuard guard_b(b);
    StreamGuard back(DefaultStream(Device::Cpu(1)));  // compute streams are not listed
    captured = CurrentStreams();
  }
  EXPECT_EQ(captured, std::vector<Stream>{a});
  Stream seen_0, seen_1, after;
  std::thread([&] {
    {
      MultiStreamGuard guard(std::vector<Stream>{a, b});
      seen_0 = CurrentStream(Device::Cpu(0));
      seen_1 = CurrentStream(Device::Cpu(1));
    }
    after = CurrentStream(Device::Cpu(1));
  }).join();
  EXPECT_EQ(seen_0, a);
  EXPECT_EQ(seen_1, b);
  EXPECT_EQ(after, Stream(Device::Cpu(1)));
}

TEST_F(StreamTest, KernelsQueuedUnderAGuardGiveTheSameResults) {
  const Tensor x = arange(10).to(kFloat32);
  Tensor y;
  {
    StreamGuard guard(CreateStream(Device::Cpu(0)));
    y = (x * x + 1.0f).to(Device::Cpu(1));
  }
  const std::vector<float> values = y.to_vector<float>();
  for (int i = 0; i < 10; ++i) EXPECT_EQ(values[i], static_cast<float>(i * i + 1)) << i;
}

TEST_F(StreamTest, EventsOnACpuDeviceAreCompleteWhenRecorded) {
  Event event;
  EXPECT_FALSE(event.recorded());
  EXPECT_TRUE(event.Query());  // never recorded: nothing to wait for
  EXPECT_NO_THROW(event.Synchronize());
  const Stream side = CreateStream(Device::Cpu(1));
  event.Record(side);
  EXPECT_TRUE(event.recorded());
  EXPECT_EQ(event.stream(), side);
  EXPECT_TRUE(event.Query());
  EXPECT_NO_THROW(event.Synchronize());
  event.Record(DefaultStream(Device::Cpu(0)));  // again, on another device
  EXPECT_EQ(event.stream(), Stream(Device::Cpu(0)));
  EXPECT_TRUE(event.Query());
}

TEST_F(StreamTest, StreamsWaitForEventsAndOtherStreams) {
  const Stream compute = DefaultStream(Device::Cpu(0));
  const Stream side = CreateStream(Device::Cpu(1));
  Event event;
  EXPECT_NO_THROW(side.Wait(event));  // an unrecorded event: no wait
  event.Record(compute);
  EXPECT_NO_THROW(side.Wait(event));
  EXPECT_NO_THROW(event.Block(compute));
  EXPECT_NO_THROW(compute.Wait(side));
  EXPECT_NO_THROW(compute.Wait(compute));
}

TEST_F(StreamTest, EventsMove) {
  Event a;
  a.Record(DefaultStream(Device::Cpu(1)));
  Event b(std::move(a));
  EXPECT_TRUE(b.recorded());
  EXPECT_EQ(b.stream(), Stream(Device::Cpu(1)));
  Event c;
  c = std::move(b);
  EXPECT_TRUE(c.Query());
  std::vector<Event> many(3);  // default-constructible, storable
  many[1].Record(CreateStream(Device::Cpu(0)));
  EXPECT_TRUE(many[1].recorded());
}

TEST_F(StreamTest, RecordStreamIsANoOpOnCpuDevices) {
  const Tensor x = ones({4, 4});
  EXPECT_NO_THROW(RecordStream(x, CreateStream(Device::Cpu(0))));
  EXPECT_NO_THROW(RecordStream(x, DefaultStream(Device::Cpu(1))));
  EXPECT_NO_THROW(RecordStream(x.narrow(0, 4, 0), SideStream(Device::Cpu(0))));
}

TEST_F(StreamTest, BadDevicesAndStreamsAreClearErrors) {
  EXPECT_THAT(ErrorOf([] { DefaultStream(Device::Cpu(7)); }),
              HasSubstr("cpu:7 does not exist: 2 logical CPU device(s)"));
  EXPECT_THAT(ErrorOf([] { CreateStream(Device::Cpu(-1)); }), HasSubstr("negative index"));
  EXPECT_THAT(ErrorOf([] { SideStream(Device::Cpu(2)); }), HasSubstr("cpu:2 does not exist"));
  EXPECT_THAT(ErrorOf([] { StreamGuard guard(Stream(Device::Cpu(5), 1)); }),
              HasSubstr("cpu:5 does not exist"));
  EXPECT_THAT(ErrorOf([] { Stream(Device::Cpu(9)).Query(); }), HasSubstr("cpu:9 does not exist"));
  EXPECT_THAT(ErrorOf([] { Stream(Device::Cpu(9)).Synchronize(); }),
              HasSubstr("cpu:9 does not exist"));
  EXPECT_THAT(ErrorOf([] { Event().Record(Stream(Device::Cpu(9))); }),
              HasSubstr("cpu:9 does not exist"));
  EXPECT_THAT(ErrorOf([] { Stream(Device::Cpu(0)).Wait(Stream(Device::Cpu(9))); }),
              HasSubstr("cpu:9 does not exist"));
  EXPECT_THAT(ErrorOf([] { RecordStream(ones({2}), Stream(Device::Cpu(9))); }),
              HasSubstr("cpu:9 does not exist"));
  // A stream id that CreateStream never gave.
  EXPECT_THAT(ErrorOf([] { StreamGuard guard(Stream(Device::Cpu(0), 1 << 30)); }),
              HasSubstr("stream 1073741824 of cpu:0 does not exist"));
  EXPECT_THAT(ErrorOf([] { Stream(Device::Cpu(0), -1).Synchronize(); }), HasSubstr("CreateStream"));
  EXPECT_THAT(ErrorOf([] { Event().stream(); }), HasSubstr("never recorded"));
  EXPECT_THAT(ErrorOf([] { RecordStream(Tensor(), DefaultStream(Device::Cpu(0))); }),
              HasSubstr("undefined"));
  // A failed guard leaves the current stream alone.
  EXPECT_EQ(CurrentStream(Device::Cpu(0)), Stream(Device::Cpu(0)));
}

TEST_F(StreamTest, CudaStreamsNeedACudaDevice) {
  if (testing::HasCuda()) GTEST_SKIP() << "this machine has a GPU: see cuda_stream_test";
  EXPECT_THAT(ErrorOf([] { DefaultStream(Device::Cuda(0)); }), HasSubstr("not available"));
  EXPECT_THAT(ErrorOf([] { CreateStream(Device::Cuda(0)); }), HasSubstr("not available"));
  EXPECT_THAT(ErrorOf([] { Event().Record(Stream(Device::Cuda(0))); }), HasSubstr("not available"));
}

TEST_F(StreamTest, BackendDefaultsSuitSynchronousDevices) {
  Backend& cpu = GetBackend(DeviceType::kCPU);
  const int id = cpu.CreateStream(1);
  EXPECT_GE(id, 1);
  EXPECT_TRUE(cpu.QueryStream(1, id));
  std::unique_ptr<EventImpl> event = cpu.RecordEvent(0, id);
  ASSERT_NE(event, nullptr);
  EXPECT_TRUE(event->Query());
  EXPECT_NO_THROW(cpu.StreamWaitEvent(1, 0, *event));
  EXPECT_THAT(ErrorOf([&] { cpu.CreateStream(2); }), HasSubstr("device index 2 does not exist"));
  EXPECT_THAT(ErrorOf([&] { cpu.RecordEvent(0, id + 1000); }), HasSubstr("does not exist"));
}

}  // namespace
}  // namespace tandem
