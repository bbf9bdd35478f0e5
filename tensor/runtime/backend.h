// Backend: the small interface through which the device-independent core (Tensor, ops,
// autograd) reaches device-specific code. One Backend is registered per DeviceType: the
// CPU backend always, the CUDA backend from tensor/cuda/ when Tandem is built with CUDA.
// Core code never includes a CUDA header; it calls these virtual functions. An op's own
// kernels (softmax, pooling, attention, ...) are not here: they are KernelStubs
// (tensor/runtime/kernel_stub.h) declared in tensor/kernels/*_kernels.h.
//
// Kernels take KernelTensor views (data pointer already offset, sizes and strides in
// elements). They run asynchronously with respect to the host on devices that queue work
// (CUDA: on the device's current stream, see tensor/runtime/stream.h); CopyToHost and Synchronize
// wait.
//
// Most users never touch this header. A new device type implements Backend and registers
// it with a static BackendRegistration:
//
//   static tandem::BackendRegistration registration(tandem::DeviceType::kCUDA,
//                                                   &MyCudaBackend::Instance);
#ifndef TANDEM_TENSOR_RUNTIME_BACKEND_H_
#define TANDEM_TENSOR_RUNTIME_BACKEND_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensor/base/device.h"
#include "tensor/base/dtype.h"
#include "tensor/base/max_dims.h"
#include "tensor/runtime/allocator.h"
#include "tensor/runtime/op_tables.h"
#include "tensor/runtime/stream.h"

namespace tandem {

// A strided view of device memory, handed to kernels. Plain data so that it can be passed
// by value to a CUDA kernel.
struct KernelTensor {
  void* data = nullptr;
  DType dtype = DType::kFloat32;
  int ndim = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};  // in elements; 0 for broadcast dimensions

  int64_t numel() const {
    int64_t n = 1;
    for (int d = 0; d < ndim; ++d) n *= sizes[d];
    return n;
  }
  bool is_contiguous() const {
    int64_t expected = 1;
    for (int d = ndim - 1; d >= 0; --d) {
      if (sizes[d] != 1 && strides[d] != expected) return false;
      expected *= sizes[d];
    }
    return true;
  }
  template <typename T>
  T* ptr() const {
    return static_cast<T*>(data);
  }

  // A contiguous vector of `n` elements at `data`.
  static KernelTensor Vector(void* data, int64_t n, DType dtype = DType::kFloat32) {
    KernelTensor t;
    t.data = data;
    t.dtype = dtype;
    t.ndim = 1;
    t.sizes[0] = n;
    t.strides[0] = 1;
    return t;
  }
};

// UnaryOp, BinaryOp and ReduceKind, the ops of Unary, Binary and Reduce below: see their
// tables in tensor/runtime/op_tables.h.

// A backend's event, behind tandem::Event (tensor/runtime/stream.h): a point in one stream's queue,
// made by Backend::RecordEvent.
class EventImpl {
 public:
  virtual ~EventImpl() = default;
  // Whether the work before the point has finished (never blocks).
  virtual bool Query() = 0;
  // Waits on the host until it has; throws tandem::Error carrying any asynchronous error.
  virtual void Synchronize() = 0;
};

// What a device can do, for balancing work across devices (DataParallel warns when some
// are much weaker than others). Zero means unknown.
struct DeviceCapacity {
  int64_t memory_bytes = 0;  // total memory the device can hold
  int64_t cores = 0;         // threads (CPU) or multiprocessors (GPU)
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual DeviceType type() const = 0;
  // Devices of this type usable in this process (0 when, e.g., there is no GPU).
  virtual int DeviceCount() const = 0;
  // Why DeviceCount() is 0, for error messages ("no CUDA driver: ..."); empty otherwise.
  virtual std::string UnavailableReason() const { return ""; }
  // The device's memory and cores (zeros where the backend cannot tell).
  virtual DeviceCapacity Capacity(int /*index*/) const { return {}; }

  // ---- Streams and events (see tensor/runtime/stream.h) ---------------------------------------
  // Stream 0 of a device is its compute stream; CreateStream makes side streams. Kernels and
  // copies go to the calling thread's CurrentStream of their device. The defaults suit
  // devices whose work runs synchronously on the calling thread (CPU): every stream is idle
  // whenever the host looks, and an event is complete as soon as it is recorded.
  //
  // A new side stream of device `index`; returns its id (>= 1).
  virtual int CreateStream(int index);
  // QueryStream: whether all work queued on the stream has finished; SynchronizeStream
  // waits on the host until it has.
  virtual bool QueryStream(int index, int stream);
  virtual void SynchronizeStream(int index, int stream);
  // An event capturing the work queued so far on stream `stream` of device `index`.
  virtual std::unique_ptr<EventImpl> RecordEvent(int index, int stream);
  // Work queued later on stream `stream` of device `index` waits for `event`, an event this
  // backend made (on any of its devices). The default waits on the host.
  virtual void StreamWaitEvent(int index, int stream, EventImpl& event);

