// Fused attention on the CPU (Note [Fused attention]). The products go through OpenBLAS's
// single-threaded GEMM on tiles small enough to stay in L1/L2 (a 64 x 128 score tile is
// 32 KB in float); the softmax bookkeeping between them is plain loops over the tile.
// 16-bit operands are converted to float a tile at a time, so the GEMMs are float32's.
// Blocks of queries are split over cpu:`index`'s pool; the backward takes one head per work item
// (each head's dk and dv are summed over all of its query blocks, so splitting a head would need
// a reduction). Registered at static initialisation (:attention_kernels is linked whole).
#include "tensor/kernels/attention_kernels.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "tensor/base/error.h"
#include "tensor/base/half.h"
#include "tensor/base/philox.h"
#include "tensor/kernels/float_conversions.h"
#include "tensor/kernels/vectorized.h"
#include "tensor/runtime/kernel_stub.h"
#include "tensor/runtime/threads.h"

namespace tandem {
namespace {

// Queries per work item and keys per tile: a query block's rows of q, the score tile and the
// output accumulator fit in L2 for head sizes up to a few hundred.
constexpr int64_t kQueryBlock = 64;
constexpr int64_t kKeyTile = 128;
// Floating-point operations per ParallelFor chunk below which splitting costs more than it
// saves (as the backend's GEMM: ~30 us on one core).
constexpr double kFlopsPerChunk = 1 << 20;

void Gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a,
              static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}
void Gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
          int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a,
              static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

// `n` elements of T as the compute type C: the data itself when T is C, else converted
// into `scratch`.
template <typename C, typename T>
const C* AsCompute(const T* src, int64_t n, std::vector<C>& scratch) {
  if constexpr (std::is_same_v<T, C>) {
    return src;
  } else {
    scratch.resize(static_cast<size_t>(n));
    vec::ToFloat(src, scratch.data(), n);
    return scratch.data();
  }
}

// Rows i0 .. i0 + rows - 1 of entry b of an operand (`length` rows of `width` features, laid out
// as `layout` says: AttentionRows) as contiguous rows of C: the data itself when it already is
// that, else gathered (and converted) into `scratch`.
template <typename C, typename T>
const C* RowsAsCompute(const T* src, const AttentionGeometry& g, const AttentionRows& layout,
                       int64_t b, int64_t i0, int64_t rows, int64_t length, int64_t width,
                       std::vector<C>& scratch) {
  if (layout.batch_stride < 0) {
    return AsCompute<C>(src + g.row_offset(layout, b, i0, length, width), rows * width, scratch);
  }
  scratch.resize(static_cast<size_t>(rows * width));
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = src + g.row_offset(layout, b, i0 + r, length, width);
    if constexpr (std::is_same_v<T, C>) {
      std::copy(row, row + width, scratch.data() + r * width);
    } else {
      vec::ToFloat(row, scratch.data() + r * width, width);
    }
  }
  return scratch.data();
}

// The inverse for a whole entry: `length` contiguous rows of C stored as T where `layout` says.
template <typename C, typename T>
void StoreRows(const C* rows, T* dst, const AttentionGeometry& g, const AttentionRows& layout,
               int64_t b, int64_t length, int64_t width) {
  for (int64_t r = 0; r < length; ++r) {
    T* row = dst + g.row_offset(layout, b, r, length, width);
    if constexpr (std::is_same_v<T, C>) {
      std::copy(rows + r * width, rows + (r + 1) * width, row);
    } else {
      vec::FromFloat(rows + r * width, row, width);
    }
  }
}

// ---- Row math, written to vectorise (called inside vec::Vectorized) -----------------------

