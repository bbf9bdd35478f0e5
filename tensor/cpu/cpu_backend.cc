// The CPU backend: kernels for logical CPU devices over host memory.
//
// Every kernel runs on the calling thread and splits large loops over the intra-op thread
// pool of its logical device (ParallelFor), so that cpu:0 and cpu:1 each use their own share
// of the cores. The elementwise kernels are in elementwise_kernels.cc and the reductions in
// reduce_kernels.cc (loops shared by all three in internal/cpu_loops.h); their math comes from
// tensor/kernels/internal/elementwise_math.h, shared with the CUDA backend, so that the CPU is
// an exact oracle for the GPU. GEMM is OpenBLAS, pinned to one thread: parallelism comes from
// splitting the product over our pool instead, so OpenBLAS's own threads never compete with
// other logical devices.
//
// Every loop computes each output element in one place, independently of how the range is
// split, so results are bitwise the same whatever the number of threads.
//
// bfloat16 and float16 are loaded as float (the vectorised conversions of
// tensor/kernels/float_conversions.h), computed in float and rounded once when stored; sums
// accumulate in float or double. GEMM converts to float around the float32 GEMM
// (ReducedPrecisionGemmViaFloat, Note [Reduced precision GEMM]).
#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tensor/base/error.h"
#include "tensor/base/half.h"
#include "tensor/base/philox.h"
#include "tensor/cpu/internal/attention_kernels.h"
#include "tensor/cpu/internal/cpu_loops.h"
#include "tensor/cpu/internal/elementwise_kernels.h"
#include "tensor/cpu/internal/onednn_conv.h"
#include "tensor/cpu/internal/onednn_matmul.h"
#include "tensor/cpu/internal/reduce_kernels.h"
#include "tensor/kernels/float_conversions.h"
#include "tensor/kernels/internal/elementwise_math.h"
#include "tensor/kernels/internal/optimizer_math.h"
#include "tensor/kernels/internal/pooling_math.h"
#include "tensor/kernels/internal/strided_layout.h"
#include "tensor/kernels/vectorized.h"
#include "tensor/runtime/allocator.h"
#include "tensor/runtime/backend.h"
#include "tensor/runtime/devices.h"
#include "tensor/runtime/internal/caching_allocator.h"
#include "tensor/runtime/run_across_devices.h"
#include "tensor/runtime/threads.h"

