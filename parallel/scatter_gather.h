// Differentiable scatter and gather: how DataParallel splits a batch across devices and
// joins the replicas' outputs, with gradients flowing back the other way.
//
// Scatter's backward gathers the chunks' gradients onto the source device (zeros for chunks
// that got none); Gather's backward scatters the gradient back to where each piece came
// from. Both are one autograd node each (Scatter has one output per device).
//
//   std::vector<Device> devices = {Device::Cpu(0), Device::Cpu(1), Device::Cpu(2)};
//   auto per_replica = parallel::scatter_inputs({x, y}, devices);  // [replica][input]
//   ... run replica i on per_replica[i] ...
//   Tensor out = parallel::Gather(outputs, Device::Cpu(0));         // differentiable
#ifndef TANDEM_PARALLEL_SCATTER_GATHER_H_
#define TANDEM_PARALLEL_SCATTER_GATHER_H_

#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace tandem::parallel {

// comm::scatter, recorded: chunk i lives on devices[i] (there may be fewer chunks than
// devices, as Tensor::chunk gives; chunk_sizes, one per device, sets them explicitly).
std::vector<Tensor> Scatter(const Tensor& input, const std::vector<Device>& devices,
                            const std::vector<int64_t>& chunk_sizes = {}, int64_t dim = 0);

// comm::gather, recorded: the pieces concatenated along `dim` on `destination`. 0-dim
// pieces (per-replica losses) are stacked into a vector.
Tensor Gather(const std::vector<Tensor>& pieces, Device destination, int64_t dim = 0);

// Scatters every input the same way along `dim` (all must have the same size there):
// result[i][k] is input k's chunk for replica i. The number of replicas is the number of
// chunks, which may be less than the number of devices (a batch of 2 over 3 devices gives
// 2). No inputs give one replica with no inputs.
std::vector<std::vector<Tensor>> scatter_inputs(const std::vector<Tensor>& inputs,
                                                const std::vector<Device>& devices, int64_t dim = 0,
                                                const std::vector<int64_t>& chunk_sizes = {});

}  // namespace tandem::parallel

#endif  // TANDEM_PARALLEL_SCATTER_GATHER_H_
