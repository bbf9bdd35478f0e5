// Launch work: the elements each kernel launch processes, next to its blocks, declared by the
// launchers whose threads each loop over many elements (reductions, the row norms, gather and
// scatter-add, softmax). The simulator's counters (//tools/cuda:device_counters) see a launch's
// grid but not its work, and a grid of 3 blocks is right for a 768-element bias update and
// starves the GPU for a sum over 2048 rows of 768 columns; this tells the two apart, so that a
// counted check can hold "no launch of more than 1M elements has fewer blocks than 2x the SMs".
//
//   cuda::StartRecordingLaunchWork();
//   RunStep();
//   for (const cuda::LaunchWork& w : cuda::StopRecordingLaunchWork()) {
//     if (w.max_elements > (1 << 20) && w.min_blocks < 2 * sms) Report(w.kernel);
//   }
//
// Off by default (one relaxed atomic load per launch); host-side, so it holds on a GPU too.
#ifndef TANDEM_TENSOR_CUDA_LAUNCH_WORK_H_
#define TANDEM_TENSOR_CUDA_LAUNCH_WORK_H_

#include <string>
#include <vector>

namespace tandem {
namespace cuda {

// One kernel's launches while recording, judged by its worst launch: the fewest blocks among
// its launches of more than kLargeLaunchElements elements (0 when none was that large).
struct LaunchWork {
  std::string kernel;  // "ReduceColumnsKernel" (the launcher's name for it)
  long long launches = 0;
  long long max_elements = 0;           // the largest launch's elements
  long long min_blocks_when_large = 0;  // fewest blocks of a launch over kLargeLaunchElements
  long long large_launches = 0;         // launches over kLargeLaunchElements
};

// The threshold: a launch of more elements must fill the GPU.
inline constexpr long long kLargeLaunchElements = 1 << 20;

// Starts recording (clearing an earlier recording). Not nested.
void StartRecordingLaunchWork();
// Stops and returns what was recorded, by kernel name.
std::vector<LaunchWork> StopRecordingLaunchWork();

// The math DeclareKernelWork (tools/cuda/device_counters.h) names for a kernel that computes in
// floats of `opmath_bytes` (sizeof(OpMath<T>)): "fp64" for double, else "fp32" (CUDA cores).
constexpr const char* RooflineMath(int opmath_bytes) { return opmath_bytes == 8 ? "fp64" : "fp32"; }

namespace internal {
// Called by launchers for each launch: its grid's blocks and the elements it reads.
void RecordLaunchWork(const char* kernel, long long blocks, long long elements);
}  // namespace internal

}  // namespace cuda
}  // namespace tandem

#endif  // TANDEM_TENSOR_CUDA_LAUNCH_WORK_H_
