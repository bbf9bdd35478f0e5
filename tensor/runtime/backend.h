// Backend: the small interface through which the device-independent core (Tensor, ops,
// autograd) reaches device-specific code. One Backend is registered per DeviceType: the
// CPU backend always, the CUDA backend from tensor/cuda/ when Tandem is built with CUDA.
// Core code never includes a CUDA header; it calls these virtual functions.
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
#include "tensor/runtime/allocator.h"
#include "tensor/runtime/op_tables.h"
#include "tensor/runtime/stream.h"

namespace tandem {

inline constexpr int kMaxDims = 8;

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

// Describes a 2-D convolution or pooling window over NCHW images. A window's taps are
// `dilation` apart (it spans dilation * (kernel - 1) + 1 pixels). With ceil_mode the output
// size rounds up, as PyTorch's pooling does, but the last window must start inside the input
// or its left padding.
struct Conv2dGeometry {
  int64_t batch = 0, channels = 0, height = 0, width = 0;
  int64_t kernel_h = 0, kernel_w = 0;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  int64_t dilation_h = 1, dilation_w = 1;
  bool ceil_mode = false;
  // Im2Col/Col2Im's column layout: false: [batch, channels*kh*kw, out_h*out_w] (one matrix
  // per image); true: [channels*kh*kw, batch, out_h*out_w] (one matrix with every image's
  // columns side by side, for a single large GEMM over the batch).
  bool batch_in_columns = false;
  constexpr int64_t span_h() const { return dilation_h * (kernel_h - 1) + 1; }
  constexpr int64_t span_w() const { return dilation_w * (kernel_w - 1) + 1; }
  int64_t out_h() const { return OutSize(height, span_h(), stride_h, pad_h, ceil_mode); }
  int64_t out_w() const { return OutSize(width, span_w(), stride_w, pad_w, ceil_mode); }

  // Im2Col's columns: where the row of image b, channel c, tap 0 starts, and the distance
  // between the rows of consecutive taps (ky * kernel_w + kx) of that image and channel.
  // constexpr so that CUDA kernels can call them too.
  constexpr int64_t columns_start(int64_t b, int64_t c, int64_t out_plane) const {
    const int64_t window = kernel_h * kernel_w;
    return (batch_in_columns ? c * window * batch + b : (b * channels + c) * window) * out_plane;
  }
  constexpr int64_t columns_tap_stride(int64_t out_plane) const {
    return batch_in_columns ? batch * out_plane : out_plane;
  }

  // PyTorch's pooling_output_shape (the padded input must hold one window).
  static int64_t OutSize(int64_t in, int64_t span, int64_t stride, int64_t pad, bool ceil) {
    const int64_t room = in + 2 * pad - span;
    int64_t out = (ceil ? room + stride - 1 : room) / stride + 1;
    if (ceil && (out - 1) * stride >= in + pad) --out;
    return out;
  }

