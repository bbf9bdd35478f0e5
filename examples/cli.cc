#include "examples/cli.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <set>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "tensor/base/error.h"
#include "tensor/tensor.h"

namespace tandem::examples {

DType ParseAutocast(const std::string& text) {
  if (text.empty()) return kFloat32;
  if (text == "bf16" || text == "bfloat16") return kBFloat16;
  if (text == "fp16" || text == "float16") return kFloat16;
  throw UsageError("--autocast must be bf16 or fp16 (or empty for float32) but is '" + text + "'");
}

std::optional<DType> ParseDdpCompression(const std::string& text) {
  if (text == "none") return std::nullopt;
  if (text == "bf16" || text == "bfloat16") return kBFloat16;
  if (text == "fp16" || text == "float16") return kFloat16;
  throw UsageError("--ddp_compression must be none, bf16 or fp16 but is '" + text +
                   "'; bf16 all-reduces DDP's gradients in bfloat16 (half the bytes of float32)");
}

std::string OneLine(std::string message) {
  const size_t where = message.rfind(" [");
  if (where != std::string::npos && !message.empty() && message.back() == ']' &&
      message.find(':', where) != std::string::npos) {
    message.erase(where);
  }
  for (size_t pos; (pos = message.find('\n')) != std::string::npos;) message.replace(pos, 1, "; ");
  return message;
}

void RequireWritableFile(const std::string& flag, const std::string& path) {
  if (path.empty()) return;
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path.substr(0, slash);
  struct stat info;
  const bool exists = stat(dir.c_str(), &info) == 0;
  Require(exists && S_ISDIR(info.st_mode), flag, "=", path, ": expected an existing folder '", dir,
          "' but ", exists ? "it is not a folder" : "it does not exist",
          "; create it or choose another path");
  Require(!(stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode)), flag, "=", path,
          " is a folder; expected a file name in it, such as ", path, path.back() == '/' ? "" : "/",
          "out");
  std::string probe = dir + "/.tandem-write-check.XXXXXX";
  const int fd = mkstemp(probe.data());
  Require(fd >= 0, flag, "=", path, ": cannot create a file in '", dir, "' (", std::strerror(errno),
          "); make the folder writable or choose another path");
  close(fd);
  unlink(probe.c_str());
}

std::string DeviceNames(const std::vector<Device>& devices, const std::string& separator) {
  std::string out;
  for (size_t i = 0; i < devices.size(); ++i) {
    out += (i > 0 ? separator : "") + devices[i].ToString();
  }
  return out;
}

std::vector<Device> ParseDevices(const std::string& text) {
  std::vector<Device> devices;
  if (!text.empty()) {
    try {
      devices = Device::ParseList(text);
    } catch (const Error& e) {
      throw UsageError("--devices: " + OneLine(e.what()));
    }
  } else if (DeviceCount(DeviceType::kCUDA) > 0) {
    for (int i = 0; i < DeviceCount(DeviceType::kCUDA); ++i) devices.push_back(Device::Cuda(i));
  } else {
    for (int i = 0; i < HardwareCores(); ++i) devices.push_back(Device::Cpu(i));
  }
  std::set<Device> seen;
  for (Device d : devices) {
    Require(seen.insert(d).second, "--devices=", text, " lists ", d,
            " more than once; list each device once");
  }
  return devices;
}

int ConfigureCpuDevices(const std::vector<Device>& devices, int threads) {
  Require(threads >= 0, "--threads must be at least 0 (0: automatic) but is ", threads);
  int cpu_devices = 0, highest = -1;
  for (Device d : devices) {
    if (!d.is_cpu()) continue;
    ++cpu_devices;
    highest = std::max(highest, d.index());
  }
  if (cpu_devices == 0) return 0;
  Require(highest < kMaxCpuDevices, "there is no device cpu:", highest,
          ": expected CPU devices cpu:0 to cpu:", kMaxCpuDevices - 1,
          " (logical devices, any number up to ", kMaxCpuDevices, "); use a lower index");
  const int cores = HardwareCores();
  if (threads == 0) threads = std::max(1, cores / cpu_devices);
  // In 64 bits: --threads=2000000000 on two devices overflowed int (UBSan in fuzz/flags_fuzzer).
  const int64_t needed = int64_t{threads} * cpu_devices;
  Require(needed <= std::max(cores, cpu_devices), "--threads=", threads, " with ", cpu_devices,
          " CPU device(s) needs ", needed, " cores but this machine has ", cores,
          "; use --threads=", std::max(1, cores / cpu_devices), " or fewer devices");
  SetCpuDeviceCount(highest + 1);
  SetCpuThreadsPerDevice(threads);
  return threads;
}

int RunMain(int argc, char** argv, const char* program, const char* usage,
            const std::function<int()>& run) {
  absl::SetProgramUsageMessage(usage);
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() > 1) {
    std::fprintf(stderr, "%s: unexpected argument '%s'; flags are written --name=value\n", program,
                 positional[1]);
    return 1;
  }
  try {
    return run();
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "%s: %s\n", program, OneLine(e.what()).c_str());
    return 1;
  }
}

}  // namespace tandem::examples
