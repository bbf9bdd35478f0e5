// Fused attention on CUDA (Note [Fused attention], tensor/kernels/attention_kernels.h):
// LaunchAttention* of kernels.h. The CPU backend's tile loops are the oracle
// (cuda_fused_attention_test.cc). Operands are read and written through their rows' strides
// (AttentionRows), so a head split reaches the kernels without a copy.
//
// Two implementations:
// - bfloat16 and float16, head and value sizes up to 256: FlashAttention-2 on tensor cores
//   (WMMA 16x16x16 tiles, float accumulation; cudasim's <mma.h> runs them on the CPU). The
//   forward takes 64 queries a block (a warp per 16) against 32-key tiles with an online
//   softmax, skipping tiles above the causal diagonal; the backward takes 64 keys a block (fewer
//   warps when a device's shared memory is smaller) against 32-query tiles, computing S and dP
//   once per pair, dk and dv in the block, dq by float32 atomics (Note [Attention dq atomics]:
//   not bitwise reproducible on a GPU). P, P Z and dS are rounded to the 16-bit type before
//   their products, as in FlashAttention.
// - float32 and float64 (and the 16-bit types where the tensor-core tiles do not fit the
//   device's shared memory): the scalar kernels below. float64 has no tensor-core path (an
//   H100's FP64 tensor cores are DMMA, which WMMA offers only for 8x8x4 doubles: not done);
//   float32 could use TF32 WMMA under cuda::AllowTf32() but does not yet.
//
// Scalar kernels: each thread owns one row: a query row in the forward and in the dq pass of
// the backward, a key row in the dk/dv pass. A block's rows keep their own operand and
// accumulators in shared memory, laid out [feature][row] so that the threads of a warp touch
// consecutive banks, and the block walks the other side's rows a tile at a time through shared
// memory (loaded once, read by every thread: a broadcast). Everything is computed in OpMath<T>
// (float for the 16-bit types, double for float64) and rounded once on store. The backward is
// FlashAttention-2's: probabilities recomputed from the saved log-sum-exp, D = rowsum(dout *
// out); dq and dk/dv are two passes so that no output is accumulated by two blocks.
//
// Dropout, in both: weight (b, i, j) is kept where Philox's uniform for dropout_counter(b, i, j)
// is >= p (DropoutFactor), the counter and comparison of the CPU kernels, so the same mask bit
// for bit on every backend and path.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <type_traits>
#include <utility>

#include "tensor/base/error.h"
#include "tensor/base/half.h"
#include "tensor/base/philox.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/launch_work.h"
#include "tensor/kernels/internal/elementwise_math.h"
#include "tools/cuda/device_counters.h"

namespace tandem {
namespace cuda {
namespace {

// Rows of the other side per shared-memory tile; a thread's scores of one tile live in
// registers.
constexpr int kTile = 16;
// The kernels' __launch_bounds__(kMaxRowsPerBlock, 1): shared memory, not registers, limits
// how many blocks an SM holds, so ptxas may give each thread what it needs (the forward's
// scores and Philox state spilled at the 64 or 128 registers ptxas picks by default).
constexpr int kMaxRowsPerBlock = 64;
// Dynamic shared memory every kernel may use; beyond it up to the device's opt-in limit
// (cudaDevAttrMaxSharedMemoryPerBlockOptin, 227 KiB on sm_90) only after
// cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes).
constexpr size_t kSharedBytesWithoutOptIn = 48 * 1024;

// A block's dynamic shared memory: `rows` rows of `row_elements` and one tile of
// `tile_elements` (the other side's kTile rows and what goes with them), in M.
struct SharedLayout {
  int64_t row_elements;
  int64_t tile_elements;
  size_t element_bytes;
  size_t Bytes(int rows) const {
    return static_cast<size_t>(rows * row_elements + tile_elements) * element_bytes;
  }
};

// The current device's opt-in limit, read once per device: cudaDeviceGetAttribute is a driver
// call, and attention runs in every layer of every step.
size_t SharedOptInBytes(int logical_device) {
  static std::mutex mutex;
  static std::map<int, size_t>* limits = new std::map<int, size_t>;
  int physical = 0;
  TANDEM_CUDA_CHECK(cudaGetDevice(&physical), logical_device);
  std::lock_guard<std::mutex> lock(mutex);
  const auto it = limits->find(physical);
  if (it != limits->end()) return it->second;
  int bytes = 0;
  TANDEM_CUDA_CHECK(
      cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, physical),
      logical_device);
  // The default is every block's, whatever the attribute says (older devices have no opt-in).
  const size_t limit = std::max(static_cast<size_t>(bytes), kSharedBytesWithoutOptIn);
  limits->emplace(physical, limit);
  return limit;
}

// Lets `kernel` launch with `bytes` of dynamic shared memory on the current device. A GPU
// refuses (cudaErrorInvalidValue) a launch past 48 KiB unless the kernel opted in to at least
// that much on that device; the setting is remembered per device and kernel so that the driver
// is asked once per larger size, not at every launch.
void OptInSharedMemory(const void* kernel, size_t bytes, int logical_device) {
  if (bytes <= kSharedBytesWithoutOptIn) return;
  static std::mutex mutex;
  static std::map<std::pair<int, const void*>, size_t>* opted =
      new std::map<std::pair<int, const void*>, size_t>;
  int physical = 0;
  TANDEM_CUDA_CHECK(cudaGetDevice(&physical), logical_device);
  std::lock_guard<std::mutex> lock(mutex);
  size_t& current = (*opted)[{physical, kernel}];
  if (current >= bytes) return;
  TANDEM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(bytes)),
                    logical_device);
  current = bytes;
}

// The most rows per block (a power of two up to kMaxRowsPerBlock: fewer rows, smaller blocks,
// is the tiling that lets large heads fit a device) whose layout fits the device's opt-in limit,
// after opting `kernel` in to its size. Throws when not even one row fits.
int PlanRows(const char* what, const void* kernel, const SharedLayout& layout,
             const AttentionGeometry& g, DType dtype, int logical_device) {
  const size_t limit = SharedOptInBytes(logical_device);
  int rows = kMaxRowsPerBlock;
  while (rows > 1 && layout.Bytes(rows) > limit) rows /= 2;
  TANDEM_CHECK(layout.Bytes(rows) <= limit, "CUDA ", what, ": head size ", g.head_dim, " (values ",
               g.value_dim, ") in ", DTypeName(dtype), " needs ", layout.Bytes(1),
               " bytes of shared memory per block even with one row per block, but cuda:",
               logical_device, " allows at most ", limit,
               " (cudaDevAttrMaxSharedMemoryPerBlockOptin); use smaller heads, a 16-bit or "
               "float32 dtype, or a device with more shared memory per block");
  OptInSharedMemory(kernel, layout.Bytes(rows), logical_device);
  return rows;
}

template <typename M>
__device__ __forceinline__ M Larger(M a, M b) {
  return a > b ? a : b;
}
__device__ __forceinline__ int64_t Smaller(int64_t a, int64_t b) { return a < b ? a : b; }

// The score of query i and key j before the softmax, or -inf where the key is excluded.
template <typename T, typename M>
__device__ __forceinline__ M MaskedScore(const AttentionGeometry& g, const T* mask, int64_t b,
                                         int64_t i, int64_t j, M dot) {
  if (g.causal && j > i) return -INFINITY;
  M s = dot * static_cast<M>(g.scale);
  if (mask != nullptr) s += static_cast<M>(mask[g.mask_offset(b, i) + j]);
  return s;
}

// Weight (b, i, j)'s dropout factor (Geometry's dropout_*): 1 / (1 - p) where kept, else 0;
// the same counter and comparison as the CPU kernels, so the same mask bit for bit.
template <typename M>
__device__ __forceinline__ M DropoutFactor(const AttentionGeometry& g, int64_t b, int64_t i,
                                           int64_t j) {
  const float u = philox::Uniform(g.dropout_seed, g.dropout_counter(b, i, j));
  return static_cast<double>(u) >= g.dropout_p ? static_cast<M>(1.0 / (1.0 - g.dropout_p)) : M(0);
}

