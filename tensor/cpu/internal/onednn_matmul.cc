#include "tensor/cpu/internal/onednn_matmul.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <dnnl.hpp>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "tensor/base/error.h"
#include "tensor/base/half.h"
#include "tensor/cpu/internal/onednn_common.h"
#include "tensor/kernels/float_conversions.h"
#include "tensor/runtime/threads.h"

namespace tandem {
namespace {

using dnnl::memory;

// Note [oneDNN threads]: Debian's libdnnl is built with the OpenMP runtime
// (DNNL_CPU_RUNTIME == DNNL_RUNTIME_OMP): a primitive opens an OpenMP parallel region of
// omp_get_max_threads() threads, by default one per core, on whichever thread calls it. In
// Tandem every logical CPU device owns a fixed share of the cores and its kernels split work
// over that device's pool, so a GEMM that fanned out to every core would compete with the
// other devices (and with its own pool's threads, each opening a region). The threadpool
// interface (dnnl_threadpool_interop_*) that would let oneDNN run on our pool exists only in
// builds with DNNL_CPU_RUNTIME == DNNL_RUNTIME_THREADPOOL, which Debian does not ship. So we
// do what the backend does with OpenBLAS: the product is cut into blocks, the device's pool
// runs the blocks (ParallelFor), and each oneDNN call runs on one thread. OpenMP's thread
// count is a per-thread setting (an ICV of the calling thread's implicit task), so
// OneThreadOpenMp sets it to one on the calling thread for the call (primitive creation
// included: oneDNN picks its blocking for the thread count it sees then) and restores it, and
// user code that uses OpenMP elsewhere keeps its own setting.

// Blocks are at least this many rows (or columns) and floating-point operations: a oneDNN
// call costs a few microseconds on top of its arithmetic (memory objects, argument checks),
// and 2^22 flops is ~20 us of bfloat16 work at ~200 GFLOP/s on one core. Narrower blocks also
// re-read the other operand once each, which made 64-row blocks slower than 128-row ones on the
// MLP's bfloat16 step (train_step --autocast=bf16).
constexpr int64_t kMinBlock = 128;
constexpr double kMinFlopsPerBlock = 1 << 22;
// At most this many blocks per GEMM (all products together): enough for every thread of a
// device's pool on today's machines, few enough that per-call costs stay small.
constexpr int64_t kMaxBlocks = 32;
// Block edges are multiples of this many rows or columns where blocks are wide enough.
constexpr int64_t kBlockAlign = 16;

bool SupportedDType(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kBFloat16 || dtype == DType::kFloat16;
}

memory::data_type DnnlType(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16:
      return memory::data_type::bf16;
    case DType::kFloat16:
      return memory::data_type::f16;
    default:
      return memory::data_type::f32;
  }
}

const dnnl::engine& Engine() { return OneDnnEngine(); }

// Everything a primitive depends on. Pointers are not part of it (memory objects bind them
// at each call), nor is the thread count (always one, see Note [oneDNN threads]).
struct Key {
  DType dtype;    // A's and B's
  DType c_dtype;  // C's: `dtype`, or float32 for 16-bit products kept in float
  bool trans_a, trans_b;
  int64_t m, n, k, lda, ldb, ldc;
  float alpha, beta;
  bool operator==(const Key& o) const {
    return dtype == o.dtype && c_dtype == o.c_dtype && trans_a == o.trans_a &&
           trans_b == o.trans_b && m == o.m && n == o.n && k == o.k && lda == o.lda &&
           ldb == o.ldb && ldc == o.ldc && std::memcmp(&alpha, &o.alpha, sizeof(alpha)) == 0 &&
           std::memcmp(&beta, &o.beta, sizeof(beta)) == 0;
  }
};

struct KeyHash {
  size_t operator()(const Key& key) const {
    uint32_t alpha_bits, beta_bits;
    std::memcpy(&alpha_bits, &key.alpha, sizeof(alpha_bits));
    std::memcpy(&beta_bits, &key.beta, sizeof(beta_bits));
    size_t h = (static_cast<size_t>(key.dtype) * 16 + static_cast<size_t>(key.c_dtype)) * 4 +
               key.trans_a * 2 + key.trans_b;
    for (uint64_t v : {static_cast<uint64_t>(key.m), static_cast<uint64_t>(key.n),
                       static_cast<uint64_t>(key.k), static_cast<uint64_t>(key.lda),
                       static_cast<uint64_t>(key.ldb), static_cast<uint64_t>(key.ldc),
                       static_cast<uint64_t>(alpha_bits), static_cast<uint64_t>(beta_bits)}) {
      h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    }
    return h;
  }
};

// A created primitive, or the fact that oneDNN has only reference code (or nothing) for the
// key. Immutable once made, so threads share it without locks: oneDNN primitives may run
// concurrently, and each call brings its own stream and scratchpad.
struct Primitive {
  bool supported = false;
  std::string implementation;
  dnnl::matmul matmul;
  memory::desc a, b, c, scratchpad;
};

std::shared_ptr<const Primitive> Create(const Key& key) {
  auto result = std::make_shared<Primitive>();
  const memory::data_type type = DnnlType(key.dtype);
  // op(A) is m x k: A stored m x k (strides lda, 1), or k x m read transposed (1, lda).
  result->a = memory::desc({key.m, key.k}, type,
                           key.trans_a ? memory::dims{1, key.lda} : memory::dims{key.lda, 1});
  result->b = memory::desc({key.k, key.n}, type,
                           key.trans_b ? memory::dims{1, key.ldb} : memory::dims{key.ldb, 1});
  result->c = memory::desc({key.m, key.n}, DnnlType(key.c_dtype), memory::dims{key.ldc, 1});
  dnnl::primitive_attr attr;
  // Our scratchpad, not the library's: a thread-local buffer per calling thread, so that
  // concurrent calls of one primitive never share one.
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  // dst = sum_scale * dst + output_scale * (A B), computed in float and rounded once.
  if (key.alpha != 1.0f) attr.set_output_scales(0, {key.alpha});
  if (key.beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(key.beta);
    attr.set_post_ops(ops);
  }
  try {
    OneThreadOpenMp one_thread;
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(result->a, result->b, result->c), attr,
                                    Engine());
    result->implementation = pd.impl_info_str();
    // The reference kernels are scalar loops, far slower than converting to float for
    // OpenBLAS: the caller's fallback does better.
    if (result->implementation.rfind("ref", 0) == 0) return result;
    result->scratchpad = pd.scratchpad_desc();
    result->matmul = dnnl::matmul(pd);
    result->supported = true;
  } catch (const dnnl::error&) {
    // No implementation for this data type on this CPU (e.g. f16 in oneDNN 2.6).
    result->supported = false;
  }
  return result;
}

