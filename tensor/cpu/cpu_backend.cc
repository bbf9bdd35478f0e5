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
#include "tensor/cpu/internal/cpu_loops.h"
#include "tensor/cpu/internal/elementwise_kernels.h"
#include "tensor/cpu/internal/onednn_matmul.h"
#include "tensor/cpu/internal/reduce_kernels.h"
#include "tensor/kernels/float_conversions.h"
#include "tensor/kernels/internal/elementwise_math.h"
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
  // Reductions (tensor/cpu/reduce_kernels.cc).
  void Reduce(int index, ReduceKind op, const KernelTensor& dst, const KernelTensor& src,
              int64_t outer, int64_t reduce, int64_t inner) override {
    CheckIndex(index);
    cpu_internal::Reduce(index, op, dst, src, outer, reduce, inner);
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
  void RandomUniform(int index, DType dtype, void* dst, int64_t n, uint64_t seed, uint64_t offset,
                     double low, double high) override;
  void RandomNormal(int index, DType dtype, void* dst, int64_t n, uint64_t seed, uint64_t offset,
                    double mean, double stddev) override;

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

BackendRegistration registration(DeviceType::kCPU, &CpuBackend::Instance);

}  // namespace
}  // namespace tandem
