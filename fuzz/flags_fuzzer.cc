// libFuzzer target: the trainer's flag values. The input is lines "name=value"; each value
// is parsed as the trainer parses it (Abseil's parser for the flag's type, then
// examples::ParseDevices for --devices/--device, examples::ConfigureCpuDevices for
// --threads with those devices, examples::MakeModel for --model). Every input must either
// be accepted or be refused with examples::UsageError or tandem::Error (one line for the
// user), never crash.
//
//   bash fuzz/run.sh flags_fuzzer 30
#include <cstdint>
#include <string>
#include <vector>

#include "absl/flags/marshalling.h"
#include "examples/cli.h"
#include "examples/models.h"
#include "fuzz/fuzz_util.h"
#include "tensor/base/error.h"

namespace {

using namespace tandem;

// Parses `value` as Abseil parses a flag of type T; false when it does not.
template <typename T>
bool Parse(const std::string& value, T* out) {
  std::string error;
  return absl::ParseFlag(value, out, &error);
}

void Flag(const std::string& name, const std::string& value, std::vector<Device>* devices) {
  if (name == "devices" || name == "device") {
    *devices = examples::ParseDevices(value);
  } else if (name == "threads") {
    int threads = 0;
    if (Parse(value, &threads) && !devices->empty()) {
      const int got = examples::ConfigureCpuDevices(*devices, threads);
      TANDEM_FUZZ_ASSERT(got >= 0);
    }
  } else if (name == "model") {
    // A model for the kinds it knows (mlp, cnn, resnet, ...), UsageError for the others.
    TANDEM_FUZZ_ASSERT(examples::MakeModel(value) != nullptr);
  } else if (name == "lr") {
    double lr = 0;
    Parse(value, &lr);
  } else if (name == "seed") {
    uint64_t seed = 0;
    Parse(value, &seed);
  } else if (name == "forward_loss") {
    bool on = false;
    Parse(value, &on);
  } else {  // epochs, batch_size, workers, ...
    int number = 0;
    Parse(value, &number);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<Device> devices;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(start, end - start);
    start = end + 1;
    const size_t equals = line.find('=');
    if (equals == std::string::npos) continue;
    try {
      Flag(line.substr(0, equals), line.substr(equals + 1), &devices);
    } catch (const examples::UsageError& e) {
      const std::string message = examples::OneLine(e.what());
      TANDEM_FUZZ_ASSERT(!message.empty() && message.find('\n') == std::string::npos);
    } catch (const Error& e) {
      TANDEM_FUZZ_ASSERT(!examples::OneLine(e.what()).empty());
    }
  }
  return 0;
}
