#include "tools/cudasim/tests/sim_kernels.h"

namespace cudasim_tests {
namespace {

constexpr unsigned kFull = 0xffffffffu;

template <bool kBarrier>
__global__ void BlockSumKernel(const float* in, float* out) {
  __shared__ float partial[1024];
  const int t = threadIdx.x;
  partial[t] = in[blockIdx.x * blockDim.x + t];
  if (kBarrier) __syncthreads();
  for (int half = blockDim.x / 2; half >= 32; half /= 2) {
    if (t < half) partial[t] += partial[t + half];
    if (kBarrier) __syncthreads();
  }
  if (t < 32) {
    float v = blockDim.x >= 32 ? partial[t] : 0.0f;
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(kFull, v, offset);
    if (t == 0) out[blockIdx.x] = v;
  }
}

__global__ void WarpSwapKernel(const float* in, float* out, unsigned* ballot, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const float x = i < n ? in[i] : 0.0f;
  const float swapped = __shfl_xor_sync(kFull, x, 1);
  const unsigned votes = __ballot_sync(kFull, x > 0.0f);
  if (i < n) out[i] = swapped;
  if (threadIdx.x % 32 == 0) ballot[i / 32] = votes;
}

__global__ void RecordOrderKernel(int* order, int* counter) {
  order[threadIdx.x] = atomicAdd(counter, 1);
}

__global__ void AtomicCountKernel(int* count, float* fsum) {
  atomicAdd(count, 1);
  atomicAdd(fsum, 0.5f);
}

__global__ void DeadlockKernel(int* out) {
  if (threadIdx.x < 16) {
    __syncthreads();
  } else {
    out[threadIdx.x] = __shfl_down_sync(kFull, static_cast<int>(threadIdx.x), 1);
  }
}

__global__ void WritePastEndKernel(float* x, int n) { x[n] = 1.0f; }

__global__ void EmptyKernelBody() {}

__global__ void SlowAddOneKernel(const float* x, float* y, int n, long long ns) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    for (long long slept = 0; slept < ns; slept += 1000000) __nanosleep(1000000);
  }
  __syncthreads();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    y[i] = x[i] + 1.0f;
  }
}

__global__ void ReverseKernel(const float* in, float* out) {
  extern __shared__ float staged[];
  const int t = threadIdx.x;
  staged[t] = in[blockIdx.x * blockDim.x + t];
  __syncthreads();
  out[blockIdx.x * blockDim.x + t] = staged[blockDim.x - 1 - t];
}

// Each of `floats` floats of dynamic shared memory written by one thread and read by another.
__global__ void SharedRoundTripKernel(float* out, int floats) {
  extern __shared__ float staged[];
  for (int i = threadIdx.x; i < floats; i += blockDim.x) staged[i] = static_cast<float>(i);
  __syncthreads();
  for (int i = threadIdx.x; i < floats; i += blockDim.x) out[i] = staged[floats - 1 - i];
}

}  // namespace

cudaError_t BlockSums(const float* in, float* out, int blocks, int threads, cudaStream_t stream) {
  BlockSumKernel<true><<<blocks, threads, 0, stream>>>(in, out);
  return cudaGetLastError();
}

cudaError_t BlockSumsWithoutBarrier(const float* in, float* out, int blocks, int threads,
                                    cudaStream_t stream) {
  BlockSumKernel<false><<<blocks, threads, 0, stream>>>(in, out);
  return cudaGetLastError();
}

cudaError_t WarpSwapAndBallot(const float* in, float* out, unsigned* ballot, int n,
                              cudaStream_t stream) {
  WarpSwapKernel<<<(n + 127) / 128, 128, 0, stream>>>(in, out, ballot, n);
  return cudaGetLastError();
}

cudaError_t RecordOrder(int* order, int threads, cudaStream_t stream) {
  // The counter lives after the order array.
  RecordOrderKernel<<<1, threads, 0, stream>>>(order, order + threads);
  return cudaGetLastError();
}

cudaError_t AtomicCount(int* count, float* fsum, int n, cudaStream_t stream) {
  AtomicCountKernel<<<(n + 255) / 256, 256, 0, stream>>>(count, fsum);
  return cudaGetLastError();
}

cudaError_t Deadlock(int* out, cudaStream_t stream) {
  DeadlockKernel<<<1, 32, 0, stream>>>(out);
  return cudaGetLastError();
}

cudaError_t WritePastEnd(float* x, int n, cudaStream_t stream) {
  WritePastEndKernel<<<1, 1, 0, stream>>>(x, n);
  return cudaGetLastError();
}

cudaError_t EmptyKernel(int threads, size_t shared_bytes, cudaStream_t stream) {
  EmptyKernelBody<<<1, threads, shared_bytes, stream>>>();
  return cudaGetLastError();
}

cudaError_t SlowAddOne(const float* x, float* y, int n, long long ns, cudaStream_t stream) {
  SlowAddOneKernel<<<4, 256, 0, stream>>>(x, y, n, ns);
  return cudaGetLastError();
}

cudaError_t ReverseInBlocks(const float* in, float* out, int blocks, int threads,
                            cudaStream_t stream) {
  ReverseKernel<<<blocks, threads, threads * sizeof(float), stream>>>(in, out);
  return cudaGetLastError();
}

cudaError_t SharedRoundTrip(float* out, int floats, cudaStream_t stream) {
  SharedRoundTripKernel<<<1, 256, floats * sizeof(float), stream>>>(out, floats);
  return cudaGetLastError();
}

cudaError_t OptInSharedRoundTrip(int bytes) {
  const cudaError_t error = cudaFuncSetAttribute(
      SharedRoundTripKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  cudaGetLastError();  // returned, not left for the next launch's check
  return error;
}

}  // namespace cudasim_tests
