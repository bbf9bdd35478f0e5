#include "tensor/runtime/backend.h"

#include <array>
#include <mutex>

#include "tensor/base/error.h"
#include "tensor/runtime/devices.h"

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

// The event of a synchronous device: complete when recorded.
class CompletedEvent final : public EventImpl {
 public:
  bool Query() override { return true; }
  void Synchronize() override {}
};

}  // namespace

void Backend::CheckDevice(int index) const {
  const int count = DeviceCount();
  TANDEM_CHECK(index >= 0 && index < count, DeviceTypeName(type()), " backend: device index ",
               index, " does not exist: ", count, " device(s) are available (indices 0 to ",
               count - 1, ")");
}

void Backend::CheckStream(int index, int stream) const {
  CheckDevice(index);
  const int last = last_default_stream_.load();
  TANDEM_CHECK(stream >= 0 && stream <= last, "stream ", stream, " of ", DeviceTypeName(type()),
               ":", index,
               " does not exist: expected 0 (the compute stream) or an id that "
               "CreateStream returned (1 to ",
               last,
               "); create side streams with "
               "tandem::CreateStream");
}

int Backend::CreateStream(int index) {
  CheckDevice(index);
  return ++last_default_stream_;
}

bool Backend::QueryStream(int index, int stream) {
  CheckStream(index, stream);
  return true;
}

void Backend::SynchronizeStream(int index, int stream) { CheckStream(index, stream); }

std::unique_ptr<EventImpl> Backend::RecordEvent(int index, int stream) {
  CheckStream(index, stream);
  return std::make_unique<CompletedEvent>();
}

void Backend::StreamWaitEvent(int index, int stream, EventImpl& event) {
  CheckStream(index, stream);
  event.Synchronize();
}

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
