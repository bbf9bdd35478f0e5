// The CUDA kernels behind CudaBackend and the KernelStubs that tensor/cuda/*_kernels.cc register
// (internal to tensor/cuda/), one launcher per kernel with its own arguments plus a
// LaunchContext. Launchers queue work on the
// context's stream and return at once; they launch nothing for empty tensors and check
// every launch (throwing tandem::Error naming the logical device). Arguments are validated
// before: by CudaBackend, or by the stubs' Run* functions (tensor/kernels/*_kernels.h).
//
// Numerics follow the CPU backend exactly where the hardware allows: the same scalar math
// (tensor/kernels/internal/elementwise_math.h), the same Philox streams (bitwise-equal uniforms),
// the same NaN and tie rules for max/argmax, sums accumulated in double for float32 (float64
// computes in double throughout). bfloat16 and float16 load as float, compute in float (OpMath)
// and round once on store; their sums accumulate in float. Copy, Fill, Unary, Binary and Reduce
// also take int32, uint8 and bool (computed in int64 and narrowed), and comparisons may write a
// bool output.
//
//   LaunchContext context{stream, /*device=*/0, /*num_sms=*/132, &allocator};
//   LaunchUnary(context, UnaryOp::kRelu, dst, src, 0.0);
#ifndef TANDEM_TENSOR_CUDA_KERNELS_H_
#define TANDEM_TENSOR_CUDA_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "tensor/base/dtype.h"
#include "tensor/kernels/attention_kernels.h"
#include "tensor/kernels/conv_geometry.h"
#include "tensor/runtime/allocator.h"
#include "tensor/runtime/backend.h"

