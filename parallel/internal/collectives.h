// Internal to //parallel: an optional engine for broadcast and reduce between devices that
// copies cannot match (NCCL between distinct physical GPUs). comm.cc asks the registered
// engine first and falls back to device copies when there is none or it declines. The NCCL
// engine (parallel/internal/nccl_collectives.cc) registers itself in CUDA builds, so comm.cc
// itself never includes a CUDA header.
#ifndef TANDEM_PARALLEL_INTERNAL_COLLECTIVES_H_
#define TANDEM_PARALLEL_INTERNAL_COLLECTIVES_H_

#include <vector>

#include "tensor/tensor.h"

namespace tandem::parallel::internal {

class Collectives {
 public:
  virtual ~Collectives() = default;
  // Whether this engine serves exactly this set of devices (in this order).
  virtual bool Supports(const std::vector<Device>& devices) const = 0;
  // buffers[i] (contiguous, same numel and dtype, on devices[i]) all receive buffers[root].
  virtual void Broadcast(const std::vector<Tensor>& buffers, int root) = 0;
  // output (on devices[root]) = the sum of inputs[i] (each on devices[i]).
  virtual void Reduce(const std::vector<Tensor>& inputs, const Tensor& output, int root) = 0;
};

// The registered engine, or nullptr.
Collectives* GetCollectives();
// Registers `engine` (owned by the caller, alive for the process); the last one wins.
void RegisterCollectives(Collectives* engine);

}  // namespace tandem::parallel::internal

#endif  // TANDEM_PARALLEL_INTERNAL_COLLECTIVES_H_