namespace tandem {
namespace {

// 64-byte aligned host memory under each CPU device's CachingAllocator.
class HostMemory final : public SystemMemory {
 public:
  void* Allocate(size_t bytes, std::string* error) override {
    void* data = std::aligned_alloc(kHostAlignment, bytes);
    if (data == nullptr) *error = "aligned_alloc returned no memory";
    return data;
  }
  void Free(void* ptr) override { std::free(ptr); }
  const char* Name() const override { return "aligned_alloc"; }
};

// The shared loops and constants of tensor/cpu/internal/cpu_loops.h.
using cpu_internal::Cpu;
using cpu_internal::kElementwiseGrain;
using cpu_internal::kTranscendentalGrain;
using cpu_internal::Replaces;
using cpu_internal::Widen;

// Minimum floating-point operations per GEMM chunk (~30 us on one core).
constexpr double kGemmFlopsPerChunk = 1 << 20;

// ---- GEMM -------------------------------------------------------------------------------

// OpenBLAS rejects (with a message on stderr, computing nothing) a leading dimension below
// the row length even where it does not matter, e.g. for a single row or an empty matrix.
int64_t LeadingDimension(int64_t rows, int64_t cols, int64_t ld, const char* name) {
  if (rows <= 1) return std::max<int64_t>(ld, std::max<int64_t>(cols, 1));
  TANDEM_CHECK(ld >= std::max<int64_t>(cols, 1), "CPU Gemm: the row stride ", name, " = ", ld,
               " is smaller than the row length ", cols,
               "; BLAS needs rows that do not overlap: make the matrix contiguous first");
  return ld;
}

// BLAS's GEMM for T: the one kernel of this file that is specialised per dtype.
void CblasGemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha,
               const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
void CblasGemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, double alpha,
               const double* a, int lda, const double* b, int ldb, double beta, double* c,
               int ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

template <typename T>
void BlasGemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
              int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0 || alpha == T(0)) {
    // C = beta * C; BLAS semantics: beta == 0 overwrites (even NaN).
    for (int64_t i = 0; i < m; ++i) {
      T* row = c + i * ldc;
      if (beta == T(0)) {
        std::fill(row, row + n, T(0));
      } else if (beta != T(1)) {
        for (int64_t j = 0; j < n; ++j) row[j] *= beta;
      }
    }
    return;
  }
  CblasGemm(trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
            static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a,
            static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

// ---- Random numbers --------------------------------------------------------------------

// The largest T (a 16-bit float) below `high` (finite): the value `high` rounds to, stepped
// down one unit while it is not below.
template <typename T>
T LargestBelow(float high) {
  T value(high);
  while (static_cast<float>(value) >= high) {
    const float f = static_cast<float>(value);
    // One unit in the last place down: the bit pattern minus one for a positive value, plus
    // one for a negative one (and -0 or +0 steps to the smallest negative subnormal).
    if (f > 0.0f) {
      value = T::FromBits(static_cast<uint16_t>(value.bits - 1));
    } else if (f == 0.0f) {
      value = T::FromBits(0x8001);
    } else {
      value = T::FromBits(static_cast<uint16_t>(value.bits + 1));
    }
  }
  return value;
}

// Writes f(block, lane) for counters [offset + begin, offset + end), generating each Philox
// block once for its `kPerBlock` lanes. Element i depends only on offset + i.
template <int kPerBlock, typename T, typename F>
void PhiloxFill(T* dst, int64_t begin, int64_t end, uint64_t seed, uint64_t offset, F&& f) {
  int64_t i = begin;
  while (i < end) {
    const uint64_t counter = offset + static_cast<uint64_t>(i);
    const int lane = static_cast<int>(counter % kPerBlock);
    const philox::Block block = philox::Generate(seed, counter / kPerBlock);
    for (int l = lane; l < kPerBlock && i < end; ++l, ++i) dst[i] = static_cast<T>(f(block, l));
  }
}

// ---- The backend -------------------------------------------------------------------------

class CpuBackend final : public Backend {
 public:
  static Backend& Instance() {
    // Leaked on purpose: device workers may still run kernels while statics are destroyed.
    static CpuBackend* backend = new CpuBackend;
    return *backend;
  }

  DeviceType type() const override { return DeviceType::kCPU; }
  int DeviceCount() const override { return CpuDeviceCount(); }
  DeviceCapacity Capacity(int index) const override {
    // Logical CPU devices share host memory and each get the same share of the cores.
    static const int64_t host_bytes =
        static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
    return DeviceCapacity{host_bytes, CpuThreadsPerDevice()};
  }

  Allocator& GetAllocator(int index) override {
    CheckIndex(index);
    // Lock-free once the device's allocator exists (every tensor allocation asks).
    if (index < kMaxCpuDevices) {
      if (Allocator* existing = fast_allocators_[index].load(std::memory_order_acquire)) {
        return *existing;
      }
    }
    std::lock_guard<std::mutex> lock(allocators_mutex_);
    std::unique_ptr<Allocator>& allocator = allocators_[index];
    if (allocator == nullptr) {
      allocator = std::make_unique<CachingAllocator>(Cpu(index), std::make_unique<HostMemory>());
    }
    if (index < kMaxCpuDevices) {
      fast_allocators_[index].store(allocator.get(), std::memory_order_release);
    }
    return *allocator;
  }

  void Synchronize(int index) override { CheckIndex(index); }  // kernels are synchronous

  void CopyToHost(int index, void* dst, const void* src, size_t bytes) override {
    CopyBytes(index, dst, src, bytes);
  }
  void CopyFromHost(int index, void* dst, const void* src, size_t bytes) override {
    CopyBytes(index, dst, src, bytes);
  }
  void CopyBetweenDevices(int dst_index, void* dst, int src_index, const void* src,
                          size_t bytes) override {
    CheckIndex(src_index);
    CopyBytes(dst_index, dst, src, bytes);
  }

  // Elementwise kernels (tensor/cpu/elementwise_kernels.cc).
  void Copy(int index, const KernelTensor& dst, const KernelTensor& src) override {
    CheckIndex(index);
    cpu_internal::Copy(index, dst, src);
  }
  void Fill(int index, const KernelTensor& dst, double value) override {
    CheckIndex(index);
    cpu_internal::Fill(index, dst, value);
  }
  void Unary(int index, UnaryOp op, const KernelTensor& dst, const KernelTensor& src,
             double scalar) override {
    CheckIndex(index);
    cpu_internal::Unary(index, op, dst, src, scalar);
  }
  void Binary(int index, BinaryOp op, const KernelTensor& dst, const KernelTensor& a,
              const KernelTensor& b) override {
    CheckIndex(index);
    cpu_internal::Binary(index, op, dst, a, b);
  }
  // Reductions and softmax (tensor/cpu/reduce_kernels.cc).
  void Reduce(int index, ReduceKind op, const KernelTensor& dst, const KernelTensor& src,
              int64_t outer, int64_t reduce, int64_t inner) override {
    CheckIndex(index);
    cpu_internal::Reduce(index, op, dst, src, outer, reduce, inner);
  }
  void Softmax(int index, DType dtype, bool log, void* dst, const void* src, int64_t outer,
               int64_t dim, int64_t inner) override {
    CheckIndex(index);
    cpu_internal::Softmax(index, dtype, log, dst, src, outer, dim, inner);
  }
  void Gemm(int index, DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
            double alpha, const void* a, int64_t lda, int64_t stride_a, const void* b, int64_t ldb,
            int64_t stride_b, double beta, void* c, int64_t ldc, int64_t stride_c,
            int64_t batch) override;
  // oneDNN's bfloat16 matmul with a float32 destination; a float32 B is rounded block by
  // block into buffers of this device's allocator.
  bool GemmFloatOutput(int index, DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n,
                       int64_t k, const void* a, int64_t lda, DType b_dtype, const void* b,
                       int64_t ldb, float* c, int64_t ldc) override {
    CheckIndex(index);
    return OneDnnGemmFloatOutput(index, dtype, trans_a, trans_b, m, n, k, a, lda, b_dtype, b, ldb,
                                 c, ldc, GetAllocator(index));
  }
  void Im2Col(int index, DType dtype, const Conv2dGeometry& g, const void* image,
              void* columns) override;
  void Col2Im(int index, DType dtype, const Conv2dGeometry& g, const void* columns,
              void* image) override;
  // oneDNN's direct convolution for bfloat16 (and float32 where it measured faster than
  // im2col + GEMM: OneDnnConvPreferredForFloat32); false sends conv2d to im2col + GEMM.
  bool Conv2dForward(int index, DType dtype, const Conv2dGeometry& g, int64_t out_channels,
                     const void* input, const void* weight, const void* bias,
                     void* output) override {
    CheckIndex(index);
    return UseOneDnnConv(dtype, g, out_channels) &&
           OneDnnConv2dForward(index, dtype, g, out_channels, input, weight, bias, output);
  }
  bool Conv2dBackwardData(int index, DType dtype, const Conv2dGeometry& g, int64_t out_channels,
                          const void* grad_output, const void* weight, void* grad_input) override {
    CheckIndex(index);
    return UseOneDnnConv(dtype, g, out_channels) &&
           OneDnnConv2dBackwardData(index, dtype, g, out_channels, grad_output, weight, grad_input);
  }
  bool Conv2dBackwardWeights(int index, DType dtype, const Conv2dGeometry& g, int64_t out_channels,
                             const void* input, const void* grad_output, void* grad_weight,
                             void* grad_bias) override {
    CheckIndex(index);
    return UseOneDnnConv(dtype, g, out_channels) &&
           OneDnnConv2dBackwardWeights(index, dtype, g, out_channels, input, grad_output,
                                       grad_weight, grad_bias);
  }
  static bool UseOneDnnConv(DType dtype, const Conv2dGeometry& g, int64_t out_channels) {
    return dtype == DType::kBFloat16 ||
           (dtype == DType::kFloat32 && OneDnnConvPreferredForFloat32(g, out_channels));
  }
  void MaxPool2d(int index, DType dtype, const Conv2dGeometry& g, const void* input, void* output,
                 int64_t* argmax) override;
  void MaxPool2dBackward(int index, DType dtype, const Conv2dGeometry& g, const void* grad_output,
                         const int64_t* argmax, void* grad_input) override;
  void AvgPool2d(int index, DType dtype, const Conv2dGeometry& g, bool count_include_pad,
                 const void* input, void* output) override;
  void AvgPool2dBackward(int index, DType dtype, const Conv2dGeometry& g, bool count_include_pad,
                         const void* grad_output, void* grad_input) override;
  void AdaptiveAvgPool2d(int index, DType dtype, int64_t planes, int64_t height, int64_t width,
                         int64_t out_h, int64_t out_w, const void* input, void* output) override;
  void AdaptiveAvgPool2dBackward(int index, DType dtype, int64_t planes, int64_t height,
                                 int64_t width, int64_t out_h, int64_t out_w,
                                 const void* grad_output, void* grad_input) override;
  void GatherColumns(int index, DType dtype, void* dst, const void* src, const int64_t* idx,
                     int64_t rows, int64_t cols) override;
  void ScatterAddColumns(int index, DType dtype, void* dst, const void* src, const int64_t* idx,
                         int64_t rows, int64_t cols) override;
  void Gather(int index, DType dtype, void* dst, const void* src, const int64_t* idx, int64_t outer,
              int64_t src_dim, int64_t idx_dim, int64_t inner) override;
  void ScatterAdd(int index, DType dtype, void* dst, const void* src, const int64_t* idx,
                  int64_t outer, int64_t dst_dim, int64_t idx_dim, int64_t inner) override;
  void FusedOptimizerUpdate(int index, DType dtype,
                            const std::vector<FusedUpdate>& updates) override;
  void RandomUniform(int index, DType dtype, void* dst, int64_t n, uint64_t seed, uint64_t offset,
                     double low, double high) override;
  void RandomNormal(int index, DType dtype, void* dst, int64_t n, uint64_t seed, uint64_t offset,
                    double mean, double stddev) override;
  // Fused row norms and triangles (Note [Fused row norms]).
  void RowNorm(int index, DType dtype, bool rms, int64_t rows, int64_t cols, double eps,
               const void* x, const void* weight, const void* bias, void* y, void* mean,
               void* rstd) override;
  void RowNormBackward(int index, DType dtype, bool rms, int64_t rows, int64_t cols,
                       const void* grad_y, const void* x, const void* mean, const void* rstd,
                       const void* weight, void* grad_x, void* grad_weight,
                       void* grad_bias) override;
  void Triangle(int index, DType dtype, bool lower, int64_t diagonal, int64_t batch, int64_t rows,
                int64_t cols, const void* src, void* dst) override;

  // ---- Fused attention (tensor/cpu/internal/attention_kernels.h) -------------------------
  void AttentionForward(int index, DType dtype, const AttentionGeometry& g, const void* q,
                        const void* k, const void* v, const void* mask, void* out,
                        void* logsumexp) override {
    CheckIndex(index);
    CpuAttentionForward(index, dtype, g, q, k, v, mask, out, logsumexp);
  }
  void AttentionBackward(int index, DType dtype, const AttentionGeometry& g, const void* q,
                         const void* k, const void* v, const void* mask, const void* out,
                         const void* dout, const void* logsumexp, void* dq, void* dk,
                         void* dv) override {
    CheckIndex(index);
    CpuAttentionBackward(index, dtype, g, q, k, v, mask, out, dout, logsumexp, dq, dk, dv);
  }

 private:
  CpuBackend() {
    // Parallelism comes from our pools (see the top of this file).
    openblas_set_num_threads(1);
  }

  // Gemm for BFloat16/Half: see its definition.
  void ReducedPrecisionGemmViaFloat(int index, DType dtype, bool trans_a, bool trans_b, int64_t m,
                                    int64_t n, int64_t k, double alpha, const void* a, int64_t lda,
                                    int64_t stride_a, const void* b, int64_t ldb, int64_t stride_b,
                                    double beta, void* c, int64_t ldc, int64_t stride_c,
                                    int64_t batch);

  static void CheckIndex(int index) {
    TANDEM_CHECK(index >= 0, "CPU backend: device index must be >= 0 but got ", index);
  }

  static void CopyBytes(int index, void* dst, const void* src, size_t bytes) {
    CheckIndex(index);
    cpu_internal::CopyBytes(index, dst, src, bytes);
  }

  std::mutex allocators_mutex_;
  std::map<int, std::unique_ptr<Allocator>> allocators_;  // never erased
  std::atomic<Allocator*> fast_allocators_[kMaxCpuDevices] = {};
};

void CpuBackend::Gemm(int index, DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n,
                      int64_t k, double alpha_value, const void* a_data, int64_t lda,
                      int64_t stride_a, const void* b_data, int64_t ldb, int64_t stride_b,
                      double beta_value, void* c_data, int64_t ldc, int64_t stride_c,
                      int64_t batch) {
  CheckIndex(index);
  // oneDNN first for 16-bit floats, and for the float32 shapes where it measured faster than
  // OpenBLAS (tensor/cpu/internal/onednn_matmul.h); where it cannot (returns false) the paths
  // below compute the product or report what is wrong with it.
  if ((IsReducedFloatingPoint(dtype) ||
       (dtype == DType::kFloat32 && OneDnnPreferredForFloat32(trans_a, trans_b, m, n, k, batch))) &&
      OneDnnGemm(index, dtype, trans_a, trans_b, m, n, k, alpha_value, a_data, lda, stride_a,
                 b_data, ldb, stride_b, beta_value, c_data, ldc, stride_c, batch)) {
    return;
  }
  if (IsReducedFloatingPoint(dtype)) {
    return ReducedPrecisionGemmViaFloat(index, dtype, trans_a, trans_b, m, n, k, alpha_value,
                                        a_data, lda, stride_a, b_data, ldb, stride_b, beta_value,
                                        c_data, ldc, stride_c, batch);
  }
  DispatchFloatingTypes(dtype, "CPU Gemm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T alpha = static_cast<T>(alpha_value), beta = static_cast<T>(beta_value);
    const T* a = static_cast<const T*>(a_data);
    const T* b = static_cast<const T*>(b_data);
    T* c = static_cast<T*>(c_data);
    TANDEM_CHECK(m >= 0 && n >= 0 && k >= 0 && batch >= 0,
                 "CPU Gemm expects non-negative sizes "
                 "but got m=",
                 m, " n=", n, " k=", k, " batch=", batch);
    if (m == 0 || n == 0 || batch == 0) return;
    constexpr int64_t kIntMax = std::numeric_limits<int>::max();
    TANDEM_CHECK(m <= kIntMax && n <= kIntMax && k <= kIntMax, "CPU Gemm: m=", m, " n=", n,
                 " k=", k, " exceed BLAS's 32-bit sizes; split the product");
    TANDEM_CHECK(batch == 1 || stride_c != 0, "CPU Gemm: a batch of ", batch,
                 " products cannot write one C (stride_c = 0); give each product its own C");
    // op(A) is m x k: A is stored m x k, or k x m when transposed; likewise B.
    lda = LeadingDimension(trans_a ? k : m, trans_a ? m : k, lda, "lda");
    ldb = LeadingDimension(trans_b ? n : k, trans_b ? k : n, ldb, "ldb");
    ldc = LeadingDimension(m, n, ldc, "ldc");

    // Work items: each product's C cut along its longer side into `pieces` blocks of rows
    // (or columns), one single-threaded BLAS call per block. Whole products are enough when
    // the batch alone feeds every thread; otherwise products are cut so that the number of
    // items is a multiple of the thread count (even chunks), but blocks stay at least 16 wide
    // (OpenBLAS's register blocking) and worth kGemmFlopsPerChunk.
    constexpr int64_t kMinBlock = 16;
    const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) *
                         static_cast<double>(std::max<int64_t>(k, 1));
    const bool split_rows = m >= n;
    const int64_t extent = split_rows ? m : n;
    const int64_t threads = CpuThreadPool(index).num_threads();
    int64_t pieces = threads / std::gcd(batch, threads);
    pieces = std::min(pieces, std::max<int64_t>(1, extent / kMinBlock));
    pieces =
        std::min(pieces, std::max<int64_t>(1, static_cast<int64_t>(flops / kGemmFlopsPerChunk)));
    const double flops_per_item = flops / static_cast<double>(pieces);
    const int64_t grain =
        std::max<int64_t>(1, static_cast<int64_t>(kGemmFlopsPerChunk / flops_per_item));
    ParallelFor(Cpu(index), batch * pieces, grain, [&](int64_t begin, int64_t end) {
      for (int64_t item = begin; item < end; ++item) {
        const int64_t product = item / pieces, piece = item % pieces;
        const int64_t lo = extent * piece / pieces, hi = extent * (piece + 1) / pieces;
        const T* a_product = a + product * stride_a;
        const T* b_product = b + product * stride_b;
        T* c_product = c + product * stride_c;
        if (split_rows) {
          // Rows [lo, hi) of op(A): rows of A, or columns of A when transposed.
          const T* a_block = trans_a ? a_product + lo : a_product + lo * lda;
          BlasGemm(trans_a, trans_b, hi - lo, n, k, alpha, a_block, lda, b_product, ldb, beta,
                   c_product + lo * ldc, ldc);
        } else {
          // Columns [lo, hi) of op(B): columns of B, or rows of B when transposed.
          const T* b_block = trans_b ? b_product + lo * ldb : b_product + lo;
          BlasGemm(trans_a, trans_b, m, hi - lo, k, alpha, a_product, lda, b_block, ldb, beta,
                   c_product + lo, ldc);
        }
      }
    });
  });
}