// e^x for x <= 0 (what a softmax exponentiates: score - max) in float without libm, so that a
// row's exponentials vectorise: Cephes' expf (x = n ln 2 + r, a degree-6 polynomial in r,
// 2^n through the exponent bits), within 2 ulp of expf; exactly 0 for x < -87 (-inf too:
// excluded keys), NaN for NaN. No branches: GCC
// vectorises no loop with control flow.
TANDEM_VECTORIZE inline float FastExp(float x) {
  const float xc = std::max(x, -87.0f);
  // floor(xc log2(e) + 1/2) by truncating a positive number: xc >= -87 keeps it above 0.
  const float nf =
      static_cast<float>(static_cast<int32_t>(xc * 1.44269504088896341f + 128.5f)) - 128.0f;
  const float r = (xc - nf * 0.693359375f) - nf * -2.12194440e-4f;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * (r * r) + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(nf) + 127) << 23;
  float pow2n;
  std::memcpy(&pow2n, &bits, sizeof(pow2n));
  // 1 for x above -87 (by more than 1e-30), 0 below, NaN for NaN, without a branch.
  const float keep = std::min(std::max((x + 87.0f) * 1e30f, 0.0f), 1.0f);
  return y * pow2n * keep;
}
inline double FastExp(double x) { return std::exp(x); }

// Reductions in kLanes independent partial results, so that they vectorise without
// reassociating one chain (GCC keeps a single float chain in order).
constexpr int kLanes = 8;

template <typename C>
TANDEM_VECTORIZE inline C RowMax(const C* __restrict s, int64_t n) {
  C lanes[kLanes];
  for (int i = 0; i < kLanes; ++i) lanes[i] = -std::numeric_limits<C>::infinity();
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes) {
    for (int i = 0; i < kLanes; ++i) lanes[i] = s[c + i] > lanes[i] ? s[c + i] : lanes[i];
  }
  for (; c < n; ++c) lanes[0] = s[c] > lanes[0] ? s[c] : lanes[0];
  C result = lanes[0];
  for (int i = 1; i < kLanes; ++i) result = lanes[i] > result ? lanes[i] : result;
  return result;
}

// s = e^(s - shift); returns the sum.
template <typename C>
TANDEM_VECTORIZE inline C ExpShiftSum(C* __restrict s, int64_t n, C shift) {
  C lanes[kLanes] = {};
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes) {
    for (int i = 0; i < kLanes; ++i) {
      s[c + i] = FastExp(s[c + i] - shift);
      lanes[i] += s[c + i];
    }
  }
  for (; c < n; ++c) {
    s[c] = FastExp(s[c] - shift);
    lanes[0] += s[c];
  }
  C result = 0;
  for (int i = 0; i < kLanes; ++i) result += lanes[i];
  return result;
}

template <typename C>
TANDEM_VECTORIZE inline void ExpShift(C* __restrict s, int64_t n, C shift) {
  for (int64_t c = 0; c < n; ++c) s[c] = FastExp(s[c] - shift);
}

template <typename C>
TANDEM_VECTORIZE inline void ScaleRow(C* __restrict a, int64_t n, C factor) {
  for (int64_t c = 0; c < n; ++c) a[c] *= factor;
}

// d = p * (d - delta): the softmax backward of one row.
template <typename C>
TANDEM_VECTORIZE inline void SoftmaxGradRow(const C* __restrict p, C* __restrict d, int64_t n,
                                            C delta) {
  for (int64_t c = 0; c < n; ++c) d[c] = p[c] * (d[c] - delta);
}

template <typename C>
TANDEM_VECTORIZE inline C Dot(const C* __restrict a, const C* __restrict b, int64_t n) {
  C lanes[kLanes] = {};
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes) {
    for (int i = 0; i < kLanes; ++i) lanes[i] += a[c + i] * b[c + i];
  }
  for (; c < n; ++c) lanes[0] += a[c] * b[c];
  C result = 0;
  for (int i = 0; i < kLanes; ++i) result += lanes[i];
  return result;
}

// How many keys of the tile starting at j0 (of `cols`) query i may attend.
int64_t AllowedKeys(const AttentionGeometry& g, int64_t i, int64_t j0, int64_t cols) {
  if (!g.causal) return cols;
  return std::clamp<int64_t>(i + 1 - j0, 0, cols);
}