// Copies `rows` rows of `width` elements, `step` elements apart from `src` on, into shared
// [row][width] as M, zero past `valid` rows; every thread of the block takes part.
template <typename T, typename M>
__device__ void LoadTile(M* dst, const T* src, int64_t step, int rows, int valid, int64_t width) {
  for (int64_t x = threadIdx.x; x < rows * width; x += blockDim.x) {
    const int64_t r = x / width;
    dst[x] = r < valid ? static_cast<M>(src[r * step + x % width]) : M(0);
  }
}

// Forward: grid (query blocks, batch), one thread per query row.
template <typename T>
__global__ void __launch_bounds__(kMaxRowsPerBlock, 1)
    AttentionForwardKernel(AttentionGeometry g, const T* q, const T* k, const T* v, const T* mask,
                           T* out, OpMath<T>* lse) {
  using M = OpMath<T>;
  extern __shared__ unsigned char shared_raw[];
  M* shared = reinterpret_cast<M*>(shared_raw);
  const int rows = blockDim.x, r = threadIdx.x;
  const int64_t e = g.head_dim, ev = g.value_dim, l = g.query_len, s = g.key_len;
  M* q_rows = shared;              // [e][rows]
  M* acc = q_rows + e * rows;      // [ev][rows]
  M* k_tile = acc + ev * rows;     // [kTile][e]
  M* v_tile = k_tile + kTile * e;  // [kTile][ev]
  const int64_t b = blockIdx.y, i0 = static_cast<int64_t>(blockIdx.x) * rows, i = i0 + r;
  const bool active = i < l;
  for (int64_t c = 0; c < e; ++c)
    q_rows[c * rows + r] = active ? static_cast<M>(q[g.q_row(b, i) + c]) : M(0);
  for (int64_t c = 0; c < ev; ++c) acc[c * rows + r] = M(0);
  M row_max = -INFINITY, row_sum = 0;
  const int64_t key_end = g.causal ? Smaller(s, i0 + rows) : s;
  for (int64_t j0 = 0; j0 < key_end; j0 += kTile) {
    const int valid = static_cast<int>(Smaller(kTile, key_end - j0));
    __syncthreads();  // the previous tile is no longer read
    LoadTile(k_tile, k + g.k_row(b, j0), g.row_step(g.k_rows, e), kTile, valid, e);
    LoadTile(v_tile, v + g.v_row(b, j0), g.row_step(g.v_rows, ev), kTile, valid, ev);
    __syncthreads();
    if (!active) continue;
    // The tile's dropout mask as bits, drawn before the scores fill the registers: Philox
    // beside sixteen live scores made ptxas spill.
    uint32_t kept = 0;
    if (g.dropout_p > 0) {
      for (int t = 0; t < valid; ++t)
        kept |= uint32_t{DropoutFactor<M>(g, b, i, j0 + t) != M(0)} << t;
    }
    M score[kTile];
    M tile_max = -INFINITY;
#pragma unroll
    for (int t = 0; t < kTile; ++t) {
      score[t] = -INFINITY;
      if (t < valid) {
        M dot = 0;
        for (int64_t c = 0; c < e; ++c) dot += q_rows[c * rows + r] * k_tile[t * e + c];
        score[t] = MaskedScore(g, mask, b, i, j0 + t, dot);
        tile_max = Larger(tile_max, score[t]);
      }
    }
    const M new_max = Larger(row_max, tile_max);
    if (new_max == -INFINITY) continue;  // nothing attended yet
    const M correction = math::Exp(row_max - new_max);
    M sum = 0;
#pragma unroll
    for (int t = 0; t < kTile; ++t) {
      score[t] = math::Exp(score[t] - new_max);
      sum += score[t];
    }
    row_sum = row_sum * correction + sum;
    row_max = new_max;
    if (g.dropout_p > 0) {
      // After the running sum took the undropped weights: only v's product sees the dropout.
      // Unrolled with a constant bound: a runtime index would put score[] in local memory.
      const M keep_scale = static_cast<M>(1.0 / (1.0 - g.dropout_p));
#pragma unroll
      for (int t = 0; t < kTile; ++t) score[t] *= (kept >> t & 1u) != 0 ? keep_scale : M(0);
    }
    for (int64_t c = 0; c < ev; ++c) {
      M a = acc[c * rows + r] * correction;
#pragma unroll
      for (int t = 0; t < kTile; ++t) a += score[t] * v_tile[t * ev + c];
      acc[c * rows + r] = a;
    }
  }
  if (!active) return;
  // A row that attended nothing has sum 0: 0 * inf gives NaN outputs, as PyTorch's.
  const M inv = M(1) / row_sum;
  for (int64_t c = 0; c < ev; ++c)
    out[g.out_row(b, i) + c] = static_cast<T>(acc[c * rows + r] * inv);
  lse[b * l + i] = row_max + math::Log(row_sum);
}

// Backward pass 1: grid (query blocks, batch), one thread per query row: D_i = dout_i . out_i
// (written to `delta` for pass 2) and dq_i = scale * sum_j p_ij (dout_i . v_j - D_i) k_j.
template <typename T>
__global__ void __launch_bounds__(kMaxRowsPerBlock, 1)
    AttentionBackwardQueryKernel(AttentionGeometry g, const T* q, const T* k, const T* v,
                                 const T* mask, const T* out, const T* dout, const OpMath<T>* lse,
                                 OpMath<T>* delta, T* dq) {
  using M = OpMath<T>;
  extern __shared__ unsigned char shared_raw[];
  M* shared = reinterpret_cast<M*>(shared_raw);
  const int rows = blockDim.x, r = threadIdx.x;
  const int64_t e = g.head_dim, ev = g.value_dim, l = g.query_len, s = g.key_len;
  M* q_rows = shared;               // [e][rows]
  M* do_rows = q_rows + e * rows;   // [ev][rows]
  M* dq_acc = do_rows + ev * rows;  // [e][rows]
  M* k_tile = dq_acc + e * rows;    // [kTile][e]
  M* v_tile = k_tile + kTile * e;   // [kTile][ev]
  const int64_t b = blockIdx.y, i0 = static_cast<int64_t>(blockIdx.x) * rows, i = i0 + r;
  const bool active = i < l;
  M d = 0;
  for (int64_t c = 0; c < e; ++c) {
    q_rows[c * rows + r] = active ? static_cast<M>(q[g.q_row(b, i) + c]) : M(0);
    dq_acc[c * rows + r] = M(0);
  }
  for (int64_t c = 0; c < ev; ++c) {
    const M x = active ? static_cast<M>(dout[g.dout_row(b, i) + c]) : M(0);
    do_rows[c * rows + r] = x;
    if (active) d += x * static_cast<M>(out[g.out_row(b, i) + c]);
  }
  const M row_lse = active ? lse[b * l + i] : M(0);
  if (active) delta[b * l + i] = d;
  const int64_t key_end = g.causal ? Smaller(s, i0 + rows) : s;
  for (int64_t j0 = 0; j0 < key_end; j0 += kTile) {
    const int valid = static_cast<int>(Smaller(kTile, key_end - j0));
    __syncthreads();
    LoadTile(k_tile, k + g.k_row(b, j0), g.row_step(g.k_rows, e), kTile, valid, e);
    LoadTile(v_tile, v + g.v_row(b, j0), g.row_step(g.v_rows, ev), kTile, valid, ev);
    __syncthreads();
    if (!active) continue;
    for (int t = 0; t < valid; ++t) {
      M dot = 0, dp = 0;
      for (int64_t c = 0; c < e; ++c) dot += q_rows[c * rows + r] * k_tile[t * e + c];
      const M p = math::Exp(MaskedScore(g, mask, b, i, j0 + t, dot) - row_lse);
      for (int64_t c = 0; c < ev; ++c) dp += do_rows[c * rows + r] * v_tile[t * ev + c];
      // With dropout, dout . v_j is the gradient of the dropped weight p z: z (dout . v_j) is
      // p's, and D = dout . out already sums p z (dout . v_j) (FlashAttention-2's backward).
      if (g.dropout_p > 0) dp *= DropoutFactor<M>(g, b, i, j0 + t);
      const M ds = p * (dp - d) * static_cast<M>(g.scale);
      for (int64_t c = 0; c < e; ++c) dq_acc[c * rows + r] += ds * k_tile[t * e + c];
    }
  }
  if (!active) return;
  for (int64_t c = 0; c < e; ++c) dq[g.dq_row(b, i) + c] = static_cast<T>(dq_acc[c * rows + r]);
}