// `count` matrices of rows x cols (row stride ld, `stride` apart) converted between T and a
// contiguous float array (`to_float`: T -> float, else float -> T, rounded), split over the
// device's threads by rows.
template <typename T>
void ConvertMatrices(int index, bool to_float, T* matrices, int64_t stride, int64_t ld,
                     int64_t count, int64_t rows, int64_t cols, float* floats) {
  if (count * rows * cols == 0) return;
  ParallelFor(Cpu(index), count * rows, std::max<int64_t>(1, kElementwiseGrain / cols),
              [&](int64_t begin, int64_t end) {
                vec::Vectorized([&] {
                  for (int64_t item = begin; item < end; ++item) {
                    T* row = matrices + (item / rows) * stride + (item % rows) * ld;
                    float* float_row = floats + item * cols;
                    if (to_float) {
                      vec::ToFloatLoop(row, float_row, cols);
                    } else {
                      vec::FromFloatLoop(float_row, row, cols);
                    }
                  }
                });
              });
}

// Note [Reduced precision GEMM]: a BFloat16/Half GEMM converts A and B to float (exact), runs
// the float32 GEMM (float accumulation; alpha and beta applied in float, to C converted to float
// when beta != 0) and rounds C once. It costs the conversions and scratch memory of three float
// matrices; a library with native 16-bit kernels (oneDNN) replaces it where it applies.
void CpuBackend::ReducedPrecisionGemmViaFloat(int index, DType dtype, bool trans_a, bool trans_b,
                                              int64_t m, int64_t n, int64_t k, double alpha,
                                              const void* a_data, int64_t lda, int64_t stride_a,
                                              const void* b_data, int64_t ldb, int64_t stride_b,
                                              double beta, void* c_data, int64_t ldc,
                                              int64_t stride_c, int64_t batch) {
  DispatchAllFloatingTypes(dtype, "CPU Gemm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (kIsReducedFloat<T>) {
      TANDEM_CHECK(m >= 0 && n >= 0 && k >= 0 && batch >= 0,
                   "CPU Gemm expects non-negative sizes but got m=", m, " n=", n, " k=", k,
                   " batch=", batch);
      if (m == 0 || n == 0 || batch == 0) return;
      TANDEM_CHECK(batch == 1 || stride_c != 0, "CPU Gemm: a batch of ", batch,
                   " products cannot write one C (stride_c = 0); give each product its own C");
      // Stored shapes: op(A) is m x k, so A is m x k or (transposed) k x m; likewise B.
      const int64_t rows_a = trans_a ? k : m, cols_a = trans_a ? m : k;
      const int64_t rows_b = trans_b ? n : k, cols_b = trans_b ? k : n;
      lda = LeadingDimension(rows_a, cols_a, lda, "lda");
      ldb = LeadingDimension(rows_b, cols_b, ldb, "ldb");
      ldc = LeadingDimension(m, n, ldc, "ldc");
      // A matrix shared by the whole batch (stride 0) is converted once.
      const int64_t count_a = stride_a == 0 ? 1 : batch, count_b = stride_b == 0 ? 1 : batch;
      std::vector<float> a(static_cast<size_t>(count_a * rows_a * cols_a));
      std::vector<float> b(static_cast<size_t>(count_b * rows_b * cols_b));
      std::vector<float> c(static_cast<size_t>(batch * m * n));
      T* a_typed = const_cast<T*>(static_cast<const T*>(a_data));  // only read
      T* b_typed = const_cast<T*>(static_cast<const T*>(b_data));
      T* c_typed = static_cast<T*>(c_data);
      ConvertMatrices(index, true, a_typed, stride_a, lda, count_a, rows_a, cols_a, a.data());
      ConvertMatrices(index, true, b_typed, stride_b, ldb, count_b, rows_b, cols_b, b.data());
      if (beta != 0.0) ConvertMatrices(index, true, c_typed, stride_c, ldc, batch, m, n, c.data());
      Gemm(index, kFloat32, trans_a, trans_b, m, n, k, alpha, a.data(),
           std::max<int64_t>(cols_a, 1), count_a == 1 ? 0 : rows_a * cols_a, b.data(),
           std::max<int64_t>(cols_b, 1), count_b == 1 ? 0 : rows_b * cols_b, beta, c.data(), n,
           m * n, batch);
      ConvertMatrices(index, false, c_typed, stride_c, ldc, batch, m, n, c.data());
    }
  });
}

void CheckGeometry(const Conv2dGeometry& g, const char* kernel) {
  TANDEM_CHECK(g.batch >= 0 && g.channels >= 0 && g.height >= 0 && g.width >= 0, "CPU ", kernel,
               " expects non-negative image sizes but got batch=", g.batch,
               " channels=", g.channels, " height=", g.height, " width=", g.width);
  TANDEM_CHECK(g.kernel_h > 0 && g.kernel_w > 0 && g.stride_h > 0 && g.stride_w > 0 &&
                   g.pad_h >= 0 && g.pad_w >= 0 && g.dilation_h > 0 && g.dilation_w > 0,
               "CPU ", kernel,
               " expects a positive kernel, stride and dilation and non-negative padding "
               "but got kernel ",
               g.kernel_h, "x", g.kernel_w, ", stride ", g.stride_h, "x", g.stride_w, ", padding ",
               g.pad_h, "x", g.pad_w, ", dilation ", g.dilation_h, "x", g.dilation_w);
  TANDEM_CHECK(g.height + 2 * g.pad_h >= g.span_h() && g.width + 2 * g.pad_w >= g.span_w(), "CPU ",
               kernel, ": the ", g.span_h(), "x", g.span_w(),
               " window (with dilation) is larger than the padded ", g.height + 2 * g.pad_h, "x",
               g.width + 2 * g.pad_w, " image; use a smaller kernel or more padding");
}

// The outputs o in [0, count) whose input position o * stride + shift lies in [0, size), as
// [lo, hi) (empty: lo == hi).
std::pair<int64_t, int64_t> InsideRange(int64_t shift, int64_t stride, int64_t size,
                                        int64_t count) {
  // o * stride + shift >= 0  <=>  o >= ceil(-shift / stride); < size  <=>  o < ceil((size -
  // shift) / stride).
  const auto ceil_div = [](int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -(-a / b); };
  const int64_t lo = std::clamp<int64_t>(ceil_div(-shift, stride), 0, count);
  const int64_t hi = std::clamp<int64_t>(ceil_div(size - shift, stride), lo, count);
  return {lo, hi};
}

// out[i] = src[i] for i in [lo, hi), 0 elsewhere in [0, n), reading src[i] for every i (so all
// of [src, src + n) must be readable). One loop with a select rather than a fill, a copy and a
// fill: those become calls to memset and memmove, most of a short row's time.
template <typename T>
TANDEM_VECTORIZE inline void CopyInside(const T* __restrict src, int32_t lo, int32_t hi, int32_t n,
                                        T* __restrict out) {
  for (int32_t i = 0; i < n; ++i) {
    const T v = src[i];
    out[i] = i >= lo && i < hi ? v : T(0);
  }
}

void CpuBackend::Im2Col(int index, DType dtype, const Conv2dGeometry& g, const void* image_data,
                        void* columns_data) {
  CheckIndex(index);
  DispatchAllFloatingTypes(dtype, "CPU Im2Col", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* image = static_cast<const T*>(image_data);
    T* columns = static_cast<T*>(columns_data);
    CheckGeometry(g, "Im2Col");
    const int64_t out_h = g.out_h(), out_w = g.out_w();
    const int64_t plane = g.height * g.width, out_plane = out_h * out_w;
    const int64_t window = g.kernel_h * g.kernel_w;
    // One column row per (image, channel, kernel_row, kernel_col).
    const int64_t rows = g.batch * g.channels * window;
    if (rows == 0 || out_plane == 0) return;
    const int64_t image_size = g.batch * g.channels * plane;
    ParallelFor(Cpu(index), rows, std::max<int64_t>(1, kElementwiseGrain / out_plane),
                [&](int64_t begin, int64_t end) {
                  vec::Vectorized([&] {
                    for (int64_t row = begin; row < end; ++row) {
                      const int64_t kx = row % g.kernel_w;
                      const int64_t ky = (row / g.kernel_w) % g.kernel_h;
                      const int64_t image_channel = row / window;  // b * channels + c
                      const T* in = image + image_channel * plane;
                      T* out = columns +
                               g.columns_start(image_channel / g.channels,
                                               image_channel % g.channels, out_plane) +
                               (row % window) * g.columns_tap_stride(out_plane);
                      // x = ox * stride - pad + kx * dilation lies inside for ox in [lo, hi).
                      const int64_t shift = kx * g.dilation_w - g.pad_w;
                      const auto [lo, hi] = InsideRange(shift, g.stride_w, g.width, out_w);
                      for (int64_t oy = 0; oy < out_h; ++oy) {
                        const int64_t y = oy * g.stride_h - g.pad_h + ky * g.dilation_h;
                        T* out_row = out + oy * out_w;
                        if (y < 0 || y >= g.height) {
                          std::fill(out_row, out_row + out_w, T(0));
                          continue;
                        }
                        const T* in_row = in + y * g.width;
                        // The padding's reads land in the neighbouring pixels, or outside the image
                        // at its first and last rows (those take the loop below).
                        const int64_t start = image_channel * plane + y * g.width + shift;
                        if (g.stride_w == 1 && start >= 0 && start + out_w <= image_size &&
                            out_w <= std::numeric_limits<int32_t>::max()) {
                          CopyInside(in_row + shift, static_cast<int32_t>(lo),
                                     static_cast<int32_t>(hi), static_cast<int32_t>(out_w),
                                     out_row);
                          continue;
                        }
                        std::fill(out_row, out_row + lo, T(0));
                        if (g.stride_w == 1) {
                          std::copy(in_row + lo + shift, in_row + hi + shift, out_row + lo);
                        } else {
                          for (int64_t ox = lo; ox < hi; ++ox)
                            out_row[ox] = in_row[ox * g.stride_w + shift];
                        }
                        std::fill(out_row + hi, out_row + out_w, T(0));
                      }
                    }
                  });
                });
  });
}

// out[i * stride] += in[i] for i < n.
template <typename Acc, typename T>
TANDEM_VECTORIZE inline void AddIntoStrided(Acc* __restrict out, int64_t stride,
                                            const T* __restrict in, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i * stride] += static_cast<Acc>(in[i]);
}