// Primitives by key, made on first use. Creating one costs tens of microseconds (and JIT
// compiles its kernel the first time), more than a small product. A program whose shapes keep
// changing would grow the map without end, so it is dropped when it gets large; callers hold
// their entry through a shared_ptr meanwhile.
std::shared_ptr<const Primitive> Lookup(const Key& key) {
  static std::mutex mutex;
  static auto* cache = new std::unordered_map<Key, std::shared_ptr<const Primitive>, KeyHash>();
  constexpr size_t kMaxEntries = 4096;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache->find(key);
    if (it != cache->end()) return it->second;
  }
  std::shared_ptr<const Primitive> made;
  {
    // Not under the map's lock (creation is slow), but one creation at a time.
    std::lock_guard<std::mutex> creating(OneDnnCreationMutex());
    made = Create(key);
  }
  std::lock_guard<std::mutex> lock(mutex);
  if (cache->size() >= kMaxEntries) cache->clear();
  return cache->emplace(key, std::move(made)).first->second;
}

// Runs `primitive` on the calling thread.
void Execute(const Primitive& primitive, const void* a, const void* b, void* c) {
  thread_local std::unique_ptr<dnnl::stream> stream;
  thread_local std::vector<uint8_t> scratch;
  if (!stream) stream = std::make_unique<dnnl::stream>(Engine());
  constexpr size_t kAlign = 64;
  const size_t scratch_bytes = primitive.scratchpad.get_size();
  if (scratch.size() < scratch_bytes + kAlign) scratch.resize(scratch_bytes + kAlign);
  void* scratch_data =
      scratch.data() + (kAlign - reinterpret_cast<uintptr_t>(scratch.data()) % kAlign) % kAlign;
  const dnnl::engine& engine = Engine();
  try {
    OneThreadOpenMp one_thread;
    memory a_memory(primitive.a, engine, const_cast<void*>(a));
    memory b_memory(primitive.b, engine, const_cast<void*>(b));
    memory c_memory(primitive.c, engine, c);
    memory scratch_memory(primitive.scratchpad, engine, scratch_data);
    primitive.matmul.execute(*stream, {{DNNL_ARG_SRC, a_memory},
                                       {DNNL_ARG_WEIGHTS, b_memory},
                                       {DNNL_ARG_DST, c_memory},
                                       {DNNL_ARG_SCRATCHPAD, scratch_memory}});
    stream->wait();
  } catch (const dnnl::error& e) {
    TANDEM_FAIL("CPU Gemm: oneDNN's ", primitive.implementation,
                " matmul failed to run: ", e.what(),
                "; this is a bug in Tandem or oneDNN: please report it with the GEMM's shape");
  }
}

