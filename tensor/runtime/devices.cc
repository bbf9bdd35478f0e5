#include "tensor/runtime/devices.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>
#include <thread>
#include <utility>

#include "tensor/base/error.h"
#include "tensor/runtime/backend.h"
#include "tensor/runtime/threads.h"

namespace tandem {
namespace {

int DefaultCpuDeviceCount() {
  if (const char* env = std::getenv("TANDEM_CPU_DEVICES")) {
    char* end = nullptr;
    const long count = std::strtol(env, &end, 10);
    TANDEM_CHECK(end != env && *end == '\0' && count >= 1 && count <= kMaxCpuDevices,
                 "TANDEM_CPU_DEVICES must be a number of logical CPU devices in [1, ",
                 kMaxCpuDevices, "] but is '", env, "'");
    return static_cast<int>(count);
  }
  return HardwareCores();
}

std::atomic<int>& CpuDeviceCountStorage() {
  static std::atomic<int> count(DefaultCpuDeviceCount());
  return count;
}

}  // namespace

void CheckAvailable(Device device) {
  TANDEM_CHECK(device.index() >= 0, "device ", device.ToString(), " has a negative index");
  if (device.type() == DeviceType::kCPU) {
    const int count = CpuDeviceCount();
    TANDEM_CHECK(device.index() < count, "device ", device.ToString(), " does not exist: ", count,
                 " logical CPU device(s) are configured (cpu:0 to cpu:", count - 1,
                 "); set TANDEM_CPU_DEVICES=", device.index() + 1,
                 " or call tandem::SetCpuDeviceCount(", device.index() + 1, ") before using it");
    return;
  }
  Backend* backend = FindBackend(device.type());
  TANDEM_CHECK(backend != nullptr, "device ", device.ToString(),
               " is not available: this build of Tandem has no CUDA backend (it was built "
               "without the CUDA toolkit or with --config=cpu); use a cpu device or rebuild "
               "with CUDA");
  const int count = backend->DeviceCount();
  if (count == 0) {
    TANDEM_FAIL("device ", device.ToString(), " is not available: ", backend->UnavailableReason());
  }
  TANDEM_CHECK(device.index() < count, "device ", device.ToString(), " does not exist: ", count,
               " CUDA device(s) are visible (cuda:0 to cuda:", count - 1, ")");
}

int DeviceCount(DeviceType type) {
  if (type == DeviceType::kCPU) return CpuDeviceCount();
  Backend* backend = FindBackend(type);
  return backend == nullptr ? 0 : backend->DeviceCount();
}

std::vector<Device> CpuDevices(int count) {
  std::vector<Device> devices;
  for (int i = 0; i < count; ++i) devices.push_back(Device::Cpu(i));
  return devices;
}

namespace {
thread_local const std::vector<Device>* t_cpu_work_devices = nullptr;
}  // namespace

std::vector<Device> CpuWorkDevices() {
  if (t_cpu_work_devices != nullptr) return *t_cpu_work_devices;
  return CpuDevices(CpuDeviceCount());
}

CpuWorkDevicesScope::CpuWorkDevicesScope(std::vector<Device> devices)
    : devices_(std::move(devices)), previous_(t_cpu_work_devices) {
  TANDEM_CHECK(!devices_.empty(), "CpuWorkDevicesScope: expected at least one CPU device");
  for (Device d : devices_) {
    TANDEM_CHECK(d.is_cpu(), "CpuWorkDevicesScope: expected CPU devices but got ", d);
    CheckAvailable(d);
  }
  t_cpu_work_devices = &devices_;
}

CpuWorkDevicesScope::~CpuWorkDevicesScope() { t_cpu_work_devices = previous_; }

int HardwareCores() {
  // hardware_concurrency() reads /sys on every call (about 10 us): ask once.
  static const int cores = [] {
    const unsigned n = std::thread::hardware_concurrency();
    return n == 0 ? 1 : static_cast<int>(n);
  }();
  return cores;
}

void SetCpuDeviceCount(int count) {
  TANDEM_CHECK(count >= 1 && count <= kMaxCpuDevices,
               "the number of logical CPU devices must be in [1, ", kMaxCpuDevices, "] but is ",
               count);
  if (CpuDeviceCountStorage().exchange(count) != count) ResetCpuThreadPools();
}

int CpuDeviceCount() { return CpuDeviceCountStorage().load(); }

namespace {
std::atomic<int> cpu_threads_per_device(0);  // 0: automatic
}  // namespace

void SetCpuThreadsPerDevice(int threads) {
  TANDEM_CHECK(threads >= 0 && threads <= 1024,
               "SetCpuThreadsPerDevice: the threads per logical CPU device must be in [1, 1024] "
               "(or 0 for cores / devices) but is ",
               threads);
  if (cpu_threads_per_device.exchange(threads) != threads) ResetCpuThreadPools();
}

int CpuThreadsPerDevice() {
  const int set = cpu_threads_per_device.load();
  return set > 0 ? set : std::max(1, HardwareCores() / CpuDeviceCount());
}

}  // namespace tandem