// out[i] += in[i] for i < n, into an accumulator of the same type or, for the 16-bit floats,
// into float.
template <typename Acc, typename T>
inline void AddIntoAccumulator(Acc* __restrict out, const T* __restrict in, int64_t n) {
  if constexpr (std::is_same_v<Acc, T>) {
    vec::AddIntoLoop(out, in, n);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] += vec::conversions_internal::ToFloatElement(in[i]);
  }
}

void CpuBackend::Col2Im(int index, DType dtype, const Conv2dGeometry& g, const void* columns_data,
                        void* image_data) {
  CheckIndex(index);
  DispatchAllFloatingTypes(dtype, "CPU Col2Im", [&](auto tag) {
    using T = typename decltype(tag)::type;
    // The 16-bit floats sum each plane in a float buffer and round it once.
    using Acc = OpMath<T>;
    constexpr bool kScratch = !std::is_same_v<Acc, T>;
    const T* columns = static_cast<const T*>(columns_data);
    T* image = static_cast<T*>(image_data);
    CheckGeometry(g, "Col2Im");
    const int64_t out_h = g.out_h(), out_w = g.out_w();
    const int64_t plane = g.height * g.width, out_plane = out_h * out_w;
    const int64_t window = g.kernel_h * g.kernel_w;
    const int64_t planes = g.batch * g.channels;
    if (planes == 0 || plane == 0) return;
    // One image plane per task: the column rows that sum into it belong to it alone. Each pixel
    // sums its taps in the same order whatever the vector unit (Vectorized: the rows' adds are
    // lanes of one vector, not a reordered sum).
    ParallelFor(Cpu(index), planes,
                std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(1, window * out_plane)),
                [&](int64_t begin, int64_t end) {
                  std::vector<Acc> scratch(kScratch ? plane : 0);
                  vec::Vectorized([&] {
                    for (int64_t p = begin; p < end; ++p) {
                      Acc* out;
                      if constexpr (kScratch) {
                        out = scratch.data();
                      } else {
                        out = image + p * plane;
                      }
                      std::fill(out, out + plane, Acc(0));
                      for (int64_t w = 0; w < window; ++w) {
                        const int64_t ky = w / g.kernel_w, kx = w % g.kernel_w;
                        const T* in = columns +
                                      g.columns_start(p / g.channels, p % g.channels, out_plane) +
                                      w * g.columns_tap_stride(out_plane);
                        const int64_t shift = kx * g.dilation_w - g.pad_w;
                        const auto [lo, hi] = InsideRange(shift, g.stride_w, g.width, out_w);
                        for (int64_t oy = 0; oy < out_h; ++oy) {
                          const int64_t y = oy * g.stride_h - g.pad_h + ky * g.dilation_h;
                          if (y < 0 || y >= g.height) continue;
                          Acc* out_row = out + y * g.width;
                          const T* in_row = in + oy * out_w;
                          if (g.stride_w == 1) {
                            AddIntoAccumulator(out_row + shift + lo, in_row + lo, hi - lo);
                          } else {
                            AddIntoStrided(out_row + lo * g.stride_w + shift, g.stride_w,
                                           in_row + lo, hi - lo);
                          }
                        }
                      }
                      if constexpr (kScratch) vec::FromFloatLoop(out, image + p * plane, plane);
                    }
                  });
                });
  });
}

// Replaces<true>(v, best): NaN wins, ties keep the earlier (the rule of every max-pooling
// loop here, scalar or in vector lanes).
inline bool Takes(float v, float best) { return (v > best) | ((v != v) & (best == best)); }

// Takes(v, *best) applied without branches: a comparison
// on random data mispredicts half the time, and GCC keeps a branch for a float select, so
// the select is done on the bits.
inline void TakeIfGreater(float v, int64_t at, float* best, int64_t* best_at) {
  const float b = *best;
  const int take = static_cast<int>(Takes(v, b));
  const uint32_t mask = 0u - static_cast<uint32_t>(take);
  uint32_t v_bits, b_bits;
  std::memcpy(&v_bits, &v, sizeof(v));
  std::memcpy(&b_bits, &b, sizeof(b));
  b_bits = (v_bits & mask) | (b_bits & ~mask);
  std::memcpy(best, &b_bits, sizeof(b_bits));
  *best_at += (at - *best_at) & -static_cast<int64_t>(take);
}

// Max pooling of the outputs [0, n) of one output row whose windows lie inside the image
// horizontally: output i's window starts at `first + i * s` and spans `rows` rows of `width`
// and kernel_w columns. Tap by tap across the row, each tap in the same scan order as
// TakeIfGreater's per output, so that the outputs are independent lanes and GCC vectorises
// the loops (Vectorized). The argmax is kept in 32 bits, the lanes of the float comparison:
// with 64-bit lanes the vector loop cost so much more that GCC ran short rows scalar.
// kStride > 0 fixes s at compile time (whole vector loads and shuffles instead of element by
// element).
template <int64_t kStride>
TANDEM_VECTORIZE inline void MaxPoolTaps(const float* __restrict in, int32_t width, int32_t rows,
                                         int32_t kernel_w, int32_t first, int32_t stride, int64_t n,
                                         float* __restrict best, int32_t* __restrict best_at) {
  const int32_t s = kStride > 0 ? kStride : stride;
  for (int64_t i = 0; i < n; ++i) {
    best_at[i] = first + static_cast<int32_t>(i) * s;
    best[i] = in[first + i * s];
  }
  for (int32_t y = 0; y < rows; ++y) {
    for (int32_t kx = y == 0 ? 1 : 0; kx < kernel_w; ++kx) {
      const int32_t tap = first + y * width + kx;
      for (int64_t i = 0; i < n; ++i) {
        const int32_t at = tap + static_cast<int32_t>(i) * s;
        const float v = in[tap + i * s], b = best[i];
        const bool take = Takes(v, b);
        best[i] = take ? v : b;
        best_at[i] = take ? at : best_at[i];
      }
    }
  }
}

// MaxPoolTaps for 2-wide windows 2 apart (2x2 pooling), one window row at a time: the pairs'
// maxima first, both taps in one pass, so that the vector loop loads every float of its span
// (a stride-2 load of one tap alone leaves a gap that makes GCC keep the last output out of
// the vector loop, and so run half of a 7- or 14-output row scalar); then each later row's
// into the running maxima, which hold the earlier taps and so win ties.
TANDEM_VECTORIZE inline void MaxPoolPairs(const float* __restrict in, int32_t first, int64_t n,
                                          float* __restrict best, int32_t* __restrict best_at) {
  for (int64_t i = 0; i < n; ++i) {
    const int32_t at = first + 2 * static_cast<int32_t>(i);
    const float v0 = in[first + 2 * i], v1 = in[first + 2 * i + 1];
    const bool take = Takes(v1, v0);
    best[i] = take ? v1 : v0;
    best_at[i] = take ? at + 1 : at;
  }
}

TANDEM_VECTORIZE inline void MaxPoolMerge(const float* __restrict row_best,
                                          const int32_t* __restrict row_at, int64_t n,
                                          float* __restrict best, int32_t* __restrict best_at) {
  for (int64_t i = 0; i < n; ++i) {
    const bool take = Takes(row_best[i], best[i]);
    best[i] = take ? row_best[i] : best[i];
    best_at[i] = take ? row_at[i] : best_at[i];
  }
}

TANDEM_VECTORIZE inline void Widen(const int32_t* __restrict in, int64_t n,
                                   int64_t* __restrict out) {
  for (int64_t i = 0; i < n; ++i) out[i] = in[i];
}

// Calls f(plane, y, x) for every element of `planes` height x width planes, a few planes per
// task of the device's pool.
template <typename F>
void ForEachPixel(int index, int64_t planes, int64_t height, int64_t width, int64_t cost, F&& f) {
  const int64_t plane = height * width;
  if (planes == 0 || plane == 0) return;
  ParallelFor(Cpu(index), planes,
              std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(1, plane * cost)),
              [&](int64_t begin, int64_t end) {
                for (int64_t p = begin; p < end; ++p) {
                  for (int64_t y = 0; y < height; ++y) {
                    for (int64_t x = 0; x < width; ++x) f(p, y, x);
                  }
                }
              });
}

// Max pooling in any floating type, one window at a time in the vectorised float32 loop's scan
// order (so the same argmax): the float64 path, where speed matters less than in float32.
template <typename T>
void MaxPool2dScalar(int index, const Conv2dGeometry& g, const T* input, T* output,
                     int64_t* argmax) {
  const int64_t out_h = g.out_h(), out_w = g.out_w();
  const int64_t plane = g.height * g.width, out_plane = out_h * out_w;
  ForEachPixel(index, g.batch * g.channels, out_h, out_w, g.kernel_h * g.kernel_w,
               [&](int64_t p, int64_t oy, int64_t ox) {
                 const T* in = input + p * plane;
                 const int64_t y0 = std::max<int64_t>(oy * g.stride_h - g.pad_h, 0);
                 const int64_t y1 = std::min(oy * g.stride_h - g.pad_h + g.kernel_h, g.height);
                 const int64_t x0 = std::max<int64_t>(ox * g.stride_w - g.pad_w, 0);
                 const int64_t x1 = std::min(ox * g.stride_w - g.pad_w + g.kernel_w, g.width);
                 int64_t best_at = y0 * g.width + x0;
                 T best = in[best_at];
                 for (int64_t y = y0; y < y1; ++y) {
                   for (int64_t x = x0; x < x1; ++x) {
                     if (Replaces<true>(in[y * g.width + x], best)) {
                       best = in[y * g.width + x];
                       best_at = y * g.width + x;
                     }
                   }
                 }
                 output[p * out_plane + oy * out_w + ox] = best;
                 argmax[p * out_plane + oy * out_w + ox] = best_at;
               });
}

