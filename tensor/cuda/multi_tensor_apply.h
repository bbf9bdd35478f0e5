// Multi-tensor launches for elementwise updates over lists of tensors (internal to tensor/cuda/),
// as PyTorch's multi_tensor_apply: the host packs the (pointers, numel) of as many tensors as fit
// in a kernel's parameter space into a fixed-size TensorChunkList and launches once per list,
// instead of once per tensor (AdamW over GPT-2's 148 parameters: 3 launches, not 148). Each
// tensor is cut into chunks of kMultiTensorChunk elements; the blocks of a launch grid-stride
// over the chunks of all its tensors, so a large tensor spreads over many blocks and a small
// one takes one.
//
//   using List = TensorChunkList<3, NoChunkExtra>;         // param, grad, buffer
//   PackChunkLists<List>(tensors, fill_slot, [&](const List& list, int64_t chunks) {
//     MyKernel<<<ChunkGrid(context, chunks), kChunkThreads, 0, stream>>>(scalars, list, chunks);
//   });
//   // in MyKernel: ForEachChunk(list, chunks, [&](int slot, int64_t begin, int64_t end) {...});
//
// Only .cu files include it (device code).
#ifndef TANDEM_TENSOR_CUDA_MULTI_TENSOR_APPLY_H_
#define TANDEM_TENSOR_CUDA_MULTI_TENSOR_APPLY_H_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "tensor/cuda/kernels.h"

namespace tandem {
namespace cuda {

// Elements per chunk: 64 per thread of a 256-thread block, enough to hide the chunk lookup (a
// binary search over at most a list's tensors) and keep each block streaming. A quarter of
// PyTorch's 65536, so that a launch of a few million elements still has a block for every SM
// twice over (a 13.5M-element AdamW step: 823 blocks where 65536 gave 216 on 132 SMs;
// //examples:gpt2_grid_fill_cuda_test).
constexpr int64_t kMultiTensorChunk = 16384;
constexpr int kChunkThreads = 256;
// The kernel parameter space every CUDA GPU and driver accepts (4 KiB; CUDA 12.1 allows 32 KiB
// on Volta and later, but only with a new enough driver). A list leaves kChunkArgReserve
// bytes of it to the kernel's other arguments.
constexpr size_t kMultiTensorArgBytes = 4096;
constexpr size_t kChunkArgReserve = 256;

// For updates without per-tensor values.
struct NoChunkExtra {};

// Up to kMaxTensors tensors of kDepth pointers each (a null pointer for a list the update does
// not use), their element counts, the running total of their chunks and a per-tensor Extra
// (Adam's step-dependent scalars).
template <int kDepth, typename Extra>
struct TensorChunkList {
  static constexpr int kMaxTensors =
      static_cast<int>((kMultiTensorArgBytes - kChunkArgReserve - sizeof(int64_t)) /
                       (kDepth * sizeof(void*) + 2 * sizeof(int64_t) + sizeof(Extra)));
  int count;
  int64_t chunk_end[kMaxTensors];  // chunks of tensors 0..slot, together
  int64_t numel[kMaxTensors];
  void* ptr[kDepth][kMaxTensors];
  Extra extra[kMaxTensors];
};

// Packs the non-empty `tensors` (each with a .numel) in order into Lists: fill(list, slot,
// tensor) sets the slot's pointers and extra; launch(list, chunks) runs once per full list and
// once for the rest. Returns how many times launch ran (the launch count of a multi-tensor
// step, which tests and benchmarks read through the Count* functions of optimizer_kernels.h).
template <typename List, typename Tensor, typename Fill, typename Launch>
int64_t PackChunkLists(const std::vector<Tensor>& tensors, Fill&& fill, Launch&& launch) {
  static_assert(sizeof(List) <= kMultiTensorArgBytes - kChunkArgReserve,
                "a TensorChunkList must leave room for the kernel's other arguments");
  List list{};  // no indeterminate bytes in the unused slots the launch copies
  list.count = 0;
  int64_t chunks = 0, launches = 0;
  for (const Tensor& t : tensors) {
    if (t.numel == 0) continue;
    const int slot = list.count++;
    fill(list, slot, t);
    list.numel[slot] = t.numel;
    chunks += (t.numel + kMultiTensorChunk - 1) / kMultiTensorChunk;
    list.chunk_end[slot] = chunks;
    if (list.count == List::kMaxTensors) {
      launch(static_cast<const List&>(list), chunks);
      ++launches;
      list.count = 0;
      chunks = 0;
    }
  }
  if (list.count > 0) {
    launch(static_cast<const List&>(list), chunks);
    ++launches;
  }
  return launches;
}

// The elements of a list's tensors (a tensor is never split across two lists).
template <typename List>
int64_t ListElements(const List& list) {
  int64_t n = 0;
  for (int s = 0; s < list.count; ++s) n += list.numel[s];
  return n;
}

// Blocks for a launch over `chunks` chunks: one per chunk, at most two waves of full SMs (the
// rest grid-stride), as the elementwise kernels size theirs.
inline int ChunkGrid(const LaunchContext& context, int64_t chunks) {
  const int64_t cap = static_cast<int64_t>(context.num_sms) * (2048 / kChunkThreads) * 2;
  return static_cast<int>(std::max<int64_t>(1, std::min(chunks, cap)));
}

// Calls body(slot, begin, end) for each chunk this block owns: elements [begin, end) of tensor
// `slot`. The slot is found by binary search over the running chunk totals.
template <typename List, typename Body>
__device__ __forceinline__ void ForEachChunk(const List& list, int64_t chunks, Body&& body) {
  for (int64_t c = blockIdx.x; c < chunks; c += gridDim.x) {
    int lo = 0, hi = list.count - 1;  // the first slot whose chunks end after c
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (list.chunk_end[mid] > c) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    const int64_t first = lo == 0 ? 0 : list.chunk_end[lo - 1];
    const int64_t begin = (c - first) * kMultiTensorChunk;
    const int64_t end =
        list.numel[lo] < begin + kMultiTensorChunk ? list.numel[lo] : begin + kMultiTensorChunk;
    body(lo, begin, end);
  }
}

}  // namespace cuda
}  // namespace tandem

#endif  // TANDEM_TENSOR_CUDA_MULTI_TENSOR_APPLY_H_