// BLAS's leading dimension rules: rows of op(X) must not overlap, except where there is at
// most one row and the stride never matters (then any value is taken as the row length).
bool LeadingDimension(int64_t rows, int64_t cols, int64_t* ld) {
  if (rows <= 1) {
    *ld = std::max<int64_t>(*ld, std::max<int64_t>(cols, 1));
    return true;
  }
  return *ld >= std::max<int64_t>(cols, 1);
}

// C = beta * C for the products that multiply nothing (k = 0 or alpha = 0), in float with one
// rounding, as BLAS does: beta = 0 overwrites, even NaN.
template <typename T>
void ScaleC(int64_t m, int64_t n, float beta, T* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i) {
    T* row = c + i * ldc;
    if (beta == 0.0f) {
      std::fill(row, row + n, T(0.0f));
    } else if (beta != 1.0f) {
      for (int64_t j = 0; j < n; ++j) row[j] = T(beta * static_cast<float>(row[j]));
    }
  }
}

void ScaleC(DType dtype, int64_t m, int64_t n, float beta, void* c, int64_t ldc) {
  switch (dtype) {
    case DType::kBFloat16:
      return ScaleC(m, n, beta, static_cast<BFloat16*>(c), ldc);
    case DType::kFloat16:
      return ScaleC(m, n, beta, static_cast<Half*>(c), ldc);
    default:
      return ScaleC(m, n, beta, static_cast<float*>(c), ldc);
  }
}

std::atomic<OneDnnFloat32Policy> float32_policy{OneDnnFloat32Policy::kMeasured};

}  // namespace

bool OneDnnSupports(DType dtype) {
  if (!SupportedDType(dtype)) return false;
  // One probe per dtype: a small plain product, the layout every kernel handles.
  static std::once_flag once[3];
  static bool supported[3];
  const int slot = dtype == DType::kFloat32 ? 0 : dtype == DType::kBFloat16 ? 1 : 2;
  std::call_once(once[slot], [&] {
    supported[slot] =
        Lookup(Key{dtype, dtype, false, false, 32, 32, 32, 32, 32, 32, 1.0f, 0.0f})->supported;
  });
  return supported[slot];
}

bool OneDnnMatmul(DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                  float alpha, const void* a, int64_t lda, const void* b, int64_t ldb, float beta,
                  void* c, int64_t ldc) {
  if (!OneDnnSupports(dtype)) return false;
  const std::shared_ptr<const Primitive> primitive =
      Lookup(Key{dtype, dtype, trans_a, trans_b, m, n, k, lda, ldb, ldc, alpha, beta});
  if (!primitive->supported) return false;
  Execute(*primitive, a, b, c);
  return true;
}

std::string OneDnnMatmulImplementation(DType dtype, bool trans_a, bool trans_b, int64_t m,
                                       int64_t n, int64_t k, int64_t lda, int64_t ldb,
                                       int64_t ldc) {
  if (!SupportedDType(dtype)) return "";
  const std::shared_ptr<const Primitive> primitive =
      Lookup(Key{dtype, dtype, trans_a, trans_b, m, n, k, lda, ldb, ldc, 1.0f, 0.0f});
  return primitive->supported ? primitive->implementation : "";
}