// Adds row i's mask to a tile's scores and sets the keys past the causal limit to -inf, so
// that the caller's loops need no per-element conditions. Returns the allowed keys.
template <typename C, typename T>
TANDEM_VECTORIZE int64_t MaskScores(const AttentionGeometry& g, const T* mask, int64_t b, int64_t i,
                                    int64_t j0, int64_t cols, C* s) {
  const int64_t allowed = AllowedKeys(g, i, j0, cols);
  if (mask != nullptr) {
    const T* m = mask + g.mask_offset(b, i) + j0;
    for (int64_t c = 0; c < allowed; ++c) s[c] += static_cast<C>(m[c]);
  }
  for (int64_t c = allowed; c < cols; ++c) s[c] = -std::numeric_limits<C>::infinity();
  return allowed;
}

// The dropout factors of row i's keys j0..j0+cols (Geometry's dropout_*): 1 / (1 - p) where
// kept, 0 where dropped. Each Philox block gives four consecutive counters' uniforms.
template <typename C>
void DropoutFactors(const AttentionGeometry& g, int64_t b, int64_t i, int64_t j0, int64_t cols,
                    C* z) {
  const C kept = static_cast<C>(1.0 / (1.0 - g.dropout_p));
  const uint64_t key = g.dropout_seed ^ philox::kUniformStream;
  const uint64_t first = g.dropout_counter(b, i, j0);
  int64_t c = 0;
  while (c < cols) {
    const uint64_t counter = first + static_cast<uint64_t>(c);
    const philox::Block block = philox::Generate(key, counter >> 2);
    for (int lane = static_cast<int>(counter & 3); lane < 4 && c < cols; ++lane, ++c) {
      const float u = philox::ToUnit(block.x[lane]);
      z[c] = static_cast<double>(u) >= g.dropout_p ? kept : C(0);
    }
  }
}

template <typename C>
TANDEM_VECTORIZE inline void MulRow(C* __restrict a, const C* __restrict b, int64_t n) {
  for (int64_t c = 0; c < n; ++c) a[c] *= b[c];
}

// ds = p * (z * dp - delta): the softmax backward of one row whose weights were dropped out
// with factors z (dout v^T is the gradient of the dropped weights p * z).
template <typename C>
TANDEM_VECTORIZE inline void DropoutSoftmaxGradRow(const C* __restrict p, const C* __restrict z,
                                                   C* __restrict d, int64_t n, C delta) {
  for (int64_t c = 0; c < n; ++c) d[c] = p[c] * (z[c] * d[c] - delta);
}