// Backward pass 2: grid (key blocks, batch), one thread per key row: dv_j = sum_i p_ij dout_i,
// dk_j = scale * sum_i p_ij (dout_i . v_j - D_i) q_i.
template <typename T>
__global__ void __launch_bounds__(kMaxRowsPerBlock, 1)
    AttentionBackwardKeyKernel(AttentionGeometry g, const T* q, const T* k, const T* v,
                               const T* mask, const T* dout, const OpMath<T>* lse,
                               const OpMath<T>* delta, T* dk, T* dv) {
  using M = OpMath<T>;
  extern __shared__ unsigned char shared_raw[];
  M* shared = reinterpret_cast<M*>(shared_raw);
  const int rows = blockDim.x, r = threadIdx.x;
  const int64_t e = g.head_dim, ev = g.value_dim, l = g.query_len, s = g.key_len;
  M* k_rows = shared;                  // [e][rows]
  M* v_rows = k_rows + e * rows;       // [ev][rows]
  M* dk_acc = v_rows + ev * rows;      // [e][rows]
  M* dv_acc = dk_acc + e * rows;       // [ev][rows]
  M* q_tile = dv_acc + ev * rows;      // [kTile][e]
  M* do_tile = q_tile + kTile * e;     // [kTile][ev]
  M* lse_tile = do_tile + kTile * ev;  // [kTile]
  M* delta_tile = lse_tile + kTile;    // [kTile]
  const int64_t b = blockIdx.y, j0 = static_cast<int64_t>(blockIdx.x) * rows, j = j0 + r;
  const bool active = j < s;
  for (int64_t c = 0; c < e; ++c) {
    k_rows[c * rows + r] = active ? static_cast<M>(k[g.k_row(b, j) + c]) : M(0);
    dk_acc[c * rows + r] = M(0);
  }
  for (int64_t c = 0; c < ev; ++c) {
    v_rows[c * rows + r] = active ? static_cast<M>(v[g.v_row(b, j) + c]) : M(0);
    dv_acc[c * rows + r] = M(0);
  }
  // Causal: queries before the block's first key attend none of its keys.
  const int64_t query_begin = g.causal ? Smaller(j0, l) : 0;
  for (int64_t t0 = query_begin; t0 < l; t0 += kTile) {
    const int valid = static_cast<int>(Smaller(kTile, l - t0));
    __syncthreads();
    LoadTile(q_tile, q + g.q_row(b, t0), g.row_step(g.q_rows, e), kTile, valid, e);
    LoadTile(do_tile, dout + g.dout_row(b, t0), g.row_step(g.dout_rows, ev), kTile, valid, ev);
    // A loop, not the first kTile threads: a block of large heads may have fewer rows.
    for (int x = threadIdx.x; x < kTile; x += blockDim.x) {
      lse_tile[x] = x < valid ? lse[b * l + t0 + x] : M(0);
      delta_tile[x] = x < valid ? delta[b * l + t0 + x] : M(0);
    }
    __syncthreads();
    if (!active) continue;
    for (int t = 0; t < valid; ++t) {
      const int64_t i = t0 + t;
      if (g.causal && j > i) continue;
      M dot = 0, dp = 0;
      for (int64_t c = 0; c < e; ++c) dot += k_rows[c * rows + r] * q_tile[t * e + c];
      const M p = math::Exp(MaskedScore(g, mask, b, i, j, dot) - lse_tile[t]);
      const M z = g.dropout_p > 0 ? DropoutFactor<M>(g, b, i, j) : M(1);
      const M pz = p * z;
      for (int64_t c = 0; c < ev; ++c) {
        const M o = do_tile[t * ev + c];
        dp += o * v_rows[c * rows + r];
        dv_acc[c * rows + r] += pz * o;
      }
      const M ds = p * (z * dp - delta_tile[t]) * static_cast<M>(g.scale);
      for (int64_t c = 0; c < e; ++c) dk_acc[c * rows + r] += ds * q_tile[t * e + c];
    }
  }
  if (!active) return;
  for (int64_t c = 0; c < e; ++c) dk[g.dk_row(b, j) + c] = static_cast<T>(dk_acc[c * rows + r]);
  for (int64_t c = 0; c < ev; ++c) dv[g.dv_row(b, j) + c] = static_cast<T>(dv_acc[c * rows + r]);
}

// ---- Tensor cores (bfloat16 and float16): FlashAttention-2's forward on WMMA tiles ----------

// A block is kTcWarps warps of 16 query rows each; the block walks the keys kTcKeys at a time
// (K and V tiles in shared memory, shared by its warps). Each warp computes its 16 x kTcKeys
// scores on tensor cores (S = Q K^T, float accumulation), updates the running max and sum of its
// rows (one lane a row) and rounds the probabilities to T, rescales its rows of the float output
// accumulator in shared memory, and adds P V on tensor cores. WMMA's element-to-lane mapping is
// unspecified, so every row-dependent step goes through shared memory, never through a
// fragment's x[]. Head and value sizes are padded with zeros to multiples of 16 (WMMA's k).
constexpr int kTcWarps = 4;
constexpr int kTcRows = 16 * kTcWarps;
constexpr int kTcKeys = 32;
// Larger heads take the scalar path (their tiles would not fit an H100's shared memory).
constexpr int64_t kTensorCoreMaxHead = 256;
// Row padding of the shared tiles (16 bytes: rows start in other banks; WMMA needs ldm to be a
// multiple of 16 bytes and tile pointers 32-byte aligned, which 16-row steps keep).
constexpr int kSkew16 = 8, kSkew32 = 4;

template <typename T>
struct TensorCoreType;
template <>
struct TensorCoreType<Half> {
  using type = __half;
  __device__ static __half Round(float x) { return __float2half(x); }
};
template <>
struct TensorCoreType<BFloat16> {
  using type = __nv_bfloat16;
  __device__ static __nv_bfloat16 Round(float x) { return __float2bfloat16(x); }
};

int RoundUp16(int64_t x) { return static_cast<int>((x + 15) / 16 * 16); }

// Byte offsets of the tensor-core forward's shared memory: q [kTcRows][ld_qk] and k
// [kTcKeys][ld_qk] and v [kTcKeys][ld_v] in T, the scores [kTcRows][ld_s] and the output
// accumulator [kTcRows][ld_o] in float, the probabilities [kTcRows][ld_p] in T, and one float
// per row (the rescaling factor, then 1 / sum).
struct TensorCoreLayout {
  int e_pad, ev_pad, ld_qk, ld_v, ld_s, ld_p, ld_o;
  size_t q, k, v, s, p, o, row, bytes;
};

TensorCoreLayout PlanTensorCore(int64_t e, int64_t ev) {
  TensorCoreLayout t;
  t.e_pad = RoundUp16(e);
  t.ev_pad = RoundUp16(ev);
  t.ld_qk = t.e_pad + kSkew16;
  t.ld_v = t.ev_pad + kSkew16;
  t.ld_s = kTcKeys + kSkew32;
  t.ld_p = kTcKeys + kSkew16;
  t.ld_o = t.ev_pad + kSkew32;
  size_t at = 0;
  const auto take = [&at](size_t bytes) {
    const size_t start = at;
    at += (bytes + 127) / 128 * 128;
    return start;
  };
  t.q = take(size_t{kTcRows} * t.ld_qk * 2);
  t.k = take(size_t{kTcKeys} * t.ld_qk * 2);
  t.v = take(size_t{kTcKeys} * t.ld_v * 2);
  t.s = take(size_t{kTcRows} * t.ld_s * 4);
  t.p = take(size_t{kTcRows} * t.ld_p * 2);
  t.o = take(size_t{kTcRows} * t.ld_o * 4);
  t.row = take(size_t{kTcRows} * 4);
  t.bytes = at;
  return t;
}

