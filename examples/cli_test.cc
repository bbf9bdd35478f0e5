// Tests of the command-line plumbing (examples/cli.h) that need no program around it.
#include "examples/cli.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tensor/runtime/devices.h"

namespace tandem::examples {
namespace {

using ::testing::HasSubstr;

template <typename F>
std::string UsageErrorOf(F f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "<no UsageError>";
}

TEST(CliTest, ParseDevicesNamesTheFlag) {
  EXPECT_EQ(ParseDevices("cpu:0,cpu:1"), (std::vector<Device>{Device::Cpu(0), Device::Cpu(1)}));
  EXPECT_THAT(UsageErrorOf([] { ParseDevices("cpu:0,gpu:1"); }),
              HasSubstr("--devices: invalid device 'gpu:1'"));
  EXPECT_THAT(UsageErrorOf([] { ParseDevices("cpu:1,cpu:1"); }),
              HasSubstr("lists cpu:1 more than once"));
}

// fuzz/regressions/flags/threads-overflow: threads * devices overflowed int (UBSan under
// --config=asan and in the fuzz build; a wrapped negative product passed the check).
TEST(CliTest, HugeThreadCountsAreRefusedWithoutOverflow) {
  const std::vector<Device> two = {Device::Cpu(0), Device::Cpu(1)};
  const std::string message = UsageErrorOf([&] { ConfigureCpuDevices(two, 2000000000); });
  EXPECT_THAT(message, HasSubstr("--threads=2000000000 with 2 CPU device(s) needs 4000000000 "
                                 "cores but this machine has "));
  EXPECT_THAT(UsageErrorOf([&] { ConfigureCpuDevices(two, 2147483647); }),
              HasSubstr("needs 4294967294 cores"));
  EXPECT_THAT(UsageErrorOf([&] { ConfigureCpuDevices(two, -1); }),
              HasSubstr("--threads must be at least 0"));
  EXPECT_EQ(ConfigureCpuDevices(two, 1), 1);
  EXPECT_EQ(CpuDeviceCount(), 2);
}

TEST(CliTest, AutocastAndDdpCompressionFlagsParseToDTypes) {
  EXPECT_EQ(ParseAutocast(""), kFloat32);
  EXPECT_EQ(ParseAutocast("bf16"), kBFloat16);
  EXPECT_EQ(ParseAutocast("float16"), kFloat16);
  EXPECT_THAT(UsageErrorOf([] { ParseAutocast("fp32"); }),
              HasSubstr("--autocast must be bf16 or fp16 (or empty for float32) but is 'fp32'"));
  EXPECT_EQ(ParseDdpCompression("none"), std::nullopt);
  EXPECT_EQ(ParseDdpCompression("bf16"), kBFloat16);
  EXPECT_EQ(ParseDdpCompression("fp16"), kFloat16);
  EXPECT_THAT(UsageErrorOf([] { ParseDdpCompression(""); }),
              HasSubstr("--ddp_compression must be none, bf16 or fp16 but is ''"));
}

}  // namespace
}  // namespace tandem::examples
