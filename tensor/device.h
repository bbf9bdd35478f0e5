// Device: where a tensor lives and where its work runs, written "cpu:0" or "cuda:1".
//
// CPU devices are *logical*: cpu:0 ... cpu:N-1 all use host memory, but each owns its own
// worker thread and a fixed share of the cores (cores / N threads, at least one), so that
// DataParallel over several CPU devices runs in parallel without oversubscribing the
// machine. N defaults to the number of cores; set it with TANDEM_CPU_DEVICES or
// SetCpuDeviceCount() before running work. CUDA devices are physical GPUs (or, for tests,
// logical devices mapped onto one GPU: see tensor/cuda/README.md).
//
//   tandem::Device d = tandem::Device::Parse("cpu:1");
//   tandem::Tensor x = tandem::zeros({4, 4}, tandem::TensorOptions().device(d));
#ifndef TANDEM_TENSOR_DEVICE_H_
#define TANDEM_TENSOR_DEVICE_H_

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

namespace tandem {

enum class DeviceType : int8_t { kCPU = 0, kCUDA = 1 };
inline constexpr int kNumDeviceTypes = 2;

const char* DeviceTypeName(DeviceType type);

class Device {
 public:
  constexpr Device() = default;
  constexpr Device(DeviceType type, int index) : type_(type), index_(index) {}

  static constexpr Device Cpu(int index = 0) { return Device(DeviceType::kCPU, index); }
  static constexpr Device Cuda(int index = 0) { return Device(DeviceType::kCUDA, index); }

  // Parses "cpu", "cpu:2", "cuda", "cuda:0". Throws tandem::Error for anything else.
  // Does not check that the device exists: see CheckAvailable().
  static Device Parse(const std::string& text);
  // Parses a comma-separated list such as "cpu:0,cpu:1".
  static std::vector<Device> ParseList(const std::string& text);

  DeviceType type() const { return type_; }
  int index() const { return index_; }
  bool is_cpu() const { return type_ == DeviceType::kCPU; }
  bool is_cuda() const { return type_ == DeviceType::kCUDA; }

  // Throws tandem::Error naming the device and how to make it available when it does not
  // exist in this process (index too large, no GPU, a build without CUDA).
  void CheckAvailable() const;

  std::string ToString() const;

  friend bool operator==(Device a, Device b) { return a.type_ == b.type_ && a.index_ == b.index_; }
  friend bool operator!=(Device a, Device b) { return !(a == b); }
  friend bool operator<(Device a, Device b) {
    return a.type_ != b.type_ ? a.type_ < b.type_ : a.index_ < b.index_;
  }

 private:
  DeviceType type_ = DeviceType::kCPU;
  int index_ = 0;
};

std::ostream& operator<<(std::ostream& out, Device device);

// Number of devices of a type present in this process (0 for CUDA without a GPU).
int DeviceCount(DeviceType type);

// Logical CPU devices. Changing the count resets the per-device thread pools; do it while
// no work is running (typically once, at start-up).
void SetCpuDeviceCount(int count);
int CpuDeviceCount();
// Threads each logical CPU device may use for one operation: max(1, cores / count).
int CpuThreadsPerDevice();
// Cores this process may use (std::thread::hardware_concurrency, at least 1).
int HardwareCores();

}  // namespace tandem

template <>
struct std::hash<tandem::Device> {
  size_t operator()(tandem::Device d) const {
    return std::hash<int>()(static_cast<int>(d.type()) * 65536 + d.index());
  }
};

#endif  // TANDEM_TENSOR_DEVICE_H_