// Copies `rows` rows of `width` elements, `step` elements apart from `src` on, into shared `dst`
// (row stride `ld`) as W, zero past `valid` rows and past `width` up to `padded` columns.
template <typename T, typename W>
__device__ void LoadPaddedTile(W* dst, int ld, const T* src, int64_t step, int rows, int valid,
                               int64_t width, int padded) {
  const W* from = reinterpret_cast<const W*>(src);
  const W zero = TensorCoreType<T>::Round(0.0f);
  for (int x = threadIdx.x; x < rows * padded; x += blockDim.x) {
    const int r = x / padded, c = x % padded;
    dst[r * ld + c] = r < valid && c < width ? from[r * step + c] : zero;
  }
}

// Forward on tensor cores: grid (query blocks of kTcRows, batch), kTcWarps warps.
template <typename T>
__global__ void __launch_bounds__(kTcWarps * 32)
    AttentionForwardTensorCoreKernel(AttentionGeometry g, TensorCoreLayout t, const T* q,
                                     const T* k, const T* v, const T* mask, T* out, float* lse) {
  namespace wmma = nvcuda::wmma;
  using W = typename TensorCoreType<T>::type;
  extern __shared__ unsigned char shared_raw[];
  W* q_s = reinterpret_cast<W*>(shared_raw + t.q);
  W* k_s = reinterpret_cast<W*>(shared_raw + t.k);
  W* v_s = reinterpret_cast<W*>(shared_raw + t.v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* s_w = reinterpret_cast<float*>(shared_raw + t.s) + warp * 16 * t.ld_s;
  W* p_w = reinterpret_cast<W*>(shared_raw + t.p) + warp * 16 * t.ld_p;
  float* o_w = reinterpret_cast<float*>(shared_raw + t.o) + warp * 16 * t.ld_o;
  float* row_w = reinterpret_cast<float*>(shared_raw + t.row) + warp * 16;
  const int64_t e = g.head_dim, ev = g.value_dim, l = g.query_len, s = g.key_len;
  const int64_t b = blockIdx.y, i0 = static_cast<int64_t>(blockIdx.x) * kTcRows;
  const int64_t warp_i0 = i0 + warp * 16;
  LoadPaddedTile(q_s, t.ld_qk, q + g.q_row(b, i0), g.row_step(g.q_rows, e), kTcRows,
                 static_cast<int>(Smaller(kTcRows, l - i0)), e, t.e_pad);
  for (int x = lane; x < 16 * t.ev_pad; x += 32) o_w[(x / t.ev_pad) * t.ld_o + x % t.ev_pad] = 0;
  // Lane r < 16 owns row warp_i0 + r's running max and sum.
  const int64_t i = warp_i0 + lane;
  float row_max = -INFINITY, row_sum = 0;
  const int64_t key_end = g.causal ? Smaller(s, i0 + kTcRows) : s;
  // The head's first rows and the steps between rows, once (their offsets divide by heads).
  const T* k_head = k + g.k_row(b, 0);
  const T* v_head = v + g.v_row(b, 0);
  const int64_t k_step = g.row_step(g.k_rows, e), v_step = g.row_step(g.v_rows, ev);
  for (int64_t j0 = 0; j0 < key_end; j0 += kTcKeys) {
    const int valid = static_cast<int>(Smaller(kTcKeys, key_end - j0));
    __syncthreads();  // the previous tiles are no longer read
    LoadPaddedTile(k_s, t.ld_qk, k_head + j0 * k_step, k_step, kTcKeys, valid, e, t.e_pad);
    LoadPaddedTile(v_s, t.ld_v, v_head + j0 * v_step, v_step, kTcKeys, valid, ev, t.ev_pad);
    __syncthreads();
    // Causal: a tile whose first key comes after the warp's last query adds nothing to it.
    if (g.causal && j0 > warp_i0 + 15) continue;
    for (int n = 0; n < kTcKeys; n += 16) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.0f);
      for (int c = 0; c < t.e_pad; c += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, W, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, W, wmma::col_major> kt;
        wmma::load_matrix_sync(a, q_s + warp * 16 * t.ld_qk + c, t.ld_qk);
        wmma::load_matrix_sync(kt, k_s + n * t.ld_qk + c, t.ld_qk);
        wmma::mma_sync(acc, a, kt, acc);
      }
      wmma::store_matrix_sync(s_w + n, acc, t.ld_s, wmma::mem_row_major);
    }
    __syncwarp();
    if (lane < 16) {
      float* score = s_w + lane * t.ld_s;
      float tile_max = -INFINITY;
      for (int x = 0; x < kTcKeys; ++x) {
        score[x] = x < valid && i < l ? MaskedScore(g, mask, b, i, j0 + x, score[x]) : -INFINITY;
        tile_max = Larger(tile_max, score[x]);
      }
      const float new_max = Larger(row_max, tile_max);
      // Nothing attended yet: the weights are zero and the accumulator stays zero.
      const float base = new_max == -INFINITY ? 0.0f : new_max;
      const float correction = math::Exp(row_max - base);
      float sum = 0;
      for (int x = 0; x < kTcKeys; ++x) {
        float p = math::Exp(score[x] - base);
        sum += p;
        // After the running sum took the undropped weight: only v's product sees the dropout.
        if (g.dropout_p > 0 && p != 0.0f) p *= DropoutFactor<float>(g, b, i, j0 + x);
        p_w[lane * t.ld_p + x] = TensorCoreType<T>::Round(p);
      }
      row_sum = row_sum * correction + sum;
      row_max = new_max;
      row_w[lane] = correction;
    }
    __syncwarp();
    for (int x = lane; x < 16 * t.ev_pad; x += 32) {
      const int r = x / t.ev_pad;
      o_w[r * t.ld_o + x % t.ev_pad] *= row_w[r];
    }
    __syncwarp();
    for (int n = 0; n < t.ev_pad; n += 16) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::load_matrix_sync(acc, o_w + n, t.ld_o, wmma::mem_row_major);
      for (int x = 0; x < kTcKeys; x += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, W, wmma::row_major> p;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, W, wmma::row_major> vt;
        wmma::load_matrix_sync(p, p_w + x, t.ld_p);
        wmma::load_matrix_sync(vt, v_s + x * t.ld_v + n, t.ld_v);
        wmma::mma_sync(acc, p, vt, acc);
      }
      wmma::store_matrix_sync(o_w + n, acc, t.ld_o, wmma::mem_row_major);
    }
  }
  __syncwarp();
  if (lane < 16) {
    // A row that attended nothing has sum 0: 0 * inf gives NaN outputs, as PyTorch's.
    row_w[lane] = 1.0f / row_sum;
    if (i < l) lse[b * l + i] = row_max + math::Log(row_sum);
  }
  __syncwarp();
  const int64_t out_head = g.out_row(b, 0), out_step = g.row_step(g.out_rows, ev);
  for (int x = lane; x < 16 * ev; x += 32) {
    const int r = static_cast<int>(x / ev), c = static_cast<int>(x % ev);
    if (warp_i0 + r < l)
      out[out_head + (warp_i0 + r) * out_step + c] = T(o_w[r * t.ld_o + c] * row_w[r]);
  }
}

// Byte offsets of the tensor-core backward's shared memory. The block's 16 * warps key rows:
// k and v in T, the dk and dv accumulators in float. The query tile's kTcKeys rows: q and dout
// in T, their log-sum-exp and D = dout . out in float. Per warp: S^T and dP^T in float, (P Z)^T
// and dS^T in T, and a 16 x 16 float tile that carries dq's partial sums to the atomics.
struct TensorCoreBackwardLayout {
  int warps, e_pad, ev_pad, ld_qk, ld_v, ld_dk, ld_dv, ld_s, ld_p;
  size_t k, v, dk, dv, q, dout, lse, delta, warp_bytes, st, dpt, pz, ds, scratch, bytes;
};

