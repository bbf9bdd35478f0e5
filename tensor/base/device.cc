#include "tensor/base/device.h"

#include <algorithm>
#include <string>

#include "tensor/base/error.h"

namespace tandem {
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

std::string Device::ToString() const {
  return std::string(DeviceTypeName(type_)) + ":" + std::to_string(index_);
}

std::ostream& operator<<(std::ostream& out, Device device) { return out << device.ToString(); }

}  // namespace tandem
