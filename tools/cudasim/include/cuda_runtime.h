// cudasim's stand-in for the CUDA runtime header: the subset of the CUDA runtime API that
// Tandem uses, implemented on the host (tools/cudasim/runtime.cc), and, for .cu files compiled
// as C++ under --config=cudasim (TANDEM_CUDASIM_DEVICE_CODE), the device built-ins.
//
// Use: nothing to include by hand. Under --config=cudasim, `@local_cuda//:cudart` resolves to
// //tools/cudasim:cudart, whose include path puts this file where <cuda_runtime.h> is looked
// up, and cuda_library compiles each .cu file with `-include cuda_runtime.h`, as nvcc does.
//
//   __global__ void Scale(float* x, int n) {
//     int i = blockIdx.x * blockDim.x + threadIdx.x;
//     if (i < n) x[i] *= 2;
//   }
//   Scale<<<(n + 255) / 256, 256, 0, stream>>>(x, n);  // rewritten by //tools/cudasim:rewrite
#ifndef TANDEM_TOOLS_CUDASIM_INCLUDE_CUDA_RUNTIME_H_
#define TANDEM_TOOLS_CUDASIM_INCLUDE_CUDA_RUNTIME_H_

#include <cstddef>
#include <cstdint>

#define TANDEM_CUDASIM 1
#define CUDART_VERSION 13000

// ---- Types ------------------------------------------------------------------------------

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInitializationError = 3,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorInsufficientDriver = 35,
  cudaErrorInvalidDeviceFunction = 98,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorIllegalState = 401,
  cudaErrorNotReady = 600,
  cudaErrorIllegalAddress = 700,
  cudaErrorLaunchOutOfResources = 701,
  cudaErrorPeerAccessAlreadyEnabled = 704,
  cudaErrorPeerAccessNotEnabled = 705,
  cudaErrorLaunchFailure = 719,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorStreamCaptureMerge = 902,
  cudaErrorStreamCaptureUnmatched = 903,
  cudaErrorStreamCaptureUnjoined = 904,
  cudaErrorStreamCaptureIsolation = 905,
  cudaErrorStreamCaptureImplicit = 906,
  cudaErrorCapturedEvent = 907,
  cudaErrorStreamCaptureWrongThread = 908,
  cudaErrorUnknown = 999,
};

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};

enum cudaDeviceAttr {
  cudaDevAttrMaxThreadsPerBlock = 1,
  cudaDevAttrMaxSharedMemoryPerBlock = 8,
  cudaDevAttrWarpSize = 10,
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrComputeCapabilityMajor = 75,
  cudaDevAttrComputeCapabilityMinor = 76,
  cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
};

enum cudaFuncAttribute {
  cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
  cudaFuncAttributePreferredSharedMemoryCarveout = 9,
};

struct CUstream_st;
struct CUevent_st;
typedef CUstream_st* cudaStream_t;
typedef CUevent_st* cudaEvent_t;

// CUDA Graphs: stream capture and replay (runtime.cc, "Graphs").
struct CUgraph_st;
struct CUgraphExec_st;
struct CUgraphNode_st;
struct cudaGraphEdgeData_st;
typedef CUgraph_st* cudaGraph_t;
typedef CUgraphExec_st* cudaGraphExec_t;
typedef CUgraphNode_st* cudaGraphNode_t;
typedef cudaGraphEdgeData_st cudaGraphEdgeData;

enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2,
};

enum cudaStreamCaptureStatus {
  cudaStreamCaptureStatusNone = 0,
  cudaStreamCaptureStatusActive = 1,
  cudaStreamCaptureStatusInvalidated = 2,
};

#define cudaStreamDefault 0x0u
#define cudaStreamNonBlocking 0x1u
#define cudaEventDefault 0x0u
#define cudaEventBlockingSync 0x1u
#define cudaEventDisableTiming 0x2u
#define cudaHostAllocDefault 0x0u
#define cudaHostAllocPortable 0x1u
#define cudaHostAllocMapped 0x2u
#define cudaHostAllocWriteCombined 0x4u

struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem;
  size_t sharedMemPerBlock;
  int regsPerBlock;
  int warpSize;
  int maxThreadsPerBlock;
  int maxThreadsDim[3];
  int maxGridSize[3];
  int major;
  int minor;
  int multiProcessorCount;
  int maxThreadsPerMultiProcessor;
  size_t sharedMemPerBlockOptin;
};

struct uint3 {
  unsigned int x, y, z;
};
struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
      : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return uint3{x, y, z}; }
};