  static Conv2dGeometry Make(int64_t batch, int64_t channels, int64_t height, int64_t width,
                             int64_t kernel_h, int64_t kernel_w, int64_t stride_h, int64_t stride_w,
                             int64_t pad_h, int64_t pad_w) {
    Conv2dGeometry g;
    g.batch = batch;
    g.channels = channels;
    g.height = height;
    g.width = width;
    g.kernel_h = kernel_h;
    g.kernel_w = kernel_w;
    g.stride_h = stride_h;
    g.stride_w = stride_w;
    g.pad_h = pad_h;
    g.pad_w = pad_w;
    return g;
  }
};

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

// ---- Fused attention (scaled_dot_product_attention's kernels) ------------------------------
// Note [Fused attention]: softmax(q k^T * scale + mask) v for `batch` independent heads,
// computed a tile of keys at a time with an online softmax (running max and sum), so that
// the query_len x key_len matrix never exists in memory; the backward recomputes the
// probabilities from the saved log-sum-exp (FlashAttention-2). Operands are contiguous:
// q [batch, query_len, head_dim], k [batch, key_len, head_dim], v [batch, key_len, value_dim],
// out [batch, query_len, value_dim], all of one floating dtype; logsumexp [batch, query_len]
// is float64 for float64 operands and float32 otherwise (the kernels' accumulation type:
// 16-bit operands load as float, accumulate in float and round once when stored).
struct AttentionGeometry {
  int64_t batch = 0, query_len = 0, key_len = 0, head_dim = 0, value_dim = 0;
  double scale = 1.0;
  // Query i attends keys 0..i only (top-left aligned, as PyTorch's is_causal).
  bool causal = false;
  // An optional additive mask of the operands' dtype (-inf excludes a key): element (b, i, j)
  // at mask[(b / mask_heads) * mask_batch_stride + (b % mask_heads) * mask_head_stride +
  // i * mask_row_stride + j]; a stride of 0 broadcasts. Two strides for the heads, so that a
  // [batch, heads] mask (a key-padding mask broadcast over the heads) needs no copy.
  int64_t mask_heads = 1;
  int64_t mask_batch_stride = 0, mask_head_stride = 0, mask_row_stride = 0;
  constexpr int64_t mask_offset(int64_t b, int64_t i) const {
    return (b / mask_heads) * mask_batch_stride + (b % mask_heads) * mask_head_stride +
           i * mask_row_stride;
  }
  // Dropout on the normalised weights (FlashAttention's): weight (b, i, j) is kept, scaled by
  // 1 / (1 - dropout_p), where philox::Uniform(dropout_seed, dropout_counter(b, i, j)) >=
  // dropout_p, and zeroed elsewhere; the log-sum-exp is that of the undropped weights. The
  // mask is a pure function of these three fields, so the backward regenerates it and every
  // backend draws the same one: the counters are those `dropout` of the [batch, query_len,
  // key_len] weights would use (the caller reserves batch * query_len * key_len of them).
  double dropout_p = 0.0;
  uint64_t dropout_seed = 0, dropout_offset = 0;
  constexpr uint64_t dropout_counter(int64_t b, int64_t i, int64_t j) const {
    return dropout_offset + static_cast<uint64_t>((b * query_len + i) * key_len + j);
  }
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
  // The kernels below take `dtype`, the element type of their floating-point operands
  // (float32, float64, bfloat16 or float16; int64 index operands stay int64_t), and untyped
  // pointers to them. The 16-bit floats are loaded as float, computed in float and rounded
  // once when stored; sums inside a kernel (softmax's, pooling windows, Col2Im's taps, a GEMM's
  // dot products, max pooling's backward) accumulate in float or wider. Scatter-adds into a
  // 16-bit dst round after each add, as PyTorch does.
  //
  // Softmax or log-softmax over the middle axis of contiguous [outer, dim, inner].
  virtual void Softmax(int index, DType dtype, bool log, void* dst, const void* src, int64_t outer,
                       int64_t dim, int64_t inner) = 0;
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
  // Unfolds NCHW images into columns [batch, channels*kh*kw, out_h*out_w] (zero padding).
  virtual void Im2Col(int index, DType dtype, const Conv2dGeometry& g, const void* image,
                      void* columns) = 0;
  // The adjoint of Im2Col: sums columns back into images (overwrites `image`).
  virtual void Col2Im(int index, DType dtype, const Conv2dGeometry& g, const void* columns,
                      void* image) = 0;
  // Max pooling over NCHW (padding counts as -inf). Writes the output and, per output
  // element, the flat index (within its H*W plane) of the chosen input element.
  virtual void MaxPool2d(int index, DType dtype, const Conv2dGeometry& g, const void* input,
                         void* output, int64_t* argmax) = 0;
  // grad_input (zeroed here first) += grad_output at the argmax positions.
  virtual void MaxPool2dBackward(int index, DType dtype, const Conv2dGeometry& g,
                                 const void* grad_output, const int64_t* argmax,
                                 void* grad_input) = 0;
  // Average pooling over NCHW, as PyTorch's avg_pool2d: each output is the sum of its
  // window's pixels inside the image, divided by the window's size clipped to the padded
  // input (count_include_pad) or to the image (otherwise). Dilation must be 1.
  virtual void AvgPool2d(int index, DType dtype, const Conv2dGeometry& g, bool count_include_pad,
                         const void* input, void* output) = 0;
  // The adjoint of AvgPool2d (overwrites grad_input).
  virtual void AvgPool2dBackward(int index, DType dtype, const Conv2dGeometry& g,
                                 bool count_include_pad, const void* grad_output,
                                 void* grad_input) = 0;
  // Adaptive average pooling of `planes` contiguous height x width planes into out_h x out_w:
  // output (i, j) is the mean of rows [floor(i * height / out_h), ceil((i + 1) * height /
  // out_h)) and likewise of columns, as PyTorch's adaptive_avg_pool2d.
  virtual void AdaptiveAvgPool2d(int index, DType dtype, int64_t planes, int64_t height,
                                 int64_t width, int64_t out_h, int64_t out_w, const void* input,
                                 void* output) = 0;
  // The adjoint of AdaptiveAvgPool2d (overwrites grad_input).
  virtual void AdaptiveAvgPool2dBackward(int index, DType dtype, int64_t planes, int64_t height,
                                         int64_t width, int64_t out_h, int64_t out_w,
                                         const void* grad_output, void* grad_input) = 0;
  // dst[r] = src[r * cols + idx[r]] for r in [0, rows). Indices must be in [0, cols): the
  // caller validates them.
  virtual void GatherColumns(int index, DType dtype, void* dst, const void* src, const int64_t* idx,
                             int64_t rows, int64_t cols) = 0;
  // dst[r * cols + idx[r]] += src[r] (dst is not cleared).
  virtual void ScatterAddColumns(int index, DType dtype, void* dst, const void* src,
                                 const int64_t* idx, int64_t rows, int64_t cols) = 0;
  // torch.gather over the middle axis of contiguous tensors: src [outer, src_dim, inner],
  // idx and dst [outer, idx_dim, inner]: dst[o, j, i] = src[o, idx[o, j, i], i]. Indices must
  // be in [0, src_dim): the caller validates them.
  virtual void Gather(int index, DType dtype, void* dst, const void* src, const int64_t* idx,
                      int64_t outer, int64_t src_dim, int64_t idx_dim, int64_t inner) = 0;
  // The adjoint of Gather: dst[o, idx[o, j, i], i] += src[o, j, i] for dst [outer, dst_dim,
  // inner] (not cleared). Repeated indices accumulate.
  virtual void ScatterAdd(int index, DType dtype, void* dst, const void* src, const int64_t* idx,
                          int64_t outer, int64_t dst_dim, int64_t idx_dim, int64_t inner) = 0;
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