TensorCoreBackwardLayout PlanTensorCoreBackward(int64_t e, int64_t ev, int warps) {
  TensorCoreBackwardLayout t;
  t.warps = warps;
  t.e_pad = RoundUp16(e);
  t.ev_pad = RoundUp16(ev);
  t.ld_qk = t.e_pad + kSkew16;
  t.ld_v = t.ev_pad + kSkew16;
  t.ld_dk = t.e_pad + kSkew32;
  t.ld_dv = t.ev_pad + kSkew32;
  t.ld_s = kTcKeys + kSkew32;
  t.ld_p = kTcKeys + kSkew16;
  size_t at = 0;
  const auto take = [&at](size_t bytes) {
    const size_t start = at;
    at += (bytes + 127) / 128 * 128;
    return start;
  };
  const size_t rows = 16 * static_cast<size_t>(warps);
  t.k = take(rows * t.ld_qk * 2);
  t.v = take(rows * t.ld_v * 2);
  t.dk = take(rows * t.ld_dk * 4);
  t.dv = take(rows * t.ld_dv * 4);
  t.q = take(size_t{kTcKeys} * t.ld_qk * 2);
  t.dout = take(size_t{kTcKeys} * t.ld_v * 2);
  t.lse = take(size_t{kTcKeys} * 4);
  t.delta = take(size_t{kTcKeys} * 4);
  const size_t warp_start = at;
  t.st = take(16 * size_t{kTcKeys + kSkew32} * 4) - warp_start;
  t.dpt = take(16 * size_t{kTcKeys + kSkew32} * 4) - warp_start;
  t.pz = take(16 * size_t{kTcKeys + kSkew16} * 2) - warp_start;
  t.ds = take(16 * size_t{kTcKeys + kSkew16} * 2) - warp_start;
  t.scratch = take(16 * size_t{16 + kSkew32} * 4) - warp_start;
  t.warp_bytes = at - warp_start;
  t.bytes = warp_start + warps * t.warp_bytes;
  return t;
}

// Backward on tensor cores (FlashAttention-2's): grid (key blocks of 16 * warps rows, batch).
// The block walks the queries kTcKeys at a time; per (query tile, key rows of a warp) it
// computes S^T = K Q^T and dP^T = V dout^T once, the probabilities P from the saved
// log-sum-exp, and dS = P (Z dP - D) scale; dv += (P Z)^T dout and dk += dS^T q accumulate in
// shared memory, and dq += dS K goes to `dq_accum` (float) by atomics (Note [Attention dq
// atomics]).
template <typename T>
__global__ void __launch_bounds__(kTcWarps * 32)
    AttentionBackwardTensorCoreKernel(AttentionGeometry g, TensorCoreBackwardLayout t, const T* q,
                                      const T* k, const T* v, const T* mask, const T* out,
                                      const T* dout, const float* lse, float* dq_accum, T* dk,
                                      T* dv) {
  namespace wmma = nvcuda::wmma;
  using W = typename TensorCoreType<T>::type;
  extern __shared__ unsigned char shared_raw[];
  W* k_s = reinterpret_cast<W*>(shared_raw + t.k);
  W* v_s = reinterpret_cast<W*>(shared_raw + t.v);
  float* dk_s = reinterpret_cast<float*>(shared_raw + t.dk);
  float* dv_s = reinterpret_cast<float*>(shared_raw + t.dv);
  W* q_t = reinterpret_cast<W*>(shared_raw + t.q);
  W* do_t = reinterpret_cast<W*>(shared_raw + t.dout);
  float* lse_t = reinterpret_cast<float*>(shared_raw + t.lse);
  float* delta_t = reinterpret_cast<float*>(shared_raw + t.delta);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  unsigned char* warp_raw = shared_raw + (t.bytes - (t.warps - warp) * t.warp_bytes);
  float* st_w = reinterpret_cast<float*>(warp_raw + t.st);
  float* dpt_w = reinterpret_cast<float*>(warp_raw + t.dpt);
  W* pz_w = reinterpret_cast<W*>(warp_raw + t.pz);
  W* ds_w = reinterpret_cast<W*>(warp_raw + t.ds);
  float* scratch_w = reinterpret_cast<float*>(warp_raw + t.scratch);
  const int64_t e = g.head_dim, ev = g.value_dim, l = g.query_len, s = g.key_len;
  const int rows = 16 * t.warps;
  const int64_t b = blockIdx.y, j0 = static_cast<int64_t>(blockIdx.x) * rows;
  const int64_t warp_j0 = j0 + warp * 16;
  const int valid_keys = static_cast<int>(Smaller(rows, s - j0));
  LoadPaddedTile(k_s, t.ld_qk, k + g.k_row(b, j0), g.row_step(g.k_rows, e), rows, valid_keys, e,
                 t.e_pad);
  LoadPaddedTile(v_s, t.ld_v, v + g.v_row(b, j0), g.row_step(g.v_rows, ev), rows, valid_keys, ev,
                 t.ev_pad);
  for (int x = threadIdx.x; x < rows * t.e_pad; x += blockDim.x)
    dk_s[(x / t.e_pad) * t.ld_dk + x % t.e_pad] = 0;
  for (int x = threadIdx.x; x < rows * t.ev_pad; x += blockDim.x)
    dv_s[(x / t.ev_pad) * t.ld_dv + x % t.ev_pad] = 0;
  const W* k_w = k_s + warp * 16 * t.ld_qk;
  const W* v_w = v_s + warp * 16 * t.ld_v;
  float* dk_w = dk_s + warp * 16 * t.ld_dk;
  float* dv_w = dv_s + warp * 16 * t.ld_dv;
  // Causal: queries before the block's first key attend none of its keys.
  const int64_t query_begin = g.causal ? Smaller(j0, l) : 0;
  for (int64_t t0 = query_begin; t0 < l; t0 += kTcKeys) {
    const int valid = static_cast<int>(Smaller(kTcKeys, l - t0));
    __syncthreads();  // the previous query tile is no longer read
    LoadPaddedTile(q_t, t.ld_qk, q + g.q_row(b, t0), g.row_step(g.q_rows, e), kTcKeys, valid, e,
                   t.e_pad);
    LoadPaddedTile(do_t, t.ld_v, dout + g.dout_row(b, t0), g.row_step(g.dout_rows, ev), kTcKeys,
                   valid, ev, t.ev_pad);
    // A loop, not the first kTcKeys threads: a block may have fewer.
    for (int x = threadIdx.x; x < kTcKeys; x += blockDim.x) {
      float d = 0;
      if (x < valid) {
        const T* dout_row = dout + g.dout_row(b, t0 + x);
        const T* out_row = out + g.out_row(b, t0 + x);
        for (int64_t c = 0; c < ev; ++c)
          d += static_cast<float>(dout_row[c]) * static_cast<float>(out_row[c]);
      }
      delta_t[x] = d;
      lse_t[x] = x < valid ? lse[b * l + t0 + x] : 0.0f;
    }
    __syncthreads();
    // Causal: the warp's first key comes after the tile's last query.
    if (g.causal && warp_j0 > t0 + kTcKeys - 1) continue;
    if (warp_j0 >= s) continue;
    for (int n = 0; n < kTcKeys; n += 16) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.0f);
      for (int c = 0; c < t.e_pad; c += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, W, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, W, wmma::col_major> qt;
        wmma::load_matrix_sync(a, k_w + c, t.ld_qk);
        wmma::load_matrix_sync(qt, q_t + n * t.ld_qk + c, t.ld_qk);
        wmma::mma_sync(acc, a, qt, acc);
      }
      wmma::store_matrix_sync(st_w + n, acc, t.ld_s, wmma::mem_row_major);
      wmma::fill_fragment(acc, 0.0f);
      for (int c = 0; c < t.ev_pad; c += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, W, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, W, wmma::col_major> dot;
        wmma::load_matrix_sync(a, v_w + c, t.ld_v);
        wmma::load_matrix_sync(dot, do_t + n * t.ld_v + c, t.ld_v);
        wmma::mma_sync(acc, a, dot, acc);
      }
      wmma::store_matrix_sync(dpt_w + n, acc, t.ld_s, wmma::mem_row_major);
    }
    __syncwarp();
    {
      // Lane x takes query t0 + x against the warp's 16 keys.
      const int x = lane;
      const int64_t i = t0 + x;
      for (int r = 0; r < 16; ++r) {
        const int64_t j = warp_j0 + r;
        float pz = 0, ds = 0;
        if (x < valid && j < s && !(g.causal && j > i)) {
          const float p = math::Exp(MaskedScore(g, mask, b, i, j, st_w[r * t.ld_s + x]) - lse_t[x]);
          const float z = g.dropout_p > 0 && p != 0.0f ? DropoutFactor<float>(g, b, i, j) : 1.0f;
          pz = p * z;
          ds = p * (z * dpt_w[r * t.ld_s + x] - delta_t[x]) * static_cast<float>(g.scale);
        }
        pz_w[r * t.ld_p + x] = TensorCoreType<T>::Round(pz);
        ds_w[r * t.ld_p + x] = TensorCoreType<T>::Round(ds);
      }
    }
    __syncwarp();
    for (int n = 0; n < t.ev_pad; n += 16) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::load_matrix_sync(acc, dv_w + n, t.ld_dv, wmma::mem_row_major);
      for (int x = 0; x < kTcKeys; x += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, W, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, W, wmma::row_major> o;
        wmma::load_matrix_sync(a, pz_w + x, t.ld_p);
        wmma::load_matrix_sync(o, do_t + x * t.ld_v + n, t.ld_v);
        wmma::mma_sync(acc, a, o, acc);
      }
      wmma::store_matrix_sync(dv_w + n, acc, t.ld_dv, wmma::mem_row_major);
    }
    for (int n = 0; n < t.e_pad; n += 16) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::load_matrix_sync(acc, dk_w + n, t.ld_dk, wmma::mem_row_major);
      for (int x = 0; x < kTcKeys; x += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, W, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, W, wmma::row_major> qm;
        wmma::load_matrix_sync(a, ds_w + x, t.ld_p);
        wmma::load_matrix_sync(qm, q_t + x * t.ld_qk + n, t.ld_qk);
        wmma::mma_sync(acc, a, qm, acc);
      }
      wmma::store_matrix_sync(dk_w + n, acc, t.ld_dk, wmma::mem_row_major);
    }
    // dq's 16 x 16 tiles: dS (dS^T read column-major) times the warp's 16 rows of k.
    for (int m = 0; m < kTcKeys && m < valid; m += 16) {
      for (int n = 0; n < t.e_pad && n < e; n += 16) {
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
        wmma::fragment<wmma::matrix_a, 16, 16, 16, W, wmma::col_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, W, wmma::row_major> km;
        wmma::fill_fragment(acc, 0.0f);
        wmma::load_matrix_sync(a, ds_w + m, t.ld_p);
        wmma::load_matrix_sync(km, k_w + n, t.ld_qk);
        wmma::mma_sync(acc, a, km, acc);
        wmma::store_matrix_sync(scratch_w, acc, 16 + kSkew32, wmma::mem_row_major);
        __syncwarp();
        for (int x = lane; x < 256; x += 32) {
          const int r = x / 16, c = x % 16;
          if (m + r < valid && n + c < e) {
            atomicAdd(&dq_accum[(b * l + t0 + m + r) * e + n + c],
                      scratch_w[r * (16 + kSkew32) + c]);
          }
        }
        __syncwarp();  // the scratch tile is read before the next store
      }
    }
  }
  __syncthreads();
  for (int x = threadIdx.x; x < rows * e; x += blockDim.x) {
    const int r = static_cast<int>(x / e), c = static_cast<int>(x % e);
    if (j0 + r < s) dk[g.dk_row(b, j0 + r) + c] = T(dk_s[r * t.ld_dk + c]);
  }
  for (int x = threadIdx.x; x < rows * ev; x += blockDim.x) {
    const int r = static_cast<int>(x / ev), c = static_cast<int>(x % ev);
    if (j0 + r < s) dv[g.dv_row(b, j0 + r) + c] = T(dv_s[r * t.ld_dv + c]);
  }
}

