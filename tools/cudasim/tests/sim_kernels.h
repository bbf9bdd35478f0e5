// Kernels that exercise cudasim itself (tools/cudasim/tests/cudasim_test.cc): barriers,
// shared memory, warp shuffles and votes, atomics, and kernels with deliberate bugs that the
// simulator must report. Host API only; every function queues on `stream` and returns the
// launch's cudaGetLastError().
#ifndef TANDEM_TOOLS_CUDASIM_TESTS_SIM_KERNELS_H_
#define TANDEM_TOOLS_CUDASIM_TESTS_SIM_KERNELS_H_

#include <cuda_runtime.h>

namespace cudasim_tests {

// out[b] = sum of in[b * threads ...] over one block of `threads` (a power of two <= 1024):
// shared-memory tree with __syncthreads, the last 32 by __shfl_down_sync.
cudaError_t BlockSums(const float* in, float* out, int blocks, int threads, cudaStream_t stream);
// The same tree without the __syncthreads between its steps (a bug the simulator must expose).
cudaError_t BlockSumsWithoutBarrier(const float* in, float* out, int blocks, int threads,
                                    cudaStream_t stream);
// out[i] = in[i ^ 1] within each warp via __shfl_xor_sync; ballot[w] = __ballot_sync of
// (in[i] > 0) for warp w.
cudaError_t WarpSwapAndBallot(const float* in, float* out, unsigned* ballot, int n,
                              cudaStream_t stream);
// order[t] = the position at which thread t of one block first ran (an atomic counter).
cudaError_t RecordOrder(int* order, int threads, cudaStream_t stream);
// *count += n via atomicAdd from a grid of n threads; *fsum += 0.5 from each.
cudaError_t AtomicCount(int* count, float* fsum, int n, cudaStream_t stream);
// Half of the block waits at __syncthreads while the other half waits in a full-warp shuffle
// that the first half never reaches: a deadlock.
cudaError_t Deadlock(int* out, cudaStream_t stream);
// Writes x[n] (one past the end).
cudaError_t WritePastEnd(float* x, int n, cudaStream_t stream);
// A launch with `threads` threads per block (to check the configuration errors).
cudaError_t EmptyKernel(int threads, size_t shared_bytes, cudaStream_t stream);
// y[i] = x[i] + 1 after sleeping `ns` nanoseconds in one thread: work that takes a while.
cudaError_t SlowAddOne(const float* x, float* y, int n, long long ns, cudaStream_t stream);
// Dynamic shared memory: out[i] = in[blockDim.x - 1 - i] within each block.
cudaError_t ReverseInBlocks(const float* in, float* out, int blocks, int threads,
                            cudaStream_t stream);
// out[i] = floats - 1 - i, through `floats` floats of dynamic shared memory in one block of 256
// threads: past 48 KiB only once OptInSharedRoundTrip allowed that much on the device.
cudaError_t SharedRoundTrip(float* out, int floats, cudaStream_t stream);
// cudaFuncSetAttribute(SharedRoundTrip's kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
// bytes) on the current device.
cudaError_t OptInSharedRoundTrip(int bytes);

}  // namespace cudasim_tests

#endif  // TANDEM_TOOLS_CUDASIM_TESTS_SIM_KERNELS_H_
