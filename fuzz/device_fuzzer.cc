// libFuzzer target: Device::Parse and Device::ParseList on arbitrary text. Every input must
// either throw tandem::Error or give devices that print back to text that parses to the
// same devices.
//
//   bash fuzz/run.sh device_fuzzer 30
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "tensor/base/device.h"
#include "tensor/base/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem;
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const Device device = Device::Parse(text);
    TANDEM_FUZZ_ASSERT(device.index() >= 0);
    TANDEM_FUZZ_ASSERT(Device::Parse(device.ToString()) == device);
  } catch (const Error&) {
  }
  try {
    const std::vector<Device> devices = Device::ParseList(text);
    TANDEM_FUZZ_ASSERT(!devices.empty());
    std::string printed;
    for (const Device& d : devices) printed += (printed.empty() ? "" : ",") + d.ToString();
    TANDEM_FUZZ_ASSERT(Device::ParseList(printed) == devices);
  } catch (const Error&) {
  }
  return 0;
}
