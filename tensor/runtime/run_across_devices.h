// RunAcrossDevices: the pieces of one host-side job (a sweep over whole gradients) run on
// several logical CPU devices' workers at once, so that a step's optimizer update or
// reduce-add uses every core the devices own. Used by the optimizers' fused updates in //nn
// and by comm's reduce-add in //parallel.
//
//   tandem::RunAcrossDevices(CpuDevices(2), 8, [&](int i) { Update(piece[i]); });
#ifndef TANDEM_TENSOR_RUNTIME_RUN_ACROSS_DEVICES_H_
#define TANDEM_TENSOR_RUNTIME_RUN_ACROSS_DEVICES_H_

#include <functional>
#include <vector>

#include "tensor/base/device.h"

namespace tandem {

// Calls piece(0) ... piece(pieces - 1), spread over the workers of `devices` and the calling
// thread (which stands in for its own worker's device, or for the first CPU device when it is
// no worker), and returns when all have finished. Pieces are claimed from a shared counter, and
// the caller takes whatever nobody else has started, so this never waits on a worker that
// is busy elsewhere (or blocked on the caller). Rethrows the first exception of a piece.
void RunAcrossDevices(const std::vector<Device>& devices, int pieces,
                      const std::function<void(int)>& piece);

}  // namespace tandem

#endif  // TANDEM_TENSOR_RUNTIME_RUN_ACROSS_DEVICES_H_