namespace {

// Rows [0, rows) x columns [0, cols) of the float32 matrix `from` (row stride `ld`) rounded to T
// into the packed `to` (row stride `cols`), as a cast rounds.
template <typename T>
void RoundBlock(const float* from, int64_t ld, int64_t rows, int64_t cols, void* to) {
  T* out = static_cast<T*>(to);
  for (int64_t r = 0; r < rows; ++r) vec::FromFloat(from + r * ld, out + r * cols, cols);
}

// B as GemmInto reads it: `dtype` itself, or float32 that each block rounds to `dtype` into a
// buffer of `allocator` (OneDnnGemmFloatOutput).
struct OperandB {
  const void* data;
  int64_t ld;
  int64_t stride;
  DType stored;
  Allocator* allocator;  // where `stored` is float32 and the GEMM's dtype is not
};

// OneDnnGemm with C of `c_dtype` (`dtype`, or float32 under 16-bit A and B).
bool GemmInto(int index, DType dtype, DType c_dtype, bool trans_a, bool trans_b, int64_t m,
              int64_t n, int64_t k, double alpha_value, const void* a_data, int64_t lda,
              int64_t stride_a, OperandB b_operand, double beta_value, void* c_data, int64_t ldc,
              int64_t stride_c, int64_t batch) {
  int64_t ldb = b_operand.ld;
  const int64_t stride_b = b_operand.stride;
  const bool round_b = b_operand.stored != dtype;
  // Arguments the caller must reject (or has nothing to do for) go back to it.
  if (index < 0 || m < 0 || n < 0 || k < 0 || batch < 0) return false;
  if (!OneDnnSupports(dtype)) return false;
  if (m == 0 || n == 0 || batch == 0) return true;
  if (batch > 1 && stride_c == 0) return false;
  if (round_b && (b_operand.stored != DType::kFloat32 || b_operand.allocator == nullptr ||
                  batch != 1 || dtype == DType::kFloat32)) {
    return false;
  }
  // op(A) is m x k: A is stored m x k, or k x m when transposed; likewise B.
  if (!LeadingDimension(trans_a ? k : m, trans_a ? m : k, &lda) ||
      !LeadingDimension(trans_b ? n : k, trans_b ? k : n, &ldb) || !LeadingDimension(m, n, &ldc)) {
    return false;
  }
  const float alpha = static_cast<float>(alpha_value), beta = static_cast<float>(beta_value);
  const size_t element = ElementSize(dtype), c_element = ElementSize(c_dtype);
  const char* a = static_cast<const char*>(a_data);
  const char* b = static_cast<const char*>(b_operand.data);
  const size_t b_element = ElementSize(b_operand.stored);
  char* c = static_cast<char*>(c_data);

  // Blocks: each product's C cut along its longer side into `pieces` blocks of rows (or
  // columns), as the OpenBLAS path does, but the count depends on the shape only, never on
  // the pool: oneDNN picks its kernel and blocking from a call's shape, and (measured with
  // oneDNN 2.6) cutting C's columns differently changes the rounding of some elements. With
  // a fixed cut each element comes from the same call whatever the number of threads.
  const bool split_rows = m >= n;
  // Blocks of rows each read all of B: rounding it per block would repeat the work.
  if (round_b && split_rows) return false;
  const int64_t extent = split_rows ? m : n;
  const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) *
                       static_cast<double>(std::max<int64_t>(k, 1));
  int64_t pieces = 1;
  while (extent / (pieces * 2) >= kMinBlock && flops / (pieces * 2) >= kMinFlopsPerBlock &&
         batch * pieces * 2 <= kMaxBlocks) {
    pieces *= 2;
  }
  // Block edges fall on multiples of kBlockAlign (the last block takes the remainder): oneDNN's
  // kernels work in register blocks of 16 (or more) columns, and a block of 98 columns spent a
  // whole vector pass on its last 2. Everything that can fail (oneDNN having only reference
  // code for a block's layout) is settled before any block is written, so that false means
  // nothing was written.
  const auto edge = [&](int64_t piece) -> int64_t {
    if (piece >= pieces) return extent;
    const int64_t even = extent * piece / pieces;
    return extent / pieces >= 2 * kBlockAlign
               ? std::min(extent, (even + kBlockAlign / 2) / kBlockAlign * kBlockAlign)
               : even;
  };
  // A block's columns of op(B), rounded: k x width (or width x k for B transposed), packed.
  const auto rounded_ldb = [&](int64_t width) { return trans_b ? k : width; };
  std::vector<std::pair<int64_t, std::shared_ptr<const Primitive>>> primitives;  // by width
  const auto primitive_for = [&](int64_t width) -> const Primitive& {
    for (const auto& [w, primitive] : primitives) {
      if (w == width) return *primitive;
    }
    TANDEM_FAIL("OneDnnGemm: no primitive for a block of width ", width,
                "; this is a bug in Tandem: please report it with the GEMM's shape");
  };
  if (k > 0 && alpha != 0.0f) {
    for (int64_t piece = 0; piece < pieces; ++piece) {
      const int64_t size = edge(piece + 1) - edge(piece);
      bool known = false;
      for (const auto& entry : primitives) known = known || entry.first == size;
      if (known) continue;
      primitives.emplace_back(
          size,
          Lookup(Key{dtype, c_dtype, trans_a, trans_b, split_rows ? size : m, split_rows ? n : size,
                     k, lda, round_b ? rounded_ldb(size) : ldb, ldc, alpha, beta}));
      if (!primitives.back().second->supported) return false;
    }
  }

