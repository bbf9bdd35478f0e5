// Command-line plumbing shared by the programs here and the benchmarks: the --devices and
// --threads flags, errors that are the user's to fix (printed as one line, exit 1), and the
// frame of main().
//
//   int main(int argc, char** argv) {
//     return tandem::examples::RunMain(argc, argv, "train", "Trains ...\n  train --epochs=3",
//                                      &tandem::Run);
//   }
//   std::vector<Device> devices = examples::ParseDevices(absl::GetFlag(FLAGS_devices));
//   int threads = examples::ConfigureCpuDevices(devices, absl::GetFlag(FLAGS_threads));
#ifndef TANDEM_EXAMPLES_CLI_H_
#define TANDEM_EXAMPLES_CLI_H_

#include <functional>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "tensor/base/device.h"
#include "tensor/base/dtype.h"

namespace tandem::examples {

// A bad flag or value: main() prints it as one line, without a source location, and exits 1.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Throws UsageError with the concatenated message unless `condition` holds.
template <typename... Args>
void Require(bool condition, const Args&... message) {
  if (!condition) {
    std::ostringstream out;
    (out << ... << message);
    throw UsageError(out.str());
  }
}

// The devices of a --devices value ("cpu:0,cpu:1"); empty means the default: every CUDA
// GPU, or without one a logical CPU device per core. Throws UsageError for a malformed list
// or a device listed twice.
std::vector<Device> ParseDevices(const std::string& text);

// Makes the CPU devices among `devices` exist with `threads` threads each (0: the machine's
// cores shared among them) and returns the threads each gets (0 when none is a CPU device).
// Call it before any work runs. Throws UsageError when the devices would need more cores
// than the machine has (they would fight over them).
int ConfigureCpuDevices(const std::vector<Device>& devices, int threads);

// Throws UsageError unless a file can be created at `path` (the value of `flag`; empty: no
// file, nothing to check): its folder must exist and be writable, and `path` must not be a
// folder. Checks by creating and removing a temporary file there, so call it before the
// work whose result goes to `path`.
void RequireWritableFile(const std::string& flag, const std::string& path);

// The dtype of an --autocast value: "bf16" (or "bfloat16"), "fp16" (or "float16"), or
// kFloat32 for "" (no autocast). Throws UsageError for anything else.
DType ParseAutocast(const std::string& text);

// The DDP gradient compression of a --ddp_compression value: "bf16"/"fp16" (as --autocast
// spells them), or nullopt for "none" (float32 all-reduces). Throws UsageError otherwise.
std::optional<DType> ParseDdpCompression(const std::string& text);

// "cpu:0, cpu:1" (with `separator` between the names).
std::string DeviceNames(const std::vector<Device>& devices, const std::string& separator);

// A message on one line (newlines become "; ") without the " [file:line]" suffix of
// tandem::Error, for printing as "program: message".
std::string OneLine(std::string message);

// Parses the flags (a positional argument is an error: flags are written --name=value),
// runs `run`, and turns any exception into one line "program: message" on stderr and exit
// status 1. Returns what `run` returns.
int RunMain(int argc, char** argv, const char* program, const char* usage,
            const std::function<int()>& run);

}  // namespace tandem::examples

#endif  // TANDEM_EXAMPLES_CLI_H_
