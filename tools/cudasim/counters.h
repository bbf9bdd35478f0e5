// cudasim's counters: what the simulated GPUs were asked to do since the last reset — kernel
// launches (one per grid, one per cuBLAS GEMM and per NCCL collective, as those libraries
// launch one kernel for each), calls that block the host on a device, and bytes copied between
// host and device. Use it to count what a training step costs without a GPU:
//
//   cudasim::ResetCounters();
//   RunStep();
//   const cudasim::Counters c = cudasim::SnapshotCounters();
//   std::printf("%lld launches, %lld host syncs\n", c.launches, c.host_syncs);
//
// Only under --config=cudasim (//tools/cudasim:counters). Code that builds for real GPUs too
// reads them through //tools/cuda:device_counters, which says "not counted" there.
#ifndef TANDEM_TOOLS_CUDASIM_COUNTERS_H_
#define TANDEM_TOOLS_CUDASIM_COUNTERS_H_

#include <cstdint>
#include <string>
#include <vector>

namespace cudasim {

// One kernel (by its launch site's name: "Kernel (file:line)", "cublasSgemm", "ncclAllReduce").
struct KernelCount {
  std::string name;
  long long launches = 0;
  // Blocks per launch (x * y * z), least and most over its launches; 0 for library calls,
  // whose grids cuBLAS and NCCL choose themselves (cudasim does not model that choice).
  long long min_blocks = 0;
  long long max_blocks = 0;
  long long threads_per_block = 0;  // of the launch with the most blocks
  // The work of its launches, summed, where counted: exactly for cuBLAS and cuBLASLt GEMMs
  // (2 m n k FLOPs; A, B, C read where beta != 0, D, and a bias or aux buffer), and as the
  // launching code declared it (DeclareLaunchWork) for Tandem's kernels. work_counted is false
  // where none was. `math`: what the FLOPs run on, for a roofline: "bf16"/"fp16" (tensor
  // cores), "tf32", "fp32" (CUDA cores), "fp64"; "mixed" when its launches differed.
  bool work_counted = false;
  double flops = 0;
  double bytes = 0;
  std::string math;
};

struct Counters {
  // Kernels launched from the host, one by one (kernels run by a graph are not among them).
  long long launches = 0;
  // cudaGraphLaunch calls, each one launch from the host however many kernels it runs, and the
  // kernels those graphs ran (cuBLAS GEMMs included; copies and memsets not).
  long long graph_launches = 0;
  long long graph_kernels = 0;
  // Calls that returned only once a device's work was done: cudaStreamSynchronize,
  // cudaDeviceSynchronize, cudaEventSynchronize, cudaMemcpy, cudaMemset, cudaMemcpyPeer, an
  // asynchronous copy into pageable host memory, cudaFree and cudaFreeHost.
  long long host_syncs = 0;
  long long bytes_host_to_device = 0;
  long long bytes_device_to_host = 0;
  std::vector<KernelCount> kernels;  // most launches first, then by name
};

// The work (FLOPs, bytes read and written in device memory) of the kernel this host thread
// launched last, declared by the code that launched it (math as in KernelCount); ignored when
// this thread launched nothing since its last declaration.
void DeclareLaunchWork(double flops, double bytes, const char* math = "fp32");

// Zeroes every counter (all simulated devices, all threads).
void ResetCounters();
// The counts since the last ResetCounters (or the start of the process).
Counters SnapshotCounters();

// Model-only mode (TANDEM_CUDASIM_MODEL_ONLY=1, read at the first CUDA call; or SetModelOnly):
// kernels and cuBLAS/cuBLASLt GEMMs are checked, counted (launches, blocks, declared and GEMM
// work) and captured into graphs exactly as otherwise, but their bodies do not run, so that a
// step at a real GPU's shapes can be counted and modelled in seconds. Copies, memsets, events,
// host functions and NCCL collectives still run. Device results are MEANINGLESS then: memory
// keeps whatever it held (cudaMalloc's NaN fill, the last copy into it), so a loss read back, a
// found-inf flag or anything computed on the device is garbage. For counting and roofline
// models only; never for a test of values. A launch runs or not as the mode was when the host
// launched it (a graph: when the host launched the graph). Prints one line to stderr, once per
// process, when the mode is first on.
void SetModelOnly(bool on);
bool ModelOnly();

namespace internal {
// The simulator's hooks (runtime.cc, cublas.cc, nccl.cc). `blocks` and `threads_per_block` are 0
// for library calls.
void CountLaunch(const std::string& name, long long blocks, long long threads_per_block);
// The work of one launch of the library call `name` (counted with CountLaunch just before).
void CountWork(const std::string& name, double flops, double bytes, const char* math);
void CountGraphLaunch(long long kernels);
void CountHostSync();
void CountCopy(long long bytes, bool host_to_device);
}  // namespace internal

}  // namespace cudasim

#endif  // TANDEM_TOOLS_CUDASIM_COUNTERS_H_
