#include "tensor/backend.h"

#include <array>
#include <mutex>

#include "tensor/error.h"

namespace tandem {
namespace {

struct RegistryEntry {
  Backend& (*instance)() = nullptr;
};

// Function-local static: registrations run during static initialisation of other files.
std::array<RegistryEntry, kNumDeviceTypes>& Registry() {
  static std::array<RegistryEntry, kNumDeviceTypes> registry;
  return registry;
}

}  // namespace

BackendRegistration::BackendRegistration(DeviceType type, Backend& (*instance)()) {
  RegistryEntry& entry = Registry()[static_cast<int>(type)];
  if (entry.instance != nullptr) {
    TANDEM_FAIL("a backend for ", DeviceTypeName(type), " is registered twice");
  }
  entry.instance = instance;
}

Backend* FindBackend(DeviceType type) {
  const RegistryEntry& entry = Registry()[static_cast<int>(type)];
  return entry.instance == nullptr ? nullptr : &entry.instance();
}

Backend& GetBackend(DeviceType type) {
  Backend* backend = FindBackend(type);
  if (backend == nullptr) {
    if (type == DeviceType::kCUDA) {
      TANDEM_FAIL(
          "no CUDA backend in this build: Tandem was built without the CUDA toolkit or "
          "with --config=cpu; use a cpu device or rebuild with CUDA");
    }
    TANDEM_FAIL("no backend registered for ", DeviceTypeName(type),
                ": link //tensor (not only //tensor:core)");
  }
  return *backend;
}

}  // namespace tandem