namespace tandem {
namespace cuda {

// Counters of each stream (LaunchContext::semaphores), for kernels whose blocks count each
// other's arrivals (a "last block finishes" reduction) in the same launch.
inline constexpr int kStreamSemaphores = 64;

struct LaunchContext {
  cudaStream_t stream = nullptr;
  int device = 0;                  // logical device index, for error messages
  int num_sms = 1;                 // streaming multiprocessors: sizes grids and reduction splits
  Allocator* workspace = nullptr;  // device memory for temporaries (split reductions)
  // kStreamSemaphores zeroed counters owned by `stream`; a kernel that uses them leaves them
  // zero (Note [Stream semaphores], cuda_device.h). Null where the context was built by hand.
  unsigned* semaphores = nullptr;
};

void LaunchCopy(const LaunchContext& context, const KernelTensor& dst, const KernelTensor& src);
void LaunchFill(const LaunchContext& context, const KernelTensor& dst, double value);
void LaunchUnary(const LaunchContext& context, UnaryOp op, const KernelTensor& dst,
                 const KernelTensor& src, double scalar);
void LaunchBinary(const LaunchContext& context, BinaryOp op, const KernelTensor& dst,
                  const KernelTensor& a, const KernelTensor& b);
void LaunchReduce(const LaunchContext& context, ReduceKind op, const KernelTensor& dst,
                  const KernelTensor& src, int64_t outer, int64_t reduce, int64_t inner);
// The kernels below take the dtype of their floating-point operands (float32, float64,
// bfloat16 or float16; any other throws, naming the kernel) and untyped pointers to them, as
// Backend's do.
void LaunchSoftmax(const LaunchContext& context, DType dtype, bool log, void* dst, const void* src,
                   int64_t outer, int64_t dim, int64_t inner);
// C = beta * C for `batch` m x n matrices (row stride ldc, batch stride stride_c): the
// k == 0 / alpha == 0 case of GEMM, which cuBLAS rejects or would read A and B for.
void LaunchScaleMatrices(const LaunchContext& context, DType dtype, double beta, void* c, int64_t m,
                         int64_t n, int64_t ldc, int64_t stride_c, int64_t batch);
void LaunchIm2Col(const LaunchContext& context, DType dtype, const Conv2dGeometry& g,
                  const void* image, void* columns);
void LaunchCol2Im(const LaunchContext& context, DType dtype, const Conv2dGeometry& g,
                  const void* columns, void* image);
void LaunchMaxPool2d(const LaunchContext& context, DType dtype, const Conv2dGeometry& g,
                     const void* input, void* output, int64_t* argmax);
void LaunchMaxPool2dBackward(const LaunchContext& context, DType dtype, const Conv2dGeometry& g,
                             const void* grad_output, const int64_t* argmax, void* grad_input);
void LaunchAvgPool2d(const LaunchContext& context, DType dtype, const Conv2dGeometry& g,
                     bool count_include_pad, const void* input, void* output);
void LaunchAvgPool2dBackward(const LaunchContext& context, DType dtype, const Conv2dGeometry& g,
                             bool count_include_pad, const void* grad_output, void* grad_input);
void LaunchAdaptiveAvgPool2d(const LaunchContext& context, DType dtype, int64_t planes,
                             int64_t height, int64_t width, int64_t out_h, int64_t out_w,
                             const void* input, void* output);
void LaunchAdaptiveAvgPool2dBackward(const LaunchContext& context, DType dtype, int64_t planes,
                                     int64_t height, int64_t width, int64_t out_h, int64_t out_w,
                                     const void* grad_output, void* grad_input);
// Note [Device-side index checks]: kernels that read with an index check its range on the
// device instead of the host reading the indices back (which would stop the host for every
// embedding and loss). A bad index is skipped (its output element written 0, its scatter
// dropped), and the first one is recorded in the device's DeviceAssert, which the backend
// reads at its next host synchronization (CopyToHost, Synchronize) and raises as a
// tandem::Error naming the op, as PyTorch reports a device-side assert, but recoverable: the
// record is cleared when raised. `op` is a string literal (static storage), kept on the
// device as an integer and only read on the host.
struct DeviceAssert {
  int flag;  // 0: clear; 1: set (the first failing thread's atomicCAS wins)
  int unused;
  unsigned long long op;  // the const char* of the op's name
  long long value;        // the bad index
  long long size;         // indices must be in [0, size)
};

void LaunchGatherColumns(const LaunchContext& context, DType dtype, void* dst, const void* src,
                         const int64_t* idx, int64_t rows, int64_t cols, DeviceAssert* check,
                         const char* op);
void LaunchScatterAddColumns(const LaunchContext& context, DType dtype, void* dst, const void* src,
                             const int64_t* idx, int64_t rows, int64_t cols);
void LaunchGather(const LaunchContext& context, DType dtype, void* dst, const void* src,
                  const int64_t* idx, int64_t outer, int64_t src_dim, int64_t idx_dim,
                  int64_t inner, DeviceAssert* check, const char* op);
void LaunchScatterAdd(const LaunchContext& context, DType dtype, void* dst, const void* src,
                      const int64_t* idx, int64_t outer, int64_t dst_dim, int64_t idx_dim,
                      int64_t inner);
// Computed in float32 whatever the dtype (Note [Random float64] in tensor/runtime/backend.h):
// float64 widens the float32 draws, bfloat16/float16 round them (so they may reach `high`).
void LaunchRandomUniform(const LaunchContext& context, DType dtype, void* dst, int64_t n,
                         uint64_t seed, uint64_t offset, double low, double high);
void LaunchRandomNormal(const LaunchContext& context, DType dtype, void* dst, int64_t n,
                        uint64_t seed, uint64_t offset, double mean, double stddev);

// The fused cross-entropy (Note [Fused cross-entropy], tensor/kernels/softmax_kernels.h): a block
// per row each way; the forward's online softmax is softmax's (one pass for the maximum and the
// sum), and a target out of range is recorded in `check` as `op`.
void LaunchCrossEntropyForward(const LaunchContext& context, DType dtype, void* row_loss, void* lse,
                               const void* logits, const int64_t* targets, int64_t rows,
                               int64_t cols, DeviceAssert* check, const char* op);
void LaunchCrossEntropyBackward(const LaunchContext& context, DType dtype, void* grad_logits,
                                const void* logits, const void* lse, const int64_t* targets,
                                const void* grad, double scale, int64_t rows, int64_t cols);

// Fused row norms and triangles (Note [Fused row norms] in tensor/kernels/norm_kernels.h). The
// backward with grad_x and grad_weight/grad_bias is one launch (blocks of rows whose column sums
// the last blocks to finish add in a fixed order, on context.semaphores) where a block's column
// sums fit its shared memory. Otherwise it launches one kernel for grad_x (blocks of rows) and,
// for grad_weight/grad_bias, a block per 32 columns and chunk of rows plus, when the rows were
// split, a second pass adding the chunks' sums in order; each only when its outputs are wanted.
// With a residual (and grad_sum) they are Note [Fused residual norm]'s, in the same launches.
// The residual, y, grad_y and grad_residual in io_dtype (Note [Autocast residual norm]).
void LaunchRowNorm(const LaunchContext& context, DType dtype, DType io_dtype, bool rms,
                   int64_t rows, int64_t cols, double eps, const void* x, const void* residual,
                   const void* weight, const void* bias, void* y, void* sum, void* mean,
                   void* rstd);
void LaunchRowNormBackward(const LaunchContext& context, DType dtype, DType io_dtype, bool rms,
                           int64_t rows, int64_t cols, const void* grad_y, const void* grad_sum,
                           const void* x, const void* mean, const void* rstd, const void* weight,
                           void* grad_x, void* grad_residual, void* grad_weight, void* grad_bias);
// Any dtype (the kernel moves bits of the element's size).
void LaunchTriangle(const LaunchContext& context, DType dtype, bool lower, int64_t diagonal,
                    int64_t batch, int64_t rows, int64_t cols, const void* src, void* dst);

// Test only (cuda_testing.h): one thread that spins on the GPU's nanosecond timer for
// `nanoseconds`, to keep a stream busy for a known time.
void LaunchSpin(const LaunchContext& context, int64_t nanoseconds);

// ---- Fused attention (Note [Fused attention], tensor/kernels/attention_kernels.h)
void LaunchAttentionForward(const LaunchContext& context, DType dtype, const AttentionGeometry& g,
                            const void* q, const void* k, const void* v, const void* mask,
                            void* out, void* logsumexp);
void LaunchAttentionBackward(const LaunchContext& context, DType dtype, const AttentionGeometry& g,
                             const void* q, const void* k, const void* v, const void* mask,
                             const void* out, const void* dout, const void* logsumexp, void* dq,
                             void* dk, void* dv);

}  // namespace cuda
}  // namespace tandem

#endif  // TANDEM_TENSOR_CUDA_KERNELS_H_
