// Test-only hooks into the CUDA backend (internal to tensor/cuda/ and its tests): work that
// takes a known time on the GPU, so that tests can show that one stream does not wait for
// another, or that memory is not reused while a stream still runs. No CUDA types.
//
//   tandem::cuda::testing::Spin(tandem::SideStream(tandem::Device::Cuda(0)), 200'000'000);
//   // the side stream is busy for 200 ms; the compute stream is not
#ifndef TANDEM_TENSOR_CUDA_CUDA_TESTING_H_
#define TANDEM_TENSOR_CUDA_CUDA_TESTING_H_

#include <cstdint>

#include "tensor/runtime/stream.h"

namespace tandem {
namespace cuda {
namespace testing {

// Queues a one-thread kernel on `stream` that spins on the GPU's nanosecond timer for
// `nanoseconds`, then returns at once (the host does not wait). Throws tandem::Error for a
// CPU stream or a missing device or stream.
void Spin(tandem::Stream stream, int64_t nanoseconds);

}  // namespace testing
}  // namespace cuda
}  // namespace tandem

#endif  // TANDEM_TENSOR_CUDA_CUDA_TESTING_H_