  // ---- Memory and copies -------------------------------------------------------------
  virtual Allocator& GetAllocator(int index) = 0;
  // Waits for all work queued on the device, on every one of its streams.
  virtual void Synchronize(int index) = 0;
  // Contiguous byte copies between the device and host memory, on the device's current
  // stream. CopyToHost returns when the bytes are on the host; CopyFromHost may return
  // earlier only if `src` is pinned.
  virtual void CopyToHost(int index, void* dst, const void* src, size_t bytes) = 0;
  virtual void CopyFromHost(int index, void* dst, const void* src, size_t bytes) = 0;
  // Contiguous byte copy between two devices of this type. It runs on the destination's
  // current stream, after an event recorded on the source's current stream: it sees the
  // work queued there before the call, and work queued later on the destination's stream
  // sees the copy. The source's stream does not wait; it goes on computing. The caller may
  // free `src` at once: backends with asynchronous streams keep its memory from being
  // reused until the copy has read it (RecordStream on the destination's stream). Writing
  // `src` in place on the source device later is not ordered after the copy: such a writer
  // first makes the source's stream wait for the destination's (Stream::Wait).
  virtual void CopyBetweenDevices(int dst_index, void* dst, int src_index, const void* src,
                                  size_t bytes) = 0;
  // Page-locked host memory for fast, asynchronous copies to this device type. Backends
  // without such memory return nullptr.
  virtual std::shared_ptr<void> AllocatePinnedHost(size_t /*bytes*/) { return nullptr; }