// dq = dq_accum ([batch, query_len, head_dim], contiguous) rounded to T, where g.dq_rows puts it.
template <typename T>
__global__ void RoundAccumulatedKernel(AttentionGeometry g, const float* accum, T* dq, int64_t n) {
  for (int64_t x = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; x < n;
       x += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = x / g.head_dim;
    dq[g.dq_row(row / g.query_len, row % g.query_len) + x % g.head_dim] = T(accum[x]);
  }
}

// Note [Attention dq atomics]: in the tensor-core backward each block owns its key rows (dk and
// dv are its own sums, written once) but every block adds to every query's dq: FlashAttention-2
// adds them by float32 atomics into a zeroed buffer and rounds that to T in a small second
// kernel, and so does this. The alternative, a second pass over the keys per query block, would
// recompute S and dP a second time, which is what the tensor-core kernels are here to avoid. The
// price: the order of the float additions depends on the GPU's scheduling, so dq is not bitwise
// reproducible from run to run on a GPU (within float rounding of the same sum); under cudasim,
// whose blocks run one at a time in a seeded thread order, it is for a given TANDEM_CUDASIM_SEED.

// ---- Declared work (DeclareKernelWork, tools/cuda/device_counters.h) ---------------------
// Each launch declares what its loops compute and the device memory it moves, for the roofline
// of //tools/bench:train_step, which sets these launches against the ideal causal attention
// (GptGemmAndAttentionRoofline: the pairs on or below the diagonal only).
// - FLOPs: 2 per multiply-add of the products, over the tiles the kernels visit. A tile that
//   reaches the causal diagonal is computed whole (its scores above the diagonal are masked
//   after the product), so a causal launch counts more than half of the full count; the tensor
//   cores also multiply their zero padding (head sizes up to multiples of 16, ragged tiles) and
//   run the forward's warps past the last query, which take tensor-core time all the same. The
//   softmax's exps, rescaling and masks (a few operations a score, against 2 (E + Ev) in the
//   products, on other units than the tensor cores) are left out.
// - Bytes: each operand's elements once (strided rows are read in place: elements, not strides).
//   Every block re-reads the other side's rows a tile at a time; those re-reads are counted as
//   L2 hits (the blocks of one head are adjacent in the grid and run together), i.e. once.

int64_t RoundUpTo(int64_t x, int64_t multiple) { return (x + multiple - 1) / multiple * multiple; }

// `rows` rows of `width` elements in every head, in bytes.
double OperandBytes(const AttentionGeometry& g, int64_t rows, int64_t width, size_t element_bytes) {
  return static_cast<double>(g.batch) * rows * width * element_bytes;
}

// The (query, key) pairs a causal attention attends: query i the keys 0..i.
double CausalPairs(int64_t l, int64_t s) {
  const double m = static_cast<double>(std::min(l, s));
  return m * (m + 1) / 2 + static_cast<double>(l - std::min(l, s)) * s;
}

// The mask's distinct elements that the scores read, in bytes: none above the causal diagonal
// (MaskedScore does not read them), one copy along a broadcast (zero) stride.
double MaskBytes(const AttentionGeometry& g, const void* mask, size_t element_bytes) {
  if (mask == nullptr) return 0;
  const int64_t l = g.query_len, s = g.key_len;
  const double groups =
      (g.mask_batch_stride == 0
           ? 1.0
           : static_cast<double>(RoundUpTo(g.batch, g.mask_heads) / g.mask_heads)) *
      (g.mask_head_stride == 0 ? 1.0 : static_cast<double>(std::min(g.mask_heads, g.batch)));
  const double per_group = g.mask_row_stride == 0
                               ? static_cast<double>(g.causal ? std::min(l, s) : s)
                               : (g.causal ? CausalPairs(l, s) : static_cast<double>(l) * s);
  return groups * per_group * element_bytes;
}

// The keys a forward (or the dq pass) with blocks of `rows` queries reads: under the causal
// mask the last block stops at its last row.
int64_t KeysRead(const AttentionGeometry& g, int64_t rows) {
  return g.causal ? std::min(g.key_len, RoundUpTo(g.query_len, rows)) : g.key_len;
}

// A forward's: q read and out and the log-sum-exp written, once; k and v up to `keys`, once.
double ForwardBytes(const AttentionGeometry& g, int64_t keys, const void* mask,
                    size_t element_bytes, size_t lse_bytes) {
  return OperandBytes(g, g.query_len, g.head_dim + g.value_dim, element_bytes) +
         OperandBytes(g, g.query_len, 1, lse_bytes) +
         OperandBytes(g, keys, g.head_dim + g.value_dim, element_bytes) +
         MaskBytes(g, mask, element_bytes);
}

template <typename T>
constexpr const char* TensorCoreMath() {
  return std::is_same_v<T, BFloat16> ? "bf16" : "fp16";
}