// Max pooling in bfloat16: a selection, so each plane is converted to float once (exact), the
// windows are compared there with the float32 loop's rule and scan order (so the same argmax),
// and the winners are converted back (exact again: they are bfloat16 values).
void MaxPool2dBFloat16(int index, const Conv2dGeometry& g, const BFloat16* input, BFloat16* output,
                       int64_t* argmax) {
  const int64_t out_h = g.out_h(), out_w = g.out_w();
  const int64_t plane = g.height * g.width, out_plane = out_h * out_w;
  // The common 2x2 window with stride 2 and no padding, on rows of even width: the pairs of
  // every row are contiguous over the whole plane, so one long vectorised pass takes each
  // pair's maximum (pooling rows are short, 14 and 7 outputs in a small CNN, and a vector
  // loop over one row would run mostly in its scalar tail); then each output row merges its
  // two rows of pair maxima, selecting on the bits (no branch to mispredict).
  const bool pairs = g.kernel_h == 2 && g.kernel_w == 2 && g.stride_h == 2 && g.stride_w == 2 &&
                     g.pad_h == 0 && g.pad_w == 0 && g.width % 2 == 0 &&
                     plane <= std::numeric_limits<int32_t>::max();
  const auto pool = [&](int64_t begin, int64_t end) {
    std::vector<float> image(plane), pair_best(pairs ? plane / 2 : 0), best(out_plane);
    std::vector<int32_t> pair_at(pairs ? plane / 2 : 0), at(out_plane);
    vec::Vectorized([&] {
      for (int64_t p = begin; p < end; ++p) {
        const float* in = image.data();
        vec::ToFloatLoop(input + p * plane, image.data(), plane);
        BFloat16* out = output + p * out_plane;
        int64_t* out_at = argmax + p * out_plane;
        if (pairs) {
          MaxPoolPairs(in, 0, plane / 2, pair_best.data(), pair_at.data());
          for (int64_t oy = 0; oy < out_h; ++oy) {
            // Rows 2 oy and 2 oy + 1 of pair maxima, out_w = width / 2 each.
            const float* upper = pair_best.data() + 2 * oy * out_w;
            const int32_t* upper_at = pair_at.data() + 2 * oy * out_w;
            for (int64_t ox = 0; ox < out_w; ++ox) {
              const float u = upper[ox], l = upper[ox + out_w];
              const uint32_t mask = 0u - static_cast<uint32_t>(Takes(l, u));
              uint32_t u_bits, l_bits;
              std::memcpy(&u_bits, &u, sizeof(u));
              std::memcpy(&l_bits, &l, sizeof(l));
              const uint32_t bits = (l_bits & mask) | (u_bits & ~mask);
              std::memcpy(&best[oy * out_w + ox], &bits, sizeof(bits));
              at[oy * out_w + ox] =
                  static_cast<int32_t>((static_cast<uint32_t>(upper_at[ox + out_w]) & mask) |
                                       (static_cast<uint32_t>(upper_at[ox]) & ~mask));
            }
          }
          Widen(at.data(), out_plane, out_at);
          vec::FromFloatLoop(best.data(), out, out_plane);
          continue;
        }
        for (int64_t oy = 0; oy < out_h; ++oy) {
          const int64_t y0 = std::max<int64_t>(oy * g.stride_h - g.pad_h, 0);
          const int64_t y1 = std::min(oy * g.stride_h - g.pad_h + g.kernel_h, g.height);
          for (int64_t ox = 0; ox < out_w; ++ox) {
            const int64_t x0 = std::max<int64_t>(ox * g.stride_w - g.pad_w, 0);
            const int64_t x1 = std::min(ox * g.stride_w - g.pad_w + g.kernel_w, g.width);
            int64_t best_at = y0 * g.width + x0;
            float value = in[best_at];
            for (int64_t y = y0; y < y1; ++y) {
              for (int64_t x = x0; x < x1; ++x) {
                TakeIfGreater(in[y * g.width + x], y * g.width + x, &value, &best_at);
              }
            }
            out[oy * out_w + ox] = input[p * plane + best_at];
            out_at[oy * out_w + ox] = best_at;
          }
        }
      }
    });
  };
  ParallelFor(Cpu(index), g.batch * g.channels,
              std::max<int64_t>(
                  1, kElementwiseGrain / std::max<int64_t>(1, out_plane * g.kernel_h * g.kernel_w)),
              pool);
}

void CpuBackend::MaxPool2d(int index, DType dtype, const Conv2dGeometry& g, const void* input_data,
                           void* output_data, int64_t* argmax) {
  CheckIndex(index);
  CheckGeometry(g, "MaxPool2d");
  TANDEM_CHECK(g.pad_h * 2 <= g.kernel_h && g.pad_w * 2 <= g.kernel_w, "CPU MaxPool2d: padding ",
               g.pad_h, "x", g.pad_w, " must be at most half the kernel ", g.kernel_h, "x",
               g.kernel_w, " (as in PyTorch), so that every window covers part of the image");
  const int64_t out_h = g.out_h(), out_w = g.out_w();
  const int64_t plane = g.height * g.width, out_plane = out_h * out_w;
  const int64_t planes = g.batch * g.channels;
  if (planes == 0 || out_plane == 0) return;
  TANDEM_CHECK(plane > 0, "CPU MaxPool2d: cannot pool ", g.height, "x", g.width,
               " images: every window would lie in the padding; give images at least one pixel");
  // Outputs whose window lies inside horizontally, [lo, hi), take the vectorised row loop.
  const int64_t lo = std::min(out_w, (g.pad_w + g.stride_w - 1) / g.stride_w);
  const int64_t room = g.width + g.pad_w - g.kernel_w;
  int64_t hi = room < 0 ? lo : std::clamp(room / g.stride_w + 1, lo, out_w);
  // The vectorised loop counts in 32 bits; larger planes take pool_one everywhere.
  if (plane > std::numeric_limits<int32_t>::max()) hi = lo;
  if (dtype == kBFloat16) {
    return MaxPool2dBFloat16(index, g, static_cast<const BFloat16*>(input_data),
                             static_cast<BFloat16*>(output_data), argmax);
  }
  if (dtype != kFloat32) {
    return DispatchAllFloatingTypes(dtype, "CPU MaxPool2d", [&](auto tag) {
      using T = typename decltype(tag)::type;
      MaxPool2dScalar(index, g, static_cast<const T*>(input_data), static_cast<T*>(output_data),
                      argmax);
    });
  }
  const float* input = static_cast<const float*>(input_data);
  float* output = static_cast<float*>(output_data);
  ParallelFor(
      Cpu(index), planes,
      std::max<int64_t>(
          1, kElementwiseGrain / std::max<int64_t>(1, out_plane * g.kernel_h * g.kernel_w)),
      [&](int64_t begin, int64_t end) {
        vec::Vectorized([&] {
          for (int64_t p = begin; p < end; ++p) {
            const float* in = input + p * plane;
            for (int64_t oy = 0; oy < out_h; ++oy) {
              const int64_t y0 = std::max<int64_t>(oy * g.stride_h - g.pad_h, 0);
              const int64_t y1 = std::min(oy * g.stride_h - g.pad_h + g.kernel_h, g.height);
              float* best = output + p * out_plane + oy * out_w;
              int64_t* best_at = argmax + p * out_plane + oy * out_w;
              // One output: its window's part inside the image, scanned row by row
              // (never empty: pad <= kernel / 2; padding is -inf).
              const auto pool_one = [&](int64_t ox) {
                const int64_t x0 = std::max<int64_t>(ox * g.stride_w - g.pad_w, 0);
                const int64_t x1 = std::min(ox * g.stride_w - g.pad_w + g.kernel_w, g.width);
                best_at[ox] = y0 * g.width + x0;
                best[ox] = in[best_at[ox]];
                for (int64_t y = y0; y < y1; ++y) {
                  for (int64_t x = x0; x < x1; ++x) {
                    TakeIfGreater(in[y * g.width + x], y * g.width + x, &best[ox], &best_at[ox]);
                  }
                }
              };
              for (int64_t ox = 0; ox < lo; ++ox) pool_one(ox);
              // Pooling rows are short (14 and 7 outputs in a small CNN), so the vector loop
              // would spend most of its time in its scalar tail: it runs to a whole number of
              // vectors instead where the extra windows still lie in the input and their
              // outputs in this task's part of the output, which pool_one below and the next
              // rows overwrite.
              const int64_t first = y0 * g.width - g.pad_w + lo * g.stride_w;
              constexpr int64_t kLanes = 8;  // floats in an AVX2 vector
              int64_t n = (hi - lo + kLanes - 1) / kLanes * kLanes;
              const int64_t last_read =
                  first + (n - 1) * g.stride_w + (y1 - y0 - 1) * g.width + g.kernel_w - 1;
              if (last_read >= (planes - p) * plane ||
                  n > (end - p) * out_plane - oy * out_w - lo) {
                n = hi - lo;
              }
              const auto inside = [&](auto stride) {
                constexpr int64_t kChunk = 256;  // outputs, a multiple of kLanes
                int32_t chunk_at[kChunk], row_at[kChunk];
                float row_best[kChunk];
                for (int64_t c = 0; c < n; c += kChunk) {
                  const int64_t m = std::min(kChunk, n - c);
                  if (decltype(stride)::value == 2 && g.kernel_w == 2) {
                    const int32_t row_first = static_cast<int32_t>(first + c * 2);
                    MaxPoolPairs(in, row_first, m, best + lo + c, chunk_at);
                    for (int64_t y = 1; y < y1 - y0; ++y) {
                      MaxPoolPairs(in, static_cast<int32_t>(row_first + y * g.width), m, row_best,
                                   row_at);
                      MaxPoolMerge(row_best, row_at, m, best + lo + c, chunk_at);
                    }
                  } else {
                    MaxPoolTaps<decltype(stride)::value>(in, g.width, y1 - y0, g.kernel_w,
                                                         first + c * g.stride_w, g.stride_w, m,
                                                         best + lo + c, chunk_at);
                  }
                  Widen(chunk_at, m, best_at + lo + c);
                }
              };
              if (g.stride_w == 1) {
                inside(std::integral_constant<int64_t, 1>());
              } else if (g.stride_w == 2) {
                inside(std::integral_constant<int64_t, 2>());
              } else {
                inside(std::integral_constant<int64_t, 0>());
              }
              for (int64_t ox = hi; ox < out_w; ++ox) pool_one(ox);
            }
          }
        });
      });
}

void CpuBackend::MaxPool2dBackward(int index, DType dtype, const Conv2dGeometry& g,
                                   const void* grad_output_data, const int64_t* argmax,
                                   void* grad_input_data) {
  CheckIndex(index);
  DispatchAllFloatingTypes(dtype, "CPU MaxPool2dBackward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* grad_output = static_cast<const T*>(grad_output_data);
    T* grad_input = static_cast<T*>(grad_input_data);
    CheckGeometry(g, "MaxPool2dBackward");
    const int64_t plane = g.height * g.width, out_plane = g.out_h() * g.out_w();
    const int64_t planes = g.batch * g.channels;
    if (planes == 0 || plane == 0) return;
    // One plane per task: an output's argmax lies in its own plane, so tasks never collide.
    ParallelFor(Cpu(index), planes,
                std::max<int64_t>(1, kElementwiseGrain / std::max(plane, out_plane)),
                [&](int64_t begin, int64_t end) {
                  // The 16-bit floats sum overlapping windows' gradients in float.
                  using Acc = OpMath<T>;
                  constexpr bool kScratch = !std::is_same_v<Acc, T>;
                  std::vector<Acc> scratch(kScratch ? plane : 0);
                  for (int64_t p = begin; p < end; ++p) {
                    Acc* out;
                    if constexpr (kScratch) {
                      out = scratch.data();
                    } else {
                      out = grad_input + p * plane;
                    }
                    std::fill(out, out + plane, Acc(0));
                    const T* grad = grad_output + p * out_plane;
                    const int64_t* at = argmax + p * out_plane;
                    for (int64_t o = 0; o < out_plane; ++o) out[at[o]] += static_cast<Acc>(grad[o]);
                    if constexpr (kScratch) {
                      vec::FromFloat(out, grad_input + p * plane, plane);
                    }
                  }
                });
  });
}

