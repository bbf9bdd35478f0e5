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

// Zeroes every counter (all simulated devices, all threads).
void ResetCounters();
// The counts since the last ResetCounters (or the start of the process).
Counters SnapshotCounters();

namespace internal {
// The simulator's hooks (runtime.cc, cublas.cc, nccl.cc). `blocks` and `threads_per_block` are 0
// for library calls.
void CountLaunch(const std::string& name, long long blocks, long long threads_per_block);
void CountGraphLaunch(long long kernels);
void CountHostSync();
void CountCopy(long long bytes, bool host_to_device);
}  // namespace internal

}  // namespace cudasim

#endif  // TANDEM_TOOLS_CUDASIM_COUNTERS_H_
