// The CUDA backend: Backend for DeviceType::kCUDA, registered at static initialisation.
//
// Each call makes its device's physical GPU current, validates its arguments (with the
// CPU backend's messages, so errors read the same on either device), and queues its work
// on the calling thread's current stream of the device (tensor/runtime/stream.h,
// tensor/cuda/cuda_device.h). Kernels are in *_kernels.cu; GEMM is cuBLAS. The ops' own kernels
// (KernelStubs, tensor/runtime/kernel_stub.h) are registered by tensor/cuda/*_kernels.cc. Nothing
// here waits for the GPU except CopyToHost, pageable CopyFromHost and the Synchronize calls.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "tensor/base/dtype.h"
#include "tensor/base/error.h"
#include "tensor/cuda/cuda.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/cuda_device.h"
#include "tensor/cuda/cuda_graph.h"
#include "tensor/cuda/cuda_testing.h"
#include "tensor/cuda/kernels.h"
#include "tensor/kernels/internal/elementwise_math.h"
#include "tensor/runtime/allocator.h"
#include "tensor/runtime/backend.h"
#include "tensor/runtime/devices.h"
#include "tensor/runtime/internal/caching_allocator.h"
#include "tensor/runtime/stream.h"
#include "tools/cuda/device_counters.h"

namespace tandem {
namespace cuda {
namespace {

std::atomic<bool> allow_tf32{false};
std::atomic<bool> sync_debug_error{false};

// SetSyncDebugError's check, before each wait of the host for `index`.
void CheckMayWait(const char* what, int index) {
  TANDEM_CHECK(!sync_debug_error.load(), what, " would make the host wait for ",
               Device::Cuda(index), " while cuda::SetSyncDebugError(true) forbids it; keep the ",
               "value on the device, or read it after the section that must not wait");
  const bool capturing = CudaDevices::Get().device(index).allocator().CaptureUnderway();
  if (capturing) internal::NoteCaptureViolation(index, what);
  TANDEM_CHECK(!capturing, what, " would make the host wait for ", Device::Cuda(index),
               " during a CUDA Graph capture, which records work without running it; keep the "
               "value on the device and read it after replay() (tensor/cuda/cuda_graph.h)");
}

// ---- Argument checks (the CPU backend's, with "CUDA" in the message) --------------------

std::string ShapeString(const KernelTensor& t) {
  std::string text = "[";
  for (int d = 0; d < t.ndim; ++d) text += (d ? ", " : "") + std::to_string(t.sizes[d]);
  return text + "]";
}

void CheckLayout(const KernelTensor& t, const char* kernel) {
  TANDEM_CHECK(t.ndim >= 0 && t.ndim <= kMaxDims, "CUDA ", kernel, " got a tensor with ", t.ndim,
               " dimensions; at most ", kMaxDims, " are supported");
  for (int d = 0; d < t.ndim; ++d) {
    TANDEM_CHECK(t.sizes[d] >= 0, "CUDA ", kernel, " got a negative size ", t.sizes[d],
                 " in dimension ", d);
  }
}

void CheckSameShape(const KernelTensor& dst, const KernelTensor& src, const char* kernel,
                    const char* what) {
  bool same = dst.ndim == src.ndim;
  for (int d = 0; same && d < dst.ndim; ++d) same = dst.sizes[d] == src.sizes[d];
  TANDEM_CHECK(same, "CUDA ", kernel, " expects ", what, " of the output's shape ",
               ShapeString(dst), " but got ", ShapeString(src),
               "; broadcast or reshape it before calling the kernel");
}

// BLAS needs rows that do not overlap, except where a matrix has at most one row (the
// CPU backend's rule, which cuBLAS shares).
int64_t LeadingDimension(int64_t rows, int64_t cols, int64_t ld, const char* name) {
  if (rows <= 1) return std::max<int64_t>(ld, std::max<int64_t>(cols, 1));
  TANDEM_CHECK(ld >= std::max<int64_t>(cols, 1), "CUDA Gemm: the row stride ", name, " = ", ld,
               " is smaller than the row length ", cols,
               "; BLAS needs rows that do not overlap: make the matrix contiguous first");
  return ld;
}

// The device's cuBLAS handle bound to its current stream for one call, locked until the
// returned object goes; the row strides (already checked by LeadingDimension) must fit
// cuBLAS's ints.
struct BoundBlas {
  std::unique_lock<std::mutex> lock;
  cublasHandle_t handle;
};
BoundBlas BindBlasForCall(CudaDevice& device, int64_t lda, int64_t ldb, int64_t ldc) {
  constexpr int64_t kIntMax = std::numeric_limits<int>::max();
  TANDEM_CHECK(lda <= kIntMax && ldb <= kIntMax && ldc <= kIntMax,
               "CUDA Gemm: row strides lda=", lda, " ldb=", ldb, " ldc=", ldc,
               " exceed cuBLAS's 32-bit sizes");
  cudaStream_t stream = device.current_stream();
  BoundBlas bound{std::unique_lock<std::mutex>(device.blas_mutex()), device.blas()};
  device.BindBlas(stream);
  return bound;
}

// ---- The backend -------------------------------------------------------------------------

class CudaBackend final : public Backend {
 public:
  static Backend& Instance() {
    // Leaked on purpose, like the devices (see CudaDevices::Get).
    static CudaBackend* backend = new CudaBackend;
    return *backend;
  }