void CpuBackend::AvgPool2d(int index, DType dtype, const Conv2dGeometry& g, bool count_include_pad,
                           const void* input_data, void* output_data) {
  CheckIndex(index);
  DispatchAllFloatingTypes(dtype, "CPU AvgPool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* input = static_cast<const T*>(input_data);
    T* output = static_cast<T*>(output_data);
    CheckGeometry(g, "AvgPool2d");
    const int64_t out_h = g.out_h(), out_w = g.out_w(), plane = g.height * g.width;
    ForEachPixel(index, g.batch * g.channels, out_h, out_w, g.kernel_h * g.kernel_w,
                 [&](int64_t p, int64_t oy, int64_t ox) {
                   output[(p * out_h + oy) * out_w + ox] =
                       AvgPoolOutput(g, count_include_pad, input + p * plane, oy, ox);
                 });
  });
}

void CpuBackend::AvgPool2dBackward(int index, DType dtype, const Conv2dGeometry& g,
                                   bool count_include_pad, const void* grad_output_data,
                                   void* grad_input_data) {
  CheckIndex(index);
  DispatchAllFloatingTypes(dtype, "CPU AvgPool2dBackward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* grad_output = static_cast<const T*>(grad_output_data);
    T* grad_input = static_cast<T*>(grad_input_data);
    CheckGeometry(g, "AvgPool2dBackward");
    const int64_t out_h = g.out_h(), out_w = g.out_w(), out_plane = out_h * out_w;
    const int64_t cost = (g.kernel_h / g.stride_h + 1) * (g.kernel_w / g.stride_w + 1);
    ForEachPixel(index, g.batch * g.channels, g.height, g.width, cost,
                 [&](int64_t p, int64_t y, int64_t x) {
                   grad_input[(p * g.height + y) * g.width + x] = AvgPoolInputGrad(
                       g, count_include_pad, out_h, out_w, grad_output + p * out_plane, y, x);
                 });
  });
}

void CpuBackend::AdaptiveAvgPool2d(int index, DType dtype, int64_t planes, int64_t height,
                                   int64_t width, int64_t out_h, int64_t out_w,
                                   const void* input_data, void* output_data) {
  CheckIndex(index);
  DispatchAllFloatingTypes(dtype, "CPU AdaptiveAvgPool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* input = static_cast<const T*>(input_data);
    T* output = static_cast<T*>(output_data);
    const int64_t cost =
        (height / std::max<int64_t>(out_h, 1) + 1) * (width / std::max<int64_t>(out_w, 1) + 1);
    ForEachPixel(index, planes, out_h, out_w, cost, [&](int64_t p, int64_t oy, int64_t ox) {
      output[(p * out_h + oy) * out_w + ox] =
          AdaptiveAvgPoolOutput(height, width, out_h, out_w, input + p * height * width, oy, ox);
    });
  });
}

void CpuBackend::AdaptiveAvgPool2dBackward(int index, DType dtype, int64_t planes, int64_t height,
                                           int64_t width, int64_t out_h, int64_t out_w,
                                           const void* grad_output_data, void* grad_input_data) {
  CheckIndex(index);
  DispatchAllFloatingTypes(dtype, "CPU AdaptiveAvgPool2dBackward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* grad_output = static_cast<const T*>(grad_output_data);
    T* grad_input = static_cast<T*>(grad_input_data);
    ForEachPixel(index, planes, height, width, out_h + out_w, [&](int64_t p, int64_t y, int64_t x) {
      grad_input[(p * height + y) * width + x] = AdaptiveAvgPoolInputGrad(
          height, width, out_h, out_w, grad_output + p * out_h * out_w, y, x);
    });
  });
}

void CpuBackend::GatherColumns(int index, DType dtype, void* dst_data, const void* src_data,
                               const int64_t* idx, int64_t rows, int64_t cols) {
  CheckIndex(index);
  DispatchAllFloatingTypes(dtype, "CPU GatherColumns", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* dst = static_cast<T*>(dst_data);
    const T* src = static_cast<const T*>(src_data);
    if (rows <= 0) return;
    ParallelFor(Cpu(index), rows, kElementwiseGrain, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) dst[r] = src[r * cols + idx[r]];
    });
  });
}

void CpuBackend::ScatterAddColumns(int index, DType dtype, void* dst_data, const void* src_data,
                                   const int64_t* idx, int64_t rows, int64_t cols) {
  CheckIndex(index);
  DispatchAllFloatingTypes(dtype, "CPU ScatterAddColumns", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* dst = static_cast<T*>(dst_data);
    const T* src = static_cast<const T*>(src_data);
    if (rows <= 0) return;
    // Row r touches only row r of dst: no two tasks write the same element.
    ParallelFor(Cpu(index), rows, kElementwiseGrain, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) dst[r * cols + idx[r]] += src[r];
    });
  });
}

void CpuBackend::Gather(int index, DType dtype, void* dst_data, const void* src_data,
                        const int64_t* idx, int64_t outer, int64_t src_dim, int64_t idx_dim,
                        int64_t inner) {
  CheckIndex(index);
  DispatchAllFloatingTypes(dtype, "CPU Gather", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* dst = static_cast<T*>(dst_data);
    const T* src = static_cast<const T*>(src_data);
    const int64_t n = outer * idx_dim * inner;
    if (n <= 0) return;
    ParallelFor(Cpu(index), n, kElementwiseGrain, [&](int64_t begin, int64_t end) {
      for (int64_t e = begin; e < end; ++e) {
        const int64_t o = e / (idx_dim * inner), i = e % inner;
        dst[e] = src[(o * src_dim + idx[e]) * inner + i];
      }
    });
  });
}

void CpuBackend::ScatterAdd(int index, DType dtype, void* dst_data, const void* src_data,
                            const int64_t* idx, int64_t outer, int64_t dst_dim, int64_t idx_dim,
                            int64_t inner) {
  CheckIndex(index);
  DispatchAllFloatingTypes(dtype, "CPU ScatterAdd", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* dst = static_cast<T*>(dst_data);
    const T* src = static_cast<const T*>(src_data);
    if (outer * idx_dim * inner <= 0) return;
    // Each task owns whole columns (o, i) of dst, so no two tasks write the same element, and
    // the additions into one element happen in j order: deterministic.
    ParallelFor(Cpu(index), outer * inner, std::max<int64_t>(1, kElementwiseGrain / idx_dim),
                [&](int64_t begin, int64_t end) {
                  for (int64_t column = begin; column < end; ++column) {
                    const int64_t o = column / inner, i = column % inner;
                    for (int64_t j = 0; j < idx_dim; ++j) {
                      const int64_t at = (o * idx_dim + j) * inner + i;
                      dst[(o * dst_dim + idx[at]) * inner + i] += src[at];
                    }
                  }
                });
  });
}

void CpuBackend::RandomUniform(int index, DType dtype, void* dst_data, int64_t n, uint64_t seed,
                               uint64_t offset, double low_value, double high_value) {
  CheckIndex(index);
  DispatchAllFloatingTypes(dtype, "CPU RandomUniform", [&](auto tag) {
    using T = typename decltype(tag)::type;
    // Computed in float32 for every dtype (Note [Random float64] in tensor/runtime/backend.h).
    T* dst = static_cast<T*>(dst_data);
    const float low = static_cast<float>(low_value), high = static_cast<float>(high_value);
    if (n <= 0) return;
    const float range = high - low;
    // low + range * u can round up to `high` itself; the largest float below it keeps the
    // interval half-open.
    const float below_high = std::nextafter(high, low);
    ParallelFor(Cpu(index), n, kTranscendentalGrain, [&](int64_t begin, int64_t end) {
      PhiloxFill<4>(dst, begin, end, seed ^ philox::kUniformStream, offset,
                    [&](const philox::Block& block, int lane) {
                      const float value = low + range * philox::ToUnit(block.x[lane]);
                      return value >= high && high > low ? below_high : value;
                    });
      if constexpr (kIsReducedFloat<T>) {
        // A draw can round up to `high` in 16 bits: it takes the largest value below instead
        // (Note [Random float64]).
        const T top = LargestBelow<T>(high);
        for (int64_t i = begin; i < end; ++i) {
          if (static_cast<float>(dst[i]) >= high && high > low) dst[i] = top;
        }
      }
    });
  });
}

void CpuBackend::RandomNormal(int index, DType dtype, void* dst_data, int64_t n, uint64_t seed,
                              uint64_t offset, double mean_value, double stddev_value) {
  CheckIndex(index);
  DispatchAllFloatingTypes(dtype, "CPU RandomNormal", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* dst = static_cast<T*>(dst_data);
    const float mean = static_cast<float>(mean_value), stddev = static_cast<float>(stddev_value);
    if (n <= 0) return;
    ParallelFor(Cpu(index), n, kTranscendentalGrain, [&](int64_t begin, int64_t end) {
      // Same arithmetic as philox::Normal, with each block generated once for both lanes.
      PhiloxFill<2>(dst, begin, end, seed ^ philox::kNormalStream, offset,
                    [&](const philox::Block& block, int lane) {
                      const float u1 = ((block.x[2 * lane] >> 8) + 1) * (1.0f / 16777216.0f);
                      const float u2 = philox::ToUnit(block.x[2 * lane + 1]);
                      const float radius = sqrtf(-2.0f * logf(u1));
                      return mean + stddev * (radius * cosf(6.2831853071795864769f * u2));
                    });
    });
  });
}

// ---- Fused optimizer updates ---------------------------------------------------------------

// About 64 KiB of floats: enough work per piece to be worth a thread's wake-up, small enough
// to balance a model's few large weights over the threads.
constexpr int64_t kUpdatePieceElements = int64_t{1} << 14;