  // ---- Kernels (all tensors on device `index`) ----------------------------------------
  // dst[i] = src[i] for strided views of the same shape; converts between any two of the
  // 8 dtypes if they differ: to bool, nonzero (NaN too) is true; floats to integers truncate
  // (to uint8 through int64, so negative values wrap); to the 16-bit floats, round to nearest
  // even (float64 through float32, as PyTorch).
  virtual void Copy(int index, const KernelTensor& dst, const KernelTensor& src) = 0;
  virtual void Fill(int index, const KernelTensor& dst, double value) = 0;
  // dst = op(src, scalar); shapes equal (strides may differ; dst may alias src exactly).
  virtual void Unary(int index, UnaryOp op, const KernelTensor& dst, const KernelTensor& src,
                     double scalar) = 0;
  // dst = op(a, b); a and b already broadcast to dst's shape (stride 0 where broadcast).
  virtual void Binary(int index, BinaryOp op, const KernelTensor& dst, const KernelTensor& a,
                      const KernelTensor& b) = 0;
  // See ReduceKind. `src` and `dst` are contiguous.
  virtual void Reduce(int index, ReduceKind op, const KernelTensor& dst, const KernelTensor& src,
                      int64_t outer, int64_t reduce, int64_t inner) = 0;
  // Gemm, GemmFloatOutput and the random kernels take `dtype`, the element type of their
  // floating-point operands (float32, float64, bfloat16 or float16), and untyped pointers to
  // them; the 16-bit floats are loaded as float, computed in float and rounded once when stored.
  // An op's own kernels (softmax, pooling, attention, ...) are KernelStubs instead, declared in
  // tensor/kernels/*_kernels.h and registered by each backend (tensor/runtime/kernel_stub.h).
  //
  // Row-major batched GEMM (16-bit floats: float accumulation, alpha and beta in float, C
  // rounded once): for b in [0, batch):
  //   C_b = alpha * op(A_b) * op(B_b) + beta * C_b,  op(X) = X or X^T,
  // with A_b = a + b * stride_a (stride 0 reuses one matrix), likewise B and C.
  // op(A) is m x k, op(B) is k x n, C is m x n; lda/ldb/ldc are row strides (in elements).
  virtual void Gemm(int index, DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n,
                    int64_t k, double alpha, const void* a, int64_t lda, int64_t stride_a,
                    const void* b, int64_t ldb, int64_t stride_b, double beta, void* c, int64_t ldc,
                    int64_t stride_c, int64_t batch) = 0;
  // C = op(A) * op(B) for one product of 16-bit A (`dtype`) and B into a float32 C (row-major,
  // leading dimensions as Gemm's): float accumulation with C never rounded to 16 bits, for the
  // float32 weight gradients of autocast's linear (Note [Autocast linear], tensor/ops/linalg.cc).
  // B is stored as `b_dtype`: `dtype`, or float32, which the backend rounds to `dtype` (as a
  // cast does) a block at a time where it can, so that no whole 16-bit copy of B is held (the
  // first layer's weight gradient, whose B is the float32 batch).
  // Returns false, having written nothing, where the backend has no such kernel (the default)
  // or cannot take this `b_dtype`: the caller then casts B itself, or computes the product in
  // `dtype` and converts it.
  virtual bool GemmFloatOutput(int /*index*/, DType /*dtype*/, bool /*trans_a*/, bool /*trans_b*/,
                               int64_t /*m*/, int64_t /*n*/, int64_t /*k*/, const void* /*a*/,
                               int64_t /*lda*/, DType /*b_dtype*/, const void* /*b*/,
                               int64_t /*ldb*/, float* /*c*/, int64_t /*ldc*/) {
    return false;
  }
  // One row-major product C = op(A) * op(B) (leading dimensions as Gemm's, alpha 1, beta 0)
  // with an epilogue fused into the GEMM, as cuBLASLt's:
  //   kBias          C = op(A) op(B) + bias              bias: [n], C's dtype
  //   kGeluTanhBias  P = op(A) op(B) + bias, C = gelu_tanh(P), and P stored into `aux` ([m, n],
  //                  row stride ld_aux, C's dtype) for the backward when aux is given
  //   kBiasGradA     C = op(A) op(B), and bias_grad[i] = sum_k op(A)[i, k]   bias_grad: [m],
  //                  c_dtype (a linear's weight gradient dW = G^T X with its bias gradient)
  //   kDGeluTanhBiasGrad  C = op(A) op(B) * gelu_tanh'(aux), aux as kGeluTanhBias stored it, and
  //                  bias_grad[j] = sum_i C[i, j]   bias_grad: [n], c_dtype or, with
  //                  float_bias_grad, float32 (the gradient of kGeluTanhBias's pre-activation
  //                  and bias from the next linear's: one GEMM instead of a GEMM and a pass)
  // A and B are `dtype`; C is `c_dtype`: dtype, or float32 for 16-bit A and B (as
  // GemmFloatOutput). Returns false, having written nothing, where the backend has no such kernel
  // (the default; the CPU composes the same values from Gemm and elementwise kernels, which the
  // caller then does) or its library declines these arguments.
  enum class GemmEpilogue { kBias, kGeluTanhBias, kBiasGradA, kDGeluTanhBiasGrad };
  struct GemmEpilogueArgs {
    GemmEpilogue kind = GemmEpilogue::kBias;
    const void* bias = nullptr;
    void* aux = nullptr;
    int64_t ld_aux = 0;
    void* bias_grad = nullptr;
    bool float_bias_grad = false;  // kDGeluTanhBiasGrad's bias_grad in float32, C 16-bit
  };
  virtual bool GemmWithEpilogue(int /*index*/, DType /*dtype*/, DType /*c_dtype*/, bool /*trans_a*/,
                                bool /*trans_b*/, int64_t /*m*/, int64_t /*n*/, int64_t /*k*/,
                                const void* /*a*/, int64_t /*lda*/, const void* /*b*/,
                                int64_t /*ldb*/, void* /*c*/, int64_t /*ldc*/,
                                const GemmEpilogueArgs& /*epilogue*/) {
    return false;
  }
  // Counter-based random numbers (see tensor/base/philox.h): element i is a pure function of
  // (seed, offset + i), so every backend produces the same numbers for the same request.
  // Uniform in [low, high), or normal(mean, stddev) by Box-Muller. Note [Random float64]:
  // a float64 request draws the float32 request's numbers, widened (computed in float32), so
  // rand(shape, kFloat64) equals rand(shape).to(kFloat64) for the same generator state.
  // Likewise a bfloat16/float16 request draws the float32 numbers rounded to nearest, except
  // that a uniform draw that rounds up to `high` takes the largest 16-bit value below it, so
  // that the interval stays half-open.
  virtual void RandomUniform(int index, DType dtype, void* dst, int64_t n, uint64_t seed,
                             uint64_t offset, double low, double high) = 0;
  virtual void RandomNormal(int index, DType dtype, void* dst, int64_t n, uint64_t seed,
                            uint64_t offset, double mean, double stddev) = 0;

 protected:
  // Throws tandem::Error unless `index` is one of this backend's devices.
  void CheckDevice(int index) const;
  // Also unless `stream` is 0 or an id that the default CreateStream gave.
  void CheckStream(int index, int stream) const;

 private:
  std::atomic<int> last_default_stream_{0};  // ids the default CreateStream gave
};

// The backend for a device type; throws tandem::Error (naming how to get one) if none is
// registered, e.g. cuda in a CPU-only build.
Backend& GetBackend(DeviceType type);
Backend* FindBackend(DeviceType type);  // nullptr when not registered
inline Backend& GetBackend(Device device) { return GetBackend(device.type()); }

// Registers a backend at static-initialisation time. `instance` is called once, lazily.
class BackendRegistration {
 public:
  BackendRegistration(DeviceType type, Backend& (*instance)());
};

}  // namespace tandem

#endif  // TANDEM_TENSOR_RUNTIME_BACKEND_H_
