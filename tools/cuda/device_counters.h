// What the CUDA devices were asked to do, counted: kernel launches (per kernel, with their block
// counts), calls that block the host on a device, and bytes copied host<->device. Use it to see
// what a training step costs in launches and syncs (tools/bench/train_step prints it):
//
//   tandem::ResetDeviceCounters();
//   Step();
//   const tandem::DeviceCounters c = tandem::ReadDeviceCounters();
//   if (c.counted) std::printf("%lld launches\n", c.launches);
//
// Counted under --config=cudasim only, by the simulator (//tools/cudasim:counters). On a real
// GPU these figures need the profiler (CUPTI's activity API: kernel, memcpy and
// synchronization records), which Tandem does not use yet, so there, and without CUDA,
// `counted` is false and `not_counted` says why; no figure is estimated.
#ifndef TANDEM_TOOLS_CUDA_DEVICE_COUNTERS_H_
#define TANDEM_TOOLS_CUDA_DEVICE_COUNTERS_H_

#include <string>
#include <vector>

namespace tandem {

struct KernelLaunches {
  std::string name;  // "Kernel (file:line)", or the cuBLAS / NCCL call
  long long launches = 0;
  // Blocks per launch, least and most; 0 for cuBLAS and NCCL calls (their grids are theirs).
  long long min_blocks = 0;
  long long max_blocks = 0;
  long long threads_per_block = 0;  // of the launch with the most blocks
  // Its launches' FLOPs and device-memory bytes, where counted (cudasim::KernelCount): GEMMs
  // exactly, Tandem's kernels as declared with DeclareKernelWork. math: "bf16", "fp16",
  // "tf32", "fp32", "fp64" or "mixed".
  bool work_counted = false;
  double flops = 0;
  double bytes = 0;
  std::string math;
};

struct DeviceCounters {
  bool counted = false;
  std::string not_counted;  // why, when !counted
  long long launches = 0;   // kernels launched one by one from the host
  // CUDA Graph launches (one each, however many kernels), and the kernels they ran.
  long long graph_launches = 0;
  long long graph_kernels = 0;
  long long host_syncs = 0;
  long long bytes_host_to_device = 0;
  long long bytes_device_to_host = 0;
  std::vector<KernelLaunches> kernels;  // most launches first
  int sm_count = 0;                     // of cuda:0, for judging block counts (0 when not counted)
};

// Declares the FLOPs and device-memory bytes of the kernel the calling thread launched last
// (under cudasim; nothing on a GPU). Written once per launcher, after its launch:
//   LaunchKernel(...);
//   DeclareKernelWork(n, 2.0 * n * sizeof(float));   // one FLOP and a read and a write each
void DeclareKernelWork(double flops, double bytes, const char* math = "fp32");

void ResetDeviceCounters();
DeviceCounters ReadDeviceCounters();

}  // namespace tandem

#endif  // TANDEM_TOOLS_CUDA_DEVICE_COUNTERS_H_
