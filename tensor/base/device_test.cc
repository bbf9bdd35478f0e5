#include "tensor/base/device.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tensor/base/error.h"
#include "tensor/runtime/devices.h"
#include "tensor/testing.h"

namespace tandem {
namespace {

using ::tandem::testing::ErrorOf;

using ::testing::HasSubstr;

TEST(DeviceTest, ParsesCanonicalForms) {
  EXPECT_EQ(Device::Parse("cpu"), Device::Cpu(0));
  EXPECT_EQ(Device::Parse("cpu:3"), Device::Cpu(3));
  EXPECT_EQ(Device::Parse("cuda"), Device::Cuda(0));
  EXPECT_EQ(Device::Parse("cuda:12"), Device::Cuda(12));
  EXPECT_EQ(Device::Cpu(2).ToString(), "cpu:2");
  EXPECT_EQ(Device::Cuda(1).ToString(), "cuda:1");
}

TEST(DeviceTest, RejectsMalformedStrings) {
  for (const char* bad : {"", "gpu:0", "cpu:", "cpu:-1", "cpu:x", "CUDA:0", "cpu:0:1", " cpu:0"}) {
    const std::string message = ErrorOf([&] { Device::Parse(bad); });
    EXPECT_THAT(message, HasSubstr("invalid device")) << "for '" << bad << "'";
  }
  EXPECT_THAT(ErrorOf([] { Device::Parse("tpu:0"); }),
              HasSubstr("expected 'cpu', 'cpu:N', 'cuda' or 'cuda:N'"));
}

TEST(DeviceTest, ParsesLists) {
  const std::vector<Device> devices = Device::ParseList("cpu:0,cpu:1,cuda:0");
  ASSERT_EQ(devices.size(), 3u);
  EXPECT_EQ(devices[2], Device::Cuda(0));
  EXPECT_THAT(ErrorOf([] { Device::ParseList("cpu:0,,cpu:1"); }), HasSubstr("invalid device list"));
  EXPECT_THAT(ErrorOf([] { Device::ParseList(""); }), HasSubstr("invalid device list"));
}

TEST(DeviceTest, LogicalCpuDevicesShareTheCores) {
  SetCpuDeviceCount(3);
  EXPECT_EQ(CpuDeviceCount(), 3);
  EXPECT_EQ(DeviceCount(DeviceType::kCPU), 3);
  EXPECT_EQ(CpuThreadsPerDevice(), std::max(1, HardwareCores() / 3));
  CheckAvailable(Device::Cpu(2));
  const std::string message = ErrorOf([] { CheckAvailable(Device::Cpu(3)); });
  EXPECT_THAT(message, HasSubstr("cpu:3 does not exist"));
  EXPECT_THAT(message, HasSubstr("TANDEM_CPU_DEVICES=4"));
  EXPECT_THAT(ErrorOf([] { SetCpuDeviceCount(0); }), HasSubstr("must be in [1, 1024]"));
  SetCpuDeviceCount(1);
  EXPECT_EQ(CpuThreadsPerDevice(), HardwareCores());
}

TEST(DeviceTest, ThreadsPerDeviceCanBeSetWhateverTheCount) {
  SetCpuDeviceCount(2);
  SetCpuThreadsPerDevice(3);
  EXPECT_EQ(CpuThreadsPerDevice(), 3);
  SetCpuDeviceCount(5);
  EXPECT_EQ(CpuThreadsPerDevice(), 3);
  EXPECT_THAT(ErrorOf([] { SetCpuThreadsPerDevice(-1); }), HasSubstr("but is -1"));
  EXPECT_EQ(CpuThreadsPerDevice(), 3);
  SetCpuThreadsPerDevice(0);  // automatic again
  EXPECT_EQ(CpuThreadsPerDevice(), std::max(1, HardwareCores() / 5));
  SetCpuDeviceCount(1);
}

TEST(DeviceTest, UnavailableCudaSaysWhy) {
  if (DeviceCount(DeviceType::kCUDA) > 0) GTEST_SKIP() << "a GPU is present";
  const std::string message = ErrorOf([] { CheckAvailable(Device::Cuda(0)); });
  EXPECT_THAT(message, HasSubstr("cuda:0 is not available"));
}

TEST(DeviceTest, ErrorsCarryTheirOrigin) {
  const std::string message = ErrorOf([] { TANDEM_CHECK(1 + 1 == 3, "arithmetic ", 42); });
  EXPECT_THAT(message, HasSubstr("arithmetic 42"));
  EXPECT_THAT(message, HasSubstr("device_test.cc:"));
}

}  // namespace
}  // namespace tandem