// The tensor-core forward: per warp of 16 queries and tile of kTcKeys keys it visits, S = Q K^T
// over the padded head size and O += P V over the padded value size.
double TensorCoreForwardFlops(const AttentionGeometry& g, const TensorCoreLayout& t) {
  int64_t warp_tiles = 0;
  for (int64_t i0 = 0; i0 < g.query_len; i0 += kTcRows) {
    const int64_t key_end = g.causal ? std::min(g.key_len, i0 + kTcRows) : g.key_len;
    for (int64_t warp_i0 = i0; warp_i0 < i0 + kTcRows; warp_i0 += 16) {
      // Causal: the warp skips the tiles that start after its last query.
      const int64_t end = g.causal ? std::min(key_end, warp_i0 + 16) : key_end;
      warp_tiles += (end + kTcKeys - 1) / kTcKeys;
    }
  }
  return 2.0 * g.batch * warp_tiles * 16 * kTcKeys * (t.e_pad + t.ev_pad);
}

// The tensor-core backward: per warp of 16 keys and tile of kTcKeys queries it visits, S^T =
// K Q^T, dP^T = V dout^T, dv += (P Z)^T dout and dk += dS^T q over whole tiles, and dq += dS K
// over the tile's 16-query steps (the last one ragged).
double TensorCoreBackwardFlops(const AttentionGeometry& g, const TensorCoreBackwardLayout& t) {
  const int64_t l = g.query_len, rows = 16 * t.warps;
  double per_head = 0;
  for (int64_t j0 = 0; j0 < g.key_len; j0 += rows) {
    const int64_t query_begin = g.causal ? std::min(j0, l) : 0;
    const int64_t tiles = (l - query_begin + kTcKeys - 1) / kTcKeys;
    for (int64_t warp_j0 = j0; warp_j0 < std::min(j0 + rows, g.key_len); warp_j0 += 16) {
      // Causal: the warp skips the leading tiles whose last query comes before its first key.
      const int64_t skipped = g.causal ? std::min(tiles, (warp_j0 - query_begin) / kTcKeys) : 0;
      const int64_t visited = tiles - skipped;
      if (visited == 0) continue;
      const int64_t last_valid = l - (query_begin + (tiles - 1) * kTcKeys);
      per_head += 2.0 * 16 *
                  (visited * 2 * kTcKeys * (t.e_pad + t.ev_pad) +
                   ((visited - 1) * kTcKeys + RoundUpTo(last_valid, 16)) * t.e_pad);
    }
  }
  return g.batch * per_head;
}

// The sum of per_block(queries, key_end) over the blocks of `rows` queries, for every head: a
// block's queries, and the keys it reaches (under the causal mask, up to its last query's).
template <typename PerBlock>
double OverQueryBlocks(const AttentionGeometry& g, int rows, PerBlock per_block) {
  double per_head = 0;
  for (int64_t i0 = 0; i0 < g.query_len; i0 += rows) {
    const int64_t key_end = g.causal ? std::min(g.key_len, i0 + rows) : g.key_len;
    per_head += per_block(static_cast<double>(std::min<int64_t>(rows, g.query_len - i0)), key_end);
  }
  return g.batch * per_head;
}

// The scalar forward, blocks of `rows` queries: each query's dot products with the keys up to
// its block's end, and P V over whole kTile tiles.
double ScalarForwardFlops(const AttentionGeometry& g, int rows) {
  return OverQueryBlocks(g, rows, [&](double queries, int64_t key_end) {
    return 2.0 * queries * (g.head_dim * key_end + g.value_dim * RoundUpTo(key_end, kTile));
  });
}

// The scalar backward's dq pass: each query's D = dout . out, then per key up to its block's
// end S, dP and dq's term (S and dP are computed again in the dk/dv pass).
double ScalarBackwardQueryFlops(const AttentionGeometry& g, int rows) {
  return OverQueryBlocks(g, rows, [&](double queries, int64_t key_end) {
    return 2.0 * queries * (g.value_dim + key_end * (2 * g.head_dim + g.value_dim));
  });
}

// The scalar backward's dk/dv pass: S, dP, dv's and dk's terms per attended pair (it skips the
// pairs above the causal diagonal one by one).
double ScalarBackwardKeyFlops(const AttentionGeometry& g) {
  const double pairs =
      g.causal ? CausalPairs(g.query_len, g.key_len) : static_cast<double>(g.query_len) * g.key_len;
  return 2.0 * g.batch * pairs * (2 * g.head_dim + 2 * g.value_dim);
}

dim3 Grid(int64_t rows, int per_block, int64_t batch, int device) {
  const int64_t blocks = (rows + per_block - 1) / per_block;
  TANDEM_CHECK(batch <= 65535, "CUDA attention on logical device ", device, ": ", batch,
               " heads exceed the grid's 65535; split the batch");
  return dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(batch));
}

// The tensor-core backward when its tiles fit the device (with 4 warps, else 2 or 1 per block);
// false, having launched nothing, when they do not (the scalar kernels take over).
template <typename T>
bool LaunchAttentionBackwardTensorCore(const LaunchContext& context, const AttentionGeometry& g,
                                       const void* q, const void* k, const void* v,
                                       const void* mask, const void* out, const void* dout,
                                       const void* logsumexp, void* dq, void* dk, void* dv) {
  if (g.head_dim > kTensorCoreMaxHead || g.value_dim > kTensorCoreMaxHead) return false;
  const size_t limit = SharedOptInBytes(context.device);
  int warps = kTcWarps;
  while (warps > 1 && PlanTensorCoreBackward(g.head_dim, g.value_dim, warps).bytes > limit) {
    warps /= 2;
  }
  const TensorCoreBackwardLayout t = PlanTensorCoreBackward(g.head_dim, g.value_dim, warps);
  if (t.bytes > limit) return false;
  const int64_t dq_elements = g.batch * g.query_len * g.head_dim;
  // Freed when this function returns, but only work queued later on this stream can reuse it.
  std::shared_ptr<void> accum_memory =
      context.workspace->Allocate(static_cast<size_t>(dq_elements) * sizeof(float));
  float* accum = static_cast<float*>(accum_memory.get());
  TANDEM_CUDA_CHECK(cudaMemsetAsync(accum, 0, dq_elements * sizeof(float), context.stream),
                    context.device);
  const void* kernel = reinterpret_cast<const void*>(&AttentionBackwardTensorCoreKernel<T>);
  OptInSharedMemory(kernel, t.bytes, context.device);
  const dim3 grid = Grid(g.key_len, 16 * warps, g.batch, context.device);
  const int64_t e = g.head_dim, ev = g.value_dim, l = g.query_len, s = g.key_len;
  internal::RecordLaunchWork("AttentionBackwardTensorCoreKernel", int64_t{grid.x} * grid.y,
                             g.batch * (l * (e + 2 * ev) + s * (e + ev)));
  AttentionBackwardTensorCoreKernel<T><<<grid, 32 * warps, t.bytes, context.stream>>>(
      g, t, static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
      static_cast<const T*>(mask), static_cast<const T*>(out), static_cast<const T*>(dout),
      static_cast<const float*>(logsumexp), accum, static_cast<T*>(dk), static_cast<T*>(dv));
  TANDEM_CUDA_CHECK_LAUNCH(context.device);
  // q, out and dout (D = dout . out, which every key block recomputes from L2) and the
  // log-sum-exp read; k and v read and dk and dv written once; the float32 dq accumulator read
  // and written by the atomics, and zeroed by the memset above, which the counters do not see
  // as a launch of its own.
  DeclareKernelWork(TensorCoreBackwardFlops(g, t),
                    OperandBytes(g, l, e + 2 * ev, sizeof(T)) +
                        OperandBytes(g, l, 1, sizeof(float)) +
                        OperandBytes(g, s, 2 * (e + ev), sizeof(T)) +
                        MaskBytes(g, mask, sizeof(T)) + 3 * OperandBytes(g, l, e, sizeof(float)),
                    TensorCoreMath<T>());
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((dq_elements + threads - 1) / threads, 4096);
  internal::RecordLaunchWork("RoundAccumulatedKernel", blocks, dq_elements);
  RoundAccumulatedKernel<T><<<static_cast<unsigned>(blocks), threads, 0, context.stream>>>(
      g, accum, static_cast<T*>(dq), dq_elements);
  TANDEM_CUDA_CHECK_LAUNCH(context.device);
  // A conversion an element: the float32 sums read, dq written.
  DeclareKernelWork(static_cast<double>(dq_elements),
                    static_cast<double>(dq_elements) * (sizeof(float) + sizeof(T)));
  return true;
}

}  // namespace