  ParallelFor(Device::Cpu(index), batch * pieces, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t product = item / pieces, piece = item % pieces;
      const int64_t lo = edge(piece), hi = edge(piece + 1);
      const char* a_product = a + product * stride_a * element;
      const char* b_product = b + product * stride_b * b_element;
      char* c_product = c + product * stride_c * c_element;
      const char* a_block = a_product;
      const char* b_block = b_product;
      char* c_block;
      int64_t rows = m, cols = n;
      if (split_rows) {
        // Rows [lo, hi) of op(A): rows of A, or columns of A when transposed.
        a_block += (trans_a ? lo : lo * lda) * element;
        c_block = c_product + lo * ldc * c_element;
        rows = hi - lo;
      } else {
        // Columns [lo, hi) of op(B): columns of B, or rows of B when transposed.
        b_block += (trans_b ? lo * ldb : lo) * b_element;
        c_block = c_product + lo * c_element;
        cols = hi - lo;
      }
      if (k == 0 || alpha == 0.0f) {
        ScaleC(c_dtype, rows, cols, beta, c_block, ldc);
      } else if (round_b) {
        const int64_t width = hi - lo;
        const std::shared_ptr<void> rounded =
            b_operand.allocator->Allocate(static_cast<size_t>(width * k) * element);
        const float* from = reinterpret_cast<const float*>(b_block);
        if (dtype == DType::kBFloat16) {
          RoundBlock<BFloat16>(from, ldb, trans_b ? width : k, trans_b ? k : width, rounded.get());
        } else {
          RoundBlock<Half>(from, ldb, trans_b ? width : k, trans_b ? k : width, rounded.get());
        }
        Execute(primitive_for(width), a_block, rounded.get(), c_block);
      } else {
        Execute(primitive_for(hi - lo), a_block, b_block, c_block);
      }
    }
  });
  return true;
}

}  // namespace

bool OneDnnGemm(int index, DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                double alpha, const void* a, int64_t lda, int64_t stride_a, const void* b,
                int64_t ldb, int64_t stride_b, double beta, void* c, int64_t ldc, int64_t stride_c,
                int64_t batch) {
  return GemmInto(index, dtype, dtype, trans_a, trans_b, m, n, k, alpha, a, lda, stride_a,
                  OperandB{b, ldb, stride_b, dtype, nullptr}, beta, c, ldc, stride_c, batch);
}

bool OneDnnGemmFloatOutput(int index, DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n,
                           int64_t k, const void* a, int64_t lda, DType b_dtype, const void* b,
                           int64_t ldb, float* c, int64_t ldc, Allocator& allocator) {
  if (dtype != DType::kBFloat16 && dtype != DType::kFloat16) return false;
  return GemmInto(index, dtype, DType::kFloat32, trans_a, trans_b, m, n, k, 1.0, a, lda, 0,
                  OperandB{b, ldb, 0, b_dtype, &allocator}, 0.0, c, ldc, 0, 1);
}

void SetOneDnnFloat32Policy(OneDnnFloat32Policy policy) { float32_policy.store(policy); }

bool OneDnnPreferredForFloat32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                               int64_t batch) {
  switch (float32_policy.load(std::memory_order_relaxed)) {
    case OneDnnFloat32Policy::kNever:
      return false;
    case OneDnnFloat32Policy::kAlways:
      return true;
    case OneDnnFloat32Policy::kMeasured:
      break;
  }
  // In float32 oneDNN (2.6) beats OpenBLAS (0.3.21) only on the CNN's wide products: the
  // im2col GEMMs with every image's columns side by side, few rows and short inner dimensions.
  // It is even on the MLP's Linear layers and slower on narrow products (the per-image GEMMs,
  // 10-row products), on the weight gradient's long inner dimension with B transposed, and on
  // large square-ish GEMMs, so those stay on OpenBLAS. The column threshold sits below a logical
  // CPU device's share of the CNN's batch (12544 columns for 64 images), so that DataParallel
  // over several devices keeps those products on oneDNN as one device does. Re-measure with
  // `bazel run -c opt //tensor/cpu:onednn_benchmark` and tools/bench/cpu_layouts.sh.
  return batch == 1 && !trans_b && n >= 8192 && m <= 512 && k <= 512;
}

}  // namespace tandem
