#include "tensor/device.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>
#include <thread>

#include "tensor/backend.h"
#include "tensor/error.h"
#include "tensor/worker.h"

namespace tandem {
namespace {

int DefaultCpuDeviceCount() {
  if (const char* env = std::getenv("TANDEM_CPU_DEVICES")) {
    char* end = nullptr;
    const long count = std::strtol(env, &end, 10);
    TANDEM_CHECK(end != env && *end == '\0' && count >= 1 && count <= 1024,
                 "TANDEM_CPU_DEVICES must be a number of logical CPU devices in [1, 1024] but is '",
                 env, "'");
    return static_cast<int>(count);
  }
  return HardwareCores();
}

std::atomic<int>& CpuDeviceCountStorage() {
  static std::atomic<int> count(DefaultCpuDeviceCount());
  return count;
}

}  // namespace

const char* DeviceTypeName(DeviceType type) { return type == DeviceType::kCPU ? "cpu" : "cuda"; }

Device Device::Parse(const std::string& text) {
  const auto colon = text.find(':');
  const std::string type_name = text.substr(0, colon);
  DeviceType type;
  if (type_name == "cpu") {
    type = DeviceType::kCPU;
  } else if (type_name == "cuda") {
    type = DeviceType::kCUDA;
  } else {
    TANDEM_FAIL("invalid device '", text,
                "': expected 'cpu', 'cpu:N', 'cuda' or 'cuda:N' with N a device index");
  }
  if (colon == std::string::npos) return Device(type, 0);
  const std::string index_text = text.substr(colon + 1);
  const bool all_digits = !index_text.empty() && index_text.size() <= 6 &&
                          std::all_of(index_text.begin(), index_text.end(),
                                      [](char c) { return c >= '0' && c <= '9'; });
  TANDEM_CHECK(all_digits, "invalid device '", text, "': the index after ':' must be a number ",
               "such as ", type_name, ":0");
  return Device(type, std::stoi(index_text));
}

std::vector<Device> Device::ParseList(const std::string& text) {
  std::vector<Device> devices;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    const std::string item =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    TANDEM_CHECK(!item.empty(), "invalid device list '", text,
                 "': expected comma-separated devices such as 'cpu:0,cpu:1'");
    devices.push_back(Parse(item));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return devices;
}

void Device::CheckAvailable() const {
  TANDEM_CHECK(index_ >= 0, "device ", ToString(), " has a negative index");
  if (type_ == DeviceType::kCPU) {
    const int count = CpuDeviceCount();
    TANDEM_CHECK(index_ < count, "device ", ToString(), " does not exist: ", count,
                 " logical CPU device(s) are configured (cpu:0 to cpu:", count - 1,
                 "); set TANDEM_CPU_DEVICES=", index_ + 1, " or call tandem::SetCpuDeviceCount(",
                 index_ + 1, ") before using it");
    return;
  }
  Backend* backend = FindBackend(type_);
  TANDEM_CHECK(backend != nullptr, "device ", ToString(),
               " is not available: this build of Tandem has no CUDA backend (it was built "
               "without the CUDA toolkit or with --config=cpu); use a cpu device or rebuild "
               "with CUDA");
  const int count = backend->DeviceCount();
  if (count == 0) {
    TANDEM_FAIL("device ", ToString(), " is not available: ", backend->UnavailableReason());
  }
  TANDEM_CHECK(index_ < count, "device ", ToString(), " does not exist: ", count,
               " CUDA device(s) are visible (cuda:0 to cuda:", count - 1, ")");
}

std::string Device::ToString() const {
  return std::string(DeviceTypeName(type_)) + ":" + std::to_string(index_);
}

std::ostream& operator<<(std::ostream& out, Device device) { return out << device.ToString(); }

int DeviceCount(DeviceType type) {
  if (type == DeviceType::kCPU) return CpuDeviceCount();
  Backend* backend = FindBackend(type);
  return backend == nullptr ? 0 : backend->DeviceCount();
}

int HardwareCores() {
  // hardware_concurrency() reads /sys on every call (about 10 us): ask once.
  static const int cores = [] {
    const unsigned n = std::thread::hardware_concurrency();
    return n == 0 ? 1 : static_cast<int>(n);
  }();
  return cores;
}

void SetCpuDeviceCount(int count) {
  TANDEM_CHECK(count >= 1 && count <= 1024,
               "SetCpuDeviceCount: the number of logical CPU devices must be in [1, 1024] but is ",
               count);
  if (CpuDeviceCountStorage().exchange(count) != count) ResetCpuThreadPools();
}

int CpuDeviceCount() { return CpuDeviceCountStorage().load(); }

int CpuThreadsPerDevice() { return std::max(1, HardwareCores() / CpuDeviceCount()); }

}  // namespace tandem
