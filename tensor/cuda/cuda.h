// tandem::cuda: what a user (or another Tandem library) may ask of the CUDA backend
// directly. Tensors on "cuda:N" devices need none of it; this header is for checks, for
// timing (Synchronize), for the TF32 switch and for interoperating with other CUDA code.
// It exposes no CUDA type, so it compiles without the CUDA toolkit's headers.
//
//   if (tandem::cuda::IsAvailable()) {
//     tandem::Tensor x = tandem::rand({1024, 1024}, tandem::Device::Cuda(0));
//     tandem::Tensor y = tandem::matmul(x, x);
//     tandem::cuda::Synchronize(0);  // y's kernels have finished
//   } else {
//     std::cerr << tandem::cuda::UnavailableReason() << "\n";
//   }
//
// Devices: by default cuda:N is physical GPU N (as numbered by CUDA_VISIBLE_DEVICES).
// For testing multi-device code on one GPU, TANDEM_CUDA_LOGICAL_DEVICES=N maps N logical
// devices onto GPU 0, each with its own stream, memory pool and cuBLAS handle (see
// tensor/cuda/README.md).
#ifndef TANDEM_TENSOR_CUDA_CUDA_H_
#define TANDEM_TENSOR_CUDA_CUDA_H_

#include <string>

#include "tensor/runtime/stream.h"

namespace tandem {
namespace cuda {

// Whether at least one CUDA device can be used.
bool IsAvailable();
// Usable (logical) CUDA devices; 0 without a GPU or driver.
int DeviceCount();
// Why DeviceCount() is 0 ("no CUDA driver: cudaGetDeviceCount returned
// cudaErrorInsufficientDriver ..."); empty when devices are available.
std::string UnavailableReason();

// Waits until all work queued on `device` (on every one of its streams) has finished.
// Throws tandem::Error carrying any asynchronous error a kernel raised (e.g. an illegal
// address), and the first out-of-range index a kernel found since the last synchronization
// (Note [Device-side index checks] in tensor/cuda/kernels.h; item() and copies to the host
// raise it too), naming the op; the device stays usable.
void Synchronize(int device);

// PyTorch's torch.cuda.set_sync_debug_mode("error"): while on, whatever makes the host wait
// for a CUDA device (a copy to the host such as item(), Synchronize, a copy from pageable host
// memory) throws tandem::Error naming it instead, so code meant to queue work without waiting
// (a training step to capture in a CUDA Graph) can be tested for it. Process-wide, off by
// default.
void SetSyncDebugError(bool on);
bool SyncDebugError();

// Whether float32 matrix products may use TF32 tensor cores (about 8x faster on an H200,
// with 10-bit mantissas for the inputs). Off by default, so that GPU results match the
// CPU's to float32 precision; PyTorch's torch.backends.cuda.matmul.allow_tf32 is the same
// switch. Applies to products queued after the call, on every device.
void SetAllowTf32(bool allow);
bool AllowTf32();

// The physical GPU behind a logical device (differs from `device` only with
// TANDEM_CUDA_LOGICAL_DEVICES).
int PhysicalDevice(int device);
// The calling thread's current stream of `device` (its compute stream unless a
// tandem::StreamGuard picked another), as an opaque handle to cast to cudaStream_t, for code
// that queues its own CUDA work (NCCL, custom kernels) in order with Tandem's.
void* Stream(int device);
// The handle of any stream of a CUDA device (tensor/runtime/stream.h), e.g. a side stream for NCCL.
// Throws tandem::Error for a CPU stream or one that does not exist.
void* StreamHandle(tandem::Stream stream);

}  // namespace cuda
}  // namespace tandem

#endif  // TANDEM_TENSOR_CUDA_CUDA_H_
