// Every KernelStub linked into //tensor has a CPU kernel: the CPU is every kernel's oracle and
// the one device every build has. (tensor/cuda/kernel_coverage_test.cc runs each kernel on both
// devices; this holds in CPU-only builds too.)
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "tensor/base/device.h"
#include "tensor/runtime/kernel_stub.h"
#include "tensor/tensor.h"

namespace tandem {
namespace {

TEST(KernelStubsTest, EveryStubHasACpuKernel) {
  const std::vector<const KernelStubBase*>& stubs = AllKernelStubs();
  for (const KernelStubBase* stub : stubs) {
    EXPECT_TRUE(stub->has(DeviceType::kCPU))
        << stub->name() << " has no CPU kernel (registered: " << stub->registered_types()
        << "); register one beside the CPU code (tensor/cpu/) in a library linked whole";
  }
  // The listing itself works: a stub of each family is in it.
  for (const char* name :
       {"AttentionForwardKernel", "Col2ImKernel", "Conv2dForwardKernel", "FusedAdamKernel",
        "GatherKernel", "MaxPool2dKernel", "RowNormKernel", "SoftmaxKernel", "TriangleKernel"}) {
    EXPECT_TRUE(
        std::any_of(stubs.begin(), stubs.end(),
                    [&](const KernelStubBase* s) { return std::string(s->name()) == name; }))
        << name << " is not among AllKernelStubs()";
  }
}

}  // namespace
}  // namespace tandem