template <typename T>
void ForwardTyped(int index, const AttentionGeometry& g, const T* q, const T* k, const T* v,
                  const T* mask, T* out, OpMath<T>* lse) {
  using C = OpMath<T>;
  constexpr C kInf = std::numeric_limits<C>::infinity();
  const int64_t l = g.query_len, s = g.key_len, e = g.head_dim, ev = g.value_dim;
  const int64_t blocks = (l + kQueryBlock - 1) / kQueryBlock;
  const C scale = static_cast<C>(g.scale);
  const bool dropout = g.dropout_p > 0.0;
  const double flops_per_item =
      2.0 * static_cast<double>(std::min(l, kQueryBlock) * s * (e + ev)) / (g.causal ? 2 : 1);
  const int64_t grain = std::max<int64_t>(1, static_cast<int64_t>(kFlopsPerChunk / flops_per_item));
  ParallelFor(Device::Cpu(index), g.batch * blocks, grain, [&](int64_t begin, int64_t end) {
    std::vector<C> q_scratch, k_scratch, v_scratch;
    std::vector<C> scores(static_cast<size_t>(kQueryBlock * kKeyTile));
    std::vector<C> acc(static_cast<size_t>(kQueryBlock * ev));
    std::vector<C> factors(dropout ? static_cast<size_t>(kKeyTile) : 0);
    C row_max[kQueryBlock], row_sum[kQueryBlock];
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / blocks, i0 = (item % blocks) * kQueryBlock;
      const int64_t rows = std::min(kQueryBlock, l - i0);
      const C* qb = RowsAsCompute<C>(q, g, g.q_rows, b, i0, rows, l, e, q_scratch);
      std::fill(acc.begin(), acc.begin() + rows * ev, C(0));
      std::fill(row_max, row_max + rows, -kInf);
      std::fill(row_sum, row_sum + rows, C(0));
      const int64_t key_end = g.causal ? std::min(s, i0 + rows) : s;
      for (int64_t j0 = 0; j0 < key_end; j0 += kKeyTile) {
        const int64_t cols = std::min(kKeyTile, key_end - j0);
        const C* kt = RowsAsCompute<C>(k, g, g.k_rows, b, j0, cols, s, e, k_scratch);
        const C* vt = RowsAsCompute<C>(v, g, g.v_rows, b, j0, cols, s, ev, v_scratch);
        Gemm(false, true, rows, cols, e, scale, qb, e, kt, e, C(0), scores.data(), kKeyTile);
        vec::Vectorized([&] {
          for (int64_t r = 0; r < rows; ++r) {
            C* sr = scores.data() + r * kKeyTile;
            const int64_t allowed = MaskScores(g, mask, b, i0 + r, j0, cols, sr);
            const C new_max = std::max(row_max[r], RowMax(sr, allowed));
            if (new_max == -kInf) {
              // Nothing attended yet: the row's weights so far are all zero.
              std::fill(sr, sr + cols, C(0));
              continue;
            }
            const C sum = ExpShiftSum(sr, cols, new_max);
            const C correction = FastExp(row_max[r] - new_max);
            row_sum[r] = row_sum[r] * correction + sum;
            row_max[r] = new_max;
            if (correction != C(1)) ScaleRow(acc.data() + r * ev, ev, correction);
          }
        });
        if (dropout) {
          // After the running sum took the undropped weights: only the product with v sees
          // the dropout (out = dropout(P) v, the log-sum-exp unchanged).
          // Past the causal limit the weights are already 0: no random numbers for them.
          for (int64_t r = 0; r < rows; ++r) {
            const int64_t allowed = AllowedKeys(g, i0 + r, j0, cols);
            DropoutFactors(g, b, i0 + r, j0, allowed, factors.data());
            vec::Vectorized([&] { MulRow(scores.data() + r * kKeyTile, factors.data(), allowed); });
          }
        }
        Gemm(false, false, rows, ev, cols, C(1), scores.data(), kKeyTile, vt, ev, C(1), acc.data(),
             ev);
      }
      for (int64_t r = 0; r < rows; ++r) {
        // A row that attended nothing has sum 0: 0 * inf gives NaN outputs, as PyTorch's.
        const C inv = C(1) / row_sum[r];
        const C* a = acc.data() + r * ev;
        T* o = out + g.out_row(b, i0 + r);
        for (int64_t c = 0; c < ev; ++c) o[c] = static_cast<T>(a[c] * inv);
        lse[b * l + i0 + r] = row_max[r] + std::log(row_sum[r]);
      }
    }
  });
}