  DeviceType type() const override { return DeviceType::kCUDA; }
  int DeviceCount() const override { return CudaDevices::Get().count(); }
  std::string UnavailableReason() const override { return CudaDevices::Get().unavailable_reason(); }
  DeviceCapacity Capacity(int index) const override {
    cudaDeviceProp properties;
    TANDEM_CUDA_CHECK(cudaGetDeviceProperties(&properties, cuda::PhysicalDevice(index)), index);
    return DeviceCapacity{static_cast<int64_t>(properties.totalGlobalMem),
                          properties.multiProcessorCount};
  }

  // ---- Streams and events ----
  int CreateStream(int index) override { return Device(index).CreateStream(); }
  bool QueryStream(int index, int stream) override;
  void SynchronizeStream(int index, int stream) override {
    CheckMayWait("a stream synchronization", index);
    CudaDevice& device = Device(index);
    cudaStream_t handle = device.stream(stream);
    DeviceGuard guard(device.physical());
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(handle), index);
    device.RaiseDeviceAssert(handle);
  }
  std::unique_ptr<EventImpl> RecordEvent(int index, int stream) override {
    CudaDevice& device = Device(index);
    return std::make_unique<CudaEvent>(device, device.stream(stream));
  }
  void StreamWaitEvent(int index, int stream, EventImpl& event) override;

  // ---- Memory and copies ----
  Allocator& GetAllocator(int index) override { return Device(index).allocator(); }

  void Synchronize(int index) override {
    CudaDevice& device = Device(index);
    const int count = device.num_streams();
    for (int id = 0; id < count; ++id) SynchronizeStream(index, id);
  }

  void CopyToHost(int index, void* dst, const void* src, size_t bytes) override;
  void CopyFromHost(int index, void* dst, const void* src, size_t bytes) override;
  void CopyBetweenDevices(int dst_index, void* dst, int src_index, const void* src,
                          size_t bytes) override;
  std::shared_ptr<void> AllocatePinnedHost(size_t bytes) override {
    return CudaDevices::Get().pinned().Allocate(bytes);
  }

  void Copy(int index, const KernelTensor& dst, const KernelTensor& src) override;
  void Fill(int index, const KernelTensor& dst, double value) override;
  void Unary(int index, UnaryOp op, const KernelTensor& dst, const KernelTensor& src,
             double scalar) override;
  void Binary(int index, BinaryOp op, const KernelTensor& dst, const KernelTensor& a,
              const KernelTensor& b) override;
  void Reduce(int index, ReduceKind op, const KernelTensor& dst, const KernelTensor& src,
              int64_t outer, int64_t reduce, int64_t inner) override;
  void Gemm(int index, DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
            double alpha, const void* a, int64_t lda, int64_t stride_a, const void* b, int64_t ldb,
            int64_t stride_b, double beta, void* c, int64_t ldc, int64_t stride_c,
            int64_t batch) override;
  // cuBLAS's GemmEx with 16-bit A and B and a float32 C (CUBLAS_COMPUTE_32F); a float32 B
  // is declined (the caller casts it: on a GPU the batch's copy is small next to its memory).
  bool GemmFloatOutput(int index, DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n,
                       int64_t k, const void* a, int64_t lda, DType b_dtype, const void* b,
                       int64_t ldb, float* c, int64_t ldc) override;
  // cuBLASLt's matmul with the epilogue (Note [cuBLASLt epilogues]); float64 stays on Gemm.
  bool GemmWithEpilogue(int index, DType dtype, DType c_dtype, bool trans_a, bool trans_b,
                        int64_t m, int64_t n, int64_t k, const void* a, int64_t lda, const void* b,
                        int64_t ldb, void* c, int64_t ldc,
                        const GemmEpilogueArgs& epilogue) override;
  void RandomUniform(int index, DType dtype, void* dst, int64_t n, uint64_t seed, uint64_t offset,
                     double low, double high) override;
  void RandomNormal(int index, DType dtype, void* dst, int64_t n, uint64_t seed, uint64_t offset,
                    double mean, double stddev) override;

 private:
  CudaBackend() = default;

