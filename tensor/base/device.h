// Device: where a tensor lives and where its work runs, written "cpu:0" or "cuda:1". A plain
// value (as c10::Device): parsing, printing and comparing need nothing else. Which devices
// exist, and how logical CPU devices are configured, is the runtime's business
// (tensor/runtime/devices.h: CheckAvailable, DeviceCount, SetCpuDeviceCount).
//
// CPU devices are *logical*: cpu:0 ... cpu:N-1 all use host memory, but each owns its own
// worker thread and a fixed share of the cores, so that DataParallel over several CPU
// devices runs in parallel without oversubscribing the machine. CUDA devices are physical
// GPUs (or, for tests, logical devices mapped onto one GPU: see tensor/cuda/README.md).
//
//   tandem::Device d = tandem::Device::Parse("cpu:1");
//   tandem::Tensor x = tandem::zeros({4, 4}, tandem::TensorOptions().device(d));
#ifndef TANDEM_TENSOR_BASE_DEVICE_H_
#define TANDEM_TENSOR_BASE_DEVICE_H_

#include <cstdint>
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
  // Does not check that the device exists: see CheckAvailable() in tensor/runtime/devices.h.
  static Device Parse(const std::string& text);
  // Parses a comma-separated list such as "cpu:0,cpu:1".
  static std::vector<Device> ParseList(const std::string& text);

  DeviceType type() const { return type_; }
  int index() const { return index_; }
  bool is_cpu() const { return type_ == DeviceType::kCPU; }
  bool is_cuda() const { return type_ == DeviceType::kCUDA; }

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

}  // namespace tandem

template <>
struct std::hash<tandem::Device> {
  size_t operator()(tandem::Device d) const {
    return std::hash<int>()(static_cast<int>(d.type()) * 65536 + d.index());
  }
};

#endif  // TANDEM_TENSOR_BASE_DEVICE_H_
