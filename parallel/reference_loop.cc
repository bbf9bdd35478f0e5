#include "parallel/reference_loop.h"

#include <algorithm>
#include <chrono>
#include <future>

#include "tensor/runtime/threads.h"

namespace tandem::parallel {
namespace {
volatile float sink = 0;
}  // namespace

__attribute__((noinline)) float ReferenceKernel(int64_t reps, float seed) {
  float acc[16];
  for (int k = 0; k < 16; ++k) acc[k] = seed + static_cast<float>(k);
  for (int64_t r = 0; r < reps; ++r) {
    for (int k = 0; k < 16; ++k) acc[k] = acc[k] * 0.999f + 0.25f;
  }
  float total = 0;
  for (float a : acc) total += a;
  sink = total;
  return total;
}

float ReferenceLoop(const std::vector<Device>& devices, int64_t reps) {
  std::vector<std::future<float>> parts;
  const int64_t share = reps / static_cast<int64_t>(devices.size());
  const bool first_here = RunsInline(devices[0]);
  for (size_t i = first_here ? 1 : 0; i < devices.size(); ++i) {
    parts.push_back(DeviceWorker::For(devices[i]).Submit([share, i] {
      return ReferenceKernel(share, static_cast<float>(i));
    }));
  }
  float total = first_here ? ReferenceKernel(share, 0.0f) : 0.0f;
  for (auto& part : parts) total += part.get();
  sink = total;
  return total;
}

int64_t CalibratedReps(double seconds) {
  using Clock = std::chrono::steady_clock;
  int64_t probe = 1 << 16;
  double best = 0;  // steps per second
  for (int i = 0; i < 5; ++i) {
    const auto start = Clock::now();
    ReferenceKernel(probe, 1.0f);
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    best = std::max(best, probe / elapsed);
    if (elapsed < 0.02) probe = static_cast<int64_t>(probe * 0.02 / std::max(elapsed, 1e-6)) + 1;
  }
  return std::max<int64_t>(16, static_cast<int64_t>(best * seconds));
}

}  // namespace tandem::parallel