template <typename T>
void BackwardTyped(int index, const AttentionGeometry& g, const T* q, const T* k, const T* v,
                   const T* mask, const T* out, const T* dout, const OpMath<T>* lse, T* dq, T* dk,
                   T* dv) {
  using C = OpMath<T>;
  // Accumulate straight into dq, dk, dv when they are contiguous C.
  const bool direct = std::is_same_v<T, C> && g.dq_rows.batch_stride < 0 &&
                      g.dk_rows.batch_stride < 0 && g.dv_rows.batch_stride < 0;
  const int64_t l = g.query_len, s = g.key_len, e = g.head_dim, ev = g.value_dim;
  const C scale = static_cast<C>(g.scale);
  const bool dropout = g.dropout_p > 0.0;
  const double flops_per_item = 4.0 * static_cast<double>(l * s * (e + ev)) / (g.causal ? 2 : 1);
  const int64_t grain = std::max<int64_t>(1, static_cast<int64_t>(kFlopsPerChunk / flops_per_item));
  ParallelFor(Device::Cpu(index), g.batch, grain, [&](int64_t begin, int64_t end) {
    std::vector<C> q_scratch, k_scratch, v_scratch, o_scratch, do_scratch;
    std::vector<C> dq_scratch, dk_scratch, dv_scratch;
    std::vector<C> p(static_cast<size_t>(kQueryBlock * kKeyTile));
    std::vector<C> dp(static_cast<size_t>(kQueryBlock * kKeyTile));
    // With dropout: the factors z, then the dropped weights p * z that dv takes.
    std::vector<C> z(dropout ? static_cast<size_t>(kQueryBlock * kKeyTile) : 0);
    std::vector<C> pz(dropout ? static_cast<size_t>(kQueryBlock * kKeyTile) : 0);
    std::vector<C> delta(static_cast<size_t>(l));
    for (int64_t b = begin; b < end; ++b) {
      const C* qh = RowsAsCompute<C>(q, g, g.q_rows, b, 0, l, l, e, q_scratch);
      const C* kh = RowsAsCompute<C>(k, g, g.k_rows, b, 0, s, s, e, k_scratch);
      const C* vh = RowsAsCompute<C>(v, g, g.v_rows, b, 0, s, s, ev, v_scratch);
      const C* oh = RowsAsCompute<C>(out, g, g.out_rows, b, 0, l, l, ev, o_scratch);
      const C* doh = RowsAsCompute<C>(dout, g, g.dout_rows, b, 0, l, l, ev, do_scratch);
      const C* lh = lse + b * l;
      C* dqh;
      C* dkh;
      C* dvh;
      if (direct) {
        // T is C here; the casts only compile the branch for the 16-bit types.
        dqh = reinterpret_cast<C*>(dq + b * l * e);
        dkh = reinterpret_cast<C*>(dk + b * s * e);
        dvh = reinterpret_cast<C*>(dv + b * s * ev);
      } else {
        dq_scratch.resize(static_cast<size_t>(l * e));
        dk_scratch.resize(static_cast<size_t>(s * e));
        dv_scratch.resize(static_cast<size_t>(s * ev));
        dqh = dq_scratch.data();
        dkh = dk_scratch.data();
        dvh = dv_scratch.data();
      }
      std::fill(dqh, dqh + l * e, C(0));
      std::fill(dkh, dkh + s * e, C(0));
      std::fill(dvh, dvh + s * ev, C(0));
      // D_i = dout_i . out_i, the softmax backward's row term (FlashAttention-2).
      vec::Vectorized([&] {
        for (int64_t i = 0; i < l; ++i)
          delta[static_cast<size_t>(i)] = Dot(doh + i * ev, oh + i * ev, ev);
      });
      for (int64_t i0 = 0; i0 < l; i0 += kQueryBlock) {
        const int64_t rows = std::min(kQueryBlock, l - i0);
        const int64_t key_end = g.causal ? std::min(s, i0 + rows) : s;
        for (int64_t j0 = 0; j0 < key_end; j0 += kKeyTile) {
          const int64_t cols = std::min(kKeyTile, key_end - j0);
          Gemm(false, true, rows, cols, e, scale, qh + i0 * e, e, kh + j0 * e, e, C(0), p.data(),
               kKeyTile);
          vec::Vectorized([&] {
            for (int64_t r = 0; r < rows; ++r) {
              C* pr = p.data() + r * kKeyTile;
              MaskScores(g, mask, b, i0 + r, j0, cols, pr);
              ExpShift(pr, cols, lh[i0 + r]);
            }
          });
          // dv += p^T dout; dp = dout v^T; ds = p * (dp - D); dq += scale ds k; dk += scale ds^T q.
          // With dropout p becomes p * z in dv's product and dp becomes z * dp; D = dout . out
          // already is the sum of p * z * (dout v^T) (FlashAttention-2's dropout backward).
          const C* dropped = p.data();
          if (dropout) {
            for (int64_t r = 0; r < rows; ++r) {
              C* zr = z.data() + r * kKeyTile;
              const int64_t allowed = AllowedKeys(g, i0 + r, j0, cols);
              DropoutFactors(g, b, i0 + r, j0, allowed, zr);
              std::fill(zr + allowed, zr + cols, C(0));
              vec::Vectorized([&] {
                const C* pr = p.data() + r * kKeyTile;
                C* pzr = pz.data() + r * kKeyTile;
                for (int64_t c = 0; c < cols; ++c) pzr[c] = pr[c] * zr[c];
              });
            }
            dropped = pz.data();
          }
          Gemm(true, false, cols, ev, rows, C(1), dropped, kKeyTile, doh + i0 * ev, ev, C(1),
               dvh + j0 * ev, ev);
          Gemm(false, true, rows, cols, ev, C(1), doh + i0 * ev, ev, vh + j0 * ev, ev, C(0),
               dp.data(), kKeyTile);
          vec::Vectorized([&] {
            for (int64_t r = 0; r < rows; ++r) {
              const C d = delta[static_cast<size_t>(i0 + r)];
              if (dropout) {
                DropoutSoftmaxGradRow(p.data() + r * kKeyTile, z.data() + r * kKeyTile,
                                      dp.data() + r * kKeyTile, cols, d);
              } else {
                SoftmaxGradRow(p.data() + r * kKeyTile, dp.data() + r * kKeyTile, cols, d);
              }
            }
          });
          Gemm(false, false, rows, e, cols, scale, dp.data(), kKeyTile, kh + j0 * e, e, C(1),
               dqh + i0 * e, e);
          Gemm(true, false, cols, e, rows, scale, dp.data(), kKeyTile, qh + i0 * e, e, C(1),
               dkh + j0 * e, e);
        }
      }
      if (!direct) {
        StoreRows(dqh, dq, g, g.dq_rows, b, l, e);
        StoreRows(dkh, dk, g, g.dk_rows, b, s, e);
        StoreRows(dvh, dv, g, g.dv_rows, b, s, ev);
      }
    }
  });
}

