#include "tensor/runtime/kernel_stub.h"

#include <algorithm>
#include <string>

#include "gtest/gtest.h"
#include "tensor/base/error.h"

namespace tandem {
namespace {

TANDEM_DECLARE_KERNEL(ScaleKernel, double(int index, double x, double factor));
TANDEM_DEFINE_KERNEL(ScaleKernel);
TANDEM_DECLARE_KERNEL(UnregisteredKernel, void(int index));
TANDEM_DEFINE_KERNEL(UnregisteredKernel);

double CpuScale(int index, double x, double factor) { return index * 1000 + x * factor; }
TANDEM_REGISTER_KERNEL(ScaleKernel, DeviceType::kCPU, CpuScale);

TEST(KernelStubTest, CallsTheRegisteredKernelWithTheDeviceIndex) {
  EXPECT_EQ(ScaleKernel(Device::Cpu(0), 2.0, 3.0), 6.0);
  EXPECT_EQ(ScaleKernel(Device::Cpu(2), 2.0, 3.0), 2006.0);
  EXPECT_TRUE(ScaleKernel.has(DeviceType::kCPU));
  EXPECT_EQ(ScaleKernel.Find(DeviceType::kCPU), &CpuScale);
}

TEST(KernelStubTest, AMissingKernelSaysWhichTypesHaveOne) {
  EXPECT_FALSE(ScaleKernel.has(DeviceType::kCUDA));
  EXPECT_EQ(ScaleKernel.Find(DeviceType::kCUDA), nullptr);
  try {
    ScaleKernel(Device::Cuda(1), 1.0, 1.0);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("no cuda kernel for ScaleKernel (called on cuda:1)"), std::string::npos)
        << message;
    EXPECT_NE(message.find("registered for: cpu"), std::string::npos) << message;
  }
  EXPECT_EQ(UnregisteredKernel.registered_types(), "none");
  EXPECT_THROW(UnregisteredKernel(Device::Cpu(0)), Error);
}

TEST(KernelStubTest, EveryDefinedStubIsListed) {
  const auto& stubs = AllKernelStubs();
  for (const KernelStubBase* stub : {static_cast<const KernelStubBase*>(&ScaleKernel),
                                     static_cast<const KernelStubBase*>(&UnregisteredKernel)}) {
    EXPECT_NE(std::find(stubs.begin(), stubs.end(), stub), stubs.end()) << stub->name();
  }
}

TEST(KernelStubDeathTest, TwoKernelsForOneDeviceTypeAbortNamingTheStub) {
  EXPECT_DEATH(ScaleKernel.Register(DeviceType::kCPU, CpuScale),
               "two kernels registered for ScaleKernel on cpu");
}

}  // namespace
}  // namespace tandem
