// cudasim's block scheduler: runs a grid's blocks one after another on the calling thread,
// each simulated CUDA thread on a fiber. Not for use outside tools/cudasim.
#ifndef TANDEM_TOOLS_CUDASIM_EXECUTOR_H_
#define TANDEM_TOOLS_CUDASIM_EXECUTOR_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>

namespace cudasim {
namespace internal {

// Thrown by RunGrid when the kernel misbehaved (a deadlock at a barrier, a shuffle whose mask
// names an exited lane, an exception out of the kernel): what() says which block and threads.
class KernelError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Runs every thread of `grid` x `block`; `seed` picks the order of the threads at the start and
// after every barrier. `dynamic_shared` bytes of dynamic shared memory per block.
void RunGrid(dim3 grid, dim3 block, size_t dynamic_shared, uint64_t seed,
             const std::function<void()>& thread_body);

}  // namespace internal
}  // namespace cudasim

#endif  // TANDEM_TOOLS_CUDASIM_EXECUTOR_H_