// Calls update(item, begin, end) over [0, sizes[item]) for every item, in pieces of at most
// kUpdatePieceElements, spread over the workers of the logical CPU devices (they share host
// memory; CpuWorkDevices: every configured one unless narrowed) or, with one, over its
// threads. The pieces are disjoint, and each element's arithmetic does not depend on the
// split, so the result is the same bit for bit however the pieces fall.
template <typename F>
void RunUpdatePieces(const std::vector<int64_t>& sizes, F&& update) {
  struct Piece {
    size_t item;
    int64_t begin, end;
  };
  std::vector<Piece> pieces;
  for (size_t item = 0; item < sizes.size(); ++item) {
    for (int64_t begin = 0; begin < sizes[item]; begin += kUpdatePieceElements) {
      pieces.push_back({item, begin, std::min(sizes[item], begin + kUpdatePieceElements)});
    }
  }
  const auto run = [&](int64_t k) {
    const Piece& piece = pieces[static_cast<size_t>(k)];
    update(piece.item, piece.begin, piece.end);
  };
  const int64_t n = static_cast<int64_t>(pieces.size());
  if (n <= 1) {
    for (int64_t k = 0; k < n; ++k) run(k);
    return;
  }
  const std::vector<Device> devices = CpuWorkDevices();
  if (devices.size() > 1) {
    RunAcrossDevices(devices, static_cast<int>(n), [&](int k) { run(k); });
  } else {
    ParallelFor(devices[0], n, 1, [&](int64_t begin, int64_t end) {
      for (int64_t k = begin; k < end; ++k) run(k);
    });
  }
}

// The loops over [begin, end) of one tensor, compiled for each combination of flags (so that
// they vectorise) and for this CPU's vector unit (tensor/kernels/vectorized.h). The pointers
// are __restrict here, in the loop's own scope: GCC does not carry the element functions'
// qualifiers into the loop after inlining them, and would keep it scalar.
template <bool kDecay, bool kMomentum, bool kNesterov, bool kFirst, typename T>
TANDEM_VECTORIZE void SgdLoop(const TypedUpdate<OpMath<T>>& u, const FusedUpdate& t, int64_t begin,
                              int64_t end) {
  T* __restrict p = static_cast<T*>(t.param);
  const T* __restrict g = static_cast<const T*>(t.grad);
  T* __restrict b = static_cast<T*>(t.state0);
  for (int64_t j = begin; j < end; ++j) {
    SgdElement<kDecay, kMomentum, kNesterov, kFirst>(u, p, g, b, j);
  }
}

// SgdLoop for this CPU's vector unit. Vectorized is inside each entry of SgdPiece's table:
// it inlines what its callable calls, which a call through a pointer is not.
template <bool kDecay, bool kMomentum, bool kNesterov, bool kFirst, typename T>
void SgdRun(const TypedUpdate<OpMath<T>>& u, const FusedUpdate& t, int64_t begin, int64_t end) {
  vec::Vectorized([&] { SgdLoop<kDecay, kMomentum, kNesterov, kFirst, T>(u, t, begin, end); });
}

template <typename T>
void SgdPiece(const TypedUpdate<OpMath<T>>& u, const FusedUpdate& t, int64_t begin, int64_t end) {
  using Loop = void (*)(const TypedUpdate<OpMath<T>>&, const FusedUpdate&, int64_t, int64_t);
  static constexpr Loop kLoops[16] = {
      SgdRun<false, false, false, false, T>, SgdRun<false, false, false, true, T>,
      SgdRun<false, false, true, false, T>,  SgdRun<false, false, true, true, T>,
      SgdRun<false, true, false, false, T>,  SgdRun<false, true, false, true, T>,
      SgdRun<false, true, true, false, T>,   SgdRun<false, true, true, true, T>,
      SgdRun<true, false, false, false, T>,  SgdRun<true, false, false, true, T>,
      SgdRun<true, false, true, false, T>,   SgdRun<true, false, true, true, T>,
      SgdRun<true, true, false, false, T>,   SgdRun<true, true, false, true, T>,
      SgdRun<true, true, true, false, T>,    SgdRun<true, true, true, true, T>,
  };
  const bool momentum = t.state0 != nullptr;
  const Loop loop = kLoops[(t.weight_decay != 0.0) * 8 + momentum * 4 +
                           (momentum && t.nesterov) * 2 + (momentum && t.first)];
  loop(u, t, begin, end);
}

template <bool kL2, typename T>
TANDEM_VECTORIZE void AdamLoop(const TypedUpdate<OpMath<T>>& u, const FusedUpdate& t, int64_t begin,
                               int64_t end) {
  T* __restrict p = static_cast<T*>(t.param);
  const T* __restrict g = static_cast<const T*>(t.grad);
  T* __restrict m = static_cast<T*>(t.state0);
  T* __restrict v = static_cast<T*>(t.state1);
  for (int64_t j = begin; j < end; ++j) AdamElement<kL2>(u, p, g, m, v, j);
}

template <bool kMomentum, bool kCentered, typename T>
TANDEM_VECTORIZE void RmspropLoop(const TypedUpdate<OpMath<T>>& u, const FusedUpdate& t,
                                  int64_t begin, int64_t end) {
  T* __restrict p = static_cast<T*>(t.param);
  const T* __restrict g = static_cast<const T*>(t.grad);
  T* __restrict v = static_cast<T*>(t.state0);
  T* __restrict b = static_cast<T*>(t.state1);
  T* __restrict a = static_cast<T*>(t.state2);
  for (int64_t j = begin; j < end; ++j) {
    RmspropElement<kMomentum, kCentered>(u, p, g, v, b, a, j);
  }
}

template <typename T>
void UpdatePiece(const TypedUpdate<OpMath<T>>& u, const FusedUpdate& t, int64_t begin,
                 int64_t end) {
  switch (t.kind) {
    case OptimizerKind::kSgd:
      return SgdPiece<T>(u, t, begin, end);
    case OptimizerKind::kAdam:
      return vec::Vectorized([&] {
        if (t.l2) {
          AdamLoop<true, T>(u, t, begin, end);
        } else {
          AdamLoop<false, T>(u, t, begin, end);
        }
      });
    case OptimizerKind::kRmsprop:
      return vec::Vectorized([&] {
        const bool momentum = t.state1 != nullptr, centered = t.state2 != nullptr;
        if (momentum && centered) {
          RmspropLoop<true, true, T>(u, t, begin, end);
        } else if (momentum) {
          RmspropLoop<true, false, T>(u, t, begin, end);
        } else if (centered) {
          RmspropLoop<false, true, T>(u, t, begin, end);
        } else {
          RmspropLoop<false, false, T>(u, t, begin, end);
        }
      });
  }
}

void CpuBackend::FusedOptimizerUpdate(int index, DType dtype,
                                      const std::vector<FusedUpdate>& updates) {
  CheckIndex(index);
  DispatchAllFloatingTypes(dtype, "CPU FusedOptimizerUpdate", [&](auto tag) {
    using T = typename decltype(tag)::type;
    // The 16-bit floats compute in float and round each stored value (optimizer_math.h).
    std::vector<TypedUpdate<OpMath<T>>> typed;
    std::vector<int64_t> sizes;
    typed.reserve(updates.size());
    for (const FusedUpdate& u : updates) {
      typed.emplace_back(u);
      sizes.push_back(u.numel);
    }
    RunUpdatePieces(sizes, [&](size_t k, int64_t begin, int64_t end) {
      UpdatePiece<T>(typed[k], updates[k], begin, end);
    });
  });
}

// ---- Fused row norms and triangles (Note [Fused row norms] in tensor/runtime/backend.h) ------

// Rows per block of RowNormBackward's weight and bias sums: each block's partial sums are
// added in block order, so the result does not depend on how the blocks fall over threads.
constexpr int64_t kNormRowBlock = 32;

// Sum of n values with eight independent accumulators, so that the loop vectorises without
// reassociating one chain (which the compiler may not do).
template <typename M>
TANDEM_VECTORIZE inline M SumLanes(const M* __restrict x, int64_t n) {
  M partial[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) partial[j] += x[i + j];
  }
  M tail = 0;
  for (; i < n; ++i) tail += x[i];
  return ((partial[0] + partial[1]) + (partial[2] + partial[3])) +
         ((partial[4] + partial[5]) + (partial[6] + partial[7])) + tail;
}

// sum((x - shift)^2) with the same lanes.
template <typename M>
TANDEM_VECTORIZE inline M SumSquaredLanes(const M* __restrict x, M shift, int64_t n) {
  M partial[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) {
      const M d = x[i + j] - shift;
      partial[j] += d * d;
    }
  }
  M tail = 0;
  for (; i < n; ++i) tail += (x[i] - shift) * (x[i] - shift);
  return ((partial[0] + partial[1]) + (partial[2] + partial[3])) +
         ((partial[4] + partial[5]) + (partial[6] + partial[7])) + tail;
}

// A row of T as OpMath<T> values: the row itself for float and double, else converted into
// `buffer` (which must hold n values).
template <typename T>
inline const OpMath<T>* RowAsMath(const T* row, int64_t n, OpMath<T>* buffer) {
  if constexpr (kIsReducedFloat<T>) {
    vec::ToFloatLoop(row, buffer, n);  // the caller runs inside vec::Vectorized
    return buffer;
  } else {
    return row;
  }
}

// `weight` or `bias` as OpMath values (empty when null).
template <typename T>
std::vector<OpMath<T>> VectorAsMath(const void* data, int64_t n) {
  std::vector<OpMath<T>> out;
  if (data == nullptr) return out;
  out.resize(static_cast<size_t>(n));
  const T* in = static_cast<const T*>(data);
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<OpMath<T>>(in[i]);
  return out;
}

// Writes n OpMath values to a row of T (rounding once for the 16-bit floats).
template <typename T>
inline void StoreRow(const OpMath<T>* in, int64_t n, T* out) {
  if constexpr (kIsReducedFloat<T>) {
    vec::FromFloatLoop(in, out, n);  // the caller runs inside vec::Vectorized
  } else {
    std::copy(in, in + n, out);
  }
}

// y = (x - mean) * rstd [* w] [+ b] over one row.
template <typename M>
TANDEM_VECTORIZE inline void NormalizeRow(const M* __restrict x, M mean, M rstd,
                                          const M* __restrict w, const M* __restrict b, int64_t n,
                                          M* __restrict out) {
  if (w != nullptr && b != nullptr) {
    for (int64_t j = 0; j < n; ++j) out[j] = (x[j] - mean) * rstd * w[j] + b[j];
  } else if (w != nullptr) {
    for (int64_t j = 0; j < n; ++j) out[j] = (x[j] - mean) * rstd * w[j];
  } else if (b != nullptr) {
    for (int64_t j = 0; j < n; ++j) out[j] = (x[j] - mean) * rstd + b[j];
  } else {
    for (int64_t j = 0; j < n; ++j) out[j] = (x[j] - mean) * rstd;
  }
}