struct alignas(8) float2 {
  float x, y;
};
struct float3 {
  float x, y, z;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(8) int2 {
  int x, y;
};
struct alignas(16) int4 {
  int x, y, z, w;
};
struct alignas(16) double2 {
  double x, y;
};
struct alignas(16) longlong2 {
  long long x, y;
};
inline constexpr float2 make_float2(float x, float y) { return float2{x, y}; }
inline constexpr float3 make_float3(float x, float y, float z) { return float3{x, y, z}; }
inline constexpr float4 make_float4(float x, float y, float z, float w) {
  return float4{x, y, z, w};
}
inline constexpr int2 make_int2(int x, int y) { return int2{x, y}; }
inline constexpr int4 make_int4(int x, int y, int z, int w) { return int4{x, y, z, w}; }
inline constexpr double2 make_double2(double x, double y) { return double2{x, y}; }
inline constexpr uint3 make_uint3(unsigned x, unsigned y, unsigned z) { return uint3{x, y, z}; }
inline constexpr dim3 make_dim3(unsigned x, unsigned y, unsigned z) { return dim3(x, y, z); }

// ---- The runtime API ----------------------------------------------------------------------

extern "C" {
const char* cudaGetErrorName(cudaError_t error);
const char* cudaGetErrorString(cudaError_t error);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);

cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaDeviceReset(void);
cudaError_t cudaDeviceCanAccessPeer(int* can_access, int device, int peer_device);
cudaError_t cudaDeviceEnablePeerAccess(int peer_device, unsigned int flags);
cudaError_t cudaDeviceDisablePeerAccess(int peer_device);
cudaError_t cudaDriverGetVersion(int* version);
cudaError_t cudaRuntimeGetVersion(int* version);

cudaError_t cudaMalloc(void** ptr, size_t size);
cudaError_t cudaFree(void* ptr);
cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned int flags);
cudaError_t cudaMallocHost(void** ptr, size_t size);
cudaError_t cudaFreeHost(void* ptr);
cudaError_t cudaMemGetInfo(size_t* free, size_t* total);

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                            cudaStream_t stream);
cudaError_t cudaMemcpyPeerAsync(void* dst, int dst_device, const void* src, int src_device,
                                size_t count, cudaStream_t stream);
cudaError_t cudaMemcpyPeer(void* dst, int dst_device, const void* src, int src_device,
                           size_t count);
cudaError_t cudaMemset(void* ptr, int value, size_t count);
cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count, cudaStream_t stream);

cudaError_t cudaStreamCreate(cudaStream_t* stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamQuery(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags);

cudaError_t cudaEventCreate(cudaEvent_t* event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value);

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph);
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status);
// CUDA 13's signature; cudasim fills `status`, `id_out`, `graph_out` and
// `numDependencies_out`, and refuses `dependencies_out` and `edgeData_out`.
cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream, cudaStreamCaptureStatus* status,
                                     unsigned long long* id_out = nullptr,
                                     cudaGraph_t* graph_out = nullptr,
                                     const cudaGraphNode_t** dependencies_out = nullptr,
                                     const cudaGraphEdgeData** edgeData_out = nullptr,
                                     size_t* numDependencies_out = nullptr);
cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode);
cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t* nodes, size_t* num_nodes);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph,
                                 unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
}  // extern "C"

// The C++ overloads cuda_runtime.h has for typed pointers.
template <typename T>
cudaError_t cudaMalloc(T** ptr, size_t size) {
  return cudaMalloc(reinterpret_cast<void**>(ptr), size);
}
template <typename T>
cudaError_t cudaHostAlloc(T** ptr, size_t size, unsigned int flags) {
  return cudaHostAlloc(reinterpret_cast<void**>(ptr), size, flags);
}
template <typename T>
cudaError_t cudaMallocHost(T** ptr, size_t size) {
  return cudaMallocHost(reinterpret_cast<void**>(ptr), size);
}
template <typename T>
cudaError_t cudaFuncSetAttribute(T* entry, cudaFuncAttribute attr, int value) {
  return cudaFuncSetAttribute(reinterpret_cast<const void*>(entry), attr, value);
}

#include "cudasim/launch.h"  // NOLINT: the launch machinery the rewritten <<<>>> calls

#if defined(TANDEM_CUDASIM_DEVICE_CODE)
#include "cudasim/device.h"  // NOLINT: threadIdx, __syncthreads, shuffles, atomics, ...
#endif

#endif  // TANDEM_TOOLS_CUDASIM_INCLUDE_CUDA_RUNTIME_H_