void LaunchAttentionForward(const LaunchContext& context, DType dtype, const AttentionGeometry& g,
                            const void* q, const void* k, const void* v, const void* mask,
                            void* out, void* logsumexp) {
  DispatchAllFloatingTypes(dtype, "CUDA AttentionForward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = OpMath<T>;
    if (g.batch == 0 || g.query_len == 0) return;
    const int64_t width = g.head_dim + g.value_dim;
    if constexpr (kIsReducedFloat<T>) {
      const TensorCoreLayout t = PlanTensorCore(g.head_dim, g.value_dim);
      if (g.head_dim <= kTensorCoreMaxHead && g.value_dim <= kTensorCoreMaxHead &&
          t.bytes <= SharedOptInBytes(context.device)) {
        const void* kernel = reinterpret_cast<const void*>(&AttentionForwardTensorCoreKernel<T>);
        OptInSharedMemory(kernel, t.bytes, context.device);
        const dim3 grid = Grid(g.query_len, kTcRows, g.batch, context.device);
        const int64_t keys = KeysRead(g, kTcRows);
        internal::RecordLaunchWork("AttentionForwardTensorCoreKernel", int64_t{grid.x} * grid.y,
                                   g.batch * (g.query_len * g.head_dim + keys * width));
        AttentionForwardTensorCoreKernel<T><<<grid, kTcWarps * 32, t.bytes, context.stream>>>(
            g, t, static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
            static_cast<const T*>(mask), static_cast<T*>(out), static_cast<float*>(logsumexp));
        TANDEM_CUDA_CHECK_LAUNCH(context.device);
        DeclareKernelWork(TensorCoreForwardFlops(g, t),
                          ForwardBytes(g, keys, mask, sizeof(T), sizeof(float)),
                          TensorCoreMath<T>());
        return;
      }
    }
    const SharedLayout layout{width, kTile * width, sizeof(M)};
    const int rows =
        PlanRows("AttentionForward", reinterpret_cast<const void*>(&AttentionForwardKernel<T>),
                 layout, g, dtype, context.device);
    const size_t shared = layout.Bytes(rows);
    const dim3 grid = Grid(g.query_len, rows, g.batch, context.device);
    const int64_t keys = KeysRead(g, rows);
    internal::RecordLaunchWork("AttentionForwardKernel", int64_t{grid.x} * grid.y,
                               g.batch * (g.query_len * g.head_dim + keys * width));
    AttentionForwardKernel<T><<<grid, rows, shared, context.stream>>>(
        g, static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
        static_cast<const T*>(mask), static_cast<T*>(out), static_cast<M*>(logsumexp));
    TANDEM_CUDA_CHECK_LAUNCH(context.device);
    DeclareKernelWork(ScalarForwardFlops(g, rows),
                      ForwardBytes(g, keys, mask, sizeof(T), sizeof(M)), RooflineMath(sizeof(M)));
  });
}

void LaunchAttentionBackward(const LaunchContext& context, DType dtype, const AttentionGeometry& g,
                             const void* q, const void* k, const void* v, const void* mask,
                             const void* out, const void* dout, const void* logsumexp, void* dq,
                             void* dk, void* dv) {
  DispatchAllFloatingTypes(dtype, "CUDA AttentionBackward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = OpMath<T>;
    if (g.batch == 0) return;
    const int64_t e = g.head_dim, ev = g.value_dim, l = g.query_len, s = g.key_len;
    if (g.query_len == 0) {
      // No query attends anything: dk and dv are zero (dq is empty).
      TANDEM_CHECK(g.dk_rows.batch_stride < 0 && g.dv_rows.batch_stride < 0,
                   "CUDA AttentionBackward: with no queries, dk and dv must be contiguous (they "
                   "are zeroed as one block each); pass them without AttentionRows");
      TANDEM_CUDA_CHECK(cudaMemsetAsync(dk, 0, g.batch * g.key_len * e * sizeof(T), context.stream),
                        context.device);
      TANDEM_CUDA_CHECK(
          cudaMemsetAsync(dv, 0, g.batch * g.key_len * ev * sizeof(T), context.stream),
          context.device);
      return;
    }
    if constexpr (kIsReducedFloat<T>) {
      if (g.key_len > 0 && LaunchAttentionBackwardTensorCore<T>(context, g, q, k, v, mask, out,
                                                                dout, logsumexp, dq, dk, dv)) {
        return;
      }
    }
    // Pass 2 reads the D of every query; the workspace goes back to the allocator when this
    // function returns, but only work queued later on this stream can reuse it.
    std::shared_ptr<void> delta_memory =
        context.workspace->Allocate(static_cast<size_t>(g.batch * g.query_len) * sizeof(M));
    M* delta = static_cast<M*>(delta_memory.get());
    const T* typed_q = static_cast<const T*>(q);
    const T* typed_k = static_cast<const T*>(k);
    const T* typed_v = static_cast<const T*>(v);
    const T* typed_mask = static_cast<const T*>(mask);
    const T* typed_dout = static_cast<const T*>(dout);
    const M* lse = static_cast<const M*>(logsumexp);
    {
      const SharedLayout layout{2 * e + ev, kTile * (e + ev), sizeof(M)};
      const int rows = PlanRows("AttentionBackward (dq)",
                                reinterpret_cast<const void*>(&AttentionBackwardQueryKernel<T>),
                                layout, g, dtype, context.device);
      const size_t shared = layout.Bytes(rows);
      const dim3 grid = Grid(l, rows, g.batch, context.device);
      const int64_t keys = KeysRead(g, rows);
      internal::RecordLaunchWork("AttentionBackwardQueryKernel", int64_t{grid.x} * grid.y,
                                 g.batch * (l * (e + 2 * ev) + keys * (e + ev)));
      AttentionBackwardQueryKernel<T><<<grid, rows, shared, context.stream>>>(
          g, typed_q, typed_k, typed_v, typed_mask, static_cast<const T*>(out), typed_dout, lse,
          delta, static_cast<T*>(dq));
      TANDEM_CUDA_CHECK_LAUNCH(context.device);
      // q, out, dout and the log-sum-exp read and dq and D written, once; k and v up to the
      // last block's keys, once.
      DeclareKernelWork(
          ScalarBackwardQueryFlops(g, rows),
          OperandBytes(g, l, 2 * e + 2 * ev, sizeof(T)) + OperandBytes(g, l, 2, sizeof(M)) +
              OperandBytes(g, keys, e + ev, sizeof(T)) + MaskBytes(g, mask, sizeof(T)),
          RooflineMath(sizeof(M)));
    }
    if (g.key_len == 0) return;
    {
      const SharedLayout layout{2 * (e + ev), kTile * (e + ev + 2), sizeof(M)};
      const int rows = PlanRows("AttentionBackward (dk, dv)",
                                reinterpret_cast<const void*>(&AttentionBackwardKeyKernel<T>),
                                layout, g, dtype, context.device);
      const size_t shared = layout.Bytes(rows);
      const dim3 grid = Grid(s, rows, g.batch, context.device);
      internal::RecordLaunchWork("AttentionBackwardKeyKernel", int64_t{grid.x} * grid.y,
                                 g.batch * (l * (e + ev) + s * (e + ev)));
      AttentionBackwardKeyKernel<T><<<grid, rows, shared, context.stream>>>(
          g, typed_q, typed_k, typed_v, typed_mask, typed_dout, lse, delta, static_cast<T*>(dk),
          static_cast<T*>(dv));
      TANDEM_CUDA_CHECK_LAUNCH(context.device);
      // k and v read and dk and dv written; q, dout, the log-sum-exp and D read, once (the
      // first key block reads every query).
      DeclareKernelWork(ScalarBackwardKeyFlops(g),
                        OperandBytes(g, s, 2 * (e + ev), sizeof(T)) +
                            OperandBytes(g, l, e + ev, sizeof(T)) +
                            OperandBytes(g, l, 2, sizeof(M)) + MaskBytes(g, mask, sizeof(T)),
                        RooflineMath(sizeof(M)));
    }
  });
}

}  // namespace cuda
}  // namespace tandem
