#include "tensor/runtime/kernel_stub.h"

#include <cstdio>
#include <cstdlib>

#include "tensor/base/error.h"

namespace tandem {
namespace {

std::vector<const KernelStubBase*>& MutableKernelStubs() {
  static auto* stubs = new std::vector<const KernelStubBase*>();
  return *stubs;
}

}  // namespace

std::string KernelStubBase::registered_types() const {
  std::string types;
  for (int t = 0; t < kNumDeviceTypes; ++t) {
    if (!registered_[t]) continue;
    if (!types.empty()) types += ", ";
    types += DeviceTypeName(static_cast<DeviceType>(t));
  }
  return types.empty() ? "none" : types;
}

void KernelStubBase::MarkRegistered(DeviceType type) {
  if (registered_[static_cast<int>(type)]) {
    std::fprintf(stderr,
                 "tandem: two kernels registered for %s on %s: each backend registers one "
                 "(TANDEM_REGISTER_KERNEL); remove the duplicate registration or link only one "
                 "of the libraries that hold them\n",
                 name_, DeviceTypeName(type));
    std::abort();
  }
  registered_[static_cast<int>(type)] = true;
}

void KernelStubBase::ThrowMissing(Device device) const {
  TANDEM_FAIL("no ", DeviceTypeName(device.type()), " kernel for ", name_, " (called on ",
              device.ToString(), "); kernels are registered for: ", registered_types(),
              ". Move the tensors to a device that has one, or link the backend that registers "
              "it (TANDEM_REGISTER_KERNEL, in an alwayslink library)");
}

const std::vector<const KernelStubBase*>& AllKernelStubs() { return MutableKernelStubs(); }

namespace internal {
KernelStubListing::KernelStubListing(const KernelStubBase* stub) {
  MutableKernelStubs().push_back(stub);
}
}  // namespace internal

}  // namespace tandem