// One row of RowNormBackward: xhat; the weight and bias partial sums (dw, db: null when not
// wanted); and, into `g` when dx is wanted, grad_x = rstd * (g - mean(g) - xhat * mean(g xhat))
// with g = gy * w (rms: without the mean(g) term).
template <typename M>
TANDEM_VECTORIZE inline void NormBackwardRow(bool rms, const M* __restrict x,
                                             const M* __restrict gy, const M* __restrict w, M mean,
                                             M rstd, int64_t n, bool want_dx, M* __restrict xhat,
                                             M* __restrict g, M* __restrict dw, M* __restrict db) {
  for (int64_t j = 0; j < n; ++j) xhat[j] = (x[j] - mean) * rstd;
  if (dw != nullptr) {
    for (int64_t j = 0; j < n; ++j) dw[j] += gy[j] * xhat[j];
  }
  if (db != nullptr) {
    for (int64_t j = 0; j < n; ++j) db[j] += gy[j];
  }
  if (!want_dx) return;
  if (w != nullptr) {
    for (int64_t j = 0; j < n; ++j) g[j] = gy[j] * w[j];
  } else {
    for (int64_t j = 0; j < n; ++j) g[j] = gy[j];
  }
  const M inv_n = M(1) / static_cast<M>(n);
  const M mean_g = rms ? M(0) : SumLanes(g, n) * inv_n;
  M dot[8] = {};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    for (int k = 0; k < 8; ++k) dot[k] += g[j + k] * xhat[j + k];
  }
  M tail = 0;
  for (; j < n; ++j) tail += g[j] * xhat[j];
  const M mean_gx =
      (((dot[0] + dot[1]) + (dot[2] + dot[3])) + ((dot[4] + dot[5]) + (dot[6] + dot[7])) + tail) *
      inv_n;
  for (int64_t k = 0; k < n; ++k) g[k] = rstd * (g[k] - mean_g - xhat[k] * mean_gx);
}

template <typename T>
void RowNormTyped(int index, bool rms, int64_t rows, int64_t cols, double eps, const void* x_data,
                  const void* weight_data, const void* bias_data, void* y_data, void* mean_data,
                  void* rstd_data) {
  using M = OpMath<T>;
  const T* x = static_cast<const T*>(x_data);
  T* y = static_cast<T*>(y_data);
  M* mean_out = static_cast<M*>(mean_data);
  M* rstd_out = static_cast<M*>(rstd_data);
  const std::vector<M> weight = VectorAsMath<T>(weight_data, cols);
  const std::vector<M> bias = VectorAsMath<T>(bias_data, cols);
  const M* w = weight.empty() ? nullptr : weight.data();
  const M* b = bias.empty() ? nullptr : bias.data();
  const M inv_cols = M(1) / static_cast<M>(cols);
  ParallelFor(Cpu(index), rows, std::max<int64_t>(1, kElementwiseGrain / (4 * cols)),
              [&](int64_t begin, int64_t end) {
                std::vector<M> in_buffer(kIsReducedFloat<T> ? cols : 0);
                std::vector<M> out(cols);
                vec::Vectorized([&] {
                  for (int64_t r = begin; r < end; ++r) {
                    const M* xs = RowAsMath(x + r * cols, cols, in_buffer.data());
                    const M mean = rms ? M(0) : SumLanes(xs, cols) * inv_cols;
                    const M var = SumSquaredLanes(xs, mean, cols) * inv_cols;
                    const M rstd = M(1) / std::sqrt(var + static_cast<M>(eps));
                    if (mean_out != nullptr) mean_out[r] = mean;
                    rstd_out[r] = rstd;
                    NormalizeRow(xs, mean, rstd, w, b, cols, out.data());
                    StoreRow<T>(out.data(), cols, y + r * cols);
                  }
                });
              });
}

template <typename T>
void RowNormBackwardTyped(int index, bool rms, int64_t rows, int64_t cols, const void* grad_data,
                          const void* x_data, const void* mean_data, const void* rstd_data,
                          const void* weight_data, void* grad_x_data, void* grad_weight_data,
                          void* grad_bias_data) {
  using M = OpMath<T>;
  const T* dy = static_cast<const T*>(grad_data);
  const T* x = static_cast<const T*>(x_data);
  const M* mean_in = static_cast<const M*>(mean_data);
  const M* rstd_in = static_cast<const M*>(rstd_data);
  T* dx = static_cast<T*>(grad_x_data);
  const std::vector<M> weight = VectorAsMath<T>(weight_data, cols);
  const M* w = weight.empty() ? nullptr : weight.data();
  const bool want_dw = grad_weight_data != nullptr, want_db = grad_bias_data != nullptr;
  const int64_t blocks = (rows + kNormRowBlock - 1) / kNormRowBlock;
  // Per block of rows: its partial sums of grad_y * xhat (dw) and grad_y (db).
  std::vector<M> partial_dw(want_dw ? blocks * cols : 0), partial_db(want_db ? blocks * cols : 0);
  ParallelFor(Cpu(index), blocks,
              std::max<int64_t>(1, kElementwiseGrain / (8 * kNormRowBlock * cols)),
              [&](int64_t block_begin, int64_t block_end) {
                const bool reduced = kIsReducedFloat<T>;
                std::vector<M> x_buffer(reduced ? cols : 0), dy_buffer(reduced ? cols : 0);
                std::vector<M> xhat(cols), g(cols);
                for (int64_t block = block_begin; block < block_end; ++block) {
                  M* dw = want_dw ? partial_dw.data() + block * cols : nullptr;
                  M* db = want_db ? partial_db.data() + block * cols : nullptr;
                  if (dw != nullptr) std::fill(dw, dw + cols, M(0));
                  if (db != nullptr) std::fill(db, db + cols, M(0));
                  const int64_t row_end = std::min(rows, (block + 1) * kNormRowBlock);
                  vec::Vectorized([&] {
                    for (int64_t r = block * kNormRowBlock; r < row_end; ++r) {
                      const M* xs = RowAsMath(x + r * cols, cols, x_buffer.data());
                      const M* gy = RowAsMath(dy + r * cols, cols, dy_buffer.data());
                      NormBackwardRow(rms, xs, gy, w, rms ? M(0) : mean_in[r], rstd_in[r], cols,
                                      dx != nullptr, xhat.data(), g.data(), dw, db);
                      if (dx != nullptr) StoreRow<T>(g.data(), cols, dx + r * cols);
                    }
                  });
                }
              });
  // The blocks' partial sums, added in block order, a tile of columns per task.
  auto finish = [&](const std::vector<M>& partial, void* out_data) {
    T* out = static_cast<T*>(out_data);
    constexpr int64_t kTile = 256;
    const int64_t tiles = (cols + kTile - 1) / kTile;
    ParallelFor(Cpu(index), tiles,
                std::max<int64_t>(1, kElementwiseGrain / (kTile * std::max<int64_t>(1, blocks))),
                [&](int64_t begin, int64_t end) {
                  M acc[kTile];
                  for (int64_t tile = begin; tile < end; ++tile) {
                    const int64_t j0 = tile * kTile, width = std::min(kTile, cols - j0);
                    std::fill(acc, acc + width, M(0));
                    for (int64_t block = 0; block < blocks; ++block) {
                      const M* p = partial.data() + block * cols + j0;
                      for (int64_t j = 0; j < width; ++j) acc[j] += p[j];
                    }
                    for (int64_t j = 0; j < width; ++j) out[j0 + j] = static_cast<T>(acc[j]);
                  }
                });
  };
  if (want_dw) finish(partial_dw, grad_weight_data);
  if (want_db) finish(partial_db, grad_bias_data);
}

void CheckRowNormShape(const char* kernel, DType dtype, int64_t rows, int64_t cols) {
  TANDEM_CHECK(IsFloatingPoint(dtype), "CPU ", kernel,
               " expects a floating dtype (float32, float64, bfloat16 or float16) but got ", dtype,
               "; convert the input with .to(kFloat32)");
  TANDEM_CHECK(rows >= 0 && cols > 0, "CPU ", kernel, " expects rows >= 0 and cols > 0 but got [",
               rows, ", ", cols, "]; a norm needs at least one element per row");
}

void CpuBackend::RowNorm(int index, DType dtype, bool rms, int64_t rows, int64_t cols, double eps,
                         const void* x, const void* weight, const void* bias, void* y, void* mean,
                         void* rstd) {
  CheckIndex(index);
  CheckRowNormShape("RowNorm", dtype, rows, cols);
  if (rows == 0) return;
  DispatchAllFloatingTypes(dtype, "CPU RowNorm", [&](auto tag) {
    RowNormTyped<typename decltype(tag)::type>(index, rms, rows, cols, eps, x, weight, bias, y,
                                               mean, rstd);
  });
}

void CpuBackend::RowNormBackward(int index, DType dtype, bool rms, int64_t rows, int64_t cols,
                                 const void* grad_y, const void* x, const void* mean,
                                 const void* rstd, const void* weight, void* grad_x,
                                 void* grad_weight, void* grad_bias) {
  CheckIndex(index);
  CheckRowNormShape("RowNormBackward", dtype, rows, cols);
  DispatchAllFloatingTypes(dtype, "CPU RowNormBackward", [&](auto tag) {
    RowNormBackwardTyped<typename decltype(tag)::type>(
        index, rms, rows, cols, grad_y, x, mean, rstd, weight, grad_x, grad_weight, grad_bias);
  });
}

void CpuBackend::Triangle(int index, DType dtype, bool lower, int64_t diagonal, int64_t batch,
                          int64_t rows, int64_t cols, const void* src, void* dst) {
  CheckIndex(index);
  TANDEM_CHECK(batch >= 0 && rows >= 0 && cols >= 0,
               "CPU Triangle expects non-negative [batch, rows, cols] but got [", batch, ", ", rows,
               ", ", cols, "]");
  const int64_t element = static_cast<int64_t>(ElementSize(dtype));
  const char* in = static_cast<const char*>(src);
  char* out = static_cast<char*>(dst);
  // Every dtype's zero is all zero bits, so one byte-level loop serves them all: copy each
  // row's kept run, clear the rest.
  ParallelFor(Cpu(index), batch * rows, std::max<int64_t>(1, kElementwiseGrain / (cols + 1)),
              [&](int64_t begin, int64_t end) {
                for (int64_t item = begin; item < end; ++item) {
                  const int64_t i = item % rows;
                  const int64_t keep_begin =
                      lower ? 0 : std::min(cols, std::max<int64_t>(0, i + diagonal));
                  const int64_t keep_end =
                      lower ? std::min(cols, std::max<int64_t>(0, i + diagonal + 1)) : cols;
                  const int64_t row = item * cols * element;
                  std::memset(out + row, 0, keep_begin * element);
                  if (keep_end > keep_begin && in != out) {
                    std::memcpy(out + row + keep_begin * element, in + row + keep_begin * element,
                                (keep_end - keep_begin) * element);
                  }
                  if (keep_end < cols) {
                    std::memset(out + row + std::max(keep_begin, keep_end) * element, 0,
                                (cols - std::max(keep_begin, keep_end)) * element);
                  }
                }
              });
}

BackendRegistration registration(DeviceType::kCPU, &CpuBackend::Instance);

}  // namespace
}  // namespace tandem