  static CudaDevice& Device(int index) { return CudaDevices::Get().device(index); }
};

// ---- Streams and events ----------------------------------------------------------------

bool CudaBackend::QueryStream(int index, int stream) {
  CudaDevice& device = Device(index);
  cudaStream_t handle = device.stream(stream);
  DeviceGuard guard(device.physical());
  const cudaError_t status = cudaStreamQuery(handle);
  if (status == cudaErrorNotReady) {
    cudaGetLastError();  // not an error: keep it from resurfacing at the next launch check
    return false;
  }
  TANDEM_CUDA_CHECK(status, index);
  return true;
}

void CudaBackend::StreamWaitEvent(int index, int stream, EventImpl& event) {
  CudaDevice& device = Device(index);
  cudaStream_t handle = device.stream(stream);
  auto* cuda_event = dynamic_cast<CudaEvent*>(&event);
  if (cuda_event == nullptr) {
    event.Synchronize();  // not a GPU event: the host orders it
    return;
  }
  // Events of another device are fine: the stream waits on the GPU, the host goes on.
  DeviceGuard guard(device.physical());
  TANDEM_CUDA_CHECK(cudaStreamWaitEvent(handle, cuda_event->get(), 0), index);
}

// ---- Copies ----------------------------------------------------------------------------

void CudaBackend::CopyToHost(int index, void* dst, const void* src, size_t bytes) {
  CudaDevice& device = Device(index);
  if (bytes == 0) return;
  CheckMayWait("a copy to the host (item(), to_vector, .to(cpu))", index);
  cudaStream_t stream = device.current_stream();
  DeviceGuard guard(device.physical());
  // Queued behind the kernels that produce `src`; the host waits for the bytes.
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream), index);
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream), index);
  device.RaiseDeviceAssert(stream);
}

void CudaBackend::CopyFromHost(int index, void* dst, const void* src, size_t bytes) {
  CudaDevice& device = Device(index);
  if (bytes == 0) return;
  cudaStream_t stream = device.current_stream();
  DeviceGuard guard(device.physical());
  PinnedHostAllocator& pinned = CudaDevices::Get().pinned();
  const bool from_pinned = pinned.Contains(src, bytes);
  if (!from_pinned) CheckMayWait("a copy from pageable host memory", index);
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream), index);
  if (from_pinned) {
    // Returns at once. The caller may free `src` as soon as we return: the pinned
    // allocator will not hand the block out again until this copy has read it.
    pinned.RecordUse(src, stream, device.physical());
  } else {
    // Pageable (or someone else's pinned) memory: its owner may reuse it the moment we
    // return, and nothing tracks it, so wait for the copy (as PyTorch's blocking copy does).
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream), index);
  }
}

void CudaBackend::CopyBetweenDevices(int dst_index, void* dst, int src_index, const void* src,
                                     size_t bytes) {
  CudaDevice& to = Device(dst_index);
  CudaDevice& from = Device(src_index);
  if (bytes == 0) return;
  const int to_stream_id = to.current_stream_id();
  cudaStream_t to_stream = to.stream(to_stream_id);
  if (dst_index == src_index) {
    DeviceGuard guard(to.physical());
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, to_stream),
                      dst_index);
    return;
  }
  if (to.physical() != from.physical()) {
    CudaDevices::Get().EnablePeerAccess(to.physical(), from.physical());
  }
  // 1. The copy runs on the destination's stream, after the work queued so far on the
  //    source's (which may still be writing `src`). The source's stream never waits.
  {
    CudaEvent source_ready(from, from.current_stream());
    DeviceGuard guard(to.physical());
    // The wait is fixed by this call: the event may go back to its pool right after.
    TANDEM_CUDA_CHECK(cudaStreamWaitEvent(to_stream, source_ready.get(), 0), dst_index);
  }
  DeviceGuard guard(to.physical());
  if (to.physical() == from.physical()) {
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, to_stream),
                      dst_index);
  } else {
    TANDEM_CUDA_CHECK(
        cudaMemcpyPeerAsync(dst, to.physical(), src, from.physical(), bytes, to_stream), dst_index);
  }
  // 2. `src`'s block may be freed as soon as we return, and the source's allocator would
  //    hand it out again to work on the source's stream, which does not wait for the copy:
  //    record the destination's stream on the block, so that it is reused only after the
  //    work queued there (the copy included) when it is freed.
  if (!from.allocator().TryRecordStream(
          src, tandem::Stream(tandem::Device::Cuda(dst_index), to_stream_id))) {
    // Memory that Tandem's allocator did not hand out: nothing can track its reuse, so make
    // the source's stream wait for the copy after all.
    CudaEvent copy_done(to, to_stream);
    TANDEM_CUDA_CHECK(cudaStreamWaitEvent(from.current_stream(), copy_done.get(), 0), src_index);
  }
}

// ---- Elementwise ---------------------------------------------------------------------------

// The device-memory bytes a kernel moves for `t`: each stored element once (a broadcast
// dimension, stride 0, is read once), for the roofline's counters (DeclareKernelWork).
double StoredBytes(const KernelTensor& t) {
  double elements = 1;
  for (int d = 0; d < t.ndim; ++d) {
    if (t.strides[d] != 0) elements *= static_cast<double>(t.sizes[d]);
  }
  return elements * static_cast<double>(ElementSize(t.dtype));
}

