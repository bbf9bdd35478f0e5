// cudasim: what a kernel launch becomes. //tools/cudasim:rewrite turns
//   Kernel<<<grid, block, shmem, stream>>>(a, b)
// into
//   ::cudasim::Launch(::cudasim::LaunchConfig(grid, block, shmem, stream), "Kernel (file:line)",
//                     ::cudasim::KernelAddress([](auto p) -> decltype(
//                         ::cudasim::internal::KernelPointer(p, Kernel)) { return Kernel; }),
//                     [](auto... cudasim_args) { Kernel(cudasim_args...); }, a, b)
// so template arguments are deduced from the call as nvcc deduces them. The arguments are
// copied at the launch (as CUDA copies kernel parameters); every simulated thread of the grid
// then calls the kernel with its own copy, on the stream's worker thread. The kernel's address
// is what cudaFuncSetAttribute keys its settings by; it is null where the launch does not name
// one function (a template whose arguments are deduced), since C++ cannot take the address of
// the specialization a call picks.
#ifndef TANDEM_TOOLS_CUDASIM_INCLUDE_CUDASIM_LAUNCH_H_
#define TANDEM_TOOLS_CUDASIM_INCLUDE_CUDASIM_LAUNCH_H_

#include <cstddef>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

namespace cudasim {

struct LaunchConfig {
  LaunchConfig(dim3 grid_dim, dim3 block_dim, size_t shared_bytes = 0,
               cudaStream_t launch_stream = nullptr)
      : grid(grid_dim), block(block_dim), shared(shared_bytes), stream(launch_stream) {}
  dim3 grid;
  dim3 block;
  size_t shared;
  cudaStream_t stream;
};

namespace internal {

// SFINAE helpers of KernelAddress: a probe's return type names the kernel's pointer type when
// the launch's callee is one function, and is ill-formed when it is an overload set.
template <typename Probe, typename F>
F* KernelPointer(Probe, F* kernel) {
  return kernel;
}
template <typename Probe>
auto ProbeKernel(Probe probe, int) -> decltype(probe(0)) {
  return probe(0);
}
template <typename Probe>
std::nullptr_t ProbeKernel(Probe, long) {
  return nullptr;
}
inline const void* AsAddress(std::nullptr_t) { return nullptr; }
template <typename F>
const void* AsAddress(F* kernel) {
  return reinterpret_cast<const void*>(kernel);
}

}  // namespace internal

// The kernel's address as cudaFuncSetAttribute sees it, or null when `probe` cannot name it.
template <typename Probe>
const void* KernelAddress(Probe probe) {
  return internal::AsAddress(internal::ProbeKernel(probe, 0));
}

// Validates the configuration (errors go to cudaGetLastError, as on a GPU) and queues the
// grid on the stream. `thread_body` runs once per simulated thread. `name` says which launch
// failed in cudasim's messages; `function` (the kernel's address, or null) selects the
// attributes cudaFuncSetAttribute gave it, such as its dynamic shared memory limit.
void EnqueueKernel(const LaunchConfig& config, const char* name, const void* function,
                   std::function<void()> thread_body);

template <typename Kernel, typename... Args>
void Launch(const LaunchConfig& config, const char* name, const void* function, Kernel kernel,
            Args&&... args) {
  EnqueueKernel(config, name, function,
                [kernel, copied = std::make_tuple(std::decay_t<Args>(args)...)]() {
                  std::apply(kernel, copied);
                });
}

}  // namespace cudasim

#endif  // TANDEM_TOOLS_CUDASIM_INCLUDE_CUDASIM_LAUNCH_H_
