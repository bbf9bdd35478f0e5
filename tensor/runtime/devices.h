// The device runtime: which devices exist in this process and how logical CPU devices are
// configured. Device (tensor/base/device.h) is a plain value; the state behind it lives here.
//
//   tandem::SetCpuDeviceCount(4);                  // cpu:0 ... cpu:3, before running work
//   tandem::CheckAvailable(Device::Parse("cuda:1"));   // throws, saying how to fix it
//   int gpus = tandem::DeviceCount(tandem::DeviceType::kCUDA);
#ifndef TANDEM_TENSOR_RUNTIME_DEVICES_H_
#define TANDEM_TENSOR_RUNTIME_DEVICES_H_

#include <vector>

#include "tensor/base/device.h"

namespace tandem {

// The most logical CPU devices a process may configure (SetCpuDeviceCount, TANDEM_CPU_DEVICES).
inline constexpr int kMaxCpuDevices = 1024;

// Throws tandem::Error naming the device and how to make it available when it does not
// exist in this process (index too large, no GPU, a build without CUDA).
void CheckAvailable(Device device);

// Number of devices of a type present in this process (0 for CUDA without a GPU).
int DeviceCount(DeviceType type);
// cpu:0, cpu:1, ..., cpu:count-1 (whether or not they are configured: see CheckAvailable).
std::vector<Device> CpuDevices(int count);

// Logical CPU devices. Changing the count resets the per-device thread pools; do it while
// no work is running (typically once, at start-up). N defaults to the number of cores, or
// TANDEM_CPU_DEVICES.
void SetCpuDeviceCount(int count);
int CpuDeviceCount();
// Threads each logical CPU device may use for one operation: the value set with
// SetCpuThreadsPerDevice, or max(1, cores / count) when none is set (or 0 was set).
int CpuThreadsPerDevice();
// Fixes the threads per logical CPU device (e.g. 1 each for a clean 1-vs-2 device
// comparison); 0 goes back to the automatic share. Resets the pools; call at start-up.
void SetCpuThreadsPerDevice(int threads);
// Cores this process may use (std::thread::hardware_concurrency, at least 1).
int HardwareCores();

// The logical CPU devices whose threads work that is split across CPU devices (the fused
// optimizer updates) may use from this thread: every configured one, unless a
// CpuWorkDevicesScope narrows them. A program that times one device's step next to a
// several-device step in the same process narrows them to that device, so that the step runs
// on the threads it would have in a process configured with that device alone.
std::vector<Device> CpuWorkDevices();

// Narrows CpuWorkDevices() on the calling thread to `devices` (CPU devices, at least one)
// while it lives:
//   { CpuWorkDevicesScope one({Device::Cpu(0)}); single_device_step(); }
class CpuWorkDevicesScope {
 public:
  explicit CpuWorkDevicesScope(std::vector<Device> devices);
  ~CpuWorkDevicesScope();
  CpuWorkDevicesScope(const CpuWorkDevicesScope&) = delete;
  CpuWorkDevicesScope& operator=(const CpuWorkDevicesScope&) = delete;

 private:
  std::vector<Device> devices_;
  const std::vector<Device>* previous_;
};

}  // namespace tandem

#endif  // TANDEM_TENSOR_RUNTIME_DEVICES_H_