void CudaBackend::Copy(int index, const KernelTensor& dst, const KernelTensor& src) {
  CudaDevice& device = Device(index);
  CheckLayout(dst, "Copy");
  CheckLayout(src, "Copy");
  CheckSameShape(dst, src, "Copy", "a source");
  DeviceGuard guard(device.physical());
  LaunchCopy(device.Launch(), dst, src);
  DeclareKernelWork(0, StoredBytes(dst) + StoredBytes(src));
}

void CudaBackend::Fill(int index, const KernelTensor& dst, double value) {
  CudaDevice& device = Device(index);
  CheckLayout(dst, "Fill");
  DeviceGuard guard(device.physical());
  LaunchFill(device.Launch(), dst, value);
  DeclareKernelWork(0, StoredBytes(dst));
}

void CudaBackend::Unary(int index, UnaryOp op, const KernelTensor& dst, const KernelTensor& src,
                        double scalar) {
  CudaDevice& device = Device(index);
  CheckLayout(dst, "Unary");
  CheckLayout(src, "Unary");
  CheckSameShape(dst, src, "Unary", "an input");
  TANDEM_CHECK(dst.dtype == src.dtype, "CUDA Unary expects the output's dtype (", dst.dtype,
               ") to match the input's (", src.dtype, "); convert with Copy first");
  TANDEM_CHECK(IsFloatingPoint(src.dtype) || UnarySupportsInt64(op), "CUDA Unary: op ",
               static_cast<int>(op), " is defined for floating types only but got ", src.dtype,
               "; convert the tensor to float32 or float64 first");
  TANDEM_CHECK(!(src.dtype == kBool && RejectsBool(op)),
               "CUDA Unary: negation of a bool tensor is not supported (as in PyTorch); use "
               "logical not (x == false) or convert to an integer dtype first");
  DeviceGuard guard(device.physical());
  LaunchUnary(device.Launch(), op, dst, src, scalar);
  DeclareKernelWork(static_cast<double>(dst.numel()), StoredBytes(dst) + StoredBytes(src));
}

void CudaBackend::Binary(int index, BinaryOp op, const KernelTensor& dst, const KernelTensor& a,
                         const KernelTensor& b) {
  CudaDevice& device = Device(index);
  CheckLayout(dst, "Binary");
  CheckLayout(a, "Binary");
  CheckLayout(b, "Binary");
  CheckSameShape(dst, a, "Binary", "a first input (already broadcast)");
  CheckSameShape(dst, b, "Binary", "a second input (already broadcast)");
  const bool comparison = IsComparison(op);
  TANDEM_CHECK(a.dtype == b.dtype && (dst.dtype == a.dtype || (comparison && dst.dtype == kBool)),
               "CUDA Binary expects inputs and output of one dtype (or a bool output for a "
               "comparison) but got ",
               a.dtype, " and ", b.dtype, " into ", dst.dtype,
               "; convert them to a common dtype first");
  TANDEM_CHECK(!BinaryIsFloatingOnly(op) || IsFloatingPoint(a.dtype), "CUDA Binary: op ",
               static_cast<int>(op),
               " (an activation's backward) is defined for floating dtypes "
               "only but got ",
               a.dtype, "; convert the tensors to a floating dtype first");
  TANDEM_CHECK(!(a.dtype == kBool && !comparison && RejectsBool(op)), "CUDA Binary: op ",
               static_cast<int>(op),
               " is not defined for bool tensors (as in PyTorch: use logical xor for "
               "subtraction); convert them to a floating dtype first");
  DeviceGuard guard(device.physical());
  LaunchBinary(device.Launch(), op, dst, a, b);
  DeclareKernelWork(static_cast<double>(dst.numel()),
                    StoredBytes(dst) + StoredBytes(a) + StoredBytes(b));
}

// ---- Reductions ------------------------------------------------------------------------------

void CudaBackend::Reduce(int index, ReduceKind op, const KernelTensor& dst, const KernelTensor& src,
                         int64_t outer, int64_t reduce, int64_t inner) {
  CudaDevice& device = Device(index);
  TANDEM_CHECK(outer >= 0 && reduce >= 0 && inner >= 0,
               "CUDA Reduce expects non-negative [outer, reduce, inner] but got [", outer, ", ",
               reduce, ", ", inner, "]");
  TANDEM_CHECK(src.numel() == outer * reduce * inner, "CUDA Reduce: the input has ", src.numel(),
               " elements but [outer, reduce, inner] = [", outer, ", ", reduce, ", ", inner,
               "] describes ", outer * reduce * inner);
  TANDEM_CHECK(dst.numel() == outer * inner, "CUDA Reduce: the output has ", dst.numel(),
               " elements but [outer, inner] = [", outer, ", ", inner, "] needs ", outer * inner);
  TANDEM_CHECK(src.is_contiguous() && dst.is_contiguous(),
               "CUDA Reduce expects contiguous tensors; call contiguous() first");
  const bool arg = IsArgReduction(op);
  TANDEM_CHECK(dst.dtype == (arg ? kInt64 : src.dtype), "CUDA Reduce ", OpName(op), " writes ",
               (arg ? kInt64 : src.dtype), " but the output is ", dst.dtype);
  if (outer * inner == 0) return;
  TANDEM_CHECK(reduce > 0 || op == ReduceKind::kSum, "CUDA Reduce: ", OpName(op),
               " of an empty dimension is undefined (the dimension being reduced has size 0); "
               "reduce a non-empty dimension");
  DeviceGuard guard(device.physical());
  LaunchReduce(device.Launch(), op, dst, src, outer, reduce, inner);
  // Attributed to its last launch where it splits into two passes.
  DeclareKernelWork(static_cast<double>(src.numel()), StoredBytes(dst) + StoredBytes(src));
}

