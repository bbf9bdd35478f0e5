// Collective copies between devices, the plumbing under scatter, replicate and gather:
// broadcast_coalesced, reduce_add_coalesced, scatter and gather, as PyTorch's
// torch.cuda.comm. Nothing here records autograd (tensor/core/autograd.h); the differentiable
// versions are in parallel/scatter_gather.h and parallel/replicate.h.
//
// Logical CPU devices share host memory, so between them a broadcast or a scatter copies
// nothing: the result on cpu:1 is a view of the same memory, owned by cpu:1 (its kernels
// run on cpu:1's threads). Such views must not be written in place; use .clone() for a
// private copy. A reduce-add onto a CPU device splits its sums over the devices' workers.
//
//   std::vector<Device> devices = {Device::Cpu(0), Device::Cpu(1)};
//   auto copies = parallel::broadcast_coalesced({w, b}, devices);   // copies[d][i]
//   Tensor total = parallel::reduce_add({g0, g1}, Device::Cpu(0));
//   std::vector<Tensor> chunks = parallel::scatter(batch, devices);  // [15, 15] of [30, 5]
//   Tensor whole = parallel::gather(chunks, Device::Cpu(0));
#ifndef TANDEM_PARALLEL_COMM_H_
#define TANDEM_PARALLEL_COMM_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace tandem::parallel {

// Flat buffers of at most this many bytes (unless one tensor alone is larger).
inline constexpr size_t kDefaultBufferBytes = size_t{10} << 20;

// `tensor` on each of `devices`: the copy for the tensor's own device is the tensor itself.
std::vector<Tensor> broadcast(const Tensor& tensor, const std::vector<Device>& devices);

// Every tensor on every device: result[d][i] is tensors[i] on devices[d]. Tensors (all on
// one device, any dtypes, zero-element ones included) are packed into flat buffers per
// dtype of at most `buffer_bytes`, and each buffer is copied once per device; the results
// are views of those buffers. The source device gets the inputs themselves.
std::vector<std::vector<Tensor>> broadcast_coalesced(const std::vector<Tensor>& tensors,
                                                     const std::vector<Device>& devices,
                                                     size_t buffer_bytes = kDefaultBufferBytes);

// The elementwise sum of `tensors` (same shape and dtype, any devices) on `destination`.
Tensor reduce_add(const std::vector<Tensor>& tensors, Device destination);

// per_device[d][i] is tensor i's copy on device d; result[i] is the sum over d, on
// `destination`, packed into flat buffers of at most `buffer_bytes` per dtype for the copies.
// Between CPU devices, a copy on `destination` that is moved in and held nowhere else becomes
// the result, summed into in place (replicate's backward gives up its gradients so).
std::vector<Tensor> reduce_add_coalesced(std::vector<std::vector<Tensor>> per_device,
                                         Device destination,
                                         size_t buffer_bytes = kDefaultBufferBytes);

// Splits `tensor` along `dim` and puts piece i on devices[i]. Without chunk_sizes the pieces
// follow Tensor::chunk (so there may be fewer pieces than devices: 10 rows over 8 devices
// are 5 pieces of 2); chunk_sizes, one per device, must add up to tensor.size(dim).
std::vector<Tensor> scatter(const Tensor& tensor, const std::vector<Device>& devices,
                            const std::vector<int64_t>& chunk_sizes = {}, int64_t dim = 0);

// Concatenates `tensors` (any devices; equal shapes except along `dim`) along `dim` into a
// new tensor on `destination`. 0-dim tensors are stacked into a vector, as PyTorch does.
Tensor gather(const std::vector<Tensor>& tensors, Device destination, int64_t dim = 0);

// The sizes Tensor::chunk gives `size` rows split `chunks` ways (maybe fewer than chunks).
std::vector<int64_t> ChunkSizes(int64_t size, int64_t chunks);

}  // namespace tandem::parallel

#endif  // TANDEM_PARALLEL_COMM_H_
