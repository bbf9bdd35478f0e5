// cudasim: what a kernel launch becomes. //tools/cudasim:rewrite turns
//   Kernel<<<grid, block, shmem, stream>>>(a, b)
// into
//   ::cudasim::Launch(::cudasim::LaunchConfig(grid, block, shmem, stream), "Kernel (file:line)",
//                     [](auto... cudasim_args) { Kernel(cudasim_args...); }, a, b)
// so template arguments are deduced from the call as nvcc deduces them. The arguments are
// copied at the launch (as CUDA copies kernel parameters); every simulated thread of the grid
// then calls the kernel with its own copy, on the stream's worker thread.
#ifndef TANDEM_TOOLS_CUDASIM_INCLUDE_CUDASIM_LAUNCH_H_
#define TANDEM_TOOLS_CUDASIM_INCLUDE_CUDASIM_LAUNCH_H_

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

// Validates the configuration (errors go to cudaGetLastError, as on a GPU) and queues the
// grid on the stream. `thread_body` runs once per simulated thread.
// `name` says which launch failed in cudasim's messages.
void EnqueueKernel(const LaunchConfig& config, const char* name, std::function<void()> thread_body);

template <typename Kernel, typename... Args>
void Launch(const LaunchConfig& config, const char* name, Kernel kernel, Args&&... args) {
  EnqueueKernel(config, name, [kernel, copied = std::make_tuple(std::decay_t<Args>(args)...)]() {
    std::apply(kernel, copied);
  });
}

}  // namespace cudasim

#endif  // TANDEM_TOOLS_CUDASIM_INCLUDE_CUDASIM_LAUNCH_H_