// ---- GEMM --------------------------------------------------------------------------------------

// cuBLAS's GEMM entry points for T: the one place the backend names a precision. float32 and
// float64 are SGEMM and DGEMM; bfloat16 and float16 are GemmEx with float compute (tensor
// cores, float accumulation, float alpha and beta, C rounded once), as PyTorch calls them.
cublasStatus_t CublasGemm(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb, int m,
                          int n, int k, const float* alpha, const float* a, int lda,
                          long long stride_a, const float* b, int ldb, long long stride_b,
                          const float* beta, float* c, int ldc, long long stride_c, int batch) {
  if (batch == 1) return cublasSgemm(handle, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  return cublasSgemmStridedBatched(handle, ta, tb, m, n, k, alpha, a, lda, stride_a, b, ldb,
                                   stride_b, beta, c, ldc, stride_c, batch);
}
cublasStatus_t CublasGemm(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb, int m,
                          int n, int k, const double* alpha, const double* a, int lda,
                          long long stride_a, const double* b, int ldb, long long stride_b,
                          const double* beta, double* c, int ldc, long long stride_c, int batch) {
  if (batch == 1) return cublasDgemm(handle, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  return cublasDgemmStridedBatched(handle, ta, tb, m, n, k, alpha, a, lda, stride_a, b, ldb,
                                   stride_b, beta, c, ldc, stride_c, batch);
}
template <typename T, typename = std::enable_if_t<kIsReducedFloat<T>>>
cublasStatus_t CublasGemm(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb, int m,
                          int n, int k, const float* alpha, const T* a, int lda, long long stride_a,
                          const T* b, int ldb, long long stride_b, const float* beta, T* c, int ldc,
                          long long stride_c, int batch) {
  const cudaDataType type = std::is_same_v<T, BFloat16> ? CUDA_R_16BF : CUDA_R_16F;
  if (batch == 1) {
    return cublasGemmEx(handle, ta, tb, m, n, k, alpha, a, type, lda, b, type, ldb, beta, c, type,
                        ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  }
  return cublasGemmStridedBatchedEx(handle, ta, tb, m, n, k, alpha, a, type, lda, stride_a, b, type,
                                    ldb, stride_b, beta, c, type, ldc, stride_c, batch,
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

void CudaBackend::Gemm(int index, DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n,
                       int64_t k, double alpha_value, const void* a_data, int64_t lda,
                       int64_t stride_a, const void* b_data, int64_t ldb, int64_t stride_b,
                       double beta_value, void* c_data, int64_t ldc, int64_t stride_c,
                       int64_t batch) {
  CudaDevice& device = Device(index);
  DispatchAllFloatingTypes(dtype, "CUDA Gemm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    // Rounded to the compute type first, as on the CPU: a float32 alpha that rounds to 0 skips
    // the product. 16-bit GEMMs compute in float (OpMath), so their alpha and beta are floats.
    using M = OpMath<T>;
    const M alpha = static_cast<M>(alpha_value), beta = static_cast<M>(beta_value);
    const T* a = static_cast<const T*>(a_data);
    const T* b = static_cast<const T*>(b_data);
    T* c = static_cast<T*>(c_data);
    TANDEM_CHECK(m >= 0 && n >= 0 && k >= 0 && batch >= 0,
                 "CUDA Gemm expects non-negative sizes but got m=", m, " n=", n, " k=", k,
                 " batch=", batch);
    if (m == 0 || n == 0 || batch == 0) return;
    constexpr int64_t kIntMax = std::numeric_limits<int>::max();
    TANDEM_CHECK(m <= kIntMax && n <= kIntMax && k <= kIntMax && batch <= kIntMax,
                 "CUDA Gemm: m=", m, " n=", n, " k=", k, " batch=", batch,
                 " exceed cuBLAS's 32-bit sizes; split the product");
    TANDEM_CHECK(batch == 1 || stride_c != 0, "CUDA Gemm: a batch of ", batch,
                 " products cannot write one C (stride_c = 0); give each product its own C");
    lda = LeadingDimension(trans_a ? k : m, trans_a ? m : k, lda, "lda");
    ldb = LeadingDimension(trans_b ? n : k, trans_b ? k : n, ldb, "ldb");
    ldc = LeadingDimension(m, n, ldc, "ldc");
    DeviceGuard guard(device.physical());
    if (k == 0 || alpha == M(0)) {
      // C = beta * C, as BLAS defines it; cuBLAS would reject k == 0's leading dimensions.
      LaunchScaleMatrices(device.Launch(), dtype, beta, c, m, n, ldc, stride_c, batch);
      return;
    }
    const BoundBlas blas = BindBlasForCall(device, lda, ldb, ldc);
    cublasHandle_t handle = blas.handle;
    if constexpr (std::is_same_v<T, float>) {
      // TF32 only ever applies to float32 (DGEMM and the 16-bit GEMMs ignore the mode), so the
      // other types leave the handle's mode as it is rather than switching it back and forth.
      // Every mode keeps split-K reductions of 16-bit GEMMs in float (the contract: GEMMs
      // accumulate in float), which cuBLAS otherwise may do in the 16-bit output type.
      const cublasMath_t mode = static_cast<cublasMath_t>(
          (allow_tf32.load() ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH) |
          CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);
      if (device.blas_math_mode() != mode) {
        TANDEM_CUBLAS_CHECK(cublasSetMathMode(handle, mode), index);
        device.blas_math_mode() = mode;
      }
    }
    // cuBLAS is column-major, and a row-major matrix is its transpose in column-major
    // terms. So the row-major C = op(A) op(B) is computed as the column-major
    // C^T = op(B)^T op(A)^T: swap the operands and m with n; the transposition flags and
    // leading dimensions stay as they are.
    const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    TANDEM_CUBLAS_CHECK(CublasGemm(handle, op_b, op_a, static_cast<int>(n), static_cast<int>(m),
                                   static_cast<int>(k), &alpha, b, static_cast<int>(ldb), stride_b,
                                   a, static_cast<int>(lda), stride_a, &beta, c,
                                   static_cast<int>(ldc), stride_c, static_cast<int>(batch)),
                        index);
  });
}

bool CudaBackend::GemmFloatOutput(int index, DType dtype, bool trans_a, bool trans_b, int64_t m,
                                  int64_t n, int64_t k, const void* a, int64_t lda, DType b_dtype,
                                  const void* b, int64_t ldb, float* c, int64_t ldc) {
  CudaDevice& device = Device(index);
  if ((dtype != DType::kBFloat16 && dtype != DType::kFloat16) || b_dtype != dtype) return false;
  TANDEM_CHECK(m >= 0 && n >= 0 && k >= 0, "CUDA Gemm expects non-negative sizes but got m=", m,
               " n=", n, " k=", k);
  if (m == 0 || n == 0) return true;
  constexpr int64_t kIntMax = std::numeric_limits<int>::max();
  TANDEM_CHECK(m <= kIntMax && n <= kIntMax && k <= kIntMax, "CUDA Gemm: m=", m, " n=", n, " k=", k,
               " exceed cuBLAS's 32-bit sizes; split the product");
  lda = LeadingDimension(trans_a ? k : m, trans_a ? m : k, lda, "lda");
  ldb = LeadingDimension(trans_b ? n : k, trans_b ? k : n, ldb, "ldb");
  ldc = LeadingDimension(m, n, ldc, "ldc");
  DeviceGuard guard(device.physical());
  if (k == 0) {
    // An empty sum: C = 0 (beta = 0 writes zeros without reading C). cuBLAS would reject
    // k == 0's leading dimensions.
    LaunchScaleMatrices(device.Launch(), DType::kFloat32, 0.0, c, m, n, ldc, 0, 1);
    return true;
  }
  const BoundBlas blas = BindBlasForCall(device, lda, ldb, ldc);
  cublasHandle_t handle = blas.handle;
  // The operands swapped, m with n, as in Gemm: the row-major C = op(A) op(B) is the
  // column-major C^T = op(B)^T op(A)^T. The handle's math mode only matters for float32
  // operands (TF32), so it is left as it is.
  const cudaDataType type = dtype == DType::kBFloat16 ? CUDA_R_16BF : CUDA_R_16F;
  const float alpha = 1.0f, beta = 0.0f;
  TANDEM_CUBLAS_CHECK(
      cublasGemmEx(handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                   static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, b, type,
                   static_cast<int>(ldb), a, type, static_cast<int>(lda), &beta, c, CUDA_R_32F,
                   static_cast<int>(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      index);
  return true;
}

// Note [cuBLASLt epilogues]: a linear's bias, a GELU after it and its bias gradient are fused
// into the GEMM through cuBLASLt's epilogues (BIAS, GELU_AUX_BIAS, BGRADB), as PyTorch's
// addmm/_addmm_activation and its fused linear do: no broadcast copy of the bias and no beta = 1
// pass over C, no separate pass for the GELU, and no column reduction launched for the bias
// gradient. float32 computes as CUBLAS_COMPUTE_32F, or 32F_FAST_TF32 when cuda::AllowTf32(); the
// 16-bit types as COMPUTE_32F with a 16-bit or float32 output. float64 is declined (cuBLASLt's
// epilogues are not for doubles): the caller composes it from Gemm, legacy cuBLAS's DGEMM. The
// matmul runs on the current stream with that stream's cuBLAS workspace (Note [cuBLAS workspace
// per stream], cuda_device.cc): cuBLAS and cuBLASLt calls on one stream are ordered, so they
// share it safely.

// The device's cuBLASLt handle, created on first use; needs the device's blas_mutex().
cublasLtHandle_t LtHandle(CudaDevice& device, int index) {
  // Leaked, like the devices; the map's own mutex, as two devices' calls may create theirs at once.
  static std::mutex* mutex = new std::mutex;
  static std::map<CudaDevice*, cublasLtHandle_t>* handles =
      new std::map<CudaDevice*, cublasLtHandle_t>;
  std::lock_guard<std::mutex> lock(*mutex);
  cublasLtHandle_t& handle = (*handles)[&device];
  if (handle == nullptr) TANDEM_CUBLAS_CHECK(cublasLtCreate(&handle), index);
  return handle;
}

cudaDataType CudaType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return CUDA_R_32F;
    case DType::kBFloat16:
      return CUDA_R_16BF;
    default:
      return CUDA_R_16F;
  }
}

// cuBLASLt's descriptors, destroyed with the call.
struct LtDescriptors {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  LtDescriptors() = default;
  LtDescriptors(const LtDescriptors&) = delete;
  LtDescriptors& operator=(const LtDescriptors&) = delete;
  ~LtDescriptors() {
    if (preference != nullptr) cublasLtMatmulPreferenceDestroy(preference);
    for (cublasLtMatrixLayout_t layout : {a, b, c}) {
      if (layout != nullptr) cublasLtMatrixLayoutDestroy(layout);
    }
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
  }
};

bool CudaBackend::GemmWithEpilogue(int index, DType dtype, DType c_dtype, bool trans_a,
                                   bool trans_b, int64_t m, int64_t n, int64_t k, const void* a,
                                   int64_t lda, const void* b, int64_t ldb, void* c, int64_t ldc,
                                   const GemmEpilogueArgs& epilogue) {
  const bool reduced = dtype == DType::kBFloat16 || dtype == DType::kFloat16;
  if (!(dtype == DType::kFloat32 || reduced) ||
      !(c_dtype == dtype || (reduced && c_dtype == DType::kFloat32))) {
    return false;
  }
  // Empty products, and aux rows cuBLASLt refuses (its ld must be a multiple of 8): composed.
  if (m <= 0 || n <= 0 || k <= 0) return false;
  const bool gelu = epilogue.kind == GemmEpilogue::kGeluTanhBias;
  const bool dgelu = epilogue.kind == GemmEpilogue::kDGeluTanhBiasGrad;
  if ((gelu || dgelu) && epilogue.aux != nullptr &&
      (epilogue.ld_aux < n || epilogue.ld_aux % 8 != 0)) {
    return false;
  }
  if (dgelu && (epilogue.aux == nullptr || c_dtype != dtype)) return false;
  const DType bias_dtype = dgelu && epilogue.float_bias_grad ? DType::kFloat32 : c_dtype;
  constexpr int64_t kIntMax = std::numeric_limits<int>::max();
  if (m > kIntMax || n > kIntMax || k > kIntMax) return false;
  lda = LeadingDimension(trans_a ? k : m, trans_a ? m : k, lda, "lda");
  ldb = LeadingDimension(trans_b ? n : k, trans_b ? k : n, ldb, "ldb");
  ldc = LeadingDimension(m, n, ldc, "ldc");
  CudaDevice& device = Device(index);
  DeviceGuard guard(device.physical());
  const BoundBlas blas = BindBlasForCall(device, lda, ldb, ldc);
  const cudaStream_t stream = device.current_stream();
  cublasLtHandle_t lt = LtHandle(device, index);
  // The row-major C = op(A) op(B) is the column-major C^T = op(B)^T op(A)^T (as in Gemm): B is
  // cuBLASLt's A, A its B. So a bias over C's columns is a bias over C^T's rows (BIAS), and the
  // sum over k of the row-major op(A) is the bias gradient of cuBLASLt's B (BGRADB).
  LtDescriptors d;
  const cublasComputeType_t compute = dtype == DType::kFloat32 && allow_tf32.load()
                                          ? CUBLAS_COMPUTE_32F_FAST_TF32
                                          : CUBLAS_COMPUTE_32F;
  TANDEM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&d.desc, compute, CUDA_R_32F), index);
  const auto set = [&](cublasLtMatmulDescAttributes_t attribute, const auto& value) {
    TANDEM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.desc, attribute, &value, sizeof(value)),
                        index);
  };
  const cublasOperation_t op_lt_a = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_lt_b = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  set(CUBLASLT_MATMUL_DESC_TRANSA, op_lt_a);
  set(CUBLASLT_MATMUL_DESC_TRANSB, op_lt_b);
  cublasLtEpilogue_t kind = CUBLASLT_EPILOGUE_BIAS;
  if (gelu) kind = epilogue.aux ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_BIAS;
  if (epilogue.kind == GemmEpilogue::kBiasGradA) kind = CUBLASLT_EPILOGUE_BGRADB;
  // DGELU_BGRAD's bias gradient is over D's rows, which are C's columns: the bias gradient of
  // the linear whose GELU output multiplied into op(B).
  if (dgelu) kind = CUBLASLT_EPILOGUE_DGELU_BGRAD;
  set(CUBLASLT_MATMUL_DESC_EPILOGUE, kind);
  const bool bias_grad = kind == CUBLASLT_EPILOGUE_BGRADB || dgelu;
  const void* bias = bias_grad ? epilogue.bias_grad : epilogue.bias;
  TANDEM_CHECK(bias != nullptr, "CUDA GemmWithEpilogue: the epilogue needs its ",
               bias_grad ? "bias_grad" : "bias", " pointer");
  set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  // The bias (or its gradient) is in C's type unless asked in float32; cuBLASLt's default is
  // D's, said explicitly.
  set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<int32_t>(CudaType(bias_dtype)));
  if (kind == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || dgelu) {
    set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, epilogue.aux);
    set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, epilogue.ld_aux);
  }
  const cudaDataType ab_type = CudaType(dtype), c_type = CudaType(c_dtype);
  TANDEM_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&d.a, ab_type, trans_b ? k : n, trans_b ? n : k, ldb), index);
  TANDEM_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&d.b, ab_type, trans_a ? m : k, trans_a ? k : m, lda), index);
  TANDEM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.c, c_type, n, m, ldc), index);
  TANDEM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&d.preference), index);
  const uint64_t workspace_bytes = device.blas_workspace_bytes();
  TANDEM_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(d.preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                           &workspace_bytes, sizeof(workspace_bytes)),
      index);
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  // No algorithm for these pointers' alignment or sizes is not an error: the caller composes.
  if (cublasLtMatmulAlgoGetHeuristic(lt, d.desc, d.a, d.b, d.c, d.c, d.preference, 1, &heuristic,
                                     &found) != CUBLAS_STATUS_SUCCESS ||
      found == 0) {
    return false;
  }
  const float alpha = 1.0f, beta = 0.0f;
  TANDEM_CUBLAS_CHECK(
      cublasLtMatmul(lt, d.desc, &alpha, b, d.a, a, d.b, &beta, c, d.c, c, d.c, &heuristic.algo,
                     device.BlasWorkspace(stream), workspace_bytes, stream),
      index);
  return true;
}