  // A convolution (groups = 1, contiguous NCHW operands, the geometry's stride, padding and
  // dilation) by a kernel of the backend's own rather than conv2d's Im2Col + Gemm + Col2Im:
  // forward (bias nullable), the input's gradient, and the weight's (and bias's, when
  // grad_bias is not null) summed over the batch. Each returns false, having written nothing,
  // where the backend has no such kernel for the dtype or geometry; the default has none.
  virtual bool Conv2dForward(int /*index*/, DType /*dtype*/, const Conv2dGeometry& /*g*/,
                             int64_t /*out_channels*/, const void* /*input*/,
                             const void* /*weight*/, const void* /*bias*/, void* /*output*/) {
    return false;
  }
  virtual bool Conv2dBackwardData(int /*index*/, DType /*dtype*/, const Conv2dGeometry& /*g*/,
                                  int64_t /*out_channels*/, const void* /*grad_output*/,
                                  const void* /*weight*/, void* /*grad_input*/) {
    return false;
  }
  virtual bool Conv2dBackwardWeights(int /*index*/, DType /*dtype*/, const Conv2dGeometry& /*g*/,
                                     int64_t /*out_channels*/, const void* /*input*/,
                                     const void* /*grad_output*/, void* /*grad_weight*/,
                                     void* /*grad_bias*/) {
    return false;
  }

  // ---- Fused normalisation and triangles (layer_norm, rms_norm, tril, triu) -----------------
  // Note [Fused row norms]: layer_norm and rms_norm normalise each row of a contiguous
  // [rows, cols] input in one pass over it, instead of the mean, subtraction, square, mean,
  // add, sqrt, division, product and sum that the formula composes (each a full pass and an
  // autograd node). Statistics are computed in OpMath (float for the 16-bit floats, double for
  // float64) by two passes over the row (mean, then the centred variance), and saved as
  // `mean` and `rstd` (contiguous [rows], OpMath's dtype: float32, or float64 for float64
  // inputs) for the backward. LayerNorm: y = (x - mean) * rstd * weight + bias with
  // rstd = 1 / sqrt(biased variance + eps); rms (RMSNorm): mean is not subtracted (nor saved:
  // `mean` may be null) and rstd = 1 / sqrt(mean(x^2) + eps). `weight` and `bias` ([cols],
  // the input's dtype) may each be null (no scale, no shift; RMSNorm has no bias).
  virtual void RowNorm(int index, DType dtype, bool rms, int64_t rows, int64_t cols, double eps,
                       const void* x, const void* weight, const void* bias, void* y, void* mean,
                       void* rstd) = 0;
  // The backward of RowNorm from the saved statistics, with xhat = (x - mean) * rstd and
  // g = grad_y * weight: grad_x = rstd * (g - mean(g) - xhat * mean(g * xhat)) (rms: without
  // the mean(g) term); grad_weight = sum over rows of grad_y * xhat; grad_bias = sum over rows
  // of grad_y. Each output may be null (not needed); the row sums accumulate in OpMath.
  virtual void RowNormBackward(int index, DType dtype, bool rms, int64_t rows, int64_t cols,
                               const void* grad_y, const void* x, const void* mean,
                               const void* rstd, const void* weight, void* grad_x,
                               void* grad_weight, void* grad_bias) = 0;
  // torch.tril (lower) / torch.triu of `batch` contiguous rows x cols matrices, any dtype:
  // dst keeps src's element (i, j) where j - i <= diagonal (lower) or j - i >= diagonal
  // (upper), and is zero elsewhere. dst may be src (in place).
  virtual void Triangle(int index, DType dtype, bool lower, int64_t diagonal, int64_t batch,
                        int64_t rows, int64_t cols, const void* src, void* dst) = 0;

  // ---- Fused attention (Note [Fused attention]) ------------------------------------------
  // out and logsumexp from q, k, v and the optional `mask` (nullptr for none). A query that
  // may attend no key gets NaN outputs (as PyTorch) and a logsumexp of -inf.
  virtual void AttentionForward(int index, DType dtype, const AttentionGeometry& g, const void* q,
                                const void* k, const void* v, const void* mask, void* out,
                                void* logsumexp) = 0;
  // dq, dk, dv (overwritten) from dout and the forward's out and logsumexp.
  virtual void AttentionBackward(int index, DType dtype, const AttentionGeometry& g, const void* q,
                                 const void* k, const void* v, const void* mask, const void* out,
                                 const void* dout, const void* logsumexp, void* dq, void* dk,
                                 void* dv) = 0;

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
