#include "tools/cuda/device_counters.h"

#ifdef TANDEM_DEVICE_COUNTERS_CUDASIM
#include <cuda_runtime.h>

#include "tools/cudasim/counters.h"
#endif

namespace tandem {

#ifdef TANDEM_DEVICE_COUNTERS_CUDASIM

void ResetDeviceCounters() { cudasim::ResetCounters(); }

void DeclareKernelWork(double flops, double bytes, const char* math) {
  cudasim::DeclareLaunchWork(flops, bytes, math);
}

DeviceCounters ReadDeviceCounters() {
  const cudasim::Counters c = cudasim::SnapshotCounters();
  DeviceCounters out;
  out.counted = true;
  out.launches = c.launches;
  out.graph_launches = c.graph_launches;
  out.graph_kernels = c.graph_kernels;
  out.host_syncs = c.host_syncs;
  out.bytes_host_to_device = c.bytes_host_to_device;
  out.bytes_device_to_host = c.bytes_device_to_host;
  for (const cudasim::KernelCount& k : c.kernels) {
    out.kernels.push_back({k.name, k.launches, k.min_blocks, k.max_blocks, k.threads_per_block,
                           k.work_counted, k.flops, k.bytes, k.math});
  }
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) == cudaSuccess) {
    out.sm_count = sms;
  }
  return out;
}

#else

void DeclareKernelWork(double, double, const char*) {}

void ResetDeviceCounters() {}

DeviceCounters ReadDeviceCounters() {
  DeviceCounters out;
#ifdef TANDEM_DEVICE_COUNTERS_CUDA
  out.not_counted =
      "not counted: on a real GPU launches and syncs need the profiler (CUPTI), which Tandem "
      "does not use yet; run under --config=cudasim to count them";
#else
  out.not_counted = "not counted: built without CUDA (--config=cudasim counts them)";
#endif
  return out;
}

#endif

}  // namespace tandem