// ---- Random numbers --------------------------------------------------------------------------

void CudaBackend::RandomUniform(int index, DType dtype, void* dst, int64_t n, uint64_t seed,
                                uint64_t offset, double low, double high) {
  CudaDevice& device = Device(index);
  DeviceGuard guard(device.physical());
  LaunchRandomUniform(device.Launch(), dtype, dst, n, seed, offset, low, high);
}

void CudaBackend::RandomNormal(int index, DType dtype, void* dst, int64_t n, uint64_t seed,
                               uint64_t offset, double mean, double stddev) {
  CudaDevice& device = Device(index);
  DeviceGuard guard(device.physical());
  LaunchRandomNormal(device.Launch(), dtype, dst, n, seed, offset, mean, stddev);
}

BackendRegistration registration(DeviceType::kCUDA, &CudaBackend::Instance);

}  // namespace

// ---- tensor/cuda/cuda.h
// ----------------------------------------------------------------------------

bool IsAvailable() { return DeviceCount() > 0; }
int DeviceCount() { return CudaDevices::Get().count(); }
std::string UnavailableReason() { return CudaDevices::Get().unavailable_reason(); }

void Synchronize(int device) { CudaBackend::Instance().Synchronize(device); }

void SetAllowTf32(bool allow) { allow_tf32.store(allow); }
bool AllowTf32() { return allow_tf32.load(); }
void SetSyncDebugError(bool on) { sync_debug_error.store(on); }
bool SyncDebugError() { return sync_debug_error.load(); }

int PhysicalDevice(int device) { return CudaDevices::Get().device(device).physical(); }
void* Stream(int device) { return CudaDevices::Get().device(device).current_stream(); }
void* StreamHandle(tandem::Stream stream) {
  TANDEM_CHECK(stream.device().is_cuda(),
               "cuda::StreamHandle expects a stream of a CUDA device "
               "but got ",
               stream, "; CPU streams have no handle");
  return CudaDevices::Get().device(stream.device().index()).stream(stream.id());
}

namespace testing {

void Spin(tandem::Stream stream, int64_t nanoseconds) {
  TANDEM_CHECK(stream.device().is_cuda() && nanoseconds >= 0,
               "cuda::testing::Spin expects a CUDA stream and a non-negative duration but got ",
               stream, " and ", nanoseconds, " ns");
  CudaDevice& device = CudaDevices::Get().device(stream.device().index());
  DeviceGuard guard(device.physical());
  LaunchSpin(device.Launch(stream.id()), nanoseconds);
}

}  // namespace testing

}  // namespace cuda
}  // namespace tandem