// The sizes' signs were checked by RunAttentionForward / RunAttentionBackward
// (tensor/kernels/attention_kernels.h); these are the CPU's own limits.
void CheckGeometry(int index, const AttentionGeometry& g, const char* kernel) {
  TANDEM_CHECK(index >= 0, "CPU backend: device index must be >= 0 but got ", index);
  constexpr int64_t kIntMax = std::numeric_limits<int>::max();
  TANDEM_CHECK(g.query_len <= kIntMax && g.key_len <= kIntMax && g.head_dim <= kIntMax &&
                   g.value_dim <= kIntMax,
               "CPU ", kernel, ": lengths and head sizes must fit BLAS's 32-bit sizes but got ",
               "query_len=", g.query_len, " key_len=", g.key_len, " head_dim=", g.head_dim,
               " value_dim=", g.value_dim);
  TANDEM_CHECK(g.dropout_p >= 0.0 && g.dropout_p < 1.0, "CPU ", kernel,
               ": dropout_p must be in [0, 1) but is ", g.dropout_p);
}

void CpuAttentionForward(int index, DType dtype, const AttentionGeometry& g, const void* q,
                         const void* k, const void* v, const void* mask, void* out,
                         void* logsumexp) {
  CheckGeometry(index, g, "AttentionForward");
  if (g.batch == 0 || g.query_len == 0) return;
  DispatchAllFloatingTypes(dtype, "CPU AttentionForward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    ForwardTyped(index, g, static_cast<const T*>(q), static_cast<const T*>(k),
                 static_cast<const T*>(v), static_cast<const T*>(mask), static_cast<T*>(out),
                 static_cast<OpMath<T>*>(logsumexp));
  });
}

void CpuAttentionBackward(int index, DType dtype, const AttentionGeometry& g, const void* q,
                          const void* k, const void* v, const void* mask, const void* out,
                          const void* dout, const void* logsumexp, void* dq, void* dk, void* dv) {
  CheckGeometry(index, g, "AttentionBackward");
  if (g.batch == 0) return;
  DispatchAllFloatingTypes(dtype, "CPU AttentionBackward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    BackwardTyped(index, g, static_cast<const T*>(q), static_cast<const T*>(k),
                  static_cast<const T*>(v), static_cast<const T*>(mask), static_cast<const T*>(out),
                  static_cast<const T*>(dout), static_cast<const OpMath<T>*>(logsumexp),
                  static_cast<T*>(dq), static_cast<T*>(dk), static_cast<T*>(dv));
  });
}

}  // namespace

TANDEM_REGISTER_KERNEL(AttentionForwardKernel, DeviceType::kCPU, CpuAttentionForward);
TANDEM_REGISTER_KERNEL(AttentionBackwardKernel, DeviceType::kCPU, CpuAttentionBackward);

}  // namespace tandem
